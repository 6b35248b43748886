"""Benchmark: the tokenizer on the cold path, full build vs the prompt-scoped ("fast") BPE.

    python bench/bench_tokenizer.py [--path FILE] [--runs 5] [--prompt TEXT]

Each run is a fresh process (interleaved scenarios, median of --runs) that does
``open_gguf`` + ``Tokenizer.from_gguf`` + ``encode(prompt)``, and in the "+cands" scenarios
also encodes three candidates (" Paris", " London", " Berlin"), either one by one (what
system1 does) or after one ``prepare([prompt, *candidates])``. "full" sets REFLEX_TOKENIZER=full
(the full ``tokenizers`` BPE, built in from_gguf: the pre-fast-path behaviour).

Reported per scenario (ms): launch->ready (from spawning the process until the ids exist, as
seen by the parent's monotonic clock), the interpreter start, import, open_gguf, from_gguf,
encode(s), and the main thread's CPU time over from_gguf + encodes. Every step of the tokenizer
holds the GIL (stdlib C calls and ``tokenizers``, which does not release it), so that CPU time
is the GIL-held time. A second set of runs adds a ticker thread (sleep 0.5 ms in a loop) and
reports the longest gap it saw during the tokenizer steps: the longest stretch another thread
(e.g. CUDA init's Python parts) would have waited for the GIL.

The file is a Qwen3-0.6B-shaped GGUF (the real Qwen3 tokenizer, zero weights), reused from
--path when it exists, else written with reflex_core.testing.modelwriter (needs numpy + gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.join("/tmp", "reflex_bench", "qwen3-0.6b-shaped-q8_0.gguf")
CANDIDATES = (" Paris", " London", " Berlin")

CHILD = r"""
import json, os, sys, threading, time
T = time.monotonic
t_start = T()
ticker = os.environ.get("BENCH_TICKER") == "1"
gaps = []
if ticker:
    stop = False
    def tick():
        last = T()
        while not stop:
            time.sleep(0.0005)
            now = T()
            gaps.append((last, now))
            last = now
    th = threading.Thread(target=tick, daemon=True)
    th.start()
from reflex_core.gguf import open_gguf
from reflex_core.tokenizer import Tokenizer
t_import = T()
prompt, cands, mode = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
g = open_gguf(sys.argv[1])
t_open = T()
c0 = time.thread_time()
tok = Tokenizer.from_gguf(g)
t_from = T()
if mode == "prepare":
    tok.prepare([prompt, *cands])
ids = tok.encode(prompt)
t_enc = T()
cids = [tok.encode(c, add_special=False) for c in cands]
t_ready = T()
cpu = time.thread_time() - c0
if ticker:
    stop = True
    th.join()
longest = max((b - a for a, b in gaps if b > t_open and a < t_ready), default=0.0)
print(json.dumps({"start": t_start, "import": t_import, "open": t_open, "from": t_from,
                  "enc": t_enc, "ready": t_ready, "cpu": cpu, "longest_gap": longest,
                  "ids": ids, "cids": cids, "path": tok.last_path, "full_built": tok.full_built,
                  "numpy": "numpy" in sys.modules}))
"""

# (name, REFLEX_TOKENIZER, candidates?, child mode)
SCENARIOS = [
    ("full: prompt", "full", False, "plain"),
    ("fast: prompt", "", False, "plain"),
    ("full: prompt +3 cands", "full", True, "plain"),
    ("fast: prompt +3 cands", "", True, "plain"),
    ("fast: prepare(prompt+3) +encodes", "", True, "prepare"),
]


def ensure_file(path: str) -> None:
    if os.path.exists(path):
        return
    sys.path.insert(0, REPO)
    from reflex_core.testing.modelwriter import qwen3_0_6b_shape, write_model

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    t0 = time.perf_counter()
    write_model(path, qwen3_0_6b_shape(), weight_type="Q8_0", tokenizer="qwen3", zero_data=True)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")


def run_once(path: str, prompt: str, env: dict, mode: str, cands, ticker: bool) -> dict:
    env = dict(env, REFLEX_TOKENIZER=mode[0], BENCH_TICKER="1" if ticker else "0")
    t_spawn = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD, path, prompt, json.dumps(list(cands)), mode[1]],
                         env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    r["spawn"] = t_spawn
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=DEFAULT_PATH, help="Qwen3-0.6B-shaped GGUF (written if missing)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", default="The capital of France is")
    args = ap.parse_args()
    ensure_file(args.path)

    # bytecode cached (as in an installed package), outside the repo
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONPYCACHEPREFIX=os.path.join(os.path.dirname(os.path.abspath(args.path)), "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import reflex_core.tokenizer, reflex_core.gguf, tokenizers"],
                   env=env, check=True)

    rows: dict[str, list[dict]] = {name: [] for name, *_ in SCENARIOS}
    gil: dict[str, list[dict]] = {name: [] for name, *_ in SCENARIOS}
    for _ in range(args.runs):  # interleaved
        for name, mode, with_cands, how in SCENARIOS:
            cands = CANDIDATES if with_cands else ()
            rows[name].append(run_once(args.path, args.prompt, env, (mode, how), cands, False))
    for _ in range(args.runs):
        for name, mode, with_cands, how in SCENARIOS:
            cands = CANDIDATES if with_cands else ()
            gil[name].append(run_once(args.path, args.prompt, env, (mode, how), cands, True))

    # every scenario must give the same ids; the fast ones must have run fast
    ref = rows["full: prompt +3 cands"][0]
    for name, mode, with_cands, how in SCENARIOS:
        for r in rows[name] + gil[name]:
            assert r["ids"] == ref["ids"], (name, r["ids"], ref["ids"])
            if with_cands:
                assert r["cids"] == ref["cids"], (name, r["cids"])
            assert r["path"] == ("full" if mode == "full" else "fast"), (name, r["path"])
            assert not r["numpy"], name

    med = lambda xs: statistics.median(xs)  # noqa: E731
    ms = lambda r, a, b: (r[b] - r[a]) * 1e3  # noqa: E731
    print(f"\nfile: {args.path} ({os.path.getsize(args.path) / 1e6:.0f} MB), {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, median of {args.runs} fresh processes")
    print(f"prompt {args.prompt!r} -> {ref['ids']}; candidates -> {ref['cids']}")
    cols = ("launch->ready", "interp", "import", "open", "from_gguf", "encode(s)", "GIL/CPU",
            "longest hold")
    print(f"\n{'scenario (ms)':<34}" + "".join(f"{c:>14}" for c in cols))
    for name, *_ in SCENARIOS:
        rs, gs = rows[name], gil[name]
        vals = (
            med([ms(r, "spawn", "ready") for r in rs]),
            med([ms(r, "spawn", "start") for r in rs]),
            med([ms(r, "start", "import") for r in rs]),
            med([ms(r, "import", "open") for r in rs]),
            med([ms(r, "open", "from") for r in rs]),
            med([ms(r, "from", "ready") for r in rs]),
            med([r["cpu"] * 1e3 for r in rs]),
            med([r["longest_gap"] * 1e3 for r in gs]),
        )
        print(f"{name:<34}" + "".join(f"{v:>14.1f}" for v in vals))
    full_rdy = med([ms(r, "spawn", "ready") for r in rows["full: prompt"]])
    fast_rdy = med([ms(r, "spawn", "ready") for r in rows["fast: prompt"]])
    print(f"\nlaunch->ready, prompt: full {full_rdy:.0f} ms -> fast {fast_rdy:.0f} ms "
          f"({full_rdy - fast_rdy:.0f} ms saved)")


if __name__ == "__main__":
    main()
