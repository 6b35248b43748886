"""Read a mapped file range into the page cache at the disk's pace, in file order, on a few threads.

With a cold page cache the weight upload's page-locking faults the file in: each fault reads
one readahead window (``read_ahead_kb``: 128 KiB by default) in 4 KiB pages and waits for it,
so one reader keeps one small request in flight and gets a fraction of the disk. Here:

1. the range is marked ``MADV_HUGEPAGE``: a fault then reads 4 MiB, the second half
   asynchronously, whatever ``read_ahead_kb`` says, and (where the filesystem caches large
   folios) the file stays cached in 2 MiB folios, so later processes map and pin it in big
   steps -- cached 4 KiB at a time, as ``MADV_WILLNEED`` or many threads faulting one mapping
   leave it, a warm 0.64 GB took 28-45 ms to populate instead of ~1 ms on the dev VM;
2. threads take successive chunks of the range in file order -- the order the upload pins
   them, so its next chunk is the one being read -- and ``MADV_POPULATE_READ`` each (Linux
   5.14+): the reads of several chunks are in flight at once, and the page tables the pinning
   walks are filled. One thread starts; the others only once a chunk is found not cached
   (mincore of its first and last page), so a warm page cache costs one thread's pass.

Where the kernel lacks POPULATE_READ (EINVAL) the chunks are only queued (``MADV_WILLNEED``,
asynchronous, in pieces: one call queues at most max(read_ahead_kb, max_sectors_kb)); any
other failure ends the pass quietly: this is an optimisation, whoever touches the pages faults
them in anyway. Stdlib only (ctypes: every call releases the GIL). The helper threads are
daemons, joined before :meth:`Readahead.run` returns; the caller keeps the mapping alive until
then. Measurements: BENCHMARKS.md (2026-12-01, the dev VM), ``bench/readahead_probe.py``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time

PAGE = mmap.PAGESIZE
_MADV_WILLNEED = 3
_MADV_HUGEPAGE = 14
_MADV_POPULATE_READ = 22

# 8 threads x 16 MiB: where the dev VM's rate plateaus with the smallest window ahead of the
# upload (1 thread reached 80-90% of it; 8 MiB chunks were slower).
CHUNK = 16 << 20  # bytes per chunk handed to a thread
PIECE = 1 << 20  # bytes per MADV_WILLNEED call (the fallback)
THREADS = 8


def default_threads() -> int:
    """THREADS, or REFLEX_READAHEAD_THREADS (0: no readahead at all -- for A/B timing)."""
    env = os.environ.get("REFLEX_READAHEAD_THREADS", "")
    return int(env) if env.isdigit() else THREADS


def plan(start: int, end: int, chunk: int = CHUNK, page: int = PAGE) -> list[tuple[int, int]]:
    """(address, length) of the chunks covering ``[start, end)`` in order: the first begins at
    ``start`` rounded down to a page (madvise wants page-aligned addresses), every later one on
    a page boundary, the last ends exactly at ``end``."""
    chunk = max(page, chunk // page * page)
    lo = start // page * page
    return [(a, min(chunk, end - a)) for a in range(lo, end, chunk)]


class Calls:
    """madvise and mincore through libc."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._madvise = libc.madvise
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._madvise.restype = ctypes.c_int
        self._mincore = libc.mincore
        self._mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._mincore.restype = ctypes.c_int

    def madvise(self, addr: int, length: int, advice: int) -> int:
        """0 or the errno."""
        return 0 if self._madvise(addr, length, advice) == 0 else ctypes.get_errno()

    def cached(self, addr: int, length: int) -> bool:
        """Whether the first and the last page of ``[addr, addr + length)`` (``addr``
        page-aligned) are in the page cache; False where mincore fails."""
        vec = ctypes.c_ubyte(0)
        for a in (addr, addr + (length - 1) // PAGE * PAGE):
            if self._mincore(a, PAGE, ctypes.byref(vec)) != 0 or not vec.value & 1:
                return False
        return True


class Readahead:
    """One pass over ``[start, end)`` of a live mapping. ``run()`` does it on the calling
    thread, plus ``threads - 1`` helpers from the first chunk not cached, and returns when
    every chunk is done; the counters say what it did (``note()`` for --timings)."""

    def __init__(self, start: int, end: int, threads: int | None = None, chunk: int = CHUNK,
                 piece: int = PIECE, calls: Calls | None = None):
        self.chunks = plan(start, end, chunk) if end > start else []
        want = default_threads() if threads is None else threads
        self.threads = max(0, min(want, len(self.chunks)))
        self.chunk, self.piece = chunk, max(PAGE, piece // PAGE * PAGE)
        self._calls = calls
        self._lock = threading.Lock()
        self._next = 0
        self._populate = True
        self._failed = False
        self._helpers: list[threading.Thread] = []
        self.huge = False  # the range was marked MADV_HUGEPAGE
        self.done = 0  # bytes of the chunks finished
        self.error = ""  # why the pass stopped early or fell back ("" when it did not)
        self.t0 = self.t1 = 0.0

    def run(self) -> "Readahead":
        self.t0 = time.perf_counter()
        try:
            if not self.threads:
                return self
            if self._calls is None:
                try:
                    self._calls = Calls()
                except (OSError, AttributeError) as e:  # no libc madvise: nothing to do
                    self.error = f"no madvise ({e})"
                    return self
            lo = self.chunks[0][0]
            hi = self.chunks[-1][0] + self.chunks[-1][1]
            # before the first fault: it decides the folio size the file is cached in
            self.huge = self._calls.madvise(lo, hi - lo, _MADV_HUGEPAGE) == 0
            self._work(spawn=self.threads > 1)
        finally:
            for th in self._helpers:  # started by the calling thread only: all known here
                th.join()
            self.t1 = time.perf_counter()
        return self

    def _take(self) -> tuple[int, int] | None:
        with self._lock:
            if self._failed:
                return None
            i = self._next
            self._next += 1
        return self.chunks[i] if i < len(self.chunks) else None

    def _stop(self, what: str, err: int) -> None:
        with self._lock:
            self._failed = True
            self.error = f"{what}: {errno.errorcode.get(err, err)}"

    def _spawn(self) -> None:
        self._helpers = [threading.Thread(target=self._work, args=(False,), daemon=True,
                                          name=f"reflex-readahead-{k}")
                         for k in range(1, self.threads)]
        for th in self._helpers:
            th.start()

    def _work(self, spawn: bool) -> None:
        """Take chunks until none is left; ``spawn``: start the helpers at the first chunk
        not cached (the calling thread's job)."""
        calls = self._calls
        while (c := self._take()) is not None:
            addr, n = c
            if spawn and not calls.cached(addr, n):  # from the disk: read on all threads
                self._spawn()
                spawn = False
            if self._populate:
                err = calls.madvise(addr, n, _MADV_POPULATE_READ)
                if err == errno.EINVAL:  # an older kernel: queue the reads only, from now on
                    with self._lock:
                        self._populate = False
                        self.error = "MADV_POPULATE_READ unsupported: MADV_WILLNEED only"
                elif err:
                    return self._stop("MADV_POPULATE_READ", err)
            if not self._populate:
                for p in range(addr, addr + n, self.piece):
                    err = calls.madvise(p, min(self.piece, addr + n - p), _MADV_WILLNEED)
                    if err:
                        return self._stop("MADV_WILLNEED", err)
            with self._lock:
                self.done += n

    def note(self) -> str:
        """One line for --timings: how much, how, in how long."""
        if not self.chunks:
            return "nothing to read"
        if not self.threads:
            return "off (REFLEX_READAHEAD_THREADS=0)"
        total = sum(n for _, n in self.chunks)
        when = f"in {(self.t1 - self.t0) * 1e3:.0f} ms" if self.t1 else "so far"
        used = 1 + len(self._helpers)
        line = (f"{self.done / 1e9:.2f} of {total / 1e9:.2f} GB {when}, {used} of {self.threads} "
                f"threads x {self.chunk >> 20} MiB chunks"
                f"{'' if self.huge else ', MADV_HUGEPAGE refused'}")
        return f"{line}; {self.error}" if self.error else line
