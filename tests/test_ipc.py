"""``reflex stdio`` and ``reflex uds`` (reflex_core.ipc) driven from outside, in subprocesses, on
the CPU backend: every kind of bad input gets its error reply and the next request is served;
replies stay in order; oversized lines are dropped without being held; signals let the request
under way finish; the socket's creation rules; the example client of docs/ipc.md."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflex_core import ipc
from reflex_core.errors import ReflexError
from reflex_core.testing.modelwriter import ModelShape

from test_cli import one_line_error, reflex

SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(model_files) -> str:
    return str(model_files(SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=3))


@pytest.fixture(scope="module")
def tiny_long(model_files) -> str:
    """The tiny model with room for a job of 1000 tokens."""
    shape = dataclasses.replace(SHAPE, context_length=1024)
    return str(model_files(shape, weight_type="Q8_0", tokenizer="qwen3", seed=3))


def _default_signals() -> None:
    # as a server started from a terminal or a supervisor: a test run from a background job
    # (CI under nohup / setsid) would hand down SIGINT ignored, which reflex leaves ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "reflex_core", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_default_signals)


def read_reply(stream, timeout: float = 60.0) -> dict:
    # read through the unbuffered stream under the reader: a buffered readline would pull
    # several replies into its buffer, and select() on the descriptor would then wait for
    # bytes that have already arrived
    raw = getattr(stream, "raw", stream)
    ready, _, _ = select.select([raw], [], [], timeout)
    assert ready, "no reply in time"
    line = raw.readline()
    assert line.endswith(b"\n"), line
    return json.loads(line)


def ask(proc: subprocess.Popen, line: bytes | dict) -> dict:
    data = line if isinstance(line, bytes) else json.dumps(line).encode()
    proc.stdin.write(data + b"\n")
    proc.stdin.flush()
    return read_reply(proc.stdout)


def error_code(reply: dict, rid=None) -> str:
    assert reply["id"] == rid and "result" not in reply, reply
    assert set(reply["error"]) == {"code", "message"} and "\n" not in reply["error"]["message"]
    return reply["error"]["code"]


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


BAD = [  # (request line, id of the reply, error code)
    (b"{not json", None, "parse_error"),
    (b'{"id": 1, "op": "ping"', None, "parse_error"),
    (b"[1, 2]", None, "invalid_request"),
    (b'"ping"', None, "invalid_request"),
    (b'{"id": 7, "op": "ping\xff"}', None, "invalid_utf8"),
    (b'{"id": 8}', 8, "invalid_request"),
    (b'{"id": [1, {"a": null}], "op": "fly"}', [1, {"a": None}], "unknown_op"),
    (b'{"id": "g", "op": "generate"}', "g", "invalid_params"),
    (b'{"id": 9, "op": "generate", "prompt": 5}', 9, "invalid_params"),
    (b'{"id": 10, "op": "generate", "prompt": "a", "max_tokens": "3"}', 10, "invalid_params"),
    (b'{"id": 11, "op": "generate", "prompt": "a", "max_tokens": true}', 11, "invalid_params"),
    (b'{"id": 12, "op": "generate", "prompt": "a", "max_tokens": 0}', 12, "invalid_params"),
    (b'{"id": 13, "op": "generate", "prompt": "a", "temperature": -1}', 13, "invalid_params"),
    (b'{"id": 14, "op": "generate", "prompt": "a", "max_token": 3}', 14, "invalid_params"),
    (b'{"id": 15, "op": "system1", "prompt": "a", "candidates": " b"}', 15, "invalid_params"),
    (b'{"id": 16, "op": "system1", "prompt": "a", "candidates": []}', 16, "failed"),
    (b'{"id": 17, "op": "generate", "prompt": ""}', 17, "failed"),
    (b'{"id": 18, "op": "generate", "prompt": "a", "max_tokens": 100000}', 18, "failed"),
    (b'{"id": 19, "op": "generate", "prompt": "a", "state": {"slot": "none"}}', 19,
     "no_such_slot"),
    (b'{"id": 20, "op": "generate", "prompt": "a", "state": "/nonexistent/s.rxs"}', 20,
     "failed"),
    (b'{"id": 21, "op": "detokenize", "token_ids": [-1]}', 21, "invalid_params"),
    (b'{"id": 22, "op": "generate", "prompt": "a", "system": "be brief"}', 22,
     "invalid_params"),
    (b'{"id": 23, "op": "ping", "deep": ' + b"[" * 100000 + b"]" * 100000 + b"}", None,
     "parse_error"),
    # what no reply could echo as JSON: NaN/Infinity (not JSON) and numbers beyond the floats
    (b'{"id": NaN, "op": "ping"}', None, "parse_error"),
    (b'{"id": -Infinity, "op": "ping"}', None, "parse_error"),
    (b'{"id": 1e400, "op": "ping"}', None, "parse_error"),
    (b'{"id": 24, "op": "generate", "prompt": "a", "temperature": 1e999}', None, "parse_error"),
    # an integer past the float range where a number goes: the request's own error
    (b'{"id": 26, "op": "generate", "prompt": "a", "top_p": 1' + b"0" * 309 + b"}", 26,
     "invalid_params"),
    # paths no system call takes, and a save_state that cannot be written: refused before the
    # job runs
    (b'{"id": 25, "op": "generate", "prompt": "a", "state": "/tmp/a\\u0000b"}', 25,
     "invalid_params"),
    (b'{"id": 26, "op": "generate", "prompt": "a", "save_state": "/tmp/\\ud800"}', 26,
     "invalid_params"),
    (b'{"id": 27, "op": "generate", "prompt": "a", "save_state": "/nonexistent/s.rxs"}', 27,
     "invalid_params"),
    (b'{"id": 28, "op": "generate", "prompt": "a", "repeat_penalty": 1e-45}', 28,
     "invalid_params"),
]


def test_stdio_answers_every_bad_request_and_keeps_serving(tiny, tmp_path):
    p = start("stdio", tiny, "--backend", "cpu")
    try:
        assert ask(p, {"id": 0, "op": "ping"}) == {"id": 0, "result": {"pong": True}}
        for line, rid, code in BAD:
            assert error_code(ask(p, line), rid) == code, line[:80]
            assert ask(p, {"id": "after", "op": "ping"})["result"] == {"pong": True}
        # a line over the limit, streamed in: refused, and never held whole in memory
        before = vm_hwm_kib(p.pid)
        big = b'{"id": 1, "op": "tokenize", "text": "' + b"a" * (ipc.MAX_LINE + 4096)
        for _ in range(4):  # 4 x (16 MiB + 4 KiB): one line of ~64 MiB
            p.stdin.write(big)
        p.stdin.write(b'"}\n')
        p.stdin.flush()
        reply = read_reply(p.stdout)
        assert error_code(reply) == "too_large" and str(ipc.MAX_LINE) in reply["error"]["message"]
        assert vm_hwm_kib(p.pid) - before < 48 * 1024  # far below the line's 64 MiB
        # a line of exactly the limit is read
        line = json.dumps({"id": "edge", "op": "detokenize", "token_ids": []}).encode()
        line = line[:-1] + b', "pad": "' + b"x" * (ipc.MAX_LINE - len(line) - 11) + b'"}'
        assert len(line) == ipc.MAX_LINE
        assert error_code(ask(p, line), "edge") == "invalid_params"  # parsed: "pad" is unknown
        # several requests written at once come back in order
        batch = [{"id": i, "op": "tokenize", "text": "Hello" * i} for i in range(1, 6)]
        p.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in batch))
        p.stdin.flush()
        got = [read_reply(p.stdout) for _ in batch]
        assert [r["id"] for r in got] == [1, 2, 3, 4, 5]
        assert [r["result"] for r in got] == [ask(p, r)["result"] for r in batch]
        assert len({r["result"]["n_tokens"] for r in got}) > 1  # distinct answers, not one
        # the ops, and a state kept in a slot and in a file
        info = ask(p, {"id": "i", "op": "info"})["result"]
        assert info["arch"] == "qwen3" and info["backend"] == "cpu" and info["protocol"] == 1
        toks = ask(p, {"id": "t", "op": "tokenize", "text": "Hello"})["result"]
        assert toks == {"token_ids": [9707], "n_tokens": 1}
        assert ask(p, {"id": "d", "op": "detokenize", "token_ids": [9707]})["result"] == {
            "text": "Hello"}
        whole = ask(p, {"id": "w", "op": "generate", "prompt": "The capital of France is",
                        "max_tokens": 6})["result"]
        assert whole["n_tokens"] == len(whole["token_ids"]) == 6
        f = tmp_path / "pre.rxs"
        for save in ({"slot": "pre"}, str(f)):
            pre = ask(p, {"id": "s", "op": "system1", "prompt": "The capital of France is",
                          "candidates": [" Paris", " Rome"], "save_state": save})["result"]
            assert pre["saved_state"]["n_pending"] == 1 and pre["num_candidates"] == 2
            cont = ask(p, {"id": "c", "op": "generate", "prompt": "", "max_tokens": 6,
                           "state": save})["result"]
            assert cont["token_ids"] == whole["token_ids"]  # resumed = uninterrupted
        assert f.stat().st_size == pre["saved_state"]["bytes"]
        assert ask(p, {"id": "f", "op": "free_state", "slot": "pre"})["result"] == {
            "freed": True}
        assert error_code(ask(p, {"id": "g", "op": "generate", "prompt": "",
                                  "state": {"slot": "pre"}}), "g") == "no_such_slot"
        # chat: the prompt goes through the file's template first
        from reflex_core.chat import render_chat
        from reflex_core.modelfile import open_model_file

        rendered = render_chat(open_model_file(tiny), "Hi", system="Be brief.")
        chat = ask(p, {"id": "chat", "op": "generate", "prompt": "Hi", "chat": True,
                       "system": "Be brief.", "max_tokens": 2})["result"]
        assert chat["prompt_token_ids"] == ask(p, {"id": "t", "op": "tokenize", "text": rendered,
                                                   "add_special": False})["result"]["token_ids"]
        # the last line needs no newline; the end of input ends the server with 0
        p.stdin.write(b'{"id": "last", "op": "ping"}')
        p.stdin.close()
        assert read_reply(p.stdout) == {"id": "last", "result": {"pong": True}}
        assert p.wait(60) == 0
        assert p.stdout.read() == b""  # nothing but replies on stdout
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_stdio_signal_finishes_the_request_under_way(tiny_long, sig, code):
    p = start("stdio", tiny_long, "--backend", "cpu")
    try:
        assert ask(p, {"id": 0, "op": "ping"})["result"] == {"pong": True}
        # long enough on the CPU that the signal comes while it runs (250 tokens took 0.35 s:
        # too close to the signal's 0.3 s on a busy machine)
        req = {"id": "long", "op": "generate", "prompt": "Once upon a time", "max_tokens": 1000}
        t_send = time.monotonic()
        p.stdin.write(json.dumps(req).encode() + b"\n")
        p.stdin.write(b'{"id": "never", "op": "ping"}\n')  # read after the signal: not served
        p.stdin.flush()
        time.sleep(0.3)
        t_sig = time.monotonic()
        p.send_signal(sig)
        res = read_reply(p.stdout)["result"]
        assert res["n_tokens"] == 1000 or res["stop_reason"] == "eog"  # the whole job
        # it ran across the signal (the server was idle when the request was sent)
        assert res["compute_ms"] / 1e3 > t_sig - t_send + 0.05, res["compute_ms"]
        assert p.wait(60) == code
        assert p.stdout.read() == b""
    finally:
        p.kill()
        p.wait()


def test_stdio_signal_while_idle_exits_at_once(tiny):
    p = start("stdio", tiny, "--backend", "cpu")
    try:
        assert ask(p, {"id": 0, "op": "ping"})["result"] == {"pong": True}
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 143
    finally:
        p.kill()
        p.wait()


# ----------------------------------------------------------------------------------------------
# uds


def connect(path: str, timeout: float = 60.0) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sock_ask(s: socket.socket, line: bytes | dict) -> dict:
    data = line if isinstance(line, bytes) else json.dumps(line).encode()
    s.sendall(data + b"\n")
    return read_reply(s.makefile("rb"))


def test_uds_serves_connections_one_after_another(tiny, tmp_path):
    path = str(tmp_path / "r.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # a socket file nobody listens on: replaced
    stale.close()
    p = start("uds", tiny, path, "--backend", "cpu")
    try:
        a = connect(path)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        # a second server on a live socket is refused in one line, the first one untouched
        again = reflex("uds", tiny, path, "--backend", "cpu")
        assert "another server is listening" in one_line_error(again)
        b = connect(path)  # queued: served once a is done
        ra = a.makefile("rb")
        for line, rid, code in BAD[:8]:
            a.sendall(line + b"\n")
            assert error_code(read_reply(ra), rid) == code
        a.sendall(b'{"id": 1, "op": "ping"}\n')
        assert read_reply(ra) == {"id": 1, "result": {"pong": True}}
        # b is not served while a is open
        b.sendall(b'{"id": "b", "op": "ping"}\n')
        assert select.select([b], [], [], 0.5)[0] == []
        a.shutdown(socket.SHUT_WR)  # half-closed: replies still come
        assert ra.read() == b""
        a.close()
        assert read_reply(b.makefile("rb")) == {"id": "b", "result": {"pong": True}}
        # a client gone in the middle of a request, then one gone before its reply
        b.sendall(b'{"id": "half", "op": "gener')
        b.close()
        c = connect(path)
        c.sendall(b'{"id": "gone", "op": "generate", "prompt": "Hello", "max_tokens": 30}\n')
        c.close()
        d = connect(path)
        assert sock_ask(d, {"id": "d", "op": "ping"}) == {"id": "d", "result": {"pong": True}}
        r = sock_ask(d, {"id": "s1", "op": "system1", "prompt": "Hello",
                         "candidates": [" world", " there"]})
        assert r["result"]["num_candidates"] == 2 and r["result"]["compute_ms"] > 0
        d.close()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 143
        assert not os.path.exists(path)  # removed at the end
    finally:
        p.kill()
        p.wait()


def test_uds_signal_during_the_load_removes_the_socket(tiny, tmp_path):
    """The socket is bound before the load (a taken path fails at once); a signal that ends the
    server before it serves removes it too."""
    path = str(tmp_path / "s.sock")
    p = start("uds", tiny, path, "--backend", "cpu")
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert os.path.exists(path)
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 143
        assert not os.path.exists(path)
    finally:
        p.kill()
        p.wait()


def test_uds_refuses_an_empty_path(tiny):
    assert "socket path is empty" in one_line_error(reflex("uds", tiny, "", "--backend", "cpu"))


def test_uds_shutdown_request(tiny, tmp_path):
    path = str(tmp_path / "s.sock")
    p = start("uds", tiny, path, "--backend", "cpu")
    try:
        s = connect(path)
        assert sock_ask(s, {"id": 1, "op": "shutdown"})["result"] == {"shutting_down": True}
        assert p.wait(30) == 0
        assert not os.path.exists(path)
    finally:
        p.kill()
        p.wait()


def test_stdio_context_size(tiny):
    """-c as generate's: every request must fit it (info reports it)."""
    p = start("stdio", tiny, "--backend", "cpu", "-c", "8")
    try:
        assert ask(p, {"id": "i", "op": "info"})["result"]["ctx_size"] == 8
        prompt = "The capital of France is"  # 5 tokens
        assert ask(p, {"id": 1, "op": "generate", "prompt": prompt,
                       "max_tokens": 3})["result"]["n_tokens"] == 3
        reply = ask(p, {"id": 2, "op": "generate", "prompt": prompt, "max_tokens": 4})
        assert "exceeds the context size (-c) (8 tokens)" in reply["error"]["message"]
        reply = ask(p, {"id": 3, "op": "system1", "prompt": prompt,
                        "candidates": [" a b c d"]})
        assert "exceed the context size (8 tokens)" in reply["error"]["message"]
    finally:
        p.kill()
        p.wait()


def test_kept_states_are_bounded(tiny, tmp_path):
    """A request that would keep a state in a slot is refused before its job once the other
    slots hold --slot-memory; the state it keeps may pass the limit (its size is known only
    after the job, whose result is not thrown away), and replacing or freeing a slot makes
    room."""
    import reflex_core

    with reflex_core.load(tiny, backend="cpu") as eng:
        h = ipc.Handler(eng, 1)  # one byte: the first state kept passes it

        def save(slot: str) -> dict:
            return ipc.handle_line(h, json.dumps({
                "id": slot, "op": "generate", "prompt": "The capital of France is",
                "max_tokens": 2, "save_state": {"slot": slot}}).encode())

        first = save("a")["result"]["saved_state"]
        info = ipc.handle_line(h, b'{"id": 0, "op": "info"}')["result"]
        per_token = (info["slot_bytes"] - 1) // first["n_tokens"]  # the name's byte aside
        assert info["slot_limit_bytes"] == 1 and info["slots"] == ["a"] and per_token > 0
        refused = save("b")
        assert error_code(refused, "b") == "failed" and "--slot-memory" in \
            refused["error"]["message"]
        assert ipc.handle_line(h, b'{"id": 0, "op": "info"}')["result"]["slots"] == ["a"]
        assert save("a")["result"]["saved_state"] == first  # a slot replaced: its bytes go
        assert ipc.handle_line(h, b'{"id": 1, "op": "free_state", "slot": "a"}')["result"] == {
            "freed": True}
        assert save("b")["result"]["saved_state"] == {**first, "slot": "b"}
        # the names count: a long one fills the limit alone
        big = ipc.Handler(eng, 1 << 20)
        reply = ipc.handle_line(big, json.dumps({
            "id": "n", "op": "generate", "prompt": "Hi", "max_tokens": 1,
            "save_state": {"slot": "x" * (2 << 20)}}).encode())
        assert "saved_state" in reply["result"]
        assert ipc.handle_line(big, b'{"id": 0, "op": "info"}')["result"]["slot_bytes"] > 2 << 20
        assert error_code(ipc.handle_line(big, json.dumps({
            "id": "m", "op": "generate", "prompt": "Hi", "max_tokens": 1,
            "save_state": {"slot": "y"}}).encode()), "m") == "failed"
        # a state file is not a slot: the limit does not apply to it
        f = tmp_path / "s.rxs"
        kept = ipc.handle_line(h, json.dumps({
            "id": "f", "op": "generate", "prompt": "The capital of France is", "max_tokens": 2,
            "save_state": str(f)}).encode())["result"]["saved_state"]
        assert kept["bytes"] == f.stat().st_size > 0


def test_uds_refuses_a_path_that_is_not_a_socket(tiny, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep me")
    assert "is not a socket" in one_line_error(reflex("uds", tiny, str(f), "--backend", "cpu"))
    assert f.read_text() == "keep me"
    link = tmp_path / "link.sock"
    link.symlink_to(tmp_path / "elsewhere.sock")
    assert "is not a socket" in one_line_error(reflex("uds", tiny, str(link), "--backend",
                                                      "cpu"))
    long_path = str(tmp_path / ("x" * 120))
    assert "at most 107 bytes" in one_line_error(reflex("uds", tiny, long_path, "--backend",
                                                        "cpu"))


def test_socket_path_length_bound(tmp_path):
    """sun_path holds 108 bytes with its NUL: a path of 107 bytes is taken, of 108 refused."""
    base = str(tmp_path) + "/"
    assert len(base) < 100
    ipc.check_socket_path(base + "s" * (107 - len(base)))  # free: nothing there
    with pytest.raises(ReflexError, match="at most 107 bytes"):
        ipc.check_socket_path(base + "s" * (108 - len(base)))


def test_the_example_client_works_in_both_modes(tiny, tmp_path):
    client = str(ROOT / "examples" / "ipc_client.py")
    p = subprocess.run([sys.executable, client, "stdio", tiny, "--backend", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    via_stdio = p.stdout.splitlines()
    assert len(via_stdio) == 2 and via_stdio[1] in (" 4", " 5")
    path = str(tmp_path / "e.sock")
    server = start("uds", tiny, path, "--backend", "cpu")
    try:
        connect(path).close()  # up
        p = subprocess.run([sys.executable, client, "uds", path], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines() == via_stdio  # greedy: the same answers
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_line_reader_bounds_and_edges():
    """The framing alone, with a tiny limit: a line over it is dropped as it streams in, lines
    split across reads are joined, a last line without newline counts, a blank line does not."""
    chunks = [b"ab", b"c\nxxxx", b"xxxxxx", b"xx\nde", b"f\n\n", b"tail"]

    def read(n):
        return chunks.pop(0) if chunks else b""

    got = list(ipc.LineReader(read, lambda: None, limit=5).lines())
    assert got[0] == b"abc"
    assert isinstance(got[1], ipc.TooLong) and got[1].n == 12
    assert got[2:] == [b"def", b"tail"]
