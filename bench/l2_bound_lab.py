"""How fast the module's one-token K-quant GEMV (reflex_matmul_gemv1x_<t>) runs when its weights
already sit in the L2, against the same launches from HBM (a benchmark, not a test).

If the L2-resident launch is not much faster than the HBM one, the kernel's own chain (the wait,
x staged, the unit iterations, the sums) bounds it and no prefetching of the weights can help; if
it is much faster, the HBM's idle time between and inside the launches is what a prefetch could
fill. Launches are captured in a CUDA graph (40 a replay), so the launch rate does not bound
them; "pdl" captures them with programmatic stream serialization as the decode step does.
Microseconds a launch: the median of 3 replays.

usage: python bench/l2_bound_lab.py
"""

from __future__ import annotations

import sys

import numpy as np
from labkit import device_copies, gemv_args, graph_us, random_blocks

N = 40
# (label, n_in, n_out, swiglu): a Qwen3-8B layer's launches, and parts of them that fit the L2
SHAPES = [("o", 4096, 4096, False), ("gate/up 1/3", 4096, 4096, True),
          ("gate/up", 4096, 12288, True), ("down 1/2", 12288, 2048, False),
          ("down", 12288, 4096, False)]
TYPES = {"q4_k": (12, 256, 144, (0, 2)), "q6_k": (14, 256, 210, (208,))}


def main() -> int:
    from reflex_core.cuda import memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    core = modules.get_kernels(quant_ops.COMMON_MODULE)
    rng = np.random.default_rng(7)
    for tname, (t, qk, ts, f16) in TYPES.items():
        name = f"reflex_matmul_gemv1x_{tname}"
        for label, n_in, n_out, swiglu in SHAPES:
            nb = n_in // qk
            rows = 2 * n_out if swiglu else n_out
            wbytes = random_blocks(rng, rows * nb, ts, f16)
            wps = device_copies(wbytes, 400 << 20)
            copies = len(wps)
            xp = memory.alloc(4 * n_in)
            memory.htod(xp, rng.standard_normal(n_in).astype(np.float32).tobytes())
            yp = memory.alloc(4 * rows)
            rb = nb * ts
            half = n_out * rb
            smem = quant_ops.x_staged_bytes(t, n_in)
            core.allow_shmem(name, smem)
            grid = -(-n_out // (8 // 2 * (2 if swiglu else 4)))
            line = []
            for mode in ("hbm", "l2"):
                for pdl in (False, True):
                    def launch(i, mode=mode):
                        w = wps[i % copies] if mode == "hbm" else wps[0]
                        core.launch(name, (grid, 1, 1), (256, 1, 1),
                                    gemv_args(w, half, xp, yp, n_in, n_out, rb, swiglu), smem)

                    us = graph_us(launch, N, pdl)
                    line.append(f"{mode}{'+pdl' if pdl else ''} {us:6.2f} us "
                                f"{len(wbytes) / us / 1e3:5.0f} GB/s")
            print(f"{tname} {label:12s} {len(wbytes) / 1e6:5.1f} MB: " + " | ".join(line),
                  flush=True)
            for p in wps + [xp, yp]:
                memory.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
