"""Prefill matmul tiles side by side on the GPU (a benchmark, not a test): the module's
reflex_matmul_xhu_<v> (128 x 128 tiles) and reflex_matmul_xhu64_<v> against the block shapes of
bench/prefill_lab.cu (xhu_body, compiled here with nvcc), on random weights of the Qwen3 shapes unpacked by the
module's reflex_qi_unpack_<t>, x of T random rows as its halves. Milliseconds a launch are the
median of 3 timings of 10 launches; TFLOP/s counts 2 T n_in n_out. Each form's outputs are
compared with the first form's: bits equal, or the largest relative difference.

usage: python bench/prefill_lab.py [--ncu] [--forms a,b,..] [--T N]   (--ncu: the gate/up
shape of Q4_K, one launch of each form, for Nsight Compute's sections)"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from labkit import load_lab, median_ms

SIG = "PPPPPPPiiiiiqi"
# variant -> (ggml type, name, QK, block bytes, f16 scale offsets)
TYPES = {"m32": (12, "q4_k", 256, 144, (0, 2)), "s16": (14, "q6_k", 256, 210, (208,)),
         "s32": (8, "q8_0", 32, 34, (0,))}
# (label, n_in, n_outs, swiglu)
SHAPES = {"m32": [("8B qkv", 4096, (4096, 1024, 1024), False), ("8B o", 4096, (4096,), False),
                  ("8B gate/up", 4096, (12288,), True), ("8B down", 12288, (4096,), False)],
          "s16": [("8B o", 4096, (4096,), False), ("8B down", 12288, (4096,), False)],
          "s32": [("0.6B qkv", 1024, (2048, 1024, 1024), False), ("0.6B gate/up", 1024, (3072,), True),
                  ("0.6B down", 3072, (1024,), False)]}
# form -> (BM, BN, WM, WN, ST): bench/prefill_lab.cu's lab_<form>_<v>
FORMS = {"a4": (128, 128, 2, 4, 4), "arows": (128, 128, 2, 4, 3), "b": (128, 128, 4, 2, 3),
         "c": (256, 64, 4, 2, 3), "d": (128, 64, 2, 2, 4), "f4": (64, 64, 2, 2, 4)}


def smem_bytes(bm: int, bn: int, st: int, ns: int) -> int:
    tiles = st * (64 * bm + 8 * ns * bm + 128 * bn + 4 * bn)
    return max(tiles, 4 * bn * (bm + 4))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--forms", default=",".join(FORMS), help="lab forms ('' for none)")
    ap.add_argument("--T", type=int, default=1518)
    a = ap.parse_args()
    forms = [f for f in a.forms.split(",") if f]
    from reflex_core.cuda import driver, memory, modules, quant_ops
    from reflex_core.cuda.start import start

    start().wait()
    d = driver._d
    lab = load_lab("prefill_lab.cu", {f"lab_{f}_{v}": SIG for f in FORMS for v in TYPES})
    qk = modules.get_kernels(quant_ops.COMMON_MODULE)
    core = modules.get_kernels("core")
    rng = np.random.default_rng(11)
    T = a.T
    todo = [("m32", SHAPES["m32"][2])] if a.ncu else [(v, s) for v in TYPES for s in SHAPES[v]]
    for v, (label, n_in, n_outs, swiglu) in todo:
        t, tname, QK, ts, f16 = TYPES[v]
        ns = 32 // quant_ops._XHU_SUB[v]
        n3 = tuple(n_outs) + (0,) * (3 - len(n_outs))
        rows = quant_ops._weight_rows(n3, swiglu)
        urb = quant_ops._unpacked_row_bytes(t, n_in)
        sizes = quant_ops._scratch_sizes(urb, n3, swiglu)
        rb = n_in // QK * ts
        scratch = memory.alloc(sum(sizes))
        ptrs, off, keep = [], scratch, []
        for n, size in zip(rows, sizes):
            blocks = rng.integers(0, 256, size=(n * n_in // QK, ts), dtype=np.uint8)
            for o in f16:  # scales 2^-10 .. 2^-6, either sign
                sc = rng.uniform(2**-10, 2**-6, len(blocks)) * rng.choice([-1, 1], len(blocks))
                blocks[:, o:o + 2] = sc.astype(np.float16).view(np.uint8).reshape(-1, 2)
            wp = memory.alloc(blocks.nbytes)
            memory.htod(wp, blocks.tobytes())
            keep.append(wp)
            words = n * n_in // 4
            qk.launch(f"reflex_qi_unpack_{tname}", (min((words + 255) // 256, 65535), 1, 1),
                      (256, 1, 1), (wp, off, n, n_in, rb))
            ptrs.append(off)
            off += size
        ptrs += [0] * (3 - len(ptrs))
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        xp = memory.alloc(x.nbytes)
        memory.htod(xp, x.tobytes())
        hp = memory.alloc(quant_ops.x_halves_bytes(T, n_in))
        quant_ops.x_halves(core, xp, hp, T, n_in)
        n_y = n3[0] if swiglu else sum(n3)
        ys = [memory.alloc(4 * T * max(n, 1)) for n in n3]
        args = (ptrs[0], ptrs[1], ptrs[2], hp, ys[0], ys[1], ys[2], T, n_in, n3[0], n3[1],
                n3[2], 2 * n_in, 1 if swiglu else 0)
        flop = 2.0 * T * n_in * (2 * n3[0] if swiglu else sum(n3))

        def out() -> np.ndarray:
            driver.synchronize()
            return np.concatenate([np.frombuffer(bytes(memory.dtoh(p, 4 * T * n)), np.float32)
                                   for p, n in zip(ys, n3) if n])

        ref, line = None, []
        for form in ["xhu", "xhu64"] + forms:
            if form in ("xhu", "xhu64"):  # the module's forms (quant_ops.matmul_xh_unpacked)
                f = form[3:]
                bm, bn, threads, _ = quant_ops._XHU_FORMS[f]
                smem = quant_ops.xhu_smem_bytes(f, quant_ops._XHU_SUB[v])
                qk.allow_shmem(f"reflex_matmul_{form}_{v}", smem)

                def launch(name=f"reflex_matmul_{form}_{v}", f=f, threads=threads, smem=smem):
                    qk.launch(name, (quant_ops._xhu_blocks(f, T, n3, swiglu), 1, 1),
                              (threads, 1, 1), args, smem)
            else:
                bm, bn, wm, wn, st = FORMS[form]
                n_rt = -(-n3[0] // (bm // 2)) if swiglu else sum(-(-n // bm) for n in n3)
                grid = n_rt * -(-T // bn)
                smem = smem_bytes(bm, bn, st, ns)
                name = f"lab_{form}_{v}"
                if not lab.allow_shmem(name, smem):
                    line.append(f"{form} (no shmem)")
                    continue

                def launch(name=name, grid=grid, threads=32 * wm * wn, smem=smem):
                    lab.launch(name, (grid, 1, 1), (threads, 1, 1), args, smem)
            for p in ys:
                driver.check(d.cuMemsetD8(p, 0xFF, 4), "cuMemsetD8")  # a NaN first word
            launch()
            y = out()
            if ref is None:
                ref, same = y, "ref"
            elif np.array_equal(y.view(np.uint32), ref.view(np.uint32)):
                same = "bits="
            else:
                same = f"rel {np.nanmax(np.abs(y - ref)) / np.nanmax(np.abs(ref)):.1e}"
            if a.ncu:
                continue
            ms = median_ms(lambda i: launch(), 10)
            line.append(f"{form} {ms:6.3f} ms {flop / ms / 1e9:4.0f} TF/s ({same})")
        print(f"{v} {label:12s} T={T} {n_in}x{n_y}: " + " | ".join(line), flush=True)
        for p in keep + ys + [scratch, xp, hp]:
            memory.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
