"""Warm decode after the long prompt (coldstart.LONG_PROMPT) and after a short one, settings of
the decode attention alternating in one process, on the GPU.

usage: python bench/decode_ab.py MODEL LABEL [--rounds 2] [--tokens 64]
                                 [--settings CELLS:BLOCKS:FUSED:GRAPHS,...]
A setting is cuda_backend.SPLIT_CELLS, SPLIT_BLOCKS, ROPE_ATT (the q/k norms and RoPE inside
the attention's launch, 0 / 1) and whether the steps replay a decode graph (0 / 1); the short
prompt runs only with the default cells and blocks (its cache is too small to split). Each round
runs every setting once (after one warm-up round); a run is a fresh state, the prompt's prefill,
then TOKENS greedy steps, and its figure the median ms/token of steps 9 on (the first ones are
the graph's eager, traced steps). Prints one line per (prompt, setting) with every round's figure.
A core wheel without ROPE_ATT (before it existed) ignores that field.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coldstart import LONG_PROMPT  # noqa: E402
from reflex_core import engine  # noqa: E402
from reflex_core.backends import cuda_backend, cuda_graph  # noqa: E402

DEFAULT = "256:264:0:1,256:264:1:1"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("label")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--settings", default=DEFAULT)
    a = ap.parse_args()
    settings = [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")]
    lm, ids = engine.load(a.model, "cuda", prompt=LONG_PROMPT)
    short = lm.require_tokenizer().encode("The capital of France is")
    model, ops = lm.model, lm.ops
    defaults = (cuda_backend.SPLIT_CELLS, cuda_backend.SPLIT_BLOCKS)

    def run(prompt: list[int], graphs: bool) -> float:
        state = model.new_state(len(prompt) + a.tokens + 1)
        b = state.append(prompt)
        nxt = ops.argmax(model.forward(b, state, [b.n_tokens - 1]))[-1]
        graph = cuda_graph.DecodeGraph(ops, model) if graphs else None
        ms = []
        try:
            for _ in range(a.tokens):
                t0 = time.perf_counter()
                nxt = ops.argmax(engine.decode_step(model, graph, state, nxt))[-1]
                ms.append((time.perf_counter() - t0) * 1e3)
        finally:
            if graph is not None:
                graph.close()
        return statistics.median(ms[8:])

    res: dict[tuple, list[float]] = {}
    for r in range(a.rounds + 1):
        for cells, blocks, fused, graphs in settings:
            cuda_backend.SPLIT_CELLS, cuda_backend.SPLIT_BLOCKS = cells, blocks
            cuda_backend.ROPE_ATT = bool(fused)
            for name, prompt in (("long", ids), ("short", short)):
                if name == "short" and (cells, blocks) != defaults:
                    continue
                v = run(prompt, bool(graphs))
                if r:
                    res.setdefault((name, cells, blocks, fused, graphs), []).append(v)
    print(f"{a.label} {os.path.basename(a.model)}: long prompt {len(ids)} tokens, "
          f"ms/token (median of steps 9-{a.tokens}) per round; "
          "(prompt, split cells, split blocks, fused prologue, graphs)")
    for k, v in res.items():
        print(f"  {a.label} {k}: " + " ".join(f"{x:.3f}" for x in v))


if __name__ == "__main__":
    main()
