"""What the GPU labs (bench/gemv_lab.py, attention_lab.py, pairs_lab.py) share: compiling a
lab's .cu file for this GPU and loading it as a kernel module, and timing launches."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_lab(cu: str, signatures: dict):
    """bench/<cu> compiled with nvcc for sm_90 against cuda/include, loaded as module "lab" with
    the given kernel signatures."""
    from reflex_core.cuda import driver, modules

    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "lab.cubin"
        subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O3", "-arch=sm_90", "-I",
                        str(ROOT / "cuda" / "include"), str(ROOT / "bench" / cu), "-o",
                        str(cubin)], check=True)
        handle = driver.check(driver._d.cuModuleLoadData(cubin.read_bytes()), "cuModuleLoadData")
    return modules.Kernels("lab", "lab", handle, "sass", signatures)


def median_ms(launch, n: int, reps: int = 3) -> float:
    """The median over ``reps`` timings of ``n`` calls of ``launch``, ms a call (CUDA events)."""
    from reflex_core.cuda import memory

    times = []
    for _ in range(reps):
        e0, e1 = memory.Event(), memory.Event()
        e0.record()
        for i in range(n):
            launch(i)
        e1.record()
        times.append(memory.elapsed_ms(e0, e1) / n)
    return sorted(times)[len(times) // 2]


def graph_us(launch, n: int, pdl: bool = False, reps: int = 3) -> float:
    """``launch(i)`` for i < n captured once in a CUDA graph (``pdl``: the core's kernels with
    programmatic stream serialization, as a decode step's), the graph replayed reps + 1 times;
    the median of the last reps, us a launch. The launch rate of Python does not enter."""
    from reflex_core.cuda import driver, memory, modules

    d = driver._d
    stream = driver.check(d.cuStreamCreate(0), "cuStreamCreate")
    saved = driver._STREAM
    driver._STREAM, modules.pdl = stream, pdl
    try:
        driver.check(d.cuStreamBeginCapture(
            stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
        for i in range(n):
            launch(i)
        graph = driver.check(d.cuStreamEndCapture(stream), "cuStreamEndCapture")
        ex = driver.check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        times = []
        for _ in range(reps + 1):
            e0, e1 = memory.Event(), memory.Event()
            e0.record()
            driver.check(d.cuGraphLaunch(ex, stream), "cuGraphLaunch")
            e1.record()
            times.append(memory.elapsed_ms(e0, e1) * 1e3 / n)
        driver.check(d.cuGraphExecDestroy(ex), "cuGraphExecDestroy")
        driver.check(d.cuGraphDestroy(graph), "cuGraphDestroy")
    finally:
        driver._STREAM, modules.pdl = saved, False
        driver.check(d.cuStreamDestroy(stream), "cuStreamDestroy")
    return sorted(times[1:])[len(times[1:]) // 2]


def random_blocks(rng, n_blocks: int, ts: int, f16_offsets) -> bytes:
    """``n_blocks`` quantized blocks of ``ts`` random bytes whose float16 scales (at the given
    byte offsets) are 2^-10 .. 2^-6, either sign: finite weights of a lab's shapes."""
    import numpy as np

    blocks = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in f16_offsets:
        v = rng.uniform(2**-10, 2**-6, n_blocks) * rng.choice([-1, 1], n_blocks)
        blocks[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.tobytes()


def device_copies(data: bytes, at_least: int) -> list[int]:
    """Device copies of ``data``, at least two and together at least ``at_least`` bytes: launches
    that cycle through them read every byte from HBM, not the L2."""
    from reflex_core.cuda import memory

    ptrs = []
    for _ in range(max(2, -(-at_least // len(data)))):
        p = memory.alloc(len(data))
        memory.htod(p, data)
        ptrs.append(p)
    return ptrs


def gemv_args(w: int, half: int, x: int, y: int, n_in: int, n_out: int, row_bytes: int,
              swiglu: bool) -> tuple:
    """A one-token GEMV launch's RX_MM_PARAMS for ``n_out`` rows of ``row_bytes`` at ``w``
    (``swiglu``: the gate rows there, the up rows ``half`` bytes on, mode 1; else mode 0)."""
    if swiglu:
        return (w, w + half, 0, x, y, 0, 0, 1, n_in, n_out, 0, 0, row_bytes, 1)
    return (w, 0, 0, x, y, 0, 0, 1, n_in, n_out, 0, 0, row_bytes, 0)
