"""The GGML tensor types and the GGUF metadata value types: the project's one table of each.

Stdlib only (the GGUF reader, the backends and the checks all read it on the cold path).
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import GGUFError


class GGMLType(NamedTuple):
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


# id -> (name, elements per block, bytes per block); ggml.h / ggml-common.h. Q8_1 is 36 bytes
# (gguf 0.19.0 says 40, wrong). Removed ids (4, 5, 31-33, 36-38) are unknown on purpose.
GGML_TYPES: dict[int, GGMLType] = {
    i: GGMLType(*v) for i, v in {
        0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
        6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
        10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
        13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
        16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
        19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
        22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
        26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
        30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
        39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
    }.items()
}
GGML_TYPE_IDS: dict[str, int] = {t.name: i for i, t in GGML_TYPES.items()}


def tensor_nbytes(ne, ggml_type: int) -> int:
    """Bytes of a dense tensor with shape `ne` (GGUF order, innermost first) of `ggml_type`."""
    t = GGML_TYPES.get(ggml_type)
    if t is None:
        raise GGUFError(f"unknown GGML type id {ggml_type}")
    n = 1
    for d in ne:
        n *= d
    ne0 = ne[0] if len(ne) else 1
    if ne0 % t.block_size:
        raise GGUFError(f"{t.name} tensor row of {ne0} elements is not a multiple of the "
                        f"block size {t.block_size}")
    return n // t.block_size * t.type_size


# GGUF metadata value types
GGUF_TYPE_UINT8 = 0
GGUF_TYPE_INT8 = 1
GGUF_TYPE_UINT16 = 2
GGUF_TYPE_INT16 = 3
GGUF_TYPE_UINT32 = 4
GGUF_TYPE_INT32 = 5
GGUF_TYPE_FLOAT32 = 6
GGUF_TYPE_BOOL = 7
GGUF_TYPE_STRING = 8
GGUF_TYPE_ARRAY = 9
GGUF_TYPE_UINT64 = 10
GGUF_TYPE_INT64 = 11
GGUF_TYPE_FLOAT64 = 12
VALUE_TYPES: dict[str, int] = {
    "UINT8": 0, "INT8": 1, "UINT16": 2, "INT16": 3, "UINT32": 4, "INT32": 5, "FLOAT32": 6,
    "BOOL": 7, "STRING": 8, "ARRAY": 9, "UINT64": 10, "INT64": 11, "FLOAT64": 12,
}
VALUE_TYPE_NAMES: dict[int, str] = {v: k for k, v in VALUE_TYPES.items()}
UNSIGNED_INT_TYPES = frozenset((GGUF_TYPE_UINT8, GGUF_TYPE_UINT16, GGUF_TYPE_UINT32,
                                GGUF_TYPE_UINT64))
