"""The prefill's attention kernels side by side on the GPU (a benchmark, not a test): the core
module's float32 query tiles (reflex_attention_tiled128/256) and tensor-core tiles
(reflex_attention_mma128/256, after reflex_kv_halves) against the tile shapes of
bench/attention_lab.cu (compiled here with nvcc), on a causal prompt of T tokens over random q,
K and V. The tensor-core forms' times include reflex_kv_halves'. Milliseconds a launch are the
median of 3 timings of 5 launches; each output is compared with the float32 tiles' (the largest
difference over the largest value).

usage: python bench/attention_lab.py [--T 1518]"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from labkit import load_lab, median_ms

SIG = "PPPPPPPiiiiif"
# form -> (DMAX, warps, cells a tile): bench/attention_lab.cu's lab_<form>
FORMS = {"w8k32": (128, 8, 32), "w4k32": (128, 4, 32), "w4k64": (128, 4, 64),
         "w8k64": (128, 8, 64), "w4k16": (128, 4, 16), "d256w4k32": (256, 4, 32),
         "d256w4k16": (256, 4, 16), "d256w2k16": (256, 2, 16)}
SHAPES = [("8B", 32, 8, 128), ("0.6B", 16, 8, 128), ("d256", 16, 4, 256)]  # (label, H, H_kv, d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1518)
    T = ap.parse_args().T
    from reflex_core.cuda import driver, memory, modules
    from reflex_core.cuda.start import start

    start().wait()
    lab = load_lab("attention_lab.cu", {f"lab_{f}": SIG for f in FORMS})
    core = modules.get_kernels("core")
    rng = np.random.default_rng(5)
    own_end = np.arange(1, T + 1, dtype=np.int32)
    zeros = np.zeros(T, np.int32)
    masks = []
    for a in (zeros, zeros, own_end):  # prefix_end, own_start, own_end: causal from cell 0
        p = memory.alloc(a.nbytes)
        memory.htod(p, a.tobytes())
        masks.append(p)
    for label, H, Hkv, d in SHAPES:
        arrs = [rng.standard_normal((T, H, d)).astype(np.float32),
                rng.standard_normal((T, Hkv, d)).astype(np.float32),
                rng.standard_normal((T, Hkv, d)).astype(np.float32)]
        ptrs = []
        for a in arrs:
            p = memory.alloc(a.nbytes)
            memory.htod(p, a.tobytes())
            ptrs.append(p)
        out = memory.alloc(4 * T * H * d)
        args = (ptrs[0], ptrs[1], ptrs[2], out, masks[0], masks[1], masks[2], T, H, Hkv, d, d,
                float(d) ** -0.5)
        halves = memory.alloc(8 * T * Hkv * d)  # K and V pairs (DMAX = d here)
        kh, vh = halves, halves + 4 * T * Hkv * d
        hargs = (ptrs[0], kh, vh) + args[3:]
        ref, line = None, []
        forms = [("tiled", None)] + [("mma", None)] + [(f, FORMS[f]) for f in FORMS if FORMS[f][0] == d]
        for form, shape in forms:
            if form == "tiled":
                kern, name, grid, threads, smem = core, f"reflex_attention_tiled{d}", (H, -(-T // (32 if d == 128 else 16))), 256, 0
            else:
                dmax, w, bk = shape or ((128, 8, 32) if d == 128 else (256, 4, 16))
                kern, name = (core, f"reflex_attention_mma{d}") if shape is None else (lab, f"lab_{form}")
                grid, threads, smem = (H, -(-T // (16 * w))), 32 * w, 4 * (16 * w + 4 * bk) * (dmax + 8)
                if not kern.allow_shmem(name, smem):
                    line.append(f"{form} (no shmem)")
                    continue

            def launch(kern=kern, name=name, grid=grid, threads=threads, smem=smem,
                       tiled=form == "tiled"):
                if not tiled:
                    core.launch("reflex_kv_halves", (min(-(-T * Hkv * d // 512), 4096),), 256,
                                (ptrs[1], ptrs[2], kh, vh, T, Hkv, d, d, d))
                kern.launch(name, grid, threads, args if tiled else hargs, smem)

            launch()
            driver.synchronize()
            y = np.frombuffer(bytes(memory.dtoh(out, 4 * T * H * d)), np.float32).copy()
            if ref is None:
                ref, same = y, "ref"
            else:
                same = f"diff {np.max(np.abs(y - ref)) / np.max(np.abs(ref)):.1e}"
            ms = median_ms(lambda i: launch(), 5)
            line.append(f"{form} {ms:.3f} ms ({same})")
        print(f"{label} H={H}/{Hkv} d={d} T={T}: " + " | ".join(line), flush=True)
        for p in ptrs + [out, halves]:
            memory.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
