"""Token sampling: the one definition both backends follow.

This module is importable without NumPy (the CUDA path imports it for :class:`SamplingParams`);
the reference implementation imports NumPy inside the function.

The algorithm (``logits`` is one float32 row of length V; ``u`` is a host-drawn uniform in
[0, 1); ``window`` is the distinct token ids among the last ``repeat_last_n`` tokens of the
context -- an imported state's, the prompt's and those generated so far --, see
:meth:`SamplingParams.penalised_ids`)::

    1. repeat_penalty != 1, in float32, on the raw logits, once per id in window:
       l_i = l_i / repeat_penalty if l_i > 0 else l_i * repeat_penalty
       Everything below reads these l (greedy decoding too).
    2. temperature <= 0:  return argmax(l)  (the lowest index among equal maxima); so does a
       temperature of at most 2^-150, 0 as a float32 (llama.cpp's type for it).
    3. z_i = float64(l_i) / float64(temperature)               (float64 throughout from here)
       p_i = exp(z_i - max_j z_j)                              (unnormalised; the max has p = 1)
       kept = all i
    4. top_k > 0 (k = min(top_k, V)):
       zk   = the k-th largest z (counting equal values separately)
       kept = { i : z_i >= zk }                                 (ties with the k-th are all kept)
    5. 0 < top_p < 1 is applied to the survivors of 4, on the probabilities at temperature 1
       (q_i = exp(float64(l_i) - max_j float64(l_j))); top_p >= 1 disables it, top_p <= 0
       behaves like a tiny top_p (keeps only the maximal q):
       S    = Σ_{i in kept} q_i
       order the kept q descending (ties by ascending index); c_m = q_(0) + ... + q_(m)
       m*   = the first m with c_m >= top_p * S    (m* = last if none, from rounding)
       t    = q_(m*)
       kept = { i in kept : q_i >= t }                          (ties with t are all kept)
    6. 0 < min_p (<= 1; 0 disables it), on the logits at temperature 1:
       kept = { i in kept : float64(l_i) - float64(max_j l_j) >= ln(min_p) }
       i.e. p1_i >= min_p * p1_max with p1 = softmax(l); ties with the bound are kept, and the
       maximum always is (min_p = 1 keeps exactly the maximal logits).
    7. draw: S' = Σ_{i in kept} p_i, summed in ascending index order; target = u * S'.
       Walk the kept indices in ASCENDING INDEX ORDER accumulating c += p_i; return the first i
       with c > target. If none qualifies (only possible through rounding), return the last kept
       index.

Against llama.cpp's default sampler chain (penalties, top-k, top-p, min-p, then temperature
and the draw):

* The repeat penalty is its ``penalties`` sampler with frequency and presence penalties 0: first,
  on the raw logits, each distinct id once, ``logit <= 0`` multiplied (l = 0 stays 0 either way).
  Its window holds the prompt's tokens too (its completion tool accepts them into the sampler);
  ``repeat_last_n`` -1 is the whole context, as -1 (the context size) was in llama.cpp before it
  began to refuse negative values.
* top-p and min-p are its ``top_p`` and ``min_p``: llama.cpp filters on the logits before its
  temperature sampler (the last of its chain), so steps 5 and 6 work on the temperature-1
  probabilities, not on p (top-k is the same set either way: dividing by T > 0 keeps the order);
  the draw then uses the temperature-T p of what is kept, as llama.cpp's ``dist`` does after
  ``temp``. In terms of p the min-p test is p_i >= min_p^(1/T) * p_max. The maximum survives
  every filter, so min-p's bound is the same whatever ran before; it runs after top-p, as in
  llama.cpp (top-p renormalises over its input, so the two do not commute). llama.cpp compares
  in float32 (``l >= l_max + logf(min_p)``, its top-p's sums too), which can differ from steps
  5-6 within float32 rounding of a bound; and where equal values straddle a cut, llama.cpp's
  top-k and top-p keep exactly k / the first m* of them, this module all of them.

Notes for other implementations (the CUDA kernel):

* Because float32 values are ~2^-24 apart relatively and float64 division is exact to 2^-53,
  dividing by a positive temperature in float64 creates no new ties: the top-k set computed on
  the raw float32 logits is identical to the one computed on z.
* t in step 5 is always a kept q value; "q_i >= t" compares the very same float64 numbers, so
  the survivor set depends only on where the cumulative sum crosses ``top_p * S``. A kernel that
  sums in another order can differ only when that crossing lies within float64 rounding of a
  boundary (and likewise for the draw in step 7) -- about 1e-16 relative.
* Step 7 walks in index order, not probability order, so a kernel needs no sort for the draw:
  survivors are a threshold test on z (top-k), on q (top-p) and on l (min-p), then one prefix
  scan. ``ln(min_p)`` is computed once on the host (Python's ``math.log``) and handed to the
  kernel, so both sides compare the same float64 numbers.
* Step 1 is IEEE float32 division and multiplication, so a kernel (without fast math)
  reproduces it bit for bit; each distinct id is penalised once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


# A temperature of 2^-150 or less is 0 as a float32, the type llama.cpp keeps it in, so greedy
# decoding there; here step 3's float64 division would send finite logits to inf (NaN draws).
GREEDY_TEMPERATURE = 2.0 ** -150
# Step 1 writes float32 logits: a penalty far from 1 sends them to +-inf or 0 (a NaN draw), so
# the callers (CLI, API, IPC) refuse one outside this range.
REPEAT_PENALTY_RANGE = (1e-6, 1e6)


@dataclass(frozen=True)
class SamplingParams:
    """What a generate job asks for. ``temperature <= 0`` is greedy decoding (and so is one of
    at most GREEDY_TEMPERATURE); ``seed`` None or negative draws a random seed (reported with
    the result). ``min_p`` 0 and ``repeat_penalty`` 1 are off; ``repeat_last_n`` is how many of
    the most recent tokens the penalty looks at (0 none, -1 the whole context)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __post_init__(self) -> None:
        if 0.0 < self.temperature <= GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalty_on(self) -> bool:
        """Whether step 1 penalises anything (it then reads the tokens generated so far)."""
        return self.repeat_penalty != 1.0 and self.repeat_last_n != 0

    def penalised_ids(self, *context: Sequence[int]) -> list[int]:
        """The ids step 1 penalises, ascending and distinct: those among the last
        ``repeat_last_n`` tokens of ``context`` (its parts oldest first, e.g. an imported
        state's tokens, the prompt, the tokens generated so far); none when the penalty is off,
        so a caller launches nothing then."""
        left = self.repeat_last_n
        if not self.penalty_on:
            return []
        ids: set[int] = set()
        for part in reversed(context):  # newest part first: only the tail is read
            if left < 0:
                ids.update(part)
                continue
            tail = part[max(0, len(part) - left):]
            ids.update(tail)
            left -= len(tail)
            if left == 0:
                break
        return sorted(ids)


def min_p_log(min_p: float) -> float:
    """The bound of step 6, ``ln(min_p)``; -inf (keep everything) when min-p is off."""
    return math.log(min_p) if min_p > 0.0 else -math.inf


def repeat_penalty_reference(logits: Any, token_ids: Sequence[int], penalty: float) -> Any:
    """Step 1 on one row: a new float32 row with each distinct id of ``token_ids`` penalised."""
    import numpy as np

    out = np.array(logits, dtype=np.float32).reshape(-1)
    ids = np.unique(np.asarray(list(token_ids), dtype=np.int64))
    if ids.size and (ids[0] < 0 or ids[-1] >= out.size):
        raise ValueError(f"repeat_penalty: token id outside [0, {out.size})")
    v = out[ids]
    pen = np.float32(penalty)
    out[ids] = np.where(v > 0, v / pen, v * pen)
    return out


def kept_mask(logits: Any, temperature: float, top_k: int, top_p: float,
              min_p: float = 0.0) -> tuple[Any, Any]:
    """Steps 3-6: (p float64 [V], kept bool [V]) for ``temperature > 0``."""
    import numpy as np

    l32 = np.asarray(logits, dtype=np.float32)
    z = l32.astype(np.float64) / float(temperature)
    p = np.exp(z - z.max())
    kept = np.ones(z.shape, dtype=bool)
    V = z.shape[0]
    if top_k > 0 and top_k < V:
        zk = np.partition(z, V - top_k)[V - top_k]  # the k-th largest
        kept &= z >= zk
    if top_p < 1.0:  # on the temperature-1 probabilities (llama.cpp's chain order)
        q = p if temperature == 1.0 else np.exp(l32.astype(np.float64) - np.float64(l32.max()))
        idx = np.flatnonzero(kept)
        pk = q[idx]
        S = float(np.sum(pk))
        # descending p, ties by ascending index (stable sort of -p over ascending indices)
        order = np.argsort(-pk, kind="stable")
        c = np.cumsum(pk[order])
        hit = np.flatnonzero(c >= top_p * S)
        m = int(hit[0]) if hit.size else len(order) - 1
        t = pk[order[m]]
        kept &= q >= t
    if min_p > 0.0:
        l64 = l32.astype(np.float64)
        kept &= l64 - np.float64(l32.max()) >= min_p_log(min_p)
    return p, kept


def sample_reference(logits: Any, temperature: float, top_k: int, top_p: float,
                     u: float, min_p: float = 0.0) -> int:
    """Steps 2-7: draw one token id from one row of (already penalised) logits (see the module
    docstring)."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    if temperature <= 0.0:
        return int(np.argmax(logits))
    p, kept = kept_mask(logits, temperature, top_k, top_p, min_p)
    idx = np.flatnonzero(kept)
    pk = p[idx]
    c = np.cumsum(pk)  # ascending index order
    target = float(u) * float(c[-1])
    hit = np.flatnonzero(c > target)
    return int(idx[hit[0]]) if hit.size else int(idx[-1])


def sample_probs(logits: Any, temperature: float, top_k: int, top_p: float,
                 min_p: float = 0.0) -> Any:
    """The distribution :func:`sample_reference` draws from (normalised float64 [V]); tests."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    out = np.zeros(logits.shape, dtype=np.float64)
    if temperature <= 0.0:
        out[int(np.argmax(logits))] = 1.0
        return out
    p, kept = kept_mask(logits, temperature, top_k, top_p, min_p)
    out[kept] = p[kept]
    return out / out.sum()
