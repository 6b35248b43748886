"""Kernel modules: loading a package's cubin/fatbin, launching its kernels, its size limits.

Launches
--------
``Kernels.launch(name, grid, block, args, shmem=0)`` takes the kernel's parameter signature from
the package's manifest (the build read it off the ``extern "C" __global__`` declaration, so
Python never restates it) and packs ``args`` with one precompiled ``struct.Struct`` per
signature into a fixed ctypes buffer of 8-byte slots, then hands the driver the address (an
``int``) of a fixed ``void*[n]`` array pointing at the slots: cuda-bindings passes an int
``kernelParams`` straight through as ``void**`` (no per-launch conversion). Signature chars:
``P`` device pointer, ``i`` int32, ``I`` uint32, ``q`` int64, ``Q`` uint64, ``f`` float32,
``d`` float64. Measured on the (GPU-less) dev machine against a stub libcuda: packing 12
parameters ~0.35 us, cuda-bindings' ``cuLaunchKernel`` wrapper ~0.35 us, the whole
``Kernels.launch`` ~1.4-2 us of Python before the driver's own cost. The buffers are shared per
signature: launch from one thread at a time (the engine does). :func:`launch_count` counts every
launch of the process (benchmarks and tests take differences around a forward pass).

Modules load eagerly (``CUDA_MODULE_LOADING=EAGER`` unless set, see ``start.DRIVER_ENV``) on
the init thread (:func:`load_modules`, run by :mod:`.start`), so no kernel is loaded lazily
inside the first forward pass -- all but the :data:`ON_DEMAND` ones, which only some files need
and whose loading every other cold start would pay for (the CUDA backend loads them once it
knows the file's tensor types); :func:`get_kernels` loads a module not loaded yet on first use.

Limits
------
:func:`limit` serves the ``#define REFLEX_<NAME> <int>`` constants of a package's CUDA sources
(sizes the kernels' shared arrays and loops are built for), recorded in its manifest.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from typing import Any, Sequence

from ..errors import CudaError, CudaUnavailable
from . import driver as _drv
from .manifest import (CORE_PACKAGE, CPU_HINT, SKIP_HINT, best_cubin, coverage_error,
                       image_for, kernels_dir, read_manifest)

# dynamic shared memory any kernel may launch with before allow_shmem (the driver's default
# is 48 KB less the kernel's static shared memory: kept under it)
_SHMEM_DEFAULT = 32 << 10
_SHMEM_STATIC_MARGIN = 1 << 10  # room left for a kernel's own static shared memory
_attrs: dict[str, int] = {}  # the device's attributes asked so far, by CUdevice_attribute name


def _device_attribute(name: str) -> int:
    """The current device's CUdevice_attribute ``name``, asked once."""
    v = _attrs.get(name)
    if v is None:
        d = _drv._d
        v = _attrs[name] = int(_drv.check(d.cuDeviceGetAttribute(
            getattr(d.CUdevice_attribute, name), _drv.current_device().handle),
            f"cuDeviceGetAttribute({name})"))
    return v


def _shmem_optin() -> int:
    """The largest shared memory a block may opt in to."""
    return _device_attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")


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


_PACKERS: dict[str, ParamPacker] = {}
_n_launches = 0  # every Kernels.launch of the process (debug / benchmarks: launch_count())
# while not None: every launch as (kernel, grid, block, shmem, signature, arguments); set by
# reflex_core.backends.cuda_graph to see whether two decode steps launch the very same work
launch_trace: list | None = None


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
    """One loaded module: function handles cached by name, ``launch``. ``signatures``: kernel
    name -> parameter signature, from the package's manifest."""

    def __init__(self, module: str, package: str, handle: Any, image: str,
                 signatures: dict[str, str]):
        self.module = module
        self.package = package
        self.handle = handle
        self.image = image  # "sass" or "ptx" for this device
        self.signatures = signatures
        self._fns: dict[str, Any] = {}
        self._ents: dict[str, tuple[Any, ParamPacker]] = {}  # name -> (function, packer)
        self._shmem: dict[str, int] = {}  # name -> dynamic shared memory allowed (allow_shmem)
        self._occupancy: dict[tuple, int] = {}  # (name, threads, shmem) -> blocks_per_sm

    def function(self, name: str) -> Any:
        f = self._fns.get(name)
        if f is None:
            _drv.ensure_context()
            try:
                f = _drv.check(_drv._d.cuModuleGetFunction(self.handle, name.encode()),
                               f"cuModuleGetFunction({name!r})")
            except CudaError as e:
                raise CudaError(f"kernel {name!r} is not in {self.package}'s {self.module!r} "
                                f"kernels ({e})") from None
            self._fns[name] = f
        return f

    def sm(self) -> int:
        """The device's compute capability as one number (90 for sm_90)."""
        return _drv.current_device().sm

    def multiprocessors(self) -> int:
        """The device's multiprocessor count (launchers size their blocks by it)."""
        return _device_attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")

    def blocks_per_sm(self, name: str, threads: int, shmem: int) -> int:
        """How many blocks of ``threads`` with ``shmem`` bytes of dynamic shared memory of
        ``name`` a multiprocessor holds at once (the driver's occupancy count: registers, shared
        memory, threads). Call :meth:`allow_shmem` first where ``shmem`` passes 48 KB. Asked of
        the driver once per kernel and sizes (eager decode steps plan their launches each step)."""
        key = (name, threads, shmem)
        n = self._occupancy.get(key)
        if n is None:
            d = _drv._d
            n = self._occupancy[key] = int(_drv.check(
                d.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function(name), int(threads),
                                                              int(shmem)),
                f"cuOccupancyMaxActiveBlocksPerMultiprocessor({name!r})"))
        return n

    def allow_shmem(self, name: str, nbytes: int) -> bool:
        """Let ``name`` launch with ``nbytes`` of dynamic shared memory: past the default 48 KB a
        kernel needs the opt-in attribute (once per kernel and size, the largest kept). False,
        and nothing set, when the device allows less than that (the caller launches another
        kernel)."""
        if nbytes <= self._shmem.get(name, _SHMEM_DEFAULT):
            return True
        if nbytes + _SHMEM_STATIC_MARGIN > _shmem_optin():
            return False
        d = _drv._d
        attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _drv.check(d.cuFuncSetAttribute(self.function(name), attr, int(nbytes)),
                   f"cuFuncSetAttribute({name!r}, max dynamic shared memory {nbytes})")
        self._shmem[name] = nbytes
        return True

    def _entry(self, name: str) -> tuple[Any, ParamPacker]:
        sig = self.signatures.get(name)
        if sig is None:
            raise CudaError(f"kernel {name!r} is not in {self.package}'s {self.module!r} "
                            f"kernels (its manifest.json has no signature for it)")
        ent = self._ents[name] = (self.function(name), packer(sig))
        return ent

    def launch(self, name: str, grid: Any, block: Any, args: Sequence[Any],
               shmem: int = 0) -> None:
        """Launch ``name`` on the default stream. ``grid``/``block``: int or (x[, y[, z]]).
        ``args`` must match the kernel's parameters (ValueError, one line, when they do not)."""
        global _n_launches
        ent = self._ents.get(name)
        if ent is None:
            ent = self._entry(name)
        f, p = ent
        if len(args) != p.n:
            raise ValueError(f"{name}: signature {p.sig!r} has {p.n} parameters, "
                             f"got {len(args)}")
        try:
            p.st.pack_into(p.buf, 0, *args)
        except struct.error as e:
            raise ValueError(f"{name}: arguments {list(args)!r} do not fit signature "
                             f"{p.sig!r} ({e})") from None
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
            _drv.ensure_context()
        _n_launches += 1
        if launch_trace is not None:
            launch_trace.append((name, (gx, gy, gz, bx, by, bz, shmem), p.sig, tuple(args)))
        d = _drv._d
        if pdl and self.package == CORE_PACKAGE:
            r = d.cuLaunchKernelEx(_pdl_config(gx, gy, gz, bx, by, bz, shmem), f, p.addr, 0)
        else:
            r = d.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, _drv._STREAM, p.addr, 0)
        if r[0] != _drv._SUCCESS:
            raise CudaError(f"cuLaunchKernel({name}, grid=({gx},{gy},{gz}), "
                            f"block=({bx},{by},{bz}), shmem={shmem}) failed: "
                            f"{_drv.error_text(r[0])}")


# Programmatic dependent launch: while set (cuda_graph.DecodeGraph sets it while it captures a
# decode step, on a device of sm_90 or later), the core's kernels launch with programmatic
# stream serialization, so each one's launch overlaps the end of the kernel before it; their
# RX_PDL_ENTRY() (reflex/common.cuh) waits for that kernel's completion before touching memory.
# Plugins' kernels launch as before (nothing says they wait).
pdl = False


def _pdl_config(gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int) -> Any:
    d = _drv._d
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    c = d.CUlaunchConfig()
    c.gridDimX, c.gridDimY, c.gridDimZ = gx, gy, gz
    c.blockDimX, c.blockDimY, c.blockDimZ = bx, by, bz
    c.sharedMemBytes = shmem
    c.hStream = _drv._STREAM
    c.attrs = [attr]
    c.numAttrs = 1
    return c


_tls = _drv._tls
_modules: dict[tuple[str, str], Kernels] = {}
# package -> its modules that no start loads: the core's weight kernels of the low-bit, codebook,
# ternary and FP4 types (cuda/quant_lowbit.cu, an sm_90 cubin of ~2 MB against ~1.2 MB for the
# common types': cuModuleLoadData's time grows with the image); the CUDA backend loads it when
# it attaches a file with one of those types (quant_ops.modules_for)
ON_DEMAND: dict[str, frozenset[str]] = {CORE_PACKAGE: frozenset({"quant_lowbit"})}
_module_lock = threading.Lock()  # not driver._lock: loading a module must not hold up init


def get_kernels(module: str, package: str = CORE_PACKAGE) -> Kernels:
    """The loaded module ``<package>/kernels/<module>``: the device's cubin when one fits, else
    the fatbin (loaded once, cached)."""
    key = (package, module)
    k = _modules.get(key)
    if k is not None:
        return k
    dev = _drv.current_device()  # before _module_lock: init() may be running on another thread
    with _module_lock:
        k = _modules.get(key)
        if k is not None:
            return k
        manifest = read_manifest(package)
        reason = coverage_error(dev.sm, manifest, package)
        if reason:
            raise CudaUnavailable(reason)
        signatures = manifest.get("kernels")
        if signatures is None:
            raise CudaUnavailable(f"{package}'s kernels were built by an older Reflex (their "
                                  f"manifest.json has no kernel signatures); rebuild them or "
                                  f"{SKIP_HINT}", cpu_hint=CPU_HINT)
        folder = kernels_dir(package)
        target = best_cubin(dev.sm, manifest)
        path = folder / (f"{module}.sm_{target}.cubin" if target else f"{module}.fatbin")
        try:
            image = path.read_bytes()
        except OSError:
            raise CudaUnavailable(f"{path} is missing (the package's kernels are incomplete); "
                                  f"{SKIP_HINT}", cpu_hint=CPU_HINT) from None
        r = _drv._d.cuModuleLoadData(image)
        if r[0] != _drv._SUCCESS:
            how = image_for(dev.sm, manifest)
            raise CudaUnavailable(
                f"cannot load {path.name} on {dev.name} (sm_{dev.sm}, {how} image, driver "
                f"{dev.driver_version // 1000}.{dev.driver_version % 1000 // 10}, kernels built by "
                f"nvcc {manifest.get('nvcc', '?')}): {_drv.error_text(r[0])}; update the NVIDIA "
                f"driver or rebuild with REFLEX_CUDA_ARCH=sm_{dev.sm}")
        k = Kernels(module, package, r[1], image_for(dev.sm, manifest) or "ptx", signatures)
        _modules[key] = k
        return k


def start_modules(manifest: dict, package: str = CORE_PACKAGE) -> list[str]:
    """The modules of ``package``'s manifest that a start loads: all but its :data:`ON_DEMAND`
    ones."""
    skip = ON_DEMAND.get(package, frozenset())
    return [m for m in manifest.get("modules", {}) if m not in skip]


def load_modules(names: Sequence[str] | None = None, package: str = CORE_PACKAGE) -> None:
    """Load those of ``package``'s modules ``names`` not loaded yet (None: its
    :func:`start_modules`), timing each in driver.INIT_STEPS (``load core``; a plugin's as
    ``load <package>/<module>``)."""
    if names is None:
        names = start_modules(read_manifest(package), package)
    prefix = "" if package == CORE_PACKAGE else f"{package}/"
    for m in names:
        if (package, m) in _modules:
            continue
        t = time.perf_counter()
        get_kernels(m, package)
        _drv.INIT_STEPS[f"load {prefix}{m}"] = (time.perf_counter() - t) * 1e3


_limits: dict[str, dict[str, int]] = {}  # package -> its manifest's limits


def limit(name: str, package: str = CORE_PACKAGE) -> int:
    """The ``#define REFLEX_<name> <int>`` of ``package``'s CUDA sources (``limit("MOE_MAX_E")``),
    as its build recorded it; read from the manifest once per package, so callers may ask per
    call. CudaUnavailable when the package has no kernels; KeyError (naming the known limits)
    when the build recorded no such limit."""
    limits = _limits.get(package)
    if limits is None:
        limits = _limits[package] = dict(read_manifest(package).get("limits", {}))
    try:
        return limits[name]
    except KeyError:
        raise KeyError(f"{package}'s kernels define no REFLEX_{name} (known: "
                       f"{', '.join(sorted(limits)) or 'none'}; kernels built by an older "
                       f"Reflex?)") from None
