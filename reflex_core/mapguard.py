"""A mapped file that shrinks under a running command: one line and exit status 1, not a
bare ``Bus error``.

GGUF files are read through read-only mmaps (reflex_core.gguf). When another process truncates
or rewrites a file while we read it -- ``cp new.gguf model.gguf`` over a model in use, a
download replacing it -- touching a page past the file's new end raises SIGBUS, which kills
the process without a word (exit 135). The faulting instruction would fault again on return,
so the handler cannot resume anything: it writes ``error: model file changed while reading
(PATH)`` and ends the process (``os._exit(1)``).

For the ``reflex`` command only (:func:`enable`, called by the CLI before any file is opened):
a library leaves its application's signals alone. The handler is installed through libc's
``signal`` with a ctypes callback, on the first mapped file of an enabled process. The
callback runs Python on the faulting thread: the GIL is taken the way any foreign callback
takes it (at once on a thread that holds it, as the main thread copying out of the map does;
after a wait on a thread that released it, as an upload thread inside a copy does), and it
only makes two system calls. Where the kernel itself reads the pages (the GPU upload pins them
with cuMemHostRegister), a cut file is an error code instead of a signal:
:func:`check_unchanged` turns that error into the same message.
"""

from __future__ import annotations

import os

_enabled = False
_installed = False
_paths: list[str] = []  # the files mapped by this process, named by the error
_keep: list[object] = []  # the ctypes callback must outlive its installation


def enable() -> None:
    """Turn the guard on for this process (the CLI). Cheap: ctypes waits for the first map."""
    global _enabled
    _enabled = True
    if _paths:
        _install()


def mapped(path: str) -> None:
    """``path`` was just mapped (by reflex_core.modelfile for a model, reflex_core.lora for an
    adapter: the GGUF reader itself stays free of process-wide concerns)."""
    if path not in _paths:
        _paths.append(path)
    if _enabled and not _installed:
        _install()


def check_unchanged(path: str, mapped_bytes: int) -> None:
    """Raise the guard's error when ``path`` is now shorter than the ``mapped_bytes`` read from
    it (for a read that failed with an error code instead of a signal)."""
    from .errors import ReflexError

    try:
        size = os.stat(path).st_size
    except OSError:
        size = -1
    if size < mapped_bytes:
        raise ReflexError(f"model file changed while reading ({path})")


def message() -> bytes:
    names = ", ".join(_paths) or "?"
    return f"error: model file changed while reading ({names})\n".encode(errors="replace")


def _on_sigbus(signum: int) -> None:
    try:
        os.write(2, message())
    finally:
        os._exit(1)


def _install() -> None:
    global _installed
    import _signal  # the C half of ``signal`` (which builds enums on import)
    import ctypes

    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
    callback = handler_type(_on_sigbus)
    libc = ctypes.CDLL(None)
    libc.signal.argtypes = [ctypes.c_int, handler_type]
    libc.signal.restype = ctypes.c_void_p
    libc.signal(_signal.SIGBUS, callback)
    _keep.append(callback)
    _installed = True
