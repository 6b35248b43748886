"""Run a registered op's cases (:class:`reflex_core.opreg.OpCase`) on a backend: the harness of
the generic op tests (tests/test_op_registry.py in CI, tests/gpu/test_registered_ops_gpu.py on
the GPU).

``attach_weights(ops_list, weights, path)`` writes the cases' weights into one GGUF (gguf-py's
writer) and attaches it to each backend; ``run(ops, fn, case)`` converts the NumPy arguments to
the backend (arrays, weights by name, prepared batches), calls ``fn(ops, *args)`` and returns
(result, in-place arguments) as NumPy.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import numpy as np

from .. import opreg
from ..opreg import BatchArg, OpCase, WeightArg


@contextmanager
def plugin_ops(plugin: Any, owner: str) -> Iterator[list[str]]:
    """The ops of a plugin's entry-point module (``plugin.OPS`` names them) in the registry for
    the duration; those that were not registered before are removed afterwards (other tests
    count the registered kernel packages). Yields the op names."""
    names = sorted(plugin.OPS)
    added = [n for n in names if opreg.get(n) is None]
    plugin.reflex_register_ops(register=lambda op: opreg.register(op, owner))
    try:
        yield names
    finally:
        for n in added:
            opreg.unregister(n)


def weights_of(cases: Iterable[OpCase]) -> dict[str, Any]:
    """Every WeightArg of ``cases`` by name (a name used twice must hold the same data)."""
    out: dict[str, Any] = {}

    def visit(a: Any) -> None:
        if isinstance(a, WeightArg):
            if a.name in out and out[a.name] is not a.data:
                raise ValueError(f"weight name {a.name!r} used for two tensors")
            out[a.name] = a.data
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    for c in cases:
        for a in c.args:
            visit(a)
    return out


def write_weights(path: Any, weights: dict[str, Any]) -> Any:
    """A GGUF at ``path`` holding ``weights`` (float32 arrays in NumPy order, or raw
    ``(bytes, ne, ggml_type)``); returns the path."""
    import gguf

    from ..gguf import GGML_TYPES

    w = gguf.GGUFWriter(str(path), "ops")
    for name, t in weights.items():
        if isinstance(t, tuple):
            raw, ne, ggml_type = t
            info = GGML_TYPES[ggml_type]
            row_bytes = ne[0] // info.block_size * info.type_size
            arr = np.frombuffer(bytes(raw), np.uint8).reshape(tuple(reversed(tuple(ne[1:])))
                                                               + (row_bytes,))
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(ggml_type))
        else:
            w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _to_backend(ops: Any, a: Any) -> Any:
    if isinstance(a, WeightArg):
        return ops.weight(a.name)
    if isinstance(a, BatchArg):
        return ops.prepare(a.batch)
    if isinstance(a, np.ndarray):
        return ops.from_numpy(a) if hasattr(ops, "from_numpy") else a.copy()
    if isinstance(a, list) and a and all(isinstance(x, WeightArg) for x in a):
        return [ops.weight(x.name) for x in a]
    return a


def to_numpy(ops: Any, r: Any) -> Any:
    """A result as NumPy: arrays, tuples of arrays, lists of numbers, None."""
    if r is None or isinstance(r, (int, float)):
        return r
    if isinstance(r, tuple):
        return tuple(to_numpy(ops, x) for x in r)
    if isinstance(r, list) and (not r or isinstance(r[0], (int, float))):
        return np.asarray(r)
    if isinstance(r, list):
        return [to_numpy(ops, x) for x in r]
    return np.asarray(ops.to_numpy(r))


def run(ops: Any, fn: Any, case: OpCase) -> tuple[Any, list]:
    """``fn(ops, *args)`` on ``ops`` with the case's arguments converted; returns (result,
    [the arguments listed in ``case.compare``, after the call]) as NumPy."""
    args = [_to_backend(ops, a) for a in case.args]
    r = fn(ops, *args, **case.kwargs)
    ops.synchronize()
    return to_numpy(ops, r), [to_numpy(ops, args[i]) for i in case.compare]


def assert_close(got: Any, want: Any, case: OpCase, what: str) -> None:
    """Equal within the case's tolerance, structure by structure."""
    if isinstance(want, (tuple, list)) and not isinstance(want, np.ndarray):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), (what, case.label)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, case, f"{what}[{i}]")
        return
    if want is None:
        assert got is None, (what, case.label)
        return
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape, f"{case.label} {what}: shape {g.shape} != {w.shape}"
    if w.dtype.kind in "iub":
        np.testing.assert_array_equal(g, w, err_msg=f"{case.label} {what}")
    else:
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.label} {what}")


class KVBuffers:
    """K and V state buffers of ``n_layers`` attention layers on ``ops`` (zeroed), as a State
    holds them: ``k[layer]`` ``[n_cells, H_kv, d_k]``, ``v[layer]`` ``[n_cells, H_kv, d_v]``
    (op tests that need a cache without a model)."""

    def __init__(self, ops: Any, n_layers: int, n_cells: int, n_kv_heads: int, head_dim_k: int,
                 head_dim_v: int):
        self.k = [ops.zeros((n_cells, n_kv_heads, head_dim_k)) for _ in range(n_layers)]
        self.v = [ops.zeros((n_cells, n_kv_heads, head_dim_v)) for _ in range(n_layers)]
