"""NumPy twin of the prefill GEMM on float16 pairs: ``reflex_x_pairs`` (cuda/core.cu),
``reflex_unpack_pairs_<t>`` and ``reflex_matmul_f16x{1,3}`` (reflex/quant_kernels.cuh).

Rows (activations, or a weight's exactly decoded rows) get x_halves' power-of-two scale s
(:func:`reflex_core.testing.x_halves.row_scales`) and each v = value / s becomes hi =
float16(v), lo = float16(v - hi). The GEMM sums s_o s_t (Wh.Xh + Wh.Xl + Wl.Xh) (three terms) or
s_o s_t Wh.Xh (one) in float32 on the tensor cores; :func:`pairs_product` is that sum in float64,
so the kernel differs from it by its float32 summation only.
"""

from __future__ import annotations

import numpy as np

from .x_halves import row_scales


def pairs(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hi float16 [R, n], lo float16 [R, n], s float32 [R]) of the float32 rows [R, n]."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    s, inv, finite = row_scales(rows)
    v = np.where(finite[:, None], rows * inv[:, None], np.float32(0)).astype(np.float32)
    hi = v.astype(np.float16)
    lo = (v - hi.astype(np.float32)).astype(np.float16)
    return hi, lo, s


def pairs_product(xp, wp, terms: int = 3) -> np.ndarray:
    """float64 [T, n]: the products of x's pairs ``xp`` and the weight's ``wp`` (each
    :func:`pairs`) that the GEMM of ``terms`` (3 or 1) terms sums, times the scales."""
    xh, xl, xs = (np.asarray(a, np.float64) for a in xp)
    wh, wl, ws = (np.asarray(a, np.float64) for a in wp)
    acc = xh @ wh.T
    if terms == 3:
        acc += xl @ wh.T + xh @ wl.T
    return acc * xs[:, None] * ws[None, :]


def pairs_magnitude(xp, wp) -> np.ndarray:
    """float64 [T, n]: s_t s_o sum |Xh| |Wh|, the scale of the GEMM's float32 rounding."""
    xh, _, xs = (np.abs(np.asarray(a, np.float64)) for a in xp)
    wh, _, ws = (np.abs(np.asarray(a, np.float64)) for a in wp)
    return (xh @ wh.T) * xs[:, None] * ws[None, :]
