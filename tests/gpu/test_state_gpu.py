"""The state contract on the GPU: buffers allocated by CudaOps, forks and snapshots as device
copies, and dump/load across backends (a state written on the GPU loads on the CPU and back)."""

from __future__ import annotations

import numpy as np

from reflex_core.state import BufferSpec, State, StateSpec, ViewSpec, attention_kv

SPEC = StateSpec(attention_kv(0, 2, 8, 6) + (
    BufferSpec("conv.1", (3, 33), per_token=False),
    BufferSpec("ssm.1", (2, 16, 16), per_token=False),
    BufferSpec("kv.2", (40,), per_token=True, views=(ViewSpec("v.2", 0, 32),)),
))


def _fill(ops, st, rng):
    for _, buf in st.buffers():
        st.ops.copy_rows(buf, 0, ops.from_numpy(rng.standard_normal(buf.shape).astype(np.float32)),
                         0, buf.shape[0])


def test_fork_snapshot_restore_on_device(cuda_ops, rng):
    st = State(SPEC, cuda_ops, 12, 3)
    assert all(not cuda_ops.to_numpy(b).any() for _, b in st.buffers())  # zeroed
    _fill(cuda_ops, st, rng)
    st.append([1, 2, 3])
    before = {b.name: cuda_ops.to_numpy(a) for b, a in st.buffers()}
    st.fork(0, 2)
    ssm = cuda_ops.to_numpy(st["ssm.1"])
    np.testing.assert_array_equal(ssm[2], before["ssm.1"][0])
    np.testing.assert_array_equal(ssm[1], before["ssm.1"][1])  # other slots untouched
    snap = st.snapshot()
    cuda_ops.copy_rows(st["conv.1"], 0, cuda_ops.zeros((1, 3, 33)), 0, 1)
    st.append_branches({2: [4, 5]})
    st.restore(snap)
    np.testing.assert_array_equal(cuda_ops.to_numpy(st["conv.1"])[0], before["conv.1"][0])
    assert st.n_used == 3 and st.position(2) == 3


def test_dump_on_gpu_loads_on_cpu_and_back(cuda_ops, ref_ops, rng):
    st = State(SPEC, cuda_ops, 10, 2)
    _fill(cuda_ops, st, rng)
    st.append([1, 2, 3, 4])
    st.fork(0, 1)
    st.append_branches({1: [5]})
    d = st.dump()
    cpu = State.load(SPEC, ref_ops, d, 16)
    for (b, a), (_, c) in zip(st.buffers(), cpu.buffers()):
        n = 5 if b.per_token else 2
        np.testing.assert_array_equal(cuda_ops.to_numpy(a)[:n], c[:n])
    back = State.load(SPEC, cuda_ops, cpu.dump(), 7)
    for (b, a), (_, c) in zip(st.buffers(), back.buffers()):
        n = 5 if b.per_token else 2
        np.testing.assert_array_equal(cuda_ops.to_numpy(a)[:n], cuda_ops.to_numpy(c)[:n])
    assert back.position(1) == 5 and back.append([6], 1).mask.visible(0) == [0, 1, 2, 3, 4, 5]
