"""The sampler's kept set and draw distribution against llama.cpp's own sampler chain (the
oracle): ``top_k`` -> ``top_p`` -> ``min_p`` -> ``temp``, the order of llama.cpp's default chain
(common/sampling), applied through llama-cpp-python's ``llama_sampler_*`` to the same logits.

What llama.cpp leaves after the chain is the kept set, and the softmax of its (temperature-
scaled) logits is the distribution its ``dist`` sampler draws from; ``sampling.sample_probs``
must give the same set and the same probabilities (llama.cpp computes in float32: 1e-6). The
rows are random normals (no ties, where the two keep different counts by design; see
reflex_core/sampling.py) of several widths and scales, over temperatures below, at and above 1.
The repeat penalty (step 1) is compared with llama.cpp's ``penalties`` sampler bit for bit.

These tests FAIL (never skip) when llama-cpp-python is missing (marker ``oracle``).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from reflex_core import sampling
from reflex_core.testing.oracle import import_llama_cpp

pytestmark = pytest.mark.oracle


def token_data(L, logits: np.ndarray):
    """``logits`` as llama.cpp's candidate array (ids in order, unsorted), for its samplers.
    The array keeps its data alive (ctypes holds the buffer assigned to its pointer field)."""
    data = (L.llama_token_data * len(logits))()
    for i, v in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(v), 0.0
    return L.llama_token_data_array(data=data, size=len(logits), selected=-1, sorted=False)


def llama_chain_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                      min_p: float) -> np.ndarray:
    """The distribution llama.cpp's chain leaves (float64 [V], zeros outside the kept set)."""
    L = import_llama_cpp()
    V = len(logits)
    arr = token_data(L, logits)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    try:
        if top_k > 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(top_k))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(top_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(min_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(temperature))
        L.llama_sampler_apply(chain, ctypes.byref(arr))
    finally:
        L.llama_sampler_free(chain)
    ids = np.array([arr.data[i].id for i in range(arr.size)])
    z = np.array([arr.data[i].logit for i in range(arr.size)], np.float64)
    out = np.zeros(V)
    out[ids] = np.exp(z - z.max())
    return out / out.sum()


@pytest.mark.parametrize("temperature", [0.3, 0.8, 1.0, 1.7])
def test_kept_set_and_distribution_match_llama_cpp(temperature):
    rng = np.random.default_rng(int(temperature * 10))
    narrowed = {"top_k": 0, "top_p": 0, "min_p": 0}
    for trial in range(60):
        V = int(rng.integers(3, 400))
        row = (rng.standard_normal(V) * rng.uniform(0.5, 4.0)).astype(np.float32)
        top_k = int(rng.choice([0, 1, 7, 40]))
        top_p = float(rng.choice([1.0, 0.3, 0.8, 0.95]))
        min_p = float(rng.choice([0.0, 0.02, 0.1, 0.4]))
        want = llama_chain_probs(row, temperature, top_k, top_p, min_p)
        got = sampling.sample_probs(row, temperature, top_k, top_p, min_p)
        what = f"V={V} T={temperature} top_k={top_k} top_p={top_p} min_p={min_p}"
        assert np.array_equal(got > 0, want > 0), what
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=what)
        for name, off in (("top_k", (0, top_p, min_p)), ("top_p", (top_k, 1.0, min_p)),
                          ("min_p", (top_k, top_p, 0.0))):
            k, p, m = off
            narrowed[name] += np.count_nonzero(got) < np.count_nonzero(
                sampling.sample_probs(row, temperature, k, p, m))
    # each filter removed tokens the others kept in some trial: each one was tested
    assert min(narrowed.values()) >= 3, narrowed


def llama_penalised(logits: np.ndarray, context: list[int], last_n: int,
                    penalty: float) -> np.ndarray:
    """llama.cpp's ``penalties`` sampler (repeat penalty only) after it accepted ``context``."""
    L = import_llama_cpp()
    V = len(logits)
    smpl = L.llama_sampler_init_penalties(V, last_n, penalty, 0.0, 0.0)
    arr = token_data(L, logits)
    try:
        for tok in context:
            L.llama_sampler_accept(smpl, tok)
        L.llama_sampler_apply(smpl, ctypes.byref(arr))
    finally:
        L.llama_sampler_free(smpl)
    out = np.empty(V, np.float32)
    for i in range(arr.size):
        out[arr.data[i].id] = arr.data[i].logit
    return out


def test_repeat_penalty_matches_llama_cpp_bit_for_bit():
    rng = np.random.default_rng(11)
    changed = 0
    for trial in range(150):
        V = int(rng.integers(5, 200))
        row = (rng.standard_normal(V) * 3).astype(np.float32)
        row[rng.random(V) < 0.1] = 0.0  # zero logits stay zero either way
        context = [int(t) for t in rng.integers(0, V, int(rng.integers(0, 100)))]
        last_n = int(rng.choice([0, 1, 8, 64, -1]))
        penalty = float(rng.choice([0.5, 1.1, 1.5, 2.0]))
        # llama.cpp's window is a ring of last_n tokens; -1 (the whole context) is that many
        want = llama_penalised(row, context, last_n if last_n >= 0 else max(len(context), 1),
                               penalty)
        params = sampling.SamplingParams(temperature=1.0, repeat_penalty=penalty,
                                         repeat_last_n=last_n)
        got = sampling.repeat_penalty_reference(row, params.penalised_ids(context), penalty)
        assert np.array_equal(got, want), (V, last_n, penalty, len(context))
        changed += not np.array_equal(got, row)
    assert changed > 100
