"""The random GGUF writer for deepseek2 (reflex_core.testing.modelwriter, spec section 8).

Two halves: the metadata and tensor list read back with reflex_core.gguf match the shape (keys,
value types, names, ne, types, value ranges), and llama.cpp (the oracle, marker ``oracle``: these
FAIL, never skip, without llama-cpp-python) loads every variant and gives finite logits of
O(1-10). A successful load is itself a check of the layout: llama.cpp creates exactly the
tensors its reading of the keys implies (MLA or legacy, q_lora or not, dense lead, MoE) and
refuses a file whose tensors do not match.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from gguf.quants import dequantize
import gguf

from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import (
    DeepSeek2Shape, ModelShape, deepseek_v2_lite_shape, q4_k_m_overrides, tensor_plan,
    tiny_deepseek2_kquant_shape, tiny_deepseek2_legacy_shape, tiny_deepseek2_lite_shape,
    tiny_deepseek2_shape, write_model,
)

A = "deepseek2."


def _block(g, i):
    p = f"blk.{i}."
    return {n[len(p):]: t for n, t in g.tensors.items() if n.startswith(p)}


def _check_u32(g, expect):
    for key, val in expect.items():
        assert g.value_types[A + key] == VT.UINT32, key
        assert g.get(A + key) == val, key


def test_v3_like_keys_and_tensors(tmp_path):
    s = tiny_deepseek2_shape()
    g = open_gguf(write_model(tmp_path / "m.gguf", s))
    assert g.get("general.architecture") == "deepseek2"
    _check_u32(g, {"block_count": 3, "context_length": 256, "embedding_length": 64,
                   "feed_forward_length": 96, "attention.head_count": 4,
                   "attention.head_count_kv": 1, "leading_dense_block_count": 1,
                   "attention.q_lora_rank": 32, "attention.kv_lora_rank": 64,
                   "attention.key_length": 64 + 16, "attention.value_length": 64,
                   "attention.key_length_mla": 48, "attention.value_length_mla": 32,
                   "expert_feed_forward_length": 32, "expert_count": 8, "expert_used_count": 2,
                   "expert_shared_count": 2, "expert_gating_func": 2, "expert_group_count": 4,
                   "expert_group_used_count": 2, "rope.dimension_count": 16,
                   "rope.scaling.original_context_length": 64, "vocab_size": 128})
    for key, val in {"expert_weights_scale": 2.5, "rope.freq_base": 10000.0,
                     "rope.scaling.factor": 4.0}.items():
        assert g.value_types[A + key] == VT.FLOAT32 and g.get(A + key) == val, key
    assert g.value_types[A + "expert_weights_norm"] == VT.BOOL and g.get(A + "expert_weights_norm")
    assert g.get(A + "rope.scaling.type") == "yarn"
    # stored as 0.1·mscale_all_dim (llama.cpp divides by 0.1 on load)
    assert g.get(A + "rope.scaling.yarn_log_multiplier") == pytest.approx(0.1)

    D, H, r_q, r_kv, d_nope, n_rot, d_v, E, Fe = 64, 4, 32, 64, 32, 16, 32, 8, 32
    common = {"attn_norm.weight": (D,), "attn_q_a.weight": (D, r_q), "attn_q_a_norm.weight": (r_q,),
              "attn_q_b.weight": (r_q, H * (d_nope + n_rot)),
              "attn_kv_a_mqa.weight": (D, r_kv + n_rot), "attn_kv_a_norm.weight": (r_kv,),
              "attn_k_b.weight": (d_nope, r_kv, H), "attn_v_b.weight": (r_kv, d_v, H),
              "attn_output.weight": (H * d_v, D), "ffn_norm.weight": (D,)}
    dense = {"ffn_gate.weight": (D, 96), "ffn_up.weight": (D, 96), "ffn_down.weight": (96, D)}
    moe = {"ffn_gate_inp.weight": (D, E), "exp_probs_b.bias": (E,),
           "ffn_gate_exps.weight": (D, Fe, E), "ffn_up_exps.weight": (D, Fe, E),
           "ffn_down_exps.weight": (Fe, D, E), "ffn_gate_shexp.weight": (D, 2 * Fe),
           "ffn_up_shexp.weight": (D, 2 * Fe), "ffn_down_shexp.weight": (2 * Fe, D)}
    for i in range(3):
        ts = _block(g, i)
        want = {**common, **(dense if i == 0 else moe)}
        assert {n: t.ne for n, t in ts.items()} == want, i
    ts = _block(g, 1)
    assert ts["ffn_gate_inp.weight"].type_name == ts["exp_probs_b.bias"].type_name == "F32"
    assert "output.weight" not in g.tensors  # tied
    assert set(g.tensors) == {t.name for t in tensor_plan(s)}


def test_lite_keys_and_tensors(tmp_path):
    s = tiny_deepseek2_lite_shape()
    assert s.lite and s.q_lora_rank == 0
    g = open_gguf(write_model(tmp_path / "m.gguf", s))
    _check_u32(g, {"block_count": 26, "attention.kv_lora_rank": 32, "expert_gating_func": 1,
                   "expert_group_count": 1, "expert_group_used_count": 1})
    # V2-Lite's converted files: no q_lora_rank, no expert_weights_norm (false), scale 1
    assert A + "attention.q_lora_rank" not in g.value_types
    assert A + "expert_weights_norm" not in g.value_types
    assert g.get(A + "expert_weights_scale") == 1.0
    assert g.get(A + "rope.scaling.yarn_log_multiplier") == pytest.approx(0.0707)
    ts = _block(g, 25)
    assert ts["attn_q.weight"].ne == (32, 2 * (32 + 8))
    assert not any(n.startswith("attn_q_") for n in ts)
    assert "exp_probs_b.bias" not in ts


def test_legacy_keys_and_tensors(tmp_path):
    s = tiny_deepseek2_legacy_shape()
    g = open_gguf(write_model(tmp_path / "m.gguf", s))
    _check_u32(g, {"attention.head_count_kv": 4, "attention.key_length": 48,
                   "attention.value_length": 32})
    assert A + "attention.key_length_mla" not in g.value_types
    assert A + "attention.value_length_mla" not in g.value_types
    ts = _block(g, 0)
    assert ts["attn_kv_b.weight"].ne == (64, 4 * (32 + 32))
    assert "attn_k_b.weight" not in ts and "attn_v_b.weight" not in ts


def test_q8_0_types_and_values(tmp_path):
    s = tiny_deepseek2_shape(tied=False)
    p = write_model(tmp_path / "m.gguf", s, weight_type="Q8_0", seed=4)
    plan = {t.name: t for t in tensor_plan(s, weight_type="Q8_0")}
    r = gguf.GGUFReader(p)
    assert len(r.tensors) == len(plan)
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == spec.ggml_type, t.name
        x = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
        assert np.isfinite(x).all(), t.name
        if len(spec.ne) == 1 or t.name.endswith("ffn_gate_inp.weight"):
            assert spec.ggml_type == "F32", t.name
        else:
            assert spec.ggml_type == "Q8_0", t.name
        if spec.kind == "norm":
            assert 0.8 < x.mean() < 1.2 and 0.02 < x.std() < 0.25, t.name
        elif x.size >= 256:
            assert 0.8 * spec.sigma < x.std() < 1.25 * spec.sigma, (t.name, x.std(), spec.sigma)
    # k_b / v_b / kv_b act on the unit-RMS latent: 1/sqrt(r_kv)
    assert plan["blk.0.attn_k_b.weight"].sigma == pytest.approx(1 / 8)
    assert plan["blk.0.attn_v_b.weight"].sigma == pytest.approx(1 / 8)
    assert plan["blk.1.exp_probs_b.bias"].sigma == pytest.approx(0.1)


def test_q4_k_m_mix(tmp_path):
    s = tiny_deepseek2_kquant_shape(n_layer=8, tied=False, qk_nope_head_dim=128)
    ov = q4_k_m_overrides(s)
    # use_more_bits over 8 blocks: i < 1, i >= 7, (i - 1) % 3 == 2 (block 0 is the dense lead)
    assert [i for i in range(1, 8) if ov[f"blk.{i}.ffn_down_exps"] == "Q6_K"] == [3, 6, 7]
    assert ov["blk.0.ffn_down"] == "Q6_K" and ov["blk.3.ffn_down_shexp"] == "Q6_K"
    assert ov["blk.1.ffn_down_shexp"] == "Q4_K"
    assert ov["blk.1.attn_k_b"] == "Q5_0"  # ne0 = d_nope = 128: the quantizer's Q4_K fallback
    assert ov["blk.1.attn_v_b"] == ov["blk.1.attn_kv_a_mqa"] == ov["blk.1.attn_q_b"] == "Q4_K"
    assert ov["output"] == "Q6_K" and ov["token_embd"] == "Q4_K"
    g = open_gguf(write_model(tmp_path / "m.gguf", s, weight_type="Q4_K", type_overrides=ov))
    assert g.tensors["blk.1.attn_k_b.weight"].type_name == "Q5_0"
    assert g.tensors["blk.3.ffn_down_exps.weight"].type_name == "Q6_K"
    assert g.tensors["blk.1.ffn_gate_inp.weight"].type_name == "F32"
    assert g.get("general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    legacy = q4_k_m_overrides(tiny_deepseek2_kquant_shape(n_layer=8, mla=False))
    # attn_kv_b is attn_v-like; a tied embedding is quantized like the head
    assert [i for i in range(8) if legacy[f"blk.{i}.attn_kv_b"] == "Q6_K"] == [0, 3, 6, 7]
    assert legacy["token_embd"] == "Q6_K"


def test_v2_lite_benchmark_shape():
    s = deepseek_v2_lite_shape()
    assert s.lite and s.q_lora_rank == 0 and s.d_qk == 192 and not s.tied
    assert (s.n_layer, s.n_embd, s.n_head, s.kv_lora_rank, s.n_rot, s.v_head_dim) == (27, 2048, 16, 512, 64, 128)
    assert (s.n_expert, s.n_expert_used, s.n_ff_exp, s.n_expert_shared, s.n_ff) == (64, 6, 1408, 2, 10944)
    ov = q4_k_m_overrides(s)
    plan = {t.name: t for t in tensor_plan(s, weight_type="Q4_K", type_overrides=ov)}
    # llama-quantize's fallbacks on V2-Lite's widths (ne0 % 256 != 0)
    assert plan["blk.0.ffn_down.weight"].ggml_type == "Q8_0"  # 10944, use_more_bits layer
    assert plan["blk.3.ffn_down_exps.weight"].ggml_type == "Q5_0"  # 1408
    assert plan["blk.5.ffn_down_exps.weight"].ggml_type == "Q8_0"  # 1408, use_more_bits layer
    assert plan["blk.5.ffn_down_shexp.weight"].ggml_type == "Q6_K"  # 2816
    assert plan["blk.3.attn_k_b.weight"].ggml_type == "Q5_0"  # 128
    assert plan["blk.3.attn_q.weight"].ne == (2048, 16 * 192)
    assert plan["output.weight"].ggml_type == "Q6_K"
    assert 10.0e9 < sum(t.nbytes for t in plan.values()) < 10.8e9  # published Q4_K_M: ~10.4 GB


@pytest.mark.parametrize("bad, match", [
    (dict(q_lora_rank=0), "lite"),
    (dict(n_layer=26), "lite"),
    (dict(expert_group_count=3), "divide"),
    (dict(expert_group_used_count=4), "expert_group_used_count"),
    (dict(expert_gating_func=3), "expert_gating_func"),
    (dict(n_rot=15), "even"),
    (dict(n_expert_shared=0), "n_expert_shared"),
    (dict(arch="qwen3"), "deepseek2"),
])
def test_bad_shapes_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        tensor_plan(tiny_deepseek2_shape(**bad))


def test_deepseek2_arch_needs_its_shape():
    with pytest.raises(ValueError, match="DeepSeek2Shape"):
        tensor_plan(ModelShape(arch="deepseek2"))
    assert isinstance(tiny_deepseek2_lite_shape(), DeepSeek2Shape)


# --------------------------------------------------------------------------------------------
# llama.cpp loads the files

TOKENS = [1, 5, 9, 33, 2, 77, 100, 4, 8, 16, 3, 64]

VARIANTS = {
    "v3-f32": (tiny_deepseek2_shape(), "F32", False),
    "v3-untied-no-yarn-f16": (tiny_deepseek2_shape(tied=False, rope_scaling=None,
                                                   yarn_mscale_all_dim=None), "F16", False),
    "lite-f32": (tiny_deepseek2_lite_shape(), "F32", False),
    "legacy-f32": (tiny_deepseek2_legacy_shape(), "F32", False),
    "legacy-lite-f32": (tiny_deepseek2_lite_shape(mla=False), "F32", False),
    "v3-q8_0": (tiny_deepseek2_shape(), "Q8_0", False),
    "lite-q8_0": (tiny_deepseek2_lite_shape(), "Q8_0", False),
    "kquant-q4_k_m": (tiny_deepseek2_kquant_shape(tied=False), "Q4_K", True),
}


def _sane(logits):
    assert np.isfinite(logits).all()
    top = float(np.abs(logits).max())
    assert 1.0 < top < 50.0, top
    assert 0.5 < float(logits.std()) < 10.0


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(VARIANTS))
def test_llama_cpp_loads(tmp_path, case):
    from reflex_core.testing.oracle import llama_logits

    shape, wtype, mix = VARIANTS[case]
    p = write_model(tmp_path / "m.gguf", shape, weight_type=wtype, seed=2,
                    type_overrides=q4_k_m_overrides(shape) if mix else None)
    logits = llama_logits(p, TOKENS, n_prompt=8)
    assert logits.shape == (len(TOKENS), 128)
    _sane(logits)


@pytest.mark.oracle
@pytest.mark.parametrize("change", [dict(exp_probs_bias=False), dict(yarn_mscale_all_dim=0.707),
                                    dict(expert_weights_scale=1.0)])
def test_llama_cpp_reads_routing_and_yarn_fields(tmp_path, change):
    """Each field the writer adds changes llama.cpp's logits (every other tensor keeps its bytes:
    a tensor's data depend only on the seed, its name, type and shape)."""
    from reflex_core.testing.oracle import llama_logits

    base = llama_logits(write_model(tmp_path / "a.gguf", tiny_deepseek2_shape(), seed=5), TOKENS)
    other = llama_logits(write_model(tmp_path / "b.gguf", tiny_deepseek2_shape(**change), seed=5),
                         TOKENS)
    _sane(other)
    assert np.abs(base - other).max() > 1e-3, change


@pytest.mark.oracle
def test_deepseek_llm_tokenizer(tmp_path):
    """tokenizer='deepseek-llm' copies llama.cpp's DeepSeek-LLM vocab (REFLEX_LLAMA_VOCAB_DIR;
    the test fails, never skips, without it) and llama.cpp serves the file."""
    from reflex_core.testing.oracle import llama_logits

    s = tiny_deepseek2_lite_shape(n_vocab=102400)
    p = write_model(tmp_path / "m.gguf", s, weight_type="Q8_0", tokenizer="deepseek-llm")
    g = open_gguf(p)
    assert g.get("tokenizer.ggml.pre") == "deepseek-llm" and g.get("tokenizer.ggml.model") == "gpt2"
    assert len(g.get("tokenizer.ggml.tokens")) == 102400 and g.get(A + "vocab_size") == 102400
    assert g.get("tokenizer.ggml.bos_token_id") == 100000 and g.get("tokenizer.ggml.add_bos_token")
    assert g.get("tokenizer.ggml.tokens")[100001] == "<\uff5cend\u2581of\u2581sentence\uff5c>"
    logits = llama_logits(p, [100000, 5, 900, 4000], n_prompt=2)
    assert logits.shape == (4, 102400)
    assert np.isfinite(logits).all()
    with pytest.raises(ValueError, match="102400 tokens"):
        write_model(tmp_path / "n.gguf", tiny_deepseek2_lite_shape(n_vocab=1000), tokenizer="deepseek-llm")
