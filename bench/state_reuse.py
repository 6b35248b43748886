"""Issue 15's cold costs, fresh processes alternating run by run, medians:

1. prefix reuse: ``reflex system1`` with the 5-token prompt alone, against the same call after
   ``--import-kv`` of a state file holding a ~1500-token prefix (bench/coldstart.py's
   LONG_PROMPT) with its buffers page-locked for the upload (the default) and without
   (REFLEX_PIN_STATE=0), against the whole ~1500-token prompt prefilled cold; plus the state
   file's size and ``--timings``' "read state file (thread)" (map, checksum, pinning) and
   "score (one forward)" spans;
2. LoRA: ``reflex generate -n 1`` without an adapter, against a rank-16 F16 adapter on every
   attention and FFN projection (written here with reflex_core.testing.lorawriter; needs gguf).

    python bench/state_reuse.py MODEL.gguf OUT_DIR [--runs 7] [--backend cuda]

Prints one table per part and writes OUT_DIR/state_reuse.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coldstart import LONG_PROMPT, PROMPT  # noqa: E402

CANDS = ["--candidate", " Paris", "--candidate", " London", "--candidate", " Berlin"]
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def run(cmd: list[str], ok: str) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or ok not in p.stdout:
        raise SystemExit(f"failed: {' '.join(cmd)[:300]}\n{p.stderr[-2000:]}")
    return wall


def spans(cmd: list[str]) -> dict[str, float]:
    """--timings' phase durations (ms) by name, from one run."""
    p = subprocess.run(cmd + ["--timings"], capture_output=True, text=True)
    out = {}
    for line in p.stderr.splitlines():
        m = re.match(r"\s*(.+?)\s{2,}[\d.]+ \|\s+([\d.]+)\s*$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)[:300]} --timings\n{p.stderr[-2000:]}")
    return out


def alternate(cmds: dict[str, list[str]], ok: str, runs: int) -> dict[str, dict]:
    for c in cmds.values():  # page cache, index, kernels' disk cache
        run(c, ok)
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for k, c in cmds.items():
            walls[k].append(run(c, ok))
    return {k: {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w), "n": len(w)}
            for k, w in walls.items()}


def table(title: str, res: dict[str, dict], base: str) -> None:
    print(f"\n{title}\n| engine | median s | min | max | / {base} |\n|---|---|---|---|---|")
    b = res[base]["median_s"]
    for k, r in res.items():
        print(f"| {k} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
              f"{r['median_s'] / b:.2f}x |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    reflex = [sys.executable, "-m", "reflex_core"]
    be = ["--backend", a.backend]
    report: dict = {"model": a.model, "runs": a.runs}

    kv = a.out / "prefix.kv"
    run(reflex + ["generate", a.model, "-p", LONG_PROMPT, "-n", "0", "--export-kv", str(kv)] + be,
        "REFLEX_GENERATE_OK")
    short = reflex + ["system1", a.model, "-p", PROMPT] + CANDS + be
    imported = reflex + ["system1", a.model, "--import-kv", str(kv), "-p", " " + PROMPT] + CANDS + be
    whole = reflex + ["system1", a.model, "-p", LONG_PROMPT + " " + PROMPT] + CANDS + be
    unpinned = ["env", "REFLEX_PIN_STATE=0"] + imported
    res = alternate({"5-token prompt": short, "1500-token prefix imported + 5": imported,
                     "the same, state not pinned (REFLEX_PIN_STATE=0)": unpinned,
                     "1500 + 5 tokens prefilled": whole}, "REFLEX_SYSTEM1_OK", a.runs)
    table("system1, launch -> exit", res, "5-token prompt")
    report["prefix"] = res
    report["state_file_bytes"] = kv.stat().st_size
    report["prefix_spans_ms"] = {k: spans(c) for k, c in (("short", short), ("imported", imported))}
    imp, sh = report["prefix_spans_ms"]["imported"], report["prefix_spans_ms"]["short"]
    print(f"state file {kv.stat().st_size / 1e6:.1f} MB; read state file {imp.get('read state file (thread)', float('nan')):.1f} ms; "
          f"score (one forward) {imp.get('score (one forward)', float('nan')):.1f} ms imported vs "
          f"{sh.get('score (one forward)', float('nan')):.1f} ms short")

    from reflex_core.gguf import open_gguf
    from reflex_core.testing.lorawriter import random_pairs, write_adapter

    g = open_gguf(a.model)
    try:
        targets = [n for n in g.tensors
                   if n.startswith("blk.") and n.split(".")[2] in PROJECTIONS and n.endswith(".weight")]
        arch = g.metadata["general.architecture"]
    finally:
        g.close()
    adapter = a.out / "rank16.gguf"
    write_adapter(adapter, arch, random_pairs(a.model, targets, rank=16, seed=0, sigma=0.01),
                  alpha=16.0, factor_type="F16")
    gen = reflex + ["generate", a.model, "-p", PROMPT, "-n", "1"] + be
    res = alternate({"no adapter": gen, "rank-16 adapter": gen + ["--lora", str(adapter)]},
                    "REFLEX_GENERATE_OK", a.runs)
    table(f"generate -n 1, launch -> exit; adapter on {len(targets)} tensors, "
          f"{adapter.stat().st_size / 1e6:.1f} MB", res, "no adapter")
    report["lora"] = res
    report["lora_tensors"] = len(targets)
    report["lora_spans_ms"] = spans(gen + ["--lora", str(adapter)])
    ls = report["lora_spans_ms"]
    print(f"open LoRA adapters {ls.get('open LoRA adapters', float('nan')):.1f} ms; "
          f"merge LoRA adapters {ls.get('merge LoRA adapters', float('nan')):.1f} ms")
    (a.out / "state_reuse.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
