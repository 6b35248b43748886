"""``NumpyOps``: the reference backend (NumPy, float32 activations, obviously right).

* Activations are C-contiguous float32 ``np.ndarray``s.
* Weights stay in the file (zero-copy memoryviews of the mmap) and are dequantized with
  ``gguf.quants.dequantize`` -- to float32 matrices cached per weight on first use, or, with
  ``cache_weights=False``, in row chunks on every use (for models too large to hold in F32).
* Matmuls accumulate in float32 (NumPy BLAS). RMSNorm statistics, RoPE angles and softmaxes are
  computed in float64 and rounded to float32.

Every op here is the "NumPy twin" the CUDA kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import sampling
from ..errors import ModelError, ReflexError
from ..ggml_types import GGML_TYPES
from ..ops import Batch, Ops, RopeParams, Weight, moe_route_groups, rows_view_shape

_F32, _F16, _BF16 = 0, 1, 30
_NON_FLOAT_TYPES = {24, 25, 26, 27, 28}  # I8, I16, I32, I64, F64: not weights we compute with
_CHUNK_BYTES = 64 << 20  # float32 bytes per dequantized chunk when not caching


def _type_name(t: int) -> str:
    info = GGML_TYPES.get(t)
    return info.name if info is not None else f"type {t}"


def _quant_sizes(t: int) -> tuple[int, int]:
    """(elements, bytes) per block of GGML type ``t`` (the project's one type table)."""
    info = GGML_TYPES[t]
    return info.block_size, info.type_size


_SUPPORTED: dict[int, bool] = {}


def type_supported(t: int) -> bool:
    """Whether ``gguf.quants`` can dequantize GGML type ``t`` (probed once per type)."""
    if t not in _SUPPORTED:
        ok = False
        if t in (_F32, _F16):
            ok = True
        elif t not in _NON_FLOAT_TYPES:
            try:
                from gguf import quants
                from gguf.constants import GGMLQuantizationType

                qt = GGMLQuantizationType(t)
                block, size = _quant_sizes(t)
                y = quants.dequantize(np.zeros((1, size), dtype=np.uint8), qt)
                ok = y.shape == (1, block)
            except Exception:  # NotImplementedError, ValueError, KeyError, ...
                ok = False
        _SUPPORTED[t] = ok
    return _SUPPORTED[t]


def dequantize_rows(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """``raw`` uint8 ``[..., row_bytes]`` of GGML type ``ggml_type`` -> float32 ``[..., n]``."""
    if ggml_type == _F32:
        return np.ascontiguousarray(raw).view(np.float32).copy()
    if ggml_type == _F16:
        return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    y = quants.dequantize(np.ascontiguousarray(raw), GGMLQuantizationType(ggml_type))
    return np.ascontiguousarray(y, dtype=np.float32)


def _lora_factor(adapter: Any, f: Any) -> np.ndarray:
    """A LoRA factor (reflex_core.lora.Factor: F32, F16, BF16 or Q8_0) as float32 in NumPy
    order."""
    raw = np.frombuffer(adapter.factor_bytes(f), dtype=np.uint8)
    if f.ggml_type == _BF16:
        a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        a = dequantize_rows(raw, f.ggml_type)
    return a.reshape(tuple(reversed(f.ne)))


class _Data:
    """``Weight.data`` of this backend: the raw bytes as uint8 ``[..., n_rows, row_bytes]``;
    for a row view (``weight_rows``) also the weight it views and its first row there."""

    __slots__ = ("raw", "row_bytes", "parent", "row0")

    def __init__(self, raw: np.ndarray, row_bytes: int, parent: Weight | None = None,
                 row0: int = 0):
        self.raw = raw
        self.row_bytes = row_bytes
        self.parent = parent
        self.row0 = row0


def _rows_of(a: np.ndarray, view: Weight) -> np.ndarray:
    """The rows of ``view`` in ``a``, the float32 values (NumPy order) of the weight it views."""
    parent, r0 = view.data.parent, view.data.row0
    outer = tuple(reversed(parent.ne[1:]))
    return a.reshape(outer + (parent.ne[0],))[..., r0:r0 + view.ne[1], :]


@dataclass
class Prepared:
    """A batch as this backend holds it (``ops.prepare``)."""

    batch: Batch
    tokens: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    seq_ids: np.ndarray  # int64 [T]
    runs: np.ndarray  # int64 [n_runs, 3]: Batch.runs
    cell0: int
    n_kv: int
    mask: np.ndarray  # bool [T, n_kv]
    rope_cache: dict = field(default_factory=dict)


def mask_array(batch: Batch) -> np.ndarray:
    """The batch's AttnMask as bool ``[T, n_kv]`` (True = may attend)."""
    T, n_kv = batch.n_tokens, batch.n_kv
    m = batch.mask
    if not (len(m.prefix_end) == len(m.own_start) == len(m.own_end) == T):
        raise ValueError(f"attention mask covers {len(m.prefix_end)} tokens, batch has {T}")
    out = np.zeros((T, n_kv), dtype=bool)
    for t in range(T):
        pe, s, e = m.prefix_end[t], m.own_start[t], m.own_end[t]
        if not (0 <= pe <= n_kv and 0 <= s <= e <= n_kv):
            raise ValueError(f"attention mask of token {t} reaches past cell {n_kv}: "
                             f"prefix_end={pe}, own=[{s}, {e})")
        out[t, :pe] = True
        out[t, s:e] = True
        if not out[t].any():
            raise ValueError(f"attention mask of token {t} is empty")
    return out


def rope_cos_sin(positions: np.ndarray, p: RopeParams) -> tuple[np.ndarray, np.ndarray]:
    """cos·m and sin·m, float32 ``[T, n_rot/2]`` (spec §4.3 / ggml rope_yarn), angles in float64."""
    half = p.n_rot // 2
    i = np.arange(half, dtype=np.float64)
    inv = np.power(float(p.freq_base), -2.0 * i / p.n_rot)
    theta_extrap = positions.astype(np.float64)[:, None] * inv[None, :]
    theta = p.freq_scale * theta_extrap
    mscale = float(p.attn_factor)
    if p.ext_factor != 0.0:
        lo, hi = p.corr_dims()
        y = (i - lo) / max(0.001, hi - lo)
        ramp = (1.0 - np.clip(y, 0.0, 1.0)) * p.ext_factor
        theta = theta * (1.0 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * np.log(1.0 / p.freq_scale)
    return ((np.cos(theta) * mscale).astype(np.float32),
            (np.sin(theta) * mscale).astype(np.float32))


class NumpyOps(Ops):
    """The reference backend. ``cache_weights=False`` dequantizes on every use (low memory)."""

    name = "cpu"

    def __init__(self, cache_weights: bool = True) -> None:
        self.cache_weights = cache_weights
        # Optional replacement for gguf.quants: ``dequantizer(weight, expert) -> float32 array``
        # in NumPy order (``expert`` None for the whole tensor). ``reflex check`` on files of tens
        # of GB plugs in the GPU's dequantization (itself checked bit for bit against gguf.quants)
        # because gguf.quants decodes K-quants at ~50 M values/s.
        self.dequantizer = None
        self.gguf: Any = None
        self._weights: dict[str, Weight] = {}
        self._f32: dict[Any, np.ndarray] = {}

    # --- weights and state -------------------------------------------------------------
    def attach(self, gguf) -> None:
        self.gguf = gguf
        self._weights.clear()
        self._f32.clear()

    def weight(self, name: str) -> Weight:
        w = self._weights.get(name)
        if w is not None:
            return w
        info, t, ne = self._tensor_info(name, type_supported,
                                        "which the CPU backend cannot dequantize")
        block, size = _quant_sizes(t)
        row = ne[0] if ne else 1  # a tensor of 0 dimensions is one element (as in ggml)
        if row % block:
            raise ModelError(f"tensor {name!r}: row length {row} is not a multiple of the "
                             f"{_type_name(t)} block size {block}")
        row_bytes = row // block * size
        n_rows = 1
        for n in ne[1:]:
            n_rows *= n
        buf = np.frombuffer(self.gguf.tensor_data(name), dtype=np.uint8)
        if buf.size != n_rows * row_bytes:
            raise ModelError(f"tensor {name!r}: {buf.size} bytes of data, expected "
                             f"{n_rows * row_bytes}")
        outer = tuple(reversed(ne[1:]))  # numpy order of the non-row dims
        w = Weight(name, t, ne, _Data(buf.reshape(outer + (row_bytes,)), row_bytes))
        self._weights[name] = w
        return w

    def weight_rows(self, w: Weight, row0: int, n_rows: int) -> Weight:
        ne, name = rows_view_shape(w, row0, n_rows)
        raw = w.data.raw[..., row0:row0 + n_rows, :]
        return Weight(name, w.ggml_type, ne, _Data(raw, w.data.row_bytes, w, row0))

    def _held(self, w: Weight) -> np.ndarray | None:
        """The float32 values held for ``w`` (a LoRA merge or the cache), else None; a row view
        holds nothing of its own: its rows of what its weight holds."""
        if w.data.parent is None:
            return self._f32.get(w.name)
        a = self._held(w.data.parent)
        return None if a is None else _rows_of(a, w)

    def dequantize(self, w: Weight) -> np.ndarray:
        """The whole weight as float32 in NumPy order (``ne`` reversed); cached if enabled. A row
        view: its rows of its weight's values (so cached, or merged, with that weight)."""
        if w.data.parent is not None:
            return _rows_of(self.dequantize(w.data.parent), w)
        a = self._f32.get(w.name)
        if a is None:
            if self.dequantizer is not None:
                a = self.dequantizer(w, None)
            else:
                a = dequantize_rows(w.data.raw, w.ggml_type)
            if self.cache_weights:
                self._f32[w.name] = a
        return a

    def f32_data(self, w: Weight) -> np.ndarray:
        return self.dequantize(w)

    def _expert(self, w: Weight, e: int) -> np.ndarray:
        parent = w.data.parent
        if parent is not None:
            r0 = w.data.row0
            return self._expert(parent, e).reshape(parent.ne[1], w.ne[0])[r0:r0 + w.ne[1]]
        key = (w.name, e)
        a = self._f32.get(key)
        if a is None:
            a = self._f32.get(w.name)
            if a is not None:
                return a[e]
            if self.dequantizer is not None:
                a = self.dequantizer(w, e)
            else:
                a = dequantize_rows(w.data.raw[e], w.ggml_type)
            if self.cache_weights:
                self._f32[key] = a
        return a

    def merge_lora(self, adapters: Sequence[Any]) -> None:
        """Merge LoRA adapters (reflex_core.lora.Adapter, in order) into the weights: each
        merged tensor becomes a float32 array that replaces the weight's dequantized values
        (every op reads those first), ``W + scale · (B @ A)`` -- ``A @ Bᵀ`` for the embedding --
        computed in float32. The twin of CudaOps.merge_lora."""
        for ad in adapters:
            for m in ad.merges:
                w = self.weight(m.name)
                a = _lora_factor(ad, m.a)
                b = _lora_factor(ad, m.b)
                delta = a @ b.T if m.embedding else b @ a
                base = self.dequantize(w).reshape(delta.shape)
                merged = base + np.float32(m.scale) * delta
                for key in [k for k in self._f32 if isinstance(k, tuple) and k[0] == m.name]:
                    del self._f32[key]  # per-expert copies of the unmerged tensor
                self._f32[m.name] = np.ascontiguousarray(merged, dtype=np.float32)

    # --- state buffers -----------------------------------------------------------------
    def zeros(self, shape: Sequence[int]) -> np.ndarray:
        return np.zeros(tuple(int(n) for n in shape), np.float32)

    def empty(self, shape: Sequence[int], dtype: str = "f32") -> np.ndarray:
        return np.empty(tuple(int(n) for n in shape), {"f32": np.float32, "i32": np.int32}[dtype])

    def clone(self, x) -> np.ndarray:
        return np.array(x, copy=True)

    def copy_rows(self, dst, dst_row: int, src, src_row: int, n_rows: int) -> None:
        if dst.shape[1:] != src.shape[1:]:
            raise ValueError(f"copy_rows: rows of {src.shape[1:]} into rows of {dst.shape[1:]}")
        dst[dst_row:dst_row + n_rows] = src[src_row:src_row + n_rows]

    def rows_to_bytes(self, x, row0: int, n_rows: int) -> bytes:
        return np.ascontiguousarray(x[row0:row0 + n_rows], dtype=np.float32).tobytes()

    def rows_from_bytes(self, x, row0: int, n_rows: int, data: bytes) -> None:
        rows = np.frombuffer(data, np.float32)
        if rows.size != n_rows * int(np.prod(x.shape[1:])):
            raise ReflexError(f"state data of {len(data)} bytes does not fill {n_rows} rows of "
                              f"{list(x.shape[1:])}")
        x[row0:row0 + n_rows] = rows.reshape((n_rows,) + x.shape[1:])

    def prepare(self, batch: Batch) -> Prepared:
        if len(batch.positions) != batch.n_tokens:
            raise ValueError(f"batch has {batch.n_tokens} tokens but {len(batch.positions)} "
                             f"positions")
        return Prepared(batch, np.asarray(batch.tokens, dtype=np.int64).reshape(-1),
                        np.asarray(batch.positions, dtype=np.int64).reshape(-1),
                        np.asarray(batch.seq_ids, dtype=np.int64).reshape(-1),
                        np.asarray(batch.runs, dtype=np.int64).reshape(-1, 3), batch.cell0,
                        batch.n_kv, mask_array(batch))

    # --- tensor ops --------------------------------------------------------------------
    def shape(self, x) -> tuple[int, ...]:
        return tuple(x.shape)

    def view(self, x, shape: Sequence[int]):
        x = np.ascontiguousarray(x)
        return x.reshape(tuple(int(s) for s in shape))  # contiguous: a view, never a copy

    def embed(self, w: Weight, pb) -> np.ndarray:
        n_vocab = w.ne[1]
        tok = pb.tokens
        if tok.size and (tok.min() < 0 or tok.max() >= n_vocab):
            bad = int(tok[(tok < 0) | (tok >= n_vocab)][0])
            raise ReflexError(f"token id {bad} is out of range for {w.name!r} "
                              f"({n_vocab} rows)")
        a = self._held(w)
        if a is not None:
            return a.reshape(n_vocab, -1)[tok].astype(np.float32, copy=True)
        return dequantize_rows(w.data.raw.reshape(n_vocab, w.data.row_bytes)[tok], w.ggml_type)

    def matmul(self, x, w: Weight) -> np.ndarray:
        if len(w.ne) > 2 and any(n != 1 for n in w.ne[2:]):
            raise ValueError(f"matmul with 3-D weight {w.name!r}; use moe_matmul")
        n_in, n_out = w.ne[0], (w.ne[1] if len(w.ne) > 1 else 1)
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != n_in:
            raise ValueError(f"matmul: input has {x.shape[-1]} columns, {w.name!r} expects {n_in}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, n_in)
        if self.cache_weights or self._held(w) is not None:
            W = self.dequantize(w).reshape(n_out, n_in)
            y = x2 @ W.T
        else:
            raw = w.data.raw.reshape(n_out, w.data.row_bytes)
            step = max(1, _CHUNK_BYTES // (4 * n_in))
            y = np.empty((x2.shape[0], n_out), np.float32)
            for r0 in range(0, n_out, step):
                Wc = dequantize_rows(raw[r0:r0 + step], w.ggml_type)
                y[:, r0:r0 + step] = x2 @ Wc.T
        return np.ascontiguousarray(y, dtype=np.float32).reshape(lead + (n_out,))

    def rmsnorm(self, x, w: Weight | None, eps: float) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        x64 = x.astype(np.float64)
        ms = np.mean(x64 * x64, axis=-1, keepdims=True)
        y = (x64 / np.sqrt(ms + float(eps))).astype(np.float32)
        if w is not None:
            g = self.dequantize(w).reshape(-1)
            if g.shape[0] != x.shape[-1]:
                raise ValueError(f"rmsnorm: {w.name!r} has {g.shape[0]} elements, input rows "
                                 f"have {x.shape[-1]}")
            y = y * g
        return np.ascontiguousarray(y, dtype=np.float32)

    def rope(self, x, pb, p: RopeParams) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        T, H, d = x.shape
        n = p.n_rot
        if n > d or n % 2:
            raise ValueError(f"rope: n_rot {n} must be even and <= head size {d}")
        if pb.positions.shape[0] != T:
            raise ValueError(f"rope: {T} rows but {pb.positions.shape[0]} positions")
        cs = pb.rope_cache.get(p) if hasattr(pb, "rope_cache") else None
        if cs is None:
            cs = rope_cos_sin(pb.positions, p)
            if hasattr(pb, "rope_cache"):
                pb.rope_cache[p] = cs
        cos, sin = cs[0][:, None, :], cs[1][:, None, :]
        y = x.copy()
        if p.mode == "neox":
            a, b = x[..., : n // 2], x[..., n // 2: n]
            y[..., : n // 2] = a * cos - b * sin
            y[..., n // 2: n] = a * sin + b * cos
        elif p.mode == "norm":
            a, b = x[..., 0:n:2], x[..., 1:n:2]
            y[..., 0:n:2] = a * cos - b * sin
            y[..., 1:n:2] = a * sin + b * cos
        else:
            raise ValueError(f"rope: unknown mode {p.mode!r}")
        return y

    def kv_write(self, k_cache, v_cache, k, v, pb) -> None:
        T = k.shape[0]
        c0 = pb.cell0
        if c0 + T > k_cache.shape[0]:
            raise ReflexError(f"KV cache full: cells [{c0}, {c0 + T}) requested, "
                              f"{k_cache.shape[0]} allocated")
        k_cache[c0:c0 + T] = np.asarray(k, dtype=np.float32).reshape((T,) + k_cache.shape[1:])
        v_cache[c0:c0 + T] = np.asarray(v, dtype=np.float32).reshape((T,) + v_cache.shape[1:])

    def attention(self, q, k_cache, v_cache, pb, scale: float) -> np.ndarray:
        q = np.asarray(q, dtype=np.float32)
        T, H, dk = q.shape
        Hkv = k_cache.shape[1]
        if H % Hkv:
            raise ValueError(f"attention: {H} query heads are not a multiple of {Hkv} KV heads")
        G = H // Hkv
        n_kv = pb.n_kv
        K = k_cache[:n_kv]  # [n, Hkv, dk]
        V = v_cache[:n_kv]  # [n, Hkv, dv]
        dv = V.shape[-1]
        # [Hkv, G*T, dk] @ [Hkv, dk, n] -> [Hkv, G*T, n]; row g*T + t is query head kv*G + g
        qh = q.reshape(T, Hkv, G, dk).transpose(1, 2, 0, 3).reshape(Hkv, G * T, dk)
        s = np.matmul(qh, K.transpose(1, 2, 0)).reshape(Hkv, G, T, n_kv)
        s = s.astype(np.float64) * float(scale)
        s = np.where(pb.mask[None, None, :, :], s, -np.inf)
        s -= s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        a = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
        o = np.matmul(a.reshape(Hkv, G * T, n_kv), V.transpose(1, 0, 2))  # [Hkv, G*T, dv]
        o = o.reshape(Hkv, G, T, dv).transpose(2, 0, 1, 3).reshape(T, H * dv)
        return np.ascontiguousarray(o, dtype=np.float32)

    def swiglu(self, gate, up) -> np.ndarray:
        g = np.asarray(gate, dtype=np.float32)
        with np.errstate(over="ignore"):
            s = g / (np.float32(1.0) + np.exp(-g))
        return np.ascontiguousarray(s * np.asarray(up, dtype=np.float32), dtype=np.float32)

    def add(self, a, b) -> np.ndarray:
        if a.shape != b.shape:
            raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
        return np.add(a, b, dtype=np.float32)

    def add_bias(self, x, b: Weight, offset: int = 0) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        v = self.dequantize(b).reshape(-1)
        if x.ndim != 2 or not 0 <= offset <= v.shape[0] - x.shape[1]:
            raise ValueError(f"add_bias: input {x.shape} from element {offset} of {b.name!r}, "
                             f"which has {v.shape[0]}")
        return np.add(x, v[None, offset:offset + x.shape[1]], dtype=np.float32)

    def take_rows(self, x, rows: Sequence[int]) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x)[np.asarray(list(rows), dtype=np.int64)])

    # --- fused ops: the NumPy twins are exactly the compositions that define them (Ops), so
    # the reference numerics are those of the unfused ops, bit for bit ----------------------
    matmul_many = Ops.matmul_many
    matmul_swiglu = Ops.matmul_swiglu
    moe_matmul_swiglu = Ops.moe_matmul_swiglu
    add_rmsnorm = Ops.add_rmsnorm
    qk_norm_rope_store = Ops.qk_norm_rope_store

    # --- MoE -----------------------------------------------------------------------------
    def moe_route(self, logits, k: int, gating: str = "softmax", norm: bool = True,
                  scale: float = 0.0, bias: Weight | None = None,
                  groups: tuple[int, int] = (0, 0)):
        z = np.asarray(logits, dtype=np.float32).astype(np.float64)
        T, E = z.shape
        G, used = moe_route_groups(E, k, groups)
        if gating in ("softmax", "softmax_weight"):
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            probs = e / e.sum(axis=-1, keepdims=True) if gating == "softmax" else z
        elif gating == "sigmoid":
            probs = 1.0 / (1.0 + np.exp(-z))
        elif gating == "sqrt_softplus":
            probs = np.sqrt(np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0)))))
        else:
            raise ValueError(f"moe_route: unknown gating {gating!r}")
        sel = probs
        if bias is not None:
            b = np.asarray(self.f32_data(bias), dtype=np.float64).reshape(-1)
            if b.size != E:
                raise ValueError(f"moe_route: bias {bias.name!r} has {b.size} values, not {E}")
            sel = probs + b
        if G:
            grouped = sel.reshape(T, G, E // G)
            top2 = -np.sort(-grouped, axis=-1)[:, :, :2].sum(axis=-1)
            # the G_used best groups; equal scores: the lower group index first (stable sort)
            kept = np.argsort(-top2, axis=-1, kind="stable")[:, :used]
            mask = np.ones((T, G), bool)
            np.put_along_axis(mask, kept, False, axis=-1)
            sel = np.where(np.repeat(mask, E // G, axis=-1), -np.inf, sel)
        # top-k of sel; equal values: the lowest expert index first (stable sort)
        ids = np.argsort(-sel, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(probs, ids, axis=-1)
        if gating == "softmax_weight":
            w = np.exp(w - w.max(axis=-1, keepdims=True))
            w = w / w.sum(axis=-1, keepdims=True)
        if norm:
            w = w / np.maximum(w.sum(axis=-1, keepdims=True), 6.103515625e-5)
        if scale != 0.0 and scale != 1.0:
            w = w * scale
        return ids.astype(np.int32), w.astype(np.float32)

    def moe_matmul(self, x, w: Weight, ids) -> np.ndarray:
        if len(w.ne) != 3:
            raise ValueError(f"moe_matmul: {w.name!r} is not a 3-D expert tensor")
        n_in, n_out, E = w.ne
        x = np.asarray(x, dtype=np.float32)
        ids = np.asarray(ids)
        T, k = ids.shape
        if x.ndim == 2:
            x = np.broadcast_to(x[:, None, :], (T, k, n_in))
        if x.shape != (T, k, n_in):
            raise ValueError(f"moe_matmul: input shape {x.shape}, expected [{T}, {k}, {n_in}]")
        if ids.min() < 0 or ids.max() >= E:
            raise ValueError(f"moe_matmul: expert id out of range [0, {E})")
        y = np.zeros((T, k, n_out), np.float32)
        for e in np.unique(ids):
            sel = ids == e
            W = self._expert(w, int(e)).reshape(n_out, n_in)
            y[sel] = x[sel] @ W.T
        return y

    def moe_combine(self, y, weights) -> np.ndarray:
        y = np.asarray(y, dtype=np.float32)
        wt = np.asarray(weights, dtype=np.float32)
        return np.ascontiguousarray(np.einsum("tk,tkn->tn", wt, y), dtype=np.float32)

    # --- results to the host -----------------------------------------------------------
    def argmax(self, logits) -> list[int]:
        a = np.asarray(logits)
        if a.ndim == 1:
            a = a[None, :]
        return [int(i) for i in np.argmax(a.reshape(-1, a.shape[-1]), axis=-1)]

    def sample(self, logits, temperature: float, top_k: int, top_p: float, u: float,
               min_p: float = 0.0) -> int:
        a = np.asarray(logits)
        row = a.reshape(-1, a.shape[-1])[-1]
        return sampling.sample_reference(row, temperature, top_k, top_p, u, min_p)

    def repeat_penalty(self, logits, token_ids: Sequence[int], penalty: float) -> None:
        row = logits[(-1,) * (logits.ndim - 1)]  # basic indexing: a view, written in place
        row[...] = sampling.repeat_penalty_reference(row, token_ids, penalty)

    def token_logprobs(self, logits, targets: Sequence[int]) -> list[float]:
        a = np.asarray(logits, dtype=np.float32)
        a = a.reshape(-1, a.shape[-1]).astype(np.float64)
        if a.shape[0] != len(targets):
            raise ValueError(f"token_logprobs: {a.shape[0]} rows, {len(targets)} targets")
        m = a.max(axis=-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(a - m).sum(axis=-1))
        tg = np.asarray(list(targets), dtype=np.int64)
        return [float(v) for v in a[np.arange(a.shape[0]), tg] - lse]

    def to_numpy(self, x) -> np.ndarray:
        return np.array(x, copy=True)

    def synchronize(self) -> None:
        return None
