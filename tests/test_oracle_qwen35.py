"""Qwen3.5 hybrid (qwen35, qwen35moe) on the NumPy reference vs llama.cpp (the oracle).

Tiny random files (testing.modelwriter's Qwen35Shape: D=64, H_v = 4 value heads over H_k = 2 key
heads, d_k = d_v = 16, attention d_h = 32 with n_rot = 8, K_c = 4) go through llama.cpp's CPU
build and through the plugin's model on NumpyOps with the same batching: a prompt of PROMPT
tokens as ONE batch, then DECODE single-token steps -- the conv windows, the delta-rule matrices
and the attention K/V carry over from the prompt to every step. The layer kinds come from a
``recurrent_layers`` array, from ``full_attention_interval`` or from llama.cpp's default
interval (4); one file has an MTP block (present, not run). Error figure and top-1 rule as in
test_oracle_qwen3.py (``testing.oracle.check_logits``).

Bounds. F32 weights with an F32 KV cache: both sides compute in float32; the spec's own
validation reached 2.8e-5 (qwen35) and 5.7e-6 (qwen35moe). Quantized weights: llama.cpp's CPU
matmuls round the activation to the weight's vec_dot type (Q8_0 / Q8_K) where the reference keeps
float32 (see test_oracle_qwen3moe.py); the bounds below sit above the figures measured on these
files (module constants, with the measurements).

These tests FAIL (never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations


import numpy as np
import pytest

from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import (tiny_qwen35_kquant_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape)

pytestmark = pytest.mark.oracle

PROMPT, DECODE = 9, 5
V = 128  # the writer's vocabulary without a tokenizer
F32_BOUND = 5e-5

SHAPES = {
    # H_v > H_k; an explicit array that is not the interval rule (attention at 1 and 3)
    "qwen35-array": tiny_qwen35_shape(recurrent_layers=(True, False, True, False),
                                      full_attention_interval=None),
    # neither key: llama.cpp's default interval 4 (layers 0-2 recurrent, 3 attention)
    "qwen35-default-interval": tiny_qwen35_shape(full_attention_interval=None),
    "qwen35-interval-2": tiny_qwen35_shape(full_attention_interval=2, n_layer=3),
    # an MTP block after the trunk (its recurrent_layers entry false), not run
    "qwen35-mtp": tiny_qwen35_shape(nextn_predict_layers=1, mtp_shared_head=True),
    # untied head, more value heads per key head, odd widths
    "qwen35-untied": tiny_qwen35_shape(tied=False, ssm_group_count=1, ssm_time_step_rank=3,
                                       n_ff=160),
    "qwen35moe-array": tiny_qwen35moe_shape(recurrent_layers=(False, True, True, True),
                                            full_attention_interval=None),
    "qwen35moe-gate-1d": tiny_qwen35moe_shape(shexp_gate_2d=False, n_expert=8,
                                              n_expert_used=3),
    # group-limited routing (expert_group_count 2, one used), which llama.cpp applies to any
    # MoE family whose file has groups
    "qwen35moe-groups": tiny_qwen35moe_shape(expert_groups=(2, 1)),
}


def run_both(path, seed: int):
    tokens = oracle.random_tokens(V, PROMPT + DECODE, seed)
    ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT, kv_type="f32")
    got = oracle.reflex_logits(path, tokens, n_prompt=PROMPT)
    return ref, got


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_f32_matches_llama_cpp(model_files, name):
    path = model_files(SHAPES[name], weight_type="F32", seed=3)
    ref, got = run_both(path, seed=3)
    c = oracle.check_logits(ref, got, F32_BOUND, name)
    assert c["rel"] < F32_BOUND


def test_expert_groups_matter(model_files):
    """Sanity for "qwen35moe-groups": the same weights routed without groups give other logits,
    so its comparison would catch groups left out."""
    shape = SHAPES["qwen35moe-groups"]
    tokens = oracle.random_tokens(V, PROMPT + DECODE, 3)
    grouped = oracle.reflex_logits(model_files(shape, weight_type="F32", seed=3), tokens,
                                   n_prompt=PROMPT)
    plain = oracle.reflex_logits(model_files(shape.replace(expert_groups=None),
                                             weight_type="F32", seed=3), tokens, n_prompt=PROMPT)
    assert oracle.compare(grouped, plain)["rel"] > 100 * F32_BOUND


def test_state_carries_over(model_files):
    """The decode steps depend on the prompt through the recurrent state: the same last token
    after two different prompts gives different logits, on both sides, by the same amounts."""
    path = model_files(SHAPES["qwen35-default-interval"], weight_type="F32", seed=4)
    a = oracle.random_tokens(V, PROMPT + 1, 7)
    b = oracle.random_tokens(V, PROMPT, 8) + a[-1:]
    ra = oracle.llama_logits(path, a, n_prompt=PROMPT, kv_type="f32")[-1]
    rb = oracle.llama_logits(path, b, n_prompt=PROMPT, kv_type="f32")[-1]
    ga = oracle.reflex_logits(path, a, n_prompt=PROMPT)[-1]
    gb = oracle.reflex_logits(path, b, n_prompt=PROMPT)[-1]
    assert np.abs(ra - rb).max() > 0.1 * np.abs(ra).max()
    np.testing.assert_allclose(ga - gb, ra - rb, atol=F32_BOUND * 2 * np.abs(ra).max())


# Quantized files. llama.cpp's CPU matmuls round each activation row to the weight's vec_dot
# type (Q8_0 for Q8_0, Q8_K for Q4_K); the reference keeps float32. Through a recurrent state and
# (qwen35moe) top-k routing those roundings grow to 0.07-0.2 (dense) and up to 0.7 (MoE: a token
# whose k-th and (k+1)-th router logits are close takes another expert) in the error figure, so a
# bound on the plain reference would say little. The test runs the reference with llama.cpp's
# roundings emulated (testing.oracle.llama_cpu_numerics_ops) and requires agreement to float32
# rounding (EXACT_ROW) on most rows (EXACT_SHARE): an activation that lies on a quantization
# boundary may still round the other way, and from that row on the recurrent state carries the
# difference (0.006-0.04 seen), so every row must stay within EMULATED_MAX. Measured over 8 seeds
# each (2026-12-01), max|diff|/max|ref| per file:
#   Q8_0 dense    plain median 0.066 max 0.11 | emulated median 1.2e-7 max 0.023
#   Q4_K dense    plain median 0.094 max 0.22 | emulated median 0.018 max 0.036
#   Q8_0 qwen35moe plain median 0.20 max 0.69 | emulated median 1.1e-7 max 0.018
#   Q4_K qwen35moe plain median 0.17 max 0.33 | emulated median 3.9e-7 max 0.025
# (the emulated Q4_K dense files agree exactly up to one flipped rounding each); the plain dense
# reference stays within PLAIN_DENSE.
QUANT = {
    "Q8_0-qwen35": (tiny_qwen35_shape(), "Q8_0"),
    "Q4_K-qwen35": (tiny_qwen35_kquant_shape(), "Q4_K"),
    "Q8_0-qwen35moe": (tiny_qwen35moe_shape(), "Q8_0"),
    "Q4_K-qwen35moe": (tiny_qwen35_kquant_shape("qwen35moe"), "Q4_K"),
}
QUANT_SEEDS = 4
EXACT_ROW = 1e-5
EXACT_SHARE = 0.5
EMULATED_MAX = 6e-2
PLAIN_DENSE = 0.3


@pytest.mark.parametrize("name", sorted(QUANT))
def test_quantized_matches_llama_cpp(model_files, name):
    shape, wtype = QUANT[name]
    rows, plain = [], []
    for seed in range(QUANT_SEEDS):
        path = model_files(shape, weight_type=wtype, seed=seed)
        tokens = oracle.random_tokens(V, PROMPT + DECODE, seed)
        ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT, kv_type="f32")
        emu = oracle.reflex_logits(path, tokens, n_prompt=PROMPT,
                                   ops=oracle.llama_cpu_numerics_ops())
        got = oracle.reflex_logits(path, tokens, n_prompt=PROMPT)
        oracle.check_logits(ref, emu, EMULATED_MAX, f"{name} s{seed}")
        rows += (np.abs(emu - ref).max(-1) / np.abs(ref).max()).tolist()
        plain.append(oracle.compare(ref, got)["rel"])
    exact = float(np.mean(np.asarray(rows) <= EXACT_ROW))
    assert exact >= EXACT_SHARE, (name, exact, rows)
    if shape.arch == "qwen35":
        assert max(plain) <= PLAIN_DENSE, (name, plain)


@pytest.mark.parametrize("name", ["qwen35-array", "qwen35moe-array"])
def test_system1_matches_llama_cpp(model_files, name):
    """Candidates scored from forks of the prompt's state in one batched pass = llama.cpp
    scoring each candidate as its own sequence."""
    path = model_files(SHAPES[name], weight_type="F32", seed=5)
    prompt = oracle.random_tokens(V, 9, seed=5)
    cands = [[7], [11, 3, 100], [42, 42], [127, 0, 5, 6, 7]]
    # the prompt once, then every candidate's tokens (all but the last) in ONE batch
    assert oracle.check_system1(path, prompt, cands) == [len(prompt),
                                                         sum(len(c) - 1 for c in cands)]
