"""The prefill GEMM on float16 pairs with the products as Hopper wgmma (bench/wgmma_lab.cu,
compiled here for sm_90a) beside the module's reflex_matmul_f16x{3,1} (mma.sync), on the same
unpacked Q4_K weights and x pairs; a benchmark, not a test. Per shape: ms a launch of each GEMM
alone (median of 3 x 10), TFLOP/s (2 T n_in n), and the largest difference of the wgmma output
from the module's over the largest output.

usage: python bench/wgmma_lab.py [--T 1518]"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from labkit import ROOT, median_ms

SHAPES = [("8B qkv", 4096, 6144), ("8B o", 4096, 4096), ("8B gate+up", 4096, 24576),
          ("8B down", 12288, 4096), ("0.6B qkv", 1024, 4096), ("0.6B gate+up", 1024, 6144),
          ("0.6B down", 3072, 1024)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1518)
    a = ap.parse_args()
    from reflex_core.cuda import driver, memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "lab.cubin"
        subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O3", "-arch=sm_90a", "-I",
                        str(ROOT / "cuda" / "include"), str(ROOT / "bench" / "wgmma_lab.cu"),
                        "-o", str(cubin)], check=True)
        handle = driver.check(driver._d.cuModuleLoadData(cubin.read_bytes()), "cuModuleLoadData")
    # kernel -> (terms, tokens a block, stages)
    forms = {"lab_wg3_n128": (3, 128, 3), "lab_wg3_n128p": (3, 128, 3), "lab_wg3_n256p": (3, 256, 2),
             "lab_wg1_n128": (1, 128, 3), "lab_wg1_n128p": (1, 128, 4), "lab_wg1_n256p": (1, 256, 4)}
    lab = modules.Kernels("lab", "lab", handle, "sass", {k: "PqPPiii" for k in forms})
    common = modules.get_kernels(quant_ops.COMMON_MODULE)
    core = modules.get_kernels("core")
    kern = modules.get_kernels(quant_ops.module_of(12))
    smem = {k: (2 if t == 3 else 1) * st * (128 + bn) * 128 + 1024 for k, (t, bn, st) in forms.items()}
    for k in forms:
        assert lab.allow_shmem(k, smem[k]), k
    rng = np.random.default_rng(5)
    T = a.T
    for label, n_in, n in SHAPES:
        blocks = rng.integers(0, 256, size=(n * n_in // 256, 144), dtype=np.uint8)
        for o in (0, 2):
            sc = rng.uniform(2**-10, 2**-6, len(blocks)) * rng.choice([-1, 1], len(blocks))
            blocks[:, o:o + 2] = sc.astype(np.float16).view(np.uint8).reshape(-1, 2)
        wp = memory.alloc(blocks.nbytes)
        memory.htod(wp, blocks.tobytes())
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        xp = memory.alloc(x.nbytes)
        memory.htod(xp, x.tobytes())
        xq = memory.alloc(quant_ops.x_pairs_bytes(T, n_in))
        quant_ops.x_pairs(core, xp, xq, T, n_in)
        sp = memory.alloc(quant_ops._pairs_slot_bytes(n, n_in, 3))
        quant_ops.unpack_pairs(kern, wp, 12, sp, n, n_in)
        lo = quant_ops.pairs_lo_offset(n, n_in)
        y_mod, y_lab = memory.alloc(4 * T * n), memory.alloc(4 * T * n)
        flop = 2.0 * T * n_in * n
        line = [f"{label} {n_in}x{n}:"]
        for terms in (3, 1):
            name = f"reflex_matmul_f16x{terms}"
            ms_smem = quant_ops.pairs_smem_bytes("", terms)
            common.allow_shmem(name, ms_smem)

            def mod(_i):
                common.launch(name, (quant_ops._pairs_blocks("", T, (n, 0, 0), False), 1, 1),
                              (quant_ops._PAIRS_FORMS[""][2], 1, 1),
                              (sp, 0, 0, xq, y_mod, 0, 0, T, n_in, n, 0, 0, 2 * n_in, 0), ms_smem)

            mod(0)
            driver.synchronize()
            ym = np.frombuffer(memory.dtoh(y_mod, 4 * T * n), np.float32).copy()
            ms_m = median_ms(mod, 10)
            line.append(f"f16x{terms} {ms_m:.3f} ({flop / ms_m / 1e9:.0f})")
            for k, (t, bn, st) in forms.items():
                if t != terms:
                    continue

                def wg(_i, k=k, bn=bn):
                    lab.launch(k, (-(-n // 128), -(-T // bn), 1), (256, 1, 1),
                               (sp, lo, xq, y_lab, T, n_in, n), smem[k])

                memory.memset(y_lab, 255, 4 * T * n)  # NaN: an output left unwritten shows
                wg(0)
                driver.synchronize()
                yl = np.frombuffer(memory.dtoh(y_lab, 4 * T * n), np.float32)
                same = "=" if np.array_equal(ym.view(np.uint32), yl.view(np.uint32)) else (
                    f"{np.abs(ym.astype(np.float64) - yl).max() / np.abs(ym).max():.1e}")
                ms_w = median_ms(wg, 10)
                line.append(f"{k[7:]} {ms_w:.3f} ({flop / ms_w / 1e9:.0f}) {same}")
        print("  ".join(line), flush=True)
        for ptr in (wp, xp, xq, sp, y_mod, y_lab):
            memory.free(ptr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
