"""Background work of the cold path: a tiny thread wrapper and the process-wide CUDA init.

Kept free of heavy imports: the console entry point imports it before anything else.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class Background:
    """Run ``fn`` on a daemon thread now; ``wait()`` returns its result or raises its error."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._result: Any = None
        self._error: BaseException | None = None
        self.t0 = time.perf_counter()
        self.t1 = self.t0
        self._thread = threading.Thread(target=self._run, name="reflex-bg", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self._error = e
        finally:
            self.t1 = time.perf_counter()

    def wait(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def succeeded(self) -> bool:
        """Finished without raising (False while still running)."""
        return not self._thread.is_alive() and self._error is None

    def span(self) -> tuple[float, float]:
        return (self.t0, self.t1)


class CudaStart:
    """The process-wide CUDA start, on two daemon threads.

    ``reflex-cuda-init`` runs :func:`reflex_core.cuda.driver.init` without modules (its first
    steps are ctypes calls into libcuda that release the GIL: cuInit and the primary context),
    signals that the context is ready, then loads the kernel modules -- so the engine can start
    the weight upload while the modules load. ``reflex-cuda-import`` imports cuda-bindings
    (~40 ms of GIL-held import work) meanwhile, so it is not added to the driver's chain.
    ``REFLEX_CUDA_PREIMPORT=0`` imports it on the init thread instead (an A/B knob for
    benchmarks)."""

    def __init__(self) -> None:
        import os

        self.t0 = time.perf_counter()
        self.t_ctx = self.t1 = self.t0
        self.device: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reflex-cuda-init", daemon=True)
        self._thread.start()
        if os.environ.get("REFLEX_CUDA_PREIMPORT", "1") != "0":
            threading.Thread(target=self._preimport, name="reflex-cuda-import",
                             daemon=True).start()

    @staticmethod
    def _preimport() -> None:
        try:
            import cuda.bindings.driver  # noqa: F401
        except BaseException:  # noqa: BLE001 - the init thread reports a missing package
            pass

    def _run(self) -> None:
        from .cuda import early  # ctypes only: the driver's start comes before any other import

        try:
            e: Any = early.run()
        except early.EarlyError as err:
            e = err
        from .cuda import driver

        try:
            self.device = driver.init(preload=(), early_result=e)
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self.error = e
        finally:
            self.t_ctx = time.perf_counter()
            self._ready.set()
        if self.error is None:
            try:
                driver.load_modules()
            except BaseException:  # noqa: BLE001 - the first launch loads again and raises
                pass
        self.t1 = time.perf_counter()
        self._done.set()

    def wait(self) -> Any:
        """The Device once the context is ready (modules may still be loading), current on the
        calling thread; raises the init error."""
        self._ready.wait()
        if self.error is not None:
            raise self.error
        from .cuda import driver

        return driver.current_device()

    def wait_all(self) -> Any:
        """Like :meth:`wait`, and the core's modules loaded too."""
        self._done.wait()
        return self.wait()

    def succeeded(self) -> bool:
        """The context is up (False while starting or after a failure)."""
        return self._ready.is_set() and self.error is None

    def span(self) -> tuple[float, float]:
        """(start, context ready) in perf_counter seconds."""
        return (self.t0, self.t_ctx)

    def modules_span(self) -> tuple[float, float]:
        return (self.t_ctx, self.t1 if self._done.is_set() else self.t_ctx)


_CUDA_INIT: CudaStart | None = None


def start_cuda_init() -> CudaStart:
    """Start CUDA initialisation in the background (once per process). The console entry point
    calls this before importing the CLI, so the driver's ~0.2-0.3 s of cuInit and context
    creation overlap even the interpreter's remaining imports."""
    global _CUDA_INIT
    if _CUDA_INIT is None:
        _CUDA_INIT = CudaStart()
    return _CUDA_INIT
