"""``reflex bench``: warm latencies in one process, and cold launches measured from outside.

Warm (``reflex bench MODEL``): load once, then repeat prefill (a fresh cache each time, the
prompt as one batch, the next token's id on the host), single-token greedy decode steps as
``generate`` runs them (engine.decode_tokens: a step is the time from one token's arrival on the
host to the next one's), and a system1 scoring pass; median and p90 in milliseconds. Every
timed region ends with a host read of a result, so GPU work is included.

Cold (``reflex bench --cold MODEL``): N fresh processes of ``reflex generate MODEL PROMPT -n 1``
(or ``reflex system1`` with ``--system1``), wall time from ``subprocess`` launch to exit measured
outside the process, GPU energy per run from NVML's cumulative energy counter (mJ), raw and with
the idle baseline (measured in the same run, before the launches) subtracted. The process exits
right after printing its first token, so launch -> exit is launch -> first token plus exit.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_CANDIDATES = (" Paris", " London", " Berlin")


def summary(xs: Sequence[float]) -> dict:
    s = sorted(xs)
    if not s:
        return {"n": 0}
    p90 = s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]
    return {"n": len(s), "median": statistics.median(s), "p90": p90, "min": s[0], "max": s[-1]}


# --------------------------------------------------------------------------------------------
# warm


def warm(path: str, backend: str = "auto", prompt: str = DEFAULT_PROMPT, reps: int = 20,
         n_decode: int = 32, candidates: Sequence[str] = DEFAULT_CANDIDATES) -> dict:
    from . import engine, system1

    lm, ids = engine.load(path, backend, prompt=prompt)
    for note in lm.notices:  # the fall back to the CPU, as generate says it
        engine.warn(note)
    ids = ids or []
    model, ops = lm.model, lm.ops
    cand_ids = system1.tokenize_candidates(lm.require_tokenizer(), candidates)

    def prefill() -> tuple[Any, int]:
        state = model.new_state(len(ids) + n_decode + 1)
        b = state.append(ids)
        nxt = ops.argmax(model.forward(b, state, [b.n_tokens - 1]))[-1]
        return state, nxt

    for _ in range(2):  # warm-up: first launches, allocator pools
        prefill()
        system1.score(model, ops, ids, cand_ids)
    launches = _launches_per_pass(lm.backend, prefill, lambda: system1.score(model, ops, ids,
                                                                              cand_ids))
    pre, dec, s1 = [], [], []
    decode_note = "eager"
    for _ in range(reps):
        t0 = time.perf_counter()
        state, nxt = prefill()
        pre.append((time.perf_counter() - t0) * 1e3)
        graph = engine.decode_graph(lm)  # as generate decodes (REFLEX_CUDA_GRAPHS=0: eager)
        chain = None if graph is None else graph.device_pick(0.0, 0, 1.0, 0.0, None)
        try:
            t0 = time.perf_counter()
            tokens = engine.decode_tokens(model, state, graph, lambda x: ops.argmax(x)[-1], nxt,
                                          n_decode + 1, chain)
            next(tokens)  # nxt itself
            for _ in tokens:  # the time from one token's arrival to the next's
                t1 = time.perf_counter()
                dec.append((t1 - t0) * 1e3)
                t0 = t1
        finally:
            if graph is not None:
                decode_note = graph.note
                graph.close()
        t0 = time.perf_counter()
        system1.score(model, ops, ids, cand_ids)
        s1.append((time.perf_counter() - t0) * 1e3)
    return {"mode": "warm", "model": path, "backend": lm.backend, "device": lm.device,
            "n_prompt_tokens": len(ids), "n_decode": n_decode, "reps": reps,
            "candidates": list(candidates),
            "prefill_ms": summary(pre), "decode_ms_per_token": summary(dec),
            "system1_ms": summary(s1), "kernel_launches": launches, "decode": decode_note}


def _launches_per_pass(backend: str, prefill: Callable, score: Callable) -> dict:
    """CUDA kernel launches of one prefill (incl. its argmax) and one system1 scoring pass."""
    if backend != "cuda":
        return {}
    from .cuda.modules import launch_count

    n0 = launch_count()
    prefill()
    n1 = launch_count()
    score()
    return {"prefill": n1 - n0, "system1": launch_count() - n1}


# --------------------------------------------------------------------------------------------
# cold


class Energy:
    """NVML cumulative GPU energy (joules) of device 0, or None when NVML is unavailable."""

    def __init__(self) -> None:
        self.handle = None
        self.error = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
            self._read()
        except Exception as e:  # noqa: BLE001 - no NVML: report walls without joules
            self.handle = None
            self.error = f"{type(e).__name__}: {e}"

    def read(self) -> float | None:
        return self._read() if self.handle is not None else None


def drop_page_cache(files: Sequence[str]) -> str:
    """Evict ``files`` (and, as root, everything) from the page cache. Returns the method used."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def idle_watts(energy: Energy, seconds: float) -> float | None:
    e0 = energy.read()
    if e0 is None:
        return None
    time.sleep(seconds)
    return (energy.read() - e0) / seconds


def measure(cmd: list[str], energy: Energy, idle_w: float | None, settle: float = 0.3,
            before: Callable[[], None] | None = None) -> dict:
    """One fresh process: wall seconds launch -> exit, GPU joules (raw and minus idle)."""
    if before is not None:
        before()
    e0 = energy.read()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    time.sleep(settle)  # NVML's counter lags; read after the tail of the run
    e1 = energy.read()
    out = (p.stdout + p.stderr).strip().splitlines()
    r = {"rc": p.returncode, "wall_s": wall, "tail": out[-2:] if out else []}
    if e0 is not None and e1 is not None:
        r["gpu_j"] = e1 - e0
        if idle_w is not None:
            r["gpu_j_minus_idle"] = (e1 - e0) - idle_w * (wall + settle)
    return r


def reflex_cmd() -> list[str]:
    exe = (shutil.which("reflex", path=os.path.dirname(sys.executable))
           or shutil.which("reflex"))
    return [exe] if exe else [sys.executable, "-m", "reflex_core"]


def cold(path: str, runs: int = 5, prompt: str = DEFAULT_PROMPT, system1: bool = False,
         candidates: Sequence[str] = DEFAULT_CANDIDATES, backend: str = "cuda",
         drop_cache: bool = False, idle_s: float = 3.0, warmup: bool = True) -> dict:
    """``runs`` fresh processes, launch -> exit wall time and GPU energy. ``warmup``: one run
    first, not counted (it fills the page cache and writes the file's index, so the timed runs
    measure the steady state of "a file used before"; with ``drop_cache`` every timed run still
    starts from a dropped cache). Its result is kept under "warmup"."""
    # the prompt after "--": text that begins with '-' (even "--help") is the prompt
    if system1:
        cmd = reflex_cmd() + ["system1", path, "--backend", backend]
        for c in candidates:
            cmd += ["--candidate", c]
    else:
        cmd = reflex_cmd() + ["generate", path, "-n", "1", "--backend", backend]
    cmd += ["--", prompt]
    energy = Energy()
    idle = idle_watts(energy, idle_s)
    method = ""

    def before() -> None:
        nonlocal method
        if drop_cache:
            method = drop_page_cache([path])

    first = None
    if warmup:
        first = measure(cmd, energy, idle)
        # the warm-up's exit spawned the index writer; make sure the index exists before the
        # timed runs (a no-op when the writer was first)
        if first["rc"] == 0:
            from . import gguf_index

            gguf_index.refresh(path)
    res = [measure(cmd, energy, idle, before=before) for _ in range(runs)]
    ok = [r for r in res if r["rc"] == 0]
    out = {"mode": "cold", "command": cmd, "warmup": first, "runs": res, "n_ok": len(ok),
           "wall_s": summary([r["wall_s"] for r in ok]), "idle_w": idle,
           "page_cache": f"dropped ({method})" if drop_cache else "warm",
           "nvml": energy.error or "ok"}
    if ok and "gpu_j" in ok[0]:
        out["gpu_j"] = summary([r["gpu_j"] for r in ok])
        if "gpu_j_minus_idle" in ok[0]:
            out["gpu_j_minus_idle"] = summary([r["gpu_j_minus_idle"] for r in ok])
    return out
