"""Whole models in the low-bit K-quants, codebook, ternary and FP4 types on the GPU against the
NumPy reference, and ``reflex check`` on the benchmark-shaped files of llama-quantize's presets.

* tiny qwen3 files of every type of modelwriter.EXTRA_WEIGHT_TYPES, and tiny qwen3moe files in
  the IQ3_XXS / IQ2_XXS preset mixes and in llama-quantize's MXFP4_MOE layout (experts MXFP4,
  the rest Q8_0): a prompt of 1, 7, 64 or 300 tokens as one batch (GEMV and tiled matmuls,
  embedding, MoE gather), then greedy decode steps; every logit row within REL of the reference
  (test_models_gpu.py's bound: same float32 weights, different summation orders);
* ``reflex check`` (GPU vs NumPy logits, and every tensor type of the file dequantized bit for
  bit against gguf-py) on the Qwen3-8B-shaped Q3_K_M and IQ4_XS files and the
  Qwen3-30B-A3B-shaped IQ3_XXS-mix file of bench/make_models.py (read from
  REFLEX_BENCH_MODELS when there, else written: 4-12 GB each; marked slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reflex_core.testing.modelwriter import (EXTRA_WEIGHT_TYPES, PRESETS, preset_overrides,
                                             tiny_kquant_shape)

pytestmark = pytest.mark.gpu

REL = 1e-4

_MOE = tiny_kquant_shape("qwen3moe")
MOE_MIXES = {
    "IQ3_XXS": (PRESETS["IQ3_XXS"], preset_overrides(_MOE, "IQ3_XXS")),
    "IQ2_XXS": (PRESETS["IQ2_XXS"], preset_overrides(_MOE, "IQ2_XXS")),
    "MXFP4_MOE": ("Q8_0", {"ffn_*_exps": "MXFP4"}),
}


@pytest.mark.parametrize("wtype", EXTRA_WEIGHT_TYPES)
@pytest.mark.parametrize("n_prompt", [1, 7, 64, 300])
def test_dense_prefill_and_decode_match_reference(prefill_decode_vs_reference, model_files, wtype,
                                                  n_prompt):
    path = model_files(tiny_kquant_shape("qwen3"), weight_type=wtype, seed=12)
    prefill_decode_vs_reference(path, n_prompt, REL, f"qwen3 {wtype}")


@pytest.mark.parametrize("mix", list(MOE_MIXES))
@pytest.mark.parametrize("n_prompt", [1, 7, 64, 300])
def test_moe_mixes_match_reference(prefill_decode_vs_reference, model_files, mix, n_prompt):
    wtype, overrides = MOE_MIXES[mix]
    path = model_files(_MOE, weight_type=wtype, seed=13, type_overrides=overrides)
    prefill_decode_vs_reference(path, n_prompt, REL, f"qwen3moe {mix}")


# bench/make_models.py's names of the files
SHAPED = {
    "8b-q3_k_m": "qwen3-8b-shaped-q3_k_m.gguf",
    "8b-iq4_xs": "qwen3-8b-shaped-iq4_xs.gguf",
    "30b-iq3_xxs": "qwen3-30b-a3b-shaped-iq3_xxs.gguf",
}


@pytest.mark.slow
@pytest.mark.parametrize("which", list(SHAPED))
def test_reflex_check_on_shaped_preset_files(cuda_device, tmp_path_factory, which):
    d = os.environ.get("REFLEX_BENCH_MODELS")
    path = os.path.join(d, SHAPED[which]) if d else None
    if not path or not os.path.exists(path):
        out = tmp_path_factory.mktemp("big")
        make = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "make_models.py")
        p = subprocess.run([sys.executable, make, str(out), "--which", which],
                           capture_output=True, text=True, timeout=1200)
        assert p.returncode == 0, p.stderr[-3000:]
        path = str(out / SHAPED[which])
    p = subprocess.run([sys.executable, "-m", "reflex_core", "check", path, "--json"],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["status"] == "ok" and res["dequant_mismatches"] == 0 and res["positions"] >= 9, res

