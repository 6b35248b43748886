"""The random GGUF writer for qwen35 / qwen35moe (reflex_core.testing.modelwriter, spec section 7).

Two halves: the metadata and tensor list read back with reflex_core.gguf match the shape (keys,
value types, names, ne, types, value ranges), and llama.cpp (the oracle, marker ``oracle``: these
FAIL, never skip, without llama-cpp-python) loads the files and gives finite logits of O(1-10).
A successful load is itself a check of the layer-kind metadata: llama.cpp creates the GDN or the
attention tensors of a block from ``recurrent_layers`` / ``full_attention_interval`` and refuses
a file whose tensors do not match, so the shapes below use patterns that differ from the
interval-4 default.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from gguf.quants import dequantize
import gguf

from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import (
    ModelShape, Qwen35Shape, q4_k_m_overrides, qwen35_0_8b_shape, qwen35_35b_a3b_shape,
    tensor_plan, tiny_qwen35_kquant_shape, tiny_qwen35moe_shape, tiny_qwen35_shape, write_model,
)

GDN_TENSORS = ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
               "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight")
ATTN_TENSORS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                "attn_q_norm.weight", "attn_k_norm.weight")
# 5 blocks: GDN, attention, GDN, GDN, attention -- not what the interval rule (4) would give
PATTERN = (True, False, True, True, False)


def _tensors_of_block(g, i):
    p = f"blk.{i}."
    return {n[len(p):]: t for n, t in g.tensors.items() if n.startswith(p)}


def test_dense_keys_and_tensors(tmp_path):
    shape = tiny_qwen35_shape(n_layer=5, recurrent_layers=PATTERN)
    g = open_gguf(write_model(tmp_path / "m.gguf", shape))
    assert g.get("general.architecture") == "qwen35"
    u32 = {"block_count": 5, "context_length": 256, "embedding_length": 64,
           "feed_forward_length": 96, "attention.head_count": 4, "attention.head_count_kv": 2,
           "attention.key_length": 32, "attention.value_length": 32, "rope.dimension_count": 8,
           "ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2,
           "ssm.time_step_rank": 4, "ssm.inner_size": 64, "full_attention_interval": 4,
           "vocab_size": 128}
    for key, val in u32.items():
        assert g.value_types[f"qwen35.{key}"] == VT.UINT32, key
        assert g.get(f"qwen35.{key}") == val, key
    assert g.value_types["qwen35.rope.freq_base"] == VT.FLOAT32
    assert g.get("qwen35.rope.freq_base") == 1e7
    sec = g.get("qwen35.rope.dimension_sections")
    assert sec.elem_type == VT.INT32 and list(sec) == [2, 1, 1, 0]  # n_rot/2 = 4 split 11:11:10
    rl = g.get("qwen35.attention.recurrent_layers")
    assert rl.elem_type == VT.BOOL and list(rl) == list(PATTERN)
    assert "qwen35.nextn_predict_layers" not in g.value_types
    assert "qwen35.expert_count" not in g.value_types

    D, conv_dim, Hv, dk = 64, 2 * 2 * 16 + 4 * 16, 4, 16
    for i, recurrent in enumerate(PATTERN):
        ts = _tensors_of_block(g, i)
        assert ("ssm_a" in ts) == recurrent and ("attn_q.weight" in ts) == (not recurrent), i
        assert "ffn_norm.weight" not in ts  # the pre-FFN norm is post_attention_norm here
        assert set(ts) == set((GDN_TENSORS if recurrent else ATTN_TENSORS)
                              + ("attn_norm.weight", "post_attention_norm.weight",
                                 "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")), i
    ts = _tensors_of_block(g, 0)
    expect = {"attn_qkv.weight": (D, conv_dim), "attn_gate.weight": (D, Hv * dk),
              "ssm_beta.weight": (D, Hv), "ssm_alpha.weight": (D, Hv), "ssm_conv1d.weight": (4, conv_dim),
              "ssm_dt.bias": (Hv,), "ssm_a": (Hv,), "ssm_norm.weight": (dk,),
              "ssm_out.weight": (Hv * dk, D), "ffn_down.weight": (96, D)}
    for name, ne in expect.items():
        assert ts[name].ne == ne, name
    ts = _tensors_of_block(g, 1)
    assert ts["attn_q.weight"].ne == (D, 2 * 4 * 32)  # per head [q_h, gate_h]
    assert ts["attn_k.weight"].ne == ts["attn_v.weight"].ne == (D, 2 * 32)
    assert ts["attn_output.weight"].ne == (4 * 32, D)
    assert ts["attn_q_norm.weight"].ne == (32,)
    assert "output.weight" not in g.tensors  # tied
    assert set(g.tensors) == {s.name for s in tensor_plan(shape)}


def test_interval_fallback_writes_no_layer_keys(tmp_path):
    shape = tiny_qwen35_shape(n_layer=5, full_attention_interval=None)
    assert shape.recurrent_flags() == [True, True, True, False, True]  # llama.cpp's default 4
    g = open_gguf(write_model(tmp_path / "m.gguf", shape))
    assert "qwen35.full_attention_interval" not in g.value_types
    assert "qwen35.attention.recurrent_layers" not in g.value_types
    assert "blk.3.attn_q.weight" in g.tensors and "blk.4.ssm_a" in g.tensors
    two = tiny_qwen35_shape(full_attention_interval=2)
    assert two.recurrent_flags() == [True, False, True, False]


def test_mtp_block(tmp_path):
    shape = tiny_qwen35_shape(nextn_predict_layers=1, mtp_shared_head=True)
    assert shape.recurrent_flags() == [True, True, True, False, False]
    g = open_gguf(write_model(tmp_path / "m.gguf", shape))
    assert g.get("qwen35.block_count") == 5
    assert g.value_types["qwen35.nextn_predict_layers"] == VT.UINT32
    assert g.get("qwen35.nextn_predict_layers") == 1
    ts = _tensors_of_block(g, 4)
    assert ts["nextn.eh_proj.weight"].ne == (128, 64)
    assert ts["nextn.enorm.weight"].ne == ts["nextn.hnorm.weight"].ne == (64,)
    assert ts["nextn.shared_head_head.weight"].ne == (64, 128)
    assert ts["nextn.shared_head_norm.weight"].ne == (64,)
    assert "attn_q.weight" in ts and "ffn_up.weight" in ts and "ssm_a" not in ts
    no_head = open_gguf(write_model(tmp_path / "n.gguf", tiny_qwen35_shape(nextn_predict_layers=1)))
    assert "blk.4.nextn.eh_proj.weight" in no_head.tensors
    assert not any("shared_head" in n for n in no_head.tensors)
    with pytest.raises(ValueError, match="MTP blocks"):
        tensor_plan(tiny_qwen35_shape(nextn_predict_layers=1, recurrent_layers=(True,) * 5))


@pytest.mark.parametrize("gate_2d", [True, False])
def test_moe_keys_and_tensors(tmp_path, gate_2d):
    shape = tiny_qwen35moe_shape(shexp_gate_2d=gate_2d, tied=False)
    g = open_gguf(write_model(tmp_path / "m.gguf", shape, weight_type="F16"))
    assert g.get("general.architecture") == "qwen35moe"
    for key, val in {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
                     "expert_shared_feed_forward_length": 64}.items():
        assert g.value_types[f"qwen35moe.{key}"] == VT.UINT32 and g.get(f"qwen35moe.{key}") == val
    assert "qwen35moe.feed_forward_length" not in g.value_types  # n_ff = 0
    ts = _tensors_of_block(g, 3)
    assert ts["ffn_gate_inp.weight"].ne == (64, 4) and ts["ffn_gate_inp.weight"].type_name == "F32"
    assert ts["ffn_gate_exps.weight"].ne == ts["ffn_up_exps.weight"].ne == (64, 32, 4)
    assert ts["ffn_down_exps.weight"].ne == (32, 64, 4)
    assert ts["ffn_gate_inp_shexp.weight"].ne == ((64, 1) if gate_2d else (64,))
    assert ts["ffn_gate_inp_shexp.weight"].type_name == "F32"
    assert ts["ffn_gate_shexp.weight"].ne == ts["ffn_up_shexp.weight"].ne == (64, 64)
    assert ts["ffn_down_shexp.weight"].ne == (64, 64)
    assert ts["ffn_down_shexp.weight"].type_name == "F16"
    assert "ffn_gate.weight" not in ts
    assert g.tensors["output.weight"].ne == (64, 128)


def test_q8_0_types_and_values(tmp_path):
    shape = tiny_qwen35_shape()
    p = write_model(tmp_path / "m.gguf", shape, weight_type="Q8_0", seed=4)
    plan = {s.name: s for s in tensor_plan(shape, weight_type="Q8_0")}
    r = gguf.GGUFReader(p)
    f32_always = ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a")
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == spec.ggml_type, t.name
        x = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
        assert np.isfinite(x).all(), t.name
        if len(spec.ne) == 1 or t.name.endswith(f32_always):
            assert spec.ggml_type == "F32", t.name
        else:
            assert spec.ggml_type == "Q8_0", t.name
        if t.name.endswith("ssm_a"):  # -exp(U(-1, 1))
            assert (x < -np.exp(-1) * 0.999).all() and (x > -np.exp(1) * 1.001).all()
        elif t.name.endswith("ssm_dt.bias"):
            assert -2.5 < x.mean() < 0.5 and (x < 0.5).all()
        elif spec.kind == "norm":
            assert 0.8 < x.mean() < 1.2 and 0.02 < x.std() < 0.25, t.name
        elif x.size >= 256:
            assert 0.8 * spec.sigma < x.std() < 1.25 * spec.sigma, (t.name, x.std(), spec.sigma)
    conv = plan["blk.0.ssm_conv1d.weight"]
    assert conv.sigma == pytest.approx(0.5)  # 1/sqrt(K_c)


def test_q4_k_m_mix(tmp_path):
    shape = tiny_qwen35_kquant_shape("qwen35moe", n_layer=8, tied=False)
    ov = q4_k_m_overrides(shape)
    # llama-quantize's use_more_bits over 8 blocks: i < 1, i >= 7, (i - 1) % 3 == 2
    more = [i for i in range(8) if f"blk.{i}.ffn_down_exps" in ov]
    assert more == [0, 3, 6, 7]
    g = open_gguf(write_model(tmp_path / "m.gguf", shape, weight_type="Q4_K", type_overrides=ov))
    assert g.tensors["blk.0.attn_qkv.weight"].type_name == "Q6_K"  # GDN block: attn_v-like
    assert g.tensors["blk.3.attn_v.weight"].type_name == "Q6_K"  # attention block
    assert g.tensors["blk.1.attn_qkv.weight"].type_name == "Q4_K"
    assert g.tensors["blk.6.ffn_down_shexp.weight"].type_name == "Q6_K"
    assert g.tensors["blk.1.ffn_down_exps.weight"].type_name == "Q4_K"
    assert g.tensors["blk.1.ssm_out.weight"].type_name == "Q4_K"
    assert g.tensors["blk.1.ssm_conv1d.weight"].type_name == "F32"
    assert g.tensors["output.weight"].type_name == "Q6_K"
    assert g.tensors["token_embd.weight"].type_name == "Q4_K"
    assert g.get("general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tied = q4_k_m_overrides(tiny_qwen35_kquant_shape())
    assert tied["token_embd"] == "Q6_K"  # a tied embedding is quantized like the head


def test_benchmark_shapes():
    s = qwen35_0_8b_shape()
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_rot) == (24, 1024, 8, 2, 256, 64)
    assert s.dimension_sections() == [11, 11, 10, 0]
    assert s.recurrent_flags().count(False) == 6 and s.tied and s.n_vocab == 248320
    plan = tensor_plan(s, weight_type="Q8_0")
    assert 0.7e9 < sum(t.nbytes for t in plan) < 0.9e9
    m = qwen35_35b_a3b_shape()
    assert (m.arch, m.n_layer, m.n_expert, m.n_expert_used, m.ssm_time_step_rank) == ("qwen35moe", 40, 256, 8, 32)
    plan = tensor_plan(m, weight_type="Q4_K", type_overrides=q4_k_m_overrides(m))
    assert 19e9 < sum(t.nbytes for t in plan) < 23e9


@pytest.mark.parametrize("bad, match", [
    (dict(ssm_time_step_rank=3), "multiple of"),
    (dict(recurrent_layers=(True, False)), "expected n_layer"),
    (dict(n_rot=7), "n_rot"),
    (dict(n_rot=64), "n_rot"),
    (dict(rope_sections=(0, 0, 0, 0)), "sections"),
    (dict(full_attention_interval=0), "full_attention_interval"),
    (dict(arch="qwen3"), "qwen35"),
    (dict(arch="qwen35moe"), "qwen35moe needs"),
])
def test_bad_shapes_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        tensor_plan(tiny_qwen35_shape(**bad))


def test_qwen35_arch_needs_its_shape():
    with pytest.raises(ValueError, match="Qwen35Shape"):
        tensor_plan(ModelShape(arch="qwen35"))
    assert isinstance(tiny_qwen35moe_shape(), Qwen35Shape)


# --------------------------------------------------------------------------------------------
# llama.cpp loads the files


def _sane(logits):
    assert np.isfinite(logits).all()
    top = float(np.abs(logits).max())
    assert 1.0 < top < 50.0, top
    assert 0.5 < float(logits.std()) < 10.0


TOKENS = [5, 17, 3, 99, 42, 7, 1, 64, 5, 11, 12]

LOADS = {
    "explicit-pattern-Hv>Hk": (tiny_qwen35_shape(n_layer=5, recurrent_layers=PATTERN), "F32"),
    "interval-fallback": (tiny_qwen35_shape(n_layer=5, full_attention_interval=None), "F32"),
    "interval-2": (tiny_qwen35_shape(full_attention_interval=2), "F32"),
    "moe-shexp-gate-2d": (tiny_qwen35moe_shape(shexp_gate_2d=True, tied=False), "F32"),
    "moe-shexp-gate-1d": (tiny_qwen35moe_shape(shexp_gate_2d=False), "F16"),
    "q8_0": (tiny_qwen35_shape(n_layer=5, recurrent_layers=PATTERN), "Q8_0"),
    "moe-q4_k_m": (tiny_qwen35_kquant_shape("qwen35moe"), "Q4_K"),
}


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(LOADS))
def test_llama_cpp_loads(tmp_path, case):
    from reflex_core.testing.oracle import llama_logits

    shape, wt = LOADS[case]
    ov = q4_k_m_overrides(shape) if wt == "Q4_K" else None
    p = write_model(tmp_path / "m.gguf", shape, weight_type=wt, seed=1, type_overrides=ov)
    logits = llama_logits(p, TOKENS, n_prompt=7)
    assert logits.shape == (len(TOKENS), 128)
    _sane(logits)


@pytest.mark.oracle
def test_qwen35_tokenizer(tmp_path):
    """tokenizer="qwen35": the Qwen3 token list under pre-tokenizer "qwen35"; llama.cpp loads it."""
    from reflex_core.testing.oracle import llama_logits

    p = write_model(tmp_path / "m.gguf", tiny_qwen35_shape(), weight_type="Q8_0", tokenizer="qwen35")
    g = open_gguf(p)
    assert g.get("tokenizer.ggml.model") == "gpt2" and g.get("tokenizer.ggml.pre") == "qwen35"
    assert len(g.get("tokenizer.ggml.tokens")) == g.tensors["token_embd.weight"].ne[1] == 151936
    g.close()
    logits = llama_logits(p, [9707, 11, 1879, 0], n_prompt=3)
    assert logits.shape == (4, 151936)
    _sane(logits)


@pytest.mark.oracle
def test_llama_cpp_mtp_block_leaves_logits_unchanged(tmp_path):
    """An MTP block loads (its tensors are counted, the block is not run for logits): the same
    trunk without it gives the same logits (every tensor's values depend only on seed + name)."""
    from reflex_core.testing.oracle import llama_logits

    with_mtp = write_model(tmp_path / "a.gguf", tiny_qwen35_shape(nextn_predict_layers=1,
                                                                  mtp_shared_head=True), seed=2)
    trunk = write_model(tmp_path / "b.gguf", tiny_qwen35_shape(), seed=2)
    a = llama_logits(with_mtp, TOKENS, n_prompt=7)
    _sane(a)
    np.testing.assert_array_equal(a, llama_logits(trunk, TOKENS, n_prompt=7))


def _silence(path, tensor):
    """Overwrite a tensor's bytes with zeros in place (an attn_output of zeros makes its block
    add nothing to the residual stream)."""
    g = open_gguf(path)
    info = g.tensors[tensor]
    offset, nbytes = info.offset, info.nbytes
    g.close()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(nbytes))


@pytest.mark.oracle
def test_llama_cpp_logits_depend_on_recurrent_state(tmp_path):
    """A token's logits depend on a token older than the conv window (K_c - 1 = 3 tokens), which
    only the delta-rule state S can carry: one GDN block, then an attention block whose output
    projection is zeroed (llama.cpp 0.3.36 aborts on a file without any attention block)."""
    from reflex_core.testing.oracle import llama_logits

    shape = tiny_qwen35_shape(n_layer=2, recurrent_layers=(True, False))
    p = write_model(tmp_path / "m.gguf", shape, seed=3)
    _silence(p, "blk.1.attn_output.weight")
    alone = llama_logits(p, [5], n_prompt=1)[0]
    _sane(alone)
    after = llama_logits(p, [9, 33, 70, 2, 44, 5], n_prompt=4)[-1]
    assert np.abs(after - alone).max() > 0.1 * np.abs(alone).max()
    # the prompts differ only in their first token, 5 positions before the last one
    a = llama_logits(p, [9, 33, 70, 2, 44, 5], n_prompt=6)[-1]
    b = llama_logits(p, [101, 33, 70, 2, 44, 5], n_prompt=6)[-1]
    assert np.abs(a - b).max() > 0.05 * np.abs(a).max()
