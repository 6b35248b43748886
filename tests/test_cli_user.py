"""The command line as a llama.cpp or Ollama user expects it (fresh processes, CPU backend):
prompt input, stop strings, context size, quiet output, --json errors, advice that works as
printed, the CPU backend's notice and progress, plugin filters, Ctrl-C and a model file that
changes under a running process."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflex_core.testing.modelwriter import ModelShape, write_model

from test_cli import SHAPE, one_line_error, reflex

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny(model_files) -> Path:
    return model_files(SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=3)


@pytest.fixture(scope="module")
def long_ctx(model_files) -> Path:
    """The tiny model with a context long enough that -n -1 runs until it is stopped."""
    shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96,
                       context_length=100_000)
    return model_files(shape, weight_type="Q8_0", tokenizer="qwen3", seed=3)


def gen_json(*args: str) -> dict:
    p = reflex("generate", *args, "--backend", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# --- advice that works as printed ---------------------------------------------------------------

def test_gpu_only_commands_do_not_advise_a_flag_they_lack(tiny):
    """CI has no GPU: smoke and check refuse with advice they accept (no --backend)."""
    for args in (["smoke"], ["check", str(tiny)]):
        p = reflex(*args)
        if p.returncode == 0:  # a GPU machine: nothing to advise
            continue
        line = one_line_error(p)
        assert "--backend" not in line and "needs an NVIDIA GPU" in line, line
        q = reflex(*args, "--backend", "cpu")  # and indeed they do not take it
        assert q.returncode == 2 and "No such option '--backend'" in q.stderr


def test_bench_cold_falls_back_to_the_cpu_like_generate(tiny, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    p = reflex("bench", str(tiny), "--cold", "-r", "1", "--json", env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["n_ok"] == 1
    if res["command"][-3] == "cpu":  # no GPU here ("--backend", "cpu", "--", PROMPT)
        assert p.stderr.startswith("notice: no usable GPU") and "timing the CPU" in p.stderr
        # the warm bench says it too, as generate does
        w = reflex("bench", str(tiny), "-r", "1", "--decode", "1", env=env, timeout=300)
        assert w.returncode == 0 and "no usable GPU" in w.stderr, w.stderr


# --- output streams -------------------------------------------------------------------------------

def test_quiet_prints_only_the_text(tiny):
    want = gen_json(str(tiny), PROMPT, "-n", "8")["text"]
    p = reflex("generate", str(tiny), PROMPT, "-n", "8", "-q")  # auto: falls back with a notice
    assert p.returncode == 0, p.stderr
    assert p.stdout == want  # not a terminal: the text exactly, no newline, no status line
    assert p.stderr == ""  # no notice either
    p = reflex("system1", str(tiny), PROMPT, "-c", " Paris", "-c", " Rome", "-q",
               "--backend", "cpu")
    best = json.loads(reflex("system1", str(tiny), PROMPT, "-c", " Paris", "-c", " Rome",
                             "--json", "--backend", "cpu").stdout)["best_text"]
    assert p.returncode == 0 and p.stdout == best + "\n"


def test_without_quiet_the_status_line_stays_on_stdout(tiny):
    p = reflex("generate", str(tiny), PROMPT, "-n", "2", "--backend", "cpu")
    assert p.returncode == 0 and p.stdout.splitlines()[-1].startswith("REFLEX_GENERATE_OK ")


@pytest.mark.parametrize("args, kind, code", [
    (["generate", "/nonexistent/m.gguf", "hi"], "GGUFError", 1),
    (["generate", "TINY", "hi", "-n", "0"], "usage", 2),
    (["system1", "TINY", "hi"], "ReflexError", 1),
    (["generate", "TINY", "hi", "-c", "3", "-n", "8"], "ReflexError", 1),
])
def test_json_errors_are_one_object_on_stdout_with_the_same_exit_code(tiny, args, kind, code):
    args = [str(tiny) if a == "TINY" else a for a in args]
    p = reflex(*args, "--json", "--backend", "cpu")
    assert p.returncode == code, p.stderr
    err = json.loads(p.stdout)["error"]  # one JSON object, nothing else on stdout
    assert err["type"] == kind and err["exit_code"] == code and err["message"]
    assert "\n" not in err["message"]
    assert p.stderr.strip().splitlines()[-1].startswith(("error: ", "Error: "))


# --- prompt input -----------------------------------------------------------------------------------

def test_every_way_of_giving_the_prompt_is_the_same_prompt(tiny, tmp_path):
    want = gen_json(str(tiny), PROMPT, "-n", "4")
    f = tmp_path / "p.txt"
    f.write_text(PROMPT + "\n")
    for args, stdin in ((["-p", PROMPT], None), (["-f", str(f)], None), (["-"], PROMPT + "\n"),
                        (["-p", "-"], PROMPT), (["-f", "-"], PROMPT)):
        p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(tiny), *args,
                            "-n", "4", "--backend", "cpu", "--json"], input=stdin,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (args, p.stderr)
        got = json.loads(p.stdout)
        assert got["prompt_token_ids"] == want["prompt_token_ids"], args
        assert got["token_ids"] == want["token_ids"], args
    # -m names the local file (llama.cpp's spelling); the prompt is then the only positional
    assert gen_json("-m", str(tiny), PROMPT, "-n", "4")["token_ids"] == want["token_ids"]
    assert gen_json("-m", str(tiny), "-p", PROMPT, "-n", "4")["token_ids"] == want["token_ids"]


def test_output_is_utf8_whatever_the_stream_encoding(tiny):
    """A stdout in another encoding (here ASCII) still gets the text and the JSON, as UTF-8
    (it ended the job with an internal UnicodeEncodeError)."""
    enc = {"PYTHONIOENCODING": "ascii"}
    prompt = "Привет мир"  # its greedy text is CJK
    want = reflex("generate", str(tiny), prompt, "-n", "8", "-q", "--backend", "cpu")
    assert want.returncode == 0 and any(ord(c) > 127 for c in want.stdout), want
    for args in (("-q",), ()):
        p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(tiny), prompt,
                            "-n", "8", "--backend", "cpu", *args], capture_output=True,
                           env={**os.environ, **enc}, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode("utf-8").startswith(want.stdout)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "system1", str(tiny), prompt,
                        "-c", " 日本", "-c", " 語", "--json", "--backend", "cpu"],
                       capture_output=True, env={**os.environ, **enc}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.decode("utf-8"))["candidates"][0]["text"] == " 日本"


def test_a_prompt_that_begins_with_a_dash(tiny):
    for text in ('-"c" is a letter', "-5 degrees outside", "--color=auto makes ls colourful"):
        a = gen_json(str(tiny), text, "-n", "2")
        b = gen_json(str(tiny), "-p", text, "-n", "2")
        q = reflex("generate", str(tiny), "-n", "2", "--backend", "cpu", "--json", "--", text)
        c = json.loads(q.stdout)
        assert a["prompt_token_ids"] == b["prompt_token_ids"] == c["prompt_token_ids"]
    p = reflex("generate", str(tiny), "-hello", "--backend", "cpu")  # looks like an option
    assert p.returncode == 2
    assert "give it with -p TEXT, or after --" in p.stderr


def test_escapes_of_p_and_stop_as_llama_cpp(tiny, tmp_path):
    """-p TEXT and --stop TEXT process \\n, \\t, \\xHH... as llama.cpp's -p and -r do
    (--no-escape: as written); PROMPT (llama-simple's) and -f files are taken as written."""
    from reflex_core.cli import process_escapes

    assert process_escapes(r"a\nb\tc\\d\'e\"f\x41\x4g\qh\\") == "a\nb\tc\\d'e\"fA\\x4g\\qh\\"
    # \x's two characters as llama.cpp's strtol(.., 16) takes them: a leading space or sign
    # counts, a trailing one does not
    assert process_escapes(r"x\x 9y|\x+9|\x-1|\x9 |\x -|\x") == "x\ty|\t|\ufffd|\\x9 |\\x -|\\x"
    real = gen_json(str(tiny), "Q: hi\nA:", "-n", "1")["prompt_token_ids"]
    escaped = gen_json(str(tiny), "-p", r"Q: hi\nA:", "-n", "1")["prompt_token_ids"]
    literal = gen_json(str(tiny), r"Q: hi\nA:", "-n", "1")["prompt_token_ids"]
    f = tmp_path / "p.txt"
    f.write_text(r"Q: hi\nA:")
    assert escaped == real != literal
    assert gen_json(str(tiny), "-p", r"Q: hi\nA:", "--no-escape", "-n", "1")[
        "prompt_token_ids"] == literal == gen_json(str(tiny), "-f", str(f), "-n", "1")[
        "prompt_token_ids"]
    whole = gen_json(str(tiny), PROMPT, "-n", "12")["text"]
    stop = whole.split()[2]
    assert stop[0].isascii()  # one \xHH byte spells it
    cut = gen_json(str(tiny), PROMPT, "-n", "12", "--stop", stop.replace(stop[0], "\\x%02x"
                                                                         % ord(stop[0]), 1))
    assert cut["stop_reason"] == "stop" and cut["text"] == whole[:whole.index(stop)]


def test_nan_and_inf_are_usage_errors(tiny):
    for opt in ("--temp", "--top-p", "--min-p", "--repeat-penalty"):
        for v in ("nan", "inf"):
            p = reflex("generate", str(tiny), "hi", opt, v, "--backend", "cpu")
            assert p.returncode == 2 and "is not" in p.stderr and "Traceback" not in p.stderr


def test_stop_strings(tiny):
    whole = gen_json(str(tiny), PROMPT, "-n", "12")
    words = whole["text"].split()
    assert len(words) >= 3, whole["text"]
    stop = words[2]
    cut = gen_json(str(tiny), PROMPT, "-n", "12", "--stop", stop, "--stop", "never-seen")
    assert cut["stop_reason"] == "stop"
    assert cut["text"] == whole["text"][:whole["text"].index(stop)]
    assert stop not in cut["text"]


def test_context_size_error_and_truncation(tiny):
    full = gen_json(str(tiny), PROMPT, "-n", "3")
    n = full["n_prompt_tokens"]
    line = one_line_error(reflex("generate", str(tiny), PROMPT, "-n", "3", "-c", str(n + 2),
                                 "--backend", "cpu"))
    assert f"prompt ({n} tokens) + 3 new tokens exceeds the context size (-c) ({n + 2} " \
           "tokens); shorten the prompt or give --truncate" in line
    p = reflex("generate", str(tiny), PROMPT, "-n", "3", "-c", str(n + 1), "--truncate",
               "--backend", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    cut = json.loads(p.stdout)
    assert cut["prompt_token_ids"] == full["prompt_token_ids"][2:]  # the oldest 2 dropped
    assert "was cut to its last" in p.stderr
    # past the model's context length, as llama.cpp: a notice, and the job runs past it
    n_new = 256 - n + 8
    p = reflex("generate", str(tiny), PROMPT, "-n", str(n_new), "-c", "300", "--backend", "cpu",
               "--json")
    assert p.returncode == 0, p.stderr
    past = json.loads(p.stdout)
    assert "notice: -c 300 is larger than the model's context length (256 tokens)" in p.stderr
    assert past["n_prompt_tokens"] + past["n_tokens"] == 256 + 8  # greedy: no end token here
    line = one_line_error(reflex("generate", str(tiny), PROMPT, "-n", "300", "--backend", "cpu"))
    assert f"prompt ({n} tokens) + 300 new tokens exceeds the model's context length (256 " \
           "tokens); ask for fewer new tokens (-n) or a larger context (-c)" in line
    # the advice works as printed: --truncate could not make room, a larger -c does
    assert "--truncate" not in line
    p = reflex("generate", str(tiny), PROMPT, "-n", "300", "-c", str(n + 300), "--backend",
               "cpu", "--json")
    assert p.returncode == 0, p.stderr
    # system1's --ctx-size (its -c is --candidate)
    line = one_line_error(reflex("system1", str(tiny), PROMPT, "-c", " a b", "--ctx-size",
                                 str(n), "--backend", "cpu"))
    assert f"exceed the context size ({n} tokens)" in line
    long = PROMPT * 60
    line = one_line_error(reflex("system1", str(tiny), long, "-c", " a", "--backend", "cpu"))
    assert "exceed the model's context length (256 tokens)" in line
    p = reflex("system1", str(tiny), long, "-c", " a", "--ctx-size", "400", "--backend", "cpu",
               "--json")
    assert p.returncode == 0, p.stderr
    assert "notice: --ctx-size 400 is larger than the model's context length" in p.stderr
    assert json.loads(p.stdout)["num_candidates"] == 1


def test_n_minus_one_runs_to_the_end_of_the_context(tiny):
    got = gen_json(str(tiny), PROMPT, "-n", "-1", "-c", "40")
    assert got["n_prompt_tokens"] + got["n_tokens"] == 40 or got["stop_reason"] == "eog"
    assert got["stop_reason"] in ("length", "eog")


def test_seed_minus_one_is_random_and_reported(tiny):
    a = gen_json(str(tiny), PROMPT, "-n", "4", "--temp", "1", "--seed", "-1")
    b = gen_json(str(tiny), PROMPT, "-n", "4", "--temp", "1")
    assert isinstance(a["seed"], int) and isinstance(b["seed"], int) and a["seed"] != b["seed"]
    again = gen_json(str(tiny), PROMPT, "-n", "4", "--temp", "1", "--seed", str(a["seed"]))
    assert again["token_ids"] == a["token_ids"]  # the reported seed reproduces the run


def test_min_p_and_repeat_penalty_flags(tiny):
    plain = gen_json(str(tiny), PROMPT, "-n", "16")
    assert len(set(plain["token_ids"])) < 16  # random weights repeat themselves
    pen = gen_json(str(tiny), PROMPT, "-n", "16", "--repeat-penalty", "5",
                   "--repeat-last-n", "-1")
    assert pen["token_ids"] != plain["token_ids"]
    # min-p 1 keeps only the most likely token: sampling becomes greedy
    mp = gen_json(str(tiny), PROMPT, "-n", "16", "--temp", "1", "--min-p", "1", "--seed", "5")
    assert mp["token_ids"] == plain["token_ids"]
    p = reflex("generate", str(tiny), PROMPT, "--min-p", "1.5", "--backend", "cpu")
    assert p.returncode == 2 and "--min-p" in p.stderr


# --- the CPU backend says what it is ----------------------------------------------------------------

def test_the_cpu_backend_estimates_its_cost_once_for_a_big_file(tmp_path):
    # ~100 M weights (the Qwen3 vocabulary x 640): beyond the few seconds worth a notice
    shape = ModelShape(n_layer=1, n_embd=640, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)
    path = write_model(tmp_path / "big.gguf", shape, weight_type="Q8_0", tokenizer="qwen3")
    p = reflex("generate", str(path), "Hi", "-n", "0", "--export-kv", str(tmp_path / "s"),
               "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if "NumPy reference path" in ln]
    assert len(notes) == 1 and "0.10 G weights" in notes[0], p.stderr
    assert "s to the first token" in notes[0] and "GiB of memory" in notes[0]


def test_a_long_prefill_shows_progress_on_a_terminal(long_ctx):
    prompt = "word " * 700
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "reflex_core", "generate", str(long_ctx),
                              prompt, "-n", "2", "--backend", "cpu", "--json"],
                             stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        err = b""
        while True:
            r, _, _ = select.select([master], [], [], 120)
            if not r:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
        out, _ = p.communicate(timeout=120)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert b"prefill: 256/" in err and b"prefill: 512/" in err, err
    chunked = json.loads(out)
    piped = gen_json(str(long_ctx), prompt, "-n", "2")  # no terminal: one batch, no progress
    assert chunked["prompt_token_ids"] == piped["prompt_token_ids"]
    assert chunked["token_ids"] == piped["token_ids"]


# --- plugin filters -------------------------------------------------------------------------------

def test_disabling_a_plugin_by_architecture_name_says_so(tiny):
    line = one_line_error(reflex("generate", str(tiny), "hi", "--backend", "cpu",
                                 env={"REFLEX_DISABLE_PLUGINS": "qwen3"}))
    assert "installed but not loaded" in line and "REFLEX_DISABLE_PLUGINS='qwen3'" in line
    assert "pip install" not in line


# --- signals and a file that changes ----------------------------------------------------------------

def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_exits_130_after_what_was_generated(long_ctx, as_json):
    args = [sys.executable, "-m", "reflex_core", "generate", str(long_ctx), PROMPT, "-n", "-1",
            "--backend", "cpu"] + (["--json"] if as_json else [])
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_default_signals)
    if as_json:
        time.sleep(3)
    else:  # wait until text is streaming
        assert select.select([p.stdout], [], [], 60)[0]
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"
    if as_json:
        assert json.loads(out) == {"error": {"type": "interrupted", "message": "interrupted",
                                             "exit_code": 130}}
    else:
        assert len(out) > 0 and b"REFLEX_GENERATE_OK" not in out


def test_a_model_file_that_shrinks_under_a_running_process_is_one_line(tiny, tmp_path):
    """The server has the model mapped (the CPU backend reads the weights as it goes); the file
    is then cut short, as `cp new.gguf model.gguf` does first: one line, exit 1, no Bus error."""
    path = tmp_path / "m.gguf"
    shutil.copy(tiny, path)
    p = subprocess.Popen([sys.executable, "-m", "reflex_core", "stdio", str(path),
                          "--backend", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = p.stderr.readline()
        assert b"serving" in line, line
        os.truncate(path, 8192)
        p.stdin.write(json.dumps({"id": 1, "op": "generate", "prompt": PROMPT}).encode() + b"\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, (p.returncode, err)
    assert err.decode().strip().splitlines() == [
        f"error: model file changed while reading ({path})"]
    assert out == b""


def test_timings_promise_an_index_write_only_where_one_can_be_written(tiny, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # the cache root's parent is a file: nothing can be created there
    p = reflex("generate", str(tiny), "hi", "-n", "1", "--backend", "cpu", "--timings",
               env={"XDG_CACHE_HOME": str(blocked / "cache"), "REFLEX_INDEX_DIR": ""})
    assert p.returncode == 0, p.stderr
    note = [ln for ln in p.stderr.splitlines() if "gguf index:" in ln]
    assert len(note) == 1 and "none is written: the user cache is not writable" in note[0], note
    q = reflex("generate", str(tiny), "hi", "-n", "1", "--backend", "cpu", "--timings",
               env={"XDG_CACHE_HOME": str(tmp_path / "ok"), "REFLEX_INDEX_DIR": ""})
    assert "the user cache's is written at exit" in q.stderr
