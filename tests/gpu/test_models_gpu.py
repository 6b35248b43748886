"""Whole models on the GPU against the NumPy reference: every supported weight type, prefill of
several lengths, decode through the device KV cache, greedy generation, system1 scoring, and
``reflex check`` on a Qwen3-0.6B-shaped file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reflex_core import engine, system1
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import ModelShape, tiny_kquant_shape, write_model

# GPU and NumPy both accumulate in float32 from identical weights, in different orders: on these
# tiny models the logits agree to ~1e-6 of their scale; 1e-4 leaves room and still catches any
# wrong op (which moves logits by O(1)).
REL = 1e-4

DENSE_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]


def shape_for(arch: str, wtype: str) -> ModelShape:
    if wtype in ("Q4_K", "Q5_K", "Q6_K"):
        return tiny_kquant_shape(arch)
    if arch == "qwen3moe":
        return ModelShape(arch="qwen3moe", n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
                          head_dim=32, n_ff=96, n_expert=8, n_expert_used=2, n_ff_exp=64)
    return ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)


@pytest.mark.parametrize("arch,wtype", [("qwen3", t) for t in DENSE_TYPES] +
                         [("qwen3moe", t) for t in ("F32", "Q8_0", "Q4_K")])
@pytest.mark.parametrize("n_prompt", [1, 7, 64, 300])
def test_prefill_and_decode_match_reference(prefill_decode_vs_reference, model_files, arch, wtype,
                                            n_prompt):
    path = model_files(shape_for(arch, wtype), weight_type=wtype, seed=11)
    prefill_decode_vs_reference(path, n_prompt, REL, f"{arch} {wtype}")


@pytest.mark.parametrize("n_prompt", [1, 64])
def test_expert_groups_match_reference(prefill_decode_vs_reference, model_files, n_prompt):
    """qwen3moe with group-limited routing (2 groups of 4 experts, one used; the oracle tests
    match the reference to llama.cpp) through the GPU's route kernel."""
    shape = shape_for("qwen3moe", "F32").replace(expert_groups=(2, 1))
    path = model_files(shape, weight_type="F32", seed=12)
    prefill_decode_vs_reference(path, n_prompt, REL, "qwen3moe groups")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_generate_and_system1_same_on_gpu_and_cpu(cuda_device, model_files, arch):
    path = model_files(shape_for(arch, "Q8_0"), weight_type="Q8_0", tokenizer="qwen3", seed=4)
    prompt = "The capital of France is"
    cands = [" Paris", " London", " Berlin", " the city of light"]
    out = {}
    for backend in ("cuda", "cpu"):
        lm, ids = engine.load(str(path), backend, prompt=prompt)
        assert lm.backend == backend
        res = engine.generate(lm, ids, 12, SamplingParams())
        cand_ids = system1.tokenize_candidates(lm.tokenizer, cands)
        s1 = system1.evaluate(lm.model, lm.ops, ids, cands, cand_ids)
        sampled = engine.generate(lm, ids, 8, SamplingParams(0.9, 50, 0.95, seed=3))
        out[backend] = (res.token_ids, s1, sampled.token_ids)
    assert out["cuda"][0] == out["cpu"][0]
    gs, cs = out["cuda"][1], out["cpu"][1]
    assert gs.best_idx == cs.best_idx
    for a, b in zip(gs.candidates, cs.candidates):
        assert abs(a.score - b.score) < 1e-3 * max(1.0, abs(b.score))
        assert abs(a.probability - b.probability) < 1e-3
    assert out["cuda"][2] == out["cpu"][2]  # same logits (to ~1e-6) and same u: same samples


def test_system1_tree_batch_equals_separate_passes_on_gpu(cuda_device, model_files):
    path = model_files(shape_for("qwen3", "F32"), weight_type="F32", tokenizer="qwen3", seed=2)
    lm, ids = engine.load(str(path), "cuda", prompt="Q: is the sky blue? A:")
    cands = [[9454], [2308, 11, 432, 374], [7414, 13]]
    tree = system1.score(lm.model, lm.ops, ids, cands)
    for c, s in zip(cands, tree):
        full = ids + c
        st = lm.model.new_state(len(full))
        logits = lm.model.forward(st.append(full), st, list(range(len(full))))
        lp = lm.ops.token_logprobs(lm.ops.take_rows(logits, list(range(len(ids) - 1, len(full) - 1))), c)
        assert abs(sum(lp) - s) < 1e-4 * max(1.0, abs(s))


@pytest.mark.slow
def test_reflex_check_on_qwen3_0_6b_shaped_file(cuda_device, tmp_path_factory):
    from reflex_core.testing.modelwriter import qwen3_0_6b_shape

    d = os.environ.get("REFLEX_BENCH_MODELS")
    path = os.path.join(d, "qwen3-0.6b-shaped-q8_0.gguf") if d else None
    if not path or not os.path.exists(path):
        path = str(tmp_path_factory.mktemp("big") / "qwen3-0.6b-shaped-q8_0.gguf")
        write_model(path, qwen3_0_6b_shape(), weight_type="Q8_0", tokenizer="qwen3", seed=1)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "check", path, "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and d["dequant_mismatches"] == 0 and d["positions"] >= 9


def test_reflex_smoke(cuda_device):
    import re

    p = subprocess.run([sys.executable, "-m", "reflex_core", "smoke"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r'REFLEX_SMOKE_OK process_start_to_result_ms=\d+\.\d+ device="[^"]+" '
                        rf"sm={cuda_device.sm} image=(sass|ptx)", p.stdout.strip()), p.stdout


def test_cli_generate_on_gpu(cuda_device, model_files):
    path = model_files(shape_for("qwen3", "Q8_0"), weight_type="Q8_0", tokenizer="qwen3", seed=4)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "generate", str(path), "Hello", "-n",
                        "4", "--json", "--timings"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["backend"] == "cuda" and 1 <= d["n_tokens"] <= 4
