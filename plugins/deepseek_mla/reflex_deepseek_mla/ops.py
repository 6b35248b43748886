"""The DeepSeek MLA family's own ops (registered by :mod:`.plugin` as ``mla_<short>``): for each,
the NumPy twin ``<short>_twin`` (the reference, the CPU backend), the CUDA launcher
``<short>_cuda`` (kernels of cuda/mla.cu) and ``<short>_cases`` (random inputs of the generic op
tests). Math: spec §8.4 (the absorbed MLA form) and §8.6 (legacy ``attn_kv_b`` files).

``mla_split_heads(x, n_head, d0) -> (a, b)``
    ``x [T, H d]`` or ``[T, H, d]``; ``a [T, H, d0]`` = every head's first ``d0`` columns,
    ``b [T, H, d - d0]`` the rest (q -> q_nope | q_pe, the latent c -> c_kv | k_pe with one
    head, legacy kv -> k_nope | v).
``mla_concat_heads(a, b) -> c``
    ``a [T, Ha, da]``, ``b [T, Hb, db]`` (a ``[T, d]`` argument is one head); ``Ha`` and ``Hb``
    are equal or one of them is 1, that head then repeated for every head of the other:
    ``c [T, H, da + db]``, ``c[t, h] = [a_h ; b_h]`` with ``H = max(Ha, Hb)``.
``mla_store_rows(rows, cache, pb) -> None``
    ``rows [T, n]`` or ``[T, 1, n]`` into cells ``[pb.cell0, pb.cell0 + T)`` of the per-token
    buffer ``cache [n_cells, n]`` (or ``[n_cells, 1, n]``), in place.
``mla_attention(q, cache, pb, scale, n_v) -> o [T, H, n_v]``
    MQA over the latent rows: ``q [T, H, n]``, ``cache [n_cells, n]`` (or ``[n_cells, 1, n]``),
    one row per cell shared by every head; ``s[t, h, j] = scale * q[t, h] . cache[j]`` over the
    cells token t sees (``[0, prefix_end[t])`` and ``[own_start[t], own_end[t])``, as the core
    attention), softmax over j in float32 (max subtracted), ``o[t, h] = sum_j a[t, h, j]
    cache[j, :n_v]`` (V = the first ``n_v`` columns of the same row).
``mla_query_temperature(q, pb, scale, length) -> q' [T, H, n]``
    ``q'[t] = q[t] * tau(p_t)`` with ``p_t`` token t's position and, as llama.cpp computes it,
    ``tau(p) = ln(floor(f32(p) / f32(length)) + 1) * scale + 1`` (the quotient and its floor in
    float32, the logarithm and the rest in float64, tau rounded to float32 before the product):
    the Llama-4-style query temperature of Mistral-Large-3 files (spec §8.4).
``mla_head_ids(T, n_head) -> ids [T, n_head]`` int32, ``ids[t, h] = h``
    the per-head weights ``attn_k_b`` / ``attn_v_b`` (ne ``[., ., H]``) go through the core's
    ``moe_matmul`` with the heads as experts.

The shape checks are shared by twin and launcher and run on the host before any launch (a
one-line ValueError). NumPy is imported inside the twins and cases only: the launchers run
without it.
"""

from __future__ import annotations

PKG = "reflex_deepseek_mla"
MODULE = "mla"

# The attention kernel's limit (cuda/mla.cu #define REFLEX_MLA_MAX_ROW; tests/test_mla_ops.py
# holds the two in agreement): the cache row width n (576 for the real models), n / 32 floats
# per lane.
ATT_MAX_ROW = 1024
# Floats per lane of the attention kernels reflex_mla_attention_<f> (ceil(n / 32) rounds up to
# the next one).
ATT_LANE_FLOATS = (2, 4, 8, 12, 18, 24, 32)


# --- shared host checks ----------------------------------------------------------------------

def _n_tokens(pb) -> int:
    return pb.batch.n_tokens


def _split_dims(x_shape, n_head: int, d0: int) -> tuple[int, int, int]:
    """(T, H, d) of a split, checked."""
    op = "mla_split_heads"
    H = int(n_head)
    if H < 1:
        raise ValueError(f"{op}: {H} heads")
    if len(x_shape) == 3 and x_shape[1] == H:
        T, d = int(x_shape[0]), int(x_shape[2])
    elif len(x_shape) == 2 and x_shape[1] % H == 0:
        T, d = int(x_shape[0]), int(x_shape[1]) // H
    else:
        raise ValueError(f"{op}: x {list(x_shape)} is not [T, {H}*d] or [T, {H}, d]")
    if not 0 < d0 < d:
        raise ValueError(f"{op}: split column {d0} is not inside heads of {d}")
    return T, H, d


def _heads(shape) -> tuple[int, int, int]:
    """(T, heads, width) of a [T, H, d] tensor or a [T, d] one (one head)."""
    if len(shape) == 2:
        return int(shape[0]), 1, int(shape[1])
    return int(shape[0]), int(shape[1]), int(shape[2])


def _concat_dims(a_shape, b_shape) -> tuple[int, int, int, int, int, int]:
    """(T, H, Ha, Hb, da, db) of a concat, checked."""
    op = "mla_concat_heads"
    if len(a_shape) not in (2, 3) or len(b_shape) not in (2, 3):
        raise ValueError(f"{op}: a {list(a_shape)} and b {list(b_shape)} must be [T, H, d] "
                         f"or [T, d]")
    T, Ha, da = _heads(a_shape)
    Tb, Hb, db = _heads(b_shape)
    if T != Tb or (Ha != Hb and 1 not in (Ha, Hb)):
        raise ValueError(f"{op}: a {list(a_shape)} and b {list(b_shape)} differ in tokens or "
                         f"in heads (one of them may have one head)")
    return T, max(Ha, Hb), Ha, Hb, da, db


def _row_width(op: str, what: str, shape, lead: str) -> int:
    """n of a ``[lead, n]`` or ``[lead, 1, n]`` tensor."""
    if len(shape) == 2:
        return int(shape[1])
    if len(shape) == 3 and shape[1] == 1:
        return int(shape[2])
    raise ValueError(f"{op}: {what} {list(shape)} is not [{lead}, n] or [{lead}, 1, n]")


def _store_dims(rows_shape, cache_shape, pb) -> tuple[int, int, int]:
    """(T, n, cell0) of a store, checked: the cells fit the buffer."""
    op = "mla_store_rows"
    n = _row_width(op, "rows", rows_shape, "T")
    if _row_width(op, "cache", cache_shape, "n_cells") != n:
        raise ValueError(f"{op}: rows {list(rows_shape)} and cache {list(cache_shape)} differ "
                         f"in row width")
    T = int(rows_shape[0])
    if T != _n_tokens(pb):
        raise ValueError(f"{op}: the batch has {_n_tokens(pb)} tokens but rows {T}")
    c0 = int(pb.cell0)
    if c0 + T > cache_shape[0]:
        raise ValueError(f"{op}: cells [{c0}, {c0 + T}) run past the {cache_shape[0]} cells of "
                         f"the cache")
    return T, n, c0


def _attention_dims(q_shape, cache_shape, pb, n_v: int) -> tuple[int, int, int]:
    """(T, H, n) of an attention call, checked."""
    op = "mla_attention"
    if len(q_shape) != 3:
        raise ValueError(f"{op}: q {list(q_shape)} is not [T, H, n]")
    T, H, n = (int(v) for v in q_shape)
    if _row_width(op, "cache", cache_shape, "n_cells") != n:
        raise ValueError(f"{op}: q {list(q_shape)} and cache {list(cache_shape)} differ in row "
                         f"width")
    if not 0 < n_v <= n:
        raise ValueError(f"{op}: V width {n_v} is not in [1, {n}] (the row width)")
    if T != _n_tokens(pb):
        raise ValueError(f"{op}: the batch has {_n_tokens(pb)} tokens but q {T}")
    if pb.n_kv > cache_shape[0]:
        raise ValueError(f"{op}: attention over {pb.n_kv} cells, the cache has {cache_shape[0]}")
    return T, H, n


def _temperature_dims(q_shape, pb, length: int) -> tuple[int, int]:
    """(T, row) of a query temperature call, checked: row = the floats of one token."""
    op = "mla_query_temperature"
    if len(q_shape) not in (2, 3):
        raise ValueError(f"{op}: q {list(q_shape)} is not [T, H, n] or [T, n]")
    T = int(q_shape[0])
    if T != _n_tokens(pb):
        raise ValueError(f"{op}: the batch has {_n_tokens(pb)} tokens but q {T}")
    if int(length) < 1:
        raise ValueError(f"{op}: temperature length {length} must be >= 1")
    row = 1
    for v in q_shape[1:]:
        row *= int(v)
    return T, row


def _head_ids_dims(T: int, n_head: int) -> tuple[int, int]:
    if T < 0 or n_head < 1:
        raise ValueError(f"mla_head_ids: {T} tokens of {n_head} heads")
    return int(T), int(n_head)


# --- NumPy twins -----------------------------------------------------------------------------

def split_heads_twin(ops, x, n_head, d0):
    import numpy as np

    x = np.asarray(x, np.float32)
    T, H, d = _split_dims(x.shape, n_head, d0)
    xh = x.reshape(T, H, d)
    return np.ascontiguousarray(xh[:, :, :d0]), np.ascontiguousarray(xh[:, :, d0:])


def concat_heads_twin(ops, a, b):
    import numpy as np

    T, H, Ha, Hb, da, db = _concat_dims(np.shape(a), np.shape(b))
    a = np.broadcast_to(np.asarray(a, np.float32).reshape(T, Ha, da), (T, H, da))
    b = np.broadcast_to(np.asarray(b, np.float32).reshape(T, Hb, db), (T, H, db))
    return np.concatenate([a, b], axis=2)


def store_rows_twin(ops, rows, cache, pb):
    import numpy as np

    if not isinstance(cache, np.ndarray) or cache.dtype != np.float32:
        raise ValueError("mla_store_rows: the cache must be a float32 ndarray (written in place)")
    T, n, c0 = _store_dims(np.shape(rows), cache.shape, pb)
    cache.reshape(cache.shape[0], n)[c0:c0 + T] = np.asarray(rows, np.float32).reshape(T, n)


def attention_twin(ops, q, cache, pb, scale, n_v):
    import numpy as np

    q = np.asarray(q, np.float32)
    T, H, n = _attention_dims(q.shape, cache.shape, pb, n_v)
    rows = np.asarray(cache, np.float32).reshape(cache.shape[0], n)[:pb.n_kv]
    s = np.matmul(q, rows.T) * np.float32(scale)  # [T, H, n_kv]
    s = np.where(pb.mask[:, None, :], s, np.float32(-np.inf))
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # the mask is never empty: max is finite
    a = e / e.sum(axis=-1, keepdims=True)
    return np.ascontiguousarray(np.matmul(a, rows[:, :n_v]), dtype=np.float32)


def temperature_factors(positions, scale, length):
    """tau(p) of every position, float32, rounded where llama.cpp rounds it."""
    import numpy as np

    p = np.asarray(positions).astype(np.float32)
    f = np.floor(p / np.float32(length))  # float32 quotient and floor
    return (np.log(f.astype(np.float64) + 1.0) * float(np.float32(scale)) + 1.0).astype(np.float32)


def query_temperature_twin(ops, q, pb, scale, length):
    import numpy as np

    q = np.asarray(q, np.float32)
    T, _ = _temperature_dims(q.shape, pb, length)
    tau = temperature_factors(pb.positions, scale, length)
    return np.ascontiguousarray(q * tau.reshape((T,) + (1,) * (q.ndim - 1)))


def head_ids_twin(ops, T, n_head):
    import numpy as np

    T, H = _head_ids_dims(T, n_head)
    return np.ascontiguousarray(np.broadcast_to(np.arange(H, dtype=np.int32), (T, H)))


# --- CUDA launchers --------------------------------------------------------------------------

def _launch(ops, kernel: str, grid, block, args) -> None:
    ops.kernels(PKG, MODULE).launch(kernel, grid, block, args)


def split_heads_cuda(ops, x, n_head, d0):
    T, H, d = _split_dims(x.shape, n_head, d0)
    a = ops.empty((T, H, d0))
    b = ops.empty((T, H, d - d0))
    if T:
        _launch(ops, "reflex_mla_split_heads", T * H, 128, (x.ptr, a.ptr, b.ptr, d, d0))
    return a, b


def concat_heads_cuda(ops, a, b):
    T, H, Ha, Hb, da, db = _concat_dims(a.shape, b.shape)
    c = ops.empty((T, H, da + db))
    if T:
        _launch(ops, "reflex_mla_concat_heads", T * H, 128,
                (a.ptr, b.ptr, c.ptr, H, int(Ha > 1), int(Hb > 1), da, db))
    return c


def store_rows_cuda(ops, rows, cache, pb):
    T, n, _ = _store_dims(rows.shape, cache.shape, pb)
    total = T * n
    if total:
        _launch(ops, "reflex_mla_store_rows", min(4096, (total + 255) // 256), 256,
                (rows.ptr, cache.ptr, pb.cell0_dev, n, total))


def _lane_floats(n: int) -> int:
    need = (n + 31) // 32
    return next(f for f in ATT_LANE_FLOATS if f >= need)


def attention_cuda(ops, q, cache, pb, scale, n_v):
    T, H, n = _attention_dims(q.shape, cache.shape, pb, n_v)
    if n > ATT_MAX_ROW:
        raise ValueError(f"mla_attention: row width {n} > {ATT_MAX_ROW} (the kernel's limit)")
    o = ops.empty((T, H, n_v))
    if T:
        _launch(ops, f"reflex_mla_attention_{_lane_floats(n)}", (H, T), 256,
                (q.ptr, cache.ptr, o.ptr, pb.prefix_end, pb.own_start, pb.own_end, H, n,
                 int(n_v), float(scale)))
    return o


def query_temperature_cuda(ops, q, pb, scale, length):
    T, row = _temperature_dims(q.shape, pb, length)
    out = ops.empty(tuple(q.shape))
    total = T * row
    if total:
        # positions are read on the device (the prepared batch): a captured decode step replays
        _launch(ops, "reflex_mla_query_temperature", min(4096, (total + 255) // 256), 256,
                (q.ptr, out.ptr, pb.positions, row, total, float(scale), int(length)))
    return out


def head_ids_cuda(ops, T, n_head):
    T, H = _head_ids_dims(T, n_head)
    ids = ops.empty((T, H), "i32")
    if T:
        _launch(ops, "reflex_mla_head_ids", (T * H + 255) // 256, 256, (ids.ptr, T * H, H))
    return ids


# --- random cases and independent references (tests only) -----------------------------------

def _f(rng, *shape, scale=1.0):
    import numpy as np

    return (rng.standard_normal(shape) * scale).astype(np.float32)


class _NoBuffers:
    """The ops of a State that only plans batches: its one per-token buffer is never used."""

    @staticmethod
    def zeros(shape):
        return None


def case_batch(history, prefix, branches=None, n_cells=None):
    """A batch planned by a :class:`State` of attention-only state: ``history`` tokens of
    sequence 0 are already in the cells (so the batch starts at cell ``history``), then
    ``prefix`` tokens of sequence 0 and, when ``branches`` (lengths) are given, each branch as a
    continuation of the prefix in its own sequence (system1's tree batch)."""
    from reflex_core.plugin_api import BufferSpec, State, StateSpec

    branches = branches or ()
    total = history + prefix + sum(branches)
    st = State(StateSpec([BufferSpec("rows", (1,), True)]), _NoBuffers(),
               n_cells or total, len(branches) + 1)
    if history:
        st.append(list(range(history)))
    if not branches:
        return st.append(list(range(prefix)))
    return st.append_tree(list(range(prefix)),
                          {i + 1: list(range(n)) for i, n in enumerate(branches)})


def attention_reference(q, cache, mask, scale, n_v):
    """mla_attention in float64 by explicit loops over each token's visible cells
    (``mask``: the batch's AttnMask)."""
    import numpy as np

    q = np.asarray(q, np.float64)
    T, H, n = q.shape
    rows = np.asarray(cache, np.float64).reshape(-1, n)
    o = np.zeros((T, H, n_v))
    for t in range(T):
        K = rows[mask.visible(t)]
        for h in range(H):
            s = scale * (K @ q[t, h])
            a = np.exp(s - s.max())
            o[t, h] = (a / a.sum()) @ K[:, :n_v]
    return o


def split_heads_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    out = []
    # (T, H, d, d0, x as [T, H d]): q of V2-Lite-like heads, the latent c of one head, legacy kv
    for T, H, d, d0, flat in ((1, 16, 192, 128, True), (67, 1, 576, 512, True),
                              (7, 3, 72, 40, False), (67, 5, 33, 1, False)):
        x = _f(rng, T, H * d) if flat else _f(rng, T, H, d)
        xh = x.reshape(T, H, d)
        want = (np.stack([xh[:, h, :d0] for h in range(H)], 1),
                np.stack([xh[:, h, d0:] for h in range(H)], 1))
        out.append(OpCase(f"T={T} H={H} d={d} d0={d0}" + (" flat" if flat else ""), (x, H, d0),
                          rtol=0, atol=0, expect=want))
    return out


def concat_heads_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    out = []
    # (T, Ha, Hb, da, db): Q = [q_abs ; q_pe], the latent row (one head each), legacy K' with the
    # shared rope key first or last, a [T, d] argument as one head
    for T, Ha, Hb, da, db in ((1, 16, 16, 512, 64), (67, 3, 3, 40, 24), (7, 1, 1, 512, 64),
                              (7, 1, 5, 24, 40), (67, 5, 1, 40, 24), (1, 3, 0, 31, 9)):
        a = _f(rng, T, Ha, da)
        b = _f(rng, T, db) if Hb == 0 else _f(rng, T, Hb, db)
        H = max(Ha, Hb, 1)
        want = np.zeros((T, H, da + db), np.float32)
        for t in range(T):
            for h in range(H):
                want[t, h, :da] = a[t, h if Ha > 1 else 0]
                want[t, h, da:] = b[t] if Hb == 0 else b[t, h if Hb > 1 else 0]
        out.append(OpCase(f"T={T} Ha={Ha} Hb={Hb or '2-D'} da={da} db={db}", (a, b),
                          rtol=0, atol=0, expect=want))
    return out


def store_rows_cases(rng):
    from reflex_core.plugin_api import BatchArg, OpCase

    out = []
    # (history cells, T, n, spare cells, rows/cache with a head axis): the cells fill the buffer
    # exactly in one case
    for hist, T, n, spare, headed in ((66, 1, 576, 3, False), (0, 67, 576, 0, True),
                                      (5, 7, 72, 4, False)):
        cache = _f(rng, hist + T + spare, 1, n) if headed else _f(rng, hist + T + spare, n)
        rows = _f(rng, T, 1, n) if headed else _f(rng, T, n)
        out.append(OpCase(f"T={T} n={n} cell0={hist}" + (" [.,1,n]" if headed else ""),
                          (rows, cache, BatchArg(case_batch(hist, T))), compare=(1,),
                          result=False, rtol=0, atol=0))
    return out


ATT_RTOL, ATT_ATOL = 2e-5, 2e-5


def attention_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import BatchArg, OpCase

    out = []
    # (label, batch, H, n, n_v): decode and prefill at the real head sizes, odd sizes, the
    # system1 tree after earlier tokens, the kernel's limit with V the whole row
    shapes = [("decode", case_batch(66, 1), 16, 576, 512),
              ("prefill", case_batch(0, 67), 3, 576, 512),
              ("chunk", case_batch(5, 7), 3, 72, 64),
              ("tree", case_batch(3, 4, (3, 2, 1)), 16, 72, 64),
              ("tree long", case_batch(9, 60, (5, 2)), 3, 576, 512),
              ("limit", case_batch(2, 7), 3, ATT_MAX_ROW, ATT_MAX_ROW),
              ("narrow", case_batch(1, 7), 5, 40, 1)]
    for label, batch, H, n, n_v in shapes:
        T, n_kv = batch.n_tokens, batch.n_kv
        scale = 1.5 / np.sqrt(n)
        cache = _f(rng, n_kv + 3, n)
        cache[n_kv:] = np.nan  # cells past the batch: a kernel reading them fails the case
        q = _f(rng, T, H, n)
        want = attention_reference(q, cache, batch.mask, scale, n_v)
        out.append(OpCase(f"{label} T={T} n_kv={n_kv} H={H} n={n} n_v={n_v}",
                          (q, cache, BatchArg(batch), scale, n_v), rtol=ATT_RTOL,
                          atol=ATT_ATOL, expect=want.astype(np.float32)))
    return out


def query_temperature_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import BatchArg, OpCase

    out = []
    # (label, batch, head shape, scale, length): decode far into the sequence, a prefill that
    # crosses several floors, length 1 (every position its own floor), the system1 tree (its
    # branches restart at the same positions), a [T, n] query, a negative scale
    for label, batch, heads, scale, length in (
            ("decode", case_batch(8190, 1), (16, 576), 0.1, 8192),
            ("prefill", case_batch(0, 67), (3, 72), 0.4, 5),
            ("length 1", case_batch(3, 7), (5, 40), 0.25, 1),
            ("tree", case_batch(3, 4, (3, 2, 1)), (3, 72), 0.7, 2),
            ("flat", case_batch(9, 13), (33,), 1.5, 4),
            ("negative", case_batch(0, 9), (2, 24), -0.3, 3)):
        T = batch.n_tokens
        q = _f(rng, T, *heads)
        pos = np.asarray(batch.positions, np.float64)
        tau = np.log(np.floor(pos / length) + 1.0) * scale + 1.0  # float64 throughout
        want = q.astype(np.float64) * tau.reshape((T,) + (1,) * len(heads))
        out.append(OpCase(f"{label} T={T} q={[T, *heads]} scale={scale} length={length}",
                          (q, BatchArg(batch), scale, length), rtol=1e-6, atol=0,
                          expect=want.astype(np.float32)))
    return out


def head_ids_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    return [OpCase(f"T={T} H={H}", (T, H), rtol=0, atol=0,
                   expect=np.array([[h for h in range(H)] for _ in range(T)], np.int32))
            for T, H in ((1, 16), (67, 3), (7, 128))]
