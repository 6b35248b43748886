"""Every family on the random hyper-parameters of tests/test_oracle_random_shapes.py (the same
fixed-seed draws: head counts and sizes, GQA ratios, expert counts and k, Qwen3.5 layer patterns
and RoPE sections, DeepSeek latent sizes, MLA or legacy, ...), the GPU against the NumPy
reference: a prompt of the draw's length as one batch, then single-token steps through the
device caches; then a prompt of 64-300 tokens (the prefill kernels of many tokens). F32 weights
on even seeds, F16 on odd ones (no block size to constrain the draws); the draws' optional tensors
(biases, fused projections) as there."""

from __future__ import annotations

import random

import pytest

from test_oracle_random_shapes import FAMILIES, optional_tensors

REL = 1e-4  # as tests/gpu/test_models_gpu.py
SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_shape_gpu_matches_reference(prefill_decode_vs_reference, model_files, family,
                                            seed):
    r = random.Random(f"{family}-{seed}")
    shape = FAMILIES[family](r)
    n_prompt = r.randint(1, 17)
    wtype = "F32" if seed % 2 == 0 else "F16"
    shape, fuse = optional_tensors(family, shape, seed)
    path = model_files(shape.replace(context_length=512), weight_type=wtype, seed=seed, fuse=fuse)
    prefill_decode_vs_reference(path, n_prompt, REL, f"{shape} {wtype}", n_decode=5)
    prefill_decode_vs_reference(path, r.randint(64, 300), REL, f"{shape} {wtype}", n_decode=2)
