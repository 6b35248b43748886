"""CudaOps against NumpyOps: weights (attach, weight, dequantize, embed, matmul, moe_matmul) on tiny
random GGUFs, of types of both weight-kernel modules (quant, quant_lowbit: the latter loaded only
for a file that has one of its types), batch preparation, views, and whole tiny models (prefill +
decode + a tree batch).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from reflex_core.errors import ReflexError, UnsupportedTensorType
from reflex_core.gguf import GGML_TYPES
from reflex_core.ops import AttnMask, Batch

pytestmark = pytest.mark.gpu

F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, BF16, NVFP4 = 0, 1, 2, 8, 12, 14, 30, 40
Q3_K, IQ4_XS = 11, 23  # served by the quant_lowbit module
# byte offsets of f16 scale fields per block (set to small sane values so outputs stay finite)
F16_FIELDS = {Q4_0: [0], Q8_0: [0], Q4_K: [0, 2], Q6_K: [208], Q3_K: [108], IQ4_XS: [0]}


def random_bytes(rng, t, ne) -> bytes:
    n = int(np.prod(ne))
    if t == F32:
        return rng.standard_normal(n).astype(np.float32).tobytes()
    if t == F16:
        return rng.standard_normal(n).astype(np.float16).tobytes()
    if t == BF16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(
            np.uint16).tobytes()
    info = GGML_TYPES[t]
    k = n // info.block_size
    b = rng.integers(0, 256, (k, info.type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(t, []):
        b[:, off:off + 2] = rng.uniform(0.002, 0.02, k).astype(np.float16).view(np.uint8).reshape(k, 2)
    return b.tobytes()


def close(got, want, rtol, atol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.size} differ; first at {i}: got "
                             f"{got[i]!r}, want {want[i]!r}; max abs err "
                             f"{np.abs(got.astype(np.float64) - want).max():.3g}")


TYPES = [F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q3_K, IQ4_XS]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: GGML_TYPES[t].name)
def test_weights_dequant_embed_matmul(attach_both, t, rng):
    n_in, n_out = 512, 77
    tensors = {
        "w": (random_bytes(rng, t, [n_in, n_out]), [n_in, n_out], t),
        "norm": rng.standard_normal(n_in).astype(np.float32),
    }
    cuda_ops, ref_ops = attach_both(tensors)
    assert cuda_ops.upload_info["method"] in ("registered", "pageable")
    wc, wr = cuda_ops.weight("w"), ref_ops.weight("w")
    assert (wc.ne, wc.ggml_type) == (wr.ne, wr.ggml_type) == ((n_in, n_out), t)
    assert cuda_ops.has_weight("w") and not cuda_ops.has_weight("nope")
    # dequantize: bit-exact with gguf.quants
    close(cuda_ops.to_numpy(cuda_ops.dequantize(wc)), ref_ops.dequantize(wr), 0, 0, "dequantize")
    # embed: rows of the [n_in, n_out] tensor seen as n_out "tokens" of n_in
    b = Batch.causal([5, 0, 76, 5, 33], 0)
    pc, pr = cuda_ops.prepare(b), ref_ops.prepare(b)
    close(cuda_ops.to_numpy(cuda_ops.embed(wc, pc)), ref_ops.embed(wr, pr), 0, 0, "embed")
    # matmul: GEMV (T <= 8) and tiled (T > 8) paths
    for T in (1, 3, 8, 9, 70):
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        got = cuda_ops.to_numpy(cuda_ops.matmul(cuda_ops.from_numpy(x), wc))
        want = ref_ops.matmul(x, wr)
        scale = np.abs(want).max() + 1e-30
        close(got / scale, want / scale, 0, 2e-5, f"matmul T={T}")


def test_matmul_on_row_view(attach_both, rng):
    """take_rows of a contiguous run is a view (possibly unaligned); matmul must handle it."""
    cuda_ops, ref_ops = attach_both({"w": rng.standard_normal((33, 36)).astype(np.float32)})
    x = rng.standard_normal((7, 36)).astype(np.float32)
    for rows in ([6], [1, 2, 3], [0, 4]):
        xs = cuda_ops.take_rows(cuda_ops.from_numpy(x), rows)
        got = cuda_ops.to_numpy(cuda_ops.matmul(xs, cuda_ops.weight("w")))
        close(got, ref_ops.matmul(x[rows], ref_ops.weight("w")), 1e-5, 1e-5, f"rows {rows}")


# q/k/v-like weight sets: (types of q, k, v); mixed types split into per-type launches, each
# from its type's module (Q4_K / IQ4_XS: quant / quant_lowbit)
MANY_SETS = [(F32, F32, F32), (Q8_0, Q8_0, Q8_0), (Q4_K, Q4_K, Q6_K), (Q6_K, Q4_0, Q6_K),
             (BF16, F16, F16), (Q4_K, IQ4_XS, Q4_K), (IQ4_XS, IQ4_XS, Q3_K)]


@pytest.mark.parametrize("types", MANY_SETS,
                         ids=lambda ts: "-".join(GGML_TYPES[t].name for t in ts))
def test_matmul_many_and_swiglu(attach_both, types, rng):
    """matmul_many == the separate matmuls (bit for bit: the same kernel per row) and the NumPy
    twin; matmul_swiglu == swiglu(matmul, matmul) within rounding, and the twin. T = 1 and 7
    (GEMV), 9 and 64 (tiled), 300 (tiled, several token tiles)."""
    n_in = 512
    n_outs = (96, 40, 40)  # q: 2x the k/v rows (GQA); odd multiples of 8
    tensors = {f"w{i}": (random_bytes(rng, t, [n_in, n]), [n_in, n], t)
               for i, (t, n) in enumerate(zip(types, n_outs))}
    tensors["up"] = (random_bytes(rng, types[0], [n_in, 96]), [n_in, 96], types[0])
    cuda_ops, ref_ops = attach_both(tensors)
    wc = [cuda_ops.weight(f"w{i}") for i in range(3)]
    wr = [ref_ops.weight(f"w{i}") for i in range(3)]
    for T in (1, 7, 9, 64, 300):
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        dx = cuda_ops.from_numpy(x)
        got = cuda_ops.matmul_many(dx, wc)
        want = ref_ops.matmul_many(x, wr)
        assert len(got) == 3
        for i in range(3):
            g = cuda_ops.to_numpy(got[i])
            assert g.shape == (T, n_outs[i])
            single = cuda_ops.to_numpy(cuda_ops.matmul(dx, wc[i]))
            close(g, single, 0, 0, f"matmul_many[{i}] vs matmul T={T}")
            scale = np.abs(want[i]).max() + 1e-30
            close(g / scale, want[i] / scale, 0, 2e-5, f"matmul_many[{i}] vs NumPy T={T}")
        assert [cuda_ops.shape(y) for y in cuda_ops.matmul_many(dx, wc[1:2])] == [(T, 40)]
        # SwiGLU: gate w0 (96 rows) and up "up" (same type and shape)
        gate_c, up_c = wc[0], cuda_ops.weight("up")
        y = cuda_ops.to_numpy(cuda_ops.matmul_swiglu(dx, gate_c, up_c))
        unf = cuda_ops.to_numpy(cuda_ops.swiglu(cuda_ops.matmul(dx, gate_c),
                                                cuda_ops.matmul(dx, up_c)))
        scale = np.abs(unf).max() + 1e-30
        close(y / scale, unf / scale, 4e-6, 1e-7, f"matmul_swiglu vs unfused T={T}")
        want = ref_ops.matmul_swiglu(x, wr[0], ref_ops.weight("up"))
        close(y / scale, want / scale, 0, 4e-5, f"matmul_swiglu vs NumPy T={T}")
    # different types / shapes: the unfused fallback
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    dx = cuda_ops.from_numpy(x)
    if types[1] == types[2]:
        y = cuda_ops.to_numpy(cuda_ops.matmul_swiglu(dx, wc[1], wc[2]))
        want = ref_ops.matmul_swiglu(x, wr[1], wr[2])
        scale = np.abs(want).max() + 1e-30
        close(y / scale, want / scale, 0, 4e-5, "matmul_swiglu k/v")
    with pytest.raises(ValueError, match="columns"):
        cuda_ops.matmul_many(cuda_ops.from_numpy(np.zeros((2, 64), np.float32)), wc)


def test_unsupported_type_names_tensor(attach_both, rng):
    info = GGML_TYPES[NVFP4]
    cuda_ops, _ = attach_both({"blk.0.ffn_up.weight": (
        rng.integers(0, 256, 512 // info.block_size * info.type_size, dtype=np.uint8).tobytes(),
        [512, 1], NVFP4)})
    with pytest.raises(UnsupportedTensorType, match=r"blk\.0\.ffn_up\.weight.*NVFP4"):
        cuda_ops.weight("blk.0.ffn_up.weight")


@pytest.mark.parametrize("t", [F32, Q8_0, Q4_K, IQ4_XS], ids=lambda t: GGML_TYPES[t].name)
@pytest.mark.parametrize("per_expert", [False, True], ids=["shared-x", "per-expert-x"])
def test_moe_matmul(attach_both, t, per_expert, rng):
    n_in, n_out, E, k, T = 256, 40, 6, 3, 5
    cuda_ops, ref_ops = attach_both({"exps": (random_bytes(rng, t, [n_in, n_out, E]),
                                              [n_in, n_out, E], t)})
    logits = rng.standard_normal((T, E)).astype(np.float32)
    ids_c, _ = cuda_ops.moe_route(cuda_ops.from_numpy(logits), k)
    ids_r, _ = ref_ops.moe_route(logits, k)
    ids_host = cuda_ops.to_numpy(ids_c)
    shape = (T, k, n_in) if per_expert else (T, n_in)
    x = rng.standard_normal(shape).astype(np.float32)
    got = cuda_ops.to_numpy(cuda_ops.moe_matmul(cuda_ops.from_numpy(x), cuda_ops.weight("exps"),
                                                ids_c))
    want = ref_ops.moe_matmul(x, ref_ops.weight("exps"), ids_host)
    scale = np.abs(want).max()
    close(got / scale, want / scale, 0, 2e-5, "moe_matmul")
    assert sorted(map(tuple, np.sort(ids_host, 1))) == sorted(map(tuple, np.sort(ids_r, 1)))
    # the fused gate/up: vs the unfused CUDA ops and the NumPy twin (same expert tensor as up)
    dx, w = cuda_ops.from_numpy(x), cuda_ops.weight("exps")
    got = cuda_ops.to_numpy(cuda_ops.moe_matmul_swiglu(dx, w, w, ids_c))
    unf = cuda_ops.to_numpy(cuda_ops.swiglu(cuda_ops.moe_matmul(dx, w, ids_c),
                                            cuda_ops.moe_matmul(dx, w, ids_c)))
    scale = np.abs(unf).max()
    close(got / scale, unf / scale, 4e-6, 1e-7, "moe_matmul_swiglu vs unfused")
    want = ref_ops.moe_matmul_swiglu(x, ref_ops.weight("exps"), ref_ops.weight("exps"), ids_host)
    close(got / scale, want / scale, 0, 4e-5, "moe_matmul_swiglu vs NumPy")


ON_DEMAND_SCRIPT = """
import sys
from reflex_core.backends.cuda_backend import CudaOps
from reflex_core.cuda import driver, modules
from reflex_core.cuda.start import start
from reflex_core.gguf import open_gguf

start().wait()
print(sorted(m for p, m in modules._modules if p == "reflex_core"))
ops = CudaOps()
for path in sys.argv[1:]:
    g = open_gguf(path)
    ops.attach(g)
    print(sorted(m for p, m in modules._modules if p == "reflex_core"))
    ops.release()
    g.close()
print("load quant_lowbit" in driver.INIT_STEPS)
"""


def test_the_lowbit_module_loads_only_for_a_file_with_its_types(cuda_device, tmp_path, rng):
    """In a fresh process (this one's tests load modules in any order): the start loads the
    core and quant; attaching a file of common types loads nothing more; attaching one with a
    quant_lowbit type loads that module (timed in the start's steps, so --timings shows it)."""
    from reflex_core.testing.op_harness import write_weights

    common = write_weights(tmp_path / "common.gguf", {
        "w": (random_bytes(rng, Q8_0, [256, 4]), [256, 4], Q8_0),
        "norm": rng.standard_normal(256).astype(np.float32)})
    lowbit = write_weights(tmp_path / "lowbit.gguf", {
        "w": (random_bytes(rng, Q8_0, [256, 4]), [256, 4], Q8_0),
        "exps": (random_bytes(rng, IQ4_XS, [256, 4, 2]), [256, 4, 2], IQ4_XS)})
    p = subprocess.run([sys.executable, "-c", ON_DEMAND_SCRIPT, str(common), str(lowbit)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["['core', 'quant']", "['core', 'quant']",
                                     "['core', 'quant', 'quant_lowbit']", "True"], p.stdout


def test_prepare_and_views(cuda_ops):
    b = Batch.causal([1, 2, 3], 4)
    pb = cuda_ops.prepare(b)
    raw = cuda_ops.to_numpy(pb.buf)
    # tokens, positions, prefix_end, own_start, own_end, sequence ids, the runs, then the first
    # cell (which a decode graph's kernels read from the device)
    assert raw.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4]
    assert pb.n_runs == 1
    two = Batch((1, 2, 3), (0, 1, 2), 0, AttnMask.causal(0, 3), (2, 2, 0))
    pb2 = cuda_ops.prepare(two)
    assert cuda_ops.to_numpy(pb2.buf).tolist()[18:] == [2, 0, 2, 0, 2, 3, 0] and pb2.n_runs == 2
    bad = Batch((1, 2), (0, 1), 0, AttnMask((1, 5), (0, 0), (0, 0)))
    with pytest.raises(ValueError, match="outside cells"):
        cuda_ops.prepare(bad)
    x = cuda_ops.from_numpy(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    v = cuda_ops.view(x, (6, 4))
    assert cuda_ops.shape(v) == (6, 4) and v.ptr == x.ptr
    assert cuda_ops.shape(cuda_ops.view(x, (-1, 12))) == (2, 12)
    with pytest.raises(ValueError):
        cuda_ops.view(x, (5, 5))
    del x  # the view keeps the memory alive
    assert cuda_ops.to_numpy(v)[5].tolist() == [20.0, 21.0, 22.0, 23.0]


def test_kv_cache_full(cuda_ops):
    kc = cuda_ops.zeros((4, 1, 32))
    pb = cuda_ops.prepare(Batch.causal([1, 2, 3], 2))
    k = cuda_ops.from_numpy(np.zeros((3, 1, 32), np.float32))
    with pytest.raises(ReflexError, match="KV cache full"):
        cuda_ops.kv_write(kc, kc, k, k, pb)


def test_allocator_reuses_memory(cuda_ops):
    from reflex_core.cuda import memory

    a = cuda_ops.from_numpy(np.zeros(1000, np.float32))
    p = a.ptr
    del a
    b = cuda_ops.from_numpy(np.ones(1000, np.float32))
    assert b.ptr == p  # the freed block came back from the cache
    assert memory.pool_stats()["live_blocks"] >= 1


# --- whole tiny models: GPU vs CPU ------------------------------------------------------------
def _model(path, ops):
    from reflex_core.gguf import open_gguf
    from reflex_core.registry import get_host

    g = open_gguf(str(path))
    ops.attach(g)
    cls = get_host().resolve(g.get("general.architecture")).load_model_class()
    return g, cls.load(g, ops)


@pytest.mark.parametrize("wt", ["F32", "Q8_0", "Q4_K"])
def test_qwen3_forward_matches_numpy(model_files, cuda_ops, ref_ops, wt):
    from reflex_core.testing.modelwriter import ModelShape, tiny_kquant_shape

    shape = tiny_kquant_shape("qwen3") if wt == "Q4_K" else ModelShape(arch="qwen3")
    path = model_files(shape, wt, seed=3)
    gc, mc = _model(path, cuda_ops)
    gr, mr = _model(path, ref_ops)
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(0, mc.n_vocab, 11)]
    cc, cr = mc.new_state(64, 3), mr.new_state(64, 3)
    b = cr.append(prompt)
    assert cc.append(prompt) == b
    lc = cuda_ops.to_numpy(mc.forward(b, cc, list(range(len(prompt)))))
    lr = mr.forward(b, cr, list(range(len(prompt))))
    s = np.abs(lr).max()
    close(lc / s, lr / s, 0, 2e-4, f"{wt} prefill logits")
    pos = len(prompt)
    for step in range(4):  # greedy decode, one token at a time
        tok = ref_ops.argmax(lr[-1:])[0]
        b = cr.append([tok])
        cc.append([tok])
        lc = mc.forward(b, cc, [0])
        lr = mr.forward(b, cr, [0])
        assert cuda_ops.argmax(lc) == ref_ops.argmax(lr) or np.isclose(
            np.sort(lr[-1])[-1], np.sort(lr[-1])[-2], rtol=1e-4), f"decode step {step}"
        close(cuda_ops.to_numpy(lc) / s, lr / s, 0, 2e-4, f"{wt} decode {step}")
        pos += 1
    # system1-style candidates after the prompt, forked sequences of 2 and 3 tokens
    base = pos
    toks = [int(t) for t in rng.integers(0, mc.n_vocab, 5)]
    for st in (cc, cr):
        st.fork(0, 1)
        st.fork(0, 2)
    b = cr.append_branches({1: toks[:2], 2: toks[2:]})
    assert cc.append_branches({1: toks[:2], 2: toks[2:]}) == b
    assert b.positions == (base, base + 1, base, base + 1, base + 2)
    assert b.mask.visible(2) == list(range(base)) + [base + 2]
    lc = cuda_ops.to_numpy(mc.forward(b, cc, list(range(5))))
    lr = mr.forward(b, cr, list(range(5)))
    close(lc / s, lr / s, 0, 2e-4, f"{wt} tree batch")
    lp_c = cuda_ops.token_logprobs(cuda_ops.from_numpy(lr), toks)
    assert np.allclose(lp_c, ref_ops.token_logprobs(lr, toks), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_launches_per_forward(model_files, cuda_ops, arch):
    """The fused ops at work: a dense Qwen3 layer is 8 launches (add+norm, q/k/v, q/k norm +
    RoPE + KV store, attention, output projection, add+norm, gate/up/SwiGLU, down), a Qwen3-MoE
    layer 11 (router, route, experts gate/up/SwiGLU, experts down, combine); plus embed, the
    final add+norm and the LM head (and take_rows for scattered rows). More than 8 tokens run
    each matmul launch of these Q8_0 weights on x halves, one reflex_x_halves before it:
    4 a dense layer (q/k/v, output, gate/up, down), 2 a MoE layer (q/k/v, output; the router
    is F32 and the experts take the MoE kernels). With ROPE_ATT (the default), up to
    ROPE_ATT_MAX_T tokens the q/k norms, RoPE and KV store run inside the attention's launch: one
    fewer."""
    from reflex_core.backends.cuda_backend import ROPE_ATT, ROPE_ATT_MAX_T
    from reflex_core.cuda import modules
    from reflex_core.testing.modelwriter import ModelShape

    shape = ModelShape(arch=arch, n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=32,
                       n_ff=96, **({"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 64}
                                   if arch == "qwen3moe" else {}))
    _, m = _model(model_files(shape, "Q8_0", seed=5), cuda_ops)
    per_layer = 8 if arch == "qwen3" else 11
    limbs = 4 if arch == "qwen3" else 2
    st = m.new_state(32)
    for tokens, rows, extra in (([3], [0], 0), ([1, 2, 3, 4, 5], [4], 0),
                                (list(range(12)), [0, 11], 1 + limbs * 3)):
        b = st.append(tokens)
        n0 = modules.launch_count()
        m.forward(b, st, rows)
        fused = 1 if ROPE_ATT and len(tokens) <= ROPE_ATT_MAX_T else 0
        assert modules.launch_count() - n0 == 3 + (per_layer - fused) * 3 + extra, (tokens, rows)
