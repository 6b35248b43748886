"""Warm prefill of the 1500-token prompt with and without the dequantize-first path (A/B).

    python bench/prefill_ab.py MODEL... [--reps 3] [--all-types]

"on": quant_ops as it is (quantized weights of a tiled matmul over DEQUANT_FIRST_MIN_T tokens or
more are dequantized once into float32 scratch, then the float32 tiled kernel runs); "off": the
quantized tiled kernel for every prompt length; --all-types: "on" dequantizes the block-of-32
types too (quant_ops skips them by default). Both in one process, alternating per repetition;
prints `reflex bench`'s prefill and decode medians for each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from coldstart import LONG_PROMPT  # noqa: E402

from reflex_core import bench  # noqa: E402
from reflex_core.cuda import quant_ops  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--all-types", action="store_true")
    a = ap.parse_args()
    on = quant_ops.DEQUANT_FIRST_MIN_T
    if a.all_types:
        quant_ops._DEQUANT_FIRST_SKIP = frozenset()
    for m in a.models:
        pre = {"on": [], "off": []}
        for _ in range(a.reps):
            for pol in pre:
                quant_ops.DEQUANT_FIRST_MIN_T = on if pol == "on" else 1 << 30
                r = bench.warm(m, "cuda", LONG_PROMPT, 3, 4, (" Paris",))
                pre[pol].append(r["prefill_ms"]["median"])
        quant_ops.DEQUANT_FIRST_MIN_T = on
        print(m.rsplit("/", 1)[-1], f"prompt {r['n_prompt_tokens']} tokens:", " ".join(
            f"dequant-first {p}: prefill {statistics.median(v):.1f} ms" for p, v in pre.items()),
            flush=True)


if __name__ == "__main__":
    main()
