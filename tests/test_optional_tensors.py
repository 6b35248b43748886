"""The optional tensors of spec §4.7 that llama.cpp 0.3.36 reads in these families.

Fused projections: ``attn_qkv`` in place of ``attn_q/k/v`` (qwen3, qwen3moe and the attention
layers of qwen35 / qwen35moe) and ``ffn_gate_up_exps`` in place of ``ffn_gate_exps`` +
``ffn_up_exps`` (qwen35moe, deepseek2), as llama.cpp's converter writes them with ``--fuse-qkv``
/ ``--fuse-gate-up-exps`` (spec §4.2, §4.7, §7.3). The models bind the fused tensor's rows as
weights of their own (``Ops.weight_rows``), so a fused file must give the logits of the same file
unfused bit for bit (the writer's fused tensor holds the parts' bytes: same seed, same values).
qwen3moe's llama.cpp graph has no fused experts: such a file is refused there, and here.

Attention biases: ``attn_{q,k,v}.bias``, or a fused ``attn_qkv.bias`` (what the converter's
``--fuse-qkv`` writes for a model with the three), added after their projections
(``Ops.add_bias``), with separate or fused weights, as llama.cpp's ``build_qkv`` adds them.

Against llama.cpp the F32 bounds of the families' oracle tests apply. The oracle tests FAIL
(never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.errors import ModelError
from reflex_core.gguf import open_gguf
from reflex_core.testing import oracle
from reflex_core.testing.modelwriter import (ModelShape, tensor_plan, tiny_deepseek2_shape,
                                             tiny_kquant_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape, write_model)

PROMPT, DECODE = 8, 4
QWEN3 = ModelShape(n_layer=2, n_embd=96, n_head=6, n_head_kv=2, head_dim=48, n_ff=160,
                   n_vocab=160, context_length=512)
QWEN3MOE = ModelShape(arch="qwen3moe", n_layer=2, n_embd=96, n_head=6, n_head_kv=2, head_dim=48,
                      n_ff=160, n_vocab=160, context_length=512, n_expert=8, n_expert_used=2,
                      n_ff_exp=64)

# (shape, weight type, fusions); the F32 bound against llama.cpp is each family's oracle bound
CASES = [
    pytest.param(QWEN3, "Q8_0", ("qkv",), 5e-6, id="qwen3-qkv"),
    pytest.param(tiny_kquant_shape("qwen3", n_vocab=160), "Q4_K", ("qkv",), 5e-6,
                 id="qwen3-qkv-q4_k"),
    pytest.param(QWEN3MOE, "Q8_0", ("qkv",), 5e-6, id="qwen3moe-qkv"),
    pytest.param(tiny_qwen35_shape(), "Q8_0", ("qkv",), 5e-5, id="qwen35-qkv"),
    pytest.param(tiny_qwen35moe_shape(), "Q8_0", ("qkv", "gate_up_exps"), 5e-5,
                 id="qwen35moe-qkv-gate_up"),
    pytest.param(tiny_deepseek2_shape(), "Q8_0", ("gate_up_exps",), 1e-5,
                 id="deepseek2-gate_up"),
]


def _tokens(shape) -> list[int]:
    return oracle.random_tokens(shape.n_vocab or 128, PROMPT + DECODE, seed=2)


@contextmanager
def _numpy_ops(path, cache_weights: bool = True):
    """A NumpyOps attached to the file at ``path``, closed afterwards."""
    g = open_gguf(str(path))
    try:
        ops = NumpyOps(cache_weights=cache_weights)
        ops.attach(g)
        yield ops
    finally:
        g.close()


def _tensor_names(path) -> set[str]:
    g = open_gguf(str(path))
    try:
        return set(g.tensors)
    finally:
        g.close()


@pytest.mark.parametrize("shape, wtype, fuse, _bound", CASES)
def test_a_fused_file_gives_the_unfused_files_logits(tmp_path, shape, wtype, fuse, _bound):
    plain = write_model(tmp_path / "plain.gguf", shape, weight_type=wtype, seed=3)
    fused = write_model(tmp_path / "fused.gguf", shape, weight_type=wtype, seed=3, fuse=fuse)
    names = _tensor_names(fused)
    if "qkv" in fuse:  # (qwen35's GDN blocks have an attn_qkv of their own)
        assert not any(n.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight"))
                       for n in names)
        assert sum(n.endswith("attn_qkv.weight") for n in names) > \
            sum(n.endswith("attn_qkv.weight") for n in _tensor_names(plain))
    if "gate_up_exps" in fuse:
        assert any(n.endswith("ffn_gate_up_exps.weight") for n in names)
        assert not any(n.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")) for n in names)
    tokens = _tokens(shape)
    want = oracle.reflex_logits(plain, tokens, n_prompt=PROMPT)
    got = oracle.reflex_logits(fused, tokens, n_prompt=PROMPT)
    assert np.array_equal(got, want)
    # the views without the float32 cache read their rows of the quantized bytes
    low = oracle.reflex_logits(fused, tokens, n_prompt=PROMPT, ops=NumpyOps(cache_weights=False))
    assert np.array_equal(low, want)


@pytest.mark.oracle
@pytest.mark.parametrize("shape, _wtype, fuse, bound", CASES)
def test_fused_files_match_llama_cpp(tmp_path, shape, _wtype, fuse, bound):
    path = write_model(tmp_path / "fused.gguf", shape, weight_type="F32", seed=4, fuse=fuse)
    tokens = _tokens(shape)
    ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT)
    got = oracle.reflex_logits(path, tokens, n_prompt=PROMPT)
    oracle.check_logits(ref, got, bound, f"{shape.arch} fused {'+'.join(fuse)}")


@pytest.mark.oracle
def test_fused_experts_in_qwen3moe_are_refused_as_llama_cpp_refuses_them(tmp_path):
    path = write_model(tmp_path / "m.gguf", QWEN3MOE, seed=5, fuse=("gate_up_exps",))
    tokens = _tokens(QWEN3MOE)
    with pytest.raises(ModelError, match=r"'blk\.0\.ffn_gate_up_exps\.weight' \(fused gate/up "
                                         r"experts\) is not supported for this architecture"):
        oracle.reflex_logits(path, tokens, n_prompt=PROMPT)
    with pytest.raises(RuntimeError, match="could not load"):
        oracle.llama_logits(path, tokens, n_prompt=PROMPT)


# --- Ops.weight_rows on the reference backend ------------------------------------------------

@pytest.fixture(scope="module")
def fused_moe(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("fused") / "m.gguf", tiny_qwen35moe_shape(),
                       weight_type="Q8_0", seed=7, fuse=("qkv", "gate_up_exps"))


@pytest.mark.parametrize("cache", [True, False])
def test_weight_rows_are_the_rows_of_the_weight(fused_moe, cache):
    with _numpy_ops(fused_moe, cache_weights=cache) as ops:
        qkv = ops.weight("blk.3.attn_qkv.weight")  # the attention block of the tiny qwen35
        whole = ops.dequantize(qkv).copy()
        k = ops.weight_rows(qkv, 256, 64)
        assert k.name == "blk.3.attn_qkv.weight[256:320]" and k.ne == (qkv.ne[0], 64)
        assert np.array_equal(ops.dequantize(k), whole[256:320])
        x = np.random.default_rng(0).standard_normal((3, qkv.ne[0])).astype(np.float32)
        assert np.array_equal(ops.matmul(x, k), x @ whole[256:320].T)

        exps = ops.weight("blk.0.ffn_gate_up_exps.weight")
        D, F2, E = exps.ne
        all_e = ops.dequantize(exps).copy()  # [E, 2 F, D]
        up = ops.weight_rows(exps, F2 // 2, F2 // 2)
        assert up.ne == (D, F2 // 2, E)
        assert np.array_equal(ops.dequantize(up), all_e[:, F2 // 2:])
        ids = np.array([[1, 3], [0, 2]])
        x = np.random.default_rng(1).standard_normal((2, D)).astype(np.float32)
        y = ops.moe_matmul(x, up, ids)
        for t in range(2):
            for j in range(2):
                want = all_e[ids[t, j], F2 // 2:] @ x[t]
                np.testing.assert_allclose(y[t, j], want, rtol=1e-5, atol=1e-5)


def test_a_merge_into_the_weight_is_seen_through_its_rows(fused_moe):
    with _numpy_ops(fused_moe, cache_weights=False) as ops:
        exps = ops.weight("blk.0.ffn_gate_up_exps.weight")
        gate = ops.weight_rows(exps, 0, exps.ne[1] // 2)
        before = ops.dequantize(gate).copy()
        merged = ops.dequantize(exps) + np.float32(1.0)
        ops._f32[exps.name] = merged  # what merge_lora leaves
        assert np.array_equal(ops.dequantize(gate), before + np.float32(1.0))
        assert np.array_equal(ops._expert(gate, 2), merged[2, :exps.ne[1] // 2])


@pytest.mark.parametrize("row0, n, match", [(0, 0, r"rows \[0, 0\)"), (-1, 4, r"rows \[-1, 3\)"),
                                            (400, 100, r"rows \[400, 500\) of .* which has 480")])
def test_weight_rows_outside_the_weight_are_refused(fused_moe, row0, n, match):
    path = write_model(fused_moe.parent / "q3.gguf", QWEN3, seed=8, fuse=("qkv",))
    with _numpy_ops(path) as ops:
        qkv = ops.weight("blk.0.attn_qkv.weight")
        with pytest.raises(ValueError, match=match):
            ops.weight_rows(qkv, row0, n)
        with pytest.raises(ValueError, match="has no rows"):
            ops.weight_rows(ops.weight("blk.0.attn_norm.weight"), 0, 1)


# --- the CUDA backend's views, without a device ------------------------------------------------

def test_cuda_weight_rows_point_into_the_weight_and_keep_the_expert_distance():
    from reflex_core.backends.cuda_backend import CudaOps
    from reflex_core.cuda import quant_ops
    from reflex_core.ops import Weight

    ops = CudaOps.__new__(CudaOps)
    Q8_0 = 8
    base = 1 << 40
    rb = quant_ops.row_bytes(Q8_0, 256)  # 272
    exps = Weight("e", Q8_0, (256, 64, 4), base, quant_ops.plan(Q8_0, (256, 64, 4), base, "e"))
    assert exps.meta.expert_bytes == 64 * rb
    up = ops.weight_rows(exps, 32, 32)
    assert up.data == base + 32 * rb and up.ne == (256, 32, 4)
    assert up.meta.expert_bytes == 64 * rb and up.meta.n_out == 32
    qkv = Weight("w", Q8_0, (256, 48), base, quant_ops.plan(Q8_0, (256, 48), base, "w"))
    v = ops.weight_rows(qkv, 40, 8)
    assert (v.data, v.ne, v.meta.n_out) == (base + 40 * rb, (256, 8), 8)


class _Kern:
    """Records launches (a kernel module as quant_ops sees it)."""

    def __init__(self):
        self.launches = []

    def launch(self, name, grid, block, args, shmem=0):
        self.launches.append((name, args))

    def allow_shmem(self, name, nbytes):
        return False


@pytest.mark.parametrize("grouped", [False, True])
def test_the_moe_launches_take_the_views_expert_distance(grouped):
    from reflex_core.cuda import quant_ops

    Q8_0 = 8
    rb = quant_ops.row_bytes(Q8_0, 256)
    kern = _Kern()
    if grouped:
        quant_ops.moe_matmul_grouped(kern, kern, 1 << 20, Q8_0, 1 << 21, 1 << 22, 1 << 23, 64, 2,
                                     256, 32, 4, 1 << 24, 1 << 25, 1 << 26, up_ptr=1 << 27,
                                     expert_bytes=64 * rb)
        args = kern.launches[-1][1]
        assert kern.launches[-1][0] == "reflex_moe_tiled_q8_0"
        assert args[10] == rb and args[11] == 64 * rb
    else:
        quant_ops.moe_matmul(kern, 1 << 20, Q8_0, 1 << 21, 1 << 22, 1 << 23, 1, 2, 256, 32, 4,
                             up_ptr=1 << 27, expert_bytes=64 * rb)
        args = kern.launches[-1][1]
        assert args[9] == rb and args[10] == 64 * rb
    kern.launches.clear()
    quant_ops.moe_matmul(kern, 1 << 20, Q8_0, 1 << 21, 1 << 22, 1 << 23, 1, 2, 256, 32, 4)
    assert kern.launches[-1][1][10] == 32 * rb  # a whole tensor: its own n_out rows


# --- the writer ----------------------------------------------------------------------------

def test_the_writer_fuses_in_the_converters_order():
    plan = {s.name: s for s in tensor_plan(tiny_qwen35moe_shape(), weight_type="Q8_0",
                                           fuse=("qkv", "gate_up_exps"))}
    qkv = plan["blk.3.attn_qkv.weight"]
    assert [p.short for p in qkv.parts] == ["attn_q", "attn_k", "attn_v"]
    assert qkv.ne[1] == sum(p.ne[1] for p in qkv.parts)
    gu = plan["blk.0.ffn_gate_up_exps.weight"]
    assert [p.short for p in gu.parts] == ["ffn_gate_exps", "ffn_up_exps"]
    assert gu.ne == (gu.parts[0].ne[0], 2 * gu.parts[0].ne[1], gu.parts[0].ne[2])
    # the GDN blocks' attn_qkv is their own tensor, not a fusion
    assert not plan["blk.0.attn_qkv.weight"].parts


@pytest.mark.parametrize("kwargs, match", [
    (dict(shape=QWEN3, fuse=("gate_up_exps",)),
     "no ffn_gate_exps.weight / ffn_up_exps.weight to fuse"),
    (dict(shape=QWEN3, fuse=("qkv",), weight_type="Q4_0", type_overrides={"attn_v": "Q8_0"}),
     "a fused tensor has one"),
    (dict(shape=QWEN3, fuse=("qk",)), "unknown fusion 'qk'"),
])
def test_the_writer_refuses_what_it_cannot_fuse(kwargs, match):
    shape = kwargs.pop("shape")
    with pytest.raises(ValueError, match=match):
        tensor_plan(shape, **kwargs)


# --- attention biases ----------------------------------------------------------------------

BIAS_CASES = [
    pytest.param(QWEN3.replace(qkv_bias=True), (), 5e-6, id="qwen3"),
    pytest.param(QWEN3.replace(qkv_bias=True), ("qkv",), 5e-6, id="qwen3-fused-weights"),
    pytest.param(QWEN3.replace(qkv_bias=True), ("qkv", "qkv_bias"), 5e-6, id="qwen3-fused-bias"),
    pytest.param(QWEN3MOE.replace(qkv_bias=True), (), 5e-6, id="qwen3moe"),
    pytest.param(tiny_qwen35_shape(qkv_bias=True), (), 5e-5, id="qwen35"),
    pytest.param(tiny_qwen35moe_shape(qkv_bias=True), ("qkv", "gate_up_exps"), 5e-5,
                 id="qwen35moe-fused"),
    pytest.param(tiny_qwen35moe_shape(qkv_bias=True), ("qkv", "qkv_bias", "gate_up_exps"), 5e-5,
                 id="qwen35moe-fused-bias"),
]


@pytest.mark.oracle
@pytest.mark.parametrize("shape, fuse, bound", BIAS_CASES)
def test_attention_biases_match_llama_cpp(tmp_path, shape, fuse, bound):
    path = write_model(tmp_path / "b.gguf", shape, seed=9, fuse=fuse)
    names = _tensor_names(path)
    fused = "qkv_bias" in fuse
    assert any(n.endswith("attn_qkv.bias" if fused else "attn_v.bias") for n in names)
    assert not any(n.endswith("attn_v.bias" if fused else "attn_qkv.bias") for n in names)
    tokens = _tokens(shape)
    ref = oracle.llama_logits(path, tokens, n_prompt=PROMPT)
    got = oracle.reflex_logits(path, tokens, n_prompt=PROMPT)
    oracle.check_logits(ref, got, bound, f"{shape.arch} with q/k/v biases")
    # the biases matter: the same file without them is far from it
    plain = write_model(tmp_path / "p.gguf", shape.replace(qkv_bias=False), seed=9,
                        fuse=tuple(f for f in fuse if f != "qkv_bias"))
    assert oracle.compare(ref, oracle.reflex_logits(plain, tokens, n_prompt=PROMPT))["rel"] \
        > 100 * bound


def test_biases_are_added_to_their_projections(tmp_path):
    from reflex_core import blocks

    path = write_model(tmp_path / "b.gguf", QWEN3.replace(qkv_bias=True), seed=10)
    with _numpy_ops(path) as ops:
        w = blocks.bind_attn(ops, 1, 96, 6, 2, 48)
        assert [(b.w.name, b.offset) for b in w.biases] == [
            (f"blk.1.attn_{t}.bias", 0) for t in "qkv"]
        x = np.random.default_rng(3).standard_normal((5, 96)).astype(np.float32)
        q, k, v = blocks.project_qkv(ops, x, (w.attn_q, w.attn_k, w.attn_v), w.biases)
        for y, wt, b in zip((q, k, v), (w.attn_q, w.attn_k, w.attn_v), w.biases):
            assert np.array_equal(y, ops.matmul(x, wt) + ops.dequantize(b.w)[None, :])
        with pytest.raises(ValueError, match="add_bias"):
            ops.add_bias(x, w.biases[1].w, 1)  # 96 columns from element 1 of 96


def test_a_fused_bias_holds_q_k_v_in_turn(tmp_path):
    from reflex_core import blocks

    path = write_model(tmp_path / "b.gguf", QWEN3.replace(qkv_bias=True), seed=10,
                       fuse=("qkv", "qkv_bias"))
    with _numpy_ops(path) as ops:
        w = blocks.bind_attn(ops, 1, 96, 6, 2, 48)
        assert [(b.w.name, b.offset) for b in w.biases] == [
            ("blk.1.attn_qkv.bias", 0), ("blk.1.attn_qkv.bias", 288), ("blk.1.attn_qkv.bias", 384)]
        x = np.random.default_rng(3).standard_normal((5, 96)).astype(np.float32)
        whole = ops.dequantize(ops.weight("blk.1.attn_qkv.bias"))
        got = blocks.project_qkv(ops, x, (w.attn_q, w.attn_k, w.attn_v), w.biases)
        for y, wt, (lo, hi) in zip(got, (w.attn_q, w.attn_k, w.attn_v),
                                   [(0, 288), (288, 384), (384, 480)]):
            assert np.array_equal(y, ops.matmul(x, wt) + whole[None, lo:hi])
