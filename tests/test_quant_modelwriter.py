"""The model writer's low-bit, codebook, ternary and FP4 types (modelwriter.EXTRA_WEIGHT_TYPES)
and llama-quantize's per-tensor mixes of the presets (modelwriter.preset_overrides).

* every extra type writes valid blocks whose dequantized values (gguf-py) have the planned std
  and about zero mean, with finite scales; the ternary types hold only the digits their
  quantizers write, MXFP4 power-of-two scales;
* the preset mixes on the benchmark shapes pick, tensor by tensor, what llama-quant.cpp's
  llama_tensor_get_type_impl picks (checked on the tensors each rule singles out, and on the
  resulting sizes: the Qwen3-8B Q3_K_M / IQ4_XS files of the Hub are 4.12 / 4.56 GB);
* a type whose block does not divide ne0 falls back as llama-quantize does.

The llama.cpp comparisons of files of these types: tests/test_oracle_quant_lowbit.py.
"""

from __future__ import annotations

from collections import Counter

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from reflex_core.testing.modelwriter import (
    EXTRA_WEIGHT_TYPES, PRESETS, ModelShape, preset_overrides, qwen3_8b_shape,
    qwen3_30b_a3b_shape, tensor_plan, tiny_kquant_shape, write_model,
)


def _types(shape, preset, **kw):
    ov = preset_overrides(shape, preset, **kw)
    plan = tensor_plan(shape, weight_type=PRESETS[preset], type_overrides=ov)
    return {s.name[: -len(".weight")]: s.ggml_type for s in plan if s.kind == "matrix"}, plan


@pytest.mark.parametrize("wt", EXTRA_WEIGHT_TYPES)
def test_extra_types_dequantize_sanely(tmp_path, wt):
    shape = tiny_kquant_shape(tied=False)
    p = write_model(tmp_path / f"{wt}.gguf", shape, weight_type=wt, seed=5)
    plan = {s.name: s for s in tensor_plan(shape, weight_type=wt)}
    r = gguf.GGUFReader(p)
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == spec.ggml_type, t.name
        if spec.kind != "matrix":
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert x.size == int(np.prod(spec.ne)) and np.isfinite(x).all(), t.name
        assert 0.8 * spec.sigma < x.std() < 1.25 * spec.sigma, (t.name, x.std(), spec.sigma)
        assert abs(x.mean()) < 0.1 * spec.sigma, (t.name, x.mean(), spec.sigma)
        raw = np.asarray(t.data).reshape(-1, gguf.GGML_QUANT_SIZES[t.tensor_type][1])
        blocks = x.reshape(raw.shape[0], -1)
        if wt in ("TQ1_0", "TQ2_0"):  # d * digit, digit in -1..1
            d = raw[:, -2:].copy().view(np.float16).astype(np.float64)
            assert np.isin(blocks / d, (-1.0, 0.0, 1.0)).all(), t.name
        if wt == "MXFP4":  # E8M0 scales near the target, never the extremes
            assert 64 < raw[:, 0].min() and raw[:, 0].max() < 192, t.name


def test_presets_on_qwen3_8b():
    """Q3_K_M and IQ4_XS on the Qwen3-8B shape (36 layers, gqa 4, untied)."""
    shape = qwen3_8b_shape()
    t, plan = _types(shape, "Q3_K_M")
    assert t["output"] == "Q6_K" and t["token_embd"] == "Q3_K"
    assert [t[f"blk.{i}.attn_v"] for i in range(4)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert [t[f"blk.{i}.ffn_down"] for i in (0, 1, 2, 35)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert t["blk.7.attn_output"] == "Q4_K"
    assert {t[f"blk.7.{n}"] for n in ("attn_q", "attn_k", "ffn_gate", "ffn_up")} == {"Q3_K"}
    assert Counter(t.values()) == {"Q3_K": 145, "Q4_K": 104, "Q5_K": 4, "Q6_K": 1}
    assert round(sum(s.nbytes for s in plan) / 1e9, 2) == 4.12

    t, plan = _types(shape, "IQ4_XS")
    assert t["output"] == "Q6_K" and t["token_embd"] == "IQ4_XS"
    assert {t[f"blk.{i}.attn_v"] for i in range(36)} == {"Q5_K"}  # gqa >= 4
    assert {t[f"blk.{i}.ffn_down"] for i in range(36)} == {"IQ4_XS"}
    assert round(sum(s.nbytes for s in plan) / 1e9, 2) == 4.56
    t, _ = _types(shape, "IQ4_XS", imatrix=False)  # then the first eighth of ffn_down is Q5_K
    assert [t[f"blk.{i}.ffn_down"] for i in (0, 3, 4)] == ["Q5_K", "Q5_K", "IQ4_XS"]


def test_presets_on_qwen3_30b_a3b():
    """IQ3_XXS and IQ2_XXS on the Qwen3-30B-A3B shape (48 layers, gqa 8, 128 experts)."""
    shape = qwen3_30b_a3b_shape()
    t, _ = _types(shape, "IQ3_XXS")
    assert t["output"] == "Q5_K" and t["token_embd"] == "IQ3_S"
    assert t["blk.0.attn_v"] == "Q4_K"
    assert t["blk.0.attn_q"] == t["blk.0.attn_k"] == "IQ2_S"
    assert t["blk.0.attn_output"] == "IQ3_S"
    assert {t[f"blk.{i}.ffn_{n}_exps"] for i in range(48) for n in ("gate", "up", "down")} == {"IQ3_XXS"}
    t, _ = _types(shape, "IQ3_XXS", imatrix=False)
    assert [t[f"blk.{i}.ffn_down_exps"] for i in (0, 5, 6)] == ["Q4_K", "Q4_K", "Q3_K"]

    t, _ = _types(shape, "IQ2_XXS")
    assert t["output"] == "Q5_K" and t["token_embd"] == "Q2_K"
    assert t["blk.0.attn_v"] == "Q4_K" and t["blk.0.attn_k"] == "IQ2_XXS"
    assert [t[f"blk.{i}.ffn_down_exps"] for i in (0, 5, 6)] == ["Q2_K", "Q2_K", "IQ2_XXS"]
    assert t["blk.9.ffn_gate_exps"] == t["blk.9.attn_output"] == "IQ2_XXS"


def test_eight_expert_rules():
    """E == 8 (the Mixtral rules of llama-quant.cpp): attn_v/attn_k Q8_0, attn_output Q5_K."""
    shape = tiny_kquant_shape("qwen3moe", n_expert=8, n_expert_used=2)
    t, _ = _types(shape, "Q3_K_M")
    assert t["blk.0.attn_v"] == t["blk.0.attn_k"] == "Q8_0" and t["blk.0.attn_output"] == "Q5_K"
    t, _ = _types(shape, "IQ2_XXS")
    assert t["blk.0.attn_k"] == "Q4_K" and t["blk.0.attn_output"] == "Q5_K"


def test_fallback_when_the_block_does_not_divide_ne0():
    # n_ff = 96: ffn_down has ne0 = 96, a multiple of 32 but not 256
    shape = ModelShape(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=96, tied=False)
    t, _ = _types(shape, "IQ3_XXS")
    assert t["blk.0.ffn_down"] == "IQ4_NL" and t["blk.0.ffn_gate"] == "IQ3_XXS"
    t, _ = _types(shape, "Q3_K_M")
    assert t["blk.1.ffn_down"] == "Q5_0"  # Q4_K -> Q5_0
    t, _ = _types(shape.replace(n_ff=80), "IQ2_XXS")  # 80: no 32-block either
    assert t["blk.1.ffn_down"] == "F16"


def test_preset_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        preset_overrides(qwen3_8b_shape(), "Q1_0")
    from reflex_core.testing.modelwriter import tiny_qwen35_kquant_shape

    with pytest.raises(ValueError, match="qwen3 / qwen3moe"):
        preset_overrides(tiny_qwen35_kquant_shape(), "IQ4_XS")
