"""DeepSeek-V2/V3 (deepseek2) on the NumPy reference vs llama.cpp (the oracle).

Tiny random files (testing.modelwriter's DeepSeek2Shape) through llama.cpp's CPU build and the
plugin's model on NumpyOps with the same batching: a prompt of PROMPT tokens as ONE batch, then
DECODE single-token steps over the latent cache. The files cover:

* V3-like: query LoRA, sigmoid gating with the selection bias, 4 expert groups keeping 2,
  renormalised weights scaled by 2.5, one dense lead layer, 2 shared experts, YaRN (factor 4,
  mscale_all_dim 1);
* V2-Lite-like: 26 blocks (llama.cpp's lite rule: no query LoRA), softmax, no groups, no
  renormalisation, YaRN with mscale_all_dim 0.707;
* legacy: ``attn_kv_b`` instead of ``attn_k_b``/``attn_v_b`` (decompressed multi-head K/V);
* V3-like without rope scaling, and with an untied head;
* V3-like and legacy with the query temperature (``attention.temperature_scale`` / ``_length``);
* V3-like with a NextN/MTP block, and GLM-4.7-Flash's shape class (47 + 1 blocks, 154880 tokens,
  no gating key: sigmoid by llama.cpp's rule).

Bounds. F32 weights with an F32 KV cache: both sides compute in float32; the spec's validation
reached 7.5e-7 (absorbed MLA) and 3.6e-6 (legacy, lite); measured here 5.9e-7 - 1.0e-6 over two
seeds of each file (2026-12-01). Quantized files: as in test_oracle_qwen35.py, the reference with
llama.cpp's activation roundings emulated must agree to float32 rounding on most rows (a value on
a quantization boundary, or a router near-tie, may go the other way from some row on).

These tests FAIL (never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations


import numpy as np
import pytest

from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import (tiny_deepseek2_kquant_shape, tiny_deepseek2_legacy_shape,
                                             tiny_deepseek2_lite_shape, tiny_deepseek2_shape)

pytestmark = pytest.mark.oracle

PROMPT, DECODE = 9, 5
V = 128  # the writer's vocabulary without a tokenizer
F32_BOUND = 1e-5

SHAPES = {
    "v3": tiny_deepseek2_shape(),
    "v2-lite": tiny_deepseek2_lite_shape(),
    "legacy": tiny_deepseek2_legacy_shape(),
    "v3-no-rope-scaling": tiny_deepseek2_shape(rope_scaling=None, yarn_mscale_all_dim=None),
    "v3-untied-softmax": tiny_deepseek2_shape(tied=False, expert_gating_func=1,
                                              expert_weights_scale=None, exp_probs_bias=False),
    # Llama-4-style query temperature (Mistral-Large-3): a floor every 3 positions, so the
    # 14 tokens see 5 different factors
    "v3-temperature": tiny_deepseek2_shape(attn_temperature=(0.8, 3)),
    "legacy-temperature": tiny_deepseek2_legacy_shape(attn_temperature=(0.8, 3)),
    # a NextN/MTP block after the trunk (loaded by llama.cpp, never run for the logits)
    "v3-mtp": tiny_deepseek2_shape(nextn_predict_layers=1, mtp_shared_head=True),
}

# GLM-4.7-Flash's shape class: 47 blocks + one MTP block and a 154880-token vocabulary, where a
# file without expert_gating_func routes by sigmoid (llama.cpp's rule; elsewhere softmax). Tiny
# widths; deep enough that float32 rounding reaches 7e-6 of the logits (softmax would be ~1.2).
GLM47_LITE = tiny_deepseek2_shape(n_layer=47, n_vocab=154880, n_embd=32, n_head=2, n_ff=64,
                                  q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, n_rot=8,
                                  v_head_dim=32, n_expert=4, n_expert_used=2, n_ff_exp=32,
                                  expert_gating_func=None, expert_group_count=1,
                                  expert_group_used_count=1, nextn_predict_layers=1)
GLM47_BOUND = 2e-5


def run_both(path, seed: int, ops=None):
    tokens = oracle.random_tokens(V, PROMPT + DECODE, seed)
    ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT, kv_type="f32")
    got = oracle.reflex_logits(path, tokens, n_prompt=PROMPT, ops=ops)
    return ref, got


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_f32_matches_llama_cpp(model_files, name):
    for seed in range(2):
        path = model_files(SHAPES[name], weight_type="F32", seed=seed)
        ref, got = run_both(path, seed)
        oracle.check_logits(ref, got, F32_BOUND, f"{name} seed {seed}")


def test_glm47_flash_shape_matches_llama_cpp(model_files):
    for seed in range(2):
        path = model_files(GLM47_LITE, weight_type="F32", seed=seed)
        tokens = oracle.random_tokens(GLM47_LITE.n_vocab, PROMPT + DECODE, seed)
        ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT, kv_type="f32")
        model = oracle.load_model(path)
        assert model.cfg.gating == "sigmoid" and model.cfg.n_layer == 47
        got = oracle.model_logits(model, tokens, n_prompt=PROMPT)
        oracle.check_logits(ref, got, GLM47_BOUND, f"glm-4.7-flash-like seed {seed}")


# Measured over 8 seeds each (2026-12-01): share of rows within EXACT_ROW with the roundings
# emulated / the emulated run's worst row / the plain reference (routing near-ties included):
#   Q8_0 V3-like  0.98 / 0.0067 / median 0.034 max 0.44
#   Q8_0 legacy   1.00 / 1.6e-7 / median 0.15  max 0.84
#   Q4_K V3-like  0.69 / 0.031  / median 0.053 max 0.55
QUANT = {
    "Q8_0-v3": (tiny_deepseek2_shape(), "Q8_0"),
    "Q8_0-legacy": (tiny_deepseek2_legacy_shape(), "Q8_0"),
    "Q4_K-v3": (tiny_deepseek2_kquant_shape(), "Q4_K"),
}
QUANT_SEEDS = 4
EXACT_ROW = 1e-5
EXACT_SHARE = 0.5
EMULATED_MAX = 0.1


@pytest.mark.parametrize("name", sorted(QUANT))
def test_quantized_matches_llama_cpp(model_files, name):
    shape, wtype = QUANT[name]
    rows = []
    for seed in range(QUANT_SEEDS):
        path = model_files(shape, weight_type=wtype, seed=seed)
        ref, emu = run_both(path, seed, ops=oracle.llama_cpu_numerics_ops())
        oracle.check_logits(ref, emu, EMULATED_MAX, f"{name} s{seed}")
        rows += (np.abs(emu - ref).max(-1) / np.abs(ref).max()).tolist()
    exact = float(np.mean(np.asarray(rows) <= EXACT_ROW))
    assert exact >= EXACT_SHARE, (name, exact, rows)


@pytest.mark.parametrize("name", ["v3", "legacy"])
def test_system1_matches_llama_cpp(model_files, name):
    """One tree-masked forward pass over the latent cache = llama.cpp scoring each candidate
    as its own sequence."""
    path = model_files(SHAPES[name], weight_type="F32", seed=5)
    prompt = oracle.random_tokens(V, 9, seed=5)
    cands = [[7], [11, 3, 100], [42, 42], [127, 0, 5, 6, 7]]
    assert oracle.check_system1(path, prompt, cands) == [len(prompt) + sum(map(len, cands))]
