"""The warm 1518-token prefill (coldstart.LONG_PROMPT) of one file on the GPU, one line.

usage: python bench/warm_long.py MODEL LABEL [--reps 3] [--decode 4]
Prints "LABEL: prefill X ms (N tokens), decode after it Y ms/token" (reflex_core.bench.warm
medians); the device scripts run it per core-wheel variant through PYTHONPATH.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coldstart import LONG_PROMPT  # noqa: E402
from reflex_core import bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("label")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", type=int, default=4)
    a = ap.parse_args()
    r = bench.warm(a.model, "cuda", LONG_PROMPT, a.reps, a.decode, (" Paris",))
    print(f"{a.label}: prefill {r['prefill_ms']['median']:.1f} ms ({r['n_prompt_tokens']} tokens), "
          f"decode after it {r['decode_ms_per_token']['median']:.3f} ms/token")


if __name__ == "__main__":
    main()
