"""The x limbs' NumPy twin (reflex_core.testing.x_limbs): what the GEMV on x limbs multiplies is
x to 23 significant bits of its block's largest value, and the byte layout holds the integers."""

import numpy as np
import pytest

from reflex_core.testing.x_limbs import slot, words_for, x_from_limbs, x_limbs


def _blocks(rng):
    """Blocks of every kind the kernel meets: ordinary, wide-ranging, tiny, huge, subnormal,
    all zero, exact halves (rint's ties), the largest value at a power of two."""
    b = [rng.standard_normal(32),
         rng.standard_normal(32) * np.exp2(rng.integers(-30, 30, 32)),
         rng.standard_normal(32) * 1e-30,
         rng.standard_normal(32) * 1e30,
         np.full(32, 1e-44) * rng.integers(-3, 4, 32),
         np.zeros(32),
         (np.arange(32) - 16) * 0.5 ** 23,
         np.r_[4.0, -4.0, rng.uniform(-4, 4, 30)]]
    return np.concatenate(b).astype(np.float32)


def test_x_limbs_stand_for_x():
    rng = np.random.default_rng(7)
    x = _blocks(rng)
    words = x_limbs(x)
    assert words.dtype == np.uint32 and words.shape == (words_for(x.size),)
    xr = x_from_limbs(words, x.size)
    nat = words.reshape(-1, 4)[slot(np.arange(x.size // 4))].reshape(-1)  # natural order
    for blk in range(x.size // 32):
        xb, rb = x[32 * blk:32 * blk + 32].astype(np.float64), xr[32 * blk:32 * blk + 32]
        m = np.abs(xb).max()
        s = np.float64(nat[32 * blk + 3].view(np.float32))
        if m == 0:
            assert (rb == 0).all() and s == 1.0
            continue
        e = max(int(np.frexp(m)[1]), -127)
        assert s == np.ldexp(1.0, e - 22), f"block {blk}"
        assert np.abs(rb / s).max() <= 2 ** 22, f"block {blk}"
        # rint: at most half a unit of s off; a block of subnormals exactly
        assert np.abs(rb - xb).max() <= s / 2, f"block {blk}"
        if e == -127:
            assert (rb == xb).all()


def test_x_limbs_bytes_and_ties():
    x = np.zeros(32, np.float32)
    # max 1.0 = 0.5 * 2^1: e = 1, s = 2^-21, X = x * 2^21; 3 * 2^-23 -> rint(0.75) = 1
    x[:4] = 1.0, -1.0, 0.75, 3 * 2.0 ** -23
    w = x_limbs(x).reshape(-1, 4)[slot(np.arange(8))].reshape(-1)  # natural order
    u = [v & 0xFFFFFFFF for v in (2 ** 21, -(2 ** 21), 3 * 2 ** 19, 1)]
    for i in range(3):
        assert int(w[i]) == sum(((v >> (8 * i)) & 0xFF) << (8 * k) for k, v in enumerate(u))
    assert w[3].view(np.float32) == np.float32(2.0 ** -21)
    # ties go to even: X = 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
    x[1:4] = np.array([0.5, 1.5, 2.5]) * 2.0 ** -21
    assert list(x_from_limbs(x_limbs(x), 32)[1:4] / 2.0 ** -21) == [0.0, 2.0, 2.0]


def test_x_limbs_non_finite_and_sizes():
    x = np.ones(64, np.float32)
    x[40] = np.nan
    w = x_limbs(x).reshape(-1, 4)[slot(np.arange(16))]
    assert np.isnan(w[8:, 3].view(np.float32)).all() and (w[8:, :3] == 0).all()
    assert (w[:8, 3].view(np.float32) == np.float32(2.0 ** -21)).all()
    x[40] = np.inf
    assert np.isnan(x_from_limbs(x_limbs(x), 64)[32:]).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        x_limbs(np.ones(33, np.float32))


def test_slots_follow_the_gemv_lanes():
    """Load i = 2k + h of lane L = 2u + p of a warp is slot 32 i + L of its chunk and holds group
    2p + k + 4h of lane unit u (its elements 4 (2p + k) + 16 h ..+4, as rx_lu<IQ4_XS>'s e0 / e1);
    every group of 3 chunks lands once, a partial chunk's groups at their full chunk's places."""
    for L in range(32):
        u, p = L >> 1, L & 1
        for k in (0, 1):
            for h in (0, 1):
                assert slot(128 + 8 * u + 2 * p + k + 4 * h) == 128 + 32 * (2 * k + h) + L
    assert sorted(slot(np.arange(384)).tolist()) == list(range(384))
    assert words_for(768) == 1024 and words_for(512) == 512 and words_for(32) == 512
