"""The ops interface: what an architecture's forward pass is written against, once.

Two backends implement it: :class:`reflex_core.backends.numpy_backend.NumpyOps` (the reference:
NumPy, float32, obviously right) and :class:`reflex_core.backends.cuda_backend.CudaOps`
(AOT-compiled kernels on device-resident buffers). A plugin never touches a backend's arrays
directly; it passes the handles it gets from one op to the next.

Conventions
-----------
* Activations are row-major float32 tensors: ``[T, n]`` (T tokens of a batch) or ``[T, H, d]``
  (heads). Shapes are NumPy order (outermost first). ``ops.shape(x)`` returns the shape.
* Weights are GGUF tensors, kept in their GGML type (quantized blocks stay quantized on the GPU);
  their shape is reported in GGUF ``ne`` order (innermost first), as in the spec: a matrix of
  ``ne = [n_in, n_out]`` maps a ``[T, n_in]`` activation to ``[T, n_out]``.
* A forward pass handles one :class:`Batch`: T tokens with their RoPE positions, written to KV
  cells ``[cell0, cell0 + T)``, attending under an :class:`AttnMask` (causal unless given).
* Ops return new tensors unless named with a trailing underscore (in place).

Token ids, positions and masks cross from the host once per batch (``ops.prepare``); within a
forward pass nothing comes back to the host until the caller asks for token ids or logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class AttnMask:
    """Which KV cells each query token of a batch may attend to.

    Token ``t`` sees cells ``[0, prefix_end[t]) ∪ [own_start[t], own_end[t])``. Causal decoding
    is ``prefix_end[t] = cell0 + t + 1`` with an empty second range; the system1 tree batch lets a
    candidate token see the whole prompt (first range) and its own earlier tokens (second range).
    """

    prefix_end: tuple[int, ...]
    own_start: tuple[int, ...]
    own_end: tuple[int, ...]

    @staticmethod
    def causal(cell0: int, n_tokens: int) -> "AttnMask":
        ends = tuple(range(cell0 + 1, cell0 + n_tokens + 1))
        zeros = (0,) * n_tokens
        return AttnMask(ends, zeros, zeros)

    def visible(self, t: int) -> list[int]:
        """The cells token t attends to (reference semantics; used by tests and NumPy)."""
        cells = list(range(self.prefix_end[t]))
        cells += [c for c in range(self.own_start[t], self.own_end[t]) if c >= self.prefix_end[t]]
        return cells


@dataclass(frozen=True)
class Batch:
    """T tokens processed together by one forward pass, made by a
    :class:`~reflex_core.state.State` (which assigns positions, cells and the mask).

    ``seq_ids[t]`` is the sequence token t belongs to (the slot of per-sequence state it reads
    and updates); empty means every token is in sequence 0.
    """

    tokens: tuple[int, ...]
    positions: tuple[int, ...]  # RoPE positions, one per token
    cell0: int  # KV cells [cell0, cell0 + T) receive this batch's K and V
    mask: AttnMask
    seq_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.seq_ids:
            object.__setattr__(self, "seq_ids", (0,) * len(self.tokens))
        elif len(self.seq_ids) != len(self.tokens):
            raise ValueError(f"batch has {len(self.tokens)} tokens but {len(self.seq_ids)} "
                             f"sequence ids")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def runs(self) -> tuple[tuple[int, int, int], ...]:
        """The batch as runs of consecutive tokens of one sequence: ``(seq, t0, t1)`` for batch
        rows ``[t0, t1)``, in batch order. Ops on per-sequence state (a recurrent layer) walk
        each run in order, starting from the run's sequence slot; a sequence in two runs of one
        batch is an error there (its slot would be read and written twice)."""
        ids = self.seq_ids
        if not ids:
            return ()
        if ids.count(ids[0]) == len(ids):  # one sequence (C speed: prompts of thousands)
            return ((ids[0], 0, len(ids)),)
        out: list[tuple[int, int, int]] = []
        t0 = 0
        for t in range(1, len(ids) + 1):
            if t == len(ids) or ids[t] != ids[t0]:
                out.append((ids[t0], t0, t))
                t0 = t
        return tuple(out)

    @property
    def n_kv(self) -> int:
        """Cells in use once this batch is written: attention spans cells [0, n_kv)."""
        return self.cell0 + len(self.tokens)

    @staticmethod
    def causal(tokens: Sequence[int], start: int) -> "Batch":
        """Plain left-to-right batch of sequence 0: token i at position and cell ``start + i``
        (for op tests; a model's batches come from its State)."""
        n = len(tokens)
        return Batch(tuple(tokens), tuple(range(start, start + n)), start, AttnMask.causal(start, n))


@dataclass(frozen=True)
class RopeParams:
    """Rotary embedding of one attention type (spec §4.3), with YaRN when ``ext_factor`` != 0.

    ``mode`` is "neox" (pairs ``(i, i + n_rot/2)``) or "norm" (pairs ``(2i, 2i + 1)``).
    """

    n_rot: int
    mode: str = "neox"
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0

    def corr_dims(self) -> tuple[float, float]:
        """YaRN ramp bounds (lo, hi) over pair indices, as ggml_rope_yarn_corr_dims."""

        def dim(beta: float) -> float:
            return self.n_rot * math.log(self.n_ctx_orig / (beta * 2 * math.pi)) / (
                2 * math.log(self.freq_base))

        lo = max(0.0, math.floor(dim(self.beta_fast)))
        hi = min(self.n_rot - 1.0, math.ceil(dim(self.beta_slow)))
        return lo, hi


class Weight:
    """A GGUF tensor as a backend holds it. ``ne`` is GGUF order (innermost first)."""

    __slots__ = ("name", "ggml_type", "ne", "data", "meta")

    def __init__(self, name: str, ggml_type: int, ne: tuple[int, ...], data: Any,
                 meta: Any = None):
        self.name = name
        self.ggml_type = ggml_type
        self.ne = ne
        self.data = data  # backend specific
        self.meta = meta  # backend specific, precomputed when the weight is bound (or None)

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, type={self.ggml_type}, ne={list(self.ne)})"


def moe_route_groups(E: int, k: int, groups: tuple[int, int]) -> tuple[int, int]:
    """The validated ``(G, G_used)`` of an :meth:`Ops.moe_route` call, ``(0, 0)`` when ungrouped
    (G <= 1); ValueError (one line) for what llama.cpp refuses: G not dividing E, a group of
    fewer than two experts (its score needs two), G_used outside ``(0, G)``, and k above the
    experts the kept groups hold (the rest would be chosen among masked ones)."""
    if not 0 < k <= E:
        raise ValueError(f"moe_route: k={k} experts of {E}")
    G, used = (int(g) for g in groups)
    if G <= 1:
        if G < 0:
            raise ValueError(f"moe_route: {G} expert groups")
        return 0, 0
    if E % G or E // G < 2 or not 0 < used < G or k > used * (E // G):
        raise ValueError(f"moe_route: {E} experts in {G} groups, {used} groups used, top-{k}: "
                         f"need G | E, E/G >= 2, 0 < used < G, k <= used * E/G")
    return G, used


def rows_view_shape(w: Weight, row0: int, n_rows: int) -> tuple[tuple[int, ...], str]:
    """(ne, name) of :meth:`Ops.weight_rows`'s view, after checking the rows lie in ``w``
    (ValueError otherwise)."""
    if len(w.ne) < 2:
        raise ValueError(f"weight_rows: {w.name!r} has no rows to take (ne {list(w.ne)})")
    if not (0 <= row0 and 0 < n_rows and row0 + n_rows <= w.ne[1]):
        raise ValueError(f"weight_rows: rows [{row0}, {row0 + n_rows}) of {w.name!r}, which has "
                         f"{w.ne[1]}")
    return (w.ne[0], n_rows) + tuple(w.ne[2:]), f"{w.name}[{row0}:{row0 + n_rows}]"


class Ops:
    """The op set every backend implements. See the module docstring for conventions.

    Ops of a family's own (registered by its plugin, :mod:`reflex_core.opreg`) are attributes
    too: ``ops.<name>(...)`` runs the op's NumPy twin on the CPU backend and its CUDA launcher on
    the GPU backend."""

    name = "abstract"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        from . import opreg

        fn = opreg.implementation(name, self.name)

        def op(*args: Any, **kwargs: Any) -> Any:
            return fn(self, *args, **kwargs)

        op.__name__ = name
        self.__dict__[name] = op  # found directly from now on
        return op

    # --- weights and state -------------------------------------------------------------
    def attach(self, gguf) -> None:
        """Make the file's tensors available (the CUDA backend uploads them here, once)."""
        raise NotImplementedError

    def weight(self, name: str) -> Weight:
        """The tensor ``name`` of the attached file. Raises ModelError if it is missing."""
        raise NotImplementedError

    def has_weight(self, name: str) -> bool:
        """Whether the attached file (``self.gguf``) has a tensor ``name``."""
        g = getattr(self, "gguf", None)
        return g is not None and name in g.tensors

    def weight_rows(self, w: Weight, row0: int, n_rows: int) -> Weight:
        """Rows ``[row0, row0 + n_rows)`` of ``w`` (along ``ne[1]``; of every expert of a 3-D
        tensor) as a weight of its own that shares ``w``'s data: the parts of a fused tensor
        (``attn_qkv`` -> q, k, v; ``ffn_gate_up_exps`` -> gate, up), each then an operand like a
        tensor of the file. Named ``"{w.name}[row0:row0 + n_rows]"``. A LoRA merge into ``w``
        made before the view is bound is seen through it."""
        raise NotImplementedError

    def _tensor_info(self, name: str, supported: Any, cannot: str) -> tuple[Any, int, tuple]:
        """(info, ggml_type, ne) of tensor ``name`` of the attached file (``self.gguf``), with the
        errors every backend raises: not attached, missing tensor (ModelError), a GGML type
        ``supported(t)`` rejects (UnsupportedTensorType, ``cannot`` says why)."""
        from .errors import ModelError, ReflexError, UnsupportedTensorType
        from .gguf import GGML_TYPES

        if getattr(self, "gguf", None) is None:
            raise ReflexError(f"{type(self).__name__}.weight() before attach()")
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelError(f"tensor {name!r} is missing from the file")
        t = int(info.ggml_type)
        if not supported(t):
            tname = GGML_TYPES[t].name if t in GGML_TYPES else f"type {t}"
            raise UnsupportedTensorType(f"tensor {name!r} has GGML type {tname} ({t}), {cannot}")
        return info, t, tuple(int(n) for n in info.ne)

    def f32_data(self, w: Weight) -> Any:
        """The values of ``w`` as float32, in the backend's own form, for an op that reads a
        small tensor whole (a conv kernel, a per-head vector): the CPU backend gives an ndarray
        (NumPy order, ``ne`` reversed), the CUDA backend the device address of the float32
        values (the tensor itself when it is F32, else a dequantized copy made once)."""
        raise NotImplementedError

    # --- state buffers (reflex_core.state.State allocates and copies through these) ----------
    state_dtype = "f32"  # element type of the state buffers this backend allocates

    def zeros(self, shape: Sequence[int]):
        """A new zero-filled float32 tensor of ``shape``."""
        raise NotImplementedError

    def empty(self, shape: Sequence[int], dtype: str = "f32"):
        """A new tensor of ``shape`` whose contents are undefined (an op's output); ``dtype``
        "f32" or "i32" (expert / head ids for ``moe_matmul``)."""
        raise NotImplementedError

    def clone(self, x):
        """A copy of ``x`` (on the backend's device)."""
        raise NotImplementedError

    def copy_rows(self, dst, dst_row: int, src, src_row: int, n_rows: int) -> None:
        """``dst[dst_row : dst_row + n] = src[src_row : src_row + n]`` along the first
        dimension (the rows have the same size), on the device."""
        raise NotImplementedError

    def rows_to_bytes(self, x, row0: int, n_rows: int) -> bytes:
        """The bytes of rows ``[row0, row0 + n_rows)`` of ``x`` (first dimension), on the host."""
        raise NotImplementedError

    def rows_from_bytes(self, x, row0: int, n_rows: int, data: bytes) -> None:
        """Overwrite rows ``[row0, row0 + n_rows)`` of ``x`` with ``data`` (from
        :meth:`rows_to_bytes` of a tensor of the same row size)."""
        raise NotImplementedError

    def prepare(self, batch: Batch) -> Any:
        """Move a batch's token ids, positions and mask to the backend (once per forward)."""
        raise NotImplementedError

    # --- tensor ops --------------------------------------------------------------------
    def shape(self, x) -> tuple[int, ...]:
        raise NotImplementedError

    def view(self, x, shape: Sequence[int]):
        """Same data, new shape (element count unchanged; no copy)."""
        raise NotImplementedError

    def embed(self, w: Weight, pb) -> Any:
        """Rows of ``w`` (ne ``[D, V]``) for the batch's tokens, dequantized: ``[T, D]``."""
        raise NotImplementedError

    def matmul(self, x, w: Weight):
        """``x [T, n_in] · wᵀ`` for ``w`` of ne ``[n_in, n_out]`` in any supported type."""
        raise NotImplementedError

    def rmsnorm(self, x, w: Weight | None, eps: float):
        """RMSNorm over the last dimension, times ``w`` (ne ``[n]``) when given."""
        raise NotImplementedError

    def rope(self, x, pb, p: RopeParams):
        """Rotate ``x [T, H, d]``'s first ``p.n_rot`` dims of every head by the batch positions."""
        raise NotImplementedError

    def kv_write(self, k_cache, v_cache, k, v, pb) -> None:
        """Store ``k [T, H_kv, d_k]`` and ``v [T, H_kv, d_v]`` in cells ``[cell0, cell0+T)`` of
        ``k_cache [n_cells, H_kv, d_k]`` / ``v_cache [n_cells, H_kv, d_v]`` (state buffers)."""
        raise NotImplementedError

    def attention(self, q, k_cache, v_cache, pb, scale: float):
        """GQA attention of ``q [T, H, d_k]`` over cells ``[0, n_kv)`` of ``k_cache`` /
        ``v_cache`` under the batch mask.

        Query head h reads KV head ``h // (H // H_kv)``. Scores are ``scale · q·k``, softmax in
        float32, masked cells excluded. Returns ``[T, H * d_v]`` (head-major).
        """
        raise NotImplementedError

    def swiglu(self, gate, up):
        """``silu(gate) * up`` elementwise."""
        raise NotImplementedError

    def add(self, a, b):
        """``a + b`` elementwise (same shape)."""
        raise NotImplementedError

    def add_bias(self, x, b: Weight, offset: int = 0):
        """``x [T, n]`` with ``b[offset : offset + n]`` (``b`` a vector) added to every row: a
        projection's bias (spec §4.7; a fused ``attn_qkv.bias`` holds q's, k's and v's)."""
        raise NotImplementedError

    def take_rows(self, x, rows: Sequence[int]):
        """Rows ``rows`` of ``x [T, n]``: ``[len(rows), n]``."""
        raise NotImplementedError

    # --- fused ops ----------------------------------------------------------------------
    # Each is defined as (and defaults to) a composition of the ops above; a backend overrides
    # it to do the same work in fewer passes / launches. Results equal the composition up to
    # float rounding (the CUDA kernels are bit-identical to their unfused kernels except where
    # noted).

    def matmul_many(self, x, ws: Sequence[Weight]) -> list:
        """``[matmul(x, w) for w in ws]``: several weights (ne ``[n_in, n_i]``, any types) applied
        to the same input ``x [T, n_in]`` -- the q/k/v projections. The CUDA backend computes
        weights that share a GGML type in one launch (up to three per launch)."""
        return [self.matmul(x, w) for w in ws]

    def matmul_swiglu(self, x, gate: Weight, up: Weight):
        """``swiglu(matmul(x, gate), matmul(x, up))``: the first half of a SwiGLU FFN, ``gate``
        and ``up`` of ne ``[n_in, n_ff]``. One launch on CUDA when both have the same GGML type
        (the per-token ``gate``/``up`` activations never reach memory)."""
        return self.swiglu(self.matmul(x, gate), self.matmul(x, up))

    def moe_matmul_swiglu(self, x, gate: Weight, up: Weight, ids):
        """``swiglu(moe_matmul(x, gate, ids), moe_matmul(x, up, ids))``: the experts' first half
        (``gate``/``up`` of ne ``[n_in, n_ff, E]``) -> ``[T, k, n_ff]``. One launch on CUDA when
        both have the same GGML type."""
        return self.swiglu(self.moe_matmul(x, gate, ids), self.moe_matmul(x, up, ids))

    def add_rmsnorm(self, a, b, w: Weight | None, eps: float) -> tuple[Any, Any]:
        """``(s, rmsnorm(s, w, eps))`` with ``s = add(a, b)``: a residual add and the following
        RMSNorm (over the last dimension) in one pass."""
        s = self.add(a, b)
        return s, self.rmsnorm(s, w, eps)

    def qk_norm_rope_store(self, q, k, v, q_norm: Weight | None, k_norm: Weight | None,
                           eps: float, pb, rope: RopeParams, k_cache, v_cache):
        """The attention prologue after the projections; returns the rotated queries.

        ``q [T, H, d_k]``, ``k [T, H_kv, d_k]``, ``v [T, H_kv, d_v]``. When ``q_norm`` is given,
        q is RMS-normalised per head (over ``d_k``) times ``q_norm`` (ne ``[d_k]``), likewise k
        with ``k_norm``; a None norm means no normalisation at all (not a weightless one). Then
        q and k are rotated by ``rope`` at the batch positions, and k (rotated) and v go to the
        cache cells ``[cell0, cell0 + T)`` of ``k_cache`` / ``v_cache``. Returns q rotated
        ``[T, H, d_k]``. Equals::

            if q_norm is not None: q = rmsnorm(q, q_norm, eps)
            if k_norm is not None: k = rmsnorm(k, k_norm, eps)
            q, k = rope(q, pb, rope), rope(k, pb, rope)
            kv_write(k_cache, v_cache, k, v, pb)
            return q
        """
        if q_norm is not None:
            q = self.rmsnorm(q, q_norm, eps)
        if k_norm is not None:
            k = self.rmsnorm(k, k_norm, eps)
        q = self.rope(q, pb, rope)
        k = self.rope(k, pb, rope)
        self.kv_write(k_cache, v_cache, k, v, pb)
        return q

    def rope_attention(self, q, k, v, q_norm: Weight | None, k_norm: Weight | None, eps: float,
                       pb, rope: RopeParams, k_cache, v_cache, scale: float):
        """:meth:`qk_norm_rope_store` then :meth:`attention` of its queries: the attention of
        the projections ``q``, ``k``, ``v`` (shapes as there) -> ``[T, H * d_v]``, with K and V
        of the batch in the cache afterwards. Equals::

            q = qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, pb, rope, k_cache, v_cache)
            return attention(q, k_cache, v_cache, pb, scale)
        """
        q = self.qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, pb, rope, k_cache, v_cache)
        return self.attention(q, k_cache, v_cache, pb, scale)

    # --- MoE (qwen3moe, qwen35moe, deepseek2) --------------------------------------------
    def moe_route(self, logits, k: int, gating: str = "softmax", norm: bool = True,
                  scale: float = 0.0, bias: Weight | None = None,
                  groups: tuple[int, int] = (0, 0)):
        """Router: ``logits [T, E]`` -> (expert ids ``[T, k]``, weights ``[T, k]``), spec §4.5.

        probs by ``gating``: "softmax" softmax(logits), "sigmoid", "softmax_weight" (the logits
        themselves; the weights become a softmax over the k selected), "sqrt_softplus". The
        selection scores are ``sel = probs + bias`` (``bias``: ne ``[E]``, DeepSeek-V3's
        ``exp_probs_b``; it changes which experts are chosen, never their weights). With
        ``groups = (G, G_used)``, G > 1 (DeepSeek's group-limited routing), the E experts form G
        consecutive groups; a group's score is the sum of its two largest sel; only the G_used
        best groups stay selectable (equal scores: the lower group index first). The k largest
        sel are selected, in descending order (equal values: the lower expert index first);
        their weights are their unbiased probs, divided by max(sum, 6.103515625e-5) when
        ``norm``, multiplied by ``scale`` when it is neither 0 nor 1. ``groups`` with G <= 1:
        no grouping. Stays on the device (no host round trip).
        """
        raise NotImplementedError

    def moe_matmul(self, x, w: Weight, ids):
        """Per selected expert: ``x`` (``[T, n_in]`` shared by the k experts, or ``[T, k, n_in]``)
        times expert ``ids[t, j]`` of ``w`` (ne ``[n_in, n_out, E]``) -> ``[T, k, n_out]``.
        Only the selected experts' weights are read."""
        raise NotImplementedError

    def moe_combine(self, y, weights):
        """``Σ_j weights[t, j] · y[t, j, :]`` -> ``[T, n]``."""
        raise NotImplementedError

    # --- results to the host -----------------------------------------------------------
    def argmax(self, logits) -> list[int]:
        """Index of the largest value of each row (first on ties)."""
        raise NotImplementedError

    def sample(self, logits, temperature: float, top_k: int, top_p: float, u: float,
               min_p: float = 0.0) -> int:
        """Draw a token from the last row of ``logits`` (see :mod:`reflex_core.sampling`)."""
        raise NotImplementedError

    def repeat_penalty(self, logits, token_ids: Sequence[int], penalty: float) -> None:
        """The repeat penalty (step 1 of :mod:`reflex_core.sampling`), in place on the last row
        of ``logits``: each distinct id of ``token_ids`` (in ``[0, V)``) once, a positive logit
        divided by ``penalty``, any other multiplied."""
        raise NotImplementedError

    def token_logprobs(self, logits, targets: Sequence[int]) -> list[float]:
        """``log_softmax(logits[i])[targets[i]]`` for each row i (full vocabulary, natural log)."""
        raise NotImplementedError

    def to_numpy(self, x):
        """Copy to a NumPy array (tests and ``reflex check`` only: imports NumPy)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until all queued work is done (a no-op on the CPU)."""
