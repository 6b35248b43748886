"""The Qwen3.5 family's own ops (registered by :mod:`.plugin` as ``qwen35_<short>``): for each,
the NumPy twin ``<short>_twin`` (the reference, the CPU backend), the CUDA launcher
``<short>_cuda`` (kernels of cuda/qwen35.cu) and ``<short>_cases`` (random inputs of the generic
op tests). Math: spec §7.5-7.7; numerics follow llama.cpp's CPU ops (ggml ssm_conv, softplus,
gated_delta_net).

``qwen35_conv(x, state, w, pb) -> y``
    ``x [T, C]`` (in-projection rows), ``state [n_seqs, C, K-1]`` (llama.cpp's conv-state
    layout: tap fastest, oldest first), ``w`` = ``ssm_conv1d.weight`` ne ``[K, C]`` (``w[c, K-1]``
    multiplies the current token). Per run ``(s, t0, t1)`` of the batch: window =
    ``[state[s].T ; x[t0:t1]]``, ``y[t0+i, c] = silu(sum_tau w[c, tau] window[i+tau, c])``, then
    ``state[s]`` = the window's last K-1 rows (in place).
``qwen35_delta_rule(y, b, a, ssm_a, dt_bias, state, pb, n_k_heads, eps) -> o``
    ``y [T, 2 H_k d + H_v d]`` (conv output q | k | v), ``b, a [T, H_v]`` (raw beta / alpha),
    ``ssm_a`` (= -exp(A_log)) and ``dt_bias`` ne ``[H_v]``, ``state [n_seqs, H_v, d, d]`` with
    ``state[s, j, col, i] = S_j[i (key), col (value)]``. q and k L2-normalised per key head
    (``x / sqrt(sum x^2 + eps)``), q scaled by ``1/sqrt(d)``, ``beta = sigmoid(b)``,
    ``g = ssm_a * softplus(a + dt_bias)``; value head j uses key head ``j % H_k``:
    ``S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q``, token by token
    from ``state[s]``, which is updated in place. Returns ``o [T, H_v d]`` head-major.
``qwen35_gated_norm(o, z, w, eps) -> out``
    per head j of ``o, z [T, H d]`` (``d = w.ne[0]``): ``o_j / sqrt(mean(o_j^2) + eps) * w *
    silu(z_j)`` (the weight is used as stored, not +1).
``qwen35_take_q(qg, n_head) -> q [T, H, d_h]``
    ``qg [T, 2 H d_h]`` holds per head ``[q_h, gate_h]``; the q halves.
``qwen35_gate_output(o, qg, n_head) -> o * sigmoid(gate)``
    ``o [T, H d_h]``, ``gate_h = qg[t, h 2d_h + d_h : (h+1) 2d_h]``.
``qwen35_shexp_combine(moe, sh, b, w) -> moe + sigmoid(b[t] . w) * sh[t]``
    ``moe, sh, b [T, D]``, ``w`` = ``ffn_gate_inp_shexp.weight`` ne ``[D]`` or ``[D, 1]``.

A sequence in two runs of one batch is a ValueError for the ops on per-sequence state (its slot
would be read and written twice). The shape checks are shared by twin and launcher and run on
the host before any launch. NumPy is imported inside the twins and cases only: the launchers
run without it.
"""

from __future__ import annotations

PKG = "reflex_qwen35_hybrid"
MODULE = "qwen35"

# The kernels' limits (cuda/qwen35.cu #define REFLEX_QWEN35_*; tests/test_qwen35_ops.py holds
# the two in agreement): conv width K, and d = d_k = d_v of the delta rule.
CONV_MAX_K = 8
CONV_CHUNK = 64  # tokens per conv thread
DELTA_MAX_D = 256
DELTA_CHUNK = 64  # tokens per chunk of the chunked delta rule
DELTA_COLS = 16  # state columns per block of the chunked walk
# A batch whose longest run has this many tokens takes the chunked delta rule (two kernels and a
# scratch buffer); shorter ones the sequential kernel, which needs neither.
DELTA_CHUNKED_MIN_RUN = 128


# --- shared host checks ----------------------------------------------------------------------

def _prod(ne) -> int:
    n = 1
    for v in ne:
        n *= int(v)
    return n


class _RunCache:
    """The last batch's checked runs: every recurrent layer of a forward pass checks the same
    batch, and ``Batch.runs`` walks all T sequence ids."""

    batch = None
    runs: tuple = ()
    seqs = (0, -1)  # (min, max) sequence id
    max_len = 0


def _runs(op: str, pb, T: int, n_seqs: int) -> tuple[tuple, int]:
    """(the batch's sequence runs, the longest run's length), checked: the batch has T tokens,
    no sequence is in two runs, every sequence has a slot among ``n_seqs``."""
    batch = pb.batch
    if batch.n_tokens != T:
        raise ValueError(f"{op}: the batch has {batch.n_tokens} tokens but the input {T} rows")
    c = _RunCache
    if c.batch is not batch:
        runs = batch.runs
        seen: set = set()
        for s, _, _ in runs:
            if s in seen:
                raise ValueError(f"{op}: sequence {s} appears in two runs of one batch (its "
                                 f"state slot would be read and written twice)")
            seen.add(s)
        c.batch, c.runs = batch, runs
        c.seqs = (min(seen, default=0), max(seen, default=-1))
        c.max_len = max((t1 - t0 for _, t0, t1 in runs), default=0)
    if c.seqs[0] < 0 or c.seqs[1] >= n_seqs:
        bad = c.seqs[0] if c.seqs[0] < 0 else c.seqs[1]
        raise ValueError(f"{op}: sequence {bad} has no slot in a state of {n_seqs} sequences")
    return c.runs, c.max_len


def _conv_dims(x_shape, state_shape, w_ne) -> tuple[int, int, int]:
    """(T, C, K) of a conv call, checked."""
    if len(x_shape) != 2:
        raise ValueError(f"qwen35_conv: x must be [T, C], got {list(x_shape)}")
    T, C = x_shape
    if len(w_ne) != 2 or w_ne[1] != C:
        raise ValueError(f"qwen35_conv: conv weight ne {list(w_ne)} is not [K, {C}]")
    K = int(w_ne[0])
    if K < 2:
        raise ValueError(f"qwen35_conv: conv width {K} < 2")
    if len(state_shape) != 3 or tuple(state_shape[1:]) != (C, K - 1):
        raise ValueError(f"qwen35_conv: state {list(state_shape)} is not [n_seqs, {C}, {K - 1}]")
    return T, C, K


def _delta_dims(y_shape, b_shape, a_shape, n_ssm_a: int, n_dt: int, state_shape,
                n_k_heads: int) -> tuple[int, int, int]:
    """(T, H_v, d) of a delta-rule call, checked."""
    op = "qwen35_delta_rule"
    if len(state_shape) != 4 or state_shape[2] != state_shape[3]:
        raise ValueError(f"{op}: state {list(state_shape)} is not [n_seqs, H_v, d, d] "
                         f"(d_k = d_v)")
    H_v, d = int(state_shape[1]), int(state_shape[3])
    H_k = int(n_k_heads)
    if H_k < 1 or H_v % H_k:
        raise ValueError(f"{op}: {H_v} value heads do not tile {H_k} key heads")
    width = 2 * H_k * d + H_v * d
    if len(y_shape) != 2 or y_shape[1] != width:
        raise ValueError(f"{op}: y {list(y_shape)} is not [T, {width}] (2*{H_k}*{d} + {H_v}*{d})")
    T = int(y_shape[0])
    for name, shape in (("b", b_shape), ("a", a_shape)):
        if tuple(shape) != (T, H_v):
            raise ValueError(f"{op}: {name} {list(shape)} is not [{T}, {H_v}]")
    for name, n in (("ssm_a", n_ssm_a), ("dt_bias", n_dt)):
        if n != H_v:
            raise ValueError(f"{op}: {name} has {n} elements, not H_v = {H_v}")
    return T, H_v, d


def _gated_norm_dims(o_shape, z_shape, w_ne) -> tuple[int, int]:
    """(rows of one head, d) of a gated norm call, checked."""
    if len(o_shape) != 2 or tuple(o_shape) != tuple(z_shape):
        raise ValueError(f"qwen35_gated_norm: o {list(o_shape)} and z {list(z_shape)} must be "
                         f"one [T, H*d] shape")
    d = int(w_ne[0]) if len(w_ne) == 1 else 0
    if d < 1 or o_shape[1] % d:
        raise ValueError(f"qwen35_gated_norm: norm weight ne {list(w_ne)} does not split rows "
                         f"of {o_shape[1]} into heads")
    return o_shape[0] * (o_shape[1] // d), d


def _qg_dims(op: str, qg_shape, n_head: int) -> tuple[int, int, int]:
    """(T, H, d_h) of a ``[T, 2 H d_h]`` query+gate projection, checked."""
    H = int(n_head)
    if len(qg_shape) != 2 or H < 1 or qg_shape[1] % (2 * H):
        raise ValueError(f"{op}: qg {list(qg_shape)} is not [T, 2*{H}*d_h]")
    return qg_shape[0], H, qg_shape[1] // (2 * H)


def _gate_output_dims(o_shape, qg_shape, n_head: int) -> tuple[int, int, int]:
    T, H, d_h = _qg_dims("qwen35_gate_output", qg_shape, n_head)
    if tuple(o_shape) != (T, H * d_h):
        raise ValueError(f"qwen35_gate_output: o {list(o_shape)} is not [{T}, {H * d_h}] "
                         f"(qg {list(qg_shape)}, {H} heads)")
    return T, H, d_h


def _shexp_dims(moe_shape, sh_shape, b_shape, w_ne) -> tuple[int, int]:
    shapes = {tuple(moe_shape), tuple(sh_shape), tuple(b_shape)}
    if len(moe_shape) != 2 or len(shapes) != 1:
        raise ValueError(f"qwen35_shexp_combine: moe {list(moe_shape)}, sh {list(sh_shape)} "
                         f"and b {list(b_shape)} must be one [T, D] shape")
    D = int(moe_shape[1])
    if tuple(w_ne) not in ((D,), (D, 1)):
        raise ValueError(f"qwen35_shexp_combine: gate weight ne {list(w_ne)} is not [{D}] or "
                         f"[{D}, 1]")
    return int(moe_shape[0]), D


# --- NumPy twins -----------------------------------------------------------------------------

def _state_array(op: str, state):
    import numpy as np

    if not isinstance(state, np.ndarray) or state.dtype != np.float32:
        raise ValueError(f"{op}: the state must be a float32 ndarray (it is updated in place)")
    return state


def _silu32(x):
    import numpy as np

    with np.errstate(over="ignore"):
        return x / (np.float32(1) + np.exp(-x))


def _sigmoid32(x):
    import numpy as np

    with np.errstate(over="ignore"):
        return np.float32(1) / (np.float32(1) + np.exp(-x))


def conv_twin(ops, x, state, w, pb):
    import numpy as np

    x = np.asarray(x, np.float32)
    state = _state_array("qwen35_conv", state)
    T, C, K = _conv_dims(x.shape, state.shape, w.ne)
    runs, _ = _runs("qwen35_conv", pb, T, state.shape[0])
    wf = np.asarray(ops.f32_data(w), np.float32).reshape(C, K)
    y = np.empty((T, C), np.float32)
    for s, t0, t1 in runs:
        n = t1 - t0
        win = np.concatenate([state[s].T, x[t0:t1]])  # [K-1+n, C]
        acc = np.zeros((n, C), np.float32)
        for tau in range(K):  # taps in order, float32: ggml's ssm_conv sum
            acc += win[tau:tau + n] * wf[:, tau]
        y[t0:t1] = _silu32(acc)
        state[s] = win[n:].T
    return y


def _l2_normalize(x, eps: float, scale: float = 1.0):
    """x / sqrt(sum x^2 + eps) * scale over the last axis (ggml: a float64 sum)."""
    import numpy as np

    ss = np.sum(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return x * (scale / np.sqrt(ss + float(eps))).astype(np.float32)


def _softplus32(x):
    """ggml's CPU softplus: x above 20, else log(1 + e^x), float32."""
    import numpy as np

    return np.where(x > 20, x, np.log(np.float32(1) + np.exp(np.minimum(x, np.float32(20)))))


def delta_rule_twin(ops, y, b, a, ssm_a, dt_bias, state, pb, n_k_heads, eps):
    import numpy as np

    op = "qwen35_delta_rule"
    y = np.asarray(y, np.float32)
    b = np.asarray(b, np.float32)
    a = np.asarray(a, np.float32)
    state = _state_array(op, state)
    T, H_v, d = _delta_dims(y.shape, b.shape, a.shape, _prod(ssm_a.ne), _prod(dt_bias.ne),
                            state.shape, n_k_heads)
    runs, _ = _runs(op, pb, T, state.shape[0])
    H_k = int(n_k_heads)
    A = np.asarray(ops.f32_data(ssm_a), np.float32).reshape(H_v)
    dt = np.asarray(ops.f32_data(dt_bias), np.float32).reshape(H_v)
    key = np.arange(H_v) % H_k  # tiled pairing: value head j reads key head j % H_k
    q = _l2_normalize(y[:, :H_k * d].reshape(T, H_k, d), eps, 1.0 / np.sqrt(d))[:, key]
    k = _l2_normalize(y[:, H_k * d:2 * H_k * d].reshape(T, H_k, d), eps)[:, key]
    v = y[:, 2 * H_k * d:].reshape(T, H_v, d)
    beta = _sigmoid32(b)
    with np.errstate(under="ignore"):
        decay = np.exp(A * _softplus32(a + dt))  # e^g, g <= 0
    o = np.empty((T, H_v, d), np.float32)
    for s, t0, t1 in runs:
        S = state[s].copy()  # [H_v, col, i]: each head's S^T, rows contiguous over keys
        for t in range(t0, t1):
            S *= decay[t][:, None, None]
            u = np.matmul(S, k[t][:, :, None])[..., 0]  # S^T k per head: [H_v, d]
            delta = beta[t][:, None] * (v[t] - u)
            S += delta[:, :, None] * k[t][:, None, :]
            o[t] = np.matmul(S, q[t][:, :, None])[..., 0]
        state[s] = S
    return o.reshape(T, H_v * d)


def gated_norm_twin(ops, o, z, w, eps):
    import numpy as np

    o = np.asarray(o, np.float32)
    z = np.asarray(z, np.float32)
    rows, d = _gated_norm_dims(o.shape, z.shape, w.ne)
    oh = o.reshape(rows, d)
    ms = np.mean(np.square(oh, dtype=np.float64), axis=-1, keepdims=True)
    normed = oh * (1.0 / np.sqrt(ms + float(eps))).astype(np.float32)
    wf = np.asarray(ops.f32_data(w), np.float32).reshape(d)
    return ((normed * wf) * _silu32(z.reshape(rows, d))).reshape(o.shape)


def take_q_twin(ops, qg, n_head):
    import numpy as np

    qg = np.asarray(qg, np.float32)
    T, H, d_h = _qg_dims("qwen35_take_q", qg.shape, n_head)
    return np.ascontiguousarray(qg.reshape(T, H, 2, d_h)[:, :, 0])


def gate_output_twin(ops, o, qg, n_head):
    import numpy as np

    o = np.asarray(o, np.float32)
    qg = np.asarray(qg, np.float32)
    T, H, d_h = _gate_output_dims(o.shape, qg.shape, n_head)
    gate = qg.reshape(T, H, 2, d_h)[:, :, 1].reshape(T, H * d_h)
    return o * _sigmoid32(gate)


def shexp_combine_twin(ops, moe, sh, b, w):
    import numpy as np

    moe = np.asarray(moe, np.float32)
    sh = np.asarray(sh, np.float32)
    b = np.asarray(b, np.float32)
    T, D = _shexp_dims(moe.shape, sh.shape, b.shape, w.ne)
    wf = np.asarray(ops.f32_data(w), np.float32).reshape(D)
    dot = (b.astype(np.float64) @ wf.astype(np.float64)).astype(np.float32)
    return moe + sh * _sigmoid32(dot)[:, None]


# --- CUDA launchers --------------------------------------------------------------------------

def _launch(ops, kernel: str, grid, block, args) -> None:
    ops.kernels(PKG, MODULE).launch(kernel, grid, block, args)


def conv_cuda(ops, x, state, w, pb):
    T, C, K = _conv_dims(x.shape, state.shape, w.ne)
    if K > CONV_MAX_K:
        raise ValueError(f"qwen35_conv: conv width {K} > {CONV_MAX_K} (the kernel's limit)")
    _, max_len = _runs("qwen35_conv", pb, T, state.shape[0])
    y = ops.empty((T, C))
    if T and C:
        chunks = (max_len + CONV_CHUNK - 1) // CONV_CHUNK
        _launch(ops, "reflex_qwen35_conv", ((C + 127) // 128, chunks, pb.n_runs), 128,
                (x.ptr, state.ptr, ops.f32_data(w), y.ptr, pb.runs, C, K))
    return y


def delta_rule_cuda(ops, y, b, a, ssm_a, dt_bias, state, pb, n_k_heads, eps):
    T, H_v, d = _delta_dims(y.shape, b.shape, a.shape, _prod(ssm_a.ne), _prod(dt_bias.ne),
                            state.shape, n_k_heads)
    if d > DELTA_MAX_D:
        raise ValueError(f"qwen35_delta_rule: head size {d} > {DELTA_MAX_D} (the kernel's limit)")
    runs, max_len = _runs("qwen35_delta_rule", pb, T, state.shape[0])
    o = ops.empty((T, H_v * d))
    if not (T and d):
        return o
    gates = (ops.f32_data(ssm_a), ops.f32_data(dt_bias))
    if max_len < DELTA_CHUNKED_MIN_RUN:
        _launch(ops, "reflex_qwen35_delta_rule", ((d + 3) // 4, H_v, pb.n_runs), 128,
                (y.ptr, b.ptr, a.ptr, *gates, state.ptr, o.ptr, pb.runs, int(n_k_heads), H_v, d,
                 float(eps)))
        return o
    C = DELTA_CHUNK
    n_chunks = sum((t1 - t0 + C - 1) // C for _, t0, t1 in runs)
    # one record per (chunk, value head): U, W [C, d], QK [C, C], two [C] scales, e^{G_last}
    scratch = ops.empty((n_chunks * H_v, 2 * C * d + C * C + 2 * C + 1))
    _launch(ops, "reflex_qwen35_delta_prep", ((max_len + C - 1) // C, H_v, pb.n_runs), 256,
            (y.ptr, b.ptr, a.ptr, *gates, pb.runs, scratch.ptr, int(n_k_heads), H_v, d,
             float(eps)))
    _launch(ops, "reflex_qwen35_delta_chunked", ((d + DELTA_COLS - 1) // DELTA_COLS, H_v,
                                                 pb.n_runs), 256,
            (y.ptr, state.ptr, o.ptr, pb.runs, scratch.ptr, int(n_k_heads), H_v, d))
    return o


def gated_norm_cuda(ops, o, z, w, eps):
    rows, d = _gated_norm_dims(o.shape, z.shape, w.ne)
    out = ops.empty(o.shape)
    if rows:
        _launch(ops, "reflex_qwen35_gated_norm", (rows + 3) // 4, 128,
                (o.ptr, z.ptr, ops.f32_data(w), out.ptr, rows, d, float(eps)))
    return out


def take_q_cuda(ops, qg, n_head):
    T, H, d_h = _qg_dims("qwen35_take_q", qg.shape, n_head)
    q = ops.empty((T, H, d_h))
    n = T * H * d_h
    if n:
        _launch(ops, "reflex_qwen35_take_q", (n + 255) // 256, 256, (qg.ptr, q.ptr, n, H, d_h))
    return q


def gate_output_cuda(ops, o, qg, n_head):
    T, H, d_h = _gate_output_dims(o.shape, qg.shape, n_head)
    out = ops.empty((T, H * d_h))
    n = T * H * d_h
    if n:
        _launch(ops, "reflex_qwen35_gate_output", (n + 255) // 256, 256,
                (o.ptr, qg.ptr, out.ptr, n, H, d_h))
    return out


def shexp_combine_cuda(ops, moe, sh, b, w):
    T, D = _shexp_dims(moe.shape, sh.shape, b.shape, w.ne)
    out = ops.empty((T, D))
    if T and D:
        _launch(ops, "reflex_qwen35_shexp_combine", T, 256,
                (moe.ptr, sh.ptr, b.ptr, ops.f32_data(w), out.ptr, D))
    return out


# --- random cases and independent references (tests only) -----------------------------------

# Sequence runs of the case batches: (seq, length) in batch order -- slots 0, 2, 1 with
# different lengths (a run of one token, runs shorter than the conv window), slot 3 untouched.
_RUNS = {1: ((2, 1),), 7: ((0, 3), (2, 2), (1, 2)), 64: ((0, 40), (2, 1), (1, 23)),
         600: ((0, 517), (2, 1), (1, 82))}
_N_SEQS = 4


def _batch(runs):
    from reflex_core.plugin_api import AttnMask, Batch, BatchArg

    seq_ids = tuple(s for s, n in runs for _ in range(n))
    T = len(seq_ids)
    return BatchArg(Batch(tuple(range(T)), tuple(range(T)), 0, AttnMask.causal(0, T), seq_ids))


def _runs_of(runs):
    """(seq, t0, t1) triples of a case's ``(seq, length)`` runs."""
    out, t0 = [], 0
    for s, n in runs:
        out.append((s, t0, t0 + n))
        t0 += n
    return out


def _f(rng, *shape, scale=1.0):
    import numpy as np

    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv_reference(x, state, w, runs):
    """(y, new state) of qwen35_conv in float64, as a correlation over sliding windows."""
    import numpy as np

    x = np.asarray(x, np.float64)
    st = np.array(state, np.float64)
    w = np.asarray(w, np.float64)  # [C, K]
    K = w.shape[1]
    y = np.zeros_like(x)
    for s, t0, t1 in runs:
        seq = np.concatenate([st[s].T, x[t0:t1]])
        windows = np.lib.stride_tricks.sliding_window_view(seq, K, axis=0)  # [n, C, K]
        pre = np.einsum("nck,ck->nc", windows, w)
        y[t0:t1] = pre / (1.0 + np.exp(-pre))
        st[s] = seq[len(seq) - (K - 1):].T
    return y, st


def delta_rule_chunked(q, k, v, beta, g, S, chunk=64):
    """The gated delta rule of one sequence by spec §7.6's chunked form, float64.
    q, k [n, H, d] (normalised, q scaled), v [n, H, d], beta, g [n, H], S [H, d_k, d_v]
    (S[j, i, col]); returns (o [n, H, d], S)."""
    import numpy as np

    n, H, d = v.shape
    o = np.zeros((n, H, d))
    S = np.array(S, np.float64)
    for c0 in range(0, n, chunk):
        c1 = min(c0 + chunk, n)
        m = c1 - c0
        causal = np.tril(np.ones((m, m), bool))
        for j in range(H):
            Kc, Qc, Vc = k[c0:c1, j], q[c0:c1, j], v[c0:c1, j]
            bc = beta[c0:c1, j]
            G = np.cumsum(g[c0:c1, j])
            decay = np.exp(np.where(causal, G[:, None] - G[None, :], -np.inf))  # e^{G_t - G_s}
            A = np.tril(bc[:, None] * (Kc @ Kc.T) * decay, -1)
            IA = np.eye(m) + A
            U = np.linalg.solve(IA, bc[:, None] * Vc)
            W = np.linalg.solve(IA, (bc * np.exp(G))[:, None] * Kc)
            Vp = U - W @ S[j]
            o[c0:c1, j] = np.exp(G)[:, None] * (Qc @ S[j]) + ((Qc @ Kc.T) * decay) @ Vp
            S[j] = np.exp(G[-1]) * S[j] + (Kc * np.exp(G[-1] - G)[:, None]).T @ Vp
    return o, S


def delta_rule_reference(y, b, a, ssm_a, dt_bias, state, runs, n_k_heads, eps):
    """(o, new state) of qwen35_delta_rule in float64 by the chunked form (state in the op's
    layout [n_seqs, H_v, col, key])."""
    import numpy as np

    y = np.asarray(y, np.float64)
    st = np.array(state, np.float64)
    T, H_v, d, H_k = y.shape[0], st.shape[1], st.shape[3], n_k_heads

    def l2(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)

    heads = [j % H_k for j in range(H_v)]
    q = l2(y[:, :H_k * d].reshape(T, H_k, d))[:, heads] / np.sqrt(d)
    k = l2(y[:, H_k * d:2 * H_k * d].reshape(T, H_k, d))[:, heads]
    v = y[:, 2 * H_k * d:].reshape(T, H_v, d)
    beta = 1.0 / (1.0 + np.exp(-np.asarray(b, np.float64)))
    g = np.asarray(ssm_a, np.float64) * np.logaddexp(0.0, np.asarray(a, np.float64)
                                                     + np.asarray(dt_bias, np.float64))
    o = np.zeros((T, H_v, d))
    for s, t0, t1 in runs:
        o[t0:t1], S = delta_rule_chunked(q[t0:t1], k[t0:t1], v[t0:t1], beta[t0:t1], g[t0:t1],
                                         st[s].transpose(0, 2, 1))
        st[s] = S.transpose(0, 2, 1)
    return o.reshape(T, H_v * d), st


def conv_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase, WeightArg

    out = []
    shapes = [(T, 75, 4) for T in (1, 7, 64, 600)] + [(7, 75, 2), (64, 33, 8), (600, 130, 5)]
    for i, (T, C, K) in enumerate(shapes):
        runs = _RUNS[T]
        x = _f(rng, T, C, scale=2)
        state = _f(rng, _N_SEQS, C, K - 1)
        w = _f(rng, C, K, scale=0.7)
        y, _ = conv_reference(x, state, w, _runs_of(runs))
        out.append(OpCase(f"T={T} C={C} K={K}", (x, state, WeightArg(f"conv{i}", w), _batch(runs)),
                          compare=(1,), rtol=2e-6, atol=2e-6, expect=y.astype(np.float32)))
    return out


# Tolerance of the delta-rule cases: the twin against the float64 reference, both CUDA paths
# against the twin. The float32 emulation of the chunked kernels (tests/test_qwen35_ops.py) differs
# from the twin by at most 9e-8 on o (|o| <= 0.4) and 1.8e-7 on the state (|S| <= 2.4) on its
# cases (d = 24, 40, 128; runs of 1 to 600 tokens), as much as the twin differs from float64.
DELTA_RTOL, DELTA_ATOL = 1e-5, 1e-6


def delta_rule_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase, WeightArg

    out = []
    # (T, H_k, H_v, d): H_v = 3 H_k (tiled pairing), odd head sizes, one and eight state
    # values per lane of the sequential kernel (d = 24, 40, 128, 256); T = 600 (a run of 517
    # tokens) takes the chunked path, with one to four 64-key row blocks (d = 24, 128, 136, 256)
    # and a partial block of state columns (d = 24, 136)
    shapes = [(T, 2, 6, 24) for T in (1, 7, 64, 600)] + [(64, 3, 3, 40), (7, 2, 4, 128),
                                                         (7, 1, 2, 256), (600, 2, 4, 128),
                                                         (600, 1, 2, 136), (600, 1, 1, 256)]
    eps = 1e-6
    for i, (T, H_k, H_v, d) in enumerate(shapes):
        runs = _RUNS[T]
        y = _f(rng, T, 2 * H_k * d + H_v * d)
        y[:, :2 * H_k * d] *= 3.0
        # every 5th token's q and k tiny: sum x^2 near eps, where eps inside the root matters
        y[::5, :2 * H_k * d] *= 3e-4
        b = _f(rng, T, H_v, scale=2)
        a = _f(rng, T, H_v, scale=3)
        a[rng.random((T, H_v)) < 0.05] = 25.0  # softplus's linear branch
        ssm_a = -np.exp(_f(rng, H_v, scale=0.5))
        dt = _f(rng, H_v)
        state = _f(rng, _N_SEQS, H_v, d, d, scale=0.5)
        o, _ = delta_rule_reference(y, b, a, ssm_a, dt, state, _runs_of(runs), H_k, eps)
        args = (y, b, a, WeightArg(f"ssm_a{i}", ssm_a), WeightArg(f"dt{i}", dt), state,
                _batch(runs), H_k, eps)
        out.append(OpCase(f"T={T} H_k={H_k} H_v={H_v} d={d}", args, compare=(5,),
                          rtol=DELTA_RTOL, atol=DELTA_ATOL, expect=o.astype(np.float32)))
    return out


def gated_norm_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase, WeightArg

    out = []
    for i, (T, H, d) in enumerate(((1, 6, 24), (67, 5, 40), (7, 4, 128))):
        o = _f(rng, T, H * d, scale=3)
        z = _f(rng, T, H * d, scale=2)
        w = _f(rng, d)
        o64 = o.astype(np.float64).reshape(T, H, d)
        z64 = z.astype(np.float64).reshape(T, H, d)
        want = (o64 / np.sqrt(np.mean(o64 ** 2, axis=-1, keepdims=True) + 1e-6) * w
                * z64 / (1 + np.exp(-z64))).reshape(T, H * d)
        out.append(OpCase(f"T={T} H={H} d={d}", (o, z, WeightArg(f"norm{i}", w), 1e-6),
                          rtol=1e-5, atol=1e-6, expect=want.astype(np.float32)))
    return out


def take_q_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    out = []
    for T, H, d_h in ((1, 3, 40), (67, 5, 24)):
        qg = _f(rng, T, 2 * H * d_h)
        want = np.stack([qg[:, h * 2 * d_h:h * 2 * d_h + d_h] for h in range(H)], axis=1)
        out.append(OpCase(f"T={T} H={H} d_h={d_h}", (qg, H), rtol=0, atol=0, expect=want))
    return out


def gate_output_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    out = []
    for T, H, d_h in ((1, 3, 40), (67, 5, 24)):
        o = _f(rng, T, H * d_h)
        qg = _f(rng, T, 2 * H * d_h, scale=4)
        gate = np.concatenate([qg[:, h * 2 * d_h + d_h:(h + 1) * 2 * d_h] for h in range(H)], 1)
        want = o.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64)))
        out.append(OpCase(f"T={T} H={H} d_h={d_h}", (o, qg, H), rtol=1e-6, atol=1e-6,
                          expect=want.astype(np.float32)))
    return out


def shexp_combine_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase, WeightArg

    out = []
    for i, (T, D, ne1) in enumerate(((1, 75, False), (67, 1000, True))):
        moe, sh, b = _f(rng, T, D), _f(rng, T, D), _f(rng, T, D)
        w = _f(rng, D, scale=0.1)
        gamma = 1 / (1 + np.exp(-(b.astype(np.float64) @ w.astype(np.float64))))
        want = moe + gamma[:, None] * sh.astype(np.float64)
        data = w.reshape(1, D) if ne1 else w  # ne [D, 1] as some files store it
        out.append(OpCase(f"T={T} D={D}" + (" ne=[D,1]" if ne1 else ""),
                          (moe, sh, b, WeightArg(f"shexp{i}", data)), rtol=1e-5, atol=1e-5,
                          expect=want.astype(np.float32)))
    return out
