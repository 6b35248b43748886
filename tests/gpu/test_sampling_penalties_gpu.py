"""The repeat penalty kernel (reflex_repeat_penalty) and min-p in reflex_sample against their NumPy
twins (reflex_core.sampling), on odd vocabulary sizes, several rows and fixed seeds; and a
decode with both features equal on the GPU and the CPU."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reflex_core import engine, sampling
from reflex_core.sampling import SamplingParams
from reflex_core.testing.modelwriter import ModelShape

V_BIG = 151936


def _row(rng, kind, V):
    x = (rng.standard_normal(V) * 3).astype(np.float32)
    if kind == "zeros":  # logits exactly 0 take the multiply branch and stay 0
        x[rng.random(V) < 0.3] = 0.0
    elif kind == "ties":
        x = rng.integers(-4, 3, V).astype(np.float32)
    elif kind == "neginf":
        x[rng.random(V) < 0.4] = -np.inf
        x[0] = 1.0
    return x


@pytest.mark.parametrize("V", [1, 7, 1001, 4097, V_BIG], ids=["V1", "V7", "V1001", "V4097",
                                                               "big-V"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kind", ["normal", "zeros", "neginf"])
def test_repeat_penalty_matches_the_twin(cuda_ops, ref_ops, V, rows, kind, rng):
    x = np.stack([_row(rng, kind, V) for _ in range(rows)])
    n_ids = min(V, 700)  # more than one block of ids where V allows
    ids = rng.integers(0, V, n_ids).tolist() + [0, V - 1, 0]  # repeats and both ends
    for penalty in (1.3, 0.6):
        want = x.copy()
        ref_ops.repeat_penalty(want, ids, penalty)
        dx = cuda_ops.from_numpy(x)
        assert cuda_ops.repeat_penalty(dx, ids, penalty) is None
        got = cuda_ops.to_numpy(dx)
        np.testing.assert_array_equal(got, want)  # IEEE float32 either side: exact
        np.testing.assert_array_equal(got[:-1], x[:-1])  # only the last row changes


def test_repeat_penalty_edges(cuda_ops, rng):
    x = (rng.standard_normal((2, 33)) * 2).astype(np.float32)
    dx = cuda_ops.from_numpy(x)
    cuda_ops.repeat_penalty(dx, [], 2.0)
    np.testing.assert_array_equal(cuda_ops.to_numpy(dx), x)
    for bad in ([33], [-1], [0, 40]):
        with pytest.raises(ValueError, match="outside"):
            cuda_ops.repeat_penalty(dx, bad, 2.0)
    np.testing.assert_array_equal(cuda_ops.to_numpy(dx), x)


MIN_P_PARAMS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.05), (0.7, 40, 1.0, 0.1), (0.8, 0, 0.9, 0.02), (1.3, 20, 0.95, 0.3),
    (0.6, 0, 1.0, 1.0), (2.0, 5000, 0.5, 0.01), (1.0, 0, 1.0, 0.0), (0.9, 3, 1.0, 0.5),
    (0.0, 0, 1.0, 0.2),
]


@pytest.mark.parametrize("V", [1, 7, 1001, 4097, V_BIG], ids=["V1", "V7", "V1001", "V4097",
                                                               "big-V"])
@pytest.mark.parametrize("kind", ["normal", "ties", "neginf"])
def test_sample_with_min_p_matches_the_reference(cuda_ops, V, kind, rng):
    u_rng = random.Random(V * 13 + len(kind))
    draws = 12 if V == V_BIG else 36
    mismatches = []
    for i in range(draws):
        x = _row(rng, kind, V)
        T, k, p, m = MIN_P_PARAMS[i % len(MIN_P_PARAMS)]
        u = u_rng.random()
        want = sampling.sample_reference(x, T, k, p, u, m)
        got = cuda_ops.sample(cuda_ops.from_numpy(x[None, :]), T, k, p, u, m)
        if got != want:
            mismatches.append(f"draw {i}: T={T} k={k} p={p} min_p={m} u={u!r}: got {got}, "
                              f"want {want}")
    assert not mismatches, "\n".join(mismatches)


def test_min_p_keeps_tied_maxima_and_its_bound(cuda_ops):
    tie = np.array([[0.5, 2.0, -1.0, 2.0, 1.9]], np.float32)
    d = cuda_ops.from_numpy(tie)
    assert {cuda_ops.sample(d, 1.3, 0, 1.0, u, 1.0) for u in (0.1, 0.4, 0.6, 0.9)} == {1, 3}
    below = np.nextafter(np.float32(-1.0), np.float32(-2.0))
    row = np.array([[0.0, -1.0, below, -3.0]], np.float32)
    d = cuda_ops.from_numpy(row)
    m = float(np.exp(-1.0))  # ln(m) == -1.0: token 1 sits on the bound, token 2 just below
    got = {cuda_ops.sample(d, 0.7, 0, 1.0, u, m) for u in np.linspace(0, 0.999, 40)}
    assert got == {0, 1}


def test_min_p_distribution(cuda_ops, rng):
    x = (rng.standard_normal(50) * 1.5).astype(np.float32)
    probs = sampling.sample_probs(x, 0.9, 0, 0.95, 0.1)
    dx = cuda_ops.from_numpy(x[None, :])
    counts = np.zeros(50)
    for j in range(400):
        counts[cuda_ops.sample(dx, 0.9, 0, 0.95, (j + 0.5) / 400, 0.1)] += 1
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(probs))
    np.testing.assert_allclose(counts / 400, probs, atol=0.01)


def test_decode_with_penalty_and_min_p_same_on_gpu_and_cpu(cuda_device, model_files):
    shape = ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=96)
    path = model_files(shape, weight_type="Q8_0", tokenizer="qwen3", seed=4)
    prompt = "The capital of France is"
    params = [SamplingParams(repeat_penalty=1.8, repeat_last_n=16),
              SamplingParams(0.9, 50, 0.95, 3, min_p=0.05, repeat_penalty=1.3,
                             repeat_last_n=-1)]
    out = {}
    for backend in ("cuda", "cpu"):
        lm, ids = engine.load(str(path), backend, prompt=prompt)
        out[backend] = [engine.generate(lm, ids, 12, sp).token_ids for sp in params]
        plain = engine.generate(lm, ids, 12, SamplingParams()).token_ids
        assert out[backend][0] != plain  # the penalty changed the greedy continuation
    assert out["cuda"] == out["cpu"]
