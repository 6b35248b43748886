"""Where a warm decode step's time goes inside its CUDA graph, one file on the GPU: the chained
steps run under PyTorch's profiler (CUPTI records every kernel a graph replays, with its start
and end), and each kernel is charged the time from the end of the kernel before it to its own
end -- with programmatic dependent launch a kernel starts before the one ahead of it ends, so
its own duration includes waiting. Needs torch (the device image's python3).

usage: python3 bench/graph_timeline.py MODEL LABEL [--long] [--steps 24] [--top 16] [--seq N]
Prints per step (the whole steps in the trace, each from its embedding's kernel on): the kernels
by charged time (count, us charged, us from start to end), the span from the first kernel's start
to the last one's end, and the idle time between one step's last kernel and the next one's
first with the copies in it (when each starts and ends). --seq N: then the first N kernels of
one step in launch order, each with its start and end from the step's start, its own time and
its charged time.
"""
import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from decode_gap import chained, load, parser  # noqa: E402


def main() -> None:
    ap = parser(24)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--seq", type=int, default=0)
    a = ap.parse_args()
    torch.cuda.init()
    lm, ids = load(a.model, a.long)
    graph, tokens = chained(lm, ids, a.steps + 2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in tokens:
            pass
    graph.close()
    kern = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and e.time_range.elapsed_us() > 0),
                  key=lambda e: e.time_range.start)
    copies = [e for e in kern if "memcpy" in e.name.lower() or "memset" in e.name.lower()]
    kern = [e for e in kern if e not in copies]
    # Whole steps only: the step queued ahead of the first token waited for was already running
    # when the profiler started, so its first kernels are missing; counting it as one of the
    # tokens' steps would spread about n - 1 steps' time over n. A step starts at its embedding.
    starts = [i for i, e in enumerate(kern) if e.name.startswith("reflex_embed")]
    if not starts:
        sys.exit("no embedding kernel in the trace: no whole step to charge")
    gaps = [kern[i].time_range.start - kern[i - 1].time_range.end for i in starts[1:]]
    # the copies between steps (the picked id out, the next step's inputs in), each as its start
    # and end from the end of the step's last kernel
    between: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for i in starts[1:]:
        t0, t1 = kern[i - 1].time_range.end, kern[i].time_range.start
        for c in copies:
            if t0 <= c.time_range.start < t1:
                between[c.name].append((c.time_range.start - t0, c.time_range.end - t0))
    kern = kern[starts[0]:]
    starts = [i - starts[0] for i in starts]
    n = len(starts)
    charged: dict[str, float] = collections.defaultdict(float)
    own: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    prev_end = None
    for e in kern:
        end = e.time_range.end
        charged[e.name] += end - prev_end if prev_end is not None else e.time_range.elapsed_us()
        own[e.name] += e.time_range.elapsed_us()
        count[e.name] += 1
        prev_end = max(prev_end or end, end)
    span = (kern[-1].time_range.end - kern[0].time_range.start) / n
    print(f"{a.label}{' long' if a.long else ''}: {n} steps, {len(kern) / n:.1f} kernels a step, "
          f"{span:.1f} us a step from first start to last end")
    if gaps:
        print(f"  between steps (the last kernel's end to the next embedding's start): median "
              f"{statistics.median(gaps):.1f} us, max {max(gaps):.1f}")
        for name, spans in between.items():
            print(f"    {len(spans) / len(gaps):.1f}x a gap  {name[:40]}: median start "
                  f"{statistics.median(s for s, _ in spans):.1f} us, end "
                  f"{statistics.median(e for _, e in spans):.1f} us after the last kernel's end")
    for name, c in sorted(charged.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {c / n:8.1f} us charged  {count[name] / n:5.1f}x  {own[name] / n:8.1f} us own  "
              f"{name[:70]}")
    if a.seq and len(starts) >= 3:
        i0 = starts[-3]
        t0 = kern[i0].time_range.start
        prev = kern[i0 - 1].time_range.end if i0 else t0
        print(f"one step's first {a.seq} kernels: start, end (us from the step's start), own, "
              f"charged")
        for e in kern[i0:min(i0 + a.seq, starts[-2])]:
            r = e.time_range
            print(f"  {r.start - t0:8.1f} {r.end - t0:8.1f} {r.elapsed_us():7.1f} "
                  f"{r.end - max(prev, r.start) if r.end > prev else 0.0:7.1f}  {e.name[:60]}")
            prev = max(prev, r.end)


if __name__ == "__main__":
    main()
