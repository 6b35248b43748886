"""The CUDA driver, checked: context, AOT fatbin modules, kernel launches, memory, events.

Built on cuda-bindings' driver API (``cuda.bindings.driver``). No numpy, no NVRTC: every kernel
comes from a fatbin compiled by nvcc when the package was built (``reflex_core/_build.py``).

Cold path
---------
The driver starts in :mod:`reflex_core.cuda.early` (ctypes: dlopen, ``cuInit``, device queries,
primary context; no GIL held, nothing imported but ctypes) on the thread the console entry point
starts first (:mod:`reflex_core.background`). :func:`init` adopts that context (the primary
context is one per device and process), imports cuda-bindings -- usually imported already by the
main thread while it waited -- and the engine starts the weight upload while this thread loads
the kernel modules (:func:`load_modules`). The driver's "current context" is per thread:
:func:`init` makes the context current on the thread that ran it, and every public entry point
here makes it current on the calling thread the first time that thread calls in (a
thread-local flag), so the main thread and the upload threads just work once :func:`init` has
finished somewhere.

Launches
--------
``Kernels.launch(name, grid, block, sig, args)`` packs ``args`` with one precompiled
``struct.Struct`` per signature into a fixed ctypes buffer of 8-byte slots and hands the driver the
address (an ``int``) of a fixed ``void*[n]`` array pointing at the slots: cuda-bindings passes an
int ``kernelParams`` straight through as ``void**`` (no per-launch conversion). Signature chars:
``P`` device pointer, ``i`` int32, ``I`` uint32, ``q`` int64, ``Q`` uint64, ``f`` float32,
``d`` float64. Measured on the (GPU-less) dev machine against a stub libcuda: packing 12
parameters ~0.35 us (``tests/test_cuda_driver_nogpu.py::test_packing_overhead`` prints it),
cuda-bindings' ``cuLaunchKernel`` wrapper ~0.35 us, the whole ``Kernels.launch`` ~1.4-2 us of
Python before the driver's own cost. The buffers are shared per signature: launch from one
thread at a time (the engine does). :func:`launch_count` counts every launch of the process
(benchmarks and tests take differences around a forward pass).

Modules load eagerly (``CUDA_MODULE_LOADING=EAGER`` unless set, see early.DRIVER_ENV) on the init
thread, so no kernel is loaded lazily inside the first forward pass. ``REFLEX_KERNEL_DIR`` points the core at another
kernels folder (dev loop: ``python reflex_core/_build.py cuda /tmp/kout cuda/include``).

Memory
------
``alloc``/``free`` go through a caching allocator (free lists keyed by rounded size), so the
per-op activations of a forward pass do not call ``cuMemAlloc``. ``upload_host_region`` is the
cold-path weight upload: page-lock the (read-only) mmap range chunk by chunk with
``cuMemHostRegister(READ_ONLY)`` on several threads, each chunk's copy queued as soon as it is
pinned (falling back to a pageable copy for a chunk whose registration is refused).

All copies and launches use the legacy default stream: they run in issue order, and a
synchronous ``htod`` from pageable memory waits for earlier work first, so reusing a cached
buffer is always safe.
"""

from __future__ import annotations

import ctypes
import json
import mmap as _mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import CudaError, CudaUnavailable

_d: Any = None  # cuda.bindings.driver, once imported
_SUCCESS: Any = None
_STREAM: Any = None  # the legacy default stream (CUstream(0))

CORE_PACKAGE = "reflex_core"
SKIP_HINT = ("reinstall without REFLEX_SKIP_CUDA with nvcc available "
             "(or use --backend cpu)")


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
                "install it with `pip install cuda-bindings`, or use --backend cpu") from None
        _SUCCESS = d.CUresult.CUDA_SUCCESS
        _STREAM = d.CUstream(0)
        _d = d
    return _d


def bindings() -> Any:
    """``cuda.bindings.driver``, imported now (CudaUnavailable when it cannot be)."""
    return _bindings()


def _error_text(err: Any) -> str:
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
        raise CudaError(f"{call} failed: {_error_text(err)}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


# ----------------------------------------------------------------------------------------------
# manifest: which GPUs the shipped fatbins cover


def kernels_dir(package: str = CORE_PACKAGE) -> Path:
    """Folder of ``package``'s fatbins. ``REFLEX_KERNEL_DIR`` overrides the core's (dev loop:
    ``python reflex_core/_build.py cuda /tmp/kout cuda/include`` then REFLEX_KERNEL_DIR=/tmp/kout);
    ``REFLEX_KERNEL_DIR_<PACKAGE>`` (upper case) overrides a plugin's."""
    env = os.environ.get("REFLEX_KERNEL_DIR" if package == CORE_PACKAGE
                         else f"REFLEX_KERNEL_DIR_{package.upper()}")
    if env:
        return Path(env)
    if package == CORE_PACKAGE:
        return Path(__file__).resolve().parent.parent / "kernels"
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CudaUnavailable(f"package {package!r} (kernels) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "kernels"


def read_manifest(package: str = CORE_PACKAGE) -> dict:
    """The package's kernels/manifest.json; CudaUnavailable when the build shipped no kernels."""
    folder = kernels_dir(package)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        raise CudaUnavailable(
            f"{package} has no CUDA kernels ({folder}/manifest.json is missing: it was built "
            f"with REFLEX_SKIP_CUDA=1 or without nvcc); {SKIP_HINT}") from None
    except (OSError, ValueError) as e:
        raise CudaUnavailable(f"{package}: unreadable {folder}/manifest.json ({e}); "
                              f"{SKIP_HINT}") from None
    if manifest.get("skipped") or not manifest.get("modules"):
        raise CudaUnavailable(f"{package} was built with REFLEX_SKIP_CUDA=1, so it has no CUDA "
                              f"kernels; {SKIP_HINT}")
    return manifest


def _sm_num(s: str) -> int:
    return int("".join(ch for ch in s.split("_", 1)[-1] if ch.isdigit()))


def _best_sass(sm: int, manifest: dict) -> int | None:
    """The shipped SASS target the driver runs on compute capability ``sm`` (same major, the
    highest minor not above the device's), or None."""
    fits = [t for t in map(_sm_num, manifest.get("sass", []))
            if t // 10 == sm // 10 and t % 10 <= sm % 10]
    return max(fits) if fits else None


def image_for(sm: int, manifest: dict) -> str | None:
    """'sass' when a shipped SASS target runs on compute capability ``sm`` (same major, minor
    not above the device's), 'ptx' when the driver can JIT the shipped PTX (PTX target <= sm),
    None when neither."""
    if _best_sass(sm, manifest) is not None:
        return "sass"
    ptx = manifest.get("ptx")
    if ptx and _sm_num(ptx) <= sm:
        return "ptx"
    return None


def best_cubin(sm: int, manifest: dict) -> int | None:
    """The SASS target whose cubin to load on compute capability ``sm`` -- the one the driver
    would pick from the fatbin -- or None (no cubins shipped, or none fits: the fatbin's PTX)."""
    return _best_sass(sm, manifest) if manifest.get("cubins") else None


def coverage_error(sm: int, manifest: dict, package: str = CORE_PACKAGE) -> str | None:
    """None when ``package``'s kernels can run on sm_XX, else the one-line reason."""
    if image_for(sm, manifest) is not None:
        return None
    sass = sorted(_sm_num(t) for t in manifest.get("sass", []))
    shipped = (f"sm_{sass[0]}..sm_{sass[-1]}" if len(sass) > 1 else
               f"sm_{sass[0]}" if sass else "no SASS")
    ptx = manifest.get("ptx", "none")
    return (f"{package} was built for {shipped} (PTX {ptx}); this GPU is sm_{sm}; "
            f"rebuild with REFLEX_CUDA_ARCH=sm_{sm}")


# ----------------------------------------------------------------------------------------------
# context


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
_async: "_InitFuture | None" = None


def _unavailable(msg: str) -> CudaUnavailable:
    return CudaUnavailable(msg)


def init(device: int = 0, preload: Sequence[str] | None = None, early_result: Any = None) -> Device:
    """cuInit, device lookup, kernel coverage check, primary context (current on this thread),
    then load the core's modules (``preload``: module names; None = all in the manifest).
    ``early_result``: what :func:`reflex_core.cuda.early.run` returned (or raised) on this
    thread already, so the ctypes steps ran before this module was even imported.

    Idempotent and thread-safe; safe to run on a background thread. Raises CudaUnavailable
    (one line) for: no cuda-bindings, no driver, no device, a GPU the shipped kernels do not
    cover, a package built with REFLEX_SKIP_CUDA.
    """
    global _device, _init_error
    with _lock:
        if _device is not None:
            _bind_this_thread()
            return _device
        if _init_error is not None:
            raise _init_error
        try:
            _device = _init(device, preload, early_result)
        except (CudaUnavailable, CudaError) as e:
            _device = None
            err = e if isinstance(e, CudaUnavailable) else CudaUnavailable(
                f"CUDA initialisation failed: {e}")
            _init_error = err
            raise err from None
        _tls.bound = True
        return _device


INIT_STEPS: dict[str, float] = {}  # step -> ms, filled by init (``--timings`` prints them)


def _unavailable_from_early(err: Any) -> CudaUnavailable:
    """The one-line message for a failed :mod:`early` step."""
    from . import early

    if err.code is None and err.step == "dlopen":
        return _unavailable(f"no NVIDIA driver: libcuda.so.1 could not be loaded ({err.detail}); "
                            "install the NVIDIA driver, or use --backend cpu")
    if err.code == early.CUDA_ERROR_NO_DEVICE:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra = f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
        return _unavailable(f"no CUDA GPU found{extra}; use --backend cpu")
    if err.code == early.CUDA_ERROR_INSUFFICIENT_DRIVER:
        return _unavailable("the NVIDIA driver is too old for this CUDA build "
                            "(CUDA_ERROR_INSUFFICIENT_DRIVER); update the driver")
    if err.code is None:
        return _unavailable(f"{err.detail}")
    return _unavailable(f"{err.step} failed: {err.detail}")


def _init(ordinal: int, preload: Sequence[str] | None, early_result: Any = None) -> Device:
    from . import early  # (its DRIVER_ENV: one work queue per context, eager module loading)

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
        raise _unavailable(reason)
    d = _bindings()  # usually imported already, on another thread, while cuInit ran
    INIT_STEPS["import cuda.bindings (rest)"] = (time.perf_counter() - t) * 1e3
    device = Device(ordinal, d.CUdevice(e.device), e.name, e.sm, e.total_mem, e.driver_version,
                    d.CUcontext(e.ctx), image_for(e.sm, manifest) or "ptx")
    global _device
    _device = device  # load_modules below needs it (init() resets it if this fails)
    _tls.bound = True  # early.run made the context current on this thread
    load_modules(preload)
    return device


def load_modules(names: Sequence[str] | None = None, package: str = CORE_PACKAGE) -> None:
    """Load ``package``'s modules (None: every module in its manifest), timing each in
    INIT_STEPS. The engine runs this on the init thread after :func:`init` (preload=()), so the
    modules load while the weights upload; a launch that needs a module still loading waits."""
    if names is None:
        names = list(read_manifest(package).get("modules", {}))
    for m in names:
        t = time.perf_counter()
        get_kernels(m, package)
        INIT_STEPS[f"load {m}"] = (time.perf_counter() - t) * 1e3


class _InitFuture:
    """The background initialisation started by :func:`start_init_async`."""

    def __init__(self, device: int, preload: Sequence[str] | None):
        self.t0 = time.perf_counter()
        self.t1: float | None = None
        self._result: Device | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(device, preload),
                                        name="reflex-cuda-init", daemon=True)
        self._thread.start()

    def _run(self, device: int, preload: Sequence[str] | None) -> None:
        try:
            self._result = init(device, preload)
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._error = e
        finally:
            self.t1 = time.perf_counter()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Device:
        """Wait for the init thread, make the context current on this thread, return the Device."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("CUDA initialisation still running")
        if self._error is not None:
            raise self._error
        _bind_this_thread()
        assert self._result is not None
        return self._result

    wait = result


def start_init_async(device: int = 0, preload: Sequence[str] | None = None) -> _InitFuture:
    """Start :func:`init` on a daemon thread (first thing in the process); see :func:`wait`."""
    global _async
    with _lock:
        if _async is None:
            _async = _InitFuture(device, preload)
        return _async


def wait(timeout: float | None = None) -> Device:
    """The Device once initialisation is done (started by start_init_async, or run here now),
    with the context current on the calling thread."""
    fut = _async
    if fut is not None:
        return fut.result(timeout)
    return init()


def current_device() -> Device:
    """The initialised Device (initialising now if needed), context current on this thread."""
    if _device is None or not getattr(_tls, "bound", False):
        return init() if _device is None else (_bind_this_thread() or _device)
    return _device


def _bind_this_thread() -> None:
    if getattr(_tls, "bound", False):
        return
    dev = _device
    if dev is None:
        fut = _async
        if fut is not None:
            fut._thread.join()
            if fut._error is not None:
                raise fut._error
        dev = _device if _device is not None else init()
    check(_d.cuCtxSetCurrent(dev.ctx), "cuCtxSetCurrent")
    _tls.bound = True


def _ensure() -> None:
    """Make the context current on the calling thread (cheap after the first call)."""
    if not getattr(_tls, "bound", False):
        _bind_this_thread()


def synchronize() -> None:
    """Wait for all queued GPU work (raises CudaError if a kernel faulted)."""
    _ensure()
    check(_d.cuCtxSynchronize(), "cuCtxSynchronize (a kernel launched earlier may have failed)")


def driver_version() -> int:
    return current_device().driver_version


# ----------------------------------------------------------------------------------------------
# modules and launches

_SLOT = {"P": "Q", "i": "i4x", "I": "I4x", "q": "q", "Q": "Q", "f": "f4x", "d": "d"}


class ParamPacker:
    """Kernel parameters of one signature: 8-byte slots in one ctypes buffer, plus a fixed
    ``void*[n]`` array pointing at them. ``pack(args)`` returns that array's address."""

    __slots__ = ("sig", "st", "buf", "ptrs", "addr", "n")

    def __init__(self, sig: str):
        try:
            fmt = "<" + "".join(_SLOT[c] for c in sig)
        except KeyError as e:
            raise ValueError(f"kernel signature {sig!r}: unknown parameter kind {e.args[0]!r} "
                             f"(use one of {''.join(_SLOT)})") from None
        self.sig = sig
        self.n = len(sig)
        self.st = struct.Struct(fmt)
        self.buf = ctypes.create_string_buffer(max(8, 8 * self.n))
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(1, self.n))(*[base + 8 * i for i in range(self.n)])
        self.addr = ctypes.addressof(self.ptrs) if self.n else 0

    def pack(self, args: Sequence[Any]) -> int:
        self.st.pack_into(self.buf, 0, *args)
        return self.addr

    def slot_bytes(self, i: int) -> bytes:
        """The 8 bytes of parameter i (tests)."""
        return bytes(self.buf.raw[8 * i: 8 * i + 8])


_PACKERS: dict[str, ParamPacker] = {}
_n_launches = 0  # every Kernels.launch of the process (debug / benchmarks: launch_count())


def launch_count() -> int:
    """Kernel launches made through :meth:`Kernels.launch` so far in this process (count the
    launches of a forward pass as a difference)."""
    return _n_launches


def packer(sig: str) -> ParamPacker:
    p = _PACKERS.get(sig)
    if p is None:
        p = _PACKERS[sig] = ParamPacker(sig)
    return p


class Kernels:
    """One loaded fatbin module: function handles cached by name, ``launch``."""

    def __init__(self, module: str, package: str, handle: Any, image: str):
        self.module = module
        self.package = package
        self.handle = handle
        self.image = image  # "sass" or "ptx" for this device
        self._fns: dict[str, Any] = {}
        self._ents: dict[str, tuple[Any, str, ParamPacker]] = {}  # name -> (fn, sig, packer)

    def function(self, name: str) -> Any:
        f = self._fns.get(name)
        if f is None:
            _ensure()
            try:
                f = check(_d.cuModuleGetFunction(self.handle, name.encode()),
                          f"cuModuleGetFunction({name!r})")
            except CudaError as e:
                raise CudaError(f"kernel {name!r} is not in {self.package}'s {self.module!r} "
                                f"kernels ({e})") from None
            self._fns[name] = f
        return f

    def launch(self, name: str, grid: Any, block: Any, sig: str, args: Sequence[Any],
               shmem: int = 0) -> None:
        """Launch ``name`` on the default stream. ``grid``/``block``: int or (x[, y[, z]])."""
        global _n_launches
        ent = self._ents.get(name)
        if ent is None or ent[1] != sig:
            ent = self._ents[name] = (self.function(name), sig, packer(sig))
        f, _, p = ent
        if len(args) != p.n:
            raise ValueError(f"{name}: signature {sig!r} has {p.n} parameters, got {len(args)}")
        try:
            p.st.pack_into(p.buf, 0, *args)
        except struct.error as e:
            raise ValueError(f"{name}: arguments {list(args)!r} do not fit signature {sig!r} "
                             f"({e})") from None
        if type(grid) is int:
            gx, gy, gz = grid, 1, 1
        elif len(grid) == 3:
            gx, gy, gz = grid
        else:
            gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        if type(block) is int:
            bx, by, bz = block, 1, 1
        elif len(block) == 3:
            bx, by, bz = block
        else:
            bx, by, bz = (tuple(block) + (1, 1))[:3]
        if not getattr(_tls, "bound", False):
            _bind_this_thread()
        _n_launches += 1
        r = _d.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, _STREAM, p.addr, 0)
        if r[0] != _SUCCESS:
            raise CudaError(f"cuLaunchKernel({name}, grid=({gx},{gy},{gz}), "
                            f"block=({bx},{by},{bz}), shmem={shmem}) failed: "
                            f"{_error_text(r[0])}")

    def num_regs(self, name: str) -> int:
        """Registers per thread of kernel ``name`` (diagnostics)."""
        A = _d.CUfunction_attribute
        return int(check(_d.cuFuncGetAttribute(A.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function(name)),
                         "cuFuncGetAttribute"))


_modules: dict[tuple[str, str], Kernels] = {}


_module_lock = threading.Lock()  # not _lock: loading a module must not hold up other threads


def get_kernels(module: str, package: str = CORE_PACKAGE) -> Kernels:
    """The loaded module ``<package>/kernels/<module>``: the device's cubin when one fits, else
    the fatbin (loaded once, cached)."""
    key = (package, module)
    k = _modules.get(key)
    if k is not None:
        return k
    dev = current_device()  # before _module_lock: init() may be loading modules under _lock
    with _module_lock:
        k = _modules.get(key)
        if k is not None:
            return k
        manifest = read_manifest(package)
        reason = coverage_error(dev.sm, manifest, package)
        if reason:
            raise CudaUnavailable(reason)
        folder = kernels_dir(package)
        target = best_cubin(dev.sm, manifest)
        path = folder / (f"{module}.sm_{target}.cubin" if target else f"{module}.fatbin")
        try:
            image = path.read_bytes()
        except OSError:
            raise CudaUnavailable(f"{path} is missing (the package's kernels are incomplete); "
                                  f"{SKIP_HINT}") from None
        r = _d.cuModuleLoadData(image)
        if r[0] != _SUCCESS:
            how = image_for(dev.sm, manifest)
            raise CudaUnavailable(
                f"cannot load {path.name} on {dev.name} (sm_{dev.sm}, {how} image, driver "
                f"{dev.driver_version // 1000}.{dev.driver_version % 1000 // 10}, kernels built by "
                f"nvcc {manifest.get('nvcc', '?')}): {_error_text(r[0])}; update the NVIDIA "
                f"driver or rebuild with REFLEX_CUDA_ARCH=sm_{dev.sm}")
        k = Kernels(module, package, r[1], image_for(dev.sm, manifest) or "ptx")
        _modules[key] = k
        return k


# ----------------------------------------------------------------------------------------------
# memory


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

    def alloc(self, nbytes: int) -> int:
        size = 512 if nbytes <= 512 else _round_size(int(nbytes))
        with self.lock:
            lst = self.free.get(size)
            if lst:
                ptr = lst.pop()
                self.cached_bytes -= size
                self.sizes[ptr] = size
                self.live_bytes += size
                return ptr
        ptr = mem_alloc_raw(size, retry=self.trim)
        with self.lock:
            self.sizes[ptr] = size
            self.live_bytes += size
        return ptr

    def release(self, ptr: int) -> None:
        with self.lock:
            size = self.sizes.pop(ptr, None)
            if size is None:
                raise ValueError(f"free({ptr:#x}): not a pointer from driver.alloc (double free?)")
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
            synchronize()
        for p in blocks:
            check(_d.cuMemFree(p), "cuMemFree")
        return freed


_pool = _Pool()


def mem_alloc_raw(nbytes: int, retry: Any = None) -> int:
    """cuMemAlloc (no caching); on out-of-memory calls ``retry()`` (e.g. trim a cache) once."""
    _ensure()
    r = _d.cuMemAlloc(max(1, int(nbytes)))
    if r[0] != _SUCCESS and retry is not None and getattr(r[0], "name", "") == \
            "CUDA_ERROR_OUT_OF_MEMORY":
        retry()
        r = _d.cuMemAlloc(max(1, int(nbytes)))
    if r[0] != _SUCCESS:
        if getattr(r[0], "name", "") == "CUDA_ERROR_OUT_OF_MEMORY":
            try:
                free_b, total_b = check(_d.cuMemGetInfo(), "cuMemGetInfo")
                info = f" ({int(free_b) / 2**20:.0f} of {int(total_b) / 2**20:.0f} MiB free)"
            except CudaError:
                info = ""
            raise CudaError(f"out of GPU memory allocating {nbytes / 2**20:.1f} MiB{info}; use a "
                            "smaller model or context")
        raise CudaError(f"cuMemAlloc({nbytes}) failed: {_error_text(r[0])}")
    return int(r[1])


def mem_free_raw(ptr: int) -> None:
    _ensure()
    check(_d.cuMemFree(ptr), "cuMemFree")


def alloc(nbytes: int) -> int:
    """Device memory of at least ``nbytes`` from the caching allocator (an int address)."""
    return _pool.alloc(nbytes)


def free(ptr: int) -> None:
    """Return a pointer from :func:`alloc` to the cache (not to the driver; see :func:`trim`)."""
    _pool.release(ptr)


def trim() -> int:
    """Release all cached device memory to the driver."""
    return _pool.trim()


def pool_stats() -> dict:
    return {"live_bytes": _pool.live_bytes, "cached_bytes": _pool.cached_bytes,
            "live_blocks": len(_pool.sizes)}


def _nbytes(data: Any) -> int:
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    return memoryview(data).nbytes


def htod(dst: int, data: Any, nbytes: int | None = None) -> None:
    """Copy host ``data`` (bytes-like, or an int host address with ``nbytes``) to ``dst``."""
    _ensure()
    n = _nbytes(data) if nbytes is None else int(nbytes)
    if n:
        check(_d.cuMemcpyHtoD(dst, data, n), f"cuMemcpyHtoD({n} bytes)")


def dtoh(src: int, nbytes: int, out: Any = None) -> Any:
    """Copy ``nbytes`` from device ``src`` into ``out`` (writable bytes-like, or an int host
    address) or a new bytearray, which is returned. Waits for earlier GPU work."""
    _ensure()
    if out is None:
        out = bytearray(nbytes)
    if nbytes:
        check(_d.cuMemcpyDtoH(out, src, nbytes),
              f"cuMemcpyDtoH({nbytes} bytes; a kernel launched earlier may have failed)")
    return out


def dtod(dst: int, src: int, nbytes: int) -> None:
    _ensure()
    if nbytes:
        check(_d.cuMemcpyDtoD(dst, src, nbytes), f"cuMemcpyDtoD({nbytes} bytes)")


def memset(ptr: int, value: int, nbytes: int) -> None:
    """Set ``nbytes`` bytes at ``ptr`` to ``value`` (0..255), in stream order."""
    _ensure()
    if nbytes:
        check(_d.cuMemsetD8(ptr, value & 0xFF, nbytes), "cuMemsetD8")


def memset_d32(ptr: int, value: int, count: int) -> None:
    """Set ``count`` 32-bit words at ``ptr`` to ``value`` (uint32 bit pattern)."""
    _ensure()
    if count:
        check(_d.cuMemsetD32(ptr, value & 0xFFFFFFFF, count), "cuMemsetD32")


# ----------------------------------------------------------------------------------------------
# host memory: addresses of (read-only) buffers, registration, the cold-path upload


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
            _ensure()
            check(_d.cuMemHostUnregister(self.start), "cuMemHostUnregister")
            self.length = 0
            self._keep = None


def host_register(addr: int, nbytes: int, keepalive: Any = None,
                  read_only: bool = True) -> tuple[HostRegistration | None, str]:
    """Page-lock the page-aligned range enclosing ``[addr, addr+nbytes)``.
    Returns (registration, "") or (None, why it was refused)."""
    _ensure()
    start, length = page_range(addr, nbytes)
    flags = _d.CU_MEMHOSTREGISTER_READ_ONLY if read_only else 0
    r = _d.cuMemHostRegister(start, length, flags)
    if r[0] != _SUCCESS:
        return None, _error_text(r[0])
    return HostRegistration(start, length, keepalive), ""


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
    process exit)."""
    _ensure()
    base, total = buffer_address(src)
    if offset < 0 or offset + nbytes > total:
        raise ValueError(f"upload range [{offset}, {offset + nbytes}) outside a buffer of {total}")
    addr = base + offset
    t0 = time.perf_counter()
    if not (register and nbytes):
        if nbytes:
            check(_d.cuMemcpyHtoD(dst, addr, nbytes), f"cuMemcpyHtoD(weights, {nbytes} bytes)")
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
    flags = _d.CU_MEMHOSTREGISTER_READ_ONLY

    def worker() -> None:
        try:
            _ensure()
            stream = check(_d.cuStreamCreate(0), "cuStreamCreate")
            try:
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        break
                    s0, n = spans[i]
                    lo, hi = max(s0, addr), min(s0 + n, addr + nbytes)
                    r0 = time.perf_counter()
                    r = _d.cuMemHostRegister(s0, n, flags)
                    r1 = time.perf_counter()
                    if r[0] == _SUCCESS:
                        with lock:
                            regs.append(HostRegistration(s0, n, src))
                            reg_ms[0] += (r1 - r0) * 1e3
                        check(_d.cuMemcpyHtoDAsync(dst + (lo - addr), lo, hi - lo, stream),
                              f"cuMemcpyHtoDAsync(weights, {hi - lo} bytes)")
                    else:
                        with lock:
                            why.append(_error_text(r[0]))
                        check(_d.cuMemcpyHtoD(dst + (lo - addr), lo, hi - lo),
                              f"cuMemcpyHtoD(weights, {hi - lo} bytes)")
                check(_d.cuStreamSynchronize(stream), "cuStreamSynchronize")
            finally:
                _d.cuStreamDestroy(stream)
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
        registration.release()
        raise errors[0]
    method = "registered" if not why else ("pageable" if not regs else "mixed")
    return {"method": method, "register_ms": reg_ms[0],
            "copy_ms": (time.perf_counter() - t0) * 1e3, "chunks": len(spans),
            "threads": n_threads, "registration": registration,
            "why": why[0] if why else ""}


# ----------------------------------------------------------------------------------------------
# events


class Event:
    """A CUDA event (timing enabled). ``record()`` on the default stream."""

    def __init__(self) -> None:
        _ensure()
        self.handle = check(_d.cuEventCreate(_d.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def record(self) -> "Event":
        check(_d.cuEventRecord(self.handle, _STREAM), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        check(_d.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def __del__(self) -> None:
        try:
            if _d is not None:
                _d.cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (waits for ``end``)."""
    end.synchronize()
    return float(check(_d.cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime"))


# ----------------------------------------------------------------------------------------------
# smoke test


def smoke() -> dict:
    """Initialise, load the core module, add two 1027-float vectors on the GPU and check the
    result exactly. Returns {"device", "sm", "image", "driver_version", "ms"}.
    Raises CudaUnavailable / CudaError (one line) when anything is wrong."""
    t0 = time.perf_counter()
    dev = wait()
    k = get_kernels("core")
    n = 1027
    a = struct.pack(f"<{n}f", *[float(i) for i in range(n)])
    b = struct.pack(f"<{n}f", *[0.5 * i - 3.0 for i in range(n)])
    pa, pb, py = alloc(4 * n), alloc(4 * n), alloc(4 * n)
    try:
        htod(pa, a)
        htod(pb, b)
        memset(py, 0xFF, 4 * n)
        k.launch("reflex_add", (n + 255) // 256, 256, "PPPi", (pa, pb, py, n))
        got = struct.unpack(f"<{n}f", bytes(dtoh(py, 4 * n)))
    finally:
        for p in (pa, pb, py):
            free(p)
    want = [float(i) + (0.5 * i - 3.0) for i in range(n)]
    bad = [i for i in range(n) if got[i] != want[i]]
    if bad:
        i = bad[0]
        raise CudaError(f"smoke test: reflex_add gave wrong results at {len(bad)} of {n} "
                        f"elements (first: [{i}] = {got[i]}, expected {want[i]})")
    return {"device": dev.name, "sm": dev.sm, "image": k.image,
            "driver_version": dev.driver_version, "ms": (time.perf_counter() - t0) * 1e3}
