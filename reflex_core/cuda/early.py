"""First contact with the CUDA driver, through ctypes: cuInit and the primary context.

The cold path's longest chain is the driver's own start (cuInit ~0.1 s + primary context ~0.12 s
on the H200 machine). It should begin as early as the process can manage, and nothing on it
should hold the GIL. Importing cuda-bindings takes ~40 ms of GIL-holding import work, so this
first step talks to ``libcuda.so.1`` directly with ctypes (stdlib, already loaded by the time
the console script runs): dlopen, ``cuInit``, a few device queries and
``cuDevicePrimaryCtxRetain``. ctypes releases the GIL for each foreign call, so the main thread
parses the GGUF and builds the tokenizer meanwhile, and cuda-bindings is imported on another
thread. :mod:`reflex_core.cuda.driver` then adopts the context: the primary context is one per
device and process, so the handle retained here is the one cuda-bindings sees.

No numpy, no cuda-bindings, no json here, and no environment changes: :mod:`.start` sets the
driver's settings (``start.DRIVER_ENV``) on the main thread before the thread that runs
:func:`run` starts. Errors become :class:`EarlyError` with the CUresult name; the driver module
turns them into its one-line :class:`~reflex_core.errors.CudaUnavailable` messages.
"""

from __future__ import annotations

import ctypes
import time

CUDA_SUCCESS = 0
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
_ATTR_CC_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_ATTR_CC_MINOR = 76


class EarlyError(Exception):
    """A failed step: ``step`` names it, ``code`` is the CUresult (None: libcuda not loadable)."""

    def __init__(self, step: str, code: int | None, detail: str):
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.code = code
        self.detail = detail


class Early:
    """What the early init established: the device and its primary context (current on the
    thread that ran :func:`run`), plus the time each step took (ms)."""

    def __init__(self) -> None:
        self.ordinal = 0
        self.device = 0  # CUdevice (an int)
        self.ctx = 0  # CUcontext address
        self.name = ""
        self.sm = 0
        self.total_mem = 0
        self.driver_version = 0
        self.count = 0
        self.steps: dict[str, float] = {}


def _lib() -> object:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise EarlyError("dlopen", None, str(e).strip().splitlines()[0] if str(e).strip()
                         else "not found") from None


def error_name(lib: object, code: int) -> str:
    """'CUDA_ERROR_X (description)' for a CUresult, as the driver names it."""
    name = ctypes.c_char_p()
    desc = ctypes.c_char_p()
    try:
        lib.cuGetErrorName(code, ctypes.byref(name))
        lib.cuGetErrorString(code, ctypes.byref(desc))
    except Exception:  # noqa: BLE001 - best effort
        pass
    n = name.value.decode(errors="replace") if name.value else f"CUresult {code}"
    return f"{n} ({desc.value.decode(errors='replace')})" if desc.value else n


def run(ordinal: int = 0) -> Early:
    """dlopen libcuda, cuInit, device ``ordinal``'s queries and primary context (made current
    on this thread). Raises :class:`EarlyError`."""
    e = Early()
    e.ordinal = ordinal
    t = time.perf_counter()

    def step(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        e.steps[name] = (now - t) * 1e3
        t = now

    return _run(e, ordinal, step)


def probe(ordinal: int = 0) -> None:
    """dlopen libcuda, cuInit and check that device ``ordinal`` exists, without making a
    context (for a process that only decides which backend its children use). Raises
    :class:`EarlyError`."""
    lib = _lib()
    r = lib.cuInit(0)
    if r != CUDA_SUCCESS:
        raise EarlyError("cuInit", r, error_name(lib, r))
    n = ctypes.c_int(0)
    r = lib.cuDeviceGetCount(ctypes.byref(n))
    if r != CUDA_SUCCESS:
        raise EarlyError("cuDeviceGetCount", r, error_name(lib, r))
    if not 0 <= ordinal < n.value:
        raise EarlyError("cuDeviceGet", CUDA_ERROR_NO_DEVICE if n.value == 0 else None,
                         f"GPU {ordinal} does not exist ({n.value} visible)")


def _run(e: Early, ordinal: int, step: object) -> Early:
    lib = _lib()
    step("dlopen libcuda")

    def call(what: str, fn: object, *args: object) -> None:
        r = fn(*args)
        if r != CUDA_SUCCESS:
            raise EarlyError(what, r, error_name(lib, r))

    call("cuInit", lib.cuInit, 0)
    step("cuInit")
    n = ctypes.c_int(0)
    call("cuDeviceGetCount", lib.cuDeviceGetCount, ctypes.byref(n))
    e.count = n.value
    if not 0 <= ordinal < n.value:
        raise EarlyError("cuDeviceGet", CUDA_ERROR_NO_DEVICE if n.value == 0 else None,
                         f"GPU {ordinal} does not exist ({n.value} visible)")
    dev = ctypes.c_int(0)
    call(f"cuDeviceGet({ordinal})", lib.cuDeviceGet, ctypes.byref(dev), ordinal)
    e.device = dev.value
    buf = ctypes.create_string_buffer(256)
    call("cuDeviceGetName", lib.cuDeviceGetName, buf, 256, dev)
    e.name = buf.value.decode(errors="replace").strip()
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    call("cuDeviceGetAttribute", lib.cuDeviceGetAttribute, ctypes.byref(major), _ATTR_CC_MAJOR,
         dev)
    call("cuDeviceGetAttribute", lib.cuDeviceGetAttribute, ctypes.byref(minor), _ATTR_CC_MINOR,
         dev)
    e.sm = major.value * 10 + minor.value
    total = ctypes.c_size_t(0)
    call("cuDeviceTotalMem", lib.cuDeviceTotalMem_v2, ctypes.byref(total), dev)
    e.total_mem = total.value
    ver = ctypes.c_int(0)
    call("cuDriverGetVersion", lib.cuDriverGetVersion, ctypes.byref(ver))
    e.driver_version = ver.value
    step("device queries")
    ctx = ctypes.c_void_p(0)
    call("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain, ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", lib.cuCtxSetCurrent, ctx)
    e.ctx = int(ctx.value or 0)
    step("primary context")
    return e
