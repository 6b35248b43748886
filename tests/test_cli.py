"""The command line as a user meets it: fresh processes, stdout/stderr contract, exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reflex_core.testing.modelwriter import ModelShape, write_model

SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)


def reflex(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "reflex_core", *args], capture_output=True,
                          text=True, env=e, timeout=timeout)


def one_line_error(p: subprocess.CompletedProcess, code: int = 1) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def wait_for_files(folder: Path, pattern: str, timeout: float = 60.0) -> list[Path]:
    """The files matching ``pattern`` in ``folder`` once there are some (or [] after
    ``timeout`` seconds): what a process leaves to a detached helper appears after its exit."""
    deadline = time.monotonic() + timeout
    while not (found := list(folder.glob(pattern))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny qwen3 model with the real Qwen3 tokenizer."""
    return write_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", SHAPE, weight_type="Q8_0",
                       tokenizer="qwen3", seed=3)


def test_generate_streams_text_then_status_line(tiny):
    p = reflex("generate", str(tiny), "The capital of France is", "-n", "6", "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.rstrip("\n").split("\n")
    m = re.fullmatch(r"REFLEX_GENERATE_OK process_start_to_first_token_ms=(\d+\.\d+) "
                     r"n_prompt_tokens=(\d+) n_tokens=(\d+) backend=\"cpu\"", lines[-1])
    assert m, lines[-1]
    assert float(m.group(1)) > 0 and int(m.group(2)) == 5 and 1 <= int(m.group(3)) <= 6


def test_generate_json_matches_text_mode(tiny):
    p = reflex("generate", str(tiny), "Hello", "-n", "5", "--backend", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and d["n_tokens"] == len(d["token_ids"]) <= 5
    assert d["prompt_token_ids"] == [9707]  # "Hello" in Qwen3
    t = reflex("generate", str(tiny), "Hello", "-n", "5", "--backend", "cpu")
    text = t.stdout.rsplit("REFLEX_GENERATE_OK", 1)[0]
    assert text == d["text"] + "\n"


def test_sampling_is_reproducible_with_a_seed(tiny):
    args = ["generate", str(tiny), "Once upon a time", "-n", "8", "--backend", "cpu", "--json",
            "--temp", "1.5", "--top-k", "40", "--top-p", "0.95"]
    a = json.loads(reflex(*args, "--seed", "7").stdout)
    b = json.loads(reflex(*args, "--seed", "7").stdout)
    assert a["token_ids"] == b["token_ids"] and a["seed"] == 7


def test_timings_name_each_phase(tiny):
    p = reflex("generate", str(tiny), "Hi", "-n", "2", "--backend", "cpu", "--timings")
    assert p.returncode == 0, p.stderr
    for phase in ("interpreter start to main", "parse gguf", "tokenizer", "weights to backend",
                  "first forward", "gguf index:"):
        assert phase in p.stderr, p.stderr
    # the total is the status line's number
    total = re.search(r"total: first token\s+0\.0 \|\s+([0-9.]+)", p.stderr)
    status = re.search(r"process_start_to_first_token_ms=([0-9.]+)", p.stdout)
    assert total and status, p.stderr
    assert abs(float(total.group(1)) - float(status.group(1))) < 0.11


def test_missing_file(tmp_path):
    line = one_line_error(reflex("generate", str(tmp_path / "nope.gguf"), "hi"))
    assert line.startswith("error: ") and "nope.gguf" in line


def test_not_a_gguf(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("just some text, certainly not a model\n" * 10)
    line = one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))
    assert "notes.txt" in line and "GGUF" in line


def test_truncated_and_corrupt_gguf(tmp_path, tiny):
    data = tiny.read_bytes()
    for i, cut in enumerate((10, 200, len(data) // 3, len(data) - 5)):
        f = tmp_path / f"cut{i}.gguf"
        f.write_bytes(data[:cut])
        line = one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))
        assert f"cut{i}.gguf" in line
    bad = bytearray(data)
    bad[8:16] = (2**62).to_bytes(8, "little")  # absurd tensor count
    f = tmp_path / "corrupt.gguf"
    f.write_bytes(bytes(bad))
    one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))


def test_unsupported_architecture(tmp_path):
    import gguf

    f = tmp_path / "m9.gguf"
    w = gguf.GGUFWriter(str(f), "mamba9")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    line = one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))
    assert "'mamba9'" in line and "qwen3" in line and "install" in line


def test_unsupported_tensor_type(tmp_path):
    """A weight in a GGML type no backend computes with (Q8_K, an intermediate type): patch the
    type of blk.0.attn_q.weight in the tensor directory of a valid file (Q8_K is smaller than
    F32, so the data still lies inside the file)."""
    import struct

    src = write_model(tmp_path / "src.gguf", ModelShape(n_embd=256, n_ff=256, head_dim=64),
                      weight_type="F32", tokenizer="qwen3")
    data = bytearray(src.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == 0  # F32
    struct.pack_into("<I", data, type_at, 15)  # Q8_K
    f = tmp_path / "q8k.gguf"
    f.write_bytes(bytes(data))
    line = one_line_error(reflex("generate", str(f), "hi", "--backend", "cpu"))
    assert "Q8_K" in line and "blk.0.attn_q.weight" in line


def test_empty_prompt(tiny):
    line = one_line_error(reflex("generate", str(tiny), "", "--backend", "cpu"))
    assert "empty prompt" in line


def test_usage_errors_exit_2(tiny):
    p = reflex("generate", str(tiny))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = reflex("generate", str(tiny), "hi", "-n", "0")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = reflex("generate", str(tiny), "hi", "--backend", "tpu")
    assert p.returncode == 2
    # a penalty whose float32 logits would overflow (NaN draws) is refused before the load
    p = reflex("generate", str(tiny), "hi", "--repeat-penalty", "1e-45", "--backend", "cpu")
    assert p.returncode == 2 and "'--repeat-penalty'" in p.stderr and "Traceback" not in p.stderr


def test_debug_shows_the_traceback(tmp_path):
    p = reflex("generate", str(tmp_path / "nope.gguf"), "hi", "--debug")
    assert p.returncode == 1 and "Traceback" in p.stderr and "error: " in p.stderr


def test_cuda_backend_without_a_gpu_is_one_clear_line(tiny):
    """On a machine without an NVIDIA driver (CI), --backend cuda fails in one line; with one,
    it runs. Either way: no traceback."""
    p = reflex("generate", str(tiny), "hi", "-n", "1", "--backend", "cuda")
    if p.returncode == 0:
        assert "REFLEX_GENERATE_OK" in p.stdout
    else:
        line = one_line_error(p)
        assert "GPU" in line or "CUDA" in line or "driver" in line


def test_auto_backend_falls_back_to_cpu_with_a_notice(tiny):
    p = reflex("generate", str(tiny), "hi", "-n", "1")
    assert p.returncode == 0, p.stderr
    if 'backend="cpu"' in p.stdout:
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("notice: ")


def test_system1_lines_and_json(tiny):
    args = ["system1", str(tiny), "The capital of France is", "--candidate", " Paris",
            "--candidate", " London", "--candidate", " Berlin", "--backend", "cpu"]
    p = reflex(*args)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 4
    for i, (text, tid) in enumerate(((" Paris", 12095), (" London", 7148), (" Berlin", 19846))):
        m = re.fullmatch(rf'REFLEX_SYSTEM1_CANDIDATE_OK idx={i} text="{text}" token_ids=\[{tid}\] '
                         r"score=(-?\d+\.\d{6}) probability=(\d\.\d{6})", lines[i])
        assert m, lines[i]
    m = re.fullmatch(r"REFLEX_SYSTEM1_OK process_start_to_result_ms=\d+\.\d+ num_candidates=3 "
                     r'best_idx=(\d) best_text="([^"]+)" entropy=(\d\.\d{6}) backend="cpu"', lines[3])
    assert m, lines[3]
    d = json.loads(reflex(*args, "--json").stdout)
    probs = [c["probability"] for c in d["candidates"]]
    assert abs(sum(probs) - 1) < 1e-9 and d["best_idx"] == int(m.group(1))
    assert d["candidates"][d["best_idx"]]["text"] == m.group(2)


@pytest.mark.parametrize("extra, msg", [
    ([], "no candidates"),
    (["--candidate", ""], "candidate 0 is empty"),
])
def test_system1_errors(tiny, extra, msg):
    line = one_line_error(reflex("system1", str(tiny), "Hi", *extra, "--backend", "cpu"))
    assert msg in line


def test_bench_cold_runs_fresh_processes_after_a_warmup(tiny, tmp_path):
    # CPU backend (CI has no GPU): the machinery -- fresh processes timed from outside, one
    # untimed warm-up that writes the file's index, energy reported as unavailable without NVML
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    p = reflex("bench", str(tiny), "--cold", "-r", "2", "--backend", "cpu", "--json", env=env,
               timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["mode"] == "cold" and res["n_ok"] == 2 and len(res["runs"]) == 2
    assert res["warmup"]["rc"] == 0 and res["page_cache"] == "warm"
    assert res["command"][-6:] == ["-n", "1", "--backend", "cpu", "--", "The capital of France is"]
    w = res["wall_s"]
    assert 0 < w["min"] <= w["median"] <= w["max"]
    for r in res["runs"]:
        assert any("REFLEX_GENERATE_OK" in line for line in r["tail"])
    # the warm-up's exit left the index to a detached helper: it lands a moment later
    assert wait_for_files(tmp_path / "xdg" / "reflex" / "index", "*.rxi")
    q = reflex("bench", str(tiny), "--cold", "-r", "1", "--backend", "cpu", "--no-warmup",
               env=env, timeout=300)
    assert q.returncode == 0, q.stderr
    assert "warmup" not in q.stdout and q.stdout.count("run rc=0") == 1
    assert "REFLEX_BENCH_COLD_OK runs=1" in q.stdout
    bad = reflex("bench", str(tiny), "--no-warmup", "--backend", "cpu")
    assert bad.returncode == 2 and "apply to --cold only" in bad.stderr
    # a prompt that looks like an option is still the prompt the children are given
    r = reflex("bench", str(tiny), "--cold", "-r", "1", "--no-warmup", "--backend", "cpu",
               "--prompt", "--help", "--json", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert any("REFLEX_GENERATE_OK" in line for line in json.loads(r.stdout)["runs"][0]["tail"])
    for prompt, code, msg in (("", 1, "empty prompt"), ("-", 2, "bench reads no standard input")):
        e = reflex("bench", str(tiny), "--prompt", prompt, "--backend", "cpu")
        assert e.returncode == code and msg in e.stderr and "Traceback" not in e.stderr
