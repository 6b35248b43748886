"""Issue 12: the CUDA backend checks a tensor's byte size against its shape and type, and that
its bytes lie inside the uploaded region, as the CPU backend does -- so an inconsistent tensor
directory (from a crafted or stale cache) is a ModelError, not a kernel reading other memory.

Runs without a GPU: the check is a pure function (``weight_offset``) that ``CudaOps.weight``
uses, exercised here on crafted TensorInfo values and through ``weight`` on a CudaOps that was
never attached to a device (its blob address is only a number).
"""

from __future__ import annotations

import pytest

from reflex_core.backends.cuda_backend import CudaOps
from reflex_core.errors import ModelError
from reflex_core.gguf import TensorInfo

Q8_0, F32 = 8, 0  # Q8_0: 32 elements in 34 bytes
START, SIZE = 4096, 1024  # the uploaded region of the file: [4096, 5120)


def info(name="w", ne=(64, 2), ggml_type=Q8_0, offset=START + 64, nbytes=136):
    return TensorInfo(name, ne, ggml_type, offset, nbytes)


def test_weight_offset_accepts_a_consistent_tensor():
    from reflex_core.backends.cuda_backend import weight_offset

    assert weight_offset(info(), Q8_0, (64, 2), START, SIZE) == 64
    last = info(ne=(4,), ggml_type=F32, offset=START + SIZE - 16, nbytes=16)
    assert weight_offset(last, F32, (4,), START, SIZE) == SIZE - 16  # ends at the region's end
    scalar = info(ne=(), ggml_type=F32, offset=START, nbytes=4)
    assert weight_offset(scalar, F32, (), START, SIZE) == 0


@pytest.mark.parametrize("bad, match", [
    (info(nbytes=135), r"'w': 135 bytes of data, expected 136"),  # size differs from the shape
    (info(nbytes=34 * 4 * 2), "272 bytes of data, expected 136"),
    (info(offset=START - 32), r"lies outside the file's tensor data \[4096, 5120\)"),  # before
    (info(offset=START + SIZE - 128), "lies outside"),  # runs past the end
    (info(offset=START + 2 ** 40), "lies outside"),
    (info(ne=(48, 2)), "row length 48 is not a multiple of the Q8_0 block size 32"),
])
def test_weight_offset_refuses_inconsistent_tensors(bad, match):
    from reflex_core.backends.cuda_backend import weight_offset

    with pytest.raises(ModelError, match=match):
        weight_offset(bad, bad.ggml_type, bad.ne, START, SIZE)


def test_tensor_region_stops_at_the_end_of_the_file():
    from reflex_core.backends.cuda_backend import tensor_region

    tensors = [info(offset=START, nbytes=136), info(offset=START + 160, nbytes=136)]
    assert tensor_region(tensors, START, 100_000) == (START, 296)
    # a directory that claims bytes past the end of the file: the upload stops there
    assert tensor_region(tensors + [info(offset=9000, nbytes=136)], START, 9050) == (START, 4954)
    assert tensor_region([], START, 100_000) == (START, 0)


class _File:
    """Just what CudaOps.weight reads of an attached file."""

    def __init__(self, *infos):
        self.tensors = {t.name: t for t in infos}


def _attached(*infos) -> CudaOps:
    """A CudaOps as attach() leaves it, without a device: the blob is an address only."""
    ops = CudaOps.__new__(CudaOps)
    ops.gguf = _File(*infos)
    ops._weights, ops._blob, ops._data_offset, ops._blob_size = {}, 1 << 40, START, SIZE
    return ops


def test_cuda_weight_checks_size_and_region():
    good = info("good")
    ops = _attached(good, info("short", nbytes=100), info("before", offset=START - 136),
                    info("past", offset=START + SIZE - 64))
    w = ops.weight("good")
    assert w.data == (1 << 40) + 64 and w.ne == (64, 2)
    with pytest.raises(ModelError, match=r"'short': 100 bytes of data, expected 136"):
        ops.weight("short")
    for name in ("before", "past"):
        with pytest.raises(ModelError, match=f"'{name}'.*lies outside"):
            ops.weight(name)
