"""Every plugin op's CUDA launcher, without a GPU: run on each of the op's own random cases against
recording stand-ins of the device, each launch is checked against the kernel's real parameter
signature (the build's parser on the plugin's preprocessed module, what its manifest holds: a
wrong count or type fails to pack) and its grid and block against CUDA's limits, and the arrays it
returns must have the shapes its NumPy twin's results have on the same case.

What only the GPU can tell (the kernels' numbers) is tests/gpu/test_registered_ops_gpu.py's; this
catches a launcher that passes the wrong arguments before a GPU is at hand. Needs nvcc (CI has
it); without it the test fails, never skips.
"""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reflex_core import opreg
from reflex_core.backends.device_array import Prepared
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.gguf import open_gguf
from reflex_core.testing import op_harness
from reflex_core.testing.op_harness import BatchArg, WeightArg
from test_quant_host import _FakeKernels, _nvcc

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = {"reflex_qwen35_hybrid": ROOT / "plugins" / "qwen35_hybrid",
           "reflex_deepseek_mla": ROOT / "plugins" / "deepseek_mla"}
GRID_MAX = (2**31 - 1, 65535, 65535)


@pytest.fixture(scope="module")
def signatures() -> dict[tuple[str, str], dict[str, str]]:
    """(package, module) -> kernel name -> signature, for every plugin module."""
    from reflex_core import _build

    nvcc = _nvcc("cannot preprocess the plugins' CUDA modules")
    out = {}
    for pkg, root in PLUGINS.items():
        for cu in sorted((root / "cuda").glob("*.cu")):
            out[(pkg, cu.stem)] = _build.module_signatures(
                nvcc, cu, [ROOT / "cuda" / "include", root / "cuda"], 90)
    return out


class _Array:
    """A device array stand-in: an address and a shape."""

    def __init__(self, ptr: int, shape: tuple, dtype: str = "f32"):
        self.ptr, self.shape, self.dtype = ptr, tuple(int(v) for v in shape), dtype
        self.n = int(np.prod(self.shape)) if self.shape else 1


class _Weight:
    def __init__(self, name: str, ne: tuple, ggml_type: int, ptr: int):
        self.name, self.ne, self.ggml_type, self.ptr = name, tuple(ne), ggml_type, ptr


class _DryOps:
    """What a plugin launcher asks of CudaOps, recording its launches."""

    def __init__(self, signatures, gguf):
        self._sigs, self._gguf = signatures, gguf
        self._addr = itertools.count(1 << 20, 1 << 20)
        self._kernels: dict[tuple[str, str], _FakeKernels] = {}

    def launches(self) -> list[tuple]:
        """(name, grid, block, args) of every launch so far, module by module."""
        return [c for k in self._kernels.values() for c in k.calls]

    def empty(self, shape, dtype="f32"):
        return _Array(next(self._addr), shape, dtype)

    def from_numpy(self, a):
        return _Array(next(self._addr), np.shape(a), "i32" if a.dtype.kind in "iu" else "f32")

    def kernels(self, package, module):
        key = (package, module)
        if key not in self._kernels:
            self._kernels[key] = _FakeKernels(self._sigs[key])
        return self._kernels[key]

    def weight(self, name):
        t = self._gguf.tensors[name]
        return _Weight(name, t.ne, t.ggml_type, next(self._addr))

    def f32_data(self, w):
        return w.ptr

    def prepare(self, batch):
        return Prepared(batch, _Array(next(self._addr), (32 * max(batch.n_tokens, 1) + 64,),
                                      "i32"), len(batch.runs))

    def to_numpy(self, x):
        raise AssertionError("a launcher read device memory back")

    def synchronize(self):
        pass


def _shapes(r: Any) -> Any:
    if r is None or isinstance(r, (int, float)):
        return r
    if isinstance(r, (tuple, list)):
        return tuple(_shapes(x) for x in r)
    return tuple(np.shape(r)) if isinstance(r, np.ndarray) else r.shape


def _plugin_ops() -> list[str]:
    from reflex_core.registry import get_host

    get_host().load_all()
    return sorted(op.name for op in opreg.all_ops()
                  if op.package in PLUGINS and op.cuda is not None)


OPS = _plugin_ops()


def test_every_plugin_with_kernels_has_ops_here():
    assert {opreg.get(n).package for n in OPS} == set(PLUGINS)
    assert "mla_query_temperature" in OPS and "qwen35_delta_rule" in OPS


@pytest.mark.parametrize("name", OPS)
def test_launcher_fits_its_kernels_and_its_twins_shapes(name, signatures, tmp_path):
    op = opreg.get(name)
    cases = opreg.resolve(op.cases)(np.random.default_rng(zlib.crc32(name.encode())))
    path = op_harness.write_weights(tmp_path / "w.gguf", op_harness.weights_of(cases))
    g = open_gguf(str(path))
    ref_ops = NumpyOps()
    ref_ops.attach(g)
    twin, launcher = opreg.implementation(name, "cpu"), opreg.implementation(name, "cuda")
    for case in cases:
        want, _ = op_harness.run(ref_ops, twin, case)
        dry = _DryOps(signatures, g)
        args = [dry.weight(a.name) if isinstance(a, WeightArg)
                else dry.prepare(a.batch) if isinstance(a, BatchArg)
                else dry.from_numpy(a) if isinstance(a, np.ndarray)
                else [dry.weight(x.name) for x in a] if isinstance(a, list) and a
                and all(isinstance(x, WeightArg) for x in a)
                else a for a in case.args]
        got = launcher(dry, *args, **case.kwargs)
        launches = dry.launches()
        assert launches, f"{case.label}: no kernel launched"
        for kernel, grid, block, _ in launches:
            assert all(1 <= g <= m for g, m in zip(grid, GRID_MAX)), (kernel, grid)
            assert all(b >= 1 for b in block) and np.prod(block) <= 1024, (kernel, block)
        if case.result:
            assert _shapes(got) == _shapes(want), (case.label, _shapes(got), _shapes(want))
