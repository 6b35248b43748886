"""Decode steps from a captured CUDA graph (reflex_core.backends.cuda_graph; the default):
the same tokens as eager decoding for every family -- greedy and sampled, short and past the
capture step, quantized weights -- the graph taken for every family (each
reads every per-token value from device memory); the blocks a graph held go back to the
allocator when the job ends."""

from __future__ import annotations

import pytest

from reflex_core import engine
from reflex_core.cuda import memory
from reflex_core.sampling import SamplingParams
from reflex_core.timing import Timings

from test_statefile_gpu import FAMILIES, GREEDY, PROMPT

pytestmark = pytest.mark.gpu

SAMPLED = SamplingParams(0.8, 40, 0.95, 1234)


def run(lm, n, sampling, monkeypatch, graphs):
    monkeypatch.setenv("REFLEX_CUDA_GRAPHS", "1" if graphs else "0")
    t = Timings()
    res = engine.generate(lm, PROMPT, n, sampling, timings=t)
    return res.token_ids, t.notes.get("decode", "")


def check_graph_equals_eager(path, monkeypatch):
    """24 tokens greedy and sampled: the same with decode graphs as with eager steps, and the
    graph captured at step 4."""
    lm = engine.load(str(path), "cuda")[0]
    try:
        for sampling in (GREEDY, SAMPLED):
            eager, _ = run(lm, 24, sampling, monkeypatch, graphs=False)
            graphed, note = run(lm, 24, sampling, monkeypatch, graphs=True)
            assert graphed == eager, (path, sampling, note)
            assert note.startswith("graph (captured at step 4)"), note
    finally:
        lm.close()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("weight_type", ["F32", "Q8_0"])  # tiny shapes: 32-wide blocks
def test_graph_decode_equals_eager(cuda_device, model_files, monkeypatch, family, weight_type):
    shape, seed = FAMILIES[family]
    check_graph_equals_eager(model_files(shape, weight_type=weight_type, seed=seed), monkeypatch)


@pytest.mark.parametrize("weight_type", ["IQ4_XS", "Q4_K", "Q6_K"])
def test_graph_decode_equals_eager_kquant_weights(cuda_device, model_files, monkeypatch, weight_type):
    """Graph replay against eager steps on the K-quant and IQ4_XS GEMVs (IQ4_XS: on x limbs, a
    scratch block per launch)."""
    from reflex_core.testing.modelwriter import tiny_kquant_shape

    check_graph_equals_eager(model_files(tiny_kquant_shape("qwen3"), weight_type=weight_type, seed=1),
                             monkeypatch)


def test_short_jobs_never_capture_and_blocks_come_back(cuda_device, model_files, monkeypatch):
    shape, seed = FAMILIES["qwen3"]
    lm = engine.load(str(model_files(shape, seed=seed)), "cuda")[0]
    try:
        eager, _ = run(lm, 3, GREEDY, monkeypatch, graphs=False)
        got, note = run(lm, 3, GREEDY, monkeypatch, graphs=True)
        assert got == eager and note.startswith("eager (not yet captured)"), note
        run(lm, 12, GREEDY, monkeypatch, graphs=True)  # warm the allocator's cache
        live = memory.pool_stats()["live_bytes"]
        got, note = run(lm, 12, GREEDY, monkeypatch, graphs=True)
        assert note.startswith("graph"), note
        assert memory.pool_stats()["live_bytes"] == live
        assert not memory._pool.held
    finally:
        lm.close()
