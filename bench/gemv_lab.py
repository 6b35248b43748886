"""One-token GEMV forms side by side on the GPU (a benchmark, not a test): the module's
gemv1ws (float x from global memory) and gemv1x (x limbs staged in shared memory, 8 warps a
block) against the block shapes of bench/gemv_lab.cu (compiled here with nvcc), on random
K-quant and Q8_0 weights of the Qwen3 shapes. Launches of a few us are bound by the launch rate
here (one Python launch after another), not by the kernel: compare those with Nsight Compute.
Each launch cycles through copies of the weights that together exceed the L2, so
every byte comes from HBM; microseconds a launch are the median of 3 timings of 40 launches.
Each form's outputs are compared with gemv1ws's: bits equal, or the largest relative
difference.

usage: python bench/gemv_lab.py [--ncu]   (--ncu: one shape, two launches of each form, for
Nsight Compute's sections)"""

from __future__ import annotations

import sys

import numpy as np
from labkit import device_copies, gemv_args, load_lab, median_ms, random_blocks

SIG = "PPPPPPPiiiiiqi"
# (label, n_in, n_out, swiglu)
SHAPES = [("8B o", 4096, 4096, False), ("8B qk", 4096, 5120, False),
          ("8B gate/up", 4096, 12288, True), ("8B down", 12288, 4096, False),
          ("30B qkv", 2048, 5120, False), ("30B o", 4096, 2048, False)]
Q8_SHAPES = [("0.6B qkv", 1024, 4096, False), ("0.6B o", 2048, 1024, False),
             ("0.6B gate/up", 1024, 3072, True), ("0.6B down", 3072, 1024, False),
             ("0.6B head", 1024, 151936, False), ("8B o", 4096, 4096, False),
             ("8B gate/up", 4096, 12288, True), ("8B down", 12288, 4096, False)]
# form -> (KS, R, WARPS); "ws" and "x" are the module's kernels
FORMS = {"ws": (2, 4, 4), "x": (2, 4, 8), "x16": (2, 4, 16), "x8k4": (4, 4, 8)}
Q8_FORMS = {"ws": (2, 4, 4), "w8k2": (2, 4, 8), "w4k4": (4, 4, 4), "w8k4": (4, 4, 8),
            "w8k8": (8, 4, 8), "w16k8": (8, 4, 16), "w8k4r2": (4, 2, 8)}
# type -> (id, QK, bytes a block, offsets of its f16 scales, shapes, forms)
TYPES = {"q4_k": (12, 256, 144, (0, 2), SHAPES, FORMS),
         "q6_k": (14, 256, 210, (208,), SHAPES, FORMS),
         "q8_0": (8, 32, 34, (0,), Q8_SHAPES, Q8_FORMS)}


def main() -> int:
    ncu = "--ncu" in sys.argv
    from reflex_core.cuda import driver, memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    names = [f"lab_{f}_{t}" for t, v in TYPES.items() for f in v[5] if f not in ("ws", "x")]
    lab = load_lab("gemv_lab.cu", {n: SIG for n in names})
    core = modules.get_kernels(quant_ops.COMMON_MODULE)
    rng = np.random.default_rng(7)
    for tname, (t, qk, ts, f16, shapes, forms) in TYPES.items():
        for label, n_in, n_out, swiglu in (shapes[2:3] if ncu else shapes):
            nb = n_in // qk
            rows = 2 * n_out if swiglu else n_out
            wbytes = random_blocks(rng, rows * nb, ts, f16)
            wps = device_copies(wbytes, 1 if ncu else 256 << 20)
            copies = len(wps)
            x = rng.standard_normal(n_in).astype(np.float32)
            xp = memory.alloc(4 * n_in)
            memory.htod(xp, x.tobytes())
            yp = memory.alloc(4 * rows)
            rb = nb * ts
            half = n_out * rb
            ref = None
            line = []
            for form, (ks, r, warps) in forms.items():
                if form == "ws":
                    kern, name, smem = core, f"reflex_matmul_gemv1ws_{tname}", 0
                elif form == "x":
                    kern, name = core, f"reflex_matmul_gemv1x_{tname}"
                    smem = quant_ops.x_staged_bytes(t, n_in)
                else:
                    kern, name = lab, f"lab_{form}_{tname}"
                    smem = quant_ops.x_staged_bytes(t, n_in) if t in quant_ops.XS_CHUNK else 0
                if smem:
                    kern.allow_shmem(name, smem)
                per_block = warps // ks * (r // 2 if swiglu else r)
                grid = -(-n_out // per_block)

                def launch(w):
                    kern.launch(name, (grid, 1, 1), (32 * warps, 1, 1),
                                gemv_args(w, half, xp, yp, n_in, n_out, rb, swiglu), smem)

                launch(wps[0])
                driver.synchronize()
                y = np.frombuffer(bytes(memory.dtoh(yp, 4 * n_out)), np.float32).copy()
                if ref is None:
                    ref, same = y, "ref"
                elif np.array_equal(y.view(np.uint32), ref.view(np.uint32)):
                    same = "bits="
                else:
                    same = f"rel {np.max(np.abs(y - ref)) / np.max(np.abs(ref)):.1e}"
                if ncu:
                    launch(wps[0])
                    driver.synchronize()
                    continue
                us = 1e3 * median_ms(lambda i: launch(wps[i % copies]), 40)
                line.append(f"{form} {us:6.1f} us {len(wbytes) / us / 1e3:5.0f} GB/s ({same})")
            if line:
                print(f"{tname} {label:11s} {n_in}x{rows}: " + " | ".join(line), flush=True)
            for p in wps + [xp, yp]:
                memory.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
