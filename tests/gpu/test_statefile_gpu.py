"""State files across backends: a state exported on the GPU resumes on the CPU and back with the
same greedy tokens as an uninterrupted run, for every family (the Qwen3.5 recurrent state and
the DeepSeek latent cache included); system1's prefix export from the GPU; the CLI on the GPU's
cold path (which must not import numpy to read or write a state file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reflex_core import engine, statefile, system1
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import (ModelShape, tiny_deepseek2_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape)

GREEDY = SamplingParams(0.0, 0, 1.0, None)
PROMPT = [5, 9, 17, 3, 44, 12, 7]
FAMILIES = {  # the seeds of tests/test_statefile.py: continuations that are not one token
    "qwen3": (ModelShape(n_vocab=200), 1),
    "qwen3moe": (ModelShape(arch="qwen3moe", n_expert=8, n_expert_used=2, n_ff_exp=64,
                            n_vocab=200), 3),
    "qwen35": (tiny_qwen35_shape(), 1),
    "qwen35moe": (tiny_qwen35moe_shape(), 3),
    "deepseek2": (tiny_deepseek2_shape(), 2),
}


def both(model_files, family):
    shape, seed = FAMILIES[family]
    path = str(model_files(shape, seed=seed))
    return {b: engine.load(path, b)[0] for b in ("cuda", "cpu")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_on_one_backend_import_on_the_other(cuda_device, model_files, tmp_path, family):
    lms = both(model_files, family)
    full = {b: engine.generate(lm, PROMPT, 8, GREEDY).token_ids for b, lm in lms.items()}
    assert full["cuda"] == full["cpu"]
    for src, dst in (("cuda", "cpu"), ("cpu", "cuda"), ("cuda", "cuda")):
        first = engine.generate(lms[src], PROMPT, 4, GREEDY, keep_state=True)
        f = tmp_path / f"{src}-{dst}.rxs"
        statefile.write(str(f), lms[src], first.state.dump(), first.fed, first.pending)
        saved = statefile.read(str(f))
        assert saved.header["backend"] == src
        statefile.check_model(saved, lms[dst])
        rest = engine.generate(lms[dst], [], 4, GREEDY, resume=saved)
        assert first.token_ids + rest.token_ids == full["cpu"], (src, dst)


@pytest.mark.parametrize("family", ["qwen3", "qwen35", "deepseek2"])
def test_system1_prefix_from_the_gpu(cuda_device, model_files, tmp_path, family):
    lms = both(model_files, family)
    cands = [[7], [11, 3, 50], [42, 42]]
    got: list[dict] = []
    s_gpu = system1.score(lms["cuda"].model, lms["cuda"].ops, PROMPT, cands, on_prefix=got.append)
    f = tmp_path / "s1.rxs"
    statefile.write(str(f), lms["cuda"], got[0], PROMPT[:-1], PROMPT[-1:])
    saved = statefile.read(str(f))
    s_cpu = system1.score(lms["cpu"].model, lms["cpu"].ops, saved.pending, cands, saved.dumped)
    for a, b in zip(s_gpu, s_cpu):
        assert abs(a - b) < 1e-3 * max(1.0, abs(b))
    res = engine.generate(lms["cpu"], [], 5, GREEDY, resume=saved)
    assert res.token_ids == engine.generate(lms["cpu"], PROMPT, 5, GREEDY).token_ids


def test_cli_gpu_export_cpu_import(cuda_device, model_files, tmp_path):
    path = str(model_files(ModelShape(n_layer=2), tokenizer="qwen3", seed=4))
    f = tmp_path / "g.rxs"

    def run(*args):
        p = subprocess.run([sys.executable, "-m", "reflex_core", *args, "--json"],
                           capture_output=True, text=True, env=dict(os.environ), timeout=300)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    full = run("generate", path, "The capital of France is", "-n", "8", "--backend", "cpu")
    a = run("generate", path, "The capital of France is", "-n", "4", "--backend", "cuda",
            "--export-kv", str(f))
    assert a["backend"] == "cuda"
    b = run("generate", path, "", "-n", "4", "--backend", "cpu", "--import-kv", str(f))
    assert a["token_ids"] + b["token_ids"] == full["token_ids"] and b["n_prefill"] == 1


@pytest.mark.parametrize("pin", ["1", "0"])
def test_cli_gpu_import_pinned_and_pageable(cuda_device, model_files, tmp_path, pin):
    """An import on the GPU uploads the state from page-locked pages (REFLEX_PIN_STATE=1, the
    default) or through the pageable copy (0): the same tokens as an uninterrupted job."""
    path = str(model_files(ModelShape(n_layer=2), tokenizer="qwen3", seed=5))
    f = tmp_path / "p.rxs"
    env = {**os.environ, "REFLEX_PIN_STATE": pin}

    def run(*args):
        p = subprocess.run([sys.executable, "-m", "reflex_core", *args], capture_output=True,
                           text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        return p

    full = run("generate", path, "The capital of France is", "-n", "8", "--backend", "cuda",
               "--json")
    run("generate", path, "The capital of France is", "-n", "4", "--backend", "cuda",
        "--export-kv", str(f))
    b = run("generate", path, "", "-n", "4", "--backend", "cuda", "--import-kv", str(f), "--json",
            "--timings")
    note = [ln for ln in b.stderr.splitlines() if "state upload:" in ln]
    assert note and ("pinned (" in note[0] if pin == "1" else "not pinned" in note[0]), b.stderr
    # the first 4 of the uninterrupted job, then the resumed 4
    first = json.loads(full.stdout)["token_ids"]
    assert json.loads(b.stdout)["token_ids"] == first[4:]
