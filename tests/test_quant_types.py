"""Every GGML type the CUDA kernels serve is served by the NumPy reference too, with the same
block geometry in the project's one type table.

* reflex_core.ggml_types gives each CUDA-supported type gguf-py's block size and bytes per block;
* NumpyOps' type probe accepts each of them, and its dequantization is gguf.quants' (what the
  CUDA decoders match bit for bit, tests/test_quant_host.py) on random blocks;
* GGML types without a decoder (Q8_1 and Q8_K, activation-only types; Q1_0 and Q2_0, which
  gguf-py cannot dequantize) are refused by both (one-line errors).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from reflex_core.backends import numpy_backend
from reflex_core.cuda import quant_ops
from reflex_core.errors import UnsupportedTensorType
from reflex_core.ggml_types import GGML_TYPES

CUDA_TYPES = sorted(quant_ops.SUPPORTED_TYPES)


def test_the_new_types_are_served():
    names = {GGML_TYPES[t].name for t in CUDA_TYPES}
    assert {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S",
            "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"} <= names


@pytest.mark.parametrize("t", CUDA_TYPES, ids=[GGML_TYPES[t].name for t in CUDA_TYPES])
def test_numpy_backend_serves_every_cuda_type(t):
    info = GGML_TYPES[t]
    qt = GGMLQuantizationType(t)
    assert (info.block_size, info.type_size) == tuple(GGML_QUANT_SIZES[qt])
    assert numpy_backend.type_supported(t)
    rng = np.random.default_rng(t)
    raw = rng.integers(0, 256, size=(3, 4 * info.type_size), dtype=np.uint8)  # NaNs, infs too
    with np.errstate(over="ignore", invalid="ignore"):
        want = dequantize(raw, qt).reshape(3, -1)
        got = numpy_backend.dequantize_rows(raw, t)
    assert got.shape == (3, 4 * info.block_size) and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), np.ascontiguousarray(want, np.float32).view(np.uint32))


@pytest.mark.parametrize("t", [9, 15, 41, 42])  # Q8_1, Q8_K, Q1_0, Q2_0
def test_types_served_by_neither(t):
    assert not numpy_backend.type_supported(t)
    with pytest.raises(UnsupportedTensorType, match="not supported by the CUDA backend"):
        quant_ops.type_name(t)
