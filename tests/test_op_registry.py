"""The op registry (reflex_core.opreg) in CI: every registered op has a NumPy twin that runs on
its random cases (odd sizes, T = 1 and T > 64), deterministically and finitely; every op with a
CUDA launcher names kernel modules that exist; the core's Ops methods are all registered. The
CUDA side of the same cases runs on the GPU machine (tests/gpu/test_registered_ops_gpu.py)."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from reflex_core import opreg
from reflex_core.backends.cuda_backend import CudaOps
from reflex_core.backends.numpy_backend import NumpyOps
from reflex_core.gguf import open_gguf
from reflex_core.ops import Ops
from reflex_core.testing import op_harness

ROOT = Path(__file__).resolve().parent.parent
TESTOP = ROOT / "tests" / "plugins" / "testop"


@pytest.fixture(scope="module", autouse=True)
def testop_plugin():
    """The test plugin under tests/plugins/testop (an op with a kernel of its own), importable
    from the source tree and registered like an installed plugin."""
    import sys

    from reflex_core.registry import get_host

    sys.path.insert(0, str(TESTOP))
    from reflex_testop import plugin

    host = get_host()
    host.register(plugin, name="reflex-infer-testop")
    host.register_ops()
    yield
    host.unregister("reflex-infer-testop")
    opreg.unregister("testop_sigmoid_mul")
    sys.path.remove(str(TESTOP))


def op_ids():
    """The core's ops, the test plugin's and those of every installed plugin (CI installs all
    of plugins/*)."""
    from reflex_core.registry import get_host

    get_host().load_all()  # registers the installed plugins' ops
    names = [op.name for op in opreg.all_ops()]
    return names + [n for n in ("testop_sigmoid_mul",) if n not in names]


def cases_of(op):
    rng = np.random.default_rng(zlib.crc32(op.name.encode()))
    return opreg.resolve(op.cases)(rng)


def test_every_core_op_method_is_registered():
    """Nothing a forward pass calls escapes the registry (and so the generic GPU test)."""
    # weight_rows binds a view, as weight binds a tensor (tests/test_optional_tensors.py,
    # tests/gpu/test_optional_tensors_gpu.py)
    not_ops = {"attach", "weight", "weight_rows", "has_weight", "prepare", "shape", "view",
               "zeros", "empty", "clone", "copy_rows", "rows_to_bytes", "rows_from_bytes",
               "sample", "to_numpy", "synchronize", "from_numpy", "release", "wait_attached",
               "release_host_registration", "dequantize", "kernels", "f32_data", "merge_lora",
               "prepared_words", "sample_into", "put_words"}  # the last three: a decode
    # graph's chained steps
    methods = {n for n in vars(CudaOps) | vars(Ops) if not n.startswith("_")
               and callable(getattr(CudaOps, n))}
    registered = {op.name for op in opreg.CORE_OPS}
    assert methods - not_ops == registered


@pytest.mark.parametrize("name", op_ids())
def test_twin_runs_on_its_cases(name, tmp_path):
    op = opreg.get(name)
    assert op is not None and op.cases, f"op {name} has no cases for the generic tests"
    cases = cases_of(op)
    assert cases and {len(c.label) > 0 for c in cases} == {True}
    path = op_harness.write_weights(tmp_path / "w.gguf", op_harness.weights_of(cases))
    ops = NumpyOps()
    ops.attach(open_gguf(str(path)))
    twin = opreg.implementation(name, "cpu")
    for case in cases:
        r1, inplace1 = op_harness.run(ops, twin, case)
        r2, inplace2 = op_harness.run(ops, twin, case)
        op_harness.assert_close(r2, r1, case, "second run")  # deterministic
        flat = [r1] if not isinstance(r1, (tuple, list)) else list(r1)
        for a in flat + inplace1:
            if a is not None:
                assert np.isfinite(np.asarray(a, dtype=np.float64)).all(), case.label
        if case.expect is not None:
            op_harness.assert_close(r1, case.expect, case, "independent formula")
        if not case.result:
            assert r1 is None


@pytest.mark.parametrize("name", op_ids())
def test_cuda_launcher_and_kernel_modules_exist(name):
    op = opreg.get(name)
    assert op.cuda is not None, f"op {name} has no CUDA launcher"
    assert callable(opreg.resolve(op.cuda))
    if op.package == opreg.CORE_PACKAGE:
        src = ROOT / "cuda"
    else:  # a plugin of this tree: plugins/<dir>/<package>/ next to plugins/<dir>/cuda/
        dirs = [p.parent for p in [TESTOP / op.package, *ROOT.glob(f"plugins/*/{op.package}")]
                if p.is_dir()]
        assert len(dirs) == 1, f"{name}: no plugin folder holds package {op.package}"
        src = dirs[0] / "cuda"
    for module in op.kernels:
        assert (src / f"{module}.cu").is_file(), f"{name}: kernel module {module} missing"


def test_plugin_ops_dispatch_through_ops_attributes():
    ops = NumpyOps()
    x = np.array([[1.0, -2.0]], np.float32)
    np.testing.assert_allclose(ops.testop_sigmoid_mul(x, np.zeros_like(x)), x / 2)
    assert "reflex_testop" in opreg.kernel_packages()
    assert opreg.CORE_PACKAGE not in opreg.kernel_packages()
