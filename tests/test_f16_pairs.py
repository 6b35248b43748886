"""The NumPy twin of the prefill GEMM on float16 pairs (reflex_core.testing.f16_pairs): its
pairs are x halves' values in plane order, and its products are what the GEMM should sum."""

import numpy as np

from reflex_core.testing.f16_pairs import pairs, pairs_magnitude, pairs_product
from reflex_core.testing.x_halves import x_from_halves, x_halves


def test_pairs_are_the_x_halves_values():
    """Same scale rule and the same (hi, lo) as reflex_x_halves' twin, every kind of row."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1] *= np.exp2(rng.integers(-30, 30, 96)).astype(np.float32)
    x[2] *= np.float32(1e-38)
    x[3] = 0
    x[4, 5] = np.nan
    x[5, 0] = -np.inf
    hi, lo, s = pairs(x)
    H, s_h, _ = x_halves(x)
    assert np.array_equal(np.isnan(s), np.isnan(s_h))
    ok = ~np.isnan(s)
    assert np.array_equal(s[ok], s_h[ok])
    assert not hi[~ok].any() and not lo[~ok].any(), "a non-finite row is zeros"
    want = x_from_halves(H, s_h)[ok]
    got = (hi.astype(np.float64) + lo.astype(np.float64))[ok] * s[ok, None].astype(np.float64)
    assert np.array_equal(got, want)
    assert (np.abs(hi.astype(np.float32)) < 2 ** 15).all()


def test_pairs_product_terms():
    """Three terms: the float64 product of the rows to about 2^-21 of the magnitude; one term:
    each operand rounded to float16, within 2^-10 of it; neither exact by accident."""
    rng = np.random.default_rng(32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    w = (rng.standard_normal((7, 256)) * np.exp2(rng.integers(-8, 8, (7, 1)))).astype(np.float32)
    xp, wp = pairs(x), pairs(w)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    mag = pairs_magnitude(xp, wp)
    err3 = np.abs(pairs_product(xp, wp, 3) - exact) / mag
    err1 = np.abs(pairs_product(xp, wp, 1) - exact) / mag
    assert err3.max() < 2 ** -21
    assert 2 ** -21 < err1.max() < 2 ** -10
