"""NumPy twin of ``reflex_x_limbs`` (cuda/core.cu): activations as the x limbs the one-token GEMV
of the integer-unit weight types reads (layout: cuda/include/reflex/quants.cuh, before
``rx_gemv_rows_xq``).

Each 32-element block of x gets a power-of-two scale s = 2^(e-22), e the exponent with
max|x| < 2^e (at least -127: a block of subnormals gets s = 2^-149, and its X are exact), and
integers X = rint(x / s) (|X| <= 2^22); an all-zero block s = 1, X = 0; a block with a NaN or
inf s = NaN, X = 0. Each group of 4 elements is 4 words: word i < 3 holds byte i of
the group's four X (X as 32-bit two's complement), word 3 holds s; the groups sit in the GEMV's
load order (:func:`slot`), in whole chunks of :data:`CHUNK` elements.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
CHUNK = 512  # RX_XQ_CHUNK
_NAN_BITS = np.uint32(0x7FC00000)


def slot(group):
    """rx_xq_slot: where natural group ``group`` (4 elements) sits, in groups from the start.
    In a chunk of 128 groups, group q = 2p + k + 4h of lane unit u goes to 32 (2k + h) + 2u + p."""
    group = np.asarray(group)
    c, g = group >> 7, group & 127
    u, q = g >> 3, g & 7
    return (c << 7) + 32 * (2 * (q & 1) + (q >> 2)) + 2 * u + ((q >> 1) & 1)


def words_for(n: int) -> int:
    """Words of the x limbs of ``n`` elements: whole chunks."""
    return -(-n // CHUNK) * CHUNK


def scaled_ints(b) -> tuple[np.ndarray, np.ndarray]:
    """The rule for each row of ``b`` (float32 [rows, size]): its scale s's bits (uint32 [rows])
    and integers X (int64 [rows, size]). The staged runs of the K-quants' one-token GEMV
    (``rx_x_limb_run``, runs of 16) follow it too."""
    b = np.asarray(b, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        m = np.abs(b).max(axis=1)
    finite = np.isfinite(m)
    live = finite & (m != 0)
    _, e = np.frexp(m[live])
    e = np.maximum(e.astype(np.int64), -127)
    X = np.zeros(b.shape, np.int64)
    # x * 2^(22-e) is exact in float32 (|result| < 2^22, or < 1/2 when it would be subnormal),
    # so float64 and rint (halves to even, as __float2int_rn) give the kernel's integers
    X[live] = np.rint(np.ldexp(b[live].astype(np.float64), (22 - e)[:, None])).astype(np.int64)
    s = np.ones(b.shape[0], np.float32)
    s[live] = np.ldexp(np.float32(1.0), (e - 22).astype(np.int32)).astype(np.float32)
    s_bits = s.view(np.uint32).copy()
    s_bits[~finite] = _NAN_BITS
    return s_bits, X


def x_limbs(x) -> np.ndarray:
    """uint32 [words_for(n)] x limbs of the float32 values ``x`` (flattened; n % 32 == 0); the
    slots of a last partial chunk that no group fills are 0 (the kernel leaves them as they
    were)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if x.size % BLOCK:
        raise ValueError(f"x_limbs: {x.size} elements is not a multiple of {BLOCK}")
    b = x.reshape(-1, BLOCK)
    s_bits, X = scaled_ints(b)
    u = (X & 0xFFFFFFFF).astype(np.uint64).reshape(-1, 4)  # groups of 4 elements
    words = np.empty((u.shape[0], 4), np.uint32)
    for i in range(3):
        byte = (u >> np.uint64(8 * i)) & np.uint64(0xFF)
        words[:, i] = (byte[:, 0] | byte[:, 1] << np.uint64(8) | byte[:, 2] << np.uint64(16)
                       | byte[:, 3] << np.uint64(24)).astype(np.uint32)
    words[:, 3] = np.repeat(s_bits, BLOCK // 4)
    out = np.zeros((words_for(x.size) // 4, 4), np.uint32)
    out[slot(np.arange(words.shape[0]))] = words
    return out.reshape(-1)


def x_from_limbs(words, n: int) -> np.ndarray:
    """The ``n`` float64 values the limbs stand for, s * X (what the GEMV multiplies)."""
    w = np.ascontiguousarray(words, dtype=np.uint32).reshape(-1, 4)[slot(np.arange(n // 4))]
    b = w[:, :3, None] >> np.array([0, 8, 16, 24], np.uint32) & np.uint32(0xFF)  # [g, limb, elem]
    hi = b[:, 2].astype(np.int64)
    hi = np.where(hi >= 128, hi - 256, hi)
    X = hi * 65536 + b[:, 1].astype(np.int64) * 256 + b[:, 0].astype(np.int64)
    s = w[:, 3].copy().view(np.float32).astype(np.float64)
    return (X * s[:, None]).reshape(-1)


def inputs_of_every_kind(rng, n: int, size: int) -> np.ndarray:
    """float32 [n] (n % size == 0) in runs of ``size`` of every kind the limbs' rule meets (tests
    of the twin's kernels): normal, wide-ranging, tiny, huge, subnormal, all zero, a NaN, an inf,
    rint's ties, the largest value at a power of two."""
    kinds = [lambda: rng.standard_normal(size),
             lambda: rng.standard_normal(size) * np.exp2(rng.integers(-30, 30, size)),
             lambda: rng.standard_normal(size) * 1e-30,
             lambda: rng.standard_normal(size) * 1e30,
             lambda: np.full(size, 1e-44) * rng.integers(-3, 4, size),
             lambda: np.zeros(size),
             lambda: np.r_[np.nan, rng.standard_normal(size - 1)],
             lambda: np.r_[rng.standard_normal(size - 1), -np.inf],
             lambda: np.r_[1.0, (np.arange(size - 1) + 0.5) * 2.0 ** -21],
             lambda: np.r_[4.0, -4.0, rng.uniform(-4, 4, size - 2)]]
    return np.concatenate([kinds[i % len(kinds)]() for i in range(n // size)]).astype(np.float32)
