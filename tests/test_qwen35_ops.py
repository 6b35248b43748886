"""The Qwen3.5 family's own ops (plugins/qwen35_hybrid, reflex_qwen35_hybrid.ops) in CI: every
twin against its independent formula on its random cases (the result and the in-place state),
the one-line ValueErrors of twins and launchers (a sequence in two runs, inconsistent widths,
the kernels' limits; the launchers fail before touching the device), a run of T tokens equal to
T one-token calls with the state carried over, and the launchers' limits equal to the kernels'.
The launchers against the twins run on the GPU machine (the generic registered-op test)."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from reflex_core import opreg
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.gguf import open_gguf
from reflex_core.ops import AttnMask, Batch
from reflex_core.testing import op_harness
from reflex_qwen35_hybrid import ops as q35
from reflex_qwen35_hybrid import plugin

ROOT = Path(__file__).resolve().parent.parent
CU = ROOT / "plugins" / "qwen35_hybrid" / "cuda" / "qwen35.cu"
NAMES = sorted(plugin.OPS)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with op_harness.plugin_ops(plugin, "reflex-infer-qwen35-hybrid"):
        yield


def _cases(name):
    return opreg.resolve(opreg.get(name).cases)(np.random.default_rng(zlib.crc32(name.encode())))


def _ops_with(weights, tmp_path):
    ops = NumpyOps()
    ops.attach(open_gguf(str(op_harness.write_weights(tmp_path / "w.gguf", weights))))
    return ops


@pytest.mark.parametrize("name", NAMES)
def test_twin_matches_its_independent_formula(name, tmp_path):
    cases = _cases(name)
    ops = _ops_with(op_harness.weights_of(cases), tmp_path)
    twin = opreg.implementation(name, "cpu")
    for case in cases:
        assert case.expect is not None, case.label
        got, inplace = op_harness.run(ops, twin, case)
        op_harness.assert_close(got, case.expect, case, "independent formula")
        if name == "qwen35_conv":
            x, state, w, b = case.args
            _, want_state = q35.conv_reference(x, state, w.data, b.batch.runs)
        elif name == "qwen35_delta_rule":
            y, bb, a, ssm_a, dt, state, b, H_k, eps = case.args
            _, want_state = q35.delta_rule_reference(y, bb, a, ssm_a.data, dt.data, state,
                                                     b.batch.runs, H_k, eps)
        else:
            continue
        op_harness.assert_close(inplace[0], want_state, case, "state")
        untouched = sorted(set(range(state.shape[0])) - set(b.batch.seq_ids))
        assert untouched and np.array_equal(inplace[0][untouched], state[untouched]), case.label


def test_every_op_has_twin_launcher_and_cases():
    for name in NAMES:
        op = opreg.get(name)
        assert op.package == q35.PKG and op.kernels == (q35.MODULE,)
        for ref in (op.twin, op.cuda, op.cases):
            assert callable(opreg.resolve(ref)), ref


def test_launcher_limits_are_the_kernels():
    defines = dict(re.findall(r"#define REFLEX_QWEN35_(\w+) (\d+)", CU.read_text()))
    assert {k: int(v) for k, v in defines.items()} == {
        "CONV_MAX_K": q35.CONV_MAX_K, "CONV_CHUNK": q35.CONV_CHUNK,
        "DELTA_MAX_D": q35.DELTA_MAX_D, "DELTA_CHUNK": q35.DELTA_CHUNK,
        "DELTA_COLS": q35.DELTA_COLS}
    # the chunked walk's thread layout: 4 columns per thread, 64 chunk rows and 64-key row blocks
    assert q35.DELTA_COLS == 16 and q35.DELTA_CHUNK == 64 and q35.DELTA_MAX_D <= 4 * 64
    # the op cases take both delta-rule paths
    lens = [max(n for _, n in runs) for runs in q35._RUNS.values()]
    assert min(lens) < q35.DELTA_CHUNKED_MIN_RUN <= max(lens)
    # a conv chunk after the first never reaches back into the state (see the kernel)
    assert q35.CONV_CHUNK >= q35.CONV_MAX_K - 1


# --- shapes of a small GDN layer for the error and carry-over tests -----------------------------

H_K, H_V, D, K_CONV, EPS = 2, 4, 24, 4, 1e-6
C = 2 * H_K * D + H_V * D


def _batch(seq_ids):
    T = len(seq_ids)
    return Batch(tuple(range(T)), tuple(range(T)), 0, AttnMask.causal(0, T), tuple(seq_ids))


def _weights(rng):
    return {"conv": (rng.standard_normal((C, K_CONV)) * 0.5).astype(np.float32),
            "ssm_a": -np.exp(rng.standard_normal(H_V) * 0.5).astype(np.float32),
            "dt": rng.standard_normal(H_V).astype(np.float32)}


def _layer_inputs(rng, T):
    return (rng.standard_normal((T, C)).astype(np.float32),
            rng.standard_normal((T, H_V)).astype(np.float32),
            (rng.standard_normal((T, H_V)) * 2).astype(np.float32))


@pytest.fixture
def gdn(tmp_path):
    rng = np.random.default_rng(13)
    return _ops_with(_weights(rng), tmp_path), rng


def _conv(ops, x, state, pb):
    return q35.conv_twin(ops, x, state, ops.weight("conv"), pb)


def _delta(ops, y, b, a, state, pb, n_k_heads=H_K):
    return q35.delta_rule_twin(ops, y, b, a, ops.weight("ssm_a"), ops.weight("dt"), state, pb,
                               n_k_heads, EPS)


def test_a_run_equals_its_tokens_one_at_a_time(gdn):
    """Prompt then decode: T tokens of slot 1 at once == T calls of one token, the conv and SSM
    states carried across the calls."""
    ops, rng = gdn
    T = 37
    x, b, a = _layer_inputs(rng, T)
    conv0 = rng.standard_normal((3, C, K_CONV - 1)).astype(np.float32)
    ssm0 = (rng.standard_normal((3, H_V, D, D)) * 0.3).astype(np.float32)
    conv_all, ssm_all = conv0.copy(), ssm0.copy()
    pb = ops.prepare(_batch([1] * T))
    o_all = _delta(ops, _conv(ops, x, conv_all, pb), b, a, ssm_all, pb)
    conv_one, ssm_one = conv0.copy(), ssm0.copy()
    rows = []
    for t in range(T):
        pb1 = ops.prepare(_batch([1]))
        y1 = _conv(ops, x[t:t + 1], conv_one, pb1)
        rows.append(_delta(ops, y1, b[t:t + 1], a[t:t + 1], ssm_one, pb1))
    np.testing.assert_allclose(np.concatenate(rows), o_all, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(conv_one, conv_all, rtol=0, atol=0)
    np.testing.assert_allclose(ssm_one, ssm_all, rtol=1e-6, atol=1e-7)
    for other in (0, 2):  # the other slots are untouched
        assert np.array_equal(conv_all[other], conv0[other])
        assert np.array_equal(ssm_all[other], ssm0[other])


class _NoDevice:
    """An ops object whose every use fails: the launchers must reject bad input before."""

    def __getattr__(self, name):
        raise AssertionError(f"the launcher used ops.{name} before rejecting its input")


def _dev(shape):
    return SimpleNamespace(shape=tuple(shape), ptr=0)


def _w(ne):
    return SimpleNamespace(ne=tuple(ne), name="w")


def _dev_batch(seq_ids):
    batch = _batch(seq_ids)
    return SimpleNamespace(batch=batch, runs=0, n_runs=len(batch.runs))


def _one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_sequence_in_two_runs_is_rejected(gdn):
    ops, rng = gdn
    seq_ids = [0, 0, 1, 0]
    x, b, a = _layer_inputs(rng, 4)
    conv = np.zeros((2, C, K_CONV - 1), np.float32)
    ssm = np.zeros((2, H_V, D, D), np.float32)
    pb = ops.prepare(_batch(seq_ids))
    with pytest.raises(ValueError) as e:
        _conv(ops, x, conv, pb)
    _one_line(e, "qwen35_conv", "sequence 0", "two runs")
    with pytest.raises(ValueError) as e:
        _delta(ops, x, b, a, ssm, pb)
    _one_line(e, "qwen35_delta_rule", "sequence 0", "two runs")
    assert not conv.any() and not ssm.any()  # nothing written before the check
    dpb = _dev_batch(seq_ids)
    with pytest.raises(ValueError) as e:
        q35.conv_cuda(_NoDevice(), _dev(x.shape), _dev(conv.shape), _w((K_CONV, C)), dpb)
    _one_line(e, "sequence 0", "two runs")
    with pytest.raises(ValueError) as e:
        q35.delta_rule_cuda(_NoDevice(), _dev(x.shape), _dev(b.shape), _dev(a.shape),
                            _w((H_V,)), _w((H_V,)), _dev(ssm.shape), dpb, H_K, EPS)
    _one_line(e, "sequence 0", "two runs")


def test_a_sequence_without_a_slot_is_rejected(gdn):
    ops, rng = gdn
    x, b, a = _layer_inputs(rng, 2)
    pb = ops.prepare(_batch([0, 2]))
    with pytest.raises(ValueError) as e:
        _delta(ops, x, b, a, np.zeros((2, H_V, D, D), np.float32), pb)
    _one_line(e, "sequence 2", "2 sequences")


# (what is wrong, y shape, b shape, state shape, n_k_heads, words of the message)
DELTA_BAD = [
    ("y width", (3, C + 1), (3, H_V), (1, H_V, D, D), H_K, [f"y [3, {C + 1}]", f"[T, {C}]"]),
    ("d_k != d_v", (3, C), (3, H_V), (1, H_V, D, D + 1), H_K, ["d_k = d_v"]),
    ("H_v % H_k", (3, C), (3, H_V), (1, H_V, D, D), 3, ["4 value heads", "3 key heads"]),
    ("beta rows", (3, C), (2, H_V), (1, H_V, D, D), H_K, ["b [2, 4]", "[3, 4]"]),
    ("state rank", (3, C), (3, H_V), (H_V, D, D), H_K, ["[n_seqs, H_v, d, d]"]),
]


@pytest.mark.parametrize("what,y,b,state,n_k_heads,words", DELTA_BAD,
                         ids=[c[0] for c in DELTA_BAD])
def test_delta_rule_rejects_bad_widths(gdn, what, y, b, state, n_k_heads, words):
    ops, _ = gdn
    pb = ops.prepare(_batch([0] * y[0]))
    with pytest.raises(ValueError) as e:
        _delta(ops, np.zeros(y, np.float32), np.zeros(b, np.float32),
               np.zeros((y[0], H_V), np.float32), np.zeros(state, np.float32), pb, n_k_heads)
    _one_line(e, "qwen35_delta_rule", *words)
    with pytest.raises(ValueError) as e:
        q35.delta_rule_cuda(_NoDevice(), _dev(y), _dev(b), _dev((y[0], H_V)), _w((H_V,)),
                            _w((H_V,)), _dev(state), _dev_batch([0] * y[0]), n_k_heads, EPS)
    _one_line(e, "qwen35_delta_rule", *words)


def test_delta_rule_rejects_gate_vectors_of_the_wrong_size():
    with pytest.raises(ValueError) as e:
        q35.delta_rule_cuda(_NoDevice(), _dev((1, C)), _dev((1, H_V)), _dev((1, H_V)),
                            _w((H_V + 1,)), _w((H_V,)), _dev((1, H_V, D, D)), _dev_batch([0]),
                            H_K, EPS)
    _one_line(e, "ssm_a has 5 elements")


def test_conv_rejects_bad_shapes(gdn):
    ops, rng = gdn
    pb = ops.prepare(_batch([0, 0]))
    x = rng.standard_normal((2, C + 1)).astype(np.float32)
    with pytest.raises(ValueError) as e:
        _conv(ops, x, np.zeros((1, C + 1, K_CONV - 1), np.float32), pb)
    _one_line(e, "qwen35_conv", f"[{K_CONV}, {C}]", f"[K, {C + 1}]")
    with pytest.raises(ValueError) as e:
        _conv(ops, x[:, :C], np.zeros((1, C, K_CONV), np.float32), pb)
    _one_line(e, "qwen35_conv", "state", f"[n_seqs, {C}, {K_CONV - 1}]")
    wide = q35.CONV_MAX_K + 1
    with pytest.raises(ValueError) as e:
        q35.conv_cuda(_NoDevice(), _dev((2, C)), _dev((1, C, wide - 1)), _w((wide, C)),
                      _dev_batch([0, 0]))
    _one_line(e, "qwen35_conv", f"width {wide}", "limit")


def test_launchers_reject_sizes_beyond_the_kernels():
    d = q35.DELTA_MAX_D + 8
    with pytest.raises(ValueError) as e:
        q35.delta_rule_cuda(_NoDevice(), _dev((1, 3 * d)), _dev((1, 1)), _dev((1, 1)), _w((1,)),
                            _w((1,)), _dev((1, 1, d, d)), _dev_batch([0]), 1, EPS)
    _one_line(e, f"head size {d}", "limit")


def test_elementwise_ops_reject_bad_shapes():
    cases = [
        (q35.take_q_cuda, (_dev((2, 50)),), 3, ["qwen35_take_q", "[T, 2*3*d_h]"]),
        (q35.gate_output_cuda, (_dev((2, 30)), _dev((2, 40))), 2,
         ["qwen35_gate_output", "o [2, 30]", "[2, 20]"]),
        (q35.gated_norm_cuda, (_dev((2, 30)), _dev((2, 30)), _w((7,))), 1e-6,
         ["qwen35_gated_norm", "ne [7]"]),
        (q35.shexp_combine_cuda, (_dev((2, 30)), _dev((2, 30)), _dev((2, 30)), _w((30, 2))),
         None, ["qwen35_shexp_combine", "ne [30, 2]"]),
        (q35.shexp_combine_cuda, (_dev((2, 30)), _dev((2, 31)), _dev((2, 30)), _w((30,))),
         None, ["qwen35_shexp_combine", "sh [2, 31]"]),
    ]
    for fn, args, last, words in cases:
        with pytest.raises(ValueError) as e:
            fn(_NoDevice(), *args, *(() if last is None else (last,)))
        _one_line(e, *words)


# --- the chunked delta rule of the CUDA launcher, emulated in float32 ----------------------------

def _chunked_float32(y, b, a, ssm_a, dt, state, runs, H_k, eps):
    """(o, new state) of qwen35_delta_rule by the algorithm of cuda/qwen35.cu's
    reflex_qwen35_delta_prep and reflex_qwen35_delta_chunked, float32 where they are: raw Gram
    matrices scaled by the norms' reciprocals, G summed in float64, (I + A)^-1 by forward
    substitution row by row, then the walk V' = U - W S, o = qs (q.S) + QK V',
    S <- e^{G_last} S + (ks k)^T V'. ``state`` is in the op's layout [n_seqs, H_v, col, key]."""
    f32, C = np.float32, q35.DELTA_CHUNK
    st = np.array(state, f32)
    T, H_v, d = y.shape[0], st.shape[1], st.shape[3]
    qr = y[:, :H_k * d].reshape(T, H_k, d)
    kr = y[:, H_k * d:2 * H_k * d].reshape(T, H_k, d)
    v = y[:, 2 * H_k * d:].reshape(T, H_v, d)
    beta = q35._sigmoid32(b)
    g = ssm_a * q35._softplus32(a + dt)
    o = np.zeros((T, H_v, d), f32)
    for s, t0, t1 in runs:
        S = st[s].transpose(0, 2, 1).copy()  # [H_v, key, col]
        for c0 in range(t0, t1, C):
            m = min(C, t1 - c0)
            rows = slice(c0, c0 + m)
            for j in range(H_v):
                h = j % H_k
                K, Q, V = kr[rows, h], qr[rows, h], v[rows, j]
                rk = f32(1) / np.sqrt(np.sum(K * K, axis=1) + f32(eps))
                rq = f32(1 / np.sqrt(d)) / np.sqrt(np.sum(Q * Q, axis=1) + f32(eps))
                G = np.cumsum(g[rows, j].astype(np.float64))
                with np.errstate(over="ignore", under="ignore"):
                    decay = np.tril(np.exp(np.minimum(G[:, None] - G[None, :], 0).astype(f32)))
                    eG = np.exp(G.astype(f32))
                    ks = rk * np.exp((G[-1] - G).astype(f32))
                    eGl = np.exp(f32(G[-1]))
                bt = beta[rows, j]
                A = np.tril(bt[:, None] * rk[:, None] * rk[None, :] * (K @ K.T) * decay, -1)
                QK = rq[:, None] * rk[None, :] * (Q @ K.T) * decay
                X = np.concatenate([V * bt[:, None], (K * rk[:, None]) * (bt * eG)[:, None]], 1)
                for t in range(1, m):
                    X[t] -= A[t, :t] @ X[:t]
                U, W = X[:, :d], X[:, d:]
                Vp = U - W @ S[j]
                o[rows, j] = (rq * eG)[:, None] * (Q @ S[j]) + QK @ Vp
                S[j] = eGl * S[j] + (K * ks[:, None]).T @ Vp
        st[s] = S.transpose(0, 2, 1)
    return o.reshape(T, H_v * d), st


# runs (seq, length) of the emulation tests: a chunk exactly, one token more or less, several
# chunks, a lone token, several runs in one batch
CHUNKED_RUNS = [((0, 1), (1, 63), (2, 64), (3, 65)), ((1, 130), (0, 600)), ((2, 517), (0, 1),
                                                                            (1, 82))]


@pytest.mark.parametrize("d,H_k,H_v", [(24, 2, 6), (40, 1, 3), (128, 1, 2), (136, 1, 1),
                                        (256, 1, 1)])
@pytest.mark.parametrize("runs", CHUNKED_RUNS, ids=["short", "long", "cases"])
def test_chunked_form_matches_the_sequential_twin(d, H_k, H_v, runs, tmp_path):
    """The launcher's chunked path, emulated in float32, against the twin within the tolerance of
    the op cases (the GPU test holds the kernels to the twin at the same tolerance)."""
    rng = np.random.default_rng(d * 1000 + len(runs))
    T = sum(n for _, n in runs)
    y = rng.standard_normal((T, 2 * H_k * d + H_v * d)).astype(np.float32)
    y[:, :2 * H_k * d] *= 3
    b = (rng.standard_normal((T, H_v)) * 2).astype(np.float32)
    a = (rng.standard_normal((T, H_v)) * 3).astype(np.float32)
    a[rng.random((T, H_v)) < 0.05] = 25.0
    w = {"ssm_a": -np.exp(rng.standard_normal(H_v) * 0.5).astype(np.float32),
         "dt": rng.standard_normal(H_v).astype(np.float32)}
    state = (rng.standard_normal((4, H_v, d, d)) * 0.5).astype(np.float32)
    ops = _ops_with(w, tmp_path)
    seq_ids = [s for s, n in runs for _ in range(n)]
    twin_state = state.copy()
    want = q35.delta_rule_twin(ops, y, b, a, ops.weight("ssm_a"), ops.weight("dt"), twin_state,
                               ops.prepare(_batch(seq_ids)), H_k, EPS)
    got, got_state = _chunked_float32(y, b, a, w["ssm_a"], w["dt"], state,
                                      q35._runs_of(runs), H_k, EPS)
    np.testing.assert_allclose(got, want, rtol=q35.DELTA_RTOL, atol=q35.DELTA_ATOL)
    np.testing.assert_allclose(got_state, twin_state, rtol=q35.DELTA_RTOL, atol=q35.DELTA_ATOL)
