"""The persistent bulk-copy Q4_K GEMV of bench/tma_gemv_lab.cu against the module's gemv1x (a
benchmark, not a test): us a launch from HBM (launches cycle through copies of the weights that
together exceed the L2), 40 launches captured in a CUDA graph, with programmatic stream
serialization as in the decode step; the median of 3 replays. Each form's outputs against
gemv1x's: the largest difference relative to the largest output.

usage: python bench/tma_gemv_lab.py
"""

from __future__ import annotations

import sys

import numpy as np
from labkit import device_copies, gemv_args, graph_us, load_lab, random_blocks

SIG = "PPPPPPPiiiiiqi"
SHAPES = [("8B o", 4096, 4096, False), ("8B q+k", 4096, 5120, False),
          ("8B gate/up 1/3", 4096, 4096, True), ("8B gate/up", 4096, 12288, True)]
# name -> (compute warps, rows a warp, stages, blocks an SM)
FORMS = {"w8r2s4b1": (8, 2, 4, 1), "w8r2s2b2": (8, 2, 2, 2), "w16r2s2b1": (16, 2, 2, 1),
         "w8r4s2b1": (8, 4, 2, 1), "w4r2s4b2": (4, 2, 4, 2), "w4r2s2b3": (4, 2, 2, 3),
         "w6r2s2b3": (6, 2, 2, 3), "w12r2s3b1": (12, 2, 3, 1)}
N = 40
# forms also timed in parts: the copies alone, the compute alone
PARTS = ("w8r2s4b1", "w16r2s2b1", "w6r2s2b3")


def main() -> int:
    from reflex_core.cuda import driver, memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    lab = load_lab("tma_gemv_lab.cu", {f"lab_tma_{f}{p}": SIG for f in FORMS
                                       for p in ("", "_copy", "_math")})
    lab.package = modules.CORE_PACKAGE  # launched with PDL like the core's kernels
    core = modules.get_kernels(quant_ops.COMMON_MODULE)
    sms = core.multiprocessors()
    rng = np.random.default_rng(7)
    t, qk, ts = 12, 256, 144
    for label, n_in, n_out, swiglu in SHAPES:
        nb = n_in // qk
        rows = 2 * n_out if swiglu else n_out
        wbytes = random_blocks(rng, rows * nb, ts, (0, 2))
        wps = device_copies(wbytes, 400 << 20)
        copies = len(wps)
        xp = memory.alloc(4 * n_in)
        memory.htod(xp, rng.standard_normal(n_in).astype(np.float32).tobytes())
        yp = memory.alloc(4 * n_out)
        rb = nb * ts
        half = n_out * rb
        xb = quant_ops.x_staged_bytes(t, n_in)
        ref = None
        line = []
        forms = [("gemv1x", None)] + [(f + p, v) for f, v in FORMS.items()
                                      for p in ("", "_copy", "_math") if f in PARTS or not p]
        for form, shape in forms:
            if shape is None:
                kern, name, smem = core, "reflex_matmul_gemv1x_q4_k", xb
                block, grid = 256, -(-n_out // (8 if swiglu else 16))
            else:
                warps, r, s, bps = shape
                per_tile = warps * r // 2 if swiglu else warps * r
                kern, name = lab, f"lab_tma_{form}"
                smem = ((xb + 16 * s + 127) & ~127) + s * warps * r * rb
                block, grid = 32 * (warps + 1), min(-(-n_out // per_tile), sms * bps)
            kern.allow_shmem(name, smem)

            def launch(i, kern=kern, name=name, grid=grid, block=block, smem=smem):
                args = gemv_args(wps[i % copies], half, xp, yp, n_in, n_out, rb, swiglu)
                kern.launch(name, (grid, 1, 1), (block, 1, 1), args, smem)

            memory.memset(yp, 0, 4 * n_out)
            launch(0)
            driver.synchronize()
            y = np.frombuffer(bytes(memory.dtoh(yp, 4 * n_out)), np.float32).copy()
            if ref is None:
                ref, same = y, "ref"
            elif form.endswith(("_copy", "_math")):
                same = "-"
            else:
                same = f"{np.max(np.abs(y - ref)) / np.max(np.abs(ref)):.0e}"
            us = graph_us(launch, N, pdl=True)
            line.append(f"{form} {us:5.1f} ({len(wbytes) / us / 1e3:4.0f} GB/s, {same})")
        print(f"{label:15s} {len(wbytes) / 1e6:5.1f} MB: " + " | ".join(line), flush=True)
        for p in wps + [xp, yp]:
            memory.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
