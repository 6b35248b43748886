"""Warm decode with the GEMV's row split forced (A/B of quant_ops.gemv_split), one process.

    python bench/gemv_split_ab.py MODEL... [--policies auto,1] [--reps 3]

Policy "auto" is quant_ops.gemv_split as it is (two warps a row pair for one token where the
row has 64 lane units or more: the gemv1s kernels); "1" replaces it with one warp a row pair
everywhere (the gemv1 kernels), for the whole model load and its warm bench (decode graphs on,
the default). Policies alternate per repetition so drift hits them alike.
"""
from __future__ import annotations

import argparse
import statistics

from reflex_core import bench
from reflex_core.cuda import quant_ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--policies", default="auto,1")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    auto = quant_ops.gemv_split
    pols = a.policies.split(",")
    for m in a.models:
        res = {p: [] for p in pols}
        for _ in range(a.reps):
            for p in pols:
                quant_ops.gemv_split = auto if p == "auto" else (lambda t, n: 1)
                r = bench.warm(m, "cuda", "The capital of France is", 3, 32, (" Paris",))
                res[p].append(r["decode_ms_per_token"]["median"])
        quant_ops.gemv_split = auto
        print(m.rsplit("/", 1)[-1], " ".join(
            f"split {p}: {statistics.median(v):.3f} ms/token" for p, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
