"""DeepSeek's MoE routing in the core's ``moe_route`` (spec §4.5, §8.5) in CI: the NumPy twin
against an independent plain-Python formula (llama.cpp's build_moe_ffn: selection by probs +
exp_probs_b, groups scored by their two largest selection scores, weights from the unbiased
probs) on random cases of odd sizes, the tie rules, the one-line ValueErrors of the twin and of
the CUDA launcher (before touching the device), and ``blocks.moe_ffn`` passing bias and groups
through. The CUDA kernel against the twin runs on the GPU machine (the generic registered-op
test, on the cases of reflex_core/testing/op_cases.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from reflex_core import blocks
from reflex_core.backends.cuda_backend import CudaOps
from reflex_core.backends.numpy_backend import NumpyOps

F32 = 0


def reference_route(logits, k, gating, norm, scale, bias, groups):
    """llama.cpp's routing, token by token in float64 Python: (ids [T, k], weights [T, k])."""
    G, used = groups
    ids, ws = [], []
    for row in np.asarray(logits, np.float64).tolist():
        E = len(row)
        if gating == "softmax":
            m = max(row)
            e = [math.exp(v - m) for v in row]
            p = [v / sum(e) for v in e]
        elif gating == "sigmoid":
            p = [1 / (1 + math.exp(-v)) for v in row]
        elif gating == "sqrt_softplus":
            p = [math.sqrt(v if v > 20 else math.log1p(math.exp(v))) for v in row]
        else:  # softmax_weight: the logits select, the softmax comes after the top-k
            p = list(row)
        sel = [p[e] + (0.0 if bias is None else float(bias[e])) for e in range(E)]
        allowed = range(E)
        if G > 1:
            n = E // G
            score = [sum(sorted(sel[g * n:(g + 1) * n], reverse=True)[:2]) for g in range(G)]
            kept = set(sorted(range(G), key=lambda g: (-score[g], g))[:used])
            allowed = [e for e in range(E) if e // n in kept]
        order = sorted(allowed, key=lambda e: (-sel[e], e))[:k]
        w = [p[e] for e in order]
        if gating == "softmax_weight":
            m = max(w)
            w = [math.exp(v - m) for v in w]
            w = [v / sum(w) for v in w]
        if norm:
            s = max(sum(w), 6.103515625e-5)
            w = [v / s for v in w]
        if scale not in (0.0, 1.0):
            w = [v * scale for v in w]
        ids.append(order)
        ws.append(w)
    return np.array(ids), np.array(ws)


def ops_with(fake_gguf, tensors: dict) -> NumpyOps:
    """NumpyOps over a fake file holding float32 ``tensors`` (name -> (ne, array))."""
    g = fake_gguf()
    for name, (ne, a) in tensors.items():
        g.add_tensor(name, ne, F32, np.ascontiguousarray(a, np.float32).tobytes())
    ops = NumpyOps()
    ops.attach(g)
    return ops


# (E, k, gating, norm, scale, bias magnitude or None, (G, G_used))
CASES = {
    "V3: sigmoid, bias, 8 groups": (64, 6, "sigmoid", True, 2.5, 0.2, (8, 3)),
    "V2: softmax, 8 groups, scale 16": (160, 6, "softmax", False, 16.0, None, (8, 3)),
    "V2-Lite: softmax, no groups": (64, 6, "softmax", False, 1.0, None, (0, 0)),
    "3 groups of 4, bias": (12, 3, "softmax", True, 0.0, 0.1, (3, 2)),
    "4 groups of 3, bias": (12, 5, "sigmoid", False, 1.5, 0.2, (4, 2)),
    "softmax_weight, 4 groups": (12, 2, "softmax_weight", True, 0.0, None, (4, 1)),
    "softmax_weight, not normalised": (12, 3, "softmax_weight", False, 0.0, None, (0, 0)),
    "sqrt_softplus, bias, one group": (37, 4, "sqrt_softplus", True, 1.5, 0.3, (1, 1)),
}


@pytest.mark.parametrize("label", list(CASES))
def test_twin_matches_llama_cpp_formula(label, rng, fake_gguf):
    E, k, gating, norm, scale, bias_mag, groups = CASES[label]
    T = 9
    logits = (rng.standard_normal((T, E)) * 2).astype(np.float32)
    bias = None if bias_mag is None else (rng.standard_normal(E) * bias_mag).astype(np.float32)
    ops = ops_with(fake_gguf, {} if bias is None else {"b": ((E,), bias)})
    w_bias = None if bias is None else ops.weight("b")
    ids, w = ops.moe_route(logits, k, gating, norm, scale, w_bias, groups)
    rids, rw = reference_route(logits, k, gating, norm, scale, bias, groups)
    assert ids.dtype == np.int32 and ids.shape == w.shape == (T, k)
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_allclose(w, rw, rtol=1e-6, atol=1e-7)
    # the bias and the groups must matter on these tokens, or the case proves nothing of them
    if bias is not None:
        assert not np.array_equal(ids, reference_route(logits, k, gating, norm, scale, None,
                                                       groups)[0]), "bias changed no selection"
    if groups[0] > 1:
        assert not np.array_equal(ids, reference_route(logits, k, gating, norm, scale, bias,
                                                       (0, 0))[0]), "groups changed no selection"


def test_bias_selects_but_does_not_weigh(fake_gguf):
    """A bias that moves expert 3 into the top 2: its weight is its unbiased prob."""
    logits = np.log(np.array([[4.0, 3.0, 2.0, 1.0]], np.float32))  # softmax: 0.4 0.3 0.2 0.1
    ops = ops_with(fake_gguf, {"b": ((4,), np.array([0, 0, 0, 0.5], np.float32))})
    ids, w = ops.moe_route(logits, 2, "softmax", False, 0.0, ops.weight("b"))
    assert ids.tolist() == [[3, 0]]
    np.testing.assert_allclose(w, [[0.1, 0.4]], rtol=1e-6)


def test_ties(fake_gguf):
    """Equal selection scores: the lower expert index first; equal group scores at the cut:
    the lower group index is kept (all sums exact in float32 and float64)."""
    logits = np.zeros((2, 16), np.float32)
    logits[1, [2, 9, 13]] = 1.0
    bias = np.array([0, .25, .25, 0, .5, 0, 0, .5, .25, .25, 0, 0, .5, 0, 0, .5], np.float32)
    ops = ops_with(fake_gguf, {"b": ((16,), bias)})
    # row 0: group scores 1.5 2 1.5 2 -> groups 1, 3 and (tie) 0; row 1: 1.73 2 1.73 2, the same
    ids, w = ops.moe_route(logits, 5, "sigmoid", True, 0.0, ops.weight("b"), (4, 3))
    assert ids.tolist() == [[4, 7, 12, 15, 1], [4, 7, 12, 15, 2]]
    rids, rw = reference_route(logits, 5, "sigmoid", True, 0.0, bias, (4, 3))
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_allclose(w, rw, rtol=1e-6)
    # all equal, no bias, two of four groups: groups 0 and 1, experts 0.. in order
    ids, _ = ops.moe_route(np.zeros((1, 16), np.float32), 6, "softmax", True, 0.0, None, (4, 2))
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5]]


BAD_GROUPS = [  # (E, k, groups): what llama.cpp refuses, and k beyond the kept experts
    (12, 2, (5, 2)),  # 5 does not divide 12
    (12, 2, (12, 3)),  # groups of one expert: no two largest
    (12, 2, (4, 0)),  # no group used
    (12, 2, (4, 4)),  # every group used
    (12, 4, (4, 1)),  # top-4 of the 3 experts of one group
    (12, 2, (-2, 1)),
]


@pytest.mark.parametrize("E,k,groups", BAD_GROUPS)
def test_twin_rejects_bad_groups(E, k, groups):
    with pytest.raises(ValueError, match=r"^moe_route: [^\n]*$"):
        NumpyOps().moe_route(np.zeros((2, E), np.float32), k, "softmax", True, 0.0, None, groups)


def test_twin_rejects_a_bias_of_another_size(fake_gguf):
    ops = ops_with(fake_gguf, {"b": ((11,), np.zeros(11))})
    with pytest.raises(ValueError, match=r"^moe_route: bias 'b' has 11 values, not 12$"):
        ops.moe_route(np.zeros((2, 12), np.float32), 2, "sigmoid", True, 0.0, ops.weight("b"))


class _NoDevice:
    """A CudaOps stand-in whose every use fails: the launcher must reject bad input before."""

    def __getattr__(self, name):
        raise AssertionError(f"the launcher used ops.{name} before rejecting its input")


@pytest.mark.parametrize("E,k,groups", BAD_GROUPS)
def test_launcher_rejects_bad_groups(E, k, groups):
    logits = SimpleNamespace(shape=(2, E), ptr=0)
    with pytest.raises(ValueError, match=r"^moe_route: [^\n]*$"):
        CudaOps.moe_route(_NoDevice(), logits, k, "softmax", True, 0.0, None, groups)


def test_launcher_rejects_a_bias_of_another_size():
    logits = SimpleNamespace(shape=(2, 12), ptr=0)
    bias = SimpleNamespace(ne=(11,), name="b")
    with pytest.raises(ValueError, match=r"^moe_route: bias 'b' has 11 values, not 12$"):
        CudaOps.moe_route(_NoDevice(), logits, 2, "sigmoid", True, 0.0, bias, (0, 0))


def test_moe_ffn_passes_bias_and_groups(rng, fake_gguf):
    """blocks.moe_ffn with a selection bias and groups vs a per-token loop over the reference
    routing."""
    D, F, E, k, T = 10, 6, 8, 3, 5
    arrs = {"r": rng.standard_normal((E, D)), "g": rng.standard_normal((E, F, D)) / 3,
            "u": rng.standard_normal((E, F, D)) / 3, "d": rng.standard_normal((E, D, F)) / 3,
            "b": rng.standard_normal(E) * 0.3}
    arrs = {n: a.astype(np.float32) for n, a in arrs.items()}
    ne = {"r": (D, E), "g": (D, F, E), "u": (D, F, E), "d": (F, D, E), "b": (E,)}
    ops = ops_with(fake_gguf, {n: (ne[n], a) for n, a in arrs.items()})
    W = {n: ops.weight(n) for n in arrs}
    x = rng.standard_normal((T, D)).astype(np.float32)
    y = blocks.moe_ffn(ops, x, W["r"], W["g"], W["u"], W["d"], k, "sigmoid", True, 2.5,
                       W["b"], (4, 2))
    logits = x.astype(np.float64) @ arrs["r"].T.astype(np.float64)
    rids, rw = reference_route(logits, k, "sigmoid", True, 2.5, arrs["b"], (4, 2))
    plain = reference_route(logits, k, "sigmoid", True, 2.5, None, (0, 0))[0]
    assert not np.array_equal(np.sort(rids), np.sort(plain)), "bias and groups changed nothing"

    def expert(e, v):
        g, u = arrs["g"][e] @ v, arrs["u"][e] @ v
        return arrs["d"][e] @ (g / (1 + np.exp(-g)) * u)

    for t in range(T):
        ref = sum(rw[t, j] * expert(rids[t, j], x[t]) for j in range(k))
        np.testing.assert_allclose(y[t], ref, rtol=1e-5, atol=1e-5)
