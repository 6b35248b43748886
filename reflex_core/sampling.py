"""Token sampling: the one definition both backends follow.

This module is importable without NumPy (the CUDA path imports it for :class:`SamplingParams`);
the reference implementation imports NumPy inside the function.

The algorithm (``logits`` is one float32 row of length V; ``u`` is a host-drawn uniform in
[0, 1))::

    1. temperature <= 0:  return argmax(logits)  (the lowest index among equal maxima).
    2. z_i = float64(logits_i) / float64(temperature)          (float64 throughout from here)
       p_i = exp(z_i - max_j z_j)                              (unnormalised; the max has p = 1)
       kept = all i
    3. top_k > 0 (k = min(top_k, V)):
       zk   = the k-th largest z (counting equal values separately)
       kept = { i : z_i >= zk }                                 (ties with the k-th are all kept)
    4. 0 < top_p < 1 is applied to the survivors of 3; top_p >= 1 disables it, top_p <= 0
       behaves like a tiny top_p (keeps only the maximal p):
       S    = Σ_{i in kept} p_i
       order the kept p descending (ties by ascending index); c_m = p_(0) + ... + p_(m)
       m*   = the first m with c_m >= top_p * S    (m* = last if none, from rounding)
       t    = p_(m*)
       kept = { i in kept : p_i >= t }                          (ties with t are all kept)
    5. draw: S' = Σ_{i in kept} p_i, summed in ascending index order; target = u * S'.
       Walk the kept indices in ASCENDING INDEX ORDER accumulating c += p_i; return the first i
       with c > target. If none qualifies (only possible through rounding), return the last kept
       index.

Notes for other implementations (the CUDA kernel):

* Because float32 values are ~2^-24 apart relatively and float64 division is exact to 2^-53,
  dividing by a positive temperature in float64 creates no new ties: the top-k set computed on
  the raw float32 logits is identical to the one computed on z.
* t in step 4 is always a kept p value; "p_i >= t" compares the very same float64 numbers, so
  the survivor set depends only on where the cumulative sum crosses ``top_p * S``. A kernel that
  sums in another order can differ only when that crossing lies within float64 rounding of a
  boundary (and likewise for the draw in step 5) -- about 1e-16 relative.
* Step 5 walks in index order, not probability order, so a kernel needs no sort for the draw:
  survivors are a threshold test on z (top-k) and on p (top-p), then one prefix scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """What a generate job asks for. ``temperature <= 0`` is greedy decoding; ``seed`` None
    draws a random seed (reported with the result)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def kept_mask(logits: Any, temperature: float, top_k: int, top_p: float) -> tuple[Any, Any]:
    """Steps 2-4: (p float64 [V], kept bool [V]) for ``temperature > 0``."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float32).astype(np.float64) / float(temperature)
    p = np.exp(z - z.max())
    kept = np.ones(z.shape, dtype=bool)
    V = z.shape[0]
    if top_k > 0 and top_k < V:
        zk = np.partition(z, V - top_k)[V - top_k]  # the k-th largest
        kept &= z >= zk
    if top_p < 1.0:
        idx = np.flatnonzero(kept)
        pk = p[idx]
        S = float(np.sum(pk))
        # descending p, ties by ascending index (stable sort of -p over ascending indices)
        order = np.argsort(-pk, kind="stable")
        c = np.cumsum(pk[order])
        hit = np.flatnonzero(c >= top_p * S)
        m = int(hit[0]) if hit.size else len(order) - 1
        t = pk[order[m]]
        kept &= p >= t
    return p, kept


def sample_reference(logits: Any, temperature: float, top_k: int, top_p: float,
                     u: float) -> int:
    """Draw one token id from one row of logits (see the module docstring)."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    if temperature <= 0.0:
        return int(np.argmax(logits))
    p, kept = kept_mask(logits, temperature, top_k, top_p)
    idx = np.flatnonzero(kept)
    pk = p[idx]
    c = np.cumsum(pk)  # ascending index order
    target = float(u) * float(c[-1])
    hit = np.flatnonzero(c > target)
    return int(idx[hit[0]]) if hit.size else int(idx[-1])


def sample_probs(logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The distribution :func:`sample_reference` draws from (normalised float64 [V]); tests."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    out = np.zeros(logits.shape, dtype=np.float64)
    if temperature <= 0.0:
        out[int(np.argmax(logits))] = 1.0
        return out
    p, kept = kept_mask(logits, temperature, top_k, top_p)
    out[kept] = p[kept]
    return out / out.sum()
