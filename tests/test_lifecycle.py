"""How a reflex process ends (reflex_core.lifecycle): exit status, and what is left running.

The real fork/exec and spawn paths run in fresh processes: a small script ends through
``lifecycle.finish`` with a CUDA context faked as live (or not), a GGUF index faked as pending,
and ``sys.executable`` pointed at a stub shell script, so the "index helper" that gets started
is the stub, which writes down how it was started: its arguments, its stdio, its session, which
descriptors it inherited, and whether the process that started it had already exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from reflex_core import lifecycle

STUB = r"""#!/bin/sh
# Read our descriptors before any redirection below changes them.
fd0=$(readlink /proc/$$/fd/0); fd1=$(readlink /proc/$$/fd/1); fd2=$(readlink /proc/$$/fd/2)
stray=$(readlink /proc/$$/fd/$STRAY_FD)  # empty, or whatever the shell opened there
sigign=$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status)  # hex masks, bit n-1: signal n
sigblk=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/$$/status)
set -- "$@" --end-of-args $(cat /proc/$$/stat)
args=""
while [ "$1" != --end-of-args ]; do args="$args $1"; shift; done
shift  # now $1.. = /proc/self/stat fields: pid comm state ppid pgrp session
{
  echo "args=$args"
  echo "stdio=$fd0 $fd1 $fd2"
  echo "stray=$stray"
  echo "sigign=$sigign"
  echo "sigblk=$sigblk"
  [ "$6" = "$$" ] && echo "session=own" || echo "session=inherited"
  [ -e "$PARENT_DONE" ] && echo "parent_done=yes" || echo "parent_done=no"
} > "$STUB_OUT.tmp"
mv "$STUB_OUT.tmp" "$STUB_OUT"
"""

SCRIPT = r"""
import atexit, os, sys, time, types
from reflex_core import lifecycle

tmp = sys.argv[1]
live, how = sys.argv[2] == "live", sys.argv[3]
# A GGUF index pending for model.gguf (relative: the helper must get it absolute)
idx = types.ModuleType("reflex_core.gguf_index")
idx.pending_paths = lambda: ["model.gguf"]
sys.modules["reflex_core.gguf_index"] = idx
lifecycle._cuda_context_live = lambda: live
sys.executable = os.path.join(tmp, "stub-python")
# A descriptor that is not close-on-exec, like a driver's may be: the helper must not get it.
stray = os.open(os.path.join(tmp, "stray-file"), os.O_RDONLY)
os.set_inheritable(stray, True)
os.environ.update(STRAY_FD=str(stray), STUB_OUT=os.path.join(tmp, "stub-out"),
                  PARENT_DONE=os.path.join(tmp, "parent-done"))
atexit.register(lambda: open(os.path.join(tmp, "atexit-ran"), "w").close())
print("the command's output")
if how == "finish":
    lifecycle.finish(7)
# "wait": fork the child directly, then stay alive a while: the helper must start only after
assert lifecycle._fork_teardown_child(lifecycle.index_helper_argv())
sys.stdout.flush()
time.sleep(0.5)
open(os.environ["PARENT_DONE"], "w").close()
os._exit(0)
"""


@pytest.fixture
def run_script(tmp_path):
    stub = tmp_path / "stub-python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (tmp_path / "stray-file").write_text("")
    script = tmp_path / "end.py"
    script.write_text(SCRIPT)

    def run(live: bool, how: str = "finish", env: dict | None = None):
        e = dict(os.environ, **(env or {}))
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, str(script), str(tmp_path),
                            "live" if live else "none", how],
                           capture_output=True, text=True, cwd=tmp_path, env=e, timeout=60)
        return p, time.monotonic() - t0

    return run


def stub_report(tmp_path: Path, timeout: float = 30.0) -> dict:
    out = tmp_path / "stub-out"
    deadline = time.monotonic() + timeout
    while not out.exists():
        assert time.monotonic() < deadline, "the index helper never ran"
        time.sleep(0.02)
    return dict(line.split("=", 1) for line in out.read_text().splitlines())


@pytest.mark.parametrize("live", [True, False], ids=["cuda-live-fork-exec", "no-cuda-spawn"])
def test_finish_exits_with_the_code_and_leaves_the_index_to_a_detached_helper(
        tmp_path, run_script, live):
    p, _ = run_script(live)
    # our exit status and output, and the pipes closed: nothing left holding them
    assert p.returncode == 7, p.stderr
    assert p.stdout == "the command's output\n" and p.stderr == ""
    r = stub_report(tmp_path)
    assert r["args"] == f" -m reflex_core.gguf_index {tmp_path / 'model.gguf'}"
    assert r["stdio"] == "/dev/null /dev/null /dev/null"
    assert not r["stray"].endswith("stray-file")  # closed before the exec
    assert r["session"] == "own"
    assert not (tmp_path / "atexit-ran").exists()  # neither process ran the interpreter's exit
    # No signal left blocked (the fork blocks them across itself); the fork child ignores
    # SIGINT from before its setsid on, and the helper it execs inherits that (the spawned
    # helper is in a session of its own from its start: no Ctrl-C of the caller reaches it).
    assert int(r["sigblk"], 16) == 0
    if live:
        assert int(r["sigign"], 16) & (1 << (signal.SIGINT - 1))


def test_fork_child_execs_only_after_the_parent_exited(tmp_path, run_script):
    p, wall = run_script(True, how="wait")
    assert p.returncode == 0, p.stderr
    r = stub_report(tmp_path)
    # the parent slept 0.5 s after the fork, then wrote parent-done, then exited
    assert r["parent_done"] == "yes"
    assert r["stdio"] == "/dev/null /dev/null /dev/null"
    assert not r["stray"].endswith("stray-file")


# ----------------------------------------------------------------------------------------------
# which way finish() goes


class Exited(Exception):
    pass


@pytest.fixture
def calls(monkeypatch):
    """finish() with the fork, the spawn and os._exit replaced by recorders."""
    rec: dict = {"fork": [], "spawn": []}
    fork_ok = {"value": True}

    def fake_fork(helper):
        rec["fork"].append(helper)
        return fork_ok["value"]

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(lifecycle, "_fork_teardown_child", fake_fork)
    monkeypatch.setattr(lifecycle, "_spawn_detached", lambda argv: rec["spawn"].append(argv))
    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.delenv("REFLEX_DETACHED_EXIT", raising=False)
    rec["fork_ok"] = fork_ok
    return rec


def finish_code(code: int) -> int:
    with pytest.raises(Exited) as e:
        lifecycle.finish(code)
    return e.value.args[0]


HELPER = [sys.executable, "-m", "reflex_core.gguf_index", "/m.gguf"]


@pytest.mark.parametrize("live, env, fork_ok, helper, fork, spawn", [
    # a CUDA context: the fork child does the teardown and runs the helper (or nothing)
    (True, None, True, HELPER, [HELPER], []),
    (True, None, True, None, [None], []),
    # ... unless turned off or the fork fails: then the helper is spawned
    (True, "0", True, HELPER, [], [HELPER]),
    (True, "0", True, None, [], []),
    (True, None, False, HELPER, [HELPER], [HELPER]),
    # no CUDA context: no fork, the helper is spawned when an index is pending
    (False, None, True, HELPER, [], [HELPER]),
    (False, None, True, None, [], []),
])
def test_finish_chooses(monkeypatch, calls, live, env, fork_ok, helper, fork, spawn):
    monkeypatch.setattr(lifecycle, "_cuda_context_live", lambda: live)
    monkeypatch.setattr(lifecycle, "index_helper_argv", lambda: helper)
    if env is not None:
        monkeypatch.setenv("REFLEX_DETACHED_EXIT", env)
    calls["fork_ok"]["value"] = fork_ok
    assert finish_code(3) == 3
    assert calls["fork"] == fork and calls["spawn"] == spawn


def test_index_helper_argv(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    idx = types.SimpleNamespace(pending_paths=lambda: ["a.gguf", "/abs/b.gguf"])
    monkeypatch.setitem(sys.modules, "reflex_core.gguf_index", idx)
    assert lifecycle.index_helper_argv() == [
        sys.executable, "-m", "reflex_core.gguf_index", str(tmp_path / "a.gguf"), "/abs/b.gguf"]
    # the index folder is made here, before we exit (the helper creates no folder)
    assert (tmp_path / "xdg" / "reflex" / lifecycle.INDEX_CACHE).is_dir()
    idx.pending_paths = lambda: []
    assert lifecycle.index_helper_argv() is None
    monkeypatch.delitem(sys.modules, "reflex_core.gguf_index")
    assert lifecycle.index_helper_argv() is None  # never imported: no GGUF was opened


def test_no_index_helper_when_the_cache_is_refused(monkeypatch, tmp_path, capsys):
    from reflex_core import cachedir

    monkeypatch.setattr(cachedir, "_refused", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "reflex").mkdir(parents=True, mode=0o777)
    os.chmod(tmp_path / "xdg" / "reflex", 0o777)
    idx = types.SimpleNamespace(pending_paths=lambda: ["/abs/b.gguf"])
    monkeypatch.setitem(sys.modules, "reflex_core.gguf_index", idx)
    assert lifecycle.index_helper_argv() is None
    assert "notice: not using the cache directory" in capsys.readouterr().err
    assert os.listdir(tmp_path / "xdg" / "reflex") == []


def test_cuda_context_live_reads_the_cuda_start(monkeypatch):
    now = [None]
    start = types.SimpleNamespace(current=lambda: now[0])
    monkeypatch.setitem(sys.modules, "reflex_core.cuda.start", start)
    assert not lifecycle._cuda_context_live()
    now[0] = types.SimpleNamespace(succeeded=lambda: False)  # starting, or failed
    assert not lifecycle._cuda_context_live()
    now[0] = types.SimpleNamespace(succeeded=lambda: True)
    assert lifecycle._cuda_context_live()
    monkeypatch.delitem(sys.modules, "reflex_core.cuda.start")
    assert not lifecycle._cuda_context_live()


# ----------------------------------------------------------------------------------------------
# Nothing is written into a cache folder after the command returned (the finding: the detached
# index writer re-created a cache directory the caller deleted right after the command returned)

AFTER_SCRIPT = r"""
import os, sys
sys.executable = os.environ["STUB_PYTHON"]  # the index helper is started through the stub
sys.argv = ["reflex", *sys.argv[1:]]
from reflex_core._launch import main
main()
"""

HOLD_STUB = r"""#!/bin/sh
# The index helper, held until the test says go (bounded: 60 s), then run for real.
i=0
while [ ! -e "$GO" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
"$REAL_PYTHON" "$@"
touch "$DONE"
"""


@pytest.mark.parametrize("delete", [True, False],
                         ids=["cache-deleted", "control"])
def test_a_cache_deleted_after_the_command_returned_stays_deleted(tmp_path, model_files,
                                                                  delete):
    from reflex_core.testing.modelwriter import ModelShape

    model = model_files(ModelShape(n_layer=1), tokenizer="qwen3")
    stub = tmp_path / "stub-python"
    stub.write_text(HOLD_STUB)
    stub.chmod(0o755)
    (tmp_path / "after.py").write_text(AFTER_SCRIPT)
    xdg = tmp_path / "xdg"
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg), STUB_PYTHON=str(stub),
               REAL_PYTHON=sys.executable, GO=str(tmp_path / "go"), DONE=str(tmp_path / "done"))
    env.pop("REFLEX_NO_INDEX", None)
    p = subprocess.run([sys.executable, str(tmp_path / "after.py"), "generate", str(model), "Hi",
                        "-n", "1", "--backend", "cpu"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    if delete:
        import shutil

        shutil.rmtree(xdg / "reflex")  # the user clears the cache right after the command
    (tmp_path / "go").touch()
    deadline = time.monotonic() + 120
    while not (tmp_path / "done").exists():
        assert time.monotonic() < deadline, "the index helper never finished"
        time.sleep(0.05)
    if delete:
        assert not (xdg / "reflex").exists()
    else:  # the helper does write the index when its folder is there
        assert list((xdg / "reflex" / lifecycle.INDEX_CACHE).iterdir())
