"""Qwen3.5 hybrid models (qwen35, qwen35moe) on the GPU against the NumPy reference: prefill of
several lengths then decode steps through the device state (conv windows, delta-rule matrices,
attention K/V), several sequences in one batch, greedy generation and system1, the plugin's
kernels loaded by the engine, and ``reflex check`` on a Qwen3.5-0.8B-shaped file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reflex_core import engine, system1
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import (tiny_qwen35_kquant_shape, tiny_qwen35_shape,
                                             tiny_qwen35moe_shape, write_model)
from reflex_core.timing import Timings

# As tests/gpu/test_models_gpu.py: float32 on both sides in different orders; a wrong op moves
# logits by O(1). The recurrent state accumulates over the prompt, so long prompts get the same
# bound (measured figures go in the closing note).
REL = 1e-4


def shape_for(arch: str, wtype: str):
    if wtype in ("Q4_K", "Q5_K", "Q6_K"):
        return tiny_qwen35_kquant_shape(arch)
    if arch == "qwen35moe":
        return tiny_qwen35moe_shape(recurrent_layers=(True, False, True, True),
                                    full_attention_interval=None)
    # H_v = 3 H_k; widths multiples of 32 (Q8_0)
    return tiny_qwen35_shape(ssm_group_count=1, ssm_time_step_rank=3, ssm_state_size=32)


@pytest.mark.parametrize("arch,wtype", [("qwen35", t) for t in ("F32", "Q8_0", "Q4_K")] +
                         [("qwen35moe", t) for t in ("F32", "Q8_0", "Q4_K")])
@pytest.mark.parametrize("n_prompt", [1, 7, 64, 600])
def test_prefill_and_decode_match_reference(prefill_decode_vs_reference, model_files, arch, wtype,
                                            n_prompt):
    path = model_files(shape_for(arch, wtype), weight_type=wtype, seed=11)
    prefill_decode_vs_reference(path, n_prompt, REL, f"{arch} {wtype}")


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_forked_sequences_in_one_batch(gpu_and_reference, model_files, arch):
    """A prompt, three forks of its state, then one batch feeding the three sequences runs of
    different lengths (the second system1 pass): GPU = NumPy, every row."""
    path = model_files(shape_for(arch, "F32"), weight_type="F32", seed=12)
    load, rel = gpu_and_reference
    g, gm, rm = load(path)
    prompt = list(range(3, 40))
    branches = {1: [5, 6, 7], 2: [9], 3: [11, 12, 13, 14, 15, 16, 17]}
    outs = []
    for m in (gm, rm):
        st = m.new_state(len(prompt) + 20, 4)
        m.forward(st.append(prompt), st, [len(prompt) - 1])
        for s in branches:
            st.fork(0, s)
        b = st.append_branches(branches)
        outs.append(m.ops.to_numpy(m.forward(b, st, list(range(b.n_tokens)))))
    assert rel(outs[0], outs[1]) < REL
    g.close()


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_generate_and_system1_same_on_gpu_and_cpu(cuda_device, model_files, arch):
    path = model_files(shape_for(arch, "Q8_0"), weight_type="Q8_0", tokenizer="qwen35", seed=4)
    prompt = "The capital of France is"
    cands = [" Paris", " London", " Berlin", " the city of light"]
    out = {}
    for backend in ("cuda", "cpu"):
        t = Timings()
        lm, ids = engine.load(str(path), backend, prompt=prompt, timings=t)
        assert lm.backend == backend
        if backend == "cuda":  # the plugin's kernels were loaded by the engine, at resolve time
            assert "reflex_qwen35_hybrid" in t.notes.get("plugin kernels", ""), t.notes
        res = engine.generate(lm, ids, 12, SamplingParams())
        cand_ids = system1.tokenize_candidates(lm.tokenizer, cands)
        s1 = system1.evaluate(lm.model, lm.ops, ids, cands, cand_ids)
        out[backend] = (res.token_ids, s1)
    assert out["cuda"][0] == out["cpu"][0]
    gs, cs = out["cuda"][1], out["cpu"][1]
    assert gs.best_idx == cs.best_idx
    for a, b in zip(gs.candidates, cs.candidates):
        assert abs(a.score - b.score) < 1e-3 * max(1.0, abs(b.score))


@pytest.mark.slow
def test_reflex_check_on_qwen35_0_8b_shaped_file(cuda_device, tmp_path_factory):
    from reflex_core.testing.modelwriter import qwen35_0_8b_shape

    d = os.environ.get("REFLEX_BENCH_MODELS")
    path = os.path.join(d, "qwen35-0.8b-shaped-q8_0.gguf") if d else None
    if not path or not os.path.exists(path):
        path = str(tmp_path_factory.mktemp("big") / "qwen35-0.8b-shaped-q8_0.gguf")
        write_model(path, qwen35_0_8b_shape(), weight_type="Q8_0", tokenizer="qwen35", seed=1)
    p = subprocess.run([sys.executable, "-m", "reflex_core", "check", path, "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and d["dequant_mismatches"] == 0 and d["positions"] >= 9
