"""A model file cut short while the GPU path reads it: one line and exit 1 (reflex_core.mapguard),
whether the upload meets the cut as a SIGBUS (a copy out of the map) or as a driver error (the
pages pinned in the kernel)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from reflex_core.testing.modelwriter import ModelShape

SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)

# the CLI, with the file cut to 8 KiB right before the weights go to the GPU
SCRIPT = """
import os, sys
from reflex_core import cli
from reflex_core.backends import cuda_backend

attach = cuda_backend.CudaOps.attach

def cut_then_attach(self, g, *a, **k):
    os.truncate(g.path, 8192)
    return attach(self, g, *a, **k)

cuda_backend.CudaOps.attach = cut_then_attach
cli.main(["generate", sys.argv[1], "Hello", "-n", "2", "--backend", "cuda"])
"""


def test_a_model_file_cut_during_the_upload_is_one_line(cuda_device, model_files, tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copy(model_files(SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=3), path)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines() == [f"error: model file changed while reading ({path})"]
