"""The CUDA driver, checked: cuda-bindings, error checking, the device and its context.

Built on cuda-bindings' driver API (``cuda.bindings.driver``). No numpy, no NVRTC: every kernel
comes from a fatbin compiled by nvcc when the package was built (``reflex_core/_build.py``).
The rest of the package builds on this module: :mod:`.modules` (kernel modules and launches),
:mod:`.memory` (device memory, copies, events), :mod:`.upload` (the cold-path weight upload);
:mod:`.start` starts it all on a thread when the process starts.

Context
-------
The driver starts in :mod:`reflex_core.cuda.early` (ctypes: dlopen, ``cuInit``, device queries,
primary context; no GIL held, nothing imported but ctypes) on the thread :mod:`.start` runs.
:func:`init` adopts that context (the primary context is one per device and process) and
imports cuda-bindings -- usually imported already by the main thread while it waited. The
driver's "current context" is per thread: :func:`init` makes the context current on the thread
that ran it, and every entry point of the package calls :func:`ensure_context`, which makes it
current on the calling thread the first time that thread calls in (a thread-local flag), so the
main thread and the upload threads just work once :func:`init` has finished somewhere.

All copies and launches use the legacy default stream (:data:`_STREAM`): they run in issue
order, and a synchronous copy from pageable memory waits for earlier work first.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..errors import CudaError, CudaUnavailable, pip_install
from .manifest import CORE_PACKAGE, coverage_error, image_for, read_manifest

# Shared with the package's other modules, which read them as driver._d etc. at call time (tests
# swap in a fake bindings module by setting these).
_d: Any = None  # cuda.bindings.driver, once imported
_SUCCESS: Any = None
_STREAM: Any = None  # the legacy default stream (CUstream(0))


# ----------------------------------------------------------------------------------------------
# bindings and error checking


def _bindings() -> Any:
    """Import cuda.bindings.driver (once); CudaUnavailable when it is not installed."""
    global _d, _SUCCESS, _STREAM
    if _d is None:
        try:
            from cuda.bindings import driver as d
        except Exception as e:  # ImportError, or a broken install
            raise CudaUnavailable(
                f"the cuda-bindings package is not usable ({type(e).__name__}: {e}); "
                f"install it with {pip_install('cuda-bindings')}",
                cpu_hint=", or use --backend cpu") from None
        _SUCCESS = d.CUresult.CUDA_SUCCESS
        _STREAM = d.CUstream(0)
        _d = d
    return _d


def bindings() -> Any:
    """``cuda.bindings.driver``, imported now (CudaUnavailable when it cannot be)."""
    return _bindings()


def error_text(err: Any) -> str:
    """'CUDA_ERROR_X (description)' for a CUresult, robust to a half-working driver."""
    d = _d
    name, desc = getattr(err, "name", str(err)), ""
    try:
        r = d.cuGetErrorName(err)
        if r[0] == _SUCCESS and r[1]:
            name = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        r = d.cuGetErrorString(err)
        if r[0] == _SUCCESS and r[1]:
            desc = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
    except Exception:  # noqa: BLE001 - best effort only
        pass
    return f"{name} ({desc})" if desc else name


def check(result: Any, call: str = "CUDA driver call") -> Any:
    """Unwrap cuda-bindings' ``(CUresult, *values)``: the value(s), or raise :class:`CudaError`.

    ``call`` names the call in the message (``"cuMemAlloc(4096)"``). Returns None for no value,
    the value for one, a tuple for several.
    """
    if isinstance(result, tuple):
        err = result[0]
        vals = result[1:]
    else:
        err, vals = result, ()
    if err != _SUCCESS:
        raise CudaError(f"{call} failed: {error_text(err)}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


# ----------------------------------------------------------------------------------------------
# device and context


class Device:
    """The GPU in use: ordinal, name, compute capability ``sm`` (e.g. 90), memory, context."""

    def __init__(self, ordinal: int, handle: Any, name: str, sm: int, total_mem: int,
                 driver_version: int, ctx: Any, image: str):
        self.ordinal = ordinal
        self.handle = handle
        self.name = name
        self.sm = sm
        self.total_mem = total_mem
        self.driver_version = driver_version  # e.g. 13000
        self.ctx = ctx
        self.image = image  # "sass" or "ptx": how the core kernels run on it

    def __repr__(self) -> str:
        return (f"Device({self.ordinal}, {self.name!r}, sm_{self.sm}, "
                f"{self.total_mem / 2**30:.1f} GiB, {self.image})")


_lock = threading.RLock()
_device: Device | None = None
_init_error: BaseException | None = None
_tls = threading.local()

INIT_STEPS: dict[str, float] = {}  # step -> ms, filled by init and module loads (``--timings``)


def init(device: int = 0, early_result: Any = None) -> Device:
    """cuInit, device lookup, kernel coverage check, primary context (current on this thread).
    ``early_result``: what :func:`reflex_core.cuda.early.run` returned (or raised) already --
    :mod:`.start` runs it before this module is even imported; without it the ctypes steps run
    here, on the calling thread, with the driver's default settings (``start.DRIVER_ENV`` is set
    by :func:`reflex_core.cuda.start.start` only). Kernel modules load on first use
    (:func:`reflex_core.cuda.modules.get_kernels`) or through :mod:`.start`.

    Idempotent and thread-safe. Raises CudaUnavailable (one line) for: no cuda-bindings, no
    driver, no device, a GPU the shipped kernels do not cover, a package built with
    REFLEX_SKIP_CUDA -- and the same error again on every later call (sticky).
    """
    global _device, _init_error
    with _lock:
        if _device is not None:
            _bind_this_thread()
            return _device
        if _init_error is not None:
            raise _init_error
        try:
            _device = _init(device, early_result)
        except (CudaUnavailable, CudaError) as e:
            _device = None
            err = e if isinstance(e, CudaUnavailable) else CudaUnavailable(
                f"CUDA initialisation failed: {e}")
            _init_error = err
            raise err from None
        _tls.bound = True  # early.run made the context current on this thread
        return _device


def probe(ordinal: int = 0) -> CudaUnavailable | None:
    """Why this process could not use GPU ``ordinal`` (None: it looks usable), found without
    making a context: the driver, the device, the core's kernels."""
    from . import early

    try:
        early.probe(ordinal)
        read_manifest(CORE_PACKAGE)
    except early.EarlyError as err:
        return _unavailable_from_early(err)
    except CudaUnavailable as e:
        return e
    return None


def _unavailable_from_early(err: Any) -> CudaUnavailable:
    """The one-line message for a failed :mod:`early` step."""
    from . import early

    if err.code is None and err.step == "dlopen":
        return CudaUnavailable(f"no NVIDIA driver: libcuda.so.1 could not be loaded "
                               f"({err.detail}); install the NVIDIA driver",
                               cpu_hint=", or use --backend cpu")
    if err.code == early.CUDA_ERROR_NO_DEVICE:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra = f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
        return CudaUnavailable(f"no CUDA GPU found{extra}", cpu_hint="; use --backend cpu")
    if err.code == early.CUDA_ERROR_INSUFFICIENT_DRIVER:
        return CudaUnavailable("the NVIDIA driver is too old for this CUDA build "
                               "(CUDA_ERROR_INSUFFICIENT_DRIVER); update the driver")
    if err.code is None:
        return CudaUnavailable(f"{err.detail}")
    return CudaUnavailable(f"{err.step} failed: {err.detail}")


def _init(ordinal: int, early_result: Any) -> Device:
    from . import early

    e = early_result
    try:
        if isinstance(e, early.EarlyError):
            raise e
        if e is None or e.ordinal != ordinal:
            e = early.run(ordinal)  # ctypes: no GIL held through cuInit and the context creation
    except early.EarlyError as err:
        raise _unavailable_from_early(err) from None
    INIT_STEPS.update(e.steps)
    t = time.perf_counter()
    manifest = read_manifest(CORE_PACKAGE)
    reason = coverage_error(e.sm, manifest)
    if reason:
        raise CudaUnavailable(reason)
    d = _bindings()  # usually imported already, on another thread, while cuInit ran
    INIT_STEPS["import cuda.bindings (rest)"] = (time.perf_counter() - t) * 1e3
    return Device(ordinal, d.CUdevice(e.device), e.name, e.sm, e.total_mem, e.driver_version,
                  d.CUcontext(e.ctx), image_for(e.sm, manifest) or "ptx")


def current_device() -> Device:
    """The initialised Device (initialising now if needed), context current on this thread."""
    if _device is None or not getattr(_tls, "bound", False):
        return init() if _device is None else (_bind_this_thread() or _device)
    return _device


def _bind_this_thread() -> None:
    if getattr(_tls, "bound", False):
        return
    if _device is None:
        init()  # makes the context current here
        return
    check(_d.cuCtxSetCurrent(_device.ctx), "cuCtxSetCurrent")
    _tls.bound = True


def ensure_context() -> None:
    """Make the context current on the calling thread (cheap after the first call)."""
    if not getattr(_tls, "bound", False):
        _bind_this_thread()


def synchronize() -> None:
    """Wait for all queued GPU work (raises CudaError if a kernel faulted)."""
    ensure_context()
    check(_d.cuCtxSynchronize(), "cuCtxSynchronize (a kernel launched earlier may have failed)")
