"""The end of a ``reflex`` process: flush the output, hand slow work to someone else, exit now.

Two things are slow after a one-shot command has printed its result, and the caller should
wait for neither:

- the GPU teardown: with a CUDA context, the kernel-side release of the context, its device
  memory and the pinned weight pages takes ~0.1 s at exit (the H200 machine: launch -> exit
  0.478 s with the detached exit, 0.562 s without);
- the GGUF index (``reflex_core.gguf_index``) of a file this process parsed the slow way, which
  the next process on that file wants.

So :func:`finish` never runs atexit handlers or the interpreter's finalisation (``os._exit``),
and:

- with a live CUDA context, it forks a child that holds a copy of the driver's file descriptors.
  The child only makes system calls: it points its stdio at /dev/null (so nobody waits on our
  pipes), leaves our session, waits until this process is gone, closes its descriptors (the
  last reference: the GPU teardown happens there, after the caller has moved on) and execs the
  index helper, or exits when there is no index to write. None of our Python runs in the child
  between the fork and the exec (only the interpreter's own after-fork hooks, made for this):
  the parent may have threads (the upload's, the CUDA start's) holding locks the child would
  inherit held. ``REFLEX_DETACHED_EXIT=0`` turns the fork off.
- otherwise (or with the fork off, or if it fails) it starts the index helper as a detached
  process of its own (new session, stdio on /dev/null, no inherited descriptors) when an index
  is pending.

The index helper never creates a cache directory: a user may delete the cache right after the
command returned, and it must stay deleted. So the index folder is made (and checked,
reflex_core.cachedir) here, before we exit, and the helper writes only into folders that exist;
when the cache is off (an unsafe folder) no helper is started at all.

Signals (:func:`handle_signals`, installed first thing by the console entry point): Ctrl-C
(SIGINT) or SIGTERM at any point -- during the imports, the load, the forward, between the
output and the exit -- prints one line (``error: interrupted`` / ``error: terminated``) and
exits 130 / 143 at once (``os._exit``; the temporary file of a cache or state-file write under
way is removed, and so is a file named by :func:`remove_on_signal`: a server's socket bound
before its load). Without this, Python raises KeyboardInterrupt wherever the main thread
happens to be (a traceback when that is outside the CLI's ``try``, e.g. in :func:`finish` or an
import) and dies silently of SIGTERM. The fork child must run none of it: signals are blocked across the
fork, and the child ignores SIGINT (it is in the caller's process group until its ``setsid``;
the exec'd helper inherits the ignore) and takes SIGTERM's default.

The index helper is ``python -m reflex_core.gguf_index PATH...``: a fresh interpreter that
parses each file and writes its missing or stale index. Without a CUDA context it is spawned
too, rather than the index built here before exit: measured on a 2-core dev machine with a tiny
model carrying Qwen3's tokenizer, building it here (the tokenizer tables) held the exit
~265 ms, the spawn (subprocess import included) ~5-15 ms. The price: the index lands ~0.35 s
after our exit, so a process started right after ours may still miss it (and spawn its own).
"""

from __future__ import annotations

import _signal  # the C half of ``signal``, loaded at startup (``signal`` builds enums: ~1 ms)
import os
import sys

TYPE_CHECKING = False  # typing costs ~5 ms to import, before the CUDA start (reflex_core._launch)
if TYPE_CHECKING:
    from typing import NoReturn

INDEX_HELPER_MODULE = "reflex_core.gguf_index"
INDEX_CACHE = "index"  # the cache folder the helper writes into (gguf_index.INDEX_DIR)
_SIGNALS = {_signal.SIGINT: (b"error: interrupted\n", 130),
            _signal.SIGTERM: (b"error: terminated\n", 143)}
_ending = False  # a signal handler is ending the process
_remove: dict[str, tuple[int, int]] = {}  # path -> (st_dev, st_ino) of a file we made
_json_errors = False  # the command prints JSON: a signal's end is also a JSON object on stdout


def json_errors() -> None:
    """The command was given --json: a signal ends it with the error object on stdout too
    (render.error_json's shape, written here without importing json)."""
    global _json_errors
    _json_errors = True


def finish(code: int) -> NoReturn:
    """End the process with exit status ``code`` once stdout and stderr are flushed, leaving the
    GPU teardown and any pending GGUF index to a detached child (see the module's docstring)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed or broken stream must not change the exit
        pass
    helper = index_helper_argv()
    detached = (_cuda_context_live() and os.environ.get("REFLEX_DETACHED_EXIT") != "0"
                and _fork_teardown_child(helper))
    if helper and not detached:
        _spawn_detached(helper)
    os._exit(code)


def remove_on_signal(path: str) -> None:
    """A signal's end (:func:`_on_signal`) removes the file ``path`` -- this process made it
    -- while it is still that file (one removed or replaced since is left alone)."""
    st = os.lstat(path)
    _remove[path] = (st.st_dev, st.st_ino)


def handle_signals() -> None:
    """End the process on SIGINT / SIGTERM with one line and exit status 130 / 143, whatever it
    is doing (module docstring). For the ``reflex`` command only (a library leaves signals to
    its application); call it from the main thread, as early as possible. A signal ignored by
    whoever started us (``nohup``, a background job of a script) stays ignored."""
    for signum in _SIGNALS:
        if _signal.getsignal(signum) != _signal.SIG_IGN:
            try:
                _signal.signal(signum, _on_signal)
            except ValueError:  # not the main thread (an application running the CLI)
                return


def _on_signal(signum: int, frame) -> None:
    global _ending
    if _ending:  # a second signal while the first one ends the process (handlers nest)
        return
    _ending = True
    for name in ("reflex_core.cachedir", "reflex_core.statefile"):  # temp files of writes
        writer = sys.modules.get(name)
        if writer is not None:
            writer.discard_writes_in_flight()
    for path, ident in list(_remove.items()):
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == ident:
                os.unlink(path)
        except OSError:
            pass
    line, code = _SIGNALS[signum]
    try:
        sys.stdout.flush()  # what was generated so far reaches the reader
    except Exception:  # noqa: BLE001 - the signal came inside a write to stdout: skip it
        pass
    try:
        # os.write, not sys.stderr: the signal may have come in the middle of a print
        os.write(2, line)
        if _json_errors:
            kind = line[len(b"error: "):-1]
            os.write(1, b'{"error": {"type": "%s", "message": "%s", "exit_code": %d}}\n'
                     % (kind, kind, code))
    except OSError:
        pass
    os._exit(code)


def index_helper_argv() -> list[str] | None:
    """The command that writes the index of every GGUF this process parsed the slow way, or
    None when there is none to write. Makes the index folder (the helper will not) when the
    cache is usable; None when it is not."""
    idx = sys.modules.get("reflex_core.gguf_index")  # not imported: no GGUF was opened
    if idx is None:
        return None
    paths = idx.pending_paths()
    if not paths:
        return None
    from . import cachedir

    if cachedir.cache_dir(INDEX_CACHE) is None:
        return None
    # Absolute paths: the helper does not depend on our working directory staying put.
    return [sys.executable, "-m", INDEX_HELPER_MODULE, *(os.path.abspath(p) for p in paths)]


def _cuda_context_live() -> bool:
    """A CUDA context was created in this process (its teardown is the slow part of exiting).

    Looked up in sys.modules: a process that never imported the CUDA start never started CUDA,
    and importing it here would only cost the CPU path time."""
    start = sys.modules.get("reflex_core.cuda.start")
    init = start.current() if start is not None else None
    return init is not None and init.succeeded()


def _fork_teardown_child(helper: list[str] | None) -> bool:
    """Fork the child that outlives us (module docstring). True in the parent when it runs;
    False when the fork failed (the caller then does the teardown itself)."""
    # Everything the child needs is computed here, before the fork.
    devnull = os.devnull.encode()
    max_fd = _max_fd()
    exe, argv = (helper[0], helper) if helper else (None, None)
    signals = set(_SIGNALS)
    try:
        gone_r, gone_w = os.pipe()  # EOF on gone_r: every write end closed, i.e. we exited
    except OSError:
        return False
    # Blocked in this thread across the fork, so the child starts with them blocked: our
    # handler must not run there (it would print to the caller's stderr). In the parent, a
    # signal taken meanwhile by another thread still runs the handler after the fork.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, signals)
    try:
        pid = os.fork()
    except OSError:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
        os.close(gone_r)
        os.close(gone_w)
        return False
    if pid != 0:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
        os.close(gone_r)
        return True
    # The child: system calls only, then exec or _exit.
    try:
        os.close(gone_w)
        null = os.open(devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.setsid()  # no terminal signals for what outlives the command
        # A Ctrl-C sent to the caller's group before the setsid is pending: ignoring SIGINT
        # discards it (and the helper inherits the ignore through the exec); SIGTERM kills.
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
        os.read(gone_r, 1)  # blocks until the parent has exited
        # Close the driver's descriptors ourselves (they need not be close-on-exec): the last
        # reference goes here, so the teardown happens here, not in the helper's lifetime.
        os.closerange(3, max_fd)
        if exe is not None:
            os.execv(exe, argv)
    finally:
        os._exit(0)


def _max_fd() -> int:
    """One past the highest descriptor this process may hold at the fork. Not SC_OPEN_MAX: that
    can be ~1e9 in a container, and closerange falls back to one close() per number where the
    kernel lacks close_range."""
    try:
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 64  # + those opened meanwhile
    except (OSError, ValueError):
        return 4096


def _spawn_detached(argv: list[str]) -> None:
    """Start ``argv`` in a session of its own, stdio on /dev/null, no other descriptors, and do
    not wait for it (best effort: a missing index only costs the next process time)."""
    import subprocess

    try:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    except OSError:
        pass
