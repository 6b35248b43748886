"""Forward-pass building blocks shared by architecture plugins, written only against :class:`Ops`.

Weight groups are small dataclasses whose fields are named after the GGUF tensor names
(``blk.{i}.attn_q.weight`` -> ``AttnWeights.attn_q``); ``bind_*`` helpers fetch them through
``ops.weight`` and check their shapes (spec ne order) so a malformed file fails at load time with
a :class:`ModelError` naming the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

from .errors import ModelError
from .ops import Ops, RopeParams, Weight


# --- shapes --------------------------------------------------------------------------------
def check_shape(w: Weight, ne: Sequence[int]) -> Weight:
    """Raise ModelError unless ``w.ne`` equals ``ne``, rank included: the backends lay a weight
    out by its rank (an expert tensor must be 3-D), so ``[D, F, E, 1]`` where ``[D, F, E]`` is
    expected would pass here and fail inside an op. (ggml-written files store no trailing 1s.)"""
    got = list(w.ne)
    want = list(ne)
    if got != want:
        raise ModelError(f"tensor {w.name!r} has shape {list(w.ne)}, expected {list(ne)}")
    return w


def tensor(ops: Ops, name: str, ne: Sequence[int]) -> Weight:
    """``ops.weight(name)`` checked against ``ne``."""
    return check_shape(ops.weight(name), ne)


def optional_tensor(ops: Ops, name: str, ne: Sequence[int]) -> Optional[Weight]:
    return tensor(ops, name, ne) if ops.has_weight(name) else None


# --- weight groups -------------------------------------------------------------------------
@dataclass
class AttnWeights:
    """Standard GQA attention of one block (``blk.{i}.attn_*``)."""

    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    attn_q_norm: Optional[Weight] = None
    attn_k_norm: Optional[Weight] = None
    # attn_{q,k,v}.bias where the file has them (spec §4.7)
    biases: tuple[Optional["Bias"], Optional["Bias"], Optional["Bias"]] = (None, None, None)


@dataclass
class FfnWeights:
    """Dense SwiGLU FFN (``blk.{i}.ffn_{gate,up,down}``)."""

    ffn_gate: Weight
    ffn_up: Weight
    ffn_down: Weight


@dataclass
class MoeWeights:
    """Routed experts (``blk.{i}.ffn_gate_inp``, ``ffn_{gate,up,down}_exps``)."""

    ffn_gate_inp: Weight
    ffn_gate_exps: Weight
    ffn_up_exps: Weight
    ffn_down_exps: Weight


@dataclass
class EmbedHeadWeights:
    """Token embedding, final norm and LM head (spec §9); ``output`` is ``token_embd`` when the
    file has no ``output.weight`` (tied embeddings, ``tied`` True)."""

    token_embd: Weight
    output_norm: Weight
    output: Weight
    tied: bool


def bind_embed_head(ops: Ops, n_embd: int, n_vocab: int) -> EmbedHeadWeights:
    """Bind and check ``token_embd`` ``[D, V]``, ``output_norm`` ``[D]`` and the optional
    ``output`` ``[D, V]``."""
    embd = tensor(ops, "token_embd.weight", [n_embd, n_vocab])
    out = optional_tensor(ops, "output.weight", [n_embd, n_vocab])
    return EmbedHeadWeights(token_embd=embd,
                            output_norm=tensor(ops, "output_norm.weight", [n_embd]),
                            output=embd if out is None else out, tied=out is None)


def _reject_unsupported(ops: Ops, i: int) -> None:
    for suffix in ("attn_q.scale", "attn_k.scale", "attn_v.scale", "attn_qkv.scale",
                   "attn_output.scale"):
        name = f"blk.{i}.{suffix}"
        if ops.has_weight(name):
            raise ModelError(f"tensor {name!r} is not supported (per-tensor scales)")


class Bias(NamedTuple):
    """A projection's bias: the elements of ``w`` from ``offset`` on (``Ops.add_bias``)."""

    w: Weight
    offset: int = 0


def bind_qkv_biases(ops: Ops, i: int, n_q: int, n_k: int,
                    n_v: int) -> tuple[Optional[Bias], Optional[Bias], Optional[Bias]]:
    """The biases of block i's q, k, v projections, each None where the file has none: a fused
    ``attn_qkv.bias`` ``[n_q + n_k + n_v]`` (q's, k's, v's elements in turn) when the file has
    one, else ``attn_{q,k,v}.bias`` -- llama.cpp adds what it finds after each projection (spec
    §4.7), beside separate or fused weights."""
    p = f"blk.{i}."
    fused = optional_tensor(ops, p + "attn_qkv.bias", [n_q + n_k + n_v])
    if fused is not None:
        return Bias(fused, 0), Bias(fused, n_q), Bias(fused, n_q + n_k)
    out = []
    for t, n in (("attn_q", n_q), ("attn_k", n_k), ("attn_v", n_v)):
        b = optional_tensor(ops, f"{p}{t}.bias", [n])
        out.append(None if b is None else Bias(b))
    return out[0], out[1], out[2]


def project_qkv(ops: Ops, x, ws: Sequence[Weight],
                biases: Sequence[Optional[Bias]] = (None, None, None)) -> list:
    """The q, k, v projections of ``x`` (one ``matmul_many``), each with its bias if any."""
    outs = ops.matmul_many(x, tuple(ws))
    return [y if b is None else ops.add_bias(y, b.w, b.offset) for y, b in zip(outs, biases)]


def bind_qkv(ops: Ops, i: int, n_embd: int, n_q: int, n_k: int,
             n_v: int) -> tuple[Weight, Weight, Weight]:
    """The q, k, v projections of block i: ``attn_{q,k,v}`` ``[D, n_q]``, ``[D, n_k]``,
    ``[D, n_v]``, or the rows of a fused ``attn_qkv`` ``[D, n_q + n_k + n_v]`` (spec §4.7: Q, K,
    V in that order), which llama.cpp takes in place of the three when the file has it."""
    p = f"blk.{i}."
    fused = optional_tensor(ops, p + "attn_qkv.weight", [n_embd, n_q + n_k + n_v])
    if fused is None:
        return (tensor(ops, p + "attn_q.weight", [n_embd, n_q]),
                tensor(ops, p + "attn_k.weight", [n_embd, n_k]),
                tensor(ops, p + "attn_v.weight", [n_embd, n_v]))
    return (ops.weight_rows(fused, 0, n_q), ops.weight_rows(fused, n_q, n_k),
            ops.weight_rows(fused, n_q + n_k, n_v))


def bind_attn(ops: Ops, i: int, n_embd: int, n_head: int, n_head_kv: int, head_dim_k: int,
              head_dim_v: Optional[int] = None, qk_norm: bool = True) -> AttnWeights:
    """Bind and check ``blk.{i}.attn_{q,k,v,output}`` (q/k/v or a fused ``attn_qkv``:
    :func:`bind_qkv`) and ``attn_{q,k}_norm`` when ``qk_norm``."""
    dv = head_dim_k if head_dim_v is None else head_dim_v
    _reject_unsupported(ops, i)
    p = f"blk.{i}."
    n_q, n_k, n_v = n_head * head_dim_k, n_head_kv * head_dim_k, n_head_kv * dv
    q, k, v = bind_qkv(ops, i, n_embd, n_q, n_k, n_v)
    return AttnWeights(
        attn_q=q, attn_k=k, attn_v=v, biases=bind_qkv_biases(ops, i, n_q, n_k, n_v),
        attn_output=tensor(ops, p + "attn_output.weight", [n_head * dv, n_embd]),
        attn_q_norm=tensor(ops, p + "attn_q_norm.weight", [head_dim_k]) if qk_norm else None,
        attn_k_norm=tensor(ops, p + "attn_k_norm.weight", [head_dim_k]) if qk_norm else None,
    )


def bind_ffn(ops: Ops, i: int, n_embd: int, n_ff: int) -> FfnWeights:
    p = f"blk.{i}."
    for suffix in ("ffn_gate.scale", "ffn_up.scale", "ffn_down.scale"):
        if ops.has_weight(p + suffix):
            raise ModelError(f"tensor {p + suffix!r} is not supported (per-tensor scales)")
    return FfnWeights(
        ffn_gate=tensor(ops, p + "ffn_gate.weight", [n_embd, n_ff]),
        ffn_up=tensor(ops, p + "ffn_up.weight", [n_embd, n_ff]),
        ffn_down=tensor(ops, p + "ffn_down.weight", [n_ff, n_embd]),
    )


def bind_moe(ops: Ops, i: int, n_embd: int, n_ff_exp: int, n_expert: int,
             fused_gate_up: bool = False) -> MoeWeights:
    """Bind and check the router ``ffn_gate_inp`` ``[D, E]`` and the expert tensors
    ``ffn_{gate,up}_exps`` ``[D, F_e, E]``, ``ffn_down_exps`` ``[F_e, D, E]`` of block i.
    ``fused_gate_up``: the family's llama.cpp graph also takes a fused ``ffn_gate_up_exps``
    ``[D, 2 F_e, E]`` (each expert's gate rows, then its up rows: spec §4.2) in place of the
    two; elsewhere such a tensor is refused, as llama.cpp's loader refuses the file."""
    p = f"blk.{i}."
    fused_name = p + "ffn_gate_up_exps.weight"
    fused = ops.has_weight(fused_name)
    if fused and not fused_gate_up:
        raise ModelError(f"tensor {fused_name!r} (fused gate/up experts) is not supported for "
                         f"this architecture (llama.cpp reads it for qwen35moe and deepseek2)")
    for suffix in ("ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias",
                   "ffn_gate_up_exps.bias", "ffn_down_exps.bias", "ffn_gate_exps.scale",
                   "ffn_up_exps.scale", "ffn_gate_up_exps.scale", "ffn_down_exps.scale"):
        if ops.has_weight(p + suffix):
            raise ModelError(f"tensor {p + suffix!r} is not supported (router / expert biases, "
                             f"per-tensor scales)")
    if fused:
        both = tensor(ops, fused_name, [n_embd, 2 * n_ff_exp, n_expert])
        gate, up = ops.weight_rows(both, 0, n_ff_exp), ops.weight_rows(both, n_ff_exp, n_ff_exp)
    else:
        gate = tensor(ops, p + "ffn_gate_exps.weight", [n_embd, n_ff_exp, n_expert])
        up = tensor(ops, p + "ffn_up_exps.weight", [n_embd, n_ff_exp, n_expert])
    return MoeWeights(
        ffn_gate_inp=tensor(ops, p + "ffn_gate_inp.weight", [n_embd, n_expert]),
        ffn_gate_exps=gate, ffn_up_exps=up,
        ffn_down_exps=tensor(ops, p + "ffn_down_exps.weight", [n_ff_exp, n_embd, n_expert]),
    )


# --- blocks --------------------------------------------------------------------------------
def residual_rmsnorm(ops: Ops, x, delta, w: Weight, eps: float):
    """The pre-norm residual step of a block loop: ``(x + delta, rmsnorm(x + delta) * w)``
    (one fused op); ``delta`` None (the first block) gives ``(x, rmsnorm(x) * w)``.

    A layer loop keeps the last branch output pending and folds it into the next norm::

        x, h = ops.embed(tok, pb), None
        for layer in layers:
            x, a = residual_rmsnorm(ops, x, h, layer.attn_norm, eps)
            h = gqa_attention(ops, a, layer.attn, state.kv(i), pb, ...)
            x, b = ops.add_rmsnorm(x, h, layer.ffn_norm, eps)
            h = swiglu_ffn(ops, b, ...)
        logits = lm_head(ops, x, out_norm, out_w, eps, rows, residual=h)
    """
    if delta is None:
        return x, ops.rmsnorm(x, w, eps)
    return ops.add_rmsnorm(x, delta, w, eps)


def gqa_attention(ops: Ops, x, w: AttnWeights, kv: tuple, pb, rope: RopeParams, eps: float,
                  n_head: int, n_head_kv: int, head_dim: int, head_dim_v: Optional[int] = None,
                  scale: Optional[float] = None):
    """Self-attention of the (already normalised) input ``x [T, D]`` -> ``[T, D]`` (spec §4.4).

    q/k/v projections (and their biases, if any); per-head RMSNorm of q and k (weights shared by
    heads) BEFORE RoPE when the norms are given; RoPE of q and k; K/V written to cells
    ``[cell0, cell0 + T)`` of the layer's state buffers ``kv = (k_cache, v_cache)``
    (``state.kv(layer)``); attention over cells ``[0, n_kv)`` under the batch mask with ``scale``
    (default ``1/sqrt(head_dim)``); output projection. (``matmul_many`` and ``rope_attention``
    are those steps fused.)
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    T = ops.shape(x)[0]
    q, k, v = project_qkv(ops, x, (w.attn_q, w.attn_k, w.attn_v), w.biases)
    o = ops.rope_attention(ops.view(q, (T, n_head, head_dim)),
                           ops.view(k, (T, n_head_kv, head_dim)), ops.view(v, (T, n_head_kv, dv)),
                           w.attn_q_norm, w.attn_k_norm, eps, pb, rope, kv[0], kv[1],
                           1.0 / math.sqrt(head_dim) if scale is None else scale)
    return ops.matmul(o, w.attn_output)


def swiglu_ffn(ops: Ops, x, gate: Weight, up: Weight, down: Weight):
    """``W_down · (silu(W_gate·x) ⊙ W_up·x)`` (spec §4.2)."""
    return ops.matmul(ops.matmul_swiglu(x, gate, up), down)


def moe_ffn(ops: Ops, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight,
            k: int, gating: str = "softmax", norm: bool = True, scale: float = 0.0,
            bias: Optional[Weight] = None, groups: tuple[int, int] = (0, 0)):
    """Routed experts (spec §4.5): ``x [T, D]`` -> ``[T, D]``; ``bias`` (the expert-selection
    bias ``exp_probs_b``) and ``groups`` (expert group count, groups used) as
    :meth:`Ops.moe_route` takes them."""
    ids, weights = ops.moe_route(ops.matmul(x, router), k, gating, norm, scale, bias, groups)
    y = ops.moe_matmul(ops.moe_matmul_swiglu(x, gate_exps, up_exps, ids), down_exps, ids)
    return ops.moe_combine(y, weights)


def lm_head(ops: Ops, x, out_norm: Weight, out_w: Weight, eps: float, rows: Sequence[int],
            residual=None):
    """Logits of the batch rows ``rows``: RMSNorm then ``W_out`` (spec §9), the matmul computed
    only for the requested rows. ``residual``: a last branch output still to be added to ``x``
    (see :func:`residual_rmsnorm`); the add and the norm then run fused over all rows."""
    if residual is None:
        return ops.matmul(ops.rmsnorm(ops.take_rows(x, rows), out_norm, eps), out_w)
    _, h = ops.add_rmsnorm(x, residual, out_norm, eps)
    return ops.matmul(ops.take_rows(h, rows), out_w)
