"""Typed access to one architecture's GGUF metadata and its RoPE parameters (spec §2-§4.3).
Families declare their configuration on top of this (:mod:`reflex_core.config`).

``Meta(gguf, arch)`` reads keys the way llama.cpp does: a required key that is missing, a key
stored with the wrong kind (a string where a number is expected, ...), an integer out of its
range or a float that is not finite is a :class:`ModelError` naming the key and the file. A key
is written without its architecture prefix (``meta.u32("attention.head_count")`` reads
``qwen3.attention.head_count``); keys of the global namespaces (``general.``, ``tokenizer.``,
``split.``, ``adapter.``) and keys already starting with ``{arch}.`` are used as written.

Counts that size things (blocks, heads, experts, the vocabulary) are bounded by the file's own
tensor directory (:meth:`Meta.bounded`) before anything is built from them: a few bytes of
metadata must not make the reader allocate gigabytes.

Standard library only (the GPU cold path imports this).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .errors import ModelError
from .ops import RopeParams

# GGUF value types (spec §2)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)
_INT_TYPES = {T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_UINT64, T_INT64}
_FLOAT_TYPES = {T_FLOAT32, T_FLOAT64}
_TYPE_NAMES = {T_UINT8: "uint8", T_INT8: "int8", T_UINT16: "uint16", T_INT16: "int16",
               T_UINT32: "uint32", T_INT32: "int32", T_FLOAT32: "float32", T_BOOL: "bool",
               T_STRING: "string", T_ARRAY: "array", T_UINT64: "uint64", T_INT64: "int64",
               T_FLOAT64: "float64"}
_GLOBAL_NAMESPACES = ("general.", "tokenizer.", "split.", "adapter.")

REQUIRED: Any = object()  # sentinel: the key must be present
F32_MAX = 3.4028234663852886e38  # float32's largest finite value: the kernels take float32


def _file_name(gguf: Any) -> str:
    for attr in ("path", "name", "filename"):
        v = getattr(gguf, attr, None)
        if v:
            return str(v)
    return "<gguf>"


def _stored_type(gguf: Any, key: str, value: Any) -> tuple[int | None, int | None]:
    """(value type, array element type) as stored in the file; None where unknown."""
    vt = getattr(gguf, "value_types", None)
    t: Any = None
    if vt is not None:
        try:
            t = vt.get(key) if hasattr(vt, "get") else vt[key]
        except (KeyError, IndexError, TypeError):
            t = None
    elem: Any = None
    if isinstance(t, (tuple, list)):  # (ARRAY, elem type)
        t, elem = (t[0], t[1] if len(t) > 1 else None)
    if t is not None:
        t = int(t)
    if t == T_ARRAY and elem is None:
        for attr in ("elem_type", "element_type", "etype", "type"):
            e = getattr(value, attr, None)
            if isinstance(e, int):
                elem = e
                break
    if t is None:  # no type table: infer the kind from the Python value
        if isinstance(value, bool):
            t = T_BOOL
        elif isinstance(value, int):
            t = T_INT64
        elif isinstance(value, float):
            t = T_FLOAT64
        elif isinstance(value, str):
            t = T_STRING
        elif isinstance(value, Sequence):
            t = T_ARRAY
    return t, (int(elem) if elem is not None else None)


class Meta:
    """One file's metadata, read for one architecture."""

    def __init__(self, gguf: Any, arch: str) -> None:
        if not isinstance(arch, str):  # a plugin passes the file's general.architecture on
            raise ModelError(f"{_file_name(gguf)}: metadata key 'general.architecture' has "
                             f"wrong type (expected string)")
        self.gguf = gguf
        self.arch = arch
        self.metadata = gguf.metadata
        self.file = _file_name(gguf)
        self._largest_dim: int | None = None

    # --- keys -------------------------------------------------------------------------
    def key(self, key: str) -> str:
        """The full key name: ``attention.head_count`` -> ``{arch}.attention.head_count``."""
        if key.startswith(self.arch + ".") or key.startswith(_GLOBAL_NAMESPACES):
            return key
        return f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.key(key) in self.metadata

    def error(self, msg: str) -> ModelError:
        """A one-line ModelError naming the file."""
        return ModelError(f"{self.file}: {msg}")

    def _get(self, key: str, default: Any) -> tuple[str, Any, bool]:
        full = self.key(key)
        if full not in self.metadata:
            if default is REQUIRED:
                raise self.error(f"metadata key {full!r} is missing (required for "
                                  f"architecture {self.arch!r})")
            return full, default, False
        return full, self.metadata[full], True

    def _kind_error(self, full: str, expected: str, t: int | None) -> ModelError:
        got = _TYPE_NAMES.get(t, str(t)) if t is not None else "unknown"
        return self.error(f"metadata key {full!r} has wrong type {got} (expected {expected})")

    # --- scalars ----------------------------------------------------------------------
    def u32(self, key: str, default: Any = REQUIRED) -> Any:
        """An unsigned 32-bit integer. Any stored integer kind in [0, 2^32) is accepted."""
        full, v, found = self._get(key, default)
        if not found:
            return v
        t, _ = _stored_type(self.gguf, full, v)
        if t not in _INT_TYPES or isinstance(v, bool):
            raise self._kind_error(full, "uint32", t)
        v = int(v)
        if not 0 <= v < 2 ** 32:
            raise self.error(f"metadata key {full!r} = {v} is out of range for uint32")
        return v

    def f32(self, key: str, default: Any = REQUIRED) -> Any:
        """A finite float in float32's range (inf and NaN are refused: no hyper-parameter means
        them, and the kernels take float32)."""
        full, v, found = self._get(key, default)
        if not found:
            return v
        t, _ = _stored_type(self.gguf, full, v)
        if t not in _FLOAT_TYPES or isinstance(v, bool):
            raise self._kind_error(full, "float32", t)
        v = float(v)
        if not abs(v) <= F32_MAX:
            raise self.error(f"metadata key {full!r} = {v} is not a finite float32")
        return v

    def bool(self, key: str, default: Any = REQUIRED) -> Any:
        full, v, found = self._get(key, default)
        if not found:
            return v
        t, _ = _stored_type(self.gguf, full, v)
        if t != T_BOOL:
            raise self._kind_error(full, "bool", t)
        return bool(v)

    def str(self, key: str, default: Any = REQUIRED) -> Any:
        full, v, found = self._get(key, default)
        if not found:
            return v
        t, _ = _stored_type(self.gguf, full, v)
        if t != T_STRING:
            raise self._kind_error(full, "string", t)
        if isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("utf-8", errors="replace")
        return v

    # --- arrays -----------------------------------------------------------------------
    def array(self, key: str, default: Any = REQUIRED) -> Any:
        """An array value as stored (a Sequence); no element-type check."""
        full, v, found = self._get(key, default)
        if not found:
            return v
        t, _ = _stored_type(self.gguf, full, v)
        if t != T_ARRAY:
            raise self._kind_error(full, "array", t)
        return v

    def u32_or_array(self, key: str, n_layers: int, default: Any = REQUIRED) -> Any:
        """A per-layer integer: a scalar (repeated ``n_layers`` times) or an array of exactly
        ``n_layers`` int32/uint32/bool entries (bool as 0/1). Returns a list of ints, or
        ``default`` (a scalar default is repeated) when the key is absent."""
        full, v, found = self._get(key, default)
        if not found:
            if isinstance(v, int) and not isinstance(v, bool):
                return [v] * n_layers
            return v
        t, elem = _stored_type(self.gguf, full, v)
        if t == T_ARRAY:
            if elem is not None and elem not in (T_INT32, T_UINT32, T_BOOL):
                raise self.error(f"metadata key {full!r} is an array of "
                                  f"{_TYPE_NAMES.get(elem, elem)} (expected int32/uint32/bool)")
            if len(v) != n_layers:
                raise self.error(f"metadata key {full!r} has {len(v)} entries; expected one "
                                  f"per block ({n_layers})")
            out = []
            for x in v:
                if isinstance(x, bool):
                    out.append(int(x))
                elif isinstance(x, int) or (hasattr(x, "__index__") and not isinstance(x, float)):
                    x = int(x)
                    if not 0 <= x < 2 ** 32:
                        raise self.error(f"metadata key {full!r} holds {x}, out of range for "
                                          f"uint32")
                    out.append(x)
                else:
                    raise self.error(f"metadata key {full!r} holds a non-integer entry {x!r}")
            return out
        return [self.u32(key)] * n_layers

    # --- bounds -----------------------------------------------------------------------
    def bounded(self, key: str, value: Any, bound: str | None) -> Any:
        """``value`` (an int or a per-layer list) of ``key``, checked against ``bound``:

        * ``"blocks"``: at most the number of tensors in the file -- every block of a model has
          tensors of its own (``blk.{i}.*``), so a block count above it cannot be a model, and
          the count must be refused before per-layer lists are made from it;
        * ``"dim"``: at most the largest tensor dimension in the file -- a width (embedding,
          head size), a head count, an expert count or the vocabulary size is a tensor
          dimension or a factor of one (``attn_q`` is ``[D, H * d_h]``);
        * None: no bound.

        ``gguf.tensors`` is the file's tensor directory (a Meta over an object without one
        bounds every count to 0)."""
        if bound is None:
            return value
        if bound == "blocks":
            limit = len(getattr(self.gguf, "tensors", None) or ())
            what = "the number of tensors in the file"
        elif bound == "dim":
            limit, what = self.largest_dim(), "the largest tensor dimension in the file"
        else:
            raise ValueError(f"unknown bound {bound!r}")
        biggest = max(value, default=0) if isinstance(value, list) else value
        if isinstance(biggest, int) and biggest > limit:
            raise self.error(f"metadata key {self.key(key)!r} = {biggest} is more than "
                              f"{what} ({limit})")
        return value

    def largest_dim(self) -> int:
        """The largest dimension of any tensor in the file (0 without tensors)."""
        if self._largest_dim is None:
            tensors = getattr(self.gguf, "tensors", None) or {}
            self._largest_dim = max((max(t.ne, default=0) for t in tensors.values()), default=0)
        return self._largest_dim

    # --- derived ----------------------------------------------------------------------
    def vocab_size(self) -> int:
        """V for this file (see :func:`vocab_size`)."""
        return vocab_size(self.gguf, self.arch)


def vocab_size(gguf: Any, arch: str) -> int:
    """V: the length of ``tokenizer.ggml.tokens``, or ``{arch}.vocab_size`` for a file whose
    tokenizer model is ``none``/``no_vocab`` (llama.cpp's dummy vocabulary)."""
    meta = Meta(gguf, arch)
    model = meta.str("tokenizer.ggml.model", None)
    if model in ("none", "no_vocab"):
        n = meta.u32("vocab_size", None)
        if n is None:
            raise meta.error(f"tokenizer.ggml.model is {model!r} and {arch}.vocab_size is "
                              f"missing: the vocabulary size is unknown")
        return meta.bounded("vocab_size", n, "dim")
    tokens = meta.array("tokenizer.ggml.tokens", None)
    if tokens is None:
        n = meta.u32("vocab_size", None)
        if n is None:
            raise meta.error("metadata key 'tokenizer.ggml.tokens' is missing (no vocabulary)")
        return meta.bounded("vocab_size", n, "dim")
    return len(tokens)


_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def rope_params(meta: Meta, n_rot: int, mode: str = "neox", yarn_log_mul: float = 0.0,
                freq_base: float | None = None) -> RopeParams:
    """RoPE parameters per spec §4.3 from the file's ``rope.*`` keys.

    ``yarn_log_mul`` is deepseek2's ``rope.scaling.yarn_log_multiplier`` (already divided by
    0.1); other architectures leave it 0. ``freq_base`` overrides ``rope.freq_base``.
    """
    if n_rot <= 0 or n_rot % 2:
        raise meta.error(f"rope dimension count {n_rot} must be a positive even number")
    if mode not in ("neox", "norm"):
        raise ValueError(f"rope mode must be 'neox' or 'norm', got {mode!r}")
    base = meta.f32("rope.freq_base", 10000.0) if freq_base is None else float(freq_base)
    if not base > 0:
        raise meta.error(f"{meta.key('rope.freq_base')} = {base} must be > 0")
    stype = meta.str("rope.scaling.type", "linear")
    if stype not in _SCALING_TYPES:
        raise meta.error(f"unknown rope scaling type {stype!r} (expected one of "
                          f"{', '.join(_SCALING_TYPES)})")
    if stype == "longrope":
        raise meta.error("rope scaling type 'longrope' is not supported")
    factor_key = "rope.scaling.factor" if meta.has("rope.scaling.factor") else "rope.scale_linear"
    factor = meta.f32(factor_key, 0.0)
    if factor < 0:
        raise meta.error(f"{meta.key(factor_key)} = {factor} must be >= 0 (0: no scaling)")
    freq_scale = 1.0 if factor == 0.0 else 1.0 / factor
    if stype == "none":
        freq_scale = 1.0
    ext_factor = 1.0 if stype == "yarn" else 0.0
    n_ctx_train = meta.u32("context_length", 0)
    n_ctx_orig = meta.u32("rope.scaling.original_context_length", 0) or n_ctx_train

    attn_factor = 1.0
    if ext_factor != 0.0:
        F = 1.0 / freq_scale

        def g(scale: float, mscale: float) -> float:
            return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0

        if yarn_log_mul != 0.0:
            mscale_all = yarn_log_mul
            mscale = mscale_all if (meta.arch == "deepseek2" and mscale_all != 1.0) else 1.0
            attn_factor = g(F, mscale) / g(F, mscale_all)
        else:
            attn_factor = g(F, 1.0)
        mag = 1.0 + 0.1 * math.log(F)  # the rope kernel multiplies this back in
        if not mag > 0:  # a factor below e^-10 shrinks YaRN's magnitude to zero or less
            raise meta.error(f"{meta.key(factor_key)} = {factor} is out of range for YaRN "
                              f"scaling")
        attn_factor /= mag
    attn_factor *= meta.f32("rope.scaling.attn_factor", 1.0)
    if ext_factor != 0.0 and n_ctx_orig <= 0:
        raise meta.error("YaRN rope scaling needs rope.scaling.original_context_length or "
                          "context_length")
    if ext_factor != 0.0 and base == 1.0:  # YaRN's ramp divides by log(freq_base)
        raise meta.error(f"{meta.key('rope.freq_base')} = 1 leaves YaRN rope scaling undefined")
    if not (abs(freq_scale) <= F32_MAX and abs(attn_factor) <= F32_MAX):
        raise meta.error(f"RoPE scaling ({meta.key(factor_key)} = {factor}, "
                          f"{meta.key('rope.scaling.attn_factor')}) is out of float32's range")
    return RopeParams(n_rot=n_rot, mode=mode, freq_base=base, freq_scale=freq_scale,
                      ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=32.0,
                      beta_slow=1.0, n_ctx_orig=n_ctx_orig)


def uniform(meta: Meta, key: str, values: list[int]) -> int:
    """The one value of a per-layer key, or a ModelError when the layers differ."""
    if len(set(values)) != 1:
        raise meta.error(f"per-layer values of {meta.key(key)!r} differ ({values}); not "
                          f"supported for {meta.arch}")
    return values[0]
