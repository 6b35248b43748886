"""The optional tensors of spec §4.7 on the GPU (tests/test_optional_tensors.py has the CPU side
and llama.cpp).

Fused ``attn_qkv`` / ``ffn_gate_up_exps`` files: the views point into the fused tensor (no copy),
and the same kernels run on the same bytes, so a fused file's logits equal the unfused file's bit
for bit -- prompts of 1, 7 and 80 tokens (GEMV, tiled, and the MoE's grouped path from 64
tokens), then greedy decode steps, and whole jobs with decode graphs; the views' dequantization
(3-D views: expert by expert) against the NumPy twin.

Attention biases (``reflex_add_bias``, whose launcher tests/gpu/test_registered_ops_gpu.py checks
against its twin), separate or one fused ``attn_qkv.bias``: whole biased files against the NumPy
reference, and their decode graphs against eager steps."""

from __future__ import annotations

import numpy as np
import pytest

from reflex_core import engine
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import (tiny_deepseek2_kquant_shape, tiny_kquant_shape,
                                             tiny_qwen35_kquant_shape)

pytestmark = pytest.mark.gpu

CASES = {
    "qwen3": (tiny_kquant_shape("qwen3"), "Q4_K", ("qkv",)),
    "qwen3moe": (tiny_kquant_shape("qwen3moe"), "Q4_K", ("qkv",)),
    "qwen35moe": (tiny_qwen35_kquant_shape("qwen35moe"), "Q4_K", ("qkv", "gate_up_exps")),
    "deepseek2": (tiny_deepseek2_kquant_shape(), "Q4_K", ("gate_up_exps",)),
    "qwen35moe-q8_0": (tiny_qwen35_kquant_shape("qwen35moe"), "Q8_0", ("qkv", "gate_up_exps")),
}
BIASED = {
    "qwen3": (tiny_kquant_shape("qwen3", qkv_bias=True), "Q4_K", ()),
    "qwen3moe-fused": (tiny_kquant_shape("qwen3moe", qkv_bias=True), "Q8_0", ("qkv",)),
    "qwen35moe-fused": (tiny_qwen35_kquant_shape("qwen35moe", qkv_bias=True), "Q4_K",
                        ("qkv", "qkv_bias", "gate_up_exps")),
}


def _logits(gpu_and_reference, path, ids, n_decode):
    load, _ = gpu_and_reference
    g, gm, _rm = load(path)
    try:
        st = gm.new_state(len(ids) + n_decode)
        b = st.append(ids)
        rows = [gm.ops.to_numpy(gm.forward(b, st, list(range(len(ids)))))]
        for _ in range(n_decode):
            b = st.append([int(rows[-1][-1].argmax())])
            rows.append(gm.ops.to_numpy(gm.forward(b, st, [0])))
        return rows
    finally:
        g.close()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n_prompt", [1, 7, 80])
def test_fused_file_equals_unfused_file_on_the_gpu(gpu_and_reference, model_files, case,
                                                   n_prompt):
    shape, wtype, fuse = CASES[case]
    plain = model_files(shape, weight_type=wtype, seed=21)
    fused = model_files(shape, weight_type=wtype, seed=21, fuse=fuse)
    vocab = shape.n_vocab or 128
    ids = np.random.default_rng(n_prompt).integers(0, vocab, n_prompt).tolist()
    want = _logits(gpu_and_reference, plain, ids, 3)
    got = _logits(gpu_and_reference, fused, ids, 3)
    for k, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"{case} T={n_prompt}, step {k}"


@pytest.mark.parametrize("case", ["qwen3", "qwen35moe"])
def test_fused_file_matches_the_reference(prefill_decode_vs_reference, model_files, case):
    shape, wtype, fuse = CASES[case]
    path = model_files(shape, weight_type=wtype, seed=22, fuse=fuse)
    prefill_decode_vs_reference(path, 7, 1e-4, f"{case} fused")


def _greedy_jobs(path, monkeypatch, graphs: tuple[str, ...]) -> list[list[int]]:
    """24 greedy tokens after a 5-token prompt from the file's model on the GPU, once with
    ``REFLEX_CUDA_GRAPHS`` set to each of ``graphs``."""
    lm = engine.load(str(path), "cuda")[0]
    try:
        out = []
        for g in graphs:
            monkeypatch.setenv("REFLEX_CUDA_GRAPHS", g)
            out.append(engine.generate(lm, [1, 2, 3, 4, 5], 24, SamplingParams()).token_ids)
        return out
    finally:
        lm.close()


@pytest.mark.parametrize("case", ["qwen3", "qwen35moe"])
def test_fused_file_jobs_with_decode_graphs(cuda_device, model_files, case, monkeypatch):
    shape, wtype, fuse = CASES[case]
    plain, fused = (model_files(shape, weight_type=wtype, seed=23, **kw)
                    for kw in ({}, {"fuse": fuse}))
    want, got = _greedy_jobs(plain, monkeypatch, ("1",)) + _greedy_jobs(fused, monkeypatch, ("1",))
    assert got == want and len(want) == 24


def test_views_dequantize_as_the_reference(gpu_and_reference, model_files):
    shape, wtype, fuse = CASES["qwen35moe"]
    load, _ = gpu_and_reference
    g, gm, rm = load(model_files(shape, weight_type=wtype, seed=24, fuse=fuse))
    try:
        for name, r0, n in [("blk.3.attn_qkv.weight", 256, 128),
                            ("blk.0.ffn_gate_up_exps.weight", 256, 256),
                            ("blk.0.ffn_gate_up_exps.weight", 0, 256)]:
            gv = gm.ops.weight_rows(gm.ops.weight(name), r0, n)
            rv = rm.ops.weight_rows(rm.ops.weight(name), r0, n)
            got = gm.ops.to_numpy(gm.ops.dequantize(gv))
            assert np.array_equal(got, rm.ops.dequantize(rv)), (name, r0, n)
    finally:
        g.close()


@pytest.mark.parametrize("case", list(BIASED))
@pytest.mark.parametrize("n_prompt", [1, 7, 80])
def test_biased_file_matches_the_reference(prefill_decode_vs_reference, model_files, case,
                                           n_prompt):
    shape, wtype, fuse = BIASED[case]
    path = model_files(shape, weight_type=wtype, seed=25, fuse=fuse)
    prefill_decode_vs_reference(path, n_prompt, 1e-4, f"{case} with q/k/v biases")


@pytest.mark.parametrize("case", list(BIASED))
def test_biased_file_decode_graphs_equal_eager(cuda_device, model_files, case, monkeypatch):
    shape, wtype, fuse = BIASED[case]
    path = model_files(shape, weight_type=wtype, seed=26, fuse=fuse)
    eager, graphed = _greedy_jobs(path, monkeypatch, ("0", "1"))
    assert eager == graphed and len(eager) == 24
