"""Sum an `ncu --metrics gpu__time_duration.sum --csv` log by kernel name.

usage: python bench/ncu_by_kernel.py NCU.csv [TOP] [--minus BASE.csv --per N] [--by-grid]

With --minus, the kernels of BASE.csv (the same program run for fewer tokens) are taken out
of NCU.csv's sums and what is left is divided by N (the extra tokens): the per-token cost of
decode, without the load and prefill both runs share. --by-grid: one line per kernel and grid
size (launches of one kernel over matrices of different shapes apart).
"""
import argparse
import collections
import csv
import re
import sys

_SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def _short(name: str) -> str:
    """A kernel's name without its parameter list (C++ templates keep their arguments)."""
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i]
    return name


def sums(path: str, by_grid: bool = False) -> tuple[dict[str, float], collections.Counter]:
    # the profiled program's own output may come before ncu's table
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    first = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if first is None:
        sys.exit(f"no ncu table in {path}")
    rows = rows[first:]
    head = rows[0]
    k, u, v = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    tot: dict[str, float] = collections.defaultdict(float)
    cnt: collections.Counter[str] = collections.Counter()
    for r in rows[1:]:
        if r[u] not in _SCALE:
            sys.exit(f"unknown time unit {r[u]!r} in {path}")
        name = _short(r[k])
        if by_grid:
            name += " " + r[head.index("Grid Size")].replace(" ", "")
        tot[name] += float(r[v].replace(",", "")) * _SCALE[r[u]]
        cnt[name] += 1
    return tot, cnt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("top", nargs="?", type=int, default=14)
    ap.add_argument("--minus", help="the same program's log for fewer tokens")
    ap.add_argument("--per", type=int, default=1, help="divide what is left by this many tokens")
    ap.add_argument("--by-grid", action="store_true", help="each kernel's grid sizes apart")
    a = ap.parse_args()
    tot, cnt = sums(a.csv, a.by_grid)
    if a.minus:
        base, bcnt = sums(a.minus, a.by_grid)
        for name in set(tot) | set(base):
            tot[name] = tot.get(name, 0.0) - base.get(name, 0.0)
            cnt[name] = cnt.get(name, 0) - bcnt.get(name, 0)
    per = max(a.per, 1)
    allus = sum(tot.values()) / per
    unit = "per token" if a.minus else "in all"
    print(f"{sum(cnt.values()) / per:.0f} kernels, {allus:.0f} us of kernel time {unit}")
    for name, us in sorted(tot.items(), key=lambda t: -t[1])[:a.top]:
        n = cnt[name] / per
        if n <= 0:
            continue
        print(f"  {name[:72]:72s} {n:6.1f} x {us / per / n:7.2f} us = {us / per:8.0f} us "
              f"({100 * us / per / allus:4.1f}%)")


if __name__ == "__main__":
    main()
