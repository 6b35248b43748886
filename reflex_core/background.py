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


_CUDA_INIT: Background | None = None


def start_cuda_init() -> Background:
    """Start CUDA initialisation on a background thread (once per process). The console entry
    point calls this before importing the CLI, so the driver's ~0.2-0.3 s of cuInit and context
    creation overlap even the interpreter's remaining imports."""
    global _CUDA_INIT
    if _CUDA_INIT is None:
        def init():
            from .cuda import driver

            return driver.init()

        _CUDA_INIT = Background(init)
    return _CUDA_INIT
