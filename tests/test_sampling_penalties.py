"""min-p and the repeat penalty (reflex_core.sampling steps 1 and 6): the NumPy reference against
straightforward formulations, the NumPy op, the penalty window, the decode loop on a tiny
model (defaults unchanged, the penalty changing greedy output, an imported state's tokens in
the window), and the Python API's and the IPC generate op's parameter checks. The CUDA kernels
are held to these twins in tests/gpu/test_sampling_penalties_gpu.py."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

import reflex_core
from reflex_core import engine, ipc, sampling, statefile
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.errors import ReflexError
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import ModelShape

# --- step 1: the repeat penalty ---------------------------------------------------------------


def penalised_by_hand(row, ids, penalty):
    """Token by token over the distinct ids, float32 scalars."""
    out = [np.float32(v) for v in row]
    pen = np.float32(penalty)
    for i in set(ids):
        out[i] = out[i] / pen if out[i] > 0 else out[i] * pen
    return np.array(out, np.float32)


def test_penalty_on_both_signs_each_id_once():
    row = np.array([2.0, -2.0, 0.0, 3.0, -0.5], np.float32)
    got = sampling.repeat_penalty_reference(row, [0, 1, 2, 0, 0, 1], 2.0)
    np.testing.assert_array_equal(got, [1.0, -4.0, 0.0, 3.0, -0.5])
    np.testing.assert_array_equal(row, [2.0, -2.0, 0.0, 3.0, -0.5])  # the input is untouched
    # a penalty below 1 favours the window's tokens: positive up, negative towards 0
    np.testing.assert_array_equal(sampling.repeat_penalty_reference(row, [0, 1], 0.5),
                                  [4.0, -1.0, 0.0, 3.0, -0.5])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_penalty_matches_the_hand_formula_on_random_rows(seed):
    rng = np.random.default_rng(seed)
    V = 1001
    row = (rng.standard_normal(V) * 4).astype(np.float32)
    row[rng.integers(0, V, 30)] = 0.0
    ids = rng.integers(0, V, 400).tolist() + [0, V - 1]
    for penalty in (1.1, 1.7, 0.8):
        got = sampling.repeat_penalty_reference(row, ids, penalty)
        np.testing.assert_array_equal(got, penalised_by_hand(row, ids, penalty))
        untouched = np.setdiff1d(np.arange(V), ids)
        np.testing.assert_array_equal(got[untouched], row[untouched])


def test_numpy_op_is_in_place_on_the_last_row_and_checks_ids():
    ops = NumpyOps()
    x = np.array([[1.0, 2.0, -1.0], [1.0, 2.0, -1.0]], np.float32)
    assert ops.repeat_penalty(x, [1, 2, 2], 4.0) is None
    np.testing.assert_array_equal(x, [[1.0, 2.0, -1.0], [1.0, 0.5, -4.0]])
    ops.repeat_penalty(x, [], 4.0)
    np.testing.assert_array_equal(x[1], [1.0, 0.5, -4.0])
    one = np.array([3.0, -3.0], np.float32)
    ops.repeat_penalty(one, [0], 1.5)
    np.testing.assert_array_equal(one, [2.0, -3.0])
    for bad in ([3], [-1]):
        with pytest.raises(ValueError, match="outside"):
            ops.repeat_penalty(x, bad, 2.0)


def test_penalty_changes_the_greedy_pick():
    ops = NumpyOps()
    row = np.array([0.1, 3.0, 2.5, -1.0], np.float32)
    assert ops.argmax(row[None])[-1] == 1
    x = row[None].copy()
    ops.repeat_penalty(x, [1], 1.5)  # 3.0 / 1.5 = 2.0 < 2.5
    assert ops.argmax(x)[-1] == 2 and ops.sample(x, 0.0, 0, 1.0, 0.5) == 2
    x = row[None].copy()
    ops.repeat_penalty(x, [1], 1.1)  # 2.727 still the largest
    assert ops.argmax(x)[-1] == 1


def test_penalised_ids_window():
    on = SamplingParams(repeat_penalty=1.3, repeat_last_n=3)
    assert on.penalised_ids([1, 2, 3, 4], [5]) == [3, 4, 5]
    assert on.penalised_ids([9, 9], [7, 7, 7]) == [7]
    assert on.penalised_ids([1, 2], [], [3, 4, 5, 6]) == [4, 5, 6]
    assert on.penalised_ids([8], [1], [2]) == [1, 2, 8]  # the tail spans three parts
    assert on.penalised_ids([], [4]) == [4]  # a context shorter than the window
    whole = SamplingParams(repeat_penalty=0.9, repeat_last_n=-1)
    assert whole.penalised_ids([5, 1, 5], [3], [1, 0]) == [0, 1, 3, 5]
    assert SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalised_ids([1], [2]) == []
    assert SamplingParams(repeat_last_n=-1).penalised_ids([1], [2]) == []  # penalty 1: off
    d = SamplingParams()
    assert (d.min_p, d.repeat_penalty, d.repeat_last_n) == (0.0, 1.0, 64)


# --- step 6: min-p ----------------------------------------------------------------------------


def distribution_by_hand(row, temperature, top_k, top_p, min_p):
    """Steps 3-7 written out with Python floats and sorted lists."""
    V = len(row)
    l = [float(v) for v in row]
    z = [v / temperature for v in l]
    zmax = max(z)
    p = [math.exp(v - zmax) for v in z]
    kept = list(range(V))
    if 0 < top_k < V:
        zk = sorted(z, reverse=True)[top_k - 1]
        kept = [i for i in kept if z[i] >= zk]
    if top_p < 1.0:  # on the temperature-1 probabilities, as llama.cpp's chain runs it
        lmax = max(l)
        q = [math.exp(v - lmax) for v in l]
        total = sum(q[i] for i in kept)
        acc, t = 0.0, 0.0
        for i in sorted(kept, key=lambda i: (-q[i], i)):
            acc += q[i]
            t = q[i]
            if acc >= top_p * total:
                break
        kept = [i for i in kept if q[i] >= t]
    if min_p > 0.0:  # llama.cpp's min-p: softmax at temperature 1 against its maximum
        lmax = max(l)
        kept = [i for i in kept if math.exp(l[i] - lmax) >= min_p]
    out = np.zeros(V)
    for i in kept:
        out[i] = p[i]
    return out / out.sum()


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.05), (0.7, 0, 1.0, 0.1), (1.5, 12, 1.0, 0.1), (0.9, 0, 0.9, 0.2),
    (1.2, 8, 0.7, 0.3), (0.5, 0, 1.0, 0.5)])
def test_min_p_distribution_matches_the_hand_formula(temperature, top_k, top_p, min_p):
    narrowed = 0
    for seed in range(3, 8):
        row = (np.random.default_rng(seed).standard_normal(61) * 2).astype(np.float32)
        want = distribution_by_hand(row, temperature, top_k, top_p, min_p)
        got = sampling.sample_probs(row, temperature, top_k, top_p, min_p)
        np.testing.assert_allclose(got, want, atol=1e-12)
        narrowed += np.count_nonzero(got) < np.count_nonzero(
            sampling.sample_probs(row, temperature, top_k, top_p))
    assert narrowed >= 2  # min-p removed tokens the other filters kept: a case that tests it


def test_min_p_draws_follow_the_distribution():
    row = (np.random.default_rng(8).standard_normal(40) * 2).astype(np.float32)
    want = sampling.sample_probs(row, 0.8, 0, 0.95, 0.05)
    N = 20000
    counts = np.zeros(40)
    for i in range(N):
        counts[sampling.sample_reference(row, 0.8, 0, 0.95, (i + 0.5) / N, 0.05)] += 1
    np.testing.assert_allclose(counts / N, want, atol=1.5 / N)
    ops = NumpyOps()
    for u in (0.0, 0.3, 0.99):
        assert ops.sample(row[None], 0.8, 0, 0.95, u, 0.05) == sampling.sample_reference(
            row, 0.8, 0, 0.95, u, 0.05)


def test_min_p_zero_is_off_and_one_keeps_the_maxima():
    rng = np.random.default_rng(9)
    row = (rng.standard_normal(50) * 3).astype(np.float32)
    for T, k, p in [(1.0, 0, 1.0), (0.6, 10, 0.9)]:
        np.testing.assert_array_equal(sampling.sample_probs(row, T, k, p, 0.0),
                                      sampling.sample_probs(row, T, k, p))
        for u in np.linspace(0, 0.999, 23):
            assert sampling.sample_reference(row, T, k, p, float(u), 0.0) == \
                sampling.sample_reference(row, T, k, p, float(u))
    tie = np.array([0.5, 2.0, -1.0, 2.0, 1.9], np.float32)
    np.testing.assert_array_equal(sampling.sample_probs(tie, 1.3, 0, 1.0, 1.0),
                                  [0, 0.5, 0, 0.5, 0])
    assert {sampling.sample_reference(tie, 1.3, 0, 1.0, u, 1.0) for u in (0.1, 0.6)} == {1, 3}
    # greedy ignores min-p (the maximum is always kept)
    assert sampling.sample_reference(tie, 0.0, 0, 1.0, 0.7, 0.9) == 1


def test_min_p_bound_is_inclusive():
    min_p = math.exp(-1.0)
    assert math.log(min_p) == -1.0  # the bound is exactly l_max - 1
    below = np.nextafter(np.float32(-1.0), np.float32(-2.0))
    row = np.array([0.0, -1.0, below, -3.0], np.float32)
    kept = np.flatnonzero(sampling.sample_probs(row, 0.7, 0, 1.0, min_p))
    assert kept.tolist() == [0, 1]


# --- the decode loop on a tiny model ----------------------------------------------------------

PROMPT = [5, 9, 17, 3, 44, 12, 7]


@pytest.fixture(scope="module")
def lm(model_files):
    # qwen3 seed 1: its greedy continuation of PROMPT is not one token repeated (test_statefile)
    return engine.load(str(model_files(ModelShape(n_vocab=200), seed=1)), "cpu")[0]


def decode_by_hand(lm, prompt, n, sp: SamplingParams):
    """The loop with the model's logits and the reference functions, no engine."""
    model = lm.model
    state = model.new_state(len(prompt) + n)
    context, out = list(prompt), []
    rng = random.Random(sp.seed)
    logits = model.forward(state.append(prompt), state, [len(prompt) - 1])
    for _ in range(n):
        row = np.asarray(logits, np.float32)[-1]
        if sp.repeat_penalty != 1.0 and sp.repeat_last_n != 0:
            window = context if sp.repeat_last_n < 0 else context[-sp.repeat_last_n:]
            row = sampling.repeat_penalty_reference(row, window, sp.repeat_penalty)
        if sp.greedy:
            nxt = int(np.argmax(row))
        else:
            nxt = sampling.sample_reference(row, sp.temperature, sp.top_k, sp.top_p,
                                            rng.random(), sp.min_p)
        out.append(nxt)
        context.append(nxt)
        logits = model.forward(state.append([nxt]), state, [0])
    return out


def test_defaults_decode_as_before(lm):
    plain = decode_by_hand(lm, PROMPT, 10, SamplingParams(0.0, 0, 1.0, None))
    assert engine.generate(lm, PROMPT, 10, SamplingParams()).token_ids == plain
    sampled = SamplingParams(0.9, 40, 0.95, 11)
    assert engine.generate(lm, PROMPT, 10, sampled).token_ids == \
        decode_by_hand(lm, PROMPT, 10, sampled)


@pytest.mark.parametrize("penalty,last_n", [(1.8, 64), (3.0, 4), (2.0, -1), (0.7, 8)])
def test_repeat_penalty_in_the_decode_loop(lm, penalty, last_n):
    sp = SamplingParams(repeat_penalty=penalty, repeat_last_n=last_n)
    got = engine.generate(lm, PROMPT, 10, sp).token_ids
    assert got == decode_by_hand(lm, PROMPT, 10, sp)
    if penalty > 1.0:
        assert got != engine.generate(lm, PROMPT, 10, SamplingParams()).token_ids
    off = SamplingParams(repeat_penalty=penalty, repeat_last_n=0)
    assert engine.generate(lm, PROMPT, 10, off).token_ids == \
        engine.generate(lm, PROMPT, 10, SamplingParams()).token_ids


def test_sampling_with_both_features(lm):
    sp = SamplingParams(1.1, 0, 1.0, 21, min_p=0.1, repeat_penalty=1.5, repeat_last_n=16)
    assert engine.generate(lm, PROMPT, 10, sp).token_ids == decode_by_hand(lm, PROMPT, 10, sp)


def test_imported_tokens_are_in_the_window(lm, tmp_path):
    """A resumed job penalises what the imported state holds, so it equals the uninterrupted
    one."""
    sp = SamplingParams(repeat_penalty=2.5, repeat_last_n=-1)
    full = engine.generate(lm, PROMPT, 9, sp)
    first = engine.generate(lm, PROMPT, 4, sp, keep_state=True)
    f = tmp_path / "s.rxs"
    statefile.write(str(f), lm, first.state.dump(), first.fed, first.pending)
    saved = statefile.read(str(f))
    statefile.check_model(saved, lm)
    rest = engine.generate(lm, [], 5, sp, resume=saved)
    assert first.token_ids + rest.token_ids == full.token_ids
    assert full.token_ids == decode_by_hand(lm, PROMPT, 9, sp)


# --- the Python API and the IPC generate op ---------------------------------------------------

API_SHAPE = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)


@pytest.fixture(scope="module")
def eng(model_files):
    path = model_files(API_SHAPE, weight_type="Q8_0", tokenizer="qwen3", seed=3)
    with reflex_core.load(str(path), backend="cpu") as e:
        yield e


def test_api_passes_the_parameters_to_the_engine(eng):
    lm = eng._lm
    ids = lm.tokenizer.encode("The capital of France is")
    sp = SamplingParams(0.8, 0, 1.0, 4, min_p=0.05, repeat_penalty=1.4, repeat_last_n=-1)
    got = eng.generate("The capital of France is", max_tokens=6, temperature=0.8, seed=4,
                       min_p=0.05, repeat_penalty=1.4, repeat_last_n=-1)
    assert got.token_ids == engine.generate(lm, ids, 6, sp).token_ids


@pytest.mark.parametrize("kw,match", [
    ({"min_p": 1.5}, "min_p must be a number in"), ({"min_p": -0.1}, "min_p must be"),
    ({"min_p": float("nan")}, "min_p must be"), ({"min_p": "0.1"}, "min_p must be"),
    ({"repeat_penalty": 0}, r"repeat_penalty must be a number in \[1e-06, 1e\+06\]"),
    ({"repeat_penalty": 1e-45}, "repeat_penalty must be"), ({"repeat_penalty": 2e6}, "repeat_pen"),
    ({"repeat_penalty": -1.0}, "repeat_penalty must be"),
    ({"repeat_penalty": float("inf")}, "repeat_penalty must be"),
    ({"repeat_last_n": -2}, "repeat_last_n must be an integer >= -1"),
    ({"repeat_last_n": 1.5}, "repeat_last_n must be"), ({"repeat_last_n": True}, "repeat_last_n"),
])
def test_api_refuses_bad_values_in_one_line(eng, kw, match):
    with pytest.raises(ReflexError, match=match) as e:
        eng.generate("Hello", max_tokens=2, **kw)
    assert "\n" not in str(e.value)


def test_api_accepts_the_boundaries(eng):
    for kw in ({"min_p": 0}, {"min_p": 1}, {"repeat_penalty": 1e-3}, {"repeat_last_n": -1},
               {"repeat_last_n": 0}):
        assert eng.generate("Hello", max_tokens=2, **kw).n_tokens >= 1


def ipc_reply(eng, req: dict) -> dict:
    return ipc.handle_line(ipc.Handler(eng, 1 << 30), json.dumps(req).encode())


def test_ipc_generate_takes_the_parameters(eng):
    req = {"id": 1, "op": "generate", "prompt": "Hello", "max_tokens": 5, "temperature": 0.9,
           "seed": 2, "min_p": 0.1, "repeat_penalty": 1.3, "repeat_last_n": 8}
    _, _, params = ipc.parse_request(json.dumps(req).encode())
    assert (params["min_p"], params["repeat_penalty"], params["repeat_last_n"]) == (0.1, 1.3, 8)
    reply = ipc_reply(eng, req)
    want = eng.generate("Hello", max_tokens=5, temperature=0.9, seed=2, min_p=0.1,
                        repeat_penalty=1.3, repeat_last_n=8)
    assert reply["result"]["token_ids"] == want.token_ids
    _, _, defaults = ipc.parse_request(b'{"op": "generate", "prompt": "a"}')
    assert (defaults["min_p"], defaults["repeat_penalty"], defaults["repeat_last_n"]) == \
        (0.0, 1.0, 64)


@pytest.mark.parametrize("extra,message", [
    ({"min_p": "high"}, "'min_p' must be a number"),
    ({"repeat_penalty": None}, "'repeat_penalty' must be a number"),
    ({"repeat_last_n": 2.5}, "'repeat_last_n' must be an integer"),
    ({"min_p": 2}, "min_p must be a number in [0, 1]"),
    ({"repeat_penalty": 0}, "repeat_penalty must be a number in [1e-06, 1e+06]"),
    ({"repeat_penalty": 1e-45}, "repeat_penalty must be"), ({"repeat_penalty": 2e6}, "repeat_pen"),
    ({"repeat_last_n": -5}, "repeat_last_n must be an integer >= -1"),
])
def test_ipc_refuses_bad_values(eng, extra, message):
    reply = ipc_reply(eng, {"id": 7, "op": "generate", "prompt": "a", **extra})
    assert reply["id"] == 7 and reply["error"]["code"] == "invalid_params"
    assert message in reply["error"]["message"] and "\n" not in reply["error"]["message"]
