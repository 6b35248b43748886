"""The cold-path weight upload: chunked host registration + async copies on several streams."""

from __future__ import annotations

import mmap

import pytest


@pytest.mark.parametrize("offset,chunk,threads", [(0, 1 << 20, 3), (7, 1 << 20, 4),
                                                  (4096, 1 << 16, 2), (100_003, 3 << 20, 1),
                                                  (5, 64 << 20, 4)])
def test_upload_host_region_exact(cuda_device, tmp_path, rng, offset, chunk, threads):
    from reflex_core.cuda import memory, upload

    data = rng.bytes((5 << 20) + 12345)
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    with open(p, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        n = len(data) - offset - 3
        d = memory.mem_alloc_raw(n)
        try:
            info = upload.upload_host_region(d, mm, offset, n, chunk=chunk, threads=threads)
            try:
                assert bytes(memory.dtoh(d, n)) == data[offset:offset + n]
                assert info["method"] in ("registered", "mixed", "pageable")
                assert info["chunks"] >= 1 and 1 <= info["threads"] <= threads
            finally:
                info["registration"].release()
        finally:
            memory.mem_free_raw(d)
        mm.close()


def test_attach_without_waiting_then_forward(cuda_device, model_files):
    """attach(wait=False): weights bind while the copy runs; results equal a waited attach."""
    import numpy as np

    from reflex_core.backends import get_backend
    from reflex_core.gguf import open_gguf
    from reflex_core.registry import get_host
    from reflex_core.testing.modelwriter import ModelShape

    path = model_files(ModelShape(), weight_type="Q8_0", seed=9)
    g = open_gguf(path)
    cls = get_host().resolve("qwen3").load_model_class()
    out = []
    for wait in (True, False):
        ops = get_backend("cuda")
        ops.attach(g, wait=wait)
        m = cls.load(g, ops)
        ops.wait_attached()
        st = m.new_state(5)
        out.append(ops.to_numpy(m.forward(st.append([1, 2, 3, 4, 5]), st, [4])))
        ops.release()
    assert np.array_equal(out[0], out[1])
