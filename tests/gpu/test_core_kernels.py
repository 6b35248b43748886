"""Every core kernel (cuda/core.cu) against its NumPy twin (the NumpyOps op of the same name), on
fresh random inputs and odd sizes. Kernels are reached through the CudaOps op that launches them
(the op only checks shapes and packs parameters), plus a few raw launches.

Cases whose id contains "big" are the realistic sizes (V = 151936, T = 300, n_kv ~ 700); the
rest are small and odd. Failures print where the first mismatch is.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from reflex_core import sampling
from reflex_core.backends.cuda_backend import (ATT_TILED_MIN_T, _attention_kernel,
                                               _attention_tiled_kernel)
from reflex_core.errors import ReflexError
from reflex_core.ops import AttnMask, Batch, Ops, RopeParams
from reflex_core.testing.op_harness import KVBuffers

pytestmark = pytest.mark.gpu

V_BIG = 151936


def close(got, want, rtol=1e-5, atol=1e-6, what=""):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        err = np.abs(got.astype(np.float64) - want)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at {i}: got "
            f"{got[i]!r}, want {want[i]!r}; max abs err {err.max():.3g}")


def both(cuda_ops, ref_ops, batch):
    return cuda_ops.prepare(batch), ref_ops.prepare(batch)


# --- smoke / raw launch ----------------------------------------------------------------------
def test_smoke(cuda_device):
    from reflex_core.cuda.smoke import smoke

    r = smoke()
    assert r["sm"] == cuda_device.sm and r["image"] in ("sass", "ptx")


def test_raw_launch_add(cuda_ctx, rng):
    k = cuda_ctx.kernels("core")
    for n in (1, 31, 256, 257, 100003):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        pa, pb, py = cuda_ctx.alloc(4 * n), cuda_ctx.alloc(4 * n), cuda_ctx.alloc(4 * n)
        cuda_ctx.htod(pa, a.tobytes())
        cuda_ctx.htod(pb, b.tobytes())
        k.launch("reflex_add", (n + 255) // 256, 256, (pa, pb, py, n))
        y = np.frombuffer(cuda_ctx.dtoh(py, 4 * n), np.float32)
        assert np.array_equal(y, a + b), f"n={n}"
        for p in (pa, pb, py):
            cuda_ctx.free(p)


# --- elementwise -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 257), (300, 1000)],
                         ids=["1", "7x33", "3x257", "300x1000"])
def test_add_swiglu(cuda_ops, ref_ops, shape, rng):
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    da, db = cuda_ops.from_numpy(a), cuda_ops.from_numpy(b)
    close(cuda_ops.to_numpy(cuda_ops.add(da, db)), ref_ops.add(a, b), 0, 0, "add")
    close(cuda_ops.to_numpy(cuda_ops.swiglu(da, db)), ref_ops.swiglu(a, b), 2e-6, 1e-6, "swiglu")


# --- rmsnorm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,n", [(1, 7), (7, 128), (5, 1000), (3, 5000), (64, 4096)],
                         ids=["1x7", "7x128", "5x1000", "3x5000", "big-64x4096"])
def test_rmsnorm(attach_both, rows, n, rng):
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    g = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    cuda_ops, ref_ops = attach_both({"norm.weight": g})
    wc, wr = cuda_ops.weight("norm.weight"), ref_ops.weight("norm.weight")
    dx = cuda_ops.from_numpy(x)
    for eps in (1e-6, 1e-5):
        close(cuda_ops.to_numpy(cuda_ops.rmsnorm(dx, wc, eps)), ref_ops.rmsnorm(x, wr, eps),
              1e-5, 1e-6, f"rmsnorm w eps={eps}")
        close(cuda_ops.to_numpy(cuda_ops.rmsnorm(dx, None, eps)), ref_ops.rmsnorm(x, None, eps),
              1e-5, 1e-6, f"rmsnorm no-w eps={eps}")


def test_rmsnorm_heads(cuda_ops, ref_ops, rng):
    """q/k-norm style: [T, H, d] normalised over d (a view as [T*H, d])."""
    x = rng.standard_normal((7, 5, 64)).astype(np.float32)
    y = cuda_ops.rmsnorm(cuda_ops.from_numpy(x), None, 1e-6)
    assert cuda_ops.shape(y) == (7, 5, 64)
    close(cuda_ops.to_numpy(y), ref_ops.rmsnorm(x, None, 1e-6), 1e-5, 1e-6, "rmsnorm heads")


@pytest.mark.parametrize("rows,n", [(1, 7), (7, 128), (5, 1000), (2, 3000), (3, 5000), (1, 9000),
                                   (64, 4096)],
                         ids=["1x7", "7x128", "5x1000", "2x3000", "3x5000", "1x9000", "big-64x4096"])
def test_add_rmsnorm(attach_both, rows, n, rng):
    """Fused residual add + RMSNorm: vs the NumPy twin, and bit-identical to the CUDA add then
    rmsnorm (same arithmetic, same reduction order); rows held in registers (up to 8 elements a
    thread) and longer ones (2x3000 on 256 threads, 1x9000 on 1024)."""
    a = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    b = rng.standard_normal((rows, n)).astype(np.float32)
    g = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    cuda_ops, ref_ops = attach_both({"norm.weight": g})
    da, db = cuda_ops.from_numpy(a), cuda_ops.from_numpy(b)
    for wc, wr in ((cuda_ops.weight("norm.weight"), ref_ops.weight("norm.weight")), (None, None)):
        s, y = cuda_ops.add_rmsnorm(da, db, wc, 1e-6)
        s_ref, y_ref = ref_ops.add_rmsnorm(a, b, wr, 1e-6)
        close(cuda_ops.to_numpy(s), s_ref, 0, 0, "add_rmsnorm sum")
        close(cuda_ops.to_numpy(y), y_ref, 1e-5, 1e-6, f"add_rmsnorm norm w={wc is not None}")
        s2 = cuda_ops.add(da, db)
        y2 = cuda_ops.rmsnorm(s2, wc, 1e-6)
        # same arithmetic and order (bit-identical on the emulator); the tolerance only allows
        # nvcc contracting differently in the two kernels
        close(cuda_ops.to_numpy(y), cuda_ops.to_numpy(y2), 5e-7, 1e-12,
              "add_rmsnorm vs add+rmsnorm")
    # [T, H, d] inputs (normalised over the last dimension)
    s, y = cuda_ops.add_rmsnorm(cuda_ops.view(da, (rows, 1, n)), cuda_ops.view(db, (rows, 1, n)),
                                None, 1e-5)
    assert cuda_ops.shape(s) == cuda_ops.shape(y) == (rows, 1, n)
    s_ref, y_ref = ref_ops.add_rmsnorm(a, b, None, 1e-5)
    close(cuda_ops.to_numpy(s).reshape(rows, n), s_ref, 0, 0, "add_rmsnorm [T, 1, n] sum")
    close(cuda_ops.to_numpy(y).reshape(rows, n), y_ref, 1e-5, 1e-6, "add_rmsnorm [T, 1, n]")
    with pytest.raises(ValueError, match="differ"):
        cuda_ops.add_rmsnorm(da, cuda_ops.view(db, (rows * n,)), None, 1e-6)


# --- rope ------------------------------------------------------------------------------------
ROPES = {
    "neox": RopeParams(n_rot=128, mode="neox", freq_base=1e6),
    "neox-partial": RopeParams(n_rot=32, mode="neox", freq_base=10000.0),
    "norm": RopeParams(n_rot=64, mode="norm", freq_base=10000.0),
    "norm-partial": RopeParams(n_rot=16, mode="norm", freq_base=500000.0),
    "neox-yarn": RopeParams(n_rot=128, mode="neox", freq_base=1e6, freq_scale=0.25, ext_factor=1.0,
                            attn_factor=1.0, n_ctx_orig=32768),
    "norm-yarn-ds": RopeParams(n_rot=64, mode="norm", freq_base=10000.0, freq_scale=1 / 40,
                               ext_factor=1.0, attn_factor=0.7071, beta_fast=32.0, beta_slow=1.0,
                               n_ctx_orig=4096),
    "neox-linear": RopeParams(n_rot=64, mode="neox", freq_base=10000.0, freq_scale=0.5),
}


@pytest.mark.parametrize("T,H,d", [(1, 1, 128), (7, 3, 128), (64, 16, 128), (300, 4, 256)],
                         ids=["T1", "T7", "T64", "big-T300"])
@pytest.mark.parametrize("name", list(ROPES))
def test_rope(cuda_ops, ref_ops, name, T, H, d, rng):
    p = ROPES[name]
    assert p.n_rot <= d  # every ROPES entry fits every head size here
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    start = int(rng.integers(0, 40000))
    pos = tuple(int(v) for v in rng.integers(0, 40000, T)) if T > 1 else (start,)
    batch = Batch(tuple(range(T)), pos, 0, AttnMask.causal(0, T))
    pc, pr = both(cuda_ops, ref_ops, batch)
    got = cuda_ops.to_numpy(cuda_ops.rope(cuda_ops.from_numpy(x), pc, p))
    close(got, ref_ops.rope(x, pr, p), 2e-6, 2e-6, f"rope {name}")


# --- qk_norm_rope_store ---------------------------------------------------------------------
QKR_CASES = [  # (T, cell0, H, Hkv, d, dv)
    (1, 0, 4, 4, 64, 64),
    (1, 37, 16, 8, 128, 128),
    (7, 5, 8, 2, 128, 128),
    (7, 0, 6, 1, 64, 64),
    (64, 3, 4, 2, 128, 128),
    (5, 2, 4, 2, 192, 128),  # d_k != d_v, d_k > 128 (256-thread blocks)
    (3, 1, 2, 1, 40, 72),  # head sizes not a multiple of 32
    (300, 11, 16, 8, 128, 128),
    (2, 1, 4, 2, 320, 64),  # d_k > 256: two dims a thread of the 256-thread sum
    (20, 0, 3, 1, 512, 96),
]
QKR_IDS = [f"{'big-' if c[0] >= 300 else ''}T{c[0]}-c{c[1]}-H{c[2]}/{c[3]}-d{c[4]}/{c[5]}"
           for c in QKR_CASES]
QKR_ROPES = ["neox", "norm-partial", "neox-yarn", "norm-yarn-ds"]


@pytest.mark.parametrize("norms", ["qk", "none", "q"])
@pytest.mark.parametrize("rope", QKR_ROPES)
@pytest.mark.parametrize("T,cell0,H,Hkv,d,dv", QKR_CASES, ids=QKR_IDS)
def test_qk_norm_rope_store(attach_both, T, cell0, H, Hkv, d, dv, rope, norms, rng,
                            monkeypatch):
    """The fused attention prologue vs the NumPy twin (rmsnorm, rope, kv_write) and vs the CUDA
    unfused ops (bit-identical for d <= 256): returned q, the cache's K and V rows written, and
    the cells around them untouched; reflex_qk_norm_rope_rows (a warp a head) and
    reflex_qk_norm_rope_store (a block a head): the same bits."""
    from reflex_core.backends import cuda_backend

    p = ROPES[rope]
    if p.n_rot > d:
        p = RopeParams(n_rot=d - d % 2, mode=p.mode, freq_base=p.freq_base,
                       freq_scale=p.freq_scale, ext_factor=p.ext_factor,
                       attn_factor=p.attn_factor, beta_fast=p.beta_fast, beta_slow=p.beta_slow,
                       n_ctx_orig=p.n_ctx_orig)
    qg = (1.0 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    kg = (1.0 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    cuda_ops, ref_ops = attach_both({"qn": qg, "kn": kg})
    qn = (cuda_ops.weight("qn"), ref_ops.weight("qn")) if "q" in norms else (None, None)
    kn = (cuda_ops.weight("kn"), ref_ops.weight("kn")) if "k" in norms else (None, None)
    q = (rng.standard_normal((T, H, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, d)) * 2).astype(np.float32)
    v = rng.standard_normal((T, Hkv, dv)).astype(np.float32)
    n_cells = cell0 + T + 2
    pos = tuple(int(x) for x in rng.integers(0, 40000, T))
    batch = Batch(tuple(range(T)), pos, cell0, AttnMask.causal(cell0, T))
    pc, pr = both(cuda_ops, ref_ops, batch)
    caches = []
    for _ in range(2):  # fused, unfused (CUDA)
        cc = KVBuffers(cuda_ops, 2, n_cells, Hkv, d, dv)
        caches.append(cc)
    cr = KVBuffers(ref_ops, 2, n_cells, Hkv, d, dv)
    dq, dk_, dv_ = cuda_ops.from_numpy(q), cuda_ops.from_numpy(k), cuda_ops.from_numpy(v)
    eps = 1e-6
    got = cuda_ops.qk_norm_rope_store(dq, dk_, dv_, qn[0], kn[0], eps, pc, p, caches[0].k[1],
                                      caches[0].v[1])
    want = ref_ops.qk_norm_rope_store(q, k, v, qn[1], kn[1], eps, pr, p, cr.k[1], cr.v[1])
    assert cuda_ops.shape(got) == (T, H, d)
    close(cuda_ops.to_numpy(got), want, 2e-5, 2e-5, "q")
    kc = cuda_ops.to_numpy(caches[0].k[1])
    close(kc, cr.k[1], 2e-5, 2e-5, "k cache")
    close(cuda_ops.to_numpy(caches[0].v[1]), cr.v[1], 0, 0, "v cache")
    assert not kc[:cell0].any() and not kc[cell0 + T:].any(), "cells outside the batch written"
    assert not cuda_ops.to_numpy(caches[0].k[0]).any(), "another layer written"
    # the unfused CUDA ops: the same arithmetic (bit-identical on the emulator; the tolerance
    # only allows nvcc contracting a*c - b*s differently in the two kernels)
    u = Ops.qk_norm_rope_store(cuda_ops, dq, dk_, dv_, qn[0], kn[0], eps, pc, p, caches[1].k[1],
                               caches[1].v[1])
    close(cuda_ops.to_numpy(got), cuda_ops.to_numpy(u), 1e-6, 1e-6, "q vs unfused")
    close(kc, cuda_ops.to_numpy(caches[1].k[1]), 1e-6, 1e-6, "k cache vs unfused")
    close(cuda_ops.to_numpy(caches[1].v[1]), cr.v[1], 0, 0, "v cache (unfused)")
    # the other kernel (a block a head below QKR_ROWS_MIN_T tokens, a warp a head from it)
    kernel = cuda_backend.qkr_kernel(T, d)[0]
    monkeypatch.setattr(cuda_backend, "QKR_ROWS_MIN_T", 1 if T < cuda_backend.QKR_ROWS_MIN_T
                        else 10**9)
    assert cuda_backend.qkr_kernel(T, d)[0] != kernel
    other = KVBuffers(cuda_ops, 2, n_cells, Hkv, d, dv)
    got2 = cuda_ops.qk_norm_rope_store(dq, dk_, dv_, qn[0], kn[0], eps, pc, p, other.k[1],
                                       other.v[1])
    np.testing.assert_array_equal(cuda_ops.to_numpy(got2), cuda_ops.to_numpy(got))
    np.testing.assert_array_equal(cuda_ops.to_numpy(other.k[1]), kc)
    np.testing.assert_array_equal(cuda_ops.to_numpy(other.v[1]), cuda_ops.to_numpy(caches[0].v[1]))


def test_qk_norm_rope_store_errors(cuda_ops):
    c = KVBuffers(cuda_ops, 1, 4, 2, 64, 64)
    pb = cuda_ops.prepare(Batch.causal([1, 2, 3], 2))
    q = cuda_ops.from_numpy(np.zeros((3, 4, 64), np.float32))
    k = cuda_ops.from_numpy(np.zeros((3, 2, 64), np.float32))
    p = ROPES["neox-partial"]
    with pytest.raises(ReflexError, match="KV cache full"):
        cuda_ops.qk_norm_rope_store(q, k, k, None, None, 1e-6, pb, p, c.k[0], c.v[0])
    pb = cuda_ops.prepare(Batch.causal([1, 2, 3], 0))
    with pytest.raises(ValueError, match="do not match"):
        cuda_ops.qk_norm_rope_store(q, q, k, None, None, 1e-6, pb, p, c.k[0], c.v[0])
    with pytest.raises(ValueError, match="n_rot"):
        cuda_ops.qk_norm_rope_store(q, k, k, None, None, 1e-6, pb, RopeParams(n_rot=66), c.k[0],
                                    c.v[0])


# --- rope_attention (a decode step's prologue and attention in one launch) --------------------
ROPE_ATT_CASES = [  # (T, cell0, H, Hkv, dk, dv, n_cells)
    (1, 0, 4, 4, 64, 64, 8),  # the first cell
    (1, 37, 16, 8, 128, 128, 60),
    (1, 1499, 16, 8, 128, 128, 1600),  # slices of the cache
    (1, 700, 32, 8, 128, 128, 2048),
    (4, 5, 8, 2, 128, 128, 40),
    (2, 900, 8, 2, 128, 128, 1200),
    (3, 1, 2, 1, 40, 72, 10),  # multiples of 4, not of 32
    (2, 10, 4, 2, 192, 128, 600),  # d_k > 128: the 256-wide kernel
    (1, 20, 8, 2, 256, 256, 30),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launches"])
@pytest.mark.parametrize("norms", ["qk", "none"])
@pytest.mark.parametrize("rope", ["neox", "norm-partial", "neox-yarn"])
@pytest.mark.parametrize("T,cell0,H,Hkv,dk,dv,n_cells", ROPE_ATT_CASES,
                         ids=[f"T{c[0]}-c{c[1]}-H{c[2]}/{c[3]}-d{c[4]}/{c[5]}-cells{c[6]}"
                              for c in ROPE_ATT_CASES])
def test_rope_attention(attach_both, T, cell0, H, Hkv, dk, dv, n_cells, rope, norms, fused, rng,
                        monkeypatch):
    """The CUDA backend's rope_attention = qk_norm_rope_store then attention (the ops' own
    composition; causal and tree masks). Fused (REFLEX_ROPE_ATT=1, one launch): the output and
    the cache rows it writes within 1e-6 (nvcc may contract a RoPE product differently in the two
    kernels), the other cells untouched. Two launches: the attention told that only the batch's
    cells are new (it reads the others before its programmatic wait), the same bits as the
    attention op's launch. Both against the NumPy twin."""
    from reflex_core.backends import cuda_backend
    from reflex_core.cuda import modules

    monkeypatch.setattr(cuda_backend, "ROPE_ATT", fused)
    width = 128 if max(dk, dv) <= 128 else 256
    p = ROPES[rope]
    if p.n_rot > dk:
        p = RopeParams(n_rot=dk, mode=p.mode, freq_base=p.freq_base)
    qg = (1.0 + 0.3 * rng.standard_normal(dk)).astype(np.float32)
    kg = (1.0 + 0.3 * rng.standard_normal(dk)).astype(np.float32)
    cuda_ops, ref_ops = attach_both({"qn": qg, "kn": kg})
    qn = (cuda_ops.weight("qn"), ref_ops.weight("qn")) if norms == "qk" else (None, None)
    kn = (cuda_ops.weight("kn"), ref_ops.weight("kn")) if norms == "qk" else (None, None)
    q = (rng.standard_normal((T, H, dk)) * 2).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, dk)) * 2).astype(np.float32)
    v = rng.standard_normal((T, Hkv, dv)).astype(np.float32)
    scale = 1.0 / math.sqrt(dk)
    tree = AttnMask(tuple([cell0] * T), tuple(cell0 + i for i in range(T)),
                    tuple(cell0 + i + 1 for i in range(T)))  # each token: prefix + itself
    pos = tuple(cell0 + i for i in range(T))
    for b in (Batch(tuple(range(T)), pos, cell0, AttnMask.causal(cell0, T)),
              Batch(tuple(range(T)), pos, cell0, tree)):
        pc, pr = both(cuda_ops, ref_ops, b)
        one, plain = (_cache_pair(cuda_ops, ref_ops, n_cells, Hkv, dk, dv,
                                  np.random.default_rng(7), cell0) for _ in range(2))
        dq, dk_, dv_ = cuda_ops.from_numpy(q), cuda_ops.from_numpy(k), cuda_ops.from_numpy(v)
        modules.launch_trace = trace = []
        try:
            got = cuda_ops.rope_attention(dq, dk_, dv_, qn[0], kn[0], 1e-6, pc, p, one[0].k[0],
                                          one[0].v[0], scale)
        finally:
            modules.launch_trace = None
        att = [x for x in trace if "attention" in x[0]]
        if fused:
            assert [x[0] for x in att] == [f"reflex_rope_attention_vec{width}"]
        else:  # its args: q, caches, out, part, done, the mask's three, the batch's first cell
            assert [x[0] for x in att] == [f"reflex_attention_vec{width}"]
            assert att[0][3][9] == pc.cell0_dev, "the attention told the batch's cells"
        assert cuda_ops.shape(got) == (T, H * dv)
        u = Ops.rope_attention(cuda_ops, dq, dk_, dv_, qn[0], kn[0], 1e-6, pc, p, plain[0].k[0],
                               plain[0].v[0], scale)
        tol = 1e-6 if fused else 0.0
        close(cuda_ops.to_numpy(got), cuda_ops.to_numpy(u), tol, tol, "vs the attention op")
        kc, vc = cuda_ops.to_numpy(one[0].k[0]), cuda_ops.to_numpy(one[0].v[0])
        close(kc, cuda_ops.to_numpy(plain[0].k[0]), tol, tol, "k cache")
        np.testing.assert_array_equal(vc, cuda_ops.to_numpy(plain[0].v[0]))
        assert not kc[cell0 + T:].any() and not vc[cell0 + T:].any(), "cells past the batch"
        want = ref_ops.rope_attention(q, k, v, qn[1], kn[1], 1e-6, pr, p, one[1].k[0],
                                      one[1].v[0], scale)
        close(cuda_ops.to_numpy(got), want, 1e-4, 2e-5, "vs the NumPy twin")


# --- kv_write + attention --------------------------------------------------------------------
def _cache_pair(cuda_ops, ref_ops, n_cells, Hkv, dk, dv, rng, n_filled):
    cc = KVBuffers(cuda_ops, 1, n_cells, Hkv, dk, dv)
    cr = KVBuffers(ref_ops, 1, n_cells, Hkv, dk, dv)
    if n_filled:
        k = rng.standard_normal((n_filled, Hkv, dk)).astype(np.float32)
        v = rng.standard_normal((n_filled, Hkv, dv)).astype(np.float32)
        b = Batch.causal(list(range(n_filled)), 0)
        pc, pr = both(cuda_ops, ref_ops, b)
        cuda_ops.kv_write(cc.k[0], cc.v[0], cuda_ops.from_numpy(k), cuda_ops.from_numpy(v), pc)
        ref_ops.kv_write(cr.k[0], cr.v[0], k, v, pr)
    return cc, cr


def test_kv_write(cuda_ops, ref_ops, rng):
    cc, cr = _cache_pair(cuda_ops, ref_ops, 50, 3, 64, 32, rng, 0)
    for cell0, T in ((0, 7), (7, 1), (8, 30), (38, 12)):
        k = rng.standard_normal((T, 3, 64)).astype(np.float32)
        v = rng.standard_normal((T, 3, 32)).astype(np.float32)
        b = Batch(tuple(range(T)), tuple(range(cell0, cell0 + T)), cell0,
                  AttnMask.causal(cell0, T))
        pc, pr = both(cuda_ops, ref_ops, b)
        cuda_ops.kv_write(cc.k[0], cc.v[0], cuda_ops.from_numpy(k), cuda_ops.from_numpy(v), pc)
        ref_ops.kv_write(cr.k[0], cr.v[0], k, v, pr)
    close(cuda_ops.to_numpy(cc.k[0]), cr.k[0], 0, 0, "k cache")
    close(cuda_ops.to_numpy(cc.v[0]), cr.v[0], 0, 0, "v cache")


ATT_CASES = [  # (T, cell0, H, Hkv, dk, dv)
    (1, 0, 4, 4, 64, 64),
    (1, 37, 8, 4, 128, 128),
    (1, 699, 16, 2, 128, 128),
    (7, 0, 8, 1, 64, 64),
    (7, 13, 16, 8, 256, 256),
    (64, 5, 4, 2, 128, 128),
    (5, 11, 6, 3, 192, 128),  # d_k != d_v (MLA-like)
    (3, 2, 2, 1, 40, 72),  # head sizes not a multiple of 32
    (2, 5, 2, 1, 42, 42),  # not a multiple of 4: reflex_attention, not the float4 kernels
    (300, 400, 16, 8, 128, 128),
    # from ATT_TILED_MIN_T tokens: the query-tiled kernels (ragged tiles, partial head sizes)
    (16, 0, 2, 1, 128, 128),
    (33, 10, 8, 2, 64, 64),
    (20, 2, 2, 1, 40, 72),
    (17, 3, 6, 3, 192, 128),  # d_k != d_v, the 256 kernel
    (40, 0, 4, 1, 256, 256),
    (130, 7, 4, 2, 256, 256),  # several query tiles of the 256 kernels
    (18, 1, 2, 1, 42, 42),  # head size not a multiple of 4: reflex_attention
]
ATT_IDS = [f"{'big-' if c[0] * c[2] * (c[0] + c[1]) > 10**6 else ''}T{c[0]}-c{c[1]}-H{c[2]}/{c[3]}"
           f"-d{c[4]}/{c[5]}" for c in ATT_CASES]


@pytest.fixture(params=[True, False], ids=["mma", "f32tiles"])
def att_mma(request, monkeypatch):
    """Both prefill attention kernels: the tensor-core tiles and the float32 query tiles."""
    from reflex_core.backends import cuda_backend

    monkeypatch.setattr(cuda_backend, "ATT_MMA", request.param)
    return request.param


@pytest.mark.parametrize("T,cell0,H,Hkv,dk,dv", ATT_CASES, ids=ATT_IDS)
def test_attention_causal(cuda_ops, ref_ops, T, cell0, H, Hkv, dk, dv, rng, att_mma):
    n_kv = cell0 + T
    cc, cr = _cache_pair(cuda_ops, ref_ops, n_kv + 3, Hkv, dk, dv, rng, n_kv)
    q = rng.standard_normal((T, H, dk)).astype(np.float32)
    b = Batch.causal(list(range(T)), cell0)
    pc, pr = both(cuda_ops, ref_ops, b)
    scale = 1.0 / math.sqrt(dk)
    want_tiled = T >= ATT_TILED_MIN_T and dk % 4 == 0 and dv % 4 == 0
    assert bool(_attention_tiled_kernel(T, dk, dv, 0)) == want_tiled  # the path this case means
    assert (_attention_kernel(dk, dv, 0) == "reflex_attention") == (dk % 4 != 0 or dv % 4 != 0)
    got = cuda_ops.to_numpy(cuda_ops.attention(cuda_ops.from_numpy(q), cc.k[0], cc.v[0], pc,
                                               scale))
    close(got, ref_ops.attention(q, cr.k[0], cr.v[0], pr, scale), 1e-4, 2e-5, "attention")


@pytest.mark.parametrize("d", [64, 128, 256])
def test_attention_tiled_skips_unseen_cells(cuda_ops, ref_ops, d, rng, att_mma):
    """Two sequences' prompts in one cache, a gap of cells no token sees between them filled with
    NaN, and a token that sees nothing: the query-tiled kernel must stage the unseen cells as
    zeros (0 * NaN would poison a tile's sum) and give the empty token zeros, as the reference."""
    H, Hkv, A, gap, B = 4, 2, 21, 40, 30
    n_kv = A + gap + B
    cc, cr = _cache_pair(cuda_ops, ref_ops, n_kv, Hkv, d, d, rng, n_kv)
    nan = np.full((gap, Hkv, d), np.nan, np.float32)  # on the GPU only: the reference's
    b = Batch(tuple(range(gap)), tuple(range(gap)), A, AttnMask.causal(A, gap))  # products use them
    pc, _ = both(cuda_ops, ref_ops, b)
    cuda_ops.kv_write(cc.k[0], cc.v[0], cuda_ops.from_numpy(nan), cuda_ops.from_numpy(nan), pc)
    # tokens 0..A-1: sequence one, causal over cells [0, A); tokens A..A+B-1: sequence two,
    # causal over [A + gap, A + gap + B); the last token sees nothing
    pe = [t + 1 for t in range(A)] + [0] * B + [0]
    os_ = [0] * A + [A + gap] * B + [0]
    oe = [0] * A + [A + gap + j + 1 for j in range(B)] + [0]
    T = len(pe)
    mask = AttnMask(tuple(pe), tuple(os_), tuple(oe))
    b = Batch(tuple(range(T)), tuple(range(T)), n_kv - T, mask)  # attention spans [0, n_kv)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    pc = cuda_ops.prepare(b)
    assert _attention_tiled_kernel(T, d, d, 0)
    got = cuda_ops.to_numpy(cuda_ops.attention(cuda_ops.from_numpy(q), cc.k[0], cc.v[0], pc,
                                               0.1))
    want = ref_ops.attention(q[:-1], cr.k[0], cr.v[0], _drop_last(ref_ops, b), 0.1)
    close(got[:-1], want, 1e-4, 2e-5, "attention beside unseen NaN cells")
    assert not got[-1].any(), "a token that sees no cell: zeros"


def _drop_last(ops, b):
    """The reference's positions of batch b without its last token (the NumPy twin's softmax
    over no cell is NaN; the kernels give zeros), over the same cells."""
    m = b.mask
    short = Batch(b.tokens[:-1], b.positions[:-1], b.cell0 + 1,
                  AttnMask(m.prefix_end[:-1], m.own_start[:-1], m.own_end[:-1]))
    return ops.prepare(short)


@pytest.mark.parametrize("H,Hkv,d", [(8, 8, 64), (8, 4, 128), (16, 2, 256)])
def test_attention_tree_mask(cuda_ops, ref_ops, H, Hkv, d, rng):
    """system1-style batch: a prompt of P tokens, then candidates that each see the prompt and
    their own earlier tokens only."""
    P = 23
    cands = [3, 1, 4, 2]
    pe, os_, oe, pos = [], [], [], []
    for t in range(P):
        pe.append(t + 1), os_.append(0), oe.append(0), pos.append(t)
    cell = P
    for L in cands:
        for j in range(L):
            pe.append(P), os_.append(cell), oe.append(cell + j + 1), pos.append(P + j)
        cell += L
    T = len(pe)
    mask = AttnMask(tuple(pe), tuple(os_), tuple(oe))
    b = Batch(tuple(range(T)), tuple(pos), 0, mask)
    cc, cr = _cache_pair(cuda_ops, ref_ops, T + 1, Hkv, d, d, rng, T)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    pc, pr = both(cuda_ops, ref_ops, b)
    got = cuda_ops.to_numpy(cuda_ops.attention(cuda_ops.from_numpy(q), cc.k[0], cc.v[0], pc,
                                               0.125))
    close(got, ref_ops.attention(q, cr.k[0], cr.v[0], pr, 0.125), 1e-4, 2e-5, "tree attention")


SPLIT_CASES = [  # (T, cell0, H, Hkv, dk, dv, n_cells): a few tokens over a long cache
    (1, 1499, 16, 8, 128, 128, 1600),
    (1, 300, 14, 2, 64, 64, 4096),  # most slices empty
    (2, 2047, 8, 1, 256, 256, 2100),
    (4, 999, 6, 3, 40, 72, 1030),  # head sizes not a multiple of 32
    (1, 700, 4, 2, 36, 44, 1100),  # multiples of 4, partial float4 chunks
    (2, 900, 4, 2, 42, 42, 1000),  # not a multiple of 4: reflex_attention's split
    (3, 0, 4, 4, 64, 64, 5000),  # fewer visible cells than slices
]


@pytest.mark.parametrize("T,cell0,H,Hkv,dk,dv,n_cells", SPLIT_CASES,
                         ids=[f"T{c[0]}-c{c[1]}-H{c[2]}/{c[3]}-d{c[4]}/{c[5]}-cells{c[6]}"
                              for c in SPLIT_CASES])
def test_attention_split_over_the_cache(cuda_ops, ref_ops, T, cell0, H, Hkv, dk, dv, n_cells,
                                        rng):
    """Flash-decoding: the visible cells in slices on separate blocks, merged by the block that
    ends last, = the reference (the causal and the tree mask); launched again, the same bits
    (the slices' counters are back at zero)."""
    from reflex_core.backends.cuda_backend import attention_splits

    assert attention_splits(T, H, n_cells) > 1  # the path under test
    cc, cr = _cache_pair(cuda_ops, ref_ops, n_cells, Hkv, dk, dv, rng, cell0 + T)
    q = rng.standard_normal((T, H, dk)).astype(np.float32)
    scale = 1.0 / math.sqrt(dk)
    tree = AttnMask(tuple([cell0] * T), tuple(cell0 + i for i in range(T)),
                    tuple(cell0 + i + 1 for i in range(T)))  # each token: prefix + itself
    first = None
    for b in (Batch.causal(list(range(T)), cell0),
              Batch(tuple(range(T)), tuple([cell0] * T), cell0, tree),
              Batch.causal(list(range(T)), cell0)):
        pc, pr = both(cuda_ops, ref_ops, b)
        got = cuda_ops.to_numpy(cuda_ops.attention(cuda_ops.from_numpy(q), cc.k[0], cc.v[0], pc,
                                                   scale))
        close(got, ref_ops.attention(q, cr.k[0], cr.v[0], pr, scale), 1e-4, 2e-5,
              "split attention")
        if first is None:
            first = got
    np.testing.assert_array_equal(got, first)


@pytest.mark.parametrize("T", [2, 20])  # the few-token kernel and the query tiles
def test_attention_large_scores(cuda_ops, ref_ops, T, rng):
    """Peaked softmax (scores ~ 100s): the online max must keep it finite and exact."""
    cc, cr = _cache_pair(cuda_ops, ref_ops, 31 + T + 7, 2, 64, 64, rng, 31 + T)
    q = (rng.standard_normal((T, 4, 64)) * 20).astype(np.float32)
    b = Batch.causal(list(range(T)), 31)
    pc, pr = both(cuda_ops, ref_ops, b)
    got = cuda_ops.to_numpy(cuda_ops.attention(cuda_ops.from_numpy(q), cc.k[0], cc.v[0], pc,
                                               1.0))
    assert np.isfinite(got).all()
    close(got, ref_ops.attention(q, cr.k[0], cr.v[0], pr, 1.0), 1e-4, 1e-4, "peaked attention")


# --- take_rows -------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [[0], [6], [2, 3, 4], [5, 0, 5, 2], list(range(7))])
def test_take_rows(cuda_ops, ref_ops, rows, rng):
    x = rng.standard_normal((7, 1001)).astype(np.float32)
    got = cuda_ops.to_numpy(cuda_ops.take_rows(cuda_ops.from_numpy(x), rows))
    close(got, ref_ops.take_rows(x, rows), 0, 0, "take_rows")


# --- argmax / token_logprobs -----------------------------------------------------------------
@pytest.mark.parametrize("rows,V", [(1, 1), (1, 1000), (7, 4097), (3, V_BIG)],
                         ids=["1x1", "1x1000", "7x4097", "big-3xV"])
def test_argmax(cuda_ops, ref_ops, rows, V, rng):
    x = rng.standard_normal((rows, V)).astype(np.float32)
    assert cuda_ops.argmax(cuda_ops.from_numpy(x)) == ref_ops.argmax(x)
    # ties: the first index of the maximum wins
    xt = rng.integers(-3, 3, (rows, V)).astype(np.float32)
    for r in range(rows):
        xt[r, rng.integers(0, V, 3)] = 7.0
    assert cuda_ops.argmax(cuda_ops.from_numpy(xt)) == ref_ops.argmax(xt)
    xn = np.full((1, V), -np.inf, np.float32)
    assert cuda_ops.argmax(cuda_ops.from_numpy(xn)) == [0]


@pytest.mark.parametrize("V", [4097, 8192, 3 * 4096 + 1, 65531, V_BIG])
def test_argmax_split(cuda_ops, ref_ops, V, rng):
    """One row of more than one reflex_argmax_split block: the blocks' pairs merged by the last,
    its count set back for the next launch (several launches in a row, the maximum in each
    block, ties across blocks, sample_into's greedy path)."""
    for case in range(6):
        x = rng.standard_normal((1, V)).astype(np.float32)
        if case == 1:  # the maximum in the last, partial block
            x[0, -1] = 9.0
        elif case == 2:  # a tie across blocks: the first index wins
            x[0, [V - 2, V // 2 + 3, 4096]] = 9.0
        elif case == 3:  # every value equal
            x[:] = -2.5
        elif case == 4:
            x[0, 0] = 9.0
        got = cuda_ops.argmax(cuda_ops.from_numpy(x))
        assert got == ref_ops.argmax(x), case
    out = cuda_ops.empty((1,), "i32")
    x = rng.standard_normal((1, V)).astype(np.float32)
    cuda_ops.sample_into(cuda_ops.from_numpy(x), out.ptr, 0.0, 0, 1.0, 0.0, 0.0, None)
    assert cuda_ops.to_numpy(out).tolist() == [int(np.argmax(x))]


def test_picks_and_words_through_mapped_host_memory(cuda_ops, rng):
    """A chained decode step's traffic with the host (cuda_graph._Chain): put_words reads int32
    words from mapped pinned memory into device memory (odd counts, an offset start), and every
    pick (one-block argmax, split argmax, draw) writes its id both to the device and to mapped
    host memory, the same id, readable once the launch has run."""
    import ctypes

    from reflex_core.backends import device_array
    from reflex_core.cuda import driver as drv

    d = drv._d
    host = drv.check(d.cuMemHostAlloc(1 << 16, d.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc")
    try:
        dev_view = int(drv.check(d.cuMemHostGetDevicePointer(host, 0), "DevicePointer"))
        words = (ctypes.c_int32 * 1100).from_address(host)
        for n, skip in ((1, 0), (255, 3), (257, 0), (1099, 1)):
            vals = [int(v) for v in rng.integers(-2**31, 2**31 - 1, n)]
            words[:n] = vals
            out = cuda_ops.empty((n + 2,), "i32")
            cuda_ops.put_words(dev_view + 4 * skip, out.ptr + 4 * skip, n - skip)
            got = cuda_ops.to_numpy(out).tolist()
            assert got[skip:n] == vals[skip:n], (n, skip)
        slot = ctypes.c_int32.from_address(host + 8192)
        for V, T in ((1000, 0.0), (V_BIG, 0.0), (1000, 0.8), (V_BIG, 0.8)):
            x = (rng.standard_normal((1, V)) * 3).astype(np.float32)
            out = cuda_ops.empty((1,), "i32")
            scratch = device_array.empty((V,), "f64") if T > 0 else None
            slot.value = -7
            cuda_ops.sample_into(cuda_ops.from_numpy(x), out.ptr, T, 0, 1.0, 0.37, 0.0, scratch,
                                 dev_view + 8192)
            cuda_ops.synchronize()
            want = int(np.argmax(x)) if T == 0 else sampling.sample_reference(x[0], T, 0, 1.0,
                                                                               0.37)
            assert slot.value == cuda_ops.to_numpy(out).tolist()[0] == want, (V, T)
    finally:
        drv.check(d.cuMemFreeHost(host), "cuMemFreeHost")


@pytest.mark.parametrize("rows,V", [(1, 10), (7, 1000), (4, V_BIG)],
                         ids=["1x10", "7x1000", "big-4xV"])
def test_token_logprobs(cuda_ops, ref_ops, rows, V, rng):
    x = (rng.standard_normal((rows, V)) * 5).astype(np.float32)
    tg = [int(t) for t in rng.integers(0, V, rows)]
    got = cuda_ops.token_logprobs(cuda_ops.from_numpy(x), tg)
    want = ref_ops.token_logprobs(x, tg)
    close(np.array(got), np.array(want), 1e-6, 1e-5, "token_logprobs")


# --- sampling --------------------------------------------------------------------------------
SAMPLE_PARAMS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.7, 40, 1.0), (0.7, 0, 0.9), (0.8, 20, 0.95), (1.3, 1, 1.0),
    (0.6, 0, 1e-9), (1.0, 0, 0.0), (2.0, 5000, 0.5), (0.5, 3, 0.3), (0.0, 0, 1.0),
]


def _logits(rng, kind, V):
    if kind == "normal":
        return (rng.standard_normal(V) * 3).astype(np.float32)
    if kind == "ties":  # few distinct values: ties everywhere (top-k and top-p boundaries)
        return rng.integers(-4, 3, V).astype(np.float32)
    if kind == "peaked":
        x = (rng.standard_normal(V) * 2).astype(np.float32)
        x[rng.integers(0, V, 4)] = 25.0
        return x
    if kind == "neginf":  # masked tokens
        x = (rng.standard_normal(V) * 3).astype(np.float32)
        x[rng.random(V) < 0.5] = -np.inf
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("V", [1, 7, 1000, 4097, V_BIG], ids=["V1", "V7", "V1000", "V4097",
                                                               "big-V"])
@pytest.mark.parametrize("kind", ["normal", "ties", "peaked", "neginf"])
def test_sample_matches_reference(cuda_ops, V, kind, rng):
    u_rng = random.Random(V * 7 + len(kind))
    draws = 12 if V == V_BIG else 40
    mismatches = []
    for i in range(draws):
        x = _logits(rng, kind, V)
        if kind == "neginf" and not np.isfinite(x).any():
            x[0] = 0.0
        T, k, p = SAMPLE_PARAMS[i % len(SAMPLE_PARAMS)]
        u = u_rng.random()
        want = sampling.sample_reference(x, T, k, p, u)
        got = cuda_ops.sample(cuda_ops.from_numpy(x[None, :]), T, k, p, u)
        if got != want:
            mismatches.append(f"draw {i}: T={T} k={k} p={p} u={u!r}: got {got}, want {want}")
    assert not mismatches, "\n".join(mismatches)


def test_sample_last_row_and_edges(cuda_ops, rng):
    x = (rng.standard_normal((3, 513)) * 3).astype(np.float32)
    dx = cuda_ops.from_numpy(x)
    for u in (0.0, 0.25, 0.5, 0.999999999):
        for (T, k, p) in SAMPLE_PARAMS:
            assert cuda_ops.sample(dx, T, k, p, u) == sampling.sample_reference(x[2], T, k, p, u)


def test_sample_draw_boundaries(cuda_ops):
    """u on an exact boundary of the running sums takes the next token, and a kept token of zero
    probability is never drawn (the reference's half-open intervals, test_numpy_ops)."""
    flat = cuda_ops.from_numpy(np.zeros((1, 4), np.float32))
    assert [cuda_ops.sample(flat, 1.0, 0, 1.0, u) for u in (0.0, 0.25, 0.5, 0.75)] == [0, 1, 2, 3]
    zero_first = cuda_ops.from_numpy(np.array([[-1e38, 0.0, 0.0]], np.float32))
    assert cuda_ops.sample(zero_first, 1.0, 0, 1.0, 0.0) == 1


def test_sample_distribution(cuda_ops, rng):
    """Many draws on one small row follow sample_probs (kept set and weights)."""
    x = (rng.standard_normal(50) * 1.5).astype(np.float32)
    probs = sampling.sample_probs(x, 0.9, 10, 0.8)
    dx = cuda_ops.from_numpy(x[None, :])
    counts = np.zeros(50)
    for j in range(400):
        u = (j + 0.5) / 400
        counts[cuda_ops.sample(dx, 0.9, 10, 0.8, u)] += 1
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(probs))
    close(counts / 400, probs, 0, 0.01, "sample distribution")


# --- MoE -------------------------------------------------------------------------------------
@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (7, 128, 8), (64, 60, 4), (3, 256, 8), (2, 512, 10)])
@pytest.mark.parametrize("gating,norm,scale", [("softmax", True, 0.0), ("softmax", False, 2.5),
                                                ("sigmoid", True, 1.0), ("softmax_weight", True, 0.0),
                                                ("softmax_weight", False, 0.0),
                                                ("sqrt_softplus", True, 1.5)])
def test_moe_route(cuda_ops, ref_ops, T, E, k, gating, norm, scale, rng):
    x = (rng.standard_normal((T, E)) * 2).astype(np.float32)
    ids_c, w_c = cuda_ops.moe_route(cuda_ops.from_numpy(x), k, gating, norm, scale)
    ids_r, w_r = ref_ops.moe_route(x, k, gating, norm, scale)
    ids_c, w_c = cuda_ops.to_numpy(ids_c), cuda_ops.to_numpy(w_c)
    assert ids_c.shape == (T, k) and w_c.shape == (T, k)
    # the order within the k selected does not matter (spec 4.5); compare sorted by expert id
    oc, orr = np.argsort(ids_c, axis=1), np.argsort(ids_r, axis=1)
    assert np.array_equal(np.take_along_axis(ids_c, oc, 1), np.take_along_axis(ids_r, orr, 1))
    close(np.take_along_axis(w_c, oc, 1), np.take_along_axis(w_r, orr, 1), 1e-5, 1e-7, "weights")


def test_moe_route_ties(cuda_ops, ref_ops):
    """Equal router logits: the lowest expert indices are chosen."""
    x = np.zeros((2, 16), np.float32)
    x[1, [3, 9, 12]] = 1.0
    ids_c, w_c = cuda_ops.moe_route(cuda_ops.from_numpy(x), 4)
    ids_r, w_r = ref_ops.moe_route(x, 4)
    assert sorted(cuda_ops.to_numpy(ids_c)[0]) == sorted(ids_r[0]) == [0, 1, 2, 3]
    assert sorted(cuda_ops.to_numpy(ids_c)[1]) == sorted(ids_r[1]) == [0, 3, 9, 12]


@pytest.mark.parametrize("E", [16, 300])
def test_moe_route_nan_and_order(cuda_ops, ref_ops, E):
    """The picks in descending order (ties: the lower index first), a NaN score after every
    number, as the twin's stable sort: with one expert a thread (E = 16, the ranks) and with
    more (E = 300, the rounds; no NaN there)."""
    x = np.zeros((2, E), np.float32)
    x[:, [2, 5, 7]] = [1.0, 3.0, 1.0]
    if E <= 256:
        x[1, 1] = np.nan
    ids_c, w_c = cuda_ops.moe_route(cuda_ops.from_numpy(x), 5, "sigmoid")
    ids_r, w_r = ref_ops.moe_route(x, 5, "sigmoid")
    ids_c, w_c = cuda_ops.to_numpy(ids_c), cuda_ops.to_numpy(w_c)
    assert ids_r.tolist() == [[5, 2, 7, 0, 1], [5, 2, 7, 0, 3] if E <= 256 else [5, 2, 7, 0, 1]]
    assert ids_c.tolist() == ids_r.tolist()
    close(w_c, w_r, 1e-6, 1e-7, "weights")


@pytest.mark.parametrize("T,k,n", [(1, 1, 1), (7, 8, 1000), (64, 4, 257)])
def test_moe_combine(cuda_ops, ref_ops, T, k, n, rng):
    y = rng.standard_normal((T, k, n)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    got = cuda_ops.to_numpy(cuda_ops.moe_combine(cuda_ops.from_numpy(y), cuda_ops.from_numpy(w)))
    close(got, ref_ops.moe_combine(y, w), 1e-5, 1e-6, "moe_combine")


@pytest.mark.parametrize("k,n", [(1, 7), (6, 1000), (8, 2048), (8, 4096 + 3)])
def test_moe_combine_resnorm(attach_both, k, n, rng):
    """One token's moe_combine taken by add_rmsnorm (reflex_moe_combine_resnorm): the sum s bit
    for bit the CUDA moe_combine then add; a block sum per 256 values; the normed output (its
    scale applied by reflex_norm_apply when read) vs the NumPy twin; the deferred sum itself
    still readable afterwards."""
    from reflex_core.backends.device_array import DeviceArray

    y = rng.standard_normal((1, k, n)).astype(np.float32)
    wts = rng.random((1, k)).astype(np.float32)
    a = (rng.standard_normal((1, n)) * 3).astype(np.float32)
    g = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    cuda_ops, ref_ops = attach_both({"norm.weight": g})
    dy, dw, da = cuda_ops.from_numpy(y), cuda_ops.from_numpy(wts), cuda_ops.from_numpy(a)
    n_part = (n + 255) // 256
    for wc, wr in ((cuda_ops.weight("norm.weight"), ref_ops.weight("norm.weight")), (None, None)):
        h = cuda_ops.moe_combine(dy, dw)
        s, yn = cuda_ops.add_rmsnorm(da, h, wc, 1e-6)
        assert yn.pending.n_part == n_part
        sums = cuda_ops.to_numpy(DeviceArray(yn.pending.part, (n_part,), s.owner, "f32", n_part))
        s_ref, y_ref = ref_ops.add_rmsnorm(a, ref_ops.moe_combine(y, wts), wr, 1e-6)
        got_s = cuda_ops.to_numpy(s)
        close(got_s, s_ref, 1e-5, 1e-5, "moe_combine_resnorm sum")
        plain = cuda_ops.to_numpy(cuda_ops.add(da, cuda_ops.moe_combine(dy, dw)))
        close(got_s, plain, 0, 0, "moe_combine_resnorm sum vs moe_combine + add")
        want = [np.sum(got_s[0, i:i + 256].astype(np.float64) ** 2) for i in range(0, n, 256)]
        np.testing.assert_allclose(sums, want, rtol=2e-6)
        close(cuda_ops.to_numpy(yn), y_ref, 1e-5, 1e-6,
              f"moe_combine_resnorm norm w={wc is not None}")
        assert h.pending is not None
        close(cuda_ops.to_numpy(h), ref_ops.moe_combine(y, wts), 1e-5, 1e-6, "deferred sum")
