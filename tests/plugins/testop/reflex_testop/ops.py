"""The plugin's op ``testop_sigmoid_mul(x, g) = x * sigmoid(g)``: NumPy twin, CUDA launcher,
random cases for the generic op tests."""

from __future__ import annotations


def sigmoid_mul_twin(ops, x, g):
    import numpy as np

    x = np.asarray(x, np.float32)
    g = np.asarray(g, np.float32)
    if x.shape != g.shape:
        raise ValueError(f"testop_sigmoid_mul: shapes {x.shape} and {g.shape} differ")
    with np.errstate(over="ignore"):
        return (x / (np.float32(1) + np.exp(-g))).astype(np.float32)


def sigmoid_mul_cuda(ops, x, g):
    if x.shape != g.shape:
        raise ValueError(f"testop_sigmoid_mul: shapes {x.shape} and {g.shape} differ")
    y = ops.empty(x.shape)
    n = x.size
    if n:
        ops.kernels("reflex_testop", "testop").launch(
            "reflex_testop_sigmoid_mul", (n + 255) // 256, 256, (x.ptr, g.ptr, y.ptr, n))
    return y


def sigmoid_mul_cases(rng):
    import numpy as np

    from reflex_core.plugin_api import OpCase

    out = []
    for T, n in ((1, 7), (67, 129), (3, 1000)):
        x = rng.standard_normal((T, n)).astype(np.float32) * 3
        g = rng.standard_normal((T, n)).astype(np.float32) * 4
        want = (x.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))))
        out.append(OpCase(f"T={T} n={n}", (x, g), rtol=1e-6, atol=1e-6,
                          expect=want.astype(np.float32)))
    return out
