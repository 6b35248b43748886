"""The process-wide CUDA start: begun first, on one thread, waited for once.

The driver's own start is the cold path's longest chain (cuInit ~0.1 s + primary context
~0.12 s on the H200 machine), and its steps release the GIL. :func:`start` begins it on a daemon
thread (``reflex-cuda-init``) as early as the process can: the console entry point calls it
before the CLI is even imported (``reflex_core/_launch.py``), the engine calls it again (a
no-op then) for library users. The thread runs

1. :func:`reflex_core.cuda.early.run` -- ctypes only: dlopen, cuInit, device queries, primary
   context -- before cuda-bindings is imported (the main thread usually imports it meanwhile);
2. :func:`reflex_core.cuda.driver.init`, which adopts that context and checks the kernels cover
   the GPU;
3. the core's kernel modules (the device's cubins, ~4 ms) -- all but the weight kernels of the
   rarer GGML types (``modules.ON_DEMAND``: the CUDA backend loads them when it attaches a file
   that has one) --, then those of the plugin packages :meth:`CudaStart.load_package` asked
   for. Measured on the H200: loading modules while the weight upload pins pages made each
   load 5-10x slower (driver-side contention) and no sooner done, so the engine starts the
   upload only after :meth:`CudaStart.wait`.

Importing this module imports only the standard library (os, threading, time): it is safe as
the first thing a process does.

Environment: the driver reads :data:`DRIVER_ENV` when it starts, so :func:`start` sets the
variables the user has not set -- on the main thread, before the thread starts, since setenv
while another thread reads the environment is undefined behaviour in glibc -- and
:meth:`CudaStart.wait` removes them again on the main thread once the context exists, so
processes this one starts (and libraries that read them later) do not inherit Reflex's
choices. Called off the main thread, :func:`start` changes nothing (the driver's defaults).

Threads: the init thread is joined by :meth:`CudaStart.wait`. A process that exits without
waiting (an error on the main thread first) leaves it inside a driver call or a module load: a
daemon thread that writes no files and holds no lock the exit path needs, so harmless.
"""

from __future__ import annotations

import os
import threading
import time

# Driver settings read when the driver starts:
# - one hardware work queue per context instead of 8: the context is created in ~58 ms instead
#   of ~120 ms on the H200 (bench/cuda_init_probe.py). Reflex issues its kernels in order on one
#   stream and its upload is copy-engine bound, so more queues would buy it nothing;
# - every kernel of a module loaded with the module (on the init thread) rather than lazily at
#   its first launch inside the first forward pass.
# A value the user set wins and is never touched.
DRIVER_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUDA_MODULE_LOADING": "EAGER"}

CORE_PACKAGE = "reflex_core"


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class CudaStart:
    """The CUDA start of this process (see the module's docstring); make it with :func:`start`.

    ``device``: the Device once ready (None before, or after a failure); ``error``: the
    failure. Times are perf_counter seconds: ``t0`` start, ``t_ctx`` context up, ``t1`` modules
    loaded."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t_ctx = self.t1 = self.t0
        self.device: object = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._requested: set[str] = set()
        self._pending: list[str] = []  # plugin packages for the init thread, in request order
        self._late: list[str] = []  # asked for after the thread finished: wait() loads them
        self._closed = False  # the init thread takes no more packages
        self._env_ours: list[str] = []
        if _on_main_thread():
            self._env_ours = [k for k in DRIVER_ENV if k not in os.environ]
            for k in self._env_ours:
                os.environ[k] = DRIVER_ENV[k]
        self._ready = threading.Event()
        # plugin package -> which thread loaded its kernels ("init thread" or "caller")
        self.loaded_on: dict[str, str] = {}
        self._thread = threading.Thread(target=self._run, name="reflex-cuda-init", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from . import early  # ctypes only: the driver's start comes before any other import

        try:
            try:
                e: object = early.run(0)
            except early.EarlyError as err:
                e = err
            from . import driver, modules

            self.device = driver.init(0, early_result=e)
            self.t_ctx = time.perf_counter()
            modules.load_modules()
            while True:
                with self._lock:
                    if not self._pending:
                        self._closed = True
                        break
                    package = self._pending.pop(0)
                _load_package(package)
                self.loaded_on[package] = "init thread"
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self.error = e
        finally:
            with self._lock:
                self._closed = True
            self.t1 = time.perf_counter()
            if self.t_ctx == self.t0:
                self.t_ctx = self.t1
            self._ready.set()

    def load_package(self, package: str) -> None:
        """Have ``package``'s kernel modules (its kernels/manifest.json) loaded: on the init
        thread after the core's, or -- when that thread has finished already -- on the thread
        that calls :meth:`wait` next. A package that ships no kernels is nothing to load; one
        whose kernels cannot load makes :meth:`wait` raise (CudaUnavailable). The engine calls
        this as soon as it has resolved the file's plugin."""
        if package == CORE_PACKAGE:
            return
        with self._lock:
            if package in self._requested:
                return
            self._requested.add(package)
            (self._late if self._closed else self._pending).append(package)

    def wait(self) -> object:
        """The Device once the context is up and the requested modules are loaded, current on
        the calling thread; raises the start's error (CudaUnavailable, one line). On the main
        thread it also puts the environment back (see the module's docstring)."""
        self._ready.wait()
        self._thread.join()  # it has set _ready in its last statement: returns at once
        self._restore_env()
        if self.error is not None:
            raise self.error
        from . import driver

        device = driver.current_device()
        while True:
            with self._lock:
                if not self._late:
                    break
                package = self._late.pop(0)
            try:
                _load_package(package)
                self.loaded_on[package] = "caller"
            except BaseException as e:  # noqa: BLE001 - sticky, as a failure on the thread
                self.error = e
                raise
        return device

    def _restore_env(self) -> None:
        if not self._env_ours or not _on_main_thread():
            return
        ours, self._env_ours = self._env_ours, []
        for k in ours:
            if os.environ.get(k) == DRIVER_ENV[k]:  # unless someone set it since
                del os.environ[k]

    def starting(self) -> bool:
        """Still starting (neither ready nor failed yet)."""
        return not self._ready.is_set()

    def ready(self) -> bool:
        """Wait until the start has finished; True when it succeeded. Unlike :meth:`wait` it
        neither loads late modules nor touches the environment: for helper threads that need
        only the context (each makes it current itself, driver.ensure_context)."""
        self._ready.wait()
        return self.error is None

    def succeeded(self) -> bool:
        """Ready (False while starting or after a failure)."""
        return self._ready.is_set() and self.error is None

    def span(self) -> tuple[float, float]:
        """(start, context up) in perf_counter seconds."""
        return (self.t0, self.t_ctx)

    def modules_span(self) -> tuple[float, float]:
        """(context up, modules loaded on the init thread)."""
        return (self.t_ctx, self.t1)


def _load_package(package: str) -> None:
    from . import manifest, modules

    if manifest.has_kernels(package):
        modules.load_modules(None, package)


_current: CudaStart | None = None
_start_lock = threading.Lock()


def start() -> CudaStart:
    """Start CUDA in the background, once per process (later calls return the same start)."""
    global _current
    with _start_lock:
        if _current is None:
            _current = CudaStart()
        return _current


def current() -> CudaStart | None:
    """This process's CUDA start, or None when nothing started it."""
    return _current
