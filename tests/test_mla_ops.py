"""The DeepSeek MLA family's own ops (plugins/deepseek_mla, reflex_deepseek_mla.ops) in CI: every
twin against its independent formula on its random cases (and the cache mla_store_rows writes),
the one-line ValueErrors of twins and launchers (bad shapes, V wider than the row, a row over the
kernel's limit, cells past the cache; the launchers fail before touching the device), the
absorbed attention against the decompressed multi-head form of spec §8.4, split/concat round
trips, the attention kernel's algorithm emulated in float32, and the launchers' limits equal to
the kernels'. The launchers against the twins run on the GPU machine (the generic registered-op
test)."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from reflex_core import opreg
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.testing import op_harness
from reflex_deepseek_mla import ops as mla
from reflex_deepseek_mla import plugin

ROOT = Path(__file__).resolve().parent.parent
CU = ROOT / "plugins" / "deepseek_mla" / "cuda" / "mla.cu"
NAMES = sorted(plugin.OPS)


@pytest.fixture(scope="module", autouse=True)
def registered():
    with op_harness.plugin_ops(plugin, "reflex-infer-deepseek-mla"):
        yield


def _cases(name):
    return opreg.resolve(opreg.get(name).cases)(np.random.default_rng(zlib.crc32(name.encode())))


@pytest.mark.parametrize("name", NAMES)
def test_twin_matches_its_independent_formula(name):
    ops = NumpyOps()
    twin = opreg.implementation(name, "cpu")
    for case in _cases(name):
        got, inplace = op_harness.run(ops, twin, case)
        if name != "mla_store_rows":
            assert case.expect is not None, case.label
            op_harness.assert_close(got, case.expect, case, "independent formula")
            continue
        rows, cache, b = case.args
        T, c0 = len(rows), b.batch.cell0
        want = cache.copy()
        for t in range(T):
            want[c0 + t] = rows[t]
        assert got is None and np.array_equal(inplace[0], want), case.label
        assert not np.array_equal(cache[c0:c0 + T], want[c0:c0 + T]), case.label


def test_every_op_has_twin_launcher_and_cases():
    for name in NAMES:
        op = opreg.get(name)
        assert op.package == mla.PKG and op.kernels == (mla.MODULE,)
        for ref in (op.twin, op.cuda, op.cases):
            assert callable(opreg.resolve(ref)), ref


def test_launcher_limits_are_the_kernels():
    src = CU.read_text()
    defines = dict(re.findall(r"#define REFLEX_MLA_(\w+) (\d+)", src))
    assert {k: int(v) for k, v in defines.items()} == {"MAX_ROW": mla.ATT_MAX_ROW}
    widths = tuple(int(w) for w in re.findall(r"^MLA_ATTENTION_KERNEL\((\d+)\)", src, re.M))
    assert widths == mla.ATT_LANE_FLOATS
    assert 32 * max(widths) == mla.ATT_MAX_ROW
    assert [mla._lane_floats(n) for n in (1, 64, 65, 72, 576, 577, 1024)] == [2, 2, 4, 4, 18,
                                                                              24, 32]


# --- the cases' batches ------------------------------------------------------------------------

def test_case_batches_have_the_tree_shape():
    """The tree batch of the cases: after earlier tokens, a prompt then branches that see the
    prompt and their own earlier tokens only."""
    b = mla.case_batch(3, 4, (3, 2))
    assert b.cell0 == 3 and b.n_tokens == 9 and b.n_kv == 12
    vis = [b.mask.visible(t) for t in range(9)]
    assert vis[3] == list(range(7))  # the prompt's last token: causal from cell 0
    assert vis[4] == list(range(7)) + [7]  # the first branch's first token
    assert vis[6] == list(range(7)) + [7, 8, 9]
    assert vis[7] == list(range(7)) + [10]  # the second branch never sees the first's cells
    assert vis[8] == list(range(7)) + [10, 11]


# --- errors ------------------------------------------------------------------------------------

class _NoDevice:
    """An ops object whose every use fails: the launchers must reject bad input before."""

    def __getattr__(self, name):
        raise AssertionError(f"the launcher used ops.{name} before rejecting its input")


def _dev(shape):
    return SimpleNamespace(shape=tuple(shape), ptr=0)


def _dev_batch(batch):
    return SimpleNamespace(batch=batch, cell0=batch.cell0, n_kv=batch.n_kv, n_tokens=batch.n_tokens,
                           prefix_end=0, own_start=0, own_end=0)


def _one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def _both(twin_call, cuda_call, *words):
    """The twin and the launcher (on an ops that must stay unused) raise one-line ValueErrors
    naming ``words``."""
    with pytest.raises(ValueError) as e:
        twin_call()
    _one_line(e, *words)
    with pytest.raises(ValueError) as e:
        cuda_call()
    _one_line(e, *words)


SPLIT_BAD = [
    ("not heads", (3, 50), 3, 10, ["mla_split_heads", "x [3, 50]", "[T, 3*d]"]),
    ("head count", (3, 4, 10), 3, 5, ["x [3, 4, 10]", "[T, 3, d]"]),
    ("d0 = d", (3, 30), 3, 10, ["split column 10", "heads of 10"]),
    ("d0 = 0", (3, 3, 10), 3, 0, ["split column 0"]),
]


@pytest.mark.parametrize("what,shape,H,d0,words", SPLIT_BAD, ids=[c[0] for c in SPLIT_BAD])
def test_split_rejects_bad_shapes(what, shape, H, d0, words):
    _both(lambda: mla.split_heads_twin(NumpyOps(), np.zeros(shape, np.float32), H, d0),
          lambda: mla.split_heads_cuda(_NoDevice(), _dev(shape), H, d0), *words)


CONCAT_BAD = [
    ("heads", (2, 3, 4), (2, 2, 5), ["mla_concat_heads", "a [2, 3, 4]", "b [2, 2, 5]"]),
    ("tokens", (2, 3, 4), (3, 3, 5), ["a [2, 3, 4]", "b [3, 3, 5]"]),
    ("rank", (2, 3, 4, 1), (2, 3, 5), ["[T, H, d] or [T, d]"]),
]


@pytest.mark.parametrize("what,a,b,words", CONCAT_BAD, ids=[c[0] for c in CONCAT_BAD])
def test_concat_rejects_bad_shapes(what, a, b, words):
    _both(lambda: mla.concat_heads_twin(NumpyOps(), np.zeros(a, np.float32),
                                        np.zeros(b, np.float32)),
          lambda: mla.concat_heads_cuda(_NoDevice(), _dev(a), _dev(b)), *words)


STORE_BAD = [
    # (what, history cells, T, rows shape, cache shape, words)
    ("past the cache", 6, 3, (3, 8), (8, 8), ["mla_store_rows", "cells [6, 9)", "8 cells"]),
    ("row width", 0, 3, (3, 8), (8, 9), ["rows [3, 8]", "cache [8, 9]", "row width"]),
    ("heads", 0, 3, (3, 2, 4), (8, 8), ["rows [3, 2, 4]", "[T, n] or [T, 1, n]"]),
    ("tokens", 0, 3, (2, 8), (8, 8), ["3 tokens", "rows 2"]),
]


@pytest.mark.parametrize("what,hist,T,rows,cache,words", STORE_BAD, ids=[c[0] for c in STORE_BAD])
def test_store_rejects_bad_shapes_and_cells_past_the_cache(what, hist, T, rows, cache, words):
    batch = mla.case_batch(hist, T, n_cells=max(hist + T, 1))
    buf = np.ones(cache, np.float32)
    _both(lambda: mla.store_rows_twin(NumpyOps(), np.zeros(rows, np.float32), buf,
                                      NumpyOps().prepare(batch)),
          lambda: mla.store_rows_cuda(_NoDevice(), _dev(rows), _dev(cache), _dev_batch(batch)),
          *words)
    assert (buf == 1).all()  # nothing written before the check


ATT_BAD = [
    # (what, q shape, cache shape, n_v, words); the batch: 2 tokens after 3
    ("v wider than the row", (2, 4, 72), (9, 72), 73, ["mla_attention", "V width 73", "[1, 72]"]),
    ("no v", (2, 4, 72), (9, 72), 0, ["V width 0"]),
    ("row width", (2, 4, 72), (9, 64), 64, ["q [2, 4, 72]", "cache [9, 64]"]),
    ("q rank", (2, 288), (9, 72), 64, ["q [2, 288]", "[T, H, n]"]),
    ("tokens", (3, 4, 72), (9, 72), 64, ["2 tokens", "q 3"]),
    ("cells", (2, 4, 72), (4, 72), 64, ["over 5 cells", "has 4"]),
    ("cache heads", (2, 4, 72), (9, 4, 72), 64, ["cache [9, 4, 72]", "[n_cells, 1, n]"]),
]


@pytest.mark.parametrize("what,q,cache,n_v,words", ATT_BAD, ids=[c[0] for c in ATT_BAD])
def test_attention_rejects_bad_shapes(what, q, cache, n_v, words):
    batch = mla.case_batch(3, 2)
    _both(lambda: mla.attention_twin(NumpyOps(), np.zeros(q, np.float32),
                                     np.zeros(cache, np.float32), NumpyOps().prepare(batch), 0.1,
                                     n_v),
          lambda: mla.attention_cuda(_NoDevice(), _dev(q), _dev(cache), _dev_batch(batch), 0.1,
                                     n_v), *words)


def test_attention_launcher_rejects_rows_over_the_kernels_limit():
    n = mla.ATT_MAX_ROW + 32
    with pytest.raises(ValueError) as e:
        mla.attention_cuda(_NoDevice(), _dev((1, 2, n)), _dev((4, n)),
                           _dev_batch(mla.case_batch(0, 1)), 0.1, 512)
    _one_line(e, "mla_attention", f"row width {n}", "limit")
    # the twin has no limit
    ops = NumpyOps()
    got = mla.attention_twin(ops, np.ones((1, 2, n), np.float32), np.ones((4, n), np.float32),
                             ops.prepare(mla.case_batch(0, 1)), 0.1, 512)
    assert got.shape == (1, 2, 512) and np.allclose(got, 1)


def test_head_ids_rejects_no_heads():
    _both(lambda: mla.head_ids_twin(NumpyOps(), 3, 0),
          lambda: mla.head_ids_cuda(_NoDevice(), 3, 0), "mla_head_ids", "0 heads")


# --- the absorbed form is multi-head attention over decompressed keys (spec §8.4) --------------

@pytest.mark.parametrize("history,prefix,branches", [(0, 9, ()), (5, 1, ()), (2, 3, (2, 3))],
                         ids=["prefill", "decode", "tree"])
def test_absorbed_attention_equals_decompressed_mha(history, prefix, branches):
    """Scores q_nope_h . (W_uk_h c_j) + q_pe_h . k_pe_j and values W_uv_h (sum_j a_j c_j) through
    mla_attention on [q_abs ; q_pe] over the cached rows [c_kv ; k_pe] equal plain multi-head
    attention with K_h = [W_uk_h c ; k_pe], V_h = W_uv_h c, computed in float64."""
    rng = np.random.default_rng(8 + history)
    H, d_nope, n_rot, r_kv, d_v = 4, 16, 8, 48, 12
    batch = mla.case_batch(history, prefix, branches)
    T, n_kv = batch.n_tokens, batch.n_kv
    scale = 1.0 / np.sqrt(d_nope + n_rot)
    W_uk = rng.standard_normal((H, d_nope, r_kv)) / np.sqrt(r_kv)  # HF kv_b_proj's K rows
    W_uv = rng.standard_normal((H, d_v, r_kv)) / np.sqrt(r_kv)
    c_kv = rng.standard_normal((n_kv, r_kv))
    k_pe = rng.standard_normal((n_kv, n_rot))
    q_nope = rng.standard_normal((T, H, d_nope)) * 2
    q_pe = rng.standard_normal((T, H, n_rot)) * 2

    # decompressed MHA, float64
    K = np.concatenate([np.einsum("hdr,jr->jhd", W_uk, c_kv),
                        np.broadcast_to(k_pe[:, None], (n_kv, H, n_rot))], axis=2)
    V = np.einsum("hvr,jr->jhv", W_uv, c_kv)
    want = np.zeros((T, H, d_v))
    for t in range(T):
        cells = batch.mask.visible(t)
        for h in range(H):
            s = scale * (K[cells, h] @ np.concatenate([q_nope[t, h], q_pe[t, h]]))
            a = np.exp(s - s.max())
            want[t, h] = (a / a.sum()) @ V[cells, h]

    # the absorbed form through the ops (float32), the cache rows written by mla_store_rows
    ops = NumpyOps()
    f32 = np.float32
    pb = ops.prepare(batch)
    cache = np.full((n_kv + 2, r_kv + n_rot), np.nan, f32)
    cache[:batch.cell0] = np.concatenate([c_kv, k_pe], 1)[:batch.cell0]
    row = mla.concat_heads_twin(ops, c_kv[batch.cell0:].astype(f32), k_pe[batch.cell0:].astype(f32))
    assert row.shape == (T, 1, r_kv + n_rot)
    mla.store_rows_twin(ops, row, cache, pb)
    q_abs = np.einsum("hdr,thd->thr", W_uk, q_nope).astype(f32)  # W_uk_h^T q_nope_h
    Q = mla.concat_heads_twin(ops, q_abs, q_pe.astype(f32))
    o_lat = mla.attention_twin(ops, Q, cache, pb, scale, r_kv)
    got = np.einsum("hvr,thr->thv", W_uv, o_lat.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


# --- split / concat round trips -------------------------------------------------------------

def test_split_then_concat_is_the_identity():
    rng = np.random.default_rng(3)
    ops = NumpyOps()
    for T, H, d, d0 in ((1, 16, 192, 128), (7, 3, 33, 1), (5, 1, 576, 512)):
        x = rng.standard_normal((T, H * d)).astype(np.float32)
        a, b = mla.split_heads_twin(ops, x, H, d0)
        assert a.shape == (T, H, d0) and b.shape == (T, H, d - d0)
        assert np.array_equal(mla.concat_heads_twin(ops, a, b).reshape(T, H * d), x)
        # the other order: [b ; a] split at d - d0 gives b and a back
        b2, a2 = mla.split_heads_twin(ops, mla.concat_heads_twin(ops, b, a), H, d - d0)
        assert np.array_equal(a2, a) and np.array_equal(b2, b)


def test_a_shared_head_is_repeated_on_either_side():
    rng = np.random.default_rng(4)
    ops = NumpyOps()
    k_pe = rng.standard_normal((3, 1, 8)).astype(np.float32)
    k_nope = rng.standard_normal((3, 5, 16)).astype(np.float32)
    first = mla.concat_heads_twin(ops, k_pe, k_nope)
    last = mla.concat_heads_twin(ops, k_nope, k_pe[:, 0])  # a [T, d] argument: one head
    for h in range(5):
        assert np.array_equal(first[:, h], np.concatenate([k_pe[:, 0], k_nope[:, h]], 1))
        assert np.array_equal(last[:, h], np.concatenate([k_nope[:, h], k_pe[:, 0]], 1))


# --- the attention kernel's algorithm, emulated ----------------------------------------------

def _kernel_float32(q, cache, mask, scale, n_v, warps=8):
    """mla_attention by the algorithm of cuda/mla.cu's reflex_mla_attention_<NPL>: the scale
    folded into q, warp w walks the visible list j = w, w+warps, ... (prefix cells, then own
    cells at or after prefix_end) with an online softmax, the warps' states merged at the end;
    float32 throughout."""
    f32 = np.float32
    T, H, n = q.shape
    o = np.zeros((T, H, n_v), f32)
    for t in range(T):
        pe, s0, e0 = mask.prefix_end[t], mask.own_start[t], mask.own_end[t]
        b_start = max(s0, pe)
        nvis = pe + max(0, e0 - b_start)
        cells = [j if j < pe else b_start + (j - pe) for j in range(nvis)]
        for h in range(H):
            qs = q[t, h] * f32(scale)
            ms, ls, accs = [], [], []
            for w in range(warps):
                m, l_, acc = f32(-np.inf), f32(0), np.zeros(n, f32)
                for j in range(w, nvis, warps):
                    row = cache[cells[j]]
                    s = f32(np.dot(qs, row))
                    mn = max(m, s)
                    corr, p = np.exp(f32(m - mn)), np.exp(f32(s - mn))
                    l_ = l_ * corr + p
                    acc = acc * corr + p * row
                    m = mn
                ms.append(m)
                ls.append(l_)
                accs.append(acc)
            M = max(ms)
            f = [f32(0) if m == -np.inf else np.exp(f32(m - M)) for m in ms]
            L = sum(l_ * fw for l_, fw in zip(ls, f))
            o[t, h] = sum(acc[:n_v] * fw for acc, fw in zip(accs, f)) / L
    return o


def test_kernel_algorithm_matches_the_twin():
    """Every attention case (tree masks, warps without a cell, cells past n_kv holding NaN)
    through the kernel's algorithm, within the cases' tolerance of the twin."""
    ops = NumpyOps()
    for case in _cases("mla_attention"):
        q, cache, b, scale, n_v = case.args
        if b.batch.n_tokens * q.shape[1] > 64:  # the emulation is slow; keep its cases small
            q = q[:, :2] if b.batch.n_tokens <= 32 else q[:, :1]
        want = mla.attention_twin(ops, q, cache, ops.prepare(b.batch), scale, n_v)
        got = _kernel_float32(q, cache, b.batch.mask, scale, n_v)
        np.testing.assert_allclose(got, want, rtol=mla.ATT_RTOL, atol=mla.ATT_ATOL,
                                   err_msg=case.label)
