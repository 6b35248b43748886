"""Random inputs for the core's registered ops (:data:`reflex_core.opreg.CORE_OPS`): the cases
the generic op tests run on every backend (tests/test_op_registry.py runs the twins in CI,
tests/gpu/test_registered_ops_gpu.py compares the CUDA launchers with them). Odd sizes, T = 1 and a T
above 64 (the tiled/batched kernel paths) for every op. Imports NumPy: tests only."""

from __future__ import annotations

import numpy as np

from ..ops import AttnMask, Batch, RopeParams
from ..opreg import BatchArg, OpCase, WeightArg

TS = (1, 67)  # one token (GEMV / decode paths) and more than 64 (tiled / prefill paths)


def _f(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _q8(rng, n_out, n_in):
    """A random Q8_0 weight of ne [n_in, n_out] (n_in a multiple of 32)."""
    import gguf
    from gguf import quants

    raw = quants.quantize(_f(rng, n_out, n_in), gguf.GGMLQuantizationType.Q8_0)
    return (raw.tobytes(), (n_in, n_out), 8)


def _causal(T, cell0=0):
    return BatchArg(Batch.causal(list(range(T)), cell0))


def embed(rng):
    out = []
    for T in TS:
        toks = rng.integers(0, 37, T).tolist()
        b = BatchArg(Batch(tuple(toks), tuple(range(T)), 0, AttnMask.causal(0, T)))
        out.append(OpCase(f"f32 T={T}", (WeightArg(f"e{T}", _f(rng, 37, 45)), b), rtol=0, atol=0))
        out.append(OpCase(f"q8_0 T={T}", (WeightArg(f"eq{T}", _q8(rng, 37, 96)), b), rtol=0, atol=0))
    return out


def matmul(rng):
    out = []
    for T in TS:
        out.append(OpCase(f"f32 T={T}", (_f(rng, T, 72), WeightArg(f"w{T}", _f(rng, 45, 72))),
                          rtol=1e-4, atol=1e-4))
        out.append(OpCase(f"q8_0 T={T}", (_f(rng, T, 96), WeightArg(f"wq{T}", _q8(rng, 45, 96))),
                          rtol=1e-4, atol=1e-4))
    return out


def matmul_many(rng):
    return [OpCase(f"q/k/v T={T}", (_f(rng, T, 96), [WeightArg(f"q{T}", _q8(rng, 48, 96)),
                                                     WeightArg(f"k{T}", _q8(rng, 16, 96)),
                                                     WeightArg(f"v{T}", _f(rng, 24, 96))]),
                   rtol=1e-4, atol=1e-4) for T in TS]


def matmul_swiglu(rng):
    # atol: at T = 67 the tiled kernel's 3xTF32 products round to about 2^-21 of each product,
    # several times f32's 2^-24; gate and up (each a sum of 96 products of about unit size) carry
    # ~1e-4 of that, and silu(g) * u multiplies it by values up to ~10 -- where the output is a
    # small difference, that is ~5e-4 absolute. A wrong weight or row moves outputs by O(1).
    return [OpCase(f"T={T}", (_f(rng, T, 96), WeightArg(f"g{T}", _q8(rng, 53, 96)),
                              WeightArg(f"u{T}", _q8(rng, 53, 96))), rtol=1e-4, atol=2e-3)
            for T in TS]


def rmsnorm(rng):
    out = []
    for T in TS:
        out.append(OpCase(f"w T={T}", (_f(rng, T, 133, scale=3), WeightArg(f"n{T}", _f(rng, 133)),
                                       1e-6)))
        out.append(OpCase(f"no w T={T}", (_f(rng, T, 5000), None, 1e-5)))
    return out


def add_rmsnorm(rng):
    return [OpCase(f"T={T}", (_f(rng, T, 133), _f(rng, T, 133), WeightArg(f"n{T}", _f(rng, 133)),
                              1e-6)) for T in TS]


def _rope_params(ext):
    return RopeParams(n_rot=24, mode="neox", freq_base=1e6, freq_scale=0.25 if ext else 1.0,
                      ext_factor=1.0 if ext else 0.0, n_ctx_orig=64 if ext else 0)


def rope(rng):
    out = []
    for T in TS:
        pos = tuple(int(p) for p in rng.integers(0, 4000, T))
        b = BatchArg(Batch(tuple(range(T)), pos, 0, AttnMask.causal(0, T)))
        for mode in ("neox", "norm"):
            p = RopeParams(n_rot=24, mode=mode, freq_base=1e6)
            out.append(OpCase(f"{mode} T={T}", (_f(rng, T, 3, 30), b, p), rtol=1e-4, atol=1e-4))
        out.append(OpCase(f"yarn T={T}", (_f(rng, T, 3, 30), b, _rope_params(True)),
                          rtol=1e-4, atol=1e-4))
    return out


def kv_write(rng):
    return [OpCase(f"T={T}", (np.zeros((T + 9, 3, 10), np.float32),
                              np.zeros((T + 9, 3, 7), np.float32), _f(rng, T, 3, 10),
                              _f(rng, T, 3, 7), _causal(T, 5)),
                   compare=(0, 1), result=False, rtol=0, atol=0) for T in TS]


def qk_norm_rope_store(rng):
    out = []
    for T in TS:
        H, Hkv, d, dv = 6, 2, 32, 24
        args = (_f(rng, T, H, d, scale=2), _f(rng, T, Hkv, d, scale=2), _f(rng, T, Hkv, dv),
                WeightArg(f"qn{T}", 1 + _f(rng, d, scale=0.3)), WeightArg(f"kn{T}", 1 + _f(rng, d, scale=0.3)),
                1e-6, _causal(T, 3), RopeParams(n_rot=d, mode="neox", freq_base=1e6),
                np.zeros((T + 4, Hkv, d), np.float32), np.zeros((T + 4, Hkv, dv), np.float32))
        out.append(OpCase(f"T={T}", args, compare=(8, 9), rtol=2e-5, atol=2e-5))
    return out


def rope_attention(rng):
    out = []
    for T in TS:
        H, Hkv, d, dv, n_prev = 6, 2, 32, 24, 5
        n = n_prev + T + 2
        K, V = _f(rng, n, Hkv, d), _f(rng, n, Hkv, dv)
        K[n_prev:], V[n_prev:] = 0, 0
        args = (_f(rng, T, H, d, scale=2), _f(rng, T, Hkv, d, scale=2), _f(rng, T, Hkv, dv),
                WeightArg(f"rqn{T}", 1 + _f(rng, d, scale=0.3)),
                WeightArg(f"rkn{T}", 1 + _f(rng, d, scale=0.3)), 1e-6, _causal(T, n_prev),
                RopeParams(n_rot=d, mode="neox", freq_base=1e6), K, V, 0.2)
        out.append(OpCase(f"T={T}", args, compare=(8, 9), rtol=2e-5, atol=2e-5))
    return out


def attention(rng):
    out = []
    for T in TS:
        n_prev = 5
        n = n_prev + T + 2
        K, V = _f(rng, n, 2, 40), _f(rng, n, 2, 24)
        out.append(OpCase(f"causal T={T}", (_f(rng, T, 6, 40), K, V, _causal(T, n_prev), 0.15),
                          rtol=2e-5, atol=2e-5))
    # the system1 tree: a prompt of 4 and two candidates of 3 and 2 tokens
    P = 4
    pe = tuple(range(1, P + 1)) + (P,) * 5
    os_ = (0,) * P + (4, 4, 4, 7, 7)
    oe = (0,) * P + (5, 6, 7, 8, 9)
    tree = BatchArg(Batch(tuple(range(9)), (0, 1, 2, 3, 4, 5, 6, 4, 5), 0, AttnMask(pe, os_, oe)))
    out.append(OpCase("tree", (_f(rng, 9, 4, 16), _f(rng, 9, 1, 16), _f(rng, 9, 1, 16), tree, 0.25),
                      rtol=2e-5, atol=2e-5))
    return out


def swiglu(rng):
    return [OpCase(f"T={T}", (_f(rng, T, 77, scale=4), _f(rng, T, 77)), rtol=1e-5, atol=1e-6)
            for T in TS]


def add(rng):
    return [OpCase(f"T={T}", (_f(rng, T, 77), _f(rng, T, 77)), rtol=0, atol=0) for T in TS]


def add_bias(rng):
    out = [OpCase(f"T={T}", (_f(rng, T, 77), WeightArg(f"b{T}", _f(rng, 77))), rtol=0, atol=0)
           for T in TS]
    # the middle of a longer vector (a fused q/k/v bias)
    return out + [OpCase(f"offset T={T}", (_f(rng, T, 33), WeightArg(f"bo{T}", _f(rng, 101)), 45),
                         rtol=0, atol=0) for T in TS]


def take_rows(rng):
    return [OpCase("gather", (_f(rng, 70, 33), [3, 69, 0, 3]), rtol=0, atol=0),
            OpCase("run", (_f(rng, 70, 33), [4, 5, 6]), rtol=0, atol=0)]


def moe_route(rng):
    out = []
    for T in TS:
        for gating in ("softmax", "sigmoid"):
            out.append(OpCase(f"{gating} T={T}", (_f(rng, T, 37, scale=2), 5, gating, True, 0.0),
                              rtol=1e-5, atol=1e-6))
        out.append(OpCase(f"scaled T={T}", (_f(rng, T, 37, scale=2), 3, "softmax", False, 2.5),
                          rtol=1e-5, atol=1e-6))
        # DeepSeek routing: the selection bias (exp_probs_b) and group-limited top-k
        out.append(OpCase(f"V3 sigmoid bias 8 groups T={T}",
                          (_f(rng, T, 64, scale=2), 6, "sigmoid", True, 2.5,
                           WeightArg(f"bias64_{T}", _f(rng, 64, scale=0.2)), (8, 3)),
                          rtol=1e-5, atol=1e-6))
        out.append(OpCase(f"softmax bias 3 groups of 4 T={T}",
                          (_f(rng, T, 12, scale=2), 3, "softmax", False, 0.0,
                           WeightArg(f"bias12_{T}", _f(rng, 12, scale=0.1)), (3, 2)),
                          rtol=1e-5, atol=1e-6))
        out.append(OpCase(f"softmax_weight 4 groups of 3 T={T}",
                          (_f(rng, T, 12, scale=2), 2, "softmax_weight", True, 0.0, None, (4, 1)),
                          rtol=1e-5, atol=1e-6))
        out.append(OpCase(f"sqrt_softplus bias T={T}",
                          (_f(rng, T, 37, scale=2), 4, "sqrt_softplus", True, 1.5,
                           WeightArg(f"bias37_{T}", _f(rng, 37, scale=0.3))),
                          rtol=1e-5, atol=1e-6))
    # ties everywhere (the sums are exact in float32): equal sel within groups and across them,
    # and two groups of equal score at the cut of the kept three
    ties = np.zeros((2, 16), np.float32)
    ties[1, [2, 9, 13]] = 1.0
    bias = np.array([0, .25, .25, 0, .5, 0, 0, .5, .25, .25, 0, 0, .5, 0, 0, .5], np.float32)
    out.append(OpCase("ties sigmoid bias 4 groups",
                      (ties, 5, "sigmoid", True, 0.0, WeightArg("bias16", bias), (4, 3)),
                      rtol=1e-5, atol=1e-6))
    return out


def _ids(rng, T, k, E):
    return np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)


def moe_matmul(rng):
    out = []
    for T in TS:
        ids = _ids(rng, T, 3, 5)
        out.append(OpCase(f"shared x T={T}", (_f(rng, T, 64), WeightArg(f"x{T}", _f(rng, 5, 40, 64)),
                                              ids), rtol=1e-4, atol=1e-4))
        out.append(OpCase(f"per expert T={T}", (_f(rng, T, 3, 64),
                                                WeightArg(f"xe{T}", _f(rng, 5, 40, 64)), ids),
                          rtol=1e-4, atol=1e-4))
    return out


def moe_matmul_swiglu(rng):
    return [OpCase(f"T={T}", (_f(rng, T, 64), WeightArg(f"g{T}", _f(rng, 5, 40, 64)),
                              WeightArg(f"u{T}", _f(rng, 5, 40, 64)), _ids(rng, T, 2, 5)),
                   rtol=1e-4, atol=1e-4) for T in TS]


def moe_combine(rng):
    return [OpCase(f"T={T}", (_f(rng, T, 3, 45), _f(rng, T, 3)), rtol=1e-5, atol=1e-5)
            for T in TS]


def argmax(rng):
    return [OpCase(f"rows={T}", (_f(rng, T, 1001),), rtol=0, atol=0) for T in TS]


def token_logprobs(rng):
    return [OpCase(f"rows={T}", (_f(rng, T, 1001, scale=4), rng.integers(0, 1001, T).tolist()),
                   rtol=1e-6, atol=1e-6) for T in TS]


def repeat_penalty(rng):
    """In place on the last row; ids repeated and at both ends of the row, logits of both
    signs and zeros; float32 arithmetic either side, so exact."""
    out = []
    for T in TS:
        x = _f(rng, T, 1001, scale=4)
        x[-1, rng.integers(0, 1001, 20)] = 0.0
        ids = rng.integers(0, 1001, 300).tolist() + [0, 1000, 0]
        out.append(OpCase(f"rows={T}", (x, ids, 1.3), compare=(0,), rtol=0, atol=0,
                          result=False))
    out.append(OpCase("penalty < 1", (_f(rng, 1, 37), [3, 5, 3, 36], 0.5), compare=(0,),
                      rtol=0, atol=0, result=False))
    return out
