"""The page-cache readahead of the tensor data (reflex_core.readahead, engine.prefetch).

Most cases run the pass over a fake ``Calls`` that records every madvise (so the order, the
coverage and the threads are visible, and failures can be injected); two run the real system
calls over a small mapped file. The disk-bandwidth side is measured by bench/readahead_probe.py,
not here.
"""

from __future__ import annotations

import errno
import mmap
import subprocess
import sys
import threading
import types

import pytest

from reflex_core import engine, readahead
from reflex_core.cuda.upload import buffer_address
from reflex_core.readahead import PAGE, Readahead, plan

HUGE, WILLNEED, POPULATE = 14, 3, 22


class FakeCalls:
    """Records (advice, addr, length, thread name); ``fail`` maps an advice to the errno it
    returns; ``cached_below``: the chunks starting below it are in the page cache."""

    def __init__(self, fail: dict[int, int] | None = None, cached_below: int = 0):
        self.fail = fail or {}
        self.cached_below = cached_below
        self.log: list[tuple[int, int, int, str]] = []
        self._lock = threading.Lock()

    def cached(self, addr: int, length: int) -> bool:
        return addr < self.cached_below

    def madvise(self, addr: int, length: int, advice: int) -> int:
        with self._lock:
            self.log.append((advice, addr, length, threading.current_thread().name))
        return self.fail.get(advice, 0)

    def spans(self, advice: int) -> list[tuple[int, int]]:
        return sorted((a, n) for adv, a, n, _ in self.log if adv == advice)


def covers_once(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """The sorted spans tile [lo, hi) with no gap and no overlap."""
    at = lo
    for a, n in spans:
        if a != at or n <= 0:
            return False
        at += n
    return at == hi


@pytest.mark.parametrize("start,end,chunk", [
    (0, 10 * PAGE, 4 * PAGE),               # aligned, last chunk short
    (123, 9 * PAGE + 7, 2 * PAGE),          # neither end aligned
    (5 * PAGE + 1, 5 * PAGE + 2, 4 * PAGE),  # one byte
    (PAGE, 3 * PAGE, 3 * PAGE + 5),         # a chunk size off the page grid
])
def test_plan_tiles_the_range_in_order(start, end, chunk):
    chunks = plan(start, end, chunk)
    lo = start // PAGE * PAGE
    assert chunks == sorted(chunks)
    assert covers_once(chunks, lo, end)
    assert all(a % PAGE == 0 for a, _ in chunks)
    assert all(n <= max(PAGE, chunk // PAGE * PAGE) for _, n in chunks)


def test_chunks_are_handed_out_in_file_order():
    r = Readahead(0, 7 * PAGE + 9, threads=3, chunk=2 * PAGE, calls=FakeCalls())
    taken = []
    while (c := r._take()) is not None:
        taken.append(c)
    assert taken == plan(0, 7 * PAGE + 9, 2 * PAGE)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_every_chunk_populated_once_on_bounded_threads(threads):
    start, end = 3 * PAGE + 17, 40 * PAGE + 5
    calls = FakeCalls()
    r = Readahead(start, end, threads=threads, chunk=4 * PAGE, calls=calls).run()
    lo = 3 * PAGE
    assert r.error == "" and r.huge
    assert r.done == end - lo
    assert calls.log[0][:3] == (HUGE, lo, end - lo)  # before any read: it sets the folio size
    assert covers_once(calls.spans(POPULATE), lo, end)
    assert not calls.spans(WILLNEED)
    names = {name for adv, *_, name in calls.log if adv == POPULATE}
    assert len(names) <= threads == r.threads
    assert f", {threads} of {threads} threads x " in r.note()  # all started: nothing cached
    if threads == 1:  # one thread: the calls themselves come in file order
        assert [(a, n) for adv, a, n, _ in calls.log if adv == POPULATE] == calls.spans(POPULATE)


def test_warm_cache_stays_on_one_thread():
    calls = FakeCalls(cached_below=1 << 62)
    r = Readahead(0, 64 * PAGE, threads=4, chunk=4 * PAGE, calls=calls).run()
    assert r.done == 64 * PAGE and covers_once(calls.spans(POPULATE), 0, 64 * PAGE)
    assert {name for *_, name in calls.log} == {threading.current_thread().name}
    assert ", 1 of 4 threads x " in r.note()


def test_helpers_start_at_the_first_chunk_not_cached():
    chunk = 4 * PAGE
    calls = FakeCalls(cached_below=3 * chunk)  # chunks 0-2 cached, 3 on from the disk
    r = Readahead(0, 64 * PAGE, threads=4, chunk=chunk, calls=calls).run()
    me = threading.current_thread().name
    helpers = [a for adv, a, _, name in calls.log if adv == POPULATE and name != me]
    assert helpers and min(helpers) >= 4 * chunk  # chunk 3 was the calling thread's
    assert covers_once(calls.spans(POPULATE), 0, 64 * PAGE)
    assert ", 4 of 4 threads x " in r.note()


def test_threads_bounded_by_chunks_and_env(monkeypatch):
    assert Readahead(0, 3 * PAGE, threads=64, chunk=PAGE, calls=FakeCalls()).threads == 3
    monkeypatch.setenv("REFLEX_READAHEAD_THREADS", "2")
    assert Readahead(0, 30 * PAGE, chunk=PAGE, calls=FakeCalls()).threads == 2
    monkeypatch.setenv("REFLEX_READAHEAD_THREADS", "0")
    calls = FakeCalls()
    r = Readahead(0, 30 * PAGE, chunk=PAGE, calls=calls).run()
    assert r.threads == 0 and not calls.log and r.note().startswith("off")
    monkeypatch.setenv("REFLEX_READAHEAD_THREADS", "lots")  # not a count: the default
    assert Readahead(0, 30 * PAGE, chunk=PAGE, calls=FakeCalls()).threads == readahead.THREADS


def test_empty_range_does_nothing():
    calls = FakeCalls()
    r = Readahead(5 * PAGE, 5 * PAGE, threads=4, calls=calls).run()
    assert r.chunks == [] and r.threads == 0 and not calls.log
    assert r.note() == "nothing to read"


def test_no_populate_read_falls_back_to_willneed_quietly():
    start, end = 0, 10 * PAGE + 3
    calls = FakeCalls({POPULATE: errno.EINVAL})
    r = Readahead(start, end, threads=1, chunk=4 * PAGE, piece=PAGE, calls=calls).run()
    assert r.done == end
    assert "MADV_WILLNEED only" in r.error and "MADV_WILLNEED only" in r.note()
    assert len(calls.spans(POPULATE)) == 1  # asked once, then not again
    assert covers_once(calls.spans(WILLNEED), 0, end)
    assert all(n <= PAGE for _, n in calls.spans(WILLNEED))


def test_other_errors_stop_the_pass_quietly():
    calls = FakeCalls({POPULATE: errno.ENOMEM, HUGE: errno.EINVAL})
    r = Readahead(0, 20 * PAGE, threads=4, chunk=2 * PAGE, calls=calls).run()
    assert r.error == "MADV_POPULATE_READ: ENOMEM"
    assert r.done == 0 and not r.huge
    assert len(calls.spans(POPULATE)) <= 4  # each thread stops after its failed call
    assert "MADV_HUGEPAGE refused" in r.note()


def test_no_libc_madvise_is_quiet(monkeypatch):
    def no_libc(*a, **k):
        raise OSError("no libc here")

    monkeypatch.setattr(readahead.ctypes, "CDLL", no_libc)
    r = Readahead(0, 4 * PAGE, threads=2).run()
    assert r.done == 0 and r.error.startswith("no madvise")


def _mapped(tmp_path, size: int) -> mmap.mmap:
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    with open(p, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


@pytest.mark.parametrize("size,offset", [(10, 3), (5 * (1 << 20) + 123, 4096 + 77)])
def test_real_calls_over_a_mapped_file(tmp_path, size, offset):
    mm = _mapped(tmp_path, size)
    try:
        base, total = buffer_address(mm)
        r = Readahead(base + offset, base + total, threads=3, chunk=1 << 20).run()
        assert r.done == total - offset // PAGE * PAGE
        assert r.error in ("", "MADV_POPULATE_READ unsupported: MADV_WILLNEED only")
        assert mm[total - 1:total] == (b"x" if size % 256 else bytes([255]))  # still readable
    finally:
        mm.close()


def test_engine_prefetch_reports_in_the_notes(tmp_path):
    mm = _mapped(tmp_path, 3 * (1 << 20) + 5)
    g = types.SimpleNamespace(mm=mm, data_offset=1000)
    notes: dict[str, str] = {}
    job = engine.prefetch(g, notes)
    assert "readahead" in notes  # there before the job ends: the job only rewrites it
    job.wait()
    mm.close()
    assert job.succeeded()
    # the whole mapping (data_offset < one page), finished, no error
    assert notes["readahead"].startswith("0.00 of 0.00 GB in ")
    assert " threads x 16 MiB chunks" in notes["readahead"] and ";" not in notes["readahead"]


def test_engine_imports_readahead_only_when_prefetching():
    code = ("import sys, reflex_core.engine; "
            "print('reflex_core.readahead' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_readahead_module_needs_only_the_stdlib():
    code = ("import sys; before = set(sys.modules); import reflex_core.readahead; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(new - set(sys.stdlib_module_names) - {'reflex_core'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
