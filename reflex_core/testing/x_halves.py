"""NumPy twin of ``reflex_x_halves`` (cuda/core.cu): activation rows as the scaled float16 pairs
the tensor-core prefill matmul of the integer weight types reads (``reflex_matmul_xh_<t>``).

Each row gets a power-of-two scale s = 2^(e-15), e the exponent with max|x| < 2^e (at least
-112); an all-zero row s = 1; a row with a NaN or inf s = NaN and every half 0. Each v = x / s
(|v| < 2^15) becomes hi = float16(v) and lo = float16(v - hi), so hi + lo is v to about 22 bits.
Per 32-element block, 32 words: word 16h + 4q + i holds two float16 bits (low half first):
i = 0 the hi of elements 16h + 2q and +1, i = 1 the hi of 16h + 2q + 8 and +9, i = 2, 3 the
same lo's (one m16n8k16 B fragment pair, hi and lo, a 16-byte load). Beside them the rows' s and
each block's sum of hi + lo in the kernel's order (a warp's xor-butterfly).
"""

from __future__ import annotations

import numpy as np

BLOCK = 32


def _word_sources() -> tuple[np.ndarray, np.ndarray]:
    """(first element, lo?) of each of a block's 32 words."""
    w = np.arange(32)
    h, q, i = w >> 4, (w >> 2) & 3, w & 3
    return 16 * h + 2 * q + np.where(i & 1, 8, 0), i >= 2


def row_scales(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s, 1 / s, finite) of each float32 row of ``x`` [R, n] (rx_pow2_scale): s = 2^(e-15) with
    max|x| < 2^e (e at least -112); an all-zero row s = 1; a row with a NaN or inf s = NaN,
    finite False."""
    R, n = x.shape
    with np.errstate(invalid="ignore"):
        m = np.abs(x).max(axis=1) if n else np.zeros(R, np.float32)
    finite = np.isfinite(m)
    s = np.ones(R, np.float32)
    inv = np.ones(R, np.float32)
    live = finite & (m != 0)
    _, e = np.frexp(m[live])
    e = np.maximum(e.astype(np.int64), -112)
    s[live] = np.ldexp(np.float32(1.0), (e - 15).astype(np.int32)).astype(np.float32)
    inv[live] = np.ldexp(np.float32(1.0), (15 - e).astype(np.int32)).astype(np.float32)
    s[~finite] = np.nan
    return s, inv, finite


def x_halves(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(H uint32 [T, n_in / 32, 32], s float32 [T], sums float32 [T, n_in / 32]) of the float32
    rows ``x`` [T, n_in] (n_in % 32 == 0)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"x_halves: rows of {x.shape[-1]} elements are not a multiple of {BLOCK}")
    T, n_in = x.shape
    s, inv, finite = row_scales(x)
    v = np.where(finite[:, None], x * inv[:, None], np.float32(0)).astype(np.float32)
    hi = v.astype(np.float16)
    lo = (v - hi.astype(np.float32)).astype(np.float16)
    hb = hi.view(np.uint16).astype(np.uint32).reshape(T, -1, BLOCK)
    lb = lo.view(np.uint16).astype(np.uint32).reshape(T, -1, BLOCK)
    first, is_lo = _word_sources()
    src = np.where(is_lo[None, None, :], lb[:, :, first], hb[:, :, first])
    nxt = np.where(is_lo[None, None, :], lb[:, :, first + 1], hb[:, :, first + 1])
    H = (src | (nxt << 16)).astype(np.uint32)
    f = (hi.astype(np.float32) + lo.astype(np.float32)).reshape(T, -1, BLOCK)
    lanes = np.arange(BLOCK)
    for off in (16, 8, 4, 2, 1):  # the kernel's __shfl_xor_sync butterfly, in float32
        f = (f + f[:, :, lanes ^ off]).astype(np.float32)
    return H, s, f[:, :, 0].copy()


def x_from_halves(H, s) -> np.ndarray:
    """The float64 rows [T, n_in] the halves stand for, s * (hi + lo)."""
    H = np.asarray(H, np.uint32)
    T, nb, _ = H.shape
    first, is_lo = _word_sources()
    v = np.zeros((T, nb, BLOCK), np.float64)
    for part, sel in ((0, ~is_lo), (1, is_lo)):
        w = H[:, :, sel]
        for k, shift in ((0, 0), (1, 16)):
            vals = ((w >> shift) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
            v[:, :, first[sel] + k] += vals
    return v.reshape(T, -1) * np.asarray(s, np.float64)[:, None]
