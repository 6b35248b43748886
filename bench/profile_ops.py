"""Where a warm forward pass spends its time, op by op (GPU machine).

    python bench/profile_ops.py MODEL [--prompt TEXT] [--decode N] [--reps R] [--backend cpu]

Loads MODEL on the CUDA backend (or the CPU's), then times (1) whole passes as the engine runs
them: a prefill of the prompt and N single-token decode steps, each ended by the next token's
id on the host;
(2) the same passes with every op followed by a device synchronisation, so each op's time is
its launch overhead plus its kernels (the sum exceeds (1) by the synchronisations). Prints the
per-token distribution of (1) and a table of (2) by op and weight type, largest first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from reflex_core import engine, opreg
from reflex_core.ggml_types import GGML_TYPES
from reflex_core.ops import Weight


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args()
    lm, ids = engine.load(a.model, a.backend, prompt=a.prompt)
    model, ops = lm.model, lm.ops

    def run() -> tuple[float, list[float]]:
        state = model.new_state(len(ids) + a.decode + 1)
        t0 = time.perf_counter()
        b = state.append(ids)
        nxt = ops.argmax(model.forward(b, state, [b.n_tokens - 1]))[-1]
        pre = (time.perf_counter() - t0) * 1e3
        dec = []
        for _ in range(a.decode):
            t0 = time.perf_counter()
            nxt = ops.argmax(model.forward(state.append([nxt]), state, [0]))[-1]
            dec.append((time.perf_counter() - t0) * 1e3)
        return pre, dec

    for _ in range(2):
        run()
    pres, decs = [], []
    for _ in range(a.reps):
        p, d = run()
        pres.append(p)
        decs += d
    decs.sort()
    q = lambda f: decs[min(len(decs) - 1, int(f * len(decs)))]  # noqa: E731
    print(f"prompt {len(ids)} tokens: prefill median {statistics.median(pres):.2f} ms; decode "
          f"ms/token min {decs[0]:.2f} p10 {q(0.1):.2f} median {q(0.5):.2f} p90 {q(0.9):.2f} "
          f"max {decs[-1]:.2f}")

    names = [op.name for op in opreg.all_ops()] + ["prepare"]
    spent: dict = defaultdict(lambda: [0.0, 0.0, 0])  # name -> [prefill ms, decode ms, calls]
    phase = [0]
    depth = [0]  # only the outermost op of a nested call is timed

    def wrap(name, fn):
        def timed(*args, **kw):
            if depth[0]:
                return fn(*args, **kw)
            depth[0] += 1
            try:
                return _timed(name, fn, args, kw)
            finally:
                depth[0] -= 1
        return timed

    def _timed(name, fn, args, kw):
        flat = [w for a in args for w in (a if isinstance(a, (list, tuple)) else (a,))]
        types = sorted({GGML_TYPES[w.ggml_type].name for w in flat if isinstance(w, Weight)})
        ops.synchronize()
        t0 = time.perf_counter()
        r = fn(*args, **kw)
        ops.synchronize()
        s = spent[f"{name}[{','.join(types)}]" if types else name]
        s[phase[0]] += (time.perf_counter() - t0) * 1e3
        s[2] += 1
        return r

    for n in names:
        fn = getattr(ops, n, None)
        if callable(fn):
            ops.__dict__[n] = wrap(n, fn)
    for _ in range(a.reps):
        state = model.new_state(len(ids) + a.decode + 1)
        phase[0] = 0
        b = state.append(ids)
        nxt = ops.argmax(model.forward(b, state, [b.n_tokens - 1]))[-1]
        phase[0] = 1
        for _ in range(a.decode):
            nxt = ops.argmax(model.forward(state.append([nxt]), state, [0]))[-1]
    print(f"{'op':36s} {'prefill ms/pass':>16s} {'decode ms/token':>16s} {'calls/pass':>11s}")
    rows = sorted(spent.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for n, (p, d, c) in rows:
        print(f"{n:36s} {p / a.reps:16.3f} {d / (a.reps * a.decode):16.4f} "
              f"{c / (a.reps * (1 + a.decode)):11.1f}")
    print(f"{'sum':36s} {sum(v[0] for v in spent.values()) / a.reps:16.3f} "
          f"{sum(v[1] for v in spent.values()) / (a.reps * a.decode):16.4f}")


if __name__ == "__main__":
    main()
