"""The prefill GEMM on float16 pairs, per Qwen3 shape, on the GPU (a benchmark, not a test). For
each shape (T random x rows, random weights of the type) it times, as the backend pays them a
launch: the x-halves tile that serves shorter prompts (reflex_matmul_xh_<t> + reflex_x_halves;
the integer-view types), the pairs path with three terms and with one (reflex_unpack_pairs_<t> +
reflex_matmul_f16x{3,1} + reflex_x_pairs), and each GEMM alone in both forms. Milliseconds a
launch are the median of 3 timings of 10 launches; TFLOP/s counts 2 T n_in n_out of the GEMM
alone. Prints the largest difference of each path from the float64 product over the largest
output, from a host copy of a few rows.

usage: python bench/pairs_lab.py [--T 1518] [--types q4_k,q6_k,q8_0]
"""

from __future__ import annotations

import argparse

import numpy as np
from labkit import median_ms

# type -> (ggml type, QK, block bytes, f16 scale offsets)
TYPES = {"q4_k": (12, 256, 144, (0, 2)), "q6_k": (14, 256, 210, (208,)), "q8_0": (8, 32, 34, (0,)),
         "f32": (0, 1, 4, ())}
# (label, n_in, n_outs, swiglu)
SHAPES = {"q4_k": [("8B qkv", 4096, (4096, 1024, 1024), False), ("8B o", 4096, (4096,), False),
                   ("8B gate/up", 4096, (12288,), True), ("8B down", 12288, (4096,), False),
                   ("30B qkv", 2048, (4096, 512, 512), False), ("30B o", 4096, (2048,), False)],
          "f32": [("30B router", 2048, (128,), False)],
          "q6_k": [("8B down", 12288, (4096,), False)],
          "q8_0": [("0.6B qkv", 1024, (2048, 1024, 1024), False), ("0.6B o", 2048, (1024,), False),
                   ("0.6B gate/up", 1024, (3072,), True), ("0.6B down", 3072, (1024,), False)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1518)
    ap.add_argument("--types", default=",".join(TYPES))
    a = ap.parse_args()
    from reflex_core.cuda import driver, memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    common = modules.get_kernels(quant_ops.COMMON_MODULE)
    core = modules.get_kernels("core")
    rng = np.random.default_rng(12)
    T = a.T
    print(f"T={T}; ms a launch (TFLOP/s of the GEMM alone)")
    for v in a.types.split(","):
        t, QK, ts, f16 = TYPES[v]
        for label, n_in, n_outs, swiglu in SHAPES[v]:
            n3 = tuple(n_outs) + (0,) * (3 - len(n_outs))
            rows = quant_ops._weight_rows(n3, swiglu)
            wps, raws = [], []
            for n in rows:
                if QK == 1:  # float32 weights
                    blocks = rng.standard_normal(n * n_in).astype(np.float32).view(np.uint8)
                    blocks = blocks.reshape(-1, 4)
                else:
                    blocks = rng.integers(0, 256, size=(n * n_in // QK, ts), dtype=np.uint8)
                for o in f16:  # scales 2^-10 .. 2^-6, either sign
                    sc = rng.uniform(2**-10, 2**-6, len(blocks)) * rng.choice([-1, 1], len(blocks))
                    blocks[:, o:o + 2] = sc.astype(np.float16).view(np.uint8).reshape(-1, 2)
                wp = memory.alloc(blocks.nbytes)
                memory.htod(wp, blocks.tobytes())
                wps.append(wp)
                raws.append(blocks)
            w3 = tuple(wps) + (0,) * (3 - len(wps))
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            xp = memory.alloc(x.nbytes)
            memory.htod(xp, x.tobytes())
            p = quant_ops.plan(t, (n_in, n3[0]), wps[0])
            ys = [memory.alloc(4 * T * n) if n else 0 for n in (n3 if not swiglu else (n3[0], 0, 0))]
            outs = n3 if not swiglu else (n3[0], 0, 0)
            xh = memory.alloc(quant_ops.x_halves_bytes(T, n_in))
            xq = memory.alloc(quant_ops.x_pairs_bytes(T, n_in))
            sp = {k: memory.alloc(quant_ops.pairs_bytes(p, T, outs, swiglu, k)) for k in (3, 1)}
            kern = modules.get_kernels(quant_ops.module_of(t))

            def xh_tile(_i):
                quant_ops.x_halves(core, xp, xh, T, n_in)
                quant_ops.matmul_planned(kern, p, xp, T, w3, tuple(ys), outs, swiglu, True, xh)

            def pairs(terms, form=None):
                def go(_i):
                    quant_ops.x_pairs(core, xp, xq, T, n_in)
                    quant_ops.matmul_pairs(kern, common, p, xq, T, w3, tuple(ys), outs, swiglu,
                                           sp[terms], form=form, terms=terms)
                return go

            def gemm(terms, form):
                name = f"reflex_matmul_f16x{terms}{form}"
                smem = quant_ops.pairs_smem_bytes(form, terms)
                common.allow_shmem(name, smem)
                ptrs, off = [], sp[terms]
                for n in rows:
                    ptrs.append(off)
                    off += quant_ops._pairs_slot_bytes(n, n_in, terms)
                ptrs += [0] * (3 - len(ptrs))

                def go(_i):
                    common.launch(name, (quant_ops._pairs_blocks(form, T, outs, swiglu), 1, 1),
                                  (quant_ops._PAIRS_FORMS[form][2], 1, 1),
                                  (ptrs[0], ptrs[1], ptrs[2], xq, ys[0], ys[1], ys[2], T, n_in,
                                   outs[0], outs[1], outs[2], 2 * n_in, 1 if swiglu else 0), smem)
                return go

            flop = 2.0 * T * n_in * sum(rows)
            line = [f"{v} {label}:"]
            results = {}
            paths = (("xh", xh_tile),) if t in quant_ops.XH_TYPES else ()
            for tag, fn in paths + (("pairs3", pairs(3)), ("pairs1", pairs(1))):
                ms = median_ms(fn, 10)
                driver.synchronize()
                results[tag] = [np.frombuffer(memory.dtoh(y, 4 * T * n), np.float32).reshape(T, n)
                                for y, n in zip(ys, outs) if n]
                line.append(f"{tag} {ms:.3f}")
            for terms in (3, 1):
                pairs(terms)(0)
                for form in ("", "_64"):
                    ms = median_ms(gemm(terms, form), 10)
                    line.append(f"f16x{terms}{form} {ms:.3f} ({flop / ms / 1e9:.0f})")
            print("  ".join(line))
            # accuracy on 4 output rows of the first output, against float64
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize
            qt = GGMLQuantizationType(t)
            cols = [0, 1, outs[0] // 2, outs[0] - 1]
            if swiglu:
                continue  # the SwiGLU outputs are not a product to compare
            wrow = dequantize(raws[0].reshape(rows[0], -1)[cols], qt).reshape(len(cols), n_in)
            ref = x.astype(np.float64) @ wrow.astype(np.float64).T
            big = np.abs(ref).max()
            acc = "  ".join(f"{tag} {np.abs(r[0][:, cols] - ref).max() / big:.2e}"
                            for tag, r in results.items())
            print(f"    max |diff| / max |ref| over rows {cols}: {acc}")
            for ptr in wps + [xp, xh, xq, sp[3], sp[1]] + [y for y in ys if y]:
                memory.free(ptr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
