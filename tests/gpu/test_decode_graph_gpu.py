"""Decode steps from a captured CUDA graph (reflex_core.backends.cuda_graph; the default):
the same tokens as eager decoding for every family -- greedy and sampled, short and past the
capture step, quantized weights, chained on the device (the default; from the prompt on, its
first token picked on the device too) or each step waiting for the host -- the graph taken for
every family (each reads every per-token value from device
memory); a chain stopped early leaves nothing behind; the blocks a graph held go back to the
allocator when the job ends."""

from __future__ import annotations

import pytest

from reflex_core import engine
from reflex_core.backends import cuda_graph
from reflex_core.cuda import memory
from reflex_core.sampling import SamplingParams
from reflex_core.timing import Timings

from test_statefile_gpu import FAMILIES, GREEDY, PROMPT

pytestmark = pytest.mark.gpu

SAMPLED = SamplingParams(0.8, 40, 0.95, 1234)


def run(lm, n, sampling, monkeypatch, graphs, chain=True, fed=False):
    """``fed``: the job chains from its prompt on (engine.decode_fed) whatever its size; else
    never."""
    monkeypatch.setenv("REFLEX_CUDA_GRAPHS", "1" if graphs else "0")
    monkeypatch.setenv("REFLEX_DECODE_FED", "1" if fed else "0")
    monkeypatch.setattr(cuda_graph, "CHAIN", chain)
    t = Timings()
    res = engine.generate(lm, PROMPT, n, sampling, timings=t)
    return res.token_ids, t.notes.get("decode", "")


def check_graph_equals_eager(path, monkeypatch):
    """24 tokens greedy and sampled: the same with decode graphs, chained or not, as with eager
    steps; the graph captured at step 2 (the first step's trace equals the captured one's)."""
    lm = engine.load(str(path), "cuda")[0]
    try:
        for sampling in (GREEDY, SAMPLED):
            eager, _ = run(lm, 24, sampling, monkeypatch, graphs=False)
            graphed, note = run(lm, 24, sampling, monkeypatch, graphs=True)
            assert graphed == eager, (path, sampling, note)
            assert note == "graph (captured at step 2), steps chained on the device, 23 steps", note
            unchained, note = run(lm, 24, sampling, monkeypatch, graphs=True, chain=False)
            assert unchained == eager, (path, sampling, note)
            assert note == "graph (captured at step 2), 23 steps", note
            fed, note = run(lm, 24, sampling, monkeypatch, graphs=True, fed=True)
            assert fed == eager, (path, sampling, note)
            assert note == ("graph (captured at step 2), steps chained on the device from the "
                            "prompt, 23 steps"), note
            two, note = run(lm, 2, sampling, monkeypatch, graphs=True, fed=True)
            assert two == eager[:2], (path, sampling, note)
            assert note.startswith("eager (not yet captured), steps chained on the device "
                                   "from the prompt"), note
    finally:
        lm.close()


def test_graph_captured_at_step_2_over_a_split_cache(cuda_device, model_files, monkeypatch):
    """A cache of 512 cells or more: the decode attention runs in slices with counters that the
    prompt's attention makes, so the first traced step allocates nothing that the captured one
    does not, and the graph is taken at step 2 as over a short cache; the tokens as eager."""
    import dataclasses

    from reflex_core.backends.cuda_backend import attention_splits

    shape, seed = FAMILIES["qwen3"]
    shape = dataclasses.replace(shape, context_length=1024)
    n = 520
    assert attention_splits(1, shape.n_head, len(PROMPT) + n) > 1
    lm = engine.load(str(model_files(shape, seed=seed)), "cuda")[0]
    try:  # the graph first: its ops have no counters yet
        graphed, note = run(lm, n, GREEDY, monkeypatch, graphs=True, fed=True)
        assert note.startswith("graph (captured at step 2), steps chained on the device from "
                               "the prompt"), note
        eager, _ = run(lm, n, GREEDY, monkeypatch, graphs=False)
        assert graphed == eager
        graphed, note = run(lm, n, GREEDY, monkeypatch, graphs=True)
        assert note.startswith("graph (captured at step 2), steps chained on the device,"), note
        assert graphed == eager
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
        eager, _ = run(lm, 2, GREEDY, monkeypatch, graphs=False)
        got, note = run(lm, 2, GREEDY, monkeypatch, graphs=True)
        assert got == eager and note.startswith("eager (not yet captured)"), note
        run(lm, 12, GREEDY, monkeypatch, graphs=True)  # warm the allocator's cache
        live = memory.pool_stats()["live_bytes"]
        got, note = run(lm, 12, GREEDY, monkeypatch, graphs=True)
        assert note.startswith("graph"), note
        assert memory.pool_stats()["live_bytes"] == live
        assert not memory._pool.held
    finally:
        lm.close()


@pytest.mark.parametrize("stop_after", [4, 9])
def test_a_chain_stopped_early_leaves_nothing_behind(cuda_device, model_files, monkeypatch,
                                                     stop_after):
    """A caller that stops taking tokens (a stop string, an end-of-generation token) with a
    chained step still queued: the tokens so far are eager decoding's, the queued step finishes
    before the graph goes, its blocks and pinned slots are given back, and the next job on the
    same model decodes the same tokens again."""
    shape, seed = FAMILIES["qwen3"]
    lm = engine.load(str(model_files(shape, seed=seed)), "cuda")[0]
    try:
        eager, _ = run(lm, 16, GREEDY, monkeypatch, graphs=False)
        run(lm, 16, GREEDY, monkeypatch, graphs=True)  # warm the allocator's cache
        live = memory.pool_stats()["live_bytes"]
        model, ops = lm.model, lm.ops
        state = model.new_state(len(PROMPT) + 16)
        batch = state.append(PROMPT)
        first = ops.argmax(model.forward(batch, state, [batch.n_tokens - 1]))[-1]
        graph = engine.decode_graph(lm)
        chain = graph.device_pick(0.0, 0, 1.0, 0.0, None)
        got = []
        tokens = engine.decode_tokens(model, state, graph, lambda x: ops.argmax(x)[-1], first,
                                      16, chain)
        for tok in tokens:
            got.append(tok)
            if len(got) == stop_after:
                break
        tokens.close()
        # tokens 2 and 3 came from the eager and the captured step, each later one from a queued
        # step, and one more step is queued past the last token taken
        assert graph._chain is not None and graph._chain.sent == stop_after - 2
        graph.close()
        # a closed generator may keep its locals (the state) until it goes (CPython 3.12)
        del state, batch, tokens
        assert got == eager[:stop_after]
        assert memory.pool_stats()["live_bytes"] == live
        assert not memory._pool.held
        again, note = run(lm, 16, GREEDY, monkeypatch, graphs=True)
        assert again == eager, note
    finally:
        lm.close()


@pytest.mark.parametrize("stop_after", [1, 3, 9])
def test_a_job_fed_from_its_prompt_stopped_early_leaves_nothing_behind(cuda_device, model_files,
                                                                       monkeypatch, stop_after):
    """engine.decode_fed stopped after ``stop_after`` tokens: its first token was picked on the
    device and its first steps queued before the host waited for it; the tokens so far are
    eager decoding's, at most FED_AHEAD steps were queued past the last token taken, and they
    finish before the graph goes, whose blocks come back."""
    from itertools import islice

    shape, seed = FAMILIES["qwen3"]
    lm = engine.load(str(model_files(shape, seed=seed)), "cuda")[0]
    try:
        eager, _ = run(lm, 16, GREEDY, monkeypatch, graphs=False)
        run(lm, 16, GREEDY, monkeypatch, graphs=True, fed=True)  # warm the allocator's cache
        live = memory.pool_stats()["live_bytes"]
        model = lm.model
        state = model.new_state(len(PROMPT) + 16)
        batch = state.append(PROMPT)
        logits = model.forward(batch, state, [batch.n_tokens - 1])
        graph = engine.decode_graph(lm)
        tokens = engine.decode_fed(state, graph, logits, 16,
                                   graph.device_pick(0.0, 0, 1.0, 0.0, None))
        got = list(islice(tokens, stop_after))
        tokens.close()
        # the prompt's pick, then one pick a step
        assert graph._chain.sent == 1 + min(15, max(stop_after, engine.FED_AHEAD))
        graph.close()
        del state, batch, logits, tokens
        assert got == eager[:stop_after]
        assert memory.pool_stats()["live_bytes"] == live
        assert not memory._pool.held
        again, note = run(lm, 16, GREEDY, monkeypatch, graphs=True, fed=True)
        assert again == eager, note
    finally:
        lm.close()
