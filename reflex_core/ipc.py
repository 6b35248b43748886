"""``reflex stdio`` / ``reflex uds``: one loaded model serving JSON-lines requests (docs/ipc.md).

One request per line, ``{"id": <any JSON>, "op": "<name>", ...params}``; one reply per line,
``{"id": ..., "result": {...}}`` or ``{"id": ..., "error": {"code": ..., "message": ...}}``, in
order; each request is finished and answered before the next line is read. Over a Unix socket
one connection is served until its end of input before the next is accepted.

Framing is ours, on raw descriptors: input is read in bounded chunks, a line longer than
MAX_LINE is discarded up to its newline as it arrives (never held whole), and the reply is
written straight to the descriptor. Bad input of any kind is an error reply, never the end of
the server; a reply the client can no longer receive is dropped.

Signals: while serving, SIGINT / SIGTERM only set a flag (and wake the loop through
``signal.set_wakeup_fd``); the request under way is finished and answered, then the server ends
with exit status 130 / 143. (Before serving -- during the load -- reflex_core.lifecycle's
handlers end the process at once, as for any command.) End of input on stdio ends it with 0.
"""

from __future__ import annotations

import errno
import json
import math
import os
import select
import signal
import socket
import stat
import sys
from typing import Any, Callable, Iterator

from .api import ParamError
from .errors import ReflexError

PROTOCOL = 1
MAX_LINE = 16 << 20  # bytes of one request line, newline excluded
CHUNK = 1 << 16
_SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


class RequestError(Exception):
    """A request that gets an error reply: ``code`` (docs/ipc.md) and a one-line message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Stop(Exception):
    """A signal came while the server waited for input: end with ``code``."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


# ----------------------------------------------------------------------------------------------
# signals


class Signals:
    """SIGINT/SIGTERM turned into a flag plus a wake-up byte on a pipe that the read loops
    select on, for as long as the server runs (``with Signals() as sig``)."""

    def __init__(self) -> None:
        self.code = 0  # 130 / 143 once a signal came

    def __enter__(self) -> "Signals":
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._on_signal) for s in _SIGNAL_EXIT
                     if signal.getsignal(s) != signal.SIG_IGN}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._r)
        os.close(self._w)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.code:
            self.code = _SIGNAL_EXIT[signum]

    def wait_readable(self, fd: int) -> None:
        """Block until ``fd`` has input (or its end); raise Stop once a signal has come."""
        while True:
            if self.code:
                raise Stop(self.code)
            ready, _, _ = select.select([fd, self._r], [], [])
            if self._r in ready:
                try:
                    os.read(self._r, 512)
                except BlockingIOError:
                    pass
            if fd in ready and not self.code:
                return


# ----------------------------------------------------------------------------------------------
# framing


class TooLong:
    """A line over MAX_LINE bytes (discarded)."""

    def __init__(self, n: int):
        self.n = n


class LineReader:
    """Lines from ``read(n) -> bytes`` (b"" at the end of input), newline excluded; a line
    over MAX_LINE comes out as :class:`TooLong` once its newline (or the end) has been read,
    its bytes thrown away as they arrived. The last line needs no newline; blank lines are
    skipped."""

    def __init__(self, read: Callable[[int], bytes], wait: Callable[[], None],
                 limit: int = MAX_LINE):
        self._read, self._wait, self._limit = read, wait, limit
        self._buf = bytearray()
        self._eof = False

    def lines(self) -> Iterator[bytes | TooLong]:
        skipped = -1  # >= 0: inside an overlong line, that many bytes thrown away so far
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl]) if skipped < 0 and nl <= self._limit else None
                del self._buf[:nl + 1]
                if line is None:
                    yield TooLong(max(skipped, 0) + nl)
                elif line.strip():  # a blank line is no request: no reply
                    yield line
                skipped = -1
                continue
            if skipped >= 0 or len(self._buf) > self._limit:
                skipped = max(skipped, 0) + len(self._buf)
                self._buf.clear()
            if self._eof:
                if skipped >= 0:
                    yield TooLong(skipped)
                elif self._buf.strip():
                    yield bytes(self._buf)
                return
            self._wait()
            data = self._read(CHUNK)
            if not data:
                self._eof = True
            self._buf += data


# ----------------------------------------------------------------------------------------------
# requests


REQUIRED = object()  # a parameter without a default


def _param_types() -> dict[str, dict[str, tuple[Callable[[Any], bool], str, Any]]]:
    """op -> param -> (check, what it must be, default; REQUIRED when it has none)."""
    text = (lambda v: isinstance(v, str), "a string")
    flag = (lambda v: isinstance(v, bool), "true or false")
    state = (lambda v: v is None or isinstance(v, str) and v != "" or _is_slot(v),
             'a state file path or {"slot": NAME}')
    common = {"state": (*state, None), "save_state": (*state, None),
              "chat": (*flag, False), "system": (lambda v: v is None or isinstance(v, str),
                                                 "a string", None)}
    return {
        "ping": {}, "info": {},
        "tokenize": {"text": (*text, REQUIRED), "add_special": (*flag, True)},
        "detokenize": {"token_ids": (lambda v: isinstance(v, list) and all(_is_int(x)
                                                                          for x in v),
                                     "a list of integers", REQUIRED)},
        "generate": {"prompt": (*text, REQUIRED),
                     "max_tokens": (_is_int, "an integer", 32),
                     "temperature": (_is_num, "a number", 0.0),
                     "top_k": (_is_int, "an integer", 0),
                     "top_p": (_is_num, "a number", 1.0),
                     "seed": (lambda v: v is None or _is_int(v), "an integer", None),
                     "min_p": (_is_num, "a number", 0.0),
                     "repeat_penalty": (_is_num, "a number", 1.0),
                     "repeat_last_n": (_is_int, "an integer", 64),
                     "stop": (lambda v: v is None or isinstance(v, str) or isinstance(v, list)
                              and all(isinstance(s, str) for s in v),
                              "a string or a list of strings", None),
                     **common},
        "system1": {"prompt": (*text, REQUIRED),
                    "candidates": (lambda v: isinstance(v, list) and all(isinstance(c, str)
                                                                         for c in v),
                                   "a list of strings", REQUIRED),
                    "normalize": (*flag, False), **common},
        "free_state": {"slot": (*text, REQUIRED)},
        "shutdown": {},
    }


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer past the float range (JSON's 1 followed by 309 zeros)
        return False


def _is_slot(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"slot"} and isinstance(v["slot"], str)


PARAMS = _param_types()


def parse_request(line: bytes | TooLong) -> tuple[Any, str, dict]:
    """(id, op, params) of one line, params checked and defaulted. RequestError otherwise; its
    reply goes to ``err.req_id`` (None when the line gave none)."""
    if isinstance(line, TooLong):
        raise _unanswerable("too_large", f"request line of {line.n} bytes exceeds the limit of "
                                         f"{MAX_LINE} bytes")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _unanswerable("invalid_utf8", f"request is not UTF-8 (byte {e.start})") from None
    try:
        req = json.loads(text, parse_constant=_not_json, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, int digits limit, nesting
        raise _unanswerable("parse_error", f"request is not JSON: {str(e).splitlines()[0]}") \
            from None
    if not isinstance(req, dict):
        raise _unanswerable("invalid_request", "a request is a JSON object")
    req_id = req.get("id")
    op = req.get("op")
    try:
        if not isinstance(op, str):
            raise RequestError("invalid_request", 'a request needs "op", a string')
        spec = PARAMS.get(op)
        if spec is None:
            raise RequestError("unknown_op", f"unknown op {op!r}; ops: {', '.join(PARAMS)}")
        params = {k: v for k, v in req.items() if k not in ("id", "op")}
        extra = sorted(set(params) - set(spec))
        if extra:
            raise RequestError("invalid_params", f"{op}: unknown parameter {extra[0]!r}")
        for name, (ok, what, default) in spec.items():
            if name not in params:
                if default is REQUIRED:
                    raise RequestError("invalid_params", f"{op}: missing parameter {name!r}")
                params[name] = default
            elif not ok(params[name]):
                raise RequestError("invalid_params", f"{op}: {name!r} must be {what}")
    except RequestError as e:
        e.req_id = req_id  # type: ignore[attr-defined]
        raise
    return req_id, op, params


def _not_json(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON has not: a reply could not echo them."""
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    """A JSON number as a float; one beyond the float range (1e400) is refused: it would come
    back as inf, which JSON cannot write."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is out of range")
    return v


def _unanswerable(code: str, message: str) -> RequestError:
    e = RequestError(code, message)
    e.req_id = None  # type: ignore[attr-defined]
    return e


def state_bytes(saved: Any) -> int:
    """Host bytes a kept state holds (its cells' data)."""
    return sum(len(v) for v in saved.dumped["data"].values())


class Handler:
    """Runs the ops on an api.Engine; in-memory states live in named slots, together at most
    ``slot_limit`` bytes (``--slot-memory``) when a request that keeps one starts: the state it
    keeps may take them past it, since its size is known only after its job and refusing it
    then would lose the job's result."""

    def __init__(self, eng: Any, slot_limit: int):
        self.eng = eng
        self.slots: dict[str, Any] = {}
        self.slot_limit = slot_limit
        self.shutdown = False

    def slot_bytes(self, but: str | None = None) -> int:
        """The kept states' bytes, their names' included (``but``: leaving that slot out)."""
        return sum(state_bytes(v) + len(k.encode("utf-8", "surrogatepass"))
                   for k, v in self.slots.items() if k != but)

    def __call__(self, op: str, p: dict) -> dict:
        return getattr(self, "op_" + op)(**p)

    def op_ping(self) -> dict:
        return {"pong": True}

    def op_info(self) -> dict:
        from . import __version__

        e = self.eng
        return {"model": e.path, "arch": e.arch, "backend": e.backend, "device": e.device,
                "n_ctx_train": e.n_ctx_train, "ctx_size": e.ctx_size, "n_vocab": e.n_vocab,
                "lora": e.lora,
                "version": __version__, "protocol": PROTOCOL, "max_line_bytes": MAX_LINE,
                "ops": list(PARAMS), "slots": sorted(self.slots),
                "slot_bytes": self.slot_bytes(), "slot_limit_bytes": self.slot_limit,
                "pid": os.getpid()}

    def op_tokenize(self, text: str, add_special: bool) -> dict:
        ids = self.eng.tokenize(text, add_special=add_special)
        return {"token_ids": ids, "n_tokens": len(ids)}

    def op_detokenize(self, token_ids: list) -> dict:
        return {"text": self.eng.detokenize(token_ids)}

    def op_generate(self, state: Any, save_state: Any, **kw: Any) -> dict:
        self._check_save(save_state)
        res = self.eng.generate(**kw, state=self._state(state),
                                keep_state=save_state is not None)
        return {**res.to_dict(), **self._save(save_state, res.state)}

    def op_system1(self, state: Any, save_state: Any, **kw: Any) -> dict:
        self._check_save(save_state)
        res = self.eng.system1(**kw, state=self._state(state), keep_state=save_state is not None)
        return {**res.to_dict(), **self._save(save_state, res.state)}

    def op_free_state(self, slot: str) -> dict:
        return {"freed": self.slots.pop(slot, None) is not None}

    def op_shutdown(self) -> dict:
        self.shutdown = True
        return {"shutting_down": True}

    def _state(self, where: Any) -> Any:
        if where is None or isinstance(where, str):
            return where  # a file path: the engine reads and checks it
        saved = self.slots.get(where["slot"])
        if saved is None:
            raise RequestError("no_such_slot", f"no state in slot {where['slot']!r}")
        return saved

    def _save(self, where: Any, saved: Any) -> dict:
        if where is None:
            return {}
        if isinstance(where, str):
            n = self.eng.export_state(saved, where)
            return {"saved_state": {"file": where, "bytes": n, "n_tokens": saved.n_tokens,
                                    "n_pending": len(saved.pending)}}
        self.slots[where["slot"]] = saved
        return {"saved_state": {"slot": where["slot"], "n_tokens": saved.n_tokens,
                                "n_pending": len(saved.pending)}}


    def _check_save(self, where: Any) -> None:
        """A ``save_state`` that could not be kept is refused before the job runs, since its
        result would be lost with it: a file that cannot be written (as the CLI refuses
        ``--export-kv``), a slot when the other slots already hold the server's limit."""
        if isinstance(where, str):
            from . import statefile

            try:  # a NUL or a lone surrogate in the path included
                statefile.check_target(where)
            except ReflexError as e:
                raise ParamError(str(e)) from None
        elif where is not None:
            held = self.slot_bytes(but=where["slot"])
            if held >= self.slot_limit:
                mib = 1 << 20
                raise RequestError(
                    "failed", f"the kept states hold {held / mib:.1f} MiB, the server's limit is "
                    f"{self.slot_limit / mib:.0f} MiB (--slot-memory): free_state a slot first")


def handle_line(handler: Handler, line: bytes | TooLong) -> dict:
    """The reply object to one request line (never raises for bad input)."""
    req_id: Any = None
    try:
        req_id, op, params = parse_request(line)
        return {"id": req_id, "result": handler(op, params)}
    except RequestError as e:
        return {"id": getattr(e, "req_id", req_id),
                "error": {"code": e.code, "message": str(e)}}
    except ReflexError as e:
        code = "invalid_params" if isinstance(e, ParamError) else "failed"
        return {"id": req_id, "error": {"code": code, "message": str(e).splitlines()[0]}}
    except Exception as e:  # noqa: BLE001 - the server outlives a bug in one request
        msg = str(e).splitlines()[0] if str(e) else ""
        return {"id": req_id, "error": {"code": "internal",
                                        "message": f"{type(e).__name__}: {msg}"}}


def encode_reply(reply: dict) -> bytes:
    try:
        text = json.dumps(reply, ensure_ascii=False)
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate from the request's id: escape it
        return json.dumps(reply).encode("ascii") + b"\n"


def _write_all(fd_write: Callable[[memoryview], int], data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[fd_write(view):]


def serve(handler: Handler, read: Callable[[int], bytes], write: Callable[[memoryview], int],
          wait: Callable[[], None], sig: Signals) -> bool:
    """Answer every line of one input until its end. Returns False when the peer can no
    longer be written to. Stop (a signal while waiting) propagates."""
    for line in LineReader(read, wait).lines():
        reply = encode_reply(handle_line(handler, line))
        try:
            _write_all(write, reply)
        except (BrokenPipeError, ConnectionResetError):
            return False
        if sig.code:
            raise Stop(sig.code)
        if handler.shutdown:
            return True
    return True


# ----------------------------------------------------------------------------------------------
# the two modes


def run_stdio(eng: Any, slot_limit: int) -> int:
    """Serve stdin -> stdout until the end of stdin (0), a signal (130/143) or ``shutdown``.
    Whatever else writes to stdout meanwhile (a library's print) goes to stderr instead: the
    protocol owns the descriptor."""
    sys.stdout.flush()
    out = os.dup(1)
    os.dup2(2, 1)
    handler = Handler(eng, slot_limit)
    with Signals() as sig:
        try:
            serve(handler, lambda n: os.read(0, n), lambda b: os.write(out, b),
                  lambda: sig.wait_readable(0), sig)
        except Stop as s:
            return s.code
        finally:
            os.close(out)
    return sig.code


def check_socket_path(path: str) -> None:
    """Refuse a path that is not ours to take: something that is not a socket, or a socket
    something listens on. A stale socket (nobody listening) is removed."""
    if not path:
        raise ReflexError("the socket path is empty; give a file path")
    if "\0" in path:
        raise ReflexError("the socket path holds a NUL byte")
    try:
        if len(os.fsencode(path)) > 107:
            raise ReflexError(f"{path}: a Unix socket path is at most 107 bytes")
    except UnicodeEncodeError:
        raise ReflexError(f"{path!r} is not valid text for a path") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ReflexError(f"{path}: {e.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ReflexError(f"{path} exists and is not a socket; give another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:  # stale: its server is gone
        os.unlink(path)
        return
    except OSError as e:
        raise ReflexError(f"{path}: cannot check the existing socket: {e.strerror}") from None
    finally:
        probe.close()
    raise ReflexError(f"{path}: another server is listening on this socket")


def bind_socket(path: str) -> socket.socket:
    """A listening socket at ``path``, created with mode 0600 (the umask is set around bind:
    no moment where another user could connect)."""
    check_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ReflexError(f"cannot create the socket {path}: {e.strerror}") from None
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


def run_uds(eng: Any, sock: socket.socket, path: str, slot_limit: int) -> int:
    """Serve one connection at a time until a signal (130/143) or ``shutdown`` (0); the socket
    file is removed at the end (if it is still ours)."""
    ident = os.stat(path)
    handler = Handler(eng, slot_limit)
    try:
        with Signals() as sig:
            while not handler.shutdown:
                try:
                    sig.wait_readable(sock.fileno())
                except Stop as s:
                    return s.code
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                with conn:
                    try:
                        serve(handler, lambda n: _recv(conn, n), conn.send,
                              lambda: sig.wait_readable(conn.fileno()), sig)
                    except Stop as s:
                        return s.code
                if sig.code:
                    return sig.code
            return 0
    finally:
        sock.close()
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == (ident.st_dev, ident.st_ino):
                os.unlink(path)
        except OSError:
            pass


def _recv(conn: socket.socket, n: int) -> bytes:
    try:
        return conn.recv(n)
    except ConnectionResetError:
        return b""
    except OSError as e:
        if e.errno in (errno.ECONNRESET, errno.ENOTCONN):
            return b""
        raise
