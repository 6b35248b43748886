"""Ctrl-C (SIGINT) and SIGTERM at any point of a ``reflex`` command: at most one line on stderr,
exit status 130 / 143 (reflex_core.lifecycle.handle_signals).

The finding: Ctrl-C in the ~0.9 s after the output printed a KeyboardInterrupt traceback (29 of
30 trials); a Ctrl-C during the imports at start did too, and SIGTERM killed the process without
a word (status -15). Here the signal is sent at controlled points: a harness runs the real
console entry point (``reflex_core._launch.main``) with a hook that, at the chosen point,
creates a marker file and then keeps the process busy there (sleeping, or running the CPU
forward pass again and again) for at most a minute; the test waits for the marker, sends the
signal, and reads what the process printed and how it ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HARNESS = r"""
import os, sys, time

point, mark = sys.argv[1], sys.argv[2]
sys.argv = ["reflex", *sys.argv[3:]]
hold_s = float(os.environ.get("HOLD_S", "60"))


def reached():
    open(mark, "w").close()


def hold():  # until the signal ends the process; bounded, then carry on
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        time.sleep(0.01)


if point == "import":  # the console script is importing the CLI (click)
    class Hold:
        def find_spec(self, name, path=None, target=None):
            if name == "click":
                sys.meta_path.remove(self)
                reached()
                hold()
            return None

    sys.meta_path.insert(0, Hold())
elif point == "generate":  # the CPU backend is running forward passes
    from reflex_core import engine

    real_generate = engine.generate

    def generate(lm, *a, **k):
        real_forward = lm.model.forward
        calls = [0]

        def forward(*fa, **fk):
            calls[0] += 1
            if calls[0] == 1:  # the prompt's forward: keep it busy
                reached()
                deadline = time.monotonic() + hold_s
                while time.monotonic() < deadline:
                    real_forward(*fa, **fk)
            return real_forward(*fa, **fk)

        lm.model.forward = forward
        return real_generate(lm, *a, **k)

    engine.generate = generate
elif point == "after-output":  # lifecycle.finish: the output is flushed, the exit is next
    from reflex_core import lifecycle

    real_argv = lifecycle.index_helper_argv

    def index_helper_argv():
        reached()
        hold()
        return real_argv()

    lifecycle.index_helper_argv = index_helper_argv

from reflex_core._launch import main

main()
"""

def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


EXPECTED = {signal.SIGINT: ("error: interrupted\n", 130),
            signal.SIGTERM: ("error: terminated\n", 143)}


@pytest.fixture(scope="module")
def tiny(model_files) -> Path:
    from reflex_core.testing.modelwriter import ModelShape

    return model_files(ModelShape(n_layer=1), tokenizer="qwen3")


@pytest.fixture
def run_until(tmp_path):
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)

    def run(point: str, sig, *args: str, env: dict | None = None, **popen):
        """Start the harness, wait until it reached ``point``, send ``sig`` (a signal, None,
        or "both": SIGINT then SIGTERM at once); (rc, out, err)."""
        mark = tmp_path / f"reached-{point}"
        e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), **(env or {}))
        # as a command started from a terminal: a test run from a background job (CI under
        # nohup / setsid) would hand down SIGINT ignored, which reflex rightly leaves ignored
        popen.setdefault("preexec_fn", _default_signals)
        p = subprocess.Popen([sys.executable, str(script), point, str(mark), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                             **popen)
        try:
            deadline = time.monotonic() + 120
            while not mark.exists():
                assert p.poll() is None, f"ended before {point}: {p.communicate()}"
                assert time.monotonic() < deadline, f"never reached {point}"
                time.sleep(0.01)
            for s in [signal.SIGINT, signal.SIGTERM] if sig == "both" else [sig] if sig else []:
                p.send_signal(s)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        return p.returncode, out, err

    return run


def generate_args(model: Path) -> list[str]:
    return ["generate", str(model), "The capital of France is", "-n", "4", "--backend", "cpu"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", ["import", "generate", "after-output"])
def test_a_signal_at_any_point_prints_one_line_and_exits_130_or_143(run_until, tiny, point, sig):
    rc, out, err = run_until(point, sig, *generate_args(tiny))
    line, code = EXPECTED[sig]
    assert (rc, err) == (code, line), (out, err)
    if point == "import":
        assert out == ""
    if point == "after-output":  # the command's output is complete
        assert out.splitlines()[-1].startswith("REFLEX_GENERATE_OK"), out


def test_the_signal_handlers_leave_the_output_of_a_normal_run_alone(run_until, tiny):
    rc, out, err = run_until("after-output", None, *generate_args(tiny), env={"HOLD_S": "0"})
    assert rc == 0 and err == "" and "REFLEX_GENERATE_OK" in out, err


def test_a_sigint_ignored_by_whoever_started_us_stays_ignored(run_until, tiny):
    """``nohup``, or a background job of a script, starts us with SIGINT ignored: a Ctrl-C
    meant for the foreground does not end us."""
    def ignore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    rc, out, err = run_until("after-output", signal.SIGINT, *generate_args(tiny),
                             env={"HOLD_S": "1"}, preexec_fn=ignore_sigint)
    assert rc == 0 and err == "" and "REFLEX_GENERATE_OK" in out, err


def test_two_signals_at_once_still_print_one_line(run_until, tiny):
    rc, out, err = run_until("generate", "both", *generate_args(tiny))
    assert (err, rc) in [EXPECTED[signal.SIGINT], EXPECTED[signal.SIGTERM]], (rc, err)
