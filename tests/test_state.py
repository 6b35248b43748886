"""The state contract (reflex_core.state) on the NumPy backend: batches made by the state,
forks of per-sequence buffers, device-side snapshots, dump/load, and the one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.errors import ReflexError
from reflex_core.state import (BufferSpec, State, StateSpec, ViewSpec, attention_kv,
                               attention_kv_spec)

HYBRID = StateSpec(attention_kv(0, 2, 4, 3) + (
    BufferSpec("conv.1", (3, 5), per_token=False),
    BufferSpec("ssm.1", (2, 4, 4), per_token=False),
    BufferSpec("kv.2", (6,), per_token=True, views=(ViewSpec("v.2", 0, 4),)),
))


def test_spec_checks():
    assert not attention_kv_spec(2, 1, 8).recurrent and HYBRID.recurrent
    with pytest.raises(ValueError, match="repeat"):
        StateSpec(attention_kv(0, 1, 2) + attention_kv(0, 1, 2))
    with pytest.raises(ValueError, match="outside"):
        StateSpec([BufferSpec("kv", (6,), True, views=(ViewSpec("v", 4, 3),))])
    with pytest.raises(ValueError, match="positive"):
        StateSpec([BufferSpec("k", (0, 2), True)])


def test_buffers_are_allocated_by_the_backend():
    st = State(HYBRID, NumpyOps(), n_cells=10, n_seqs=3)
    assert st["k.0"].shape == (10, 2, 4) and st["v.0"].shape == (10, 2, 3)
    assert st["conv.1"].shape == (3, 3, 5) and st["ssm.1"].shape == (3, 2, 4, 4)
    buf, c0, n = st.view("v.2")
    assert buf is st["kv.2"] and (c0, n) == (0, 4)
    assert [b.name for b, _ in st.buffers()] == ["k.0", "v.0", "conv.1", "ssm.1", "kv.2"]
    assert all(not a.any() for _, a in st.buffers())
    with pytest.raises(KeyError, match="no state buffer"):
        st["nope"]


def test_a_state_the_host_cannot_hold_is_one_clear_error():
    """-c 1000000000 with -n -1 on the NumPy backend: numpy's MemoryError becomes advice."""
    class Small(NumpyOps):
        def zeros(self, shape, *a, **kw):
            if shape[0] > 1000:
                raise MemoryError(f"Unable to allocate {shape}")
            return super().zeros(shape, *a, **kw)

    with pytest.raises(ReflexError, match=r"model state of 1000000000 tokens: give a smaller "
                                          r"context \(-c\)"):
        State(HYBRID, Small(), n_cells=10**9)
    assert State(HYBRID, Small(), n_cells=1000).n_cells == 1000


def test_append_continues_a_sequence():
    st = State(attention_kv_spec(1, 1, 2), NumpyOps(), 8)
    a = st.append([5, 6, 7])
    b = st.append([8])
    assert (a.cell0, a.positions, a.mask.prefix_end) == (0, (0, 1, 2), (1, 2, 3))
    assert (b.cell0, b.positions, b.mask.visible(0)) == (3, (3,), [0, 1, 2, 3])
    assert st.n_used == 4 and st.position(0) == 4 and b.seq_ids == (0,)
    with pytest.raises(ReflexError, match="context is full: 9 tokens needed, 8 cells"):
        st.append([1] * 5)


def test_fork_copies_per_sequence_buffers_and_branches_see_their_own_cells():
    ops = NumpyOps()
    st = State(HYBRID, ops, 16, 3)
    st.append([1, 2, 3])
    st["conv.1"][0] = 7.0
    st["ssm.1"][0] = np.arange(32, dtype=np.float32).reshape(2, 4, 4)
    st.fork(0, 1)
    st.fork(0, 2)
    assert (st["conv.1"][1] == 7).all() and np.array_equal(st["ssm.1"][2], st["ssm.1"][0])
    st["conv.1"][1] = 1.0  # the copies are independent
    assert (st["conv.1"][0] == 7).all()
    b = st.append_branches({1: [10, 11], 2: [20]})
    assert b.seq_ids == (1, 1, 2) and b.positions == (3, 4, 3) and b.cell0 == 3
    assert b.mask.visible(1) == [0, 1, 2, 3, 4]
    assert b.mask.visible(2) == [0, 1, 2, 5]  # the prompt and itself, not sequence 1's cells
    # sequence 1 saw one range (prompt + its own cells): it grows as a second range after
    # sequence 2's cell; then sequence 2, with its own range already, cannot grow any more
    c = st.append([12], seq=1)
    assert c.mask.visible(0) == [0, 1, 2, 3, 4, 6] and st.position(1) == 6
    with pytest.raises(ReflexError, match="sequence 2 cannot grow"):
        st.append([21], seq=2)
    assert st.n_used == 7 and st.position(2) == 4  # the refused batch changed nothing
    with pytest.raises(ReflexError, match="cannot be forked"):
        st.fork(1, 2)


def test_tree_batch_needs_attention_state():
    st = State(HYBRID, NumpyOps(), 16, 3)
    with pytest.raises(ReflexError, match="recurrent"):
        st.append_tree([1, 2], {1: [3]})


def test_snapshot_restore_rewinds_everything():
    ops = NumpyOps()
    st = State(HYBRID, ops, 16, 2)
    st.append([1, 2, 3])
    st["ssm.1"][0] = 2.0
    snap = st.snapshot()
    st["ssm.1"][0] = 9.0
    st.fork(0, 1)
    st.append_branches({1: [4, 5]})
    st.restore(snap)
    assert st.n_used == 3 and st.position(0) == 3 and st.position(1) == 0
    assert (st["ssm.1"][0] == 2.0).all() and (st["ssm.1"][1] == 0.0).all()
    again = st.append([4])  # the cells after the snapshot are written again
    assert again.cell0 == 3 and again.mask.visible(0) == [0, 1, 2, 3]


def test_dump_load_round_trip_and_mismatches():
    ops = NumpyOps()
    rng = np.random.default_rng(11)
    st = State(HYBRID, ops, 12, 2)
    st.append([1, 2, 3, 4])
    for _, a in st.buffers():
        a[...] = rng.standard_normal(a.shape).astype(np.float32)
    st.fork(0, 1)
    st.append_branches({1: [9]})
    d = st.dump()
    assert d["n_cells_used"] == 5 and d["dtype"] == "f32"
    assert len(d["data"]["k.0"]) == 5 * 2 * 4 * 4  # the used cells only
    back = State.load(HYBRID, ops, d, n_cells=20)
    assert back.n_cells == 20 and back.n_used == 5 and back.position(1) == 5
    for (b, a), (_, c) in zip(st.buffers(), back.buffers()):
        n = 5 if b.per_token else 2
        np.testing.assert_array_equal(a[:n], c[:n])
    assert back.append([7], seq=1).mask.visible(0) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ReflexError, match="another model layout"):
        State.load(attention_kv_spec(1, 2, 4), ops, d, 20)
    with pytest.raises(ReflexError, match="holds 5 cells, more than the 4"):
        State.load(HYBRID, ops, d, 4)
    with pytest.raises(ReflexError, match="holds f16 buffers"):
        State.load(HYBRID, ops, {**d, "dtype": "f16"}, 20)
    bad = {**d, "data": {**d["data"], "k.0": d["data"]["k.0"][:-4]}}
    with pytest.raises(ReflexError, match="does not fill"):
        State.load(HYBRID, ops, bad, 20)
