"""Where the time goes inside each one-token GEMV launch of a warm decode step, one file on the
GPU, from the per-block stamps of a trace build (the core built with REFLEX_CUDA_TRACE=1:
RX_TRACE in reflex/common.cuh): the global timer and the SM's clock at the block's start, after
the programmatic wait, after x is staged, when the first ring slot has landed (streamed forms),
after the first tile's (or the row loop's) arithmetic, and at the block's end. The stamps cost
the step a few percent (BENCHMARKS.md, 2026-12-06, forty-third session), so compare launches
within one trace, and time changes with `reflex bench` on release builds.

usage: python3 bench/phase_trace.py MODEL LABEL [--long] [--steps 5] [--dump FILE.npy]
Prints, per kind of launch and width, medians over its launches: blocks, tiles a block, us
charged (its last block's end minus the launch before's), how early its first block started,
its blocks' wait against the launch before's end, x's staging, the first slot's landing, the
first tile's arithmetic, wait to end, and the tail (last block's end minus the median block's);
then one step's first launches in order. --dump also saves the raw records (n x 16 words, the
layout in reflex/common.cuh) for a closer look, e.g. at which blocks end last. The decode
attention (reflex_attention_vec*, reflex_rope_attention_vec*, in the core module) records its
start, the wait, its prologue, the batch's rows, the cells summed and its end in the same
columns.
"""
import collections
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = {400: "attention", 401: "RoPE + attention",
         110: "stream producer", 120: "stream reader (one weight)", 121: "stream SwiGLU reader",
         310: "gemv1xr (producer)", 320: "gemv1xn (reader)", 321: "gemv1xn SwiGLU"}
TYPES = {8: "Q8_0", 12: "Q4_K", 14: "Q6_K", 13: "Q5_K"}


def main() -> None:
    from decode_gap import chained, load, parser
    from reflex_core.cuda import driver, modules, quant_ops
    from reflex_core.errors import CudaError

    ap = parser(5)
    ap.add_argument("--dump", help="save the raw records to this .npy file")
    a = ap.parse_args()
    lm, ids = load(a.model, a.long)
    d = driver.bindings()

    def sym(handle, name: bytes):
        try:
            ptr, size = driver.check(d.cuModuleGetGlobal(handle, name), "cuModuleGetGlobal")
        except CudaError:
            raise SystemExit(f"a module has no {name.decode()}: install a trace build "
                             "(REFLEX_CUDA_TRACE=1 at build time)") from None
        return int(ptr), size

    # each module records its own kernels' blocks: the GEMVs' (quant) and the attention's (core)
    bufs = [(sym(k.handle, b"rx_trace_n")[0], *sym(k.handle, b"rx_trace_buf"))
            for k in (modules.get_kernels(quant_ops.COMMON_MODULE), modules.get_kernels("core"))]
    graph, tokens = chained(lm, ids, a.steps)
    driver.synchronize()
    for n_ptr, _, _ in bufs:
        driver.check(d.cuMemsetD32(n_ptr, 0, 1), "cuMemsetD32")
    n_steps = sum(1 for _ in tokens)
    driver.synchronize()
    graph.close()
    parts = []
    for n_ptr, b_ptr, b_size in bufs:
        cnt = np.zeros(1, np.uint32)
        driver.check(d.cuMemcpyDtoH(cnt.ctypes.data, n_ptr, 4), "cuMemcpyDtoH")
        n = int(min(cnt[0], b_size // 128))
        part = np.zeros((n, 16), np.uint64)
        driver.check(d.cuMemcpyDtoH(part.ctypes.data, b_ptr, n * 128), "cuMemcpyDtoH")
        parts.append(part)
    buf = np.concatenate(parts)
    print(f"{a.label} {Path(a.model).name}: {len(buf)} records, {n_steps} steps")
    if a.dump:
        np.save(a.dump, buf)
    analyze(buf, n_steps)


def analyze(buf: np.ndarray, n_steps: int) -> dict:
    """Print the launches' phases from the trace records ``buf`` (n x 16 words) of ``n_steps``
    decode steps; returns {(kind, width): [per-launch figures]} (a q/k/v launch of two types is
    one launch)."""
    kind = (buf[:, 0] >> 32).astype(np.int64)
    extra = buf[:, 14].astype(np.int64)
    width = extra & 0xffff
    types = (extra >> 24) & 0xff
    g = buf[:, 2:8].astype(np.float64) / 1e3  # us
    c = buf[:, 8:14].astype(np.float64)
    tiles = (extra >> 16) & 0xff
    # SM clock: cycles per us from the blocks' start-to-end spans
    spans = (g[:, 5] - g[:, 0])
    ok = spans > 2
    mhz = float(np.median((c[ok, 5] - c[ok, 0]) / spans[ok])) if ok.any() else 1980.0
    order = np.argsort(g[:, 0])
    # launches: one key's blocks, split where starts are more than 8 us apart
    launches = []
    cur: dict[tuple, list[int]] = {}
    last: dict[tuple, float] = {}
    for i in order:
        k = (int(kind[i]), int(width[i]))
        if k in cur and g[i, 0] - last[k] > 8.0:
            launches.append((k, cur.pop(k)))
        cur.setdefault(k, []).append(int(i))
        last[k] = g[i, 0]
    launches += list(cur.items())
    launches.sort(key=lambda kv: min(g[j, 0] for j in kv[1]))
    print(f"{len(launches)} launches, SM clock {mhz:.0f} MHz")
    rows = collections.defaultdict(list)
    in_order = []  # (key, figures) of each launch, in launch order
    type_of = {}
    prev_end = None
    for k, idx in launches:
        idx = np.array(idx)
        type_of[k] = ("-" if k[0] >= 400 else  # the attention: no weight type
                      "+".join(TYPES.get(int(t), str(t)) for t in sorted(set(types[idx].tolist()))))
        gg, cc = g[idx], c[idx]
        end_max = gg[:, 5].max()
        r = {
            "blocks": len(idx),
            "start_min": gg[:, 0].min(),
            "wait_med": np.median(gg[:, 1]),
            "staged_med": np.median(gg[:, 2]) if (gg[:, 2] > 0).all() else np.nan,
            "end_med": np.median(gg[:, 5]),
            "end_max": end_max,
            "stage_us": np.median((cc[:, 2] - cc[:, 1]) / mhz) if (cc[:, 2] > 0).all() else np.nan,
            "land_us": np.median(np.maximum(cc[:, 3] - cc[:, 2], 0) / mhz) if (cc[:, 3] > 0).all() else np.nan,
            "tile1_us": np.median((cc[:, 4] - np.where(cc[:, 3] > 0, cc[:, 3], cc[:, 2])) / mhz)
            if (cc[:, 4] > 0).all() else np.nan,
            "after_wait_us": np.median((cc[:, 5] - cc[:, 1]) / mhz),
            "tiles_med": float(np.median(tiles[idx])),
            "start_max": gg[:, 0].max(),
        }
        if prev_end is not None:
            r["release_us"] = r["wait_med"] - prev_end
            r["charged_us"] = end_max - prev_end
            r["early_us"] = prev_end - r["start_min"]
            r["late_us"] = r["start_max"] - prev_end
        r["tail_us"] = end_max - r["end_med"]
        rows[k].append(r)
        in_order.append((k, r))
        prev_end = end_max
    print("per kind and width, medians over its launches, us (attention: n_in = head size, "
          "tiles = cells a block, stage x = its prologue, 1st slot lands = the batch's rows "
          "loaded, 1st tile = the cells summed):")
    hdr = ("kind", "type", "n_in", "launches", "blocks", "tiles", "charged", "early start",
           "last start->prev end", "wait->prev end", "stage x", "1st slot lands", "1st tile",
           "wait->end", "tail")
    print(" | ".join(hdr))
    for k, rs in sorted(rows.items(), key=lambda kv: -len(kv[1])):
        kd, n_in = k

        def med(f):
            v = [r[f] for r in rs if f in r and not np.isnan(r[f])]
            return f"{statistics.median(v):.2f}" if v else "-"
        print(" | ".join([KINDS.get(kd, str(kd)), type_of[k], str(n_in), str(len(rs)),
                          med("blocks"), med("tiles_med"), med("charged_us"), med("early_us"),
                          med("late_us"), med("release_us"), med("stage_us"), med("land_us"),
                          med("tile1_us"),
                          med("after_wait_us"), med("tail_us")]))
    # the last step's first launches, in order
    print("one step's launches in order (the last step), us from its first launch's start:")
    per_step = len(in_order) // max(n_steps, 1)
    seq = in_order[-per_step:] if per_step else []
    t0 = seq[0][1]["start_min"] if seq else 0.0
    for (kd, n_in), r in seq[:14]:
        print(f"  {KINDS.get(kd, str(kd)):28s} {type_of[(kd, n_in)]:9s} n_in {n_in:6d}: start "
              f"{r['start_min'] - t0:8.2f} wait(med) {r['wait_med'] - t0:8.2f} staged(med) "
              f"{r['staged_med'] - t0:8.2f} end(med) {r['end_med'] - t0:8.2f} end(max) "
              f"{r['end_max'] - t0:8.2f}")
    return rows


if __name__ == "__main__":
    main()
