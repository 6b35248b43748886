"""The disk alone, then the page-cache readahead (reflex_core.readahead) over the same files.

    python bench/readahead_probe.py FILE [FILE...] [--runs 3] [--threads 1,2,4,8]
                                    [--rows direct,buffered,old,readahead,warm,pipeline]
                                    [--chunk-mib 16] [--out probe.json]

Needs root (the page cache is dropped before every cold run: sync; echo 3 > drop_caches).
Per file, each run in turn (so drift hits every row alike), the --rows chosen (default all):
  direct Tx64M  -- O_DIRECT reads of 64 MiB blocks on T threads in file order (the disk's
                   bandwidth without the page cache; T = 1 and the largest --threads);
  buffered 1M   -- read() of 1 MiB blocks, one thread (dd without iflag=direct);
  old prefetch  -- what engine.prefetch did before reflex_core.readahead: one MADV_POPULATE_READ
                   over the whole mapping, one thread;
  readahead T   -- reflex_core.readahead over the whole file on T threads, cold;
  warm T        -- the same with every page already cached, as the readahead leaves it (its
                   cost on a warm start);
  pipeline X    -- a stand-in for the cold path: prefetch X starts, and --upload-delay-ms later
                   (CUDA init) 4 threads fault the range in 64 MiB chunks in file order, as the
                   upload's cuMemHostRegister does (MADV_POPULATE_READ: the same page faults);
                   the time until the last chunk is in (X: none, old, readahead at the
                   default threads).
Prints medians (min-max) in MB/s and ms, and each readahead row's fraction of the best
O_DIRECT rate.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import threading
import time
from pathlib import Path

from reflex_core import readahead
from reflex_core.bench import drop_page_cache
from reflex_core.cuda.upload import buffer_address

DIRECT_BLOCK = 64 << 20
ROWS = ("direct", "buffered", "old", "readahead", "warm", "pipeline")


def direct_read(path: str, threads: int) -> float:
    """Seconds to read the whole file with O_DIRECT, ``threads`` readers taking blocks in order."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size
    nxt = [0]
    lock = threading.Lock()

    def worker() -> None:
        buf = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT requires
        view = memoryview(buf)
        while True:
            with lock:
                off = nxt[0]
                nxt[0] += DIRECT_BLOCK
            if off >= size:
                break
            got, want = 0, min(DIRECT_BLOCK, size - off)
            while got < want:  # a short read at EOF ends the block
                n = os.preadv(fd, [view[got:]], off + got)
                if n <= 0:
                    break
                got += n
        view.release()
        buf.close()

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    os.close(fd)
    return time.perf_counter() - t0


def buffered_read(path: str) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(1 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def readahead_pass(path: str, threads: int, chunk: int) -> tuple[float, str]:
    """Seconds for one pass over the whole mapped file, and its --timings note."""
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    os.close(fd)
    base, size = buffer_address(mm)
    r = readahead.Readahead(base, base + size, threads=threads, chunk=chunk).run()
    note = r.note()
    mm.close()
    return r.t1 - r.t0, note


def old_prefetch(path: str) -> float:
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    os.close(fd)
    base, size = buffer_address(mm)
    t0 = time.perf_counter()
    readahead.Calls().madvise(base, size, 22)  # MADV_POPULATE_READ
    dt = time.perf_counter() - t0
    mm.close()
    return dt


def pipeline(path: str, prefetch: str, delay_s: float) -> float:
    """Seconds from the prefetch's start until a simulated upload has faulted every chunk."""
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    os.close(fd)
    base, size = buffer_address(mm)
    calls = readahead.Calls()
    t0 = time.perf_counter()
    if prefetch == "old":
        job = threading.Thread(target=calls.madvise, args=(base, size, 22))
    elif prefetch == "readahead":
        job = threading.Thread(target=readahead.Readahead(base, base + size).run)
    else:
        job = None
    if job is not None:
        job.start()
    time.sleep(delay_s)
    chunks = iter(readahead.plan(base, base + size, 64 << 20))
    lock = threading.Lock()

    def pin() -> None:
        while True:
            with lock:
                c = next(chunks, None)
            if c is None:
                return
            calls.madvise(c[0], c[1], 22)

    pool = [threading.Thread(target=pin) for _ in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    dt = time.perf_counter() - t0
    if job is not None:
        job.join()
    mm.close()
    return dt


def med(xs: list[float], digits: int = 0) -> str:
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--chunk-mib", type=int, default=readahead.CHUNK >> 20)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--upload-delay-ms", type=float, default=250.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    ts = [int(x) for x in a.threads.split(",")]
    want = set(a.rows.split(","))
    if want - set(ROWS):
        ap.error(f"--rows: unknown {', '.join(sorted(want - set(ROWS)))} (from {', '.join(ROWS)})")
    chunk = a.chunk_mib << 20
    report = {"chunk": chunk, "files": {}}
    for path in a.files:
        size = os.path.getsize(path)
        rows: dict[str, list[float]] = {}
        notes: dict[str, str] = {}

        def timed(name: str, fn, cold: bool = True) -> None:
            if cold:
                drop_page_cache([path])
            dt = fn()
            if isinstance(dt, tuple):
                dt, notes[name] = dt
            rows.setdefault(name, []).append(dt)
            print(f"{Path(path).name} {name}: {dt * 1e3:.0f} ms, {size / dt / 1e6:.0f} MB/s",
                  flush=True)

        for _ in range(a.runs):
            if "direct" in want:
                for t in sorted({1, max(ts)}):
                    timed(f"direct {t}x64M", lambda t=t: direct_read(path, t))
            if "buffered" in want:
                timed("buffered 1M", lambda: buffered_read(path))
            if "old" in want:
                timed("old prefetch", lambda: old_prefetch(path))
            if "readahead" in want:
                for t in ts:
                    timed(f"readahead {t}", lambda t=t: readahead_pass(path, t, chunk))
            if "warm" in want:  # the cache as the readahead leaves it (2 MiB folios)
                readahead_pass(path, max(ts), chunk)
                for t in ts:
                    timed(f"warm {t}", lambda t=t: readahead_pass(path, t, chunk),
                          cold=False)
            if "pipeline" in want:
                for x in ("none", "old", "readahead"):
                    timed(f"pipeline {x}",
                          lambda x=x: pipeline(path, x, a.upload_delay_ms / 1e3))
        best = max((size / statistics.median(v) for k, v in rows.items()
                    if k.startswith("direct")), default=None)
        print(f"\n{Path(path).name}: {size / 1e9:.2f} GB, chunk {chunk >> 20} MiB, "
              f"{a.runs} runs, medians (min-max)")
        print("| row | ms | MB/s | of O_DIRECT best |\n|---|---|---|---|")
        for name, v in rows.items():
            rate = [size / x / 1e6 for x in v]
            frac = (f"{size / statistics.median(v) / best:.0%}"
                    if best and not name.startswith("warm") else "-")
            print(f"| {name} | {med([x * 1e3 for x in v], 1)} | {med(rate)} | {frac} |")
        report["files"][path] = {"size": size, "seconds": rows, "notes": notes}
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
