"""Device memory: the caching allocator, copies and fills, timing events.

``alloc``/``free`` go through a caching allocator (free lists keyed by rounded size), so the
per-op activations of a forward pass do not call ``cuMemAlloc``. All copies use the legacy
default stream: they run in issue order, and a synchronous ``htod`` from pageable memory waits
for earlier work first, so reusing a cached buffer is always safe.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import CudaError
from . import driver as _drv
from .driver import check, ensure_context


def _round_size(n: int) -> int:
    """Bucket size of the caching allocator: powers of two up to 1 MiB, then 1 MiB multiples."""
    if n <= 512:
        return 512
    if n <= (1 << 20):
        return 1 << (n - 1).bit_length()
    return (n + (1 << 20) - 1) & ~((1 << 20) - 1)


class _Pool:
    def __init__(self) -> None:
        self.free: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}  # live pool pointer -> bucket size
        self.cached_bytes = 0
        self.live_bytes = 0
        # re-entrant: a garbage collection triggered inside a locked section may run a block's
        # __del__ -> release() on this very thread
        self.lock = threading.RLock()
        # Decode graphs (reflex_core.backends.cuda_graph): ``recording`` lists what is allocated
        # while a step is traced or captured, in order; a captured graph's blocks are ``held``
        # (pointer -> released by its owner yet) until the graph is destroyed, since its
        # replays write them.
        self.recording: dict[int, int] | None = None
        self.held: dict[int, bool] = {}

    def alloc(self, nbytes: int) -> int:
        size = 512 if nbytes <= 512 else _round_size(int(nbytes))
        with self.lock:
            lst = self.free.get(size)
            if lst:
                ptr = lst.pop()
                self.cached_bytes -= size
                self.sizes[ptr] = size
                self.live_bytes += size
                if self.recording is not None:
                    self.recording[ptr] = size
                return ptr
        ptr = mem_alloc_raw(size, retry=self.trim)
        with self.lock:
            self.sizes[ptr] = size
            self.live_bytes += size
            if self.recording is not None:
                self.recording[ptr] = size
        return ptr

    def release(self, ptr: int) -> None:
        with self.lock:
            if ptr in self.held:  # a captured graph still uses it: kept until release_held
                self.held[ptr] = True
                return
            size = self.sizes.pop(ptr, None)
            if size is None:
                raise ValueError(f"free({ptr:#x}): not a pointer from memory.alloc "
                                 f"(double free?)")
            self.live_bytes -= size
            lst = self.free.get(size)
            if lst is None:
                lst = self.free[size] = []
            lst.append(ptr)
            self.cached_bytes += size

    def trim(self) -> int:
        """Give every cached (unused) block back to the driver; returns bytes freed."""
        with self.lock:
            blocks = [p for lst in self.free.values() for p in lst]
            freed = self.cached_bytes
            self.free.clear()
            self.cached_bytes = 0
        if blocks:
            _drv.synchronize()
        for p in blocks:
            check(_drv._d.cuMemFree(p), "cuMemFree")
        return freed


_pool = _Pool()


def mem_alloc_raw(nbytes: int, retry: Any = None) -> int:
    """cuMemAlloc (no caching); on out-of-memory calls ``retry()`` (e.g. trim a cache) once."""
    ensure_context()
    d = _drv._d
    r = d.cuMemAlloc(max(1, int(nbytes)))
    if r[0] != _drv._SUCCESS and retry is not None and getattr(r[0], "name", "") == \
            "CUDA_ERROR_OUT_OF_MEMORY":
        retry()
        r = d.cuMemAlloc(max(1, int(nbytes)))
    if r[0] != _drv._SUCCESS:
        if getattr(r[0], "name", "") == "CUDA_ERROR_OUT_OF_MEMORY":
            try:
                free_b, total_b = check(d.cuMemGetInfo(), "cuMemGetInfo")
                info = f" ({int(free_b) / 2**20:.0f} of {int(total_b) / 2**20:.0f} MiB free)"
            except CudaError:
                info = ""
            raise CudaError(f"out of GPU memory allocating {nbytes / 2**20:.1f} MiB{info}; use a "
                            "smaller model or context")
        raise CudaError(f"cuMemAlloc({nbytes}) failed: {_drv.error_text(r[0])}")
    return int(r[1])


def mem_free_raw(ptr: int) -> None:
    ensure_context()
    check(_drv._d.cuMemFree(ptr), "cuMemFree")


def alloc(nbytes: int) -> int:
    """Device memory of at least ``nbytes`` from the caching allocator (an int address)."""
    return _pool.alloc(nbytes)


def free(ptr: int) -> None:
    """Return a pointer from :func:`alloc` to the cache (not to the driver; see :func:`trim`)."""
    _pool.release(ptr)


def trim() -> int:
    """Release all cached device memory to the driver."""
    return _pool.trim()


def record_begin() -> None:
    """From now on, note every block allocated (:func:`record_end`)."""
    with _pool.lock:
        _pool.recording = {}


def record_end() -> dict[int, int]:
    """The blocks allocated since :func:`record_begin`, pointer -> size, in allocation order."""
    with _pool.lock:
        got, _pool.recording = _pool.recording or {}, None
        return got


def hold(ptrs: list[int]) -> None:
    """Keep ``ptrs`` out of the cache, even once their arrays are gone, until
    :func:`release_held` (a captured graph's blocks)."""
    with _pool.lock:
        for ptr in ptrs:
            _pool.held[ptr] = False


def release_held(ptrs: list[int]) -> None:
    """The graph that held ``ptrs`` is gone: blocks whose arrays are gone return to the cache,
    the others when their arrays go."""
    for ptr in ptrs:
        with _pool.lock:
            released = _pool.held.pop(ptr, None)
        if released:
            _pool.release(ptr)


def pool_stats() -> dict:
    return {"live_bytes": _pool.live_bytes, "cached_bytes": _pool.cached_bytes,
            "live_blocks": len(_pool.sizes)}


def _nbytes(data: Any) -> int:
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    return memoryview(data).nbytes


# while not None: every synchronous copy as (kind, device address, bytes); see modules.launch_trace
copy_trace: list | None = None


def htod(dst: int, data: Any, nbytes: int | None = None) -> None:
    """Copy host ``data`` (bytes-like, or an int host address with ``nbytes``) to ``dst``."""
    ensure_context()
    n = _nbytes(data) if nbytes is None else int(nbytes)
    if copy_trace is not None:
        copy_trace.append(("htod", dst, n))
    if n:
        check(_drv._d.cuMemcpyHtoD(dst, data, n), f"cuMemcpyHtoD({n} bytes)")


def dtoh(src: int, nbytes: int, out: Any = None) -> Any:
    """Copy ``nbytes`` from device ``src`` into ``out`` (writable bytes-like, or an int host
    address) or a new bytearray, which is returned. Waits for earlier GPU work."""
    ensure_context()
    if copy_trace is not None:
        copy_trace.append(("dtoh", src, nbytes))
    if out is None:
        out = bytearray(nbytes)
    if nbytes:
        check(_drv._d.cuMemcpyDtoH(out, src, nbytes),
              f"cuMemcpyDtoH({nbytes} bytes; a kernel launched earlier may have failed)")
    return out


def dtod(dst: int, src: int, nbytes: int) -> None:
    """Device-to-device copy, queued on the launches' stream (asynchronous to the host, as a
    launch is; a graph being captured records it)."""
    ensure_context()
    if copy_trace is not None:
        copy_trace.append(("dtod", dst, src, nbytes))
    if nbytes:
        check(_drv._d.cuMemcpyDtoDAsync(dst, src, nbytes, _drv._STREAM),
              f"cuMemcpyDtoDAsync({nbytes} bytes)")


def memset(ptr: int, value: int, nbytes: int) -> None:
    """Set ``nbytes`` bytes at ``ptr`` to ``value`` (0..255), in stream order."""
    ensure_context()
    if nbytes:
        check(_drv._d.cuMemsetD8(ptr, value & 0xFF, nbytes), "cuMemsetD8")


# ----------------------------------------------------------------------------------------------
# events


class Event:
    """A CUDA event (timing enabled). ``record()`` on the default stream."""

    def __init__(self) -> None:
        ensure_context()
        d = _drv._d
        self.handle = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def record(self) -> "Event":
        check(_drv._d.cuEventRecord(self.handle, _drv._STREAM), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        check(_drv._d.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def __del__(self) -> None:
        try:
            if _drv._d is not None:
                _drv._d.cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (waits for ``end``)."""
    end.synchronize()
    return float(check(_drv._d.cuEventElapsedTime(start.handle, end.handle),
                       "cuEventElapsedTime"))
