"""The random GGUF model writer (reflex_core.testing.modelwriter)."""

import numpy as np
import pytest
import gguf
from gguf import GGUFValueType as VT
from gguf.quants import dequantize

from reflex_core.gguf import open_gguf
from reflex_core.testing.modelwriter import (
    Q4_K_M_OVERRIDES, WEIGHT_TYPES, ModelShape, qwen3_0_6b_shape, qwen3_30b_a3b_shape, qwen3_8b_shape,
    q4_k_m_overrides, tensor_plan, tiny_kquant_shape, write_model,
)

K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
MOE = ModelShape(arch="qwen3moe", n_expert=4, n_expert_used=2, n_ff_exp=32)


def _field(r, key):
    f = r.fields[key]
    return f.types[0], f.contents()


def _tensors(r):
    return {t.name: t for t in r.tensors}


def test_dense_keys_and_tensors(tmp_path):
    p = write_model(tmp_path / "m.gguf", ModelShape())
    r = gguf.GGUFReader(p)
    assert _field(r, "general.architecture") == (VT.STRING, "qwen3")
    for key, val in [("block_count", 2), ("context_length", 256), ("embedding_length", 64),
                     ("feed_forward_length", 96), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                     ("attention.key_length", 32), ("attention.value_length", 32), ("vocab_size", 128)]:
        assert _field(r, f"qwen3.{key}") == (VT.UINT32, val), key
    t, v = _field(r, "qwen3.rope.freq_base")
    assert t == VT.FLOAT32 and v == 1e6
    t, v = _field(r, "qwen3.attention.layer_norm_rms_epsilon")
    assert t == VT.FLOAT32 and v == pytest.approx(1e-6)
    assert _field(r, "tokenizer.ggml.model") == (VT.STRING, "none")
    assert _field(r, "general.file_type") == (VT.UINT32, 0)
    assert "qwen3.expert_count" not in r.fields

    ts = _tensors(r)
    assert "output.weight" not in ts  # tied
    expect = {"token_embd.weight": [64, 128], "output_norm.weight": [64], "blk.1.attn_norm.weight": [64],
              "blk.0.attn_q.weight": [64, 128], "blk.0.attn_k.weight": [64, 64], "blk.0.attn_v.weight": [64, 64],
              "blk.0.attn_output.weight": [128, 64], "blk.0.attn_q_norm.weight": [32],
              "blk.0.attn_k_norm.weight": [32], "blk.0.ffn_norm.weight": [64], "blk.0.ffn_gate.weight": [64, 96],
              "blk.0.ffn_up.weight": [64, 96], "blk.1.ffn_down.weight": [96, 64]}
    for name, ne in expect.items():
        assert list(ts[name].shape) == ne, name
        assert ts[name].tensor_type == gguf.GGMLQuantizationType.F32
    assert len(ts) == 1 + 2 * 11 + 1

    # the core's reader sees the same
    g = open_gguf(p)
    assert g.value_types["qwen3.block_count"] == VT.UINT32
    assert list(g.tensors["blk.0.attn_output.weight"].ne) == [128, 64]


def test_untied_has_output(tmp_path):
    r = gguf.GGUFReader(write_model(tmp_path / "m.gguf", ModelShape(tied=False, n_vocab=96)))
    ts = _tensors(r)
    assert list(ts["output.weight"].shape) == [64, 96]
    assert list(ts["token_embd.weight"].shape) == [64, 96]


def test_moe_keys_and_tensors(tmp_path):
    r = gguf.GGUFReader(write_model(tmp_path / "m.gguf", MOE, weight_type="F16"))
    assert _field(r, "general.architecture") == (VT.STRING, "qwen3moe")
    assert _field(r, "qwen3moe.expert_count") == (VT.UINT32, 4)
    assert _field(r, "qwen3moe.expert_used_count") == (VT.UINT32, 2)
    assert _field(r, "qwen3moe.expert_feed_forward_length") == (VT.UINT32, 32)
    ts = _tensors(r)
    assert list(ts["blk.0.ffn_gate_inp.weight"].shape) == [64, 4]
    assert ts["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(ts["blk.0.ffn_gate_exps.weight"].shape) == [64, 32, 4]
    assert list(ts["blk.0.ffn_up_exps.weight"].shape) == [64, 32, 4]
    assert list(ts["blk.1.ffn_down_exps.weight"].shape) == [32, 64, 4]
    assert ts["blk.1.ffn_down_exps.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert ts["blk.0.ffn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert "blk.0.ffn_gate.weight" not in ts


def test_rope_scaling_keys(tmp_path):
    shape = ModelShape(rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 16})
    r = gguf.GGUFReader(write_model(tmp_path / "m.gguf", shape))
    assert _field(r, "qwen3.rope.scaling.type") == (VT.STRING, "yarn")
    assert _field(r, "qwen3.rope.scaling.factor") == (VT.FLOAT32, 4.0)
    assert _field(r, "qwen3.rope.scaling.original_context_length") == (VT.UINT32, 16)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
def test_weight_types_dequantize_sanely(tmp_path, wt):
    shape = tiny_kquant_shape() if wt in K_TYPES else ModelShape()
    p = write_model(tmp_path / f"{wt}.gguf", shape, weight_type=wt, seed=5)
    plan = {s.name: s for s in tensor_plan(shape, weight_type=wt)}
    r = gguf.GGUFReader(p)
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == spec.ggml_type, t.name
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert x.size == int(np.prod(spec.ne)), t.name
        assert np.isfinite(x).all(), t.name
        if spec.kind == "norm":
            assert 0.9 < x.mean() < 1.1 and 0.02 < x.std() < 0.2, t.name
        else:
            assert 0.8 * spec.sigma < x.std() < 1.25 * spec.sigma, (t.name, x.std(), spec.sigma)
            assert abs(x.mean()) < 0.25 * spec.sigma, (t.name, x.mean(), spec.sigma)


def test_moe_kquant(tmp_path):
    shape = tiny_kquant_shape("qwen3moe", tied=False)
    p = write_model(tmp_path / "m.gguf", shape, weight_type="Q4_K", type_overrides=Q4_K_M_OVERRIDES)
    r = gguf.GGUFReader(p)
    ts = _tensors(r)
    assert ts["blk.0.ffn_down_exps.weight"].tensor_type.name == "Q6_K"
    assert ts["blk.0.ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
    assert ts["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    x = dequantize(ts["blk.0.ffn_down_exps.weight"].data, ts["blk.0.ffn_down_exps.weight"].tensor_type)
    assert x.shape == (4, 256, 256) and np.isfinite(x).all()


def test_type_overrides_q4_k_m(tmp_path):
    shape = tiny_kquant_shape(tied=False)
    p = write_model(tmp_path / "m.gguf", shape, weight_type="Q4_K", type_overrides=Q4_K_M_OVERRIDES)
    r = gguf.GGUFReader(p)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.attn_v.weight"] == types["blk.1.attn_v.weight"] == "Q6_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_output.weight"] == "Q4_K"  # "output" does not match attn_output
    assert types["blk.0.attn_q.weight"] == types["blk.0.ffn_up.weight"] == "Q4_K"
    assert types["output_norm.weight"] == "F32"
    assert _field(r, "general.file_type") == (VT.UINT32, int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    # full-name patterns address single layers
    plan = tensor_plan(shape, weight_type="Q8_0", type_overrides={"blk.1.attn_q": "F16"})
    types = {s.name: s.ggml_type for s in plan}
    assert types["blk.1.attn_q.weight"] == "F16" and types["blk.0.attn_q.weight"] == "Q8_0"


def test_deterministic(tmp_path):
    shape = tiny_kquant_shape()
    a = write_model(tmp_path / "a.gguf", shape, weight_type="Q4_K", seed=3).read_bytes()
    b = write_model(tmp_path / "b.gguf", shape, weight_type="Q4_K", seed=3).read_bytes()
    c = write_model(tmp_path / "c.gguf", shape, weight_type="Q4_K", seed=4).read_bytes()
    assert a == b
    assert a != c and len(a) == len(c)
    d = write_model(tmp_path / "d.gguf", ModelShape(), weight_type="F16", seed=3).read_bytes()
    assert d == write_model(tmp_path / "e.gguf", ModelShape(), weight_type="F16", seed=3).read_bytes()


def test_zero_data(tmp_path):
    r = gguf.GGUFReader(write_model(tmp_path / "z.gguf", ModelShape(), weight_type="Q8_0", zero_data=True))
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type)
        if t.name.endswith("norm.weight"):
            assert (x == 1).all()
        else:
            assert (x == 0).all()


def test_kquant_needs_ne0_multiple_of_256(tmp_path):
    with pytest.raises(ValueError, match="multiple of 256"):
        write_model(tmp_path / "bad.gguf", ModelShape(), weight_type="Q4_K")
    with pytest.raises(ValueError, match="multiple of 256"):
        write_model(tmp_path / "bad.gguf", ModelShape(), weight_type="Q8_0", type_overrides={"ffn_down": "Q6_K"})
    assert not (tmp_path / "bad.gguf").exists()
    with pytest.raises(ValueError, match="unsupported weight_type"):
        write_model(tmp_path / "bad.gguf", ModelShape(), weight_type="Q1_0")


def test_qwen3_tokenizer_metadata(tmp_path):
    p = write_model(tmp_path / "t.gguf", ModelShape(n_layer=1), tokenizer="qwen3")
    g = open_gguf(p)
    vt = g.value_types
    assert g.get("tokenizer.ggml.model") == "gpt2" and g.get("tokenizer.ggml.pre") == "qwen2"
    assert "qwen3.vocab_size" not in g.metadata
    tokens = g.metadata["tokenizer.ggml.tokens"]
    types = g.metadata["tokenizer.ggml.token_type"].tolist()
    merges = g.metadata["tokenizer.ggml.merges"]
    assert len(tokens) == len(types) == 151936 and len(merges) == 151387
    assert g.metadata["tokenizer.ggml.token_type"].elem_type == VT.INT32
    assert tokens[0] == "!" and tokens[12095] == "\u0120Paris" and merges[0] == "\u0120 \u0120"
    assert types[:151643] == [1] * 151643
    assert tokens[151645] == "<|im_end|>" and types[151645] == 3
    assert tokens[151657] == "<tool_call>" and types[151657] == 4  # not special, not <|...|>
    assert tokens[151659] == "<|fim_prefix|>" and types[151659] == 3  # looks special -> CONTROL
    assert tokens[151667] == "<think>" and types[151667] == 4
    assert tokens[151669] == "[PAD151669]" and set(types[151669:]) == {5}
    for key, val in [("eos_token_id", 151645), ("bos_token_id", 151643), ("padding_token_id", 151643)]:
        assert g.get(f"tokenizer.ggml.{key}") == val and vt[f"tokenizer.ggml.{key}"] == VT.UINT32
    assert g.get("tokenizer.ggml.add_bos_token") is False and vt["tokenizer.ggml.add_bos_token"] == VT.BOOL
    assert "<|im_start|>" in g.get("tokenizer.chat_template")
    assert list(g.tensors["token_embd.weight"].ne) == [64, 151936]


def test_benchmark_shapes():
    s = qwen3_0_6b_shape()
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.tied, s.n_vocab) == \
        (28, 1024, 16, 8, 128, 3072, True, 151936)
    s = qwen3_8b_shape()
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.tied) == (36, 4096, 32, 8, 128, 12288, False)
    s = qwen3_30b_a3b_shape()
    assert (s.arch, s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.n_expert, s.n_expert_used, s.n_ff_exp, s.tied) == \
        ("qwen3moe", 48, 2048, 32, 4, 128, 8, 768, False)

    def gb(shape, wt, ov=None):
        return sum(t.nbytes for t in tensor_plan(shape, weight_type=wt, tokenizer="qwen3", type_overrides=ov)) / 1e9

    assert 0.6 < gb(qwen3_0_6b_shape(), "Q8_0") < 0.7
    # the real files: Qwen3-8B Q4_K_M 5.03 GB, Qwen3-30B-A3B Q4_K_M 18.6 GB
    assert 4.9 < gb(qwen3_8b_shape(), "Q4_K", q4_k_m_overrides(qwen3_8b_shape())) < 5.2
    assert 18.2 < gb(qwen3_30b_a3b_shape(), "Q4_K", q4_k_m_overrides(qwen3_30b_a3b_shape())) < 19


def test_q4_k_m_overrides_follow_use_more_bits():
    shape = qwen3_8b_shape()
    types = {s.name: s.ggml_type for s in tensor_plan(shape, weight_type="Q4_K", type_overrides=q4_k_m_overrides(shape))}
    six = [i for i in range(36) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    assert all(types[f"blk.{i}.attn_v.weight"] == "Q6_K" for i in six)
    assert types["blk.4.attn_v.weight"] == types["blk.4.attn_q.weight"] == "Q4_K"
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"


@pytest.mark.oracle
@pytest.mark.parametrize("case", ["F32", "Q8_0", "BF16", "Q4_K", "Q5_K", "Q6_K", "moe-F16", "moe-Q4_K_M", "yarn"])
def test_llama_cpp_loads_and_logits_are_sane(tmp_path, case):
    import llama_cpp
    wt, ov, shape = case, None, ModelShape()
    if case in K_TYPES:
        shape = tiny_kquant_shape()
    elif case == "moe-F16":
        wt, shape = "F16", MOE
    elif case == "moe-Q4_K_M":
        wt, ov, shape = "Q4_K", Q4_K_M_OVERRIDES, tiny_kquant_shape("qwen3moe", tied=False)
    elif case == "yarn":
        wt, shape = "F32", ModelShape(rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 16})
    p = write_model(tmp_path / "m.gguf", shape, weight_type=wt, type_overrides=ov, seed=2)
    m = llama_cpp.Llama(str(p), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    toks = [1, 5, 17, 100, 3, 42, 7, 9]
    m.eval(toks)
    logits = np.array(m.scores[: len(toks)])
    assert np.isfinite(logits).all()
    std = logits.std(axis=1)
    assert (std > 0.5).all() and (std < 10).all(), std
    assert np.abs(logits).max() < 40
    # the context matters (attention is not degenerate)
    m.reset()
    m.eval([2, 9, 33, 9])
    other = np.array(m.scores[3])
    assert np.linalg.norm(other - logits[7]) > 0.1 * np.linalg.norm(logits[7])


@pytest.mark.oracle
def test_llama_cpp_reads_qwen3_tokenizer(tmp_path):
    import llama_cpp

    p = write_model(tmp_path / "t.gguf", ModelShape(n_layer=1), tokenizer="qwen3")
    m = llama_cpp.Llama(str(p), n_ctx=64, verbose=False, vocab_only=True)
    assert m.tokenize(b" Paris", add_bos=True, special=True) == [12095]
    assert m.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=True, special=True) == [151644, 872, 198, 6023, 151645]
    assert m.tokenize(b"<think>a</think>", add_bos=False, special=False) == [151667, 64, 151668]
    assert (m.token_eos(), m.token_bos()) == (151645, 151643)
