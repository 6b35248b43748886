"""Host memory for the GPU: addresses of (read-only) buffers, page-locking, the weight upload.

``upload_host_region`` is the cold-path weight upload: page-lock the (read-only) mmap range
chunk by chunk with ``cuMemHostRegister(READ_ONLY)`` on several threads, each chunk's copy
queued as soon as it is pinned (falling back to a pageable copy for a chunk whose registration
is refused).

Threads: the upload's worker threads are joined before ``upload_host_region`` returns or
raises, and no registration is released while a copy queued from it may still be running
(after a failure the whole context is synchronized first). :func:`buffer_address` and
:func:`page_range` are plain ctypes: importing this module imports no CUDA.
"""

from __future__ import annotations

import ctypes
import mmap as _mmap
import os
import threading
import time
from typing import Any

from . import driver as _drv
from .driver import check, ensure_context


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_GetBuffer.restype = ctypes.c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_ReleaseBuffer.restype = None
_PyBUF_SIMPLE = 0


def buffer_address(obj: Any) -> tuple[int, int]:
    """(address, nbytes) of a contiguous buffer -- read-only ones too (an ``mmap`` opened with
    ACCESS_READ, ``bytes``): PyObject_GetBuffer with PyBUF_SIMPLE, released at once. The address
    stays valid only while ``obj`` is alive and not resized or closed."""
    view = _PyBuffer()
    if _GetBuffer(obj, ctypes.byref(view), _PyBUF_SIMPLE) != 0:  # raises via pythonapi
        raise TypeError(f"{type(obj).__name__} does not expose a contiguous buffer")
    try:
        return int(view.buf or 0), int(view.len)
    finally:
        _ReleaseBuffer(ctypes.byref(view))


def page_range(addr: int, nbytes: int, page: int = _mmap.PAGESIZE) -> tuple[int, int]:
    """(start, length) of the page-aligned range enclosing ``[addr, addr + nbytes)``."""
    start = addr & ~(page - 1)
    end = (addr + nbytes + page - 1) & ~(page - 1)
    return start, end - start


class HostRegistration:
    """A page-locked host range (cuMemHostRegister); ``release()`` unregisters it."""

    def __init__(self, start: int, length: int, keepalive: Any):
        self.start, self.length = start, length
        self._keep = keepalive  # the mmap must outlive the registration

    def release(self) -> None:
        if self.length:
            ensure_context()
            check(_drv._d.cuMemHostUnregister(self.start), "cuMemHostUnregister")
            self.length = 0
            self._keep = None


def host_register(addr: int, nbytes: int, keepalive: Any = None,
                  read_only: bool = True) -> tuple[HostRegistration | None, str]:
    """Page-lock the page-aligned range enclosing ``[addr, addr+nbytes)``.
    Returns (registration, "") or (None, why it was refused)."""
    ensure_context()
    d = _drv._d
    start, length = page_range(addr, nbytes)
    flags = d.CU_MEMHOSTREGISTER_READ_ONLY if read_only else 0
    r = d.cuMemHostRegister(start, length, flags)
    if r[0] != _drv._SUCCESS:
        return None, _drv.error_text(r[0])
    return HostRegistration(start, length, keepalive), ""


def pin_views(views: list) -> tuple[HostRegistration | None, str]:
    """Page-lock the host range spanned by ``views`` (slices of one buffer, such as a mapped
    state file's buffers) so that host-to-device copies from them run at DMA speed instead of
    through the driver's pageable staging. Returns (registration, "") or (None, why); the
    registration keeps the views (and so their buffer) alive."""
    spans = [buffer_address(v) for v in views]
    spans = [(a, n) for a, n in spans if n]
    if not spans:
        return None, "nothing to pin"
    lo = min(a for a, _ in spans)
    hi = max(a + n for a, n in spans)
    return host_register(lo, hi - lo, keepalive=list(views), read_only=True)


class Registrations:
    """Several page-locked ranges released together (the chunks of one upload)."""

    def __init__(self, regs: list) -> None:
        self.regs = regs

    def release(self) -> None:
        for r in self.regs:
            r.release()
        self.regs = []


UPLOAD_CHUNK = 64 << 20  # bytes per registered chunk


def _upload_threads() -> int:
    """4 pinning threads (REFLEX_UPLOAD_THREADS overrides). Measured on the H200 machine, 640 MB:
    4 threads pin in ~75 thread-ms in all; 8 threads took 115-150 thread-ms (the kernel's page
    pinning contends) and no less wall time."""
    env = os.environ.get("REFLEX_UPLOAD_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return 4


def upload_host_region(dst: int, src: Any, offset: int, nbytes: int,
                       register: bool = True, chunk: int | None = None,
                       threads: int | None = None) -> dict:
    """Copy ``src[offset : offset+nbytes]`` (an mmap or any buffer) to device ``dst``.

    The cold-path weight upload. The page-aligned range is cut into chunks (UPLOAD_CHUNK); a few
    worker threads each page-lock a chunk (``cuMemHostRegister`` READ_ONLY: CPU work, pinning
    the pages) and queue its copy on their own stream (``cuMemcpyHtoDAsync``: DMA), so pinning
    the next chunks overlaps the copies of the previous ones. A chunk whose registration is
    refused is copied from pageable memory instead. Returns when every byte is on the device:
    {"method", "register_ms" (summed over chunks), "copy_ms" (wall), "chunks", "threads",
    "registration", "why"}; the caller keeps "registration" and releases it (or lets the
    process exit). On a failure every worker is joined and every queued copy has finished
    before the registrations are released and the first error is raised."""
    ensure_context()
    d = _drv._d
    base, total = buffer_address(src)
    if offset < 0 or offset + nbytes > total:
        raise ValueError(f"upload range [{offset}, {offset + nbytes}) outside a buffer of {total}")
    addr = base + offset
    t0 = time.perf_counter()
    if not (register and nbytes):
        if nbytes:
            check(d.cuMemcpyHtoD(dst, addr, nbytes), f"cuMemcpyHtoD(weights, {nbytes} bytes)")
        return {"method": "pageable", "register_ms": 0.0,
                "copy_ms": (time.perf_counter() - t0) * 1e3, "chunks": 1, "threads": 0,
                "registration": None, "why": "not requested"}
    chunk = max(_mmap.PAGESIZE, (chunk or UPLOAD_CHUNK) // _mmap.PAGESIZE * _mmap.PAGESIZE)
    start, length = page_range(addr, nbytes)
    spans = [(s, min(chunk, start + length - s)) for s in range(start, start + length, chunk)]
    n_threads = max(1, min(threads or _upload_threads(), len(spans)))
    lock = threading.Lock()
    todo = iter(range(len(spans)))
    regs: list = []
    reg_ms = [0.0]
    why: list[str] = []
    errors: list[BaseException] = []
    flags = d.CU_MEMHOSTREGISTER_READ_ONLY

    def worker() -> None:
        try:
            ensure_context()
            stream = check(d.cuStreamCreate(0), "cuStreamCreate")
            try:
                while not errors:  # another worker failed: queue nothing more
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        break
                    s0, n = spans[i]
                    lo, hi = max(s0, addr), min(s0 + n, addr + nbytes)
                    r0 = time.perf_counter()
                    r = d.cuMemHostRegister(s0, n, flags)
                    r1 = time.perf_counter()
                    if r[0] == _drv._SUCCESS:
                        with lock:
                            regs.append(HostRegistration(s0, n, src))
                            reg_ms[0] += (r1 - r0) * 1e3
                        check(d.cuMemcpyHtoDAsync(dst + (lo - addr), lo, hi - lo, stream),
                              f"cuMemcpyHtoDAsync(weights, {hi - lo} bytes)")
                    else:
                        with lock:
                            why.append(_drv.error_text(r[0]))
                        check(d.cuMemcpyHtoD(dst + (lo - addr), lo, hi - lo),
                              f"cuMemcpyHtoD(weights, {hi - lo} bytes)")
                check(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
            finally:
                d.cuStreamDestroy(stream)  # its queued copies still complete
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(e)

    pool = [threading.Thread(target=worker, name=f"reflex-upload-{k}", daemon=True)
            for k in range(n_threads - 1)]
    for th in pool:
        th.start()
    worker()  # the calling thread works too
    for th in pool:
        th.join()
    registration = Registrations(regs)
    if errors:
        # A failed worker skipped its stream's synchronize, and a destroyed stream's copies go
        # on: wait for every copy of the context before unpinning the pages they read (an
        # error here means the context is unusable anyway; the first error is the story).
        d.cuCtxSynchronize()
        try:
            registration.release()
        except Exception:  # noqa: BLE001 - a broken context: the worker's error says why
            pass
        raise errors[0]
    method = "registered" if not why else ("pageable" if not regs else "mixed")
    return {"method": method, "register_ms": reg_ms[0],
            "copy_ms": (time.perf_counter() - t0) * 1e3, "chunks": len(spans),
            "threads": n_threads, "registration": registration,
            "why": why[0] if why else ""}
