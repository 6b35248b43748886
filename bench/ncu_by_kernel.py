"""Sum an `ncu --metrics gpu__time_duration.sum --csv` log by kernel name.

usage: python bench/ncu_by_kernel.py NCU.csv [TOP]
"""
import collections
import csv
import sys


def main() -> None:
    rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
    if not rows:
        sys.exit("no ncu rows")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 14
    head = rows[0]
    k, u, v = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    tot: dict[str, float] = collections.defaultdict(float)
    cnt: collections.Counter[str] = collections.Counter()
    for r in rows[1:]:
        if r[u] not in scale:
            sys.exit(f"unknown time unit {r[u]!r} in {sys.argv[1]}")
        tot[r[k]] += float(r[v].replace(",", "")) * scale[r[u]]
        cnt[r[k]] += 1
    allus = sum(tot.values())
    print(f"{sum(cnt.values())} kernels, {allus:.0f} us of kernel time")
    for name, us in sorted(tot.items(), key=lambda t: -t[1])[:top]:
        print(f"  {name[:48]:48s} {cnt[name]:5d} x {us / cnt[name]:7.2f} us = {us:8.0f} us "
              f"({100 * us / allus:4.1f}%)")


if __name__ == "__main__":
    main()
