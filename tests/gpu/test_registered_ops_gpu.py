"""Every registered op (the core's, the test plugin's and every installed plugin's) on the GPU
against its NumPy twin, on the op's own random cases (reflex_core.opreg: odd sizes, T = 1 and
T > 64; the Qwen3.5 recurrent ops also T = 7, 64 and 600)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from reflex_core import opreg
from reflex_core.gguf import open_gguf
from reflex_core.testing import op_harness



def _names() -> list[str]:
    from reflex_core.registry import get_host

    get_host().load_all()  # registers the installed plugins' ops
    names = [op.name for op in opreg.all_ops()]
    return names + [n for n in ("testop_sigmoid_mul",) if n not in names]


NAMES = _names()


@pytest.mark.parametrize("name", NAMES)
def test_cuda_op_matches_its_twin(name, testop_plugin, cuda_ops, ref_ops, tmp_path):
    op = opreg.get(name)
    cases = opreg.resolve(op.cases)(np.random.default_rng(zlib.crc32(name.encode())))
    path = op_harness.write_weights(tmp_path / "w.gguf", op_harness.weights_of(cases))
    g = open_gguf(str(path))
    cuda_ops.attach(g)
    ref_ops.attach(g)
    twin, launcher = opreg.implementation(name, "cpu"), opreg.implementation(name, "cuda")
    for case in cases:
        want, want_inplace = op_harness.run(ref_ops, twin, case)
        got, got_inplace = op_harness.run(cuda_ops, launcher, case)
        if case.result:
            op_harness.assert_close(got, want, case, "result")
        for i, (a, b) in zip(case.compare, zip(got_inplace, want_inplace)):
            op_harness.assert_close(a, b, case, f"argument {i}")
