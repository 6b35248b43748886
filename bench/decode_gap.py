"""How much of a warm decode step is the host's: the step as `generate` runs it against the same
captured graph replayed back to back, one file on the GPU.

usage: python bench/decode_gap.py MODEL LABEL [--long] [--steps 48]
Prints per-token medians: the loop with every step waiting for the host (state.append, prepare,
graph launch, argmax, the token's copy to the host) and its parts, the chained steps as
`generate` runs them (engine.decode_tokens, a new job), and the graph alone (K replays queued,
one synchronize): the loop's excess over the graph is what the GPU waits for the host.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coldstart import LONG_PROMPT  # noqa: E402
from reflex_core import engine  # noqa: E402
from reflex_core.cuda import driver as drv  # noqa: E402


def parser(steps: int) -> argparse.ArgumentParser:
    """The arguments this script and graph_timeline.py share: MODEL LABEL [--long] [--steps]."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("label")
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--steps", type=int, default=steps)
    return ap


def load(model: str, long: bool, backend: str = "cuda"):
    """(Loaded, prompt ids): ``model`` with the long prompt or the short one."""
    return engine.load(model, backend, prompt=LONG_PROMPT if long else "The capital of France is")


def prefilled(lm, ids, n_cells: int):
    """A fresh state of ``n_cells`` with ``ids`` fed as one batch, and the greedy next token."""
    model, ops = lm.model, lm.ops
    state = model.new_state(n_cells)
    b = state.append(ids)
    return state, ops.argmax(model.forward(b, state, [b.n_tokens - 1]))[-1]


def chained(lm, ids, steps: int):
    """(graph, tokens): a fresh state with ``ids`` prefilled, its decode graph (the caller closes
    it) and the generator of ``steps`` greedy steps chained on the device, started past the
    first six (the eager step, the capture, the first chained ones)."""
    model, ops = lm.model, lm.ops
    state, nxt = prefilled(lm, ids, len(ids) + steps + 16)
    graph = engine.decode_graph(lm)
    pick = graph.device_pick(0.0, 0, 1.0, 0.0, None)
    tokens = engine.decode_tokens(model, state, graph, lambda x: ops.argmax(x)[-1], nxt,
                                  steps + 6, pick)
    for _ in range(6):
        next(tokens)
    return graph, tokens


def main() -> None:
    a = parser(48).parse_args()
    lm, ids = load(a.model, a.long)
    model, ops = lm.model, lm.ops
    state, nxt = prefilled(lm, ids, len(ids) + 2 * a.steps + 8)
    graph = engine.decode_graph(lm)
    first, loop, parts = [], [], {"append": [], "prepare+launch": [], "argmax+copy": []}
    try:
        for i in range(a.steps):
            t0 = time.perf_counter()
            batch = state.append([nxt])
            t1 = time.perf_counter()
            logits = graph.forward(batch, state)
            t2 = time.perf_counter()
            nxt = ops.argmax(logits)[-1]
            t3 = time.perf_counter()
            ms = (t3 - t0) * 1e3
            if i < 6:
                first.append(ms)
                continue
            loop.append(ms)
            parts["append"].append((t1 - t0) * 1e3)
            parts["prepare+launch"].append((t2 - t1) * 1e3)
            parts["argmax+copy"].append((t3 - t2) * 1e3)
        d = drv._d
        replay = []
        for _ in range(5):
            drv.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                drv.check(d.cuGraphLaunch(graph._exec, graph._stream), "cuGraphLaunch")
            drv.synchronize()
            replay.append((time.perf_counter() - t0) * 1e3 / a.steps)
        note = graph.note
    finally:
        graph.close()
    state, nxt = prefilled(lm, ids, len(ids) + a.steps + 8)
    graph = engine.decode_graph(lm)
    chained = []
    try:
        tokens = engine.decode_tokens(model, state, graph, lambda x: ops.argmax(x)[-1], nxt,
                                      a.steps, graph.device_pick(0.0, 0, 1.0, 0.0, None))
        t0 = time.perf_counter()
        for i, _ in enumerate(tokens):
            t1 = time.perf_counter()
            if i > 6:
                chained.append((t1 - t0) * 1e3)
            t0 = t1
        chained_note = graph.note
    finally:
        graph.close()
    med = statistics.median
    print(f"{a.label}{' long' if a.long else ''}: {len(ids)} prompt tokens; {note}")
    print(f"  first steps ms: {', '.join(f'{x:.2f}' for x in first)}")
    print(f"  loop {med(loop):.3f} ms/token (min {min(loop):.3f}); "
          + ", ".join(f"{k} {med(v):.3f}" for k, v in parts.items()))
    print(f"  chained {med(chained):.3f} ms/token (min {min(chained):.3f}; {chained_note})")
    print(f"  graph alone {med(replay):.3f} ms/token (min {min(replay):.3f}); "
          f"host gap {med(loop) - med(replay):.3f} ms/token")


if __name__ == "__main__":
    main()
