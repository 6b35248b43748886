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
