"""``reflex smoke``: start CUDA, run one core kernel and check its result exactly."""

from __future__ import annotations

import struct
import time

from ..errors import CudaError
from . import memory, modules
from .start import start


def smoke() -> dict:
    """Initialise (through :mod:`.start`), load the core module, add two 1027-float vectors on
    the GPU and check the result exactly. Returns {"device", "sm", "image", "driver_version",
    "ms"}. Raises CudaUnavailable / CudaError (one line) when anything is wrong."""
    t0 = time.perf_counter()
    dev = start().wait()
    k = modules.get_kernels("core")
    n = 1027
    a = struct.pack(f"<{n}f", *[float(i) for i in range(n)])
    b = struct.pack(f"<{n}f", *[0.5 * i - 3.0 for i in range(n)])
    pa, pb, py = memory.alloc(4 * n), memory.alloc(4 * n), memory.alloc(4 * n)
    try:
        memory.htod(pa, a)
        memory.htod(pb, b)
        memory.memset(py, 0xFF, 4 * n)
        k.launch("reflex_add", (n + 255) // 256, 256, (pa, pb, py, n))
        got = struct.unpack(f"<{n}f", bytes(memory.dtoh(py, 4 * n)))
    finally:
        for p in (pa, pb, py):
            memory.free(p)
    want = [float(i) + (0.5 * i - 3.0) for i in range(n)]
    bad = [i for i in range(n) if got[i] != want[i]]
    if bad:
        i = bad[0]
        raise CudaError(f"smoke test: reflex_add gave wrong results at {len(bad)} of {n} "
                        f"elements (first: [{i}] = {got[i]}, expected {want[i]})")
    return {"device": dev.name, "sm": dev.sm, "image": k.image,
            "driver_version": dev.driver_version, "ms": (time.perf_counter() - t0) * 1e3}
