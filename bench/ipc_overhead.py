"""Per-request overhead of ``reflex stdio`` and ``reflex uds``: N system1 requests each way, and
for each (reply received - request sent) - result.compute_ms, the time the server spent on the
job itself. Reports median and p99 per mode (ms) as one JSON object.

    python bench/ipc_overhead.py MODEL.gguf [-n 200] [--backend cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REQUEST = {"op": "system1", "prompt": "The capital of France is",
           "candidates": [" Paris", " London", " Berlin"]}
WARMUP = 5


def measure(w, r, n: int) -> list[float]:
    over = []
    for i in range(-WARMUP, n):
        line = json.dumps({"id": i, **REQUEST}).encode() + b"\n"
        t0 = time.perf_counter()
        w.write(line)
        w.flush()
        reply = json.loads(r.readline())
        dt = (time.perf_counter() - t0) * 1e3
        if "error" in reply:
            sys.exit(f"error: the server said {reply['error']}")
        if i >= 0:
            over.append(dt - reply["result"]["compute_ms"])
    return over


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs), 4),
            "p99_ms": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 4), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args()
    server = [sys.executable, "-m", "reflex_core"]
    out = {}
    p = subprocess.Popen([*server, "stdio", a.model, "--backend", a.backend],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out["stdio"] = summary(measure(p.stdin, p.stdout, a.n))
    p.stdin.close()
    p.wait()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "reflex.sock")
        p = subprocess.Popen([*server, "uds", a.model, path, "--backend", a.backend])
        try:
            while True:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    s.close()
                    if p.poll() is not None:
                        sys.exit("error: the uds server ended before it listened")
                    time.sleep(0.02)
            out["uds"] = summary(measure(s.makefile("wb"), s.makefile("rb"), a.n))
            s.close()
        finally:
            p.terminate()
            p.wait()
    print(json.dumps({"model": a.model, "backend": a.backend, "request": REQUEST, **out},
                     indent=1))


if __name__ == "__main__":
    main()
