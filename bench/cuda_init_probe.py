"""Where does a cold CUDA start go on this machine? Fresh processes, ctypes only, per step.

    python3 bench/cuda_init_probe.py [--runs 5] [--module FILE ...] [--json OUT]

Each run is a new Python process (``-S``: no site, so nothing but ctypes is imported) that
dlopens libcuda, calls cuInit, queries device 0, retains the primary context, loads the given
module files (fatbin or cubin) and allocates 64 MiB, timing each step; the parent also times the
whole process from launch to exit. Variants change one thing at a time: context scheduling
flags, CUDA_DEVICE_MAX_CONNECTIONS, CUDA_MODULE_LOADING (EAGER/LAZY). Prints the median of
each step per variant. Used to decide the cold path's design (BENCHMARKS.md); not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import ctypes, json, os, sys, time
t = time.perf_counter()
out = {}
def step(name):
    global t
    now = time.perf_counter(); out[name] = (now - t) * 1e3; t = now
lib = ctypes.CDLL("libcuda.so.1"); step("dlopen")
def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")
ok(lib.cuInit(0), "cuInit"); step("cuInit")
dev = ctypes.c_int(); ok(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
flags = int(os.environ.get("PROBE_CTX_FLAGS", "0"))
if flags:
    ok(lib.cuDevicePrimaryCtxSetFlags_v2(dev, flags), "SetFlags")
step("device")
ctx = ctypes.c_void_p(); ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(lib.cuCtxSetCurrent(ctx), "setcurrent"); step("primary ctx")
for path in [p for p in os.environ.get("PROBE_MODULES", "").split(os.pathsep) if p]:
    data = open(path, "rb").read()
    mod = ctypes.c_void_p()
    ok(lib.cuModuleLoadData(ctypes.byref(mod), data), "load " + path)
    step("load " + os.path.basename(path))
ptr = ctypes.c_uint64()
ok(lib.cuMemAlloc_v2(ctypes.byref(ptr), 64 << 20), "alloc"); step("first alloc 64M")
ok(lib.cuCtxSynchronize(), "sync"); step("sync")
print(json.dumps(out))
"""

VARIANTS = [
    ("default (EAGER)", {"CUDA_MODULE_LOADING": "EAGER"}),
    ("LAZY modules", {"CUDA_MODULE_LOADING": "LAZY"}),
    ("MAX_CONNECTIONS=1", {"CUDA_MODULE_LOADING": "EAGER", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    ("ctx SCHED_SPIN", {"CUDA_MODULE_LOADING": "EAGER", "PROBE_CTX_FLAGS": "1"}),
    ("ctx SCHED_BLOCKING_SYNC", {"CUDA_MODULE_LOADING": "EAGER", "PROBE_CTX_FLAGS": "4"}),
]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--module", action="append", default=[], help="module file(s) to load")
    ap.add_argument("--module-set", action="append", default=[],
                    help="NAME=FILE[:FILE...]: an extra EAGER variant loading these files instead")
    ap.add_argument("--json", help="write all runs here")
    a = ap.parse_args(argv)
    variants = [(n, dict(e, PROBE_MODULES=os.pathsep.join(a.module))) for n, e in VARIANTS]
    for ms in a.module_set:
        name, files = ms.split("=", 1)
        variants.append((f"EAGER {name}", {"CUDA_MODULE_LOADING": "EAGER",
                                           "PROBE_MODULES": files.replace(":", os.pathsep)}))
        variants.append((f"LAZY {name}", {"CUDA_MODULE_LOADING": "LAZY",
                                          "PROBE_MODULES": files.replace(":", os.pathsep)}))
    runs: dict[str, list[dict]] = {n: [] for n, _ in variants}
    for _ in range(a.runs):  # variants interleaved run by run
        for name, extra in variants:
            env = dict(os.environ, **extra)
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-S", "-c", CHILD], env=env, capture_output=True,
                               text=True, timeout=60)
            wall = (time.perf_counter() - t0) * 1e3
            if p.returncode != 0:
                print(f"{name}: failed: {p.stdout.strip()} {p.stderr.strip()[-300:]}")
                continue
            rec = json.loads(p.stdout)
            rec["process wall"] = wall
            runs[name].append(rec)
    for name, recs in runs.items():
        if not recs:
            continue
        keys = list(recs[0])
        med = {k: statistics.median(r[k] for r in recs if k in r) for k in keys}
        print(f"{name:28s} " + "  ".join(f"{k} {v:.1f}" for k, v in med.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
