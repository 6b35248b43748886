"""NumpyOps, op by op, against independent naive computations on fresh random inputs.

The naive versions are written from the spec (ARCHITECTURES.md §4, §11.2) with explicit loops
and float64 math, not from the backend's code.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from reflex_core import sampling
from reflex_core.backends import get_backend
from reflex_core.backends import numpy_backend as nb
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.errors import ModelError, ReflexError, UnsupportedTensorType
from reflex_core.ops import AttnMask, Batch, RopeParams
from reflex_core.testing.op_harness import KVBuffers

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22),
         Q5_1: (32, 24), Q8_0: (32, 34), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144),
         Q5_K: (256, 176), Q6_K: (256, 210)}
# byte offsets of the f16 scale fields of each block type (overwritten with sane values)
F16_FIELDS = {Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q8_0: [0], Q2_K: [80, 82],
              Q3_K: [108], Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208]}


# --- weights -------------------------------------------------------------------------------
def random_weight_bytes(rng, t: int, ne) -> bytes:
    n = int(np.prod(ne))
    if t == F32:
        return rng.standard_normal(n).astype(np.float32).tobytes()
    if t == F16:
        return rng.standard_normal(n).astype(np.float16).tobytes()
    if t == BF16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(
            np.uint16).tobytes()
    block, size = BLOCK[t]
    k = n // block
    b = rng.integers(0, 256, (k, size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = rng.uniform(0.002, 0.02, k).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(k, 2)
    return b.tobytes()


def f16(b: np.ndarray) -> float:
    return float(np.frombuffer(bytes(b), np.float16)[0])


def naive_dequant_block(t: int, blk: np.ndarray) -> list[float]:
    """One block per spec §11.2, element by element."""
    if t == Q8_0:
        d = f16(blk[0:2])
        return [d * float(np.int8(q)) for q in blk[2:34].view(np.int8)]
    if t == Q4_0:
        d = f16(blk[0:2])
        qs = blk[2:18]
        y = [0.0] * 32
        for j in range(16):
            y[j] = d * ((int(qs[j]) & 15) - 8)
            y[j + 16] = d * ((int(qs[j]) >> 4) - 8)
        return y
    if t == Q4_K:
        d, dmin = f16(blk[0:2]), f16(blk[2:4])
        s = [int(v) for v in blk[4:16]]
        qs = blk[16:144]
        sc, mn = [0] * 8, [0] * 8
        for j in range(8):
            if j < 4:
                sc[j], mn[j] = s[j] & 63, s[j + 4] & 63
            else:
                sc[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)
                mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        y = [0.0] * 256
        for t4 in range(4):
            for l in range(32):
                q = int(qs[32 * t4 + l])
                y[64 * t4 + l] = d * sc[2 * t4] * (q & 15) - dmin * mn[2 * t4]
                y[64 * t4 + 32 + l] = d * sc[2 * t4 + 1] * (q >> 4) - dmin * mn[2 * t4 + 1]
        return y
    if t == Q6_K:
        ql, qh = blk[0:128], blk[128:192]
        sc = blk[192:208].view(np.int8)
        d = f16(blk[208:210])
        y = [0.0] * 256
        for h in range(2):
            L, Hh = ql[64 * h:64 * h + 64], qh[32 * h:32 * h + 32]
            for l in range(32):
                i = l // 16
                a, b, c = int(L[l]), int(L[l + 32]), int(Hh[l])
                y[128 * h + l] = d * sc[8 * h + i] * (((a & 15) | ((c & 3) << 4)) - 32)
                y[128 * h + 32 + l] = d * sc[8 * h + i + 2] * (((b & 15) | (((c >> 2) & 3) << 4)) - 32)
                y[128 * h + 64 + l] = d * sc[8 * h + i + 4] * (((a >> 4) | (((c >> 4) & 3) << 4)) - 32)
                y[128 * h + 96 + l] = d * sc[8 * h + i + 6] * (((b >> 4) | (((c >> 6) & 3) << 4)) - 32)
        return y
    raise AssertionError(t)


def naive_dequant(t: int, data: bytes, ne) -> np.ndarray:
    block, size = BLOCK[t]
    raw = np.frombuffer(data, np.uint8).reshape(-1, size)
    vals = [v for blk in raw for v in naive_dequant_block(t, blk)]
    return np.array(vals, np.float64).reshape(tuple(reversed(ne)))


def ops_with(fake_gguf, tensors: dict, cache_weights=True) -> NumpyOps:
    g = fake_gguf()
    for name, (ne, t, data) in tensors.items():
        g.add_tensor(name, ne, t, data)
    ops = NumpyOps(cache_weights=cache_weights)
    ops.attach(g)
    return ops


@pytest.mark.parametrize("t", [Q8_0, Q4_0, Q4_K, Q6_K])
def test_matmul_quantized_vs_naive_dequant(rng, fake_gguf, t):
    block = BLOCK[t][0]
    n_in, n_out, T = block * 2, 5, 3
    data = random_weight_bytes(rng, t, (n_in, n_out))
    ops = ops_with(fake_gguf, {"w": ((n_in, n_out), t, data)})
    W = naive_dequant(t, data, (n_in, n_out))  # [n_out, n_in]
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    y = ops.matmul(x, ops.weight("w"))
    ref = x.astype(np.float64) @ W.T
    assert y.shape == (T, n_out) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    # embed dequantizes only the requested rows, exactly as the matrix
    pb = ops.prepare(Batch.causal([4, 0, 4, 2], 0))
    np.testing.assert_allclose(ops.embed(ops.weight("w"), pb), W[[4, 0, 4, 2]], rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("t", [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
                               Q5_K, Q6_K])
@pytest.mark.parametrize("cache_weights", [True, False])
def test_matmul_every_type_and_chunking(rng, fake_gguf, monkeypatch, t, cache_weights):
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    block, size = BLOCK[t]
    n_in, n_out, T = max(block, 32) * 2, 7, 5
    data = random_weight_bytes(rng, t, (n_in, n_out))
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 3 * 4 * n_in)  # 3 rows per chunk: 3 chunks
    ops = ops_with(fake_gguf, {"w": ((n_in, n_out), t, data)}, cache_weights=cache_weights)
    raw = np.frombuffer(data, np.uint8).reshape(n_out, -1)
    if t == F32:
        W = raw.view(np.float32)
    elif t == F16:
        W = raw.view(np.float16).astype(np.float32)
    else:
        W = quants.dequantize(raw, GGMLQuantizationType(t))
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    ref = x.astype(np.float64) @ W.astype(np.float64).T
    y = ops.matmul(x, ops.weight("w"))
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    assert bool(ops._f32) == cache_weights


def test_unsupported_and_missing_weights(fake_gguf):
    ops = ops_with(fake_gguf, {"blk.0.w": ((4, 2), 26, np.zeros(8, np.int32).tobytes())})  # I32
    with pytest.raises(UnsupportedTensorType, match=r"blk\.0\.w.*I32"):
        ops.weight("blk.0.w")
    with pytest.raises(ModelError, match="nope"):
        ops.weight("nope")
    assert not ops.has_weight("nope") and ops.has_weight("blk.0.w")


def test_embed_rejects_bad_token(fake_gguf):
    ops = ops_with(fake_gguf, {"e": ((4, 3), F32, np.zeros(12, np.float32).tobytes())})
    with pytest.raises(ReflexError, match="token id 3"):
        ops.embed(ops.weight("e"), ops.prepare(Batch.causal([0, 3], 0)))


def test_rmsnorm(rng, fake_gguf):
    n = 37
    g = rng.standard_normal(n).astype(np.float32)
    ops = ops_with(fake_gguf, {"g": ((n,), F32, g.tobytes())})
    x = rng.standard_normal((3, 5, n)).astype(np.float32) * 3
    y = ops.rmsnorm(x, ops.weight("g"), 1e-6)
    y0 = ops.rmsnorm(x, None, 1e-6)
    for idx in np.ndindex(3, 5):
        row = x[idx].astype(np.float64)
        r = row / math.sqrt(sum(v * v for v in row) / n + 1e-6)
        np.testing.assert_allclose(y0[idx], r, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(y[idx], r * g, rtol=1e-6, atol=1e-7)


# --- rope ----------------------------------------------------------------------------------
def naive_rope(x, positions, p: RopeParams):
    """Per pair, in float64, spec §4.3 (with YaRN written out independently of RopeParams)."""
    x = x.astype(np.float64)
    T, H, d = x.shape
    n = p.n_rot
    out = x.copy()
    if p.ext_factor:
        def cdim(beta):
            return n * math.log(p.n_ctx_orig / (2 * math.pi * beta)) / (2 * math.log(p.freq_base))
        lo = max(0.0, math.floor(cdim(p.beta_fast)))
        hi = min(n - 1.0, math.ceil(cdim(p.beta_slow)))
    for t in range(T):
        for i in range(n // 2):
            th_e = positions[t] * p.freq_base ** (-2.0 * i / n)
            th = p.freq_scale * th_e
            m = p.attn_factor
            if p.ext_factor:
                gamma = p.ext_factor * (1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo))))
                th = th * (1 - gamma) + th_e * gamma
                m = p.attn_factor * (1 + 0.1 * math.log(1 / p.freq_scale))
            c, s = math.cos(th) * m, math.sin(th) * m
            ia, ib = (i, i + n // 2) if p.mode == "neox" else (2 * i, 2 * i + 1)
            for h in range(H):
                a, b = x[t, h, ia], x[t, h, ib]
                out[t, h, ia] = a * c - b * s
                out[t, h, ib] = a * s + b * c
    return out


@pytest.mark.parametrize("mode", ["neox", "norm"])
@pytest.mark.parametrize("n_rot,d", [(8, 8), (6, 10), (4, 9)])
def test_rope_plain(rng, mode, n_rot, d):
    ops = NumpyOps()
    positions = (0, 3, 4, 17, 1000, 5)
    b = Batch(tuple(range(6)), positions, 0, AttnMask.causal(0, 6))
    p = RopeParams(n_rot=n_rot, mode=mode, freq_base=500.0)
    x = rng.standard_normal((6, 3, d)).astype(np.float32)
    y = ops.rope(x, ops.prepare(b), p)
    np.testing.assert_allclose(y, naive_rope(x, positions, p), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y[..., n_rot:], x[..., n_rot:])  # outside the window
    np.testing.assert_array_equal(y[0], x[0])  # position 0: identity


@pytest.mark.parametrize("mode", ["neox", "norm"])
def test_rope_yarn(rng, mode):
    ops = NumpyOps()
    p = RopeParams(n_rot=32, mode=mode, freq_base=10000.0, freq_scale=0.25, ext_factor=1.0,
                   attn_factor=0.9, n_ctx_orig=4096)
    lo, hi = p.corr_dims()
    assert 0 < lo < hi < 15  # a real ramp over the 16 pairs
    positions = (0, 1, 7, 40, 5000)
    b = Batch(tuple(range(5)), positions, 0, AttnMask.causal(0, 5))
    x = rng.standard_normal((5, 2, 40)).astype(np.float32)
    y = ops.rope(x, ops.prepare(b), p)
    np.testing.assert_allclose(y, naive_rope(x, positions, p), rtol=1e-5, atol=1e-5)
    # the ramp's ends: pairs below lo are pure extrapolation, above hi pure interpolation
    cos, _ = nb.rope_cos_sin(np.array([40]), p)
    m = 0.9 * (1 + 0.1 * math.log(4))
    for i in (0, int(lo)):
        assert cos[0, i] == pytest.approx(math.cos(40 * 10000 ** (-2 * i / 32)) * m, abs=1e-6)
    for i in range(int(math.ceil(hi)) + 1, 16):
        assert cos[0, i] == pytest.approx(math.cos(0.25 * 40 * 10000 ** (-2 * i / 32)) * m,
                                          abs=1e-6)


def test_rope_linear_scaling(rng):
    ops = NumpyOps()
    p = RopeParams(n_rot=16, mode="neox", freq_base=10000.0, freq_scale=0.5, attn_factor=1.0)
    b = Batch((0, 1), (6, 9), 0, AttnMask.causal(0, 2))
    x = rng.standard_normal((2, 2, 16)).astype(np.float32)
    np.testing.assert_allclose(ops.rope(x, ops.prepare(b), p), naive_rope(x, (6, 9), p),
                               rtol=1e-5, atol=1e-5)


# --- attention -----------------------------------------------------------------------------
def naive_attention(q, K, V, mask: AttnMask, scale, tiled=False):
    T, H, dk = q.shape
    Hkv = K.shape[1]
    out = np.zeros((T, H, V.shape[2]))
    for t in range(T):
        cells = mask.visible(t)
        for h in range(H):
            g = h % Hkv if tiled else h // (H // Hkv)
            s = [scale * float(np.dot(q[t, h].astype(np.float64), K[c, g])) for c in cells]
            m = max(s)
            e = [math.exp(v - m) for v in s]
            z = sum(e)
            for w, c in zip(e, cells):
                out[t, h] += (w / z) * V[c, g]
    return out.reshape(T, -1)


def _fill_cache(ops, rng, n_cells, Hkv, dk, dv, n_prev):
    cache = KVBuffers(ops, 2, n_cells, Hkv, dk, dv)
    if n_prev:
        prev = Batch.causal(list(range(n_prev)), 0)
        for layer in range(2):
            ops.kv_write(cache.k[layer], cache.v[layer],
                         rng.standard_normal((n_prev, Hkv, dk)).astype(np.float32),
                         rng.standard_normal((n_prev, Hkv, dv)).astype(np.float32),
                         ops.prepare(prev))
    return cache


@pytest.mark.parametrize("H,Hkv,dk,dv", [(6, 2, 5, 7), (4, 4, 8, 8), (3, 1, 9, 4)])
@pytest.mark.parametrize("n_prev,T", [(0, 5), (6, 3), (9, 1)])
def test_attention_causal_gqa(rng, H, Hkv, dk, dv, n_prev, T):
    ops = NumpyOps()
    cache = _fill_cache(ops, rng, 20, Hkv, dk, dv, n_prev)
    b = Batch.causal(list(range(T)), n_prev)
    pb = ops.prepare(b)
    k = rng.standard_normal((T, Hkv, dk)).astype(np.float32)
    v = rng.standard_normal((T, Hkv, dv)).astype(np.float32)
    ops.kv_write(cache.k[1], cache.v[1], k, v, pb)
    np.testing.assert_array_equal(cache.k[1][n_prev:n_prev + T], k)
    q = rng.standard_normal((T, H, dk)).astype(np.float32) * 2
    scale = 1 / math.sqrt(dk)
    y = ops.attention(q, cache.k[1], cache.v[1], pb, scale)
    K, V = cache.k[1][:b.n_kv], cache.v[1][:b.n_kv]
    ref = naive_attention(q, K, V, b.mask, scale)
    assert y.shape == (T, H * dv)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # a wrong (tiled) head grouping would differ: the test can tell them apart
    if Hkv > 1 and H > Hkv:
        assert not np.allclose(naive_attention(q, K, V, b.mask, scale, tiled=True), ref)


def test_attention_tree_mask(rng):
    """Prompt of 4 cells, then a batch of two 3-token candidates: each sees the prompt and its
    own earlier tokens only (the system1 layout)."""
    ops = NumpyOps()
    H, Hkv, d = 4, 2, 6
    cache = _fill_cache(ops, rng, 16, Hkv, d, d, 4)
    own_start = (4, 4, 4, 7, 7, 7)
    own_end = (5, 6, 7, 8, 9, 10)
    mask = AttnMask((4,) * 6, own_start, own_end)
    b = Batch(tuple(range(6)), (4, 5, 6, 4, 5, 6), 4, mask)
    pb = ops.prepare(b)
    assert pb.mask.tolist()[3] == [True] * 4 + [False] * 3 + [True] + [False] * 2
    ops.kv_write(cache.k[0], cache.v[0], rng.standard_normal((6, Hkv, d)).astype(np.float32),
                 rng.standard_normal((6, Hkv, d)).astype(np.float32), pb)
    q = rng.standard_normal((6, H, d)).astype(np.float32)
    y = ops.attention(q, cache.k[0], cache.v[0], pb, 0.3)
    ref = naive_attention(q, cache.k[0][:10], cache.v[0][:10], mask, 0.3)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # candidate 2's first token equals a fresh causal decode over prompt + that token alone
    solo = Batch((0,), (4,), 4, AttnMask((4,), (4,), (5,)))
    c2 = KVBuffers(ops, 1, 16, Hkv, d, d)
    c2.k[0][:4], c2.v[0][:4] = cache.k[0][:4], cache.v[0][:4]
    c2.k[0][4], c2.v[0][4] = cache.k[0][7], cache.v[0][7]
    np.testing.assert_allclose(ops.attention(q[3:4], c2.k[0], c2.v[0], ops.prepare(solo), 0.3), y[3:4],
                               rtol=1e-6, atol=1e-6)


def test_kv_write_overflow():
    ops = NumpyOps()
    cache = KVBuffers(ops, 1, 4, 1, 2, 2)
    pb = ops.prepare(Batch.causal([1, 2], 3))
    with pytest.raises(ReflexError, match="KV cache"):
        ops.kv_write(cache.k[0], cache.v[0], np.zeros((2, 1, 2), np.float32),
                     np.zeros((2, 1, 2), np.float32), pb)


def test_bad_mask_rejected():
    ops = NumpyOps()
    with pytest.raises(ValueError):
        ops.prepare(Batch((1,), (0,), 0, AttnMask((3,), (0,), (0,))))


# --- elementwise and shape ops ---------------------------------------------------------------
def test_swiglu_add_take_rows_view(rng):
    ops = NumpyOps()
    g = rng.standard_normal((3, 11)).astype(np.float32) * 4
    u = rng.standard_normal((3, 11)).astype(np.float32)
    ref = [[g[i, j] / (1 + math.exp(-float(g[i, j]))) * u[i, j] for j in range(11)] for i in range(3)]
    np.testing.assert_allclose(ops.swiglu(g, u), ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ops.add(g, u), g + u)
    np.testing.assert_array_equal(ops.take_rows(g, [2, 0, 2]), g[[2, 0, 2]])
    v = ops.view(g, (3, 11, 1))
    assert ops.shape(v) == (3, 11, 1) and np.shares_memory(v, g)
    with pytest.raises(ValueError):
        ops.add(g, u[:2])


# --- MoE ------------------------------------------------------------------------------------
def naive_route(logits, k, gating, norm, scale):
    ids, ws = [], []
    for row in logits.astype(np.float64):
        if gating == "softmax":
            m = max(row)
            e = [math.exp(v - m) for v in row]
            p = [v / sum(e) for v in e]
        else:
            p = [1 / (1 + math.exp(-v)) for v in row]
        order = sorted(range(len(p)), key=lambda i: (-p[i], i))[:k]
        w = [p[i] for i in order]
        if norm:
            s = max(sum(w), 6.103515625e-5)
            w = [v / s for v in w]
        if scale not in (0.0, 1.0):
            w = [v * scale for v in w]
        ids.append(order)
        ws.append(w)
    return np.array(ids), np.array(ws)


@pytest.mark.parametrize("gating,norm,scale", [("softmax", True, 0.0), ("softmax", False, 0.0),
                                               ("sigmoid", True, 2.5), ("sigmoid", False, 1.0)])
def test_moe_route(rng, gating, norm, scale):
    ops = NumpyOps()
    logits = rng.standard_normal((5, 9)).astype(np.float32)
    logits[1, [2, 5, 7]] = 3.0  # a three-way tie at the top: lowest index first
    logits[2, :] = 0.25  # all equal
    ids, w = ops.moe_route(logits, 3, gating, norm, scale)
    rids, rw = naive_route(logits, 3, gating, norm, scale)
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_allclose(w, rw, rtol=1e-6)
    assert ids[1].tolist() == [2, 5, 7] and ids[2].tolist() == [0, 1, 2]
    if norm:
        np.testing.assert_allclose(w.sum(-1), 1.0 if scale in (0.0, 1.0) else scale, rtol=1e-6)


def test_moe_route_renorm_clamp():
    ops = NumpyOps()
    logits = np.full((1, 6), -30.0, np.float32)  # sigmoid probs ~1e-13: the sum is clamped
    _, w = ops.moe_route(logits, 2, "sigmoid", True)
    p = 1 / (1 + math.exp(30.0))
    np.testing.assert_allclose(w, [[p / 6.103515625e-5] * 2], rtol=1e-5)


@pytest.mark.parametrize("t", [F32, Q8_0])
@pytest.mark.parametrize("per_expert_input", [False, True])
def test_moe_matmul_and_combine(rng, fake_gguf, t, per_expert_input):
    n_in, n_out, E, T, k = 64, 5, 4, 6, 2
    data = random_weight_bytes(rng, t, (n_in, n_out, E))
    ops = ops_with(fake_gguf, {"exps": ((n_in, n_out, E), t, data)})
    W = (np.frombuffer(data, np.float32).reshape(E, n_out, n_in).astype(np.float64) if t == F32
         else naive_dequant(t, data, (n_in, n_out, E)))
    ids = rng.integers(0, E, (T, k)).astype(np.int32)
    x = rng.standard_normal((T, k, n_in) if per_expert_input else (T, n_in)).astype(np.float32)
    y = ops.moe_matmul(x, ops.weight("exps"), ids)
    assert y.shape == (T, k, n_out)
    for tt in range(T):
        for j in range(k):
            xi = x[tt, j] if per_expert_input else x[tt]
            np.testing.assert_allclose(y[tt, j], W[ids[tt, j]] @ xi, rtol=1e-5, atol=1e-5)
    w = rng.random((T, k)).astype(np.float32)
    c = ops.moe_combine(y, w)
    ref = [sum(float(w[tt, j]) * y[tt, j].astype(np.float64) for j in range(k)) for tt in range(T)]
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-6)


# --- results to the host --------------------------------------------------------------------
def test_argmax_and_logprobs(rng):
    ops = NumpyOps()
    x = rng.standard_normal((4, 13)).astype(np.float32)
    x[2, [3, 8]] = 9.0
    assert ops.argmax(x) == [int(np.argmax(r)) for r in x] and ops.argmax(x)[2] == 3
    lp = ops.token_logprobs(x, [0, 5, 8, 12])
    for i, tg in enumerate([0, 5, 8, 12]):
        row = x[i].astype(np.float64)
        assert lp[i] == pytest.approx(row[tg] - math.log(sum(math.exp(v) for v in row)), abs=1e-9)


def _rows(rng, V=50):
    return rng.standard_normal(V).astype(np.float32) * 2


def test_sampling_greedy_cases(rng):
    ops = NumpyOps()
    for _ in range(20):
        row = _rows(rng)
        a = int(np.argmax(row))
        for u in (0.0, 0.37, 0.999999):
            assert ops.sample(row[None], 0.0, 0, 1.0, u) == a  # temperature 0
            assert ops.sample(row[None], -1.0, 5, 0.5, u) == a
            assert ops.sample(row[None], 0.8, 1, 1.0, u) == a  # top_k = 1
            assert ops.sample(row[None], 1.3, 0, 1e-9, u) == a  # tiny top_p
    tie = np.zeros(7, np.float32)
    tie[[2, 4]] = 1.0
    assert ops.sample(tie[None], 0.0, 0, 1.0, 0.9) == 2  # first on ties


def test_sampling_deterministic_and_last_row(rng):
    ops = NumpyOps()
    logits = rng.standard_normal((3, 40)).astype(np.float32)
    for u in rng.random(10):
        a = ops.sample(logits, 0.9, 10, 0.9, float(u))
        assert a == ops.sample(logits, 0.9, 10, 0.9, float(u))
        assert a == sampling.sample_reference(logits[-1], 0.9, 10, 0.9, float(u))


def independent_distribution(row, temperature, top_k, top_p):
    """llama.cpp's chain order: top-k, top-p on the temperature-1 probabilities q, then the
    temperature-T p of the nucleus."""
    z = row.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    q = np.exp(row.astype(np.float64) - row.max())
    order = sorted(range(len(p)), key=lambda i: -z[i])
    keep = set(order[:top_k]) if top_k > 0 else set(order)
    kept = sorted(keep, key=lambda i: -q[i])
    total = sum(q[i] for i in kept)
    acc, nucleus = 0.0, []
    for i in kept:
        nucleus.append(i)
        acc += q[i]
        if acc >= top_p * total:
            break
    out = np.zeros(len(p))
    for i in nucleus:
        out[i] = p[i]
    return out / out.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.5, 0, 0.6), (0.9, 8, 0.8)])
def test_sampling_distribution(rng, temperature, top_k, top_p):
    row = _rows(rng, 30)
    want = independent_distribution(row, temperature, top_k, top_p)
    np.testing.assert_allclose(sampling.sample_probs(row, temperature, top_k, top_p), want,
                               atol=1e-12)
    # a fine grid of u reproduces the distribution (inverse-CDF draw in index order)
    N = 20000
    counts = np.zeros(30)
    for i in range(N):
        counts[sampling.sample_reference(row, temperature, top_k, top_p, (i + 0.5) / N)] += 1
    np.testing.assert_allclose(counts / N, want, atol=1.5 / N)
    # index-order walk: u just above 0 gives the first kept index
    assert sampling.sample_reference(row, temperature, top_k, top_p, 0.0) == int(
        np.flatnonzero(want)[0])


def test_sampling_draw_intervals_are_half_open():
    """Step 7's walk returns the first kept index whose running sum exceeds u * S: token i owns
    [c_(i-1), c_i) of the draw, so a u on a boundary takes the next token, and a token of zero
    probability (kept: no filter is on) is never drawn, not even at u = 0."""
    row = np.zeros(4, np.float32)  # p = 1, 1, 1, 1 exactly: the sums are exact
    assert [sampling.sample_reference(row, 1.0, 0, 1.0, u) for u in (0.0, 0.25, 0.5, 0.75)] == \
        [0, 1, 2, 3]
    row = np.array([-1e38, 0.0, 0.0], np.float32)  # token 0: exp(-1e38) = 0
    assert sampling.sample_reference(row, 1.0, 0, 1.0, 0.0) == 1
    assert sampling.sample_probs(row, 1.0, 0, 1.0)[0] == 0.0


def test_sampling_top_k_keeps_ties():
    row = np.array([0.0, 2.0, 1.0, 1.0, 1.0, -1.0], np.float32)
    p = sampling.sample_probs(row, 1.0, 2, 1.0)
    assert set(np.flatnonzero(p)) == {1, 2, 3, 4}


def test_sampling_module_imports_without_numpy():
    code = ("import sys; sys.modules['numpy'] = None\n"
            "from reflex_core import sampling\n"
            "p = sampling.SamplingParams(0.5, 3, 0.9)\n"
            "assert (p.top_k, p.seed, p.greedy, sampling.SamplingParams().greedy) == "
            "(3, None, False, True)\n")
    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_get_backend():
    assert isinstance(get_backend("cpu"), NumpyOps)
    assert get_backend("cpu", cache_weights=False).cache_weights is False
    with pytest.raises(ReflexError, match="unknown backend"):
        get_backend("tpu")


# --- the qwen3 model on NumpyOps (no oracle needed) ---------------------------------------------
def test_qwen3_rows_and_tree_batch(model_files):
    """Logits of selected rows equal the full computation's; a tree batch (prompt + two
    candidates) gives each candidate the logits of its own causal run."""
    from reflex_core.gguf import open_gguf
    from reflex_core.testing.modelwriter import ModelShape
    from reflex_qwen3.model import Qwen3

    path = model_files(ModelShape(n_vocab=97), "F32", seed=3)
    ops = NumpyOps()
    ops.attach(open_gguf(path))
    m = Qwen3.load(open_gguf(path), ops)
    prompt, c1, c2 = [5, 9, 1, 44], [7, 8], [30, 31, 32]

    def causal(tokens):
        st = m.new_state(16)
        return m.forward(st.append(tokens), st, list(range(len(tokens))))

    full = causal(prompt + c1)
    st = m.new_state(8)
    np.testing.assert_allclose(m.forward(st.append(prompt + c1), st, [5, 1]),
                               full[[5, 1]], rtol=1e-6, atol=1e-6)
    # tree batch: cells 0-3 prompt, 4-5 c1, 6-8 c2
    st = m.new_state(16, 3)
    b = st.append_tree(prompt, {1: c1, 2: c2})
    assert b.positions == (0, 1, 2, 3, 4, 5, 4, 5, 6)
    assert b.mask.visible(6) == [0, 1, 2, 3, 6] and b.mask.visible(5) == [0, 1, 2, 3, 4, 5]
    tree = m.forward(b, st, list(range(9)))
    np.testing.assert_allclose(tree[:6], full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tree[6:], causal(prompt + c2)[4:], rtol=1e-5, atol=1e-5)


def test_blocks_moe_ffn_and_swiglu_ffn(rng, fake_gguf):
    """blocks.moe_ffn / swiglu_ffn on NumpyOps vs a per-token loop (spec §4.2, §4.5)."""
    from reflex_core import blocks

    D, F, E, k, T = 12, 7, 5, 2, 4
    arrs = {"r": rng.standard_normal((E, D)), "g": rng.standard_normal((E, F, D)) / 3,
            "u": rng.standard_normal((E, F, D)) / 3, "d": rng.standard_normal((E, D, F)) / 3}
    ne = {"r": (D, E), "g": (D, F, E), "u": (D, F, E), "d": (F, D, E)}
    ops = ops_with(fake_gguf, {n: (ne[n], F32, a.astype(np.float32).tobytes())
                               for n, a in arrs.items()})
    x = rng.standard_normal((T, D)).astype(np.float32)
    W = {n: ops.weight(n) for n in arrs}
    y = blocks.moe_ffn(ops, x, W["r"], W["g"], W["u"], W["d"], k)

    def silu(v):
        return v / (1 + np.exp(-v))

    for t in range(T):
        logits = arrs["r"] @ x[t]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        sel = sorted(range(E), key=lambda e: (-p[e], e))[:k]
        wsum = sum(p[e] for e in sel)
        ref = sum(p[e] / wsum * (arrs["d"][e] @ (silu(arrs["g"][e] @ x[t]) * (arrs["u"][e] @ x[t])))
                  for e in sel)
        np.testing.assert_allclose(y[t], ref, rtol=1e-5, atol=1e-5)
    # the dense FFN with expert 0's matrices as plain 2-D weights
    ops2 = ops_with(fake_gguf, {"g": ((D, F), F32, arrs["g"][0].astype(np.float32).tobytes()),
                                "u": ((D, F), F32, arrs["u"][0].astype(np.float32).tobytes()),
                                "d": ((F, D), F32, arrs["d"][0].astype(np.float32).tobytes())})
    y2 = blocks.swiglu_ffn(ops2, x, ops2.weight("g"), ops2.weight("u"), ops2.weight("d"))
    ref2 = [arrs["d"][0] @ (silu(arrs["g"][0] @ xt) * (arrs["u"][0] @ xt)) for xt in x]
    np.testing.assert_allclose(y2, ref2, rtol=1e-5, atol=1e-5)


# --- fused ops: NumPy twins ----------------------------------------------------------------------
# Each fused op against its definition written out in float64 from the dequantized weights (the
# spec's formulas, not the backend's ops). Tolerances are float32 error bounds, not fitted:
U = 2.0 ** -24  # unit roundoff of float32


def dot_bound(x64: np.ndarray, W64: np.ndarray) -> np.ndarray:
    """Bound on |float32 x·w - exact x·w| for every output, whatever the order of summation
    (and with or without FMA): gamma_n * sum_i |x_i w_i|, gamma_n = n u / (1 - n u) (Higham,
    "Accuracy and Stability of Numerical Algorithms", 3.1). x and the dequantized weights are
    exact float32 values, so this is the whole error of a float32 matmul."""
    n = x64.shape[-1]
    return n * U / (1 - n * U) * (np.abs(x64) @ np.abs(W64).T)


def silu64(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def swiglu_bound(g64, eg, u64, eu):
    """Bound on |float32 silu(g~) u~ - silu(g) u| where g~, u~ are within eg, eu of g, u: silu
    has slope in [-0.1, 1.1], so silu(g~) is within 1.1 eg; the float32 silu and product add a
    few roundings (exp, add, divide, multiply), counted generously as 16 u of the result."""
    return (1.1 * eg * (np.abs(u64) + eu) + np.abs(silu64(g64)) * eu
            + 16 * U * np.abs(silu64(g64) * u64))


def assert_within(got, want, bound, what):
    err = np.abs(np.asarray(got, np.float64) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} "
                                  f"at {worst}")


def dequantized(t: int, data: bytes, ne) -> np.ndarray:
    """float64 weights [..., n_out, n_in] from raw bytes: this file's own decoders."""
    if t == F32:
        return np.frombuffer(data, np.float32).astype(np.float64).reshape(tuple(reversed(ne)))
    if t == F16:
        return np.frombuffer(data, np.float16).astype(np.float64).reshape(tuple(reversed(ne)))
    return naive_dequant(t, data, ne)


def test_fused_ops_vs_their_formulas(rng, fake_gguf):
    """matmul_many, matmul_swiglu, moe_matmul_swiglu and add_rmsnorm on NumpyOps: mixed weight
    types (Q8_0, Q4_0, F16, F32), odd sizes, T = 1 and 7, weights cached or dequantized per use."""
    D, F, n, E, k = 37, 11, 64, 5, 2
    raw = {"q": ((n, 24), Q8_0), "k": ((n, 8), Q4_0), "v": ((n, 8), F16), "g": ((D, F), F32),
           "u": ((D, F), F16), "eg": ((n, F, E), Q8_0), "eu": ((n, F, E), F32)}
    tensors = {name: (ne, t, random_weight_bytes(rng, t, ne)) for name, (ne, t) in raw.items()}
    tensors["nw"] = ((D,), F32, (1 + 0.2 * rng.standard_normal(D)).astype(np.float32).tobytes())
    W64 = {name: dequantized(t, data, ne) for name, (ne, t, data) in tensors.items()}
    for cache_weights in (True, False):
        ops = ops_with(fake_gguf, tensors, cache_weights)
        W = {name: ops.weight(name) for name in tensors}
        for T in (1, 7):
            x = rng.standard_normal((T, n)).astype(np.float32)
            x64 = x.astype(np.float64)
            got = ops.matmul_many(x, [W["q"], W["k"], W["v"]])
            assert [y.shape for y in got] == [(T, 24), (T, 8), (T, 8)]
            for y, name in zip(got, "qkv"):
                assert y.dtype == np.float32
                assert_within(y, x64 @ W64[name].T, dot_bound(x64, W64[name]),
                              f"matmul_many {name}")

            xd = rng.standard_normal((T, D)).astype(np.float32)
            xd64 = xd.astype(np.float64)
            g64, u64 = xd64 @ W64["g"].T, xd64 @ W64["u"].T
            bound = swiglu_bound(g64, dot_bound(xd64, W64["g"]), u64, dot_bound(xd64, W64["u"]))
            assert_within(ops.matmul_swiglu(xd, W["g"], W["u"]), silu64(g64) * u64, bound,
                          "matmul_swiglu")

            ids = rng.integers(0, E, (T, k)).astype(np.int32)
            for xe in (x, rng.standard_normal((T, k, n)).astype(np.float32)):  # shared, per slot
                xs = np.broadcast_to(xe[:, None, :] if xe.ndim == 2 else xe, (T, k, n))
                want, bound = np.zeros((T, k, F)), np.zeros((T, k, F))
                for t in range(T):
                    for j in range(k):
                        xi = xs[t, j].astype(np.float64)[None]
                        Ge, Ue = W64["eg"][ids[t, j]], W64["eu"][ids[t, j]]
                        ge, ue = (xi @ Ge.T)[0], (xi @ Ue.T)[0]
                        want[t, j] = silu64(ge) * ue
                        bound[t, j] = swiglu_bound(ge, dot_bound(xi, Ge)[0], ue,
                                                   dot_bound(xi, Ue)[0])
                got = ops.moe_matmul_swiglu(xe, W["eg"], W["eu"], ids)
                assert_within(got, want, bound, f"moe_matmul_swiglu x{xe.shape}")

            a = (rng.standard_normal((T, D)) * 3).astype(np.float32)
            b = rng.standard_normal((T, D)).astype(np.float32)
            # float32 addition is correctly rounded, and the float64 sum of two float32 values
            # whose exponents differ by less than 29 is exact, so rounding that once to float32
            # is the float32 sum: the residual must match to the bit
            assert (np.minimum(abs(a), abs(b)) > 2.0 ** -28 * np.maximum(abs(a), abs(b))).all()
            s_want = (a.astype(np.float64) + b).astype(np.float32)
            for w, w64 in ((W["nw"], W64["nw"]), (None, 1.0)):
                s, y = ops.add_rmsnorm(a, b, w, 1e-6)
                assert s.dtype == y.dtype == np.float32
                assert np.array_equal(s, s_want)
                s64 = s_want.astype(np.float64)
                y_want = s64 / np.sqrt((s64 * s64).mean(-1, keepdims=True) + 1e-6) * w64
                # relative per element: a float32 sum of D squares (gamma_D, halved by the square
                # root) plus a few single roundings (mean, + eps, sqrt, divide, times w)
                np.testing.assert_allclose(y, y_want, rtol=(D / 2 + 8) * U, atol=0)


def test_numpy_fused_ops_are_the_base_compositions():
    """The oracle tests validated the unfused ops' numerics; the NumPy twins must stay exactly
    those compositions (the Ops defaults), not re-implementations that round differently."""
    from reflex_core.ops import Ops

    for name in ("matmul_many", "matmul_swiglu", "moe_matmul_swiglu", "add_rmsnorm",
                 "qk_norm_rope_store"):
        assert getattr(NumpyOps, name) is getattr(Ops, name), name


@pytest.mark.parametrize("norms", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("mode,ext", [("neox", 0.0), ("norm", 0.0), ("neox", 1.0), ("norm", 1.0)])
@pytest.mark.parametrize("T,H,Hkv,d,dv", [(1, 4, 2, 8, 8), (7, 6, 3, 10, 6), (5, 3, 1, 9, 4)])
def test_qk_norm_rope_store_vs_naive(rng, fake_gguf, norms, mode, ext, T, H, Hkv, d, dv):
    """The fused attention prologue: naive per-head RMSNorm (float64) then naive RoPE, and the
    cache cells [cell0, cell0 + T) hold rotated k and v (and no other cell, no other layer)."""
    n_rot = d - d % 2 if mode == "neox" else max(2, (d - 2) - (d - 2) % 2)
    p = RopeParams(n_rot=n_rot, mode=mode, freq_base=10000.0,
                   freq_scale=0.25 if ext else 1.0, ext_factor=ext, attn_factor=1.0,
                   n_ctx_orig=64 if ext else 0)
    qg = (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    kg = (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    ops = ops_with(fake_gguf, {"qn": ((d,), F32, qg.tobytes()), "kn": ((d,), F32, kg.tobytes())})
    qn = ops.weight("qn") if norms[0] else None
    kn = ops.weight("kn") if norms[1] else None
    q = (rng.standard_normal((T, H, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, d)) * 2).astype(np.float32)
    v = rng.standard_normal((T, Hkv, dv)).astype(np.float32)
    cell0 = 3
    batch = Batch(tuple(range(T)), tuple(int(x) for x in rng.integers(0, 500, T)), cell0,
                  AttnMask.causal(cell0, T))
    pb = ops.prepare(batch)
    cache = KVBuffers(ops, 2, cell0 + T + 1, Hkv, d, dv)
    eps = 1e-6
    got = ops.qk_norm_rope_store(q, k, v, qn, kn, eps, pb, p, cache.k[1], cache.v[1])

    def naive_norm(x, g):
        x = x.astype(np.float64)
        r = x / np.sqrt((x * x).sum(-1, keepdims=True) / x.shape[-1] + eps)
        return r * g.astype(np.float64)

    pos = np.array(batch.positions)
    want_q = naive_rope(naive_norm(q, qg) if norms[0] else q, pos, p)
    want_k = naive_rope(naive_norm(k, kg) if norms[1] else k, pos, p)
    # float32 error: the norm rounds twice (to float32, times the weight), the rotation rounds
    # cos/sin and a*c - b*s: a few u (6e-8) of |a| + |b|, which stay below ~15 here (rows of RMS
    # 2, or RMS 1 times weights up to ~2): ~5e-6 at worst. A wrong angle or pairing is off by O(1).
    np.testing.assert_allclose(got, want_q, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cache.k[1][cell0:cell0 + T], want_k, rtol=2e-5, atol=2e-5)
    assert np.array_equal(cache.v[1][cell0:cell0 + T], v)
    assert not cache.k[1][:cell0].any() and not cache.k[1][cell0 + T:].any()
    assert not cache.k[0].any() and not cache.v[0].any()


def test_blocks_residual_rmsnorm_and_lm_head(rng, fake_gguf):
    """blocks.residual_rmsnorm (None delta: plain norm) and lm_head(residual=...) == the unfused
    add / take_rows / rmsnorm / matmul."""
    from reflex_core import blocks

    D, V, T = 16, 9, 5
    ops = ops_with(fake_gguf, {
        "n": ((D,), F32, (1 + 0.1 * rng.standard_normal(D)).astype(np.float32).tobytes()),
        "o": ((D, V), F32, rng.standard_normal((V, D)).astype(np.float32).tobytes())})
    x = rng.standard_normal((T, D)).astype(np.float32)
    h = rng.standard_normal((T, D)).astype(np.float32)
    nw, ow = ops.weight("n"), ops.weight("o")
    x1, a = blocks.residual_rmsnorm(ops, x, None, nw, 1e-6)
    assert x1 is x and np.array_equal(a, ops.rmsnorm(x, nw, 1e-6))
    x2, b = blocks.residual_rmsnorm(ops, x, h, nw, 1e-6)
    assert np.array_equal(x2, x + h) and np.array_equal(b, ops.rmsnorm(x + h, nw, 1e-6))
    for rows in ([4], [1, 2, 3], [3, 0]):
        want = ops.matmul(ops.rmsnorm(ops.take_rows(ops.add(x, h), rows), nw, 1e-6), ow)
        got = blocks.lm_head(ops, x, nw, ow, 1e-6, rows, residual=h)
        assert np.array_equal(got, want), rows
        assert np.array_equal(blocks.lm_head(ops, x, nw, ow, 1e-6, rows),
                              ops.matmul(ops.rmsnorm(ops.take_rows(x, rows), nw, 1e-6), ow))
