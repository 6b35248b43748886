"""Meta (typed metadata access), vocab_size, rope_params, and Qwen3 hparams/weight binding."""

from __future__ import annotations

import math

import pytest

from reflex_core.errors import ModelError
from reflex_core.hparams import (T_ARRAY, T_BOOL, T_FLOAT32, T_INT32, T_STRING, T_UINT32, Meta,
                                 rope_params, vocab_size)
from reflex_core.ops import Weight


class Arr(list):
    """A metadata array with its element type (like reflex_core.gguf.GGUFArray)."""

    def __init__(self, items, elem_type):
        super().__init__(items)
        self.elem_type = elem_type


def directory(g, n_layer=3, dims=((64, 100), (64, 128))):
    """A tensor directory for ``g`` (Meta bounds counts by it): ``n_layer`` blocks' worth of
    tensors whose dimensions reach the largest of ``dims``."""
    g.tensors = {}
    for i in range(n_layer):
        for j, ne in enumerate(dims):
            name = f"blk.{i}.t{j}.weight"
            g.tensors[name] = g._Info(name, ne, 0, 4)
    return g


def qwen3_meta(fake_gguf, **over):
    g = directory(fake_gguf(path="/models/q.gguf"))
    g.set("general.architecture", "qwen3", T_STRING)
    for k, v, t in [("block_count", 3, T_UINT32), ("context_length", 4096, T_UINT32),
                    ("embedding_length", 64, T_UINT32), ("feed_forward_length", 96, T_UINT32),
                    ("attention.head_count", 4, T_UINT32), ("attention.head_count_kv", 2, T_UINT32),
                    ("attention.key_length", 32, T_UINT32), ("attention.value_length", 32, T_UINT32),
                    ("rope.freq_base", 1e6, T_FLOAT32),
                    ("attention.layer_norm_rms_epsilon", 1e-6, T_FLOAT32)]:
        g.set("qwen3." + k, v, t)
    g.set("tokenizer.ggml.model", "none", T_STRING)
    g.set("qwen3.vocab_size", 100, T_UINT32)
    for k, (v, t) in over.items():
        key = k if k.startswith(("general.", "tokenizer.")) else "qwen3." + k
        if v is None:
            g.metadata.pop(key)
            g.value_types.pop(key)
        else:
            g.set(key, v, t)
    return g


def test_keys_and_scalars(fake_gguf):
    g = qwen3_meta(fake_gguf)
    g.set("qwen3.flag", True, T_BOOL)
    m = Meta(g, "qwen3")
    assert m.key("attention.head_count") == "qwen3.attention.head_count"
    assert m.key("general.architecture") == "general.architecture"
    assert m.key("tokenizer.ggml.model") == "tokenizer.ggml.model"
    assert m.key("qwen3.block_count") == "qwen3.block_count"
    assert m.u32("block_count") == 3 and m.u32("qwen3.block_count") == 3
    assert m.f32("rope.freq_base") == 1e6
    assert m.bool("flag") is True
    assert m.str("general.architecture") == "qwen3"
    assert m.u32("expert_count", 0) == 0 and m.f32("nothing", None) is None
    assert m.has("block_count") and not m.has("expert_count")


def test_missing_and_wrong_kind(fake_gguf):
    g = qwen3_meta(fake_gguf)
    g.set("qwen3.s", "x", T_STRING).set("qwen3.f", 1.5, T_FLOAT32).set("qwen3.i", -1, T_INT32)
    g.set("qwen3.b", True, T_BOOL)
    m = Meta(g, "qwen3")
    with pytest.raises(ModelError, match=r"/models/q\.gguf.*'qwen3\.expert_count' is missing"):
        m.u32("expert_count")
    with pytest.raises(ModelError, match=r"'qwen3\.s' has wrong type string \(expected uint32\)"):
        m.u32("s")
    with pytest.raises(ModelError, match="wrong type float32"):
        m.u32("f")
    with pytest.raises(ModelError, match="out of range"):
        m.u32("i")
    with pytest.raises(ModelError, match="wrong type bool"):
        m.u32("b")
    with pytest.raises(ModelError, match="wrong type uint32"):
        m.f32("block_count")
    with pytest.raises(ModelError, match="expected bool"):
        m.bool("block_count")
    with pytest.raises(ModelError, match="expected string"):
        m.str("block_count")


def test_u32_or_array(fake_gguf):
    g = qwen3_meta(fake_gguf)
    g.set("qwen3.a", Arr([4, 4, 8], T_INT32), T_ARRAY)
    g.set("qwen3.bools", Arr([True, False, True], T_BOOL), T_ARRAY)
    g.set("qwen3.short", Arr([1, 2], T_UINT32), T_ARRAY)
    g.set("qwen3.floats", Arr([1.0, 2.0, 3.0], T_FLOAT32), T_ARRAY)
    m = Meta(g, "qwen3")
    assert m.u32_or_array("attention.head_count", 3) == [4, 4, 4]
    assert m.u32_or_array("a", 3) == [4, 4, 8]
    assert m.u32_or_array("bools", 3) == [1, 0, 1]
    assert m.u32_or_array("absent", 3, 7) == [7, 7, 7]
    with pytest.raises(ModelError, match=r"'qwen3\.short' has 2 entries; expected one per block \(3\)"):
        m.u32_or_array("short", 3)
    with pytest.raises(ModelError, match="array of float32"):
        m.u32_or_array("floats", 3)
    with pytest.raises(ModelError, match="is missing"):
        m.u32_or_array("absent", 3)


def test_vocab_size(fake_gguf):
    g = qwen3_meta(fake_gguf)
    assert vocab_size(g, "qwen3") == 100
    g.set("tokenizer.ggml.model", "gpt2", T_STRING)
    g.set("tokenizer.ggml.tokens", Arr(["a", "b", "c"], T_STRING), T_ARRAY)
    assert vocab_size(g, "qwen3") == 3  # the token list wins over vocab_size
    g2 = qwen3_meta(fake_gguf, vocab_size=(None, None))
    with pytest.raises(ModelError, match="vocab_size"):
        vocab_size(g2, "qwen3")


def test_rope_params_defaults_and_linear(fake_gguf):
    m = Meta(qwen3_meta(fake_gguf, **{"rope.freq_base": (None, None)}), "qwen3")
    p = rope_params(m, 32)
    assert (p.n_rot, p.mode, p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor,
            p.n_ctx_orig) == (32, "neox", 10000.0, 1.0, 0.0, 1.0, 4096)
    m = Meta(qwen3_meta(fake_gguf, **{"rope.scaling.type": ("linear", T_STRING),
                                      "rope.scaling.factor": (2.0, T_FLOAT32)}), "qwen3")
    p = rope_params(m, 32, "norm")
    assert (p.freq_base, p.freq_scale, p.ext_factor, p.mode) == (1e6, 0.5, 0.0, "norm")
    # the old key name, and type none forcing scale 1
    m = Meta(qwen3_meta(fake_gguf, **{"rope.scale_linear": (4.0, T_FLOAT32)}), "qwen3")
    assert rope_params(m, 32).freq_scale == 0.25
    m = Meta(qwen3_meta(fake_gguf, **{"rope.scaling.type": ("none", T_STRING),
                                      "rope.scaling.factor": (4.0, T_FLOAT32)}), "qwen3")
    assert rope_params(m, 32).freq_scale == 1.0


def test_rope_params_yarn(fake_gguf):
    g = qwen3_meta(fake_gguf, **{"rope.scaling.type": ("yarn", T_STRING),
                                 "rope.scaling.factor": (4.0, T_FLOAT32),
                                 "rope.scaling.original_context_length": (1024, T_UINT32)})
    p = rope_params(Meta(g, "qwen3"), 64)
    assert (p.freq_scale, p.ext_factor, p.n_ctx_orig, p.beta_fast, p.beta_slow) == (
        0.25, 1.0, 1024, 32.0, 1.0)
    # the net RoPE magnitude is g(F,1) = 1 + 0.1 ln F: attn_factor cancels the kernel's factor
    assert p.attn_factor * (1 + 0.1 * math.log(4.0)) == pytest.approx(1 + 0.1 * math.log(4.0))
    g.set("qwen3.rope.scaling.attn_factor", 0.5, T_FLOAT32)
    assert rope_params(Meta(g, "qwen3"), 64).attn_factor == pytest.approx(0.5)
    # no original_context_length: context_length
    g.metadata.pop("qwen3.rope.scaling.original_context_length")
    assert rope_params(Meta(g, "qwen3"), 64).n_ctx_orig == 4096
    # deepseek2 with yarn_log_multiplier (mscale == mscale_all): g/g = 1, kernel factor cancelled
    d = fake_gguf()
    d.set("deepseek2.context_length", 4096, T_UINT32)
    d.set("deepseek2.rope.scaling.type", "yarn", T_STRING)
    d.set("deepseek2.rope.scaling.factor", 40.0, T_FLOAT32)
    pd = rope_params(Meta(d, "deepseek2"), 64, "norm", yarn_log_mul=0.707)
    assert pd.attn_factor == pytest.approx(1 / (1 + 0.1 * math.log(40.0)))
    # freq_base 1: YaRN's ramp (a division by log(freq_base)) is undefined -- a one-line error
    # (found by the hparams fuzz target as a ZeroDivisionError in the first forward)
    g.set("qwen3.rope.freq_base", 1.0, T_FLOAT32)
    with pytest.raises(ModelError, match=r"^[^\n]*rope\.freq_base = 1 leaves YaRN rope scaling "
                                         r"undefined$"):
        rope_params(Meta(g, "qwen3"), 64)
    g.set("qwen3.rope.scaling.type", "linear", T_STRING)  # plain RoPE with base 1: allowed
    assert rope_params(Meta(g, "qwen3"), 64).freq_base == 1.0


def test_rope_params_bad_type(fake_gguf):
    for t in ("longrope", "dynamic"):
        m = Meta(qwen3_meta(fake_gguf, **{"rope.scaling.type": (t, T_STRING)}), "qwen3")
        with pytest.raises(ModelError, match=t):
            rope_params(m, 32)


# --- read_transformer_hparams (spec §3): qwen3 and qwen3moe files ------------------------------
def read_hparams(g, arch, ffn="dense"):
    """The family's typed configuration (reflex_core.config), as its plugin reads it."""
    from reflex_qwen3.model import Qwen3Config
    from reflex_qwen3_moe.model import Qwen3MoEConfig

    return (Qwen3MoEConfig if ffn == "moe" else Qwen3Config).from_gguf(g, arch)


def test_qwen3_hparams(fake_gguf):
    hp = read_hparams(qwen3_meta(fake_gguf, nextn_predict_layers=(1, T_UINT32)), "qwen3")
    assert (hp.n_layer, hp.n_layer_all, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim,
            hp.n_ff, hp.n_vocab, hp.n_ctx_train, hp.eps) == (2, 3, 64, 4, 2, 32, 96, 100, 4096,
                                                             pytest.approx(1e-6))
    assert hp.rope.n_rot == 32 and hp.rope.mode == "neox" and hp.rope.freq_base == 1e6
    # key_length defaults to D/H when absent
    hp = read_hparams(qwen3_meta(fake_gguf, **{"attention.key_length": (None, None),
                                               "attention.value_length": (None, None)}), "qwen3")
    assert hp.head_dim == 16
    with pytest.raises(ModelError, match="key_length == value_length"):
        read_hparams(qwen3_meta(fake_gguf, **{"rope.dimension_count": (16, T_UINT32)}), "qwen3")
    with pytest.raises(ModelError, match="not a multiple"):
        read_hparams(qwen3_meta(fake_gguf, **{"attention.head_count_kv": (3, T_UINT32)}), "qwen3")
    with pytest.raises(ModelError, match="layer_norm_rms_epsilon"):
        read_hparams(qwen3_meta(fake_gguf, **{"attention.layer_norm_rms_epsilon": (None, None)}),
                     "qwen3")
    with pytest.raises(ModelError, match="differ"):
        read_hparams(qwen3_meta(fake_gguf, **{"feed_forward_length": (Arr([96, 96, 64], T_UINT32),
                                                                      T_ARRAY)}), "qwen3")


def moe_meta(fake_gguf, **over):
    """A qwen3moe file's metadata: the qwen3 keys under the qwen3moe prefix plus the experts."""
    g = directory(fake_gguf(path="/models/moe.gguf"))
    q = qwen3_meta(fake_gguf)
    for k, v in q.metadata.items():
        g.set(k.replace("qwen3.", "qwen3moe.", 1), v, q.value_types[k])
    g.set("general.architecture", "qwen3moe", T_STRING)
    for k, v, t in [("expert_count", 8, T_UINT32), ("expert_used_count", 2, T_UINT32),
                    ("expert_feed_forward_length", 48, T_UINT32)]:
        g.set("qwen3moe." + k, v, t)
    for k, (v, t) in over.items():
        key = "qwen3moe." + k
        if v is None:
            g.metadata.pop(key)
            g.value_types.pop(key)
        else:
            g.set(key, v, t)
    return g


def test_moe_hparams(fake_gguf):
    """E, k, F_e (fallback F / k, spec §6.1) and the §3 checks, one-line ModelErrors."""
    hp = read_hparams(moe_meta(fake_gguf), "qwen3moe", "moe")
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff) == (8, 2, 48, 96)
    assert (hp.n_layer, hp.head_dim, hp.n_vocab) == (3, 32, 100)
    # F_e absent or 0: F / k
    for fe in (None, 0):
        g = moe_meta(fake_gguf, expert_feed_forward_length=(fe, T_UINT32))
        assert read_hparams(g, "qwen3moe", "moe").n_ff_exp == 48
    g = moe_meta(fake_gguf, expert_feed_forward_length=(None, None),
                 expert_used_count=(4, T_UINT32))
    assert read_hparams(g, "qwen3moe", "moe").n_ff_exp == 24
    # per-layer k: layer 0's value is the one used (spec §4.5); every layer's must fit E
    g = moe_meta(fake_gguf, expert_used_count=(Arr([3, 2, 2], T_UINT32), T_ARRAY))
    assert read_hparams(g, "qwen3moe", "moe").n_expert_used == 3
    # a MoE file needs no dense FFN width, a dense file reads no experts
    g = moe_meta(fake_gguf, feed_forward_length=(None, None))
    assert read_hparams(g, "qwen3moe", "moe").n_ff == 0
    hp = read_hparams(qwen3_meta(fake_gguf), "qwen3")
    assert not any(hasattr(hp, f) for f in ("n_expert", "n_expert_used", "n_ff_exp"))
    bad = [
        (dict(expert_used_count=(9, T_UINT32)),
         r"qwen3moe\.expert_used_count = 9 exceeds qwen3moe\.expert_count = 8"),
        (dict(expert_used_count=(Arr([2, 2, 9], T_UINT32), T_ARRAY)), "exceeds"),
        (dict(expert_count=(None, None)), r"qwen3moe\.expert_count must be > 0"),
        (dict(expert_used_count=(0, T_UINT32)), r"expert_used_count must be > 0"),
        (dict(expert_used_count=(None, None)), r"expert_used_count must be > 0"),
        (dict(expert_feed_forward_length=(None, None), feed_forward_length=(None, None)),
         "expert FFN width is unknown"),
        (dict(expert_feed_forward_length=(Arr([48, 48, 32], T_UINT32), T_ARRAY)), "differ"),
        (dict(expert_group_count=(8, T_UINT32)), "expert_group_count = 8"),
        (dict(expert_count=(8, T_INT32)), None),  # any integer kind is accepted
    ]
    for over, msg in bad:
        g = moe_meta(fake_gguf, **over)
        if msg is None:
            read_hparams(g, "qwen3moe", "moe")
            continue
        with pytest.raises(ModelError, match=msg) as e:
            read_hparams(g, "qwen3moe", "moe")
        assert "\n" not in str(e.value) and str(e.value).startswith("/models/moe.gguf: ")


class PlanOps:
    """Just enough of Ops for binding: weights from modelwriter's tensor plan."""

    def __init__(self, plan, **ne_override):
        self.t = {s.name: Weight(s.name, 0, tuple(s.ne), None) for s in plan}
        for name, ne in ne_override.items():
            name = name.replace("__", ".")
            if ne is None:
                del self.t[name]
            else:
                self.t[name] = Weight(name, 0, tuple(ne), None)

    def weight(self, name):
        if name not in self.t:
            raise ModelError(f"tensor {name!r} is missing from the file")
        return self.t[name]

    def has_weight(self, name):
        return name in self.t

    def weight_rows(self, w, row0, n_rows):
        from reflex_core.ops import rows_view_shape

        ne, name = rows_view_shape(w, row0, n_rows)
        return Weight(name, w.ggml_type, ne, None)


def _fake_file(fake_gguf, shape):
    g = qwen3_meta(fake_gguf, block_count=(shape.n_layer, T_UINT32))
    return g


@pytest.mark.parametrize("tied", [True, False])
def test_qwen3_binding(fake_gguf, tied):
    from reflex_core.testing.modelwriter import ModelShape, tensor_plan
    from reflex_qwen3.model import Qwen3

    shape = ModelShape(n_layer=3, n_vocab=100, tied=tied)
    plan = tensor_plan(shape)
    m = Qwen3(_fake_file(fake_gguf, shape), PlanOps(plan))
    assert m.tied == tied and m.n_vocab == 100 and len(m.layers) == 3
    assert (m.output is m.token_embd) == tied
    assert m.layers[2].attn.attn_k_norm.name == "blk.2.attn_k_norm.weight"
    for override, msg in [({"blk__1__attn_q__weight": (64, 64)}, r"'blk\.1\.attn_q\.weight' has shape"),
                          ({"blk__0__ffn_down__weight": None}, r"'blk\.0\.ffn_down\.weight' is missing"),
                          ({"token_embd__weight": (64, 99)}, "token_embd"),
                          ({"blk__2__attn_k_norm__weight": (16,)}, "attn_k_norm"),
                          ({"blk__0__attn_qkv__weight": (64, 255)},
                           r"'blk\.0\.attn_qkv\.weight' has shape \[64, 255\], expected "
                           r"\[64, 256\]"),
                          ({"blk__0__attn_q__bias": (127,)},
                           r"'blk\.0\.attn_q\.bias' has shape \[127\], expected \[128\]"),
                          ({"blk__0__attn_qkv__bias": (255,)},
                           r"'blk\.0\.attn_qkv\.bias' has shape \[255\], expected \[256\]"),
                          ({"blk__1__attn_k__scale": (1,)}, "per-tensor scales")]:
        with pytest.raises(ModelError, match=msg):
            Qwen3(_fake_file(fake_gguf, shape), PlanOps(plan, **override))
    # a fused attn_qkv of q + k + v rows: bound as its rows, the separate three not read
    m = Qwen3(_fake_file(fake_gguf, shape),
              PlanOps(plan, blk__1__attn_qkv__weight=(64, 256), blk__1__attn_q__weight=None))
    a = m.layers[1].attn
    assert [w.name for w in (a.attn_q, a.attn_k, a.attn_v)] == [
        "blk.1.attn_qkv.weight[0:128]", "blk.1.attn_qkv.weight[128:192]",
        "blk.1.attn_qkv.weight[192:256]"]


def test_meta_on_real_file(model_files):
    from reflex_core.gguf import open_gguf
    from reflex_core.testing.modelwriter import ModelShape

    g = open_gguf(model_files(ModelShape(rope_scaling={"type": "yarn", "factor": 4.0,
                                                       "original_context_length": 16}), "F32"))
    m = Meta(g, "qwen3")
    assert m.u32("attention.key_length") == 32 and m.str("rope.scaling.type") == "yarn"
    assert m.vocab_size() == 128
    p = rope_params(m, 32)
    assert (p.freq_scale, p.ext_factor, p.n_ctx_orig) == (0.25, 1.0, 16)


def test_meta_with_the_core_reader(tmp_path):
    """Arrays and scalar kinds as reflex_core.gguf reports them (GGUFArray.elem_type, value_types)."""
    import gguf

    from reflex_core.gguf import open_gguf

    path = tmp_path / "kv.gguf"
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_uint32("qwen3.block_count", 3)
    w.add_int32("qwen3.signed", 5)
    w.add_array("qwen3.per_layer", [2, 4, 8])  # INT32 elements
    w.add_array("qwen3.flags", [True, False, True])  # BOOL elements
    w.add_array("qwen3.floats", [1.0, 2.0, 3.0])
    w.add_float32("qwen3.eps", 1e-6)
    w.add_bool("qwen3.causal", True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    m = Meta(open_gguf(path), "qwen3")
    assert m.u32("block_count") == 3 and m.u32("signed") == 5
    assert m.u32_or_array("per_layer", 3) == [2, 4, 8]
    assert m.u32_or_array("flags", 3) == [1, 0, 1]
    assert m.u32_or_array("block_count", 3) == [3, 3, 3]
    with pytest.raises(ModelError, match="array of float32"):
        m.u32_or_array("floats", 3)
    with pytest.raises(ModelError, match="has 3 entries; expected one per block"):
        m.u32_or_array("per_layer", 4)
    with pytest.raises(ModelError, match="wrong type array"):
        m.u32("per_layer")
    assert m.f32("eps") == pytest.approx(1e-6) and m.bool("causal") is True
    with pytest.raises(ModelError, match=str(path.name)):
        m.u32("missing")
