"""GGUF LoRA adapters for tests, written with gguf-py's GGUFWriter (spec §12 layout).

    pairs = random_pairs(base_path, ["blk.0.attn_q.weight", "token_embd.weight"], rank=4, seed=0)
    write_adapter(path, "qwen3", pairs, alpha=8.0)

``pairs`` maps a base tensor name to ``(A, B)`` in NumPy order: ``A (r, n_in)``, ``B (n_out, r)``
(expert tensors ``(E, r, n_in)`` / ``(E, n_out, r)``); for ``token_embd.weight`` ``A (V, r)``,
``B (D, r)``. :func:`merged_reference` is the merge written out plainly from those arrays (the
definition the backends' ``merge_lora`` must meet). numpy and gguf are imported where used: a
module of reflex_core that imports them at module level must be listed in
tests/test_import_graph.py.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from ..gguf import open_gguf

if TYPE_CHECKING:
    import numpy as np

EMBEDDING = "token_embd.weight"


def random_pairs(base_path: str | os.PathLike, targets: list[str], rank: int, seed: int,
                 sigma: float = 0.1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random float32 (A, B) of ``rank`` for each of ``targets``, shaped for the base file."""
    import numpy as np

    g = open_gguf(base_path)
    try:
        shapes = {n: tuple(g.tensors[n].ne) for n in targets}
    finally:
        g.close()
    rng = np.random.default_rng(seed)
    out = {}
    for name, ne in shapes.items():
        if name == EMBEDDING:
            D, V = ne
            a_shape, b_shape = (V, rank), (D, rank)
        else:
            lead = tuple(reversed(ne[2:]))  # (E,) for expert tensors
            a_shape, b_shape = lead + (rank, ne[0]), lead + (ne[1], rank)
        out[name] = (rng.normal(0, sigma, a_shape).astype(np.float32),
                     rng.normal(0, sigma, b_shape).astype(np.float32))
    return out


def _encode(x: np.ndarray, factor_type: str) -> tuple[np.ndarray, Any]:
    import gguf
    import numpy as np

    x = np.ascontiguousarray(x, np.float32)
    if factor_type == "F32":
        return x, gguf.GGMLQuantizationType.F32
    if factor_type == "F16":
        return x.astype(np.float16), gguf.GGMLQuantizationType.F16
    if factor_type == "BF16":
        u = x.view(np.uint32)
        bits = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
        return bits, gguf.GGMLQuantizationType.BF16
    qt = gguf.GGMLQuantizationType[factor_type]
    return gguf.quants.quantize(x, qt), qt


def write_adapter(path: str | os.PathLike, arch: str,
                  pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], alpha: float | None = 8.0,
                  factor_type: str = "F32", general_type: str = "adapter",
                  adapter_type: str = "lora",
                  extra: Mapping[str, np.ndarray] | None = None) -> str:
    """Write an adapter: ``general.type``/``adapter.type`` as given, ``adapter.lora.alpha``
    (omitted when None), ``N.lora_a``/``N.lora_b`` of every pair in ``factor_type`` (F32, F16,
    BF16 or a quantized type gguf-py can write), then ``extra`` tensors (F32) as named."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_string("general.type", general_type)
    w.add_string("adapter.type", adapter_type)
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", float(alpha))
    for name, (a, b) in pairs.items():
        for suffix, x in ((".lora_a", a), (".lora_b", b)):
            data, qt = _encode(x, factor_type)
            w.add_tensor(name + suffix, data, raw_dtype=qt)
    for name, x in (extra or {}).items():
        w.add_tensor(name, np.ascontiguousarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


def merged_reference(base: np.ndarray, name: str, a: np.ndarray, b: np.ndarray,
                     scale: float) -> np.ndarray:
    """``base`` (NumPy order) with the pair merged, in float64: the definition of spec §12."""
    import numpy as np

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    delta = a64 @ b64.T if name == EMBEDDING else b64 @ a64
    return base.astype(np.float64) + scale * delta
