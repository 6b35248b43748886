"""The fuzz harness's seed corpus, replayed through every target (no atheris needed): each
valid tiny model and each known-bad reproducer must give at most a ReflexError, under the
harness's address-space cap and per-input time limit (tests/fuzz/run.py --replay). CI also
fuzzes each target for a minute (scripts/test.sh); this is the part that runs everywhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.craft import BAD, BAD_TENSORS, bad_tensor_model, tiny_model

FUZZ = Path(__file__).parent / "fuzz"


def replay(target: str, *paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FUZZ / "run.py"), target, "--replay",
                           *map(str, paths)], capture_output=True, text=True, timeout=600)


def test_the_seeds_are_the_ones_make_seeds_writes():
    names = set(os.listdir(FUZZ / "seeds"))
    assert {f"bad-{n}.gguf" for n in list(BAD) + list(BAD_TENSORS)} <= names
    assert (FUZZ / "seeds" / "valid-qwen3.gguf").read_bytes() == tiny_model("qwen3").to_bytes()


@pytest.mark.parametrize("target", ["reader", "tokenizer", "hparams"])
def test_seeds_replay_without_findings(target):
    p = replay(target, FUZZ / "seeds")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert p.stdout.strip().endswith("0 findings"), p.stdout[-2000:]


def test_index_seeds_replay_without_findings():
    """Index files that are not indexes (marshal bombs, an empty file) and the valid index:
    the model reads the same through each, and nothing allocates past the cap."""
    p = replay("index", FUZZ / "seeds-index")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]


@pytest.mark.parametrize("name", sorted(BAD_TENSORS))
def test_bad_tensor_shapes_are_model_errors(tmp_path, name):
    """Found by the hparams target: a tensor of 0 dimensions (a scalar to ggml) where a vector
    is bound made the CPU backend's weight() fail with an IndexError; an expert tensor with a
    trailing 1 ([D, F, E, 1]) passed the shape check and failed in moe_matmul (ValueError)."""
    from reflex_qwen3.model import Qwen3
    from reflex_qwen3_moe.model import Qwen3MoE

    from reflex_core.backends.numpy_backend import NumpyOps
    from reflex_core.errors import ModelError
    from reflex_core.gguf import open_gguf

    arch, tensor, ne = BAD_TENSORS[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(bad_tensor_model(name).to_bytes())
    g = open_gguf(path)
    ops = NumpyOps()
    ops.attach(g)
    with pytest.raises(ModelError, match=re.escape(f"'{tensor}' has shape {list(ne)}")):
        (Qwen3MoE if arch == "qwen3moe" else Qwen3)(g, ops)
