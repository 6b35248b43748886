"""Qwen3.5 hybrid models (spec §7): ``qwen35`` (dense SwiGLU) and ``qwen35moe`` (routed experts
plus a sigmoid-gated shared expert).

Every executed layer is ``h = x + Mixer(RMSNorm(x))``, ``x' = h + FFN(RMSNorm(h))``; the mixer is
either a Gated DeltaNet (a recurrent layer: causal conv1d with state, the gated delta rule with a
``d_k x d_v`` state per value head, gated RMSNorm) or gated full attention (query and output gate
interleaved per head in ``attn_q``, q/k RMSNorm, RoPE over the first ``n_rot`` of ``d_h`` dims).
MTP blocks at the end of the file are not run. The norm weights already hold the converter's
``+1`` and ``ssm_a`` is already ``-exp(A_log)`` (spec §7.4): both are used as stored.

State: K and V of each attention layer (per token), and per sequence a conv window
``conv.{i}`` ``[conv_dim, K_c - 1]`` and the delta-rule matrices ``ssm.{i}`` ``[H_v, d_v, d_k]``
of each recurrent layer, both in llama.cpp's memory layout (spec §7.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from reflex_core.plugin_api import (Batch, BufferSpec, Model, ModelError, Ops, State,
                                    StateSpec, Weight, attention_kv, blocks)

from .config import Qwen35Config, Qwen35MoEConfig

# spec §7.7: qwen35moe routes like qwen3moe -- softmax, top-k renormalised, no weight scale
GATING = "softmax"
NORM_TOPK = True
W_SCALE = 0.0


@dataclass
class GatedAttnWeights:
    """A full-attention layer: ``attn_q`` holds ``[q_h, gate_h]`` per head (ne ``[D, 2 H d_h]``)."""

    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    attn_q_norm: Weight
    attn_k_norm: Weight
    biases: tuple = (None, None, None)  # attn_{q,k,v}.bias where the file has them (spec §4.7)


@dataclass
class DeltaNetWeights:
    """A Gated DeltaNet layer (spec §7.3)."""

    attn_qkv: Weight  # in-projection of the conv channels [q | k | v]
    attn_gate: Weight  # z, the output gate
    ssm_beta: Weight
    ssm_alpha: Weight
    ssm_conv1d: Weight
    ssm_dt: Weight
    ssm_a: Weight
    ssm_norm: Weight
    ssm_out: Weight


@dataclass
class SharedExpertWeights:
    ffn_gate_inp_shexp: Weight  # ne [D] (or [D, 1]): the shared expert's sigmoid gate
    ffn: blocks.FfnWeights  # ffn_{gate,up,down}_shexp


@dataclass
class Qwen35Layer:
    attn_norm: Weight
    mixer: Any  # DeltaNetWeights or GatedAttnWeights
    post_attention_norm: Weight
    ffn: Any  # blocks.FfnWeights (qwen35) or (blocks.MoeWeights, SharedExpertWeights)


def _bind_gated_attn(ops: Ops, i: int, D: int, H: int, H_kv: int, d_h: int) -> GatedAttnWeights:
    p = f"blk.{i}."
    t = blocks.tensor
    # q's rows hold each head's query then its output gate (spec §7.3), its bias likewise
    n_q, n_kv = 2 * H * d_h, H_kv * d_h
    q, k, v = blocks.bind_qkv(ops, i, D, n_q, n_kv, n_kv)
    return GatedAttnWeights(
        attn_q=q, attn_k=k, attn_v=v, biases=blocks.bind_qkv_biases(ops, i, n_q, n_kv, n_kv),
        attn_output=t(ops, p + "attn_output.weight", [H * d_h, D]),
        attn_q_norm=t(ops, p + "attn_q_norm.weight", [d_h]),
        attn_k_norm=t(ops, p + "attn_k_norm.weight", [d_h]))


def _bind_delta_net(ops: Ops, i: int, cfg: Qwen35Config) -> DeltaNetWeights:
    p = f"blk.{i}."
    D, Hv, value_dim = cfg.n_embd, cfg.n_v_heads, cfg.d_inner
    t = blocks.tensor
    return DeltaNetWeights(
        attn_qkv=t(ops, p + "attn_qkv.weight", [D, cfg.conv_dim]),
        attn_gate=t(ops, p + "attn_gate.weight", [D, value_dim]),
        ssm_beta=t(ops, p + "ssm_beta.weight", [D, Hv]),
        ssm_alpha=t(ops, p + "ssm_alpha.weight", [D, Hv]),
        ssm_conv1d=t(ops, p + "ssm_conv1d.weight", [cfg.conv_kernel, cfg.conv_dim]),
        ssm_dt=t(ops, p + "ssm_dt.bias", [Hv]),
        ssm_a=t(ops, p + "ssm_a", [Hv]),
        ssm_norm=t(ops, p + "ssm_norm.weight", [cfg.d_v]),
        ssm_out=t(ops, p + "ssm_out.weight", [value_dim, D]))


def _bind_shared_expert(ops: Ops, i: int, D: int, F_s: int) -> SharedExpertWeights:
    p = f"blk.{i}."
    name = p + "ffn_gate_inp_shexp.weight"
    gate = ops.weight(name)
    if list(gate.ne) not in ([D], [D, 1]):
        raise ModelError(f"tensor {name!r} has shape {list(gate.ne)}, expected [{D}] or "
                         f"[{D}, 1]")
    t = blocks.tensor
    return SharedExpertWeights(gate, blocks.FfnWeights(
        ffn_gate=t(ops, p + "ffn_gate_shexp.weight", [D, F_s]),
        ffn_up=t(ops, p + "ffn_up_shexp.weight", [D, F_s]),
        ffn_down=t(ops, p + "ffn_down_shexp.weight", [F_s, D])))


class Qwen35(Model):
    """Qwen3.5 dense: Gated DeltaNet and gated attention layers, SwiGLU FFN."""

    arch = "qwen35"
    config_class: type = Qwen35Config

    @classmethod
    def lora_applies(cls, name: str) -> bool:
        # the short convolution runs as ggml_ssm_conv, outside llama.cpp's LoRA path
        return not name.endswith(".ssm_conv1d.weight")

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        cfg = self.configure(self.config_class)
        D = cfg.n_embd
        self.layers = []
        for i in range(cfg.n_layer):
            if cfg.recurrent[i]:
                mixer: Any = _bind_delta_net(ops, i, cfg)
            else:
                mixer = _bind_gated_attn(ops, i, D, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
            self.layers.append(Qwen35Layer(
                attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                mixer=mixer,
                post_attention_norm=blocks.tensor(ops, f"blk.{i}.post_attention_norm.weight",
                                                  [D]),
                ffn=self._bind_ffn(ops, i)))

    def _bind_ffn(self, ops: Ops, i: int) -> Any:
        cfg = self.cfg
        return blocks.bind_ffn(ops, i, cfg.n_embd, cfg.n_ff)

    def _ffn(self, b: Any, ffn: Any) -> Any:
        return blocks.swiglu_ffn(self.ops, b, ffn.ffn_gate, ffn.ffn_up, ffn.ffn_down)

    # --- state ---------------------------------------------------------------------------------
    def state_spec(self) -> StateSpec:
        cfg = self.cfg
        bufs: list[BufferSpec] = []
        for i in range(cfg.n_layer):
            if cfg.recurrent[i]:
                bufs.append(BufferSpec(f"conv.{i}", (cfg.conv_dim, cfg.conv_kernel - 1), False))
                bufs.append(BufferSpec(f"ssm.{i}", (cfg.n_v_heads, cfg.d_v, cfg.d_k), False))
            else:
                bufs.extend(attention_kv(i, cfg.n_head_kv, cfg.head_dim))
        return StateSpec(bufs)

    # --- forward -------------------------------------------------------------------------------
    def forward(self, batch: Batch, state: State, out_rows: Sequence[int]) -> Any:
        ops, cfg = self.ops, self.cfg
        pb = ops.prepare(batch)
        # pre-norm residual blocks; h, the last branch output, is added to x by the next
        # (fused add + RMSNorm) op
        x, h = ops.embed(self.token_embd, pb), None
        for i, layer in enumerate(self.layers):
            x, a = blocks.residual_rmsnorm(ops, x, h, layer.attn_norm, cfg.eps)
            if cfg.recurrent[i]:
                h = self._delta_net(a, layer.mixer, state, i, pb)
            else:
                h = self._gated_attention(a, layer.mixer, state.kv(i), pb)
            x, b = ops.add_rmsnorm(x, h, layer.post_attention_norm, cfg.eps)
            h = self._ffn(b, layer.ffn)
        return blocks.lm_head(ops, x, self.output_norm, self.output, cfg.eps, out_rows,
                              residual=h)

    def _delta_net(self, a: Any, w: DeltaNetWeights, state: State, i: int, pb: Any) -> Any:
        """Spec §7.6 for the batch's sequence runs, each from its own slot of the state."""
        ops, cfg = self.ops, self.cfg
        mixed, z, beta, alpha = ops.matmul_many(a, (w.attn_qkv, w.attn_gate, w.ssm_beta,
                                                    w.ssm_alpha))
        y = ops.qwen35_conv(mixed, state[f"conv.{i}"], w.ssm_conv1d, pb)
        o = ops.qwen35_delta_rule(y, beta, alpha, w.ssm_a, w.ssm_dt, state[f"ssm.{i}"], pb,
                                  cfg.n_k_heads, cfg.eps)
        return ops.matmul(ops.qwen35_gated_norm(o, z, w.ssm_norm, cfg.eps), w.ssm_out)

    def _gated_attention(self, a: Any, w: GatedAttnWeights, kv: tuple, pb: Any) -> Any:
        """Spec §7.5: gated attention over this layer's K/V cells."""
        ops, cfg = self.ops, self.cfg
        H, H_kv, d_h = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        T = ops.shape(a)[0]
        qg, k, v = blocks.project_qkv(ops, a, (w.attn_q, w.attn_k, w.attn_v), w.biases)
        o = ops.rope_attention(ops.qwen35_take_q(qg, H), ops.view(k, (T, H_kv, d_h)),
                               ops.view(v, (T, H_kv, d_h)), w.attn_q_norm, w.attn_k_norm,
                               cfg.eps, pb, cfg.rope, kv[0], kv[1], 1.0 / math.sqrt(d_h))
        return ops.matmul(ops.qwen35_gate_output(o, qg, H), w.attn_output)


class Qwen35MoE(Qwen35):
    """Qwen3.5 MoE: the same mixers; every FFN is softmax-routed top-k experts plus a shared
    expert scaled by ``sigmoid(ffn_gate_inp_shexp · b)`` (spec §7.7)."""

    arch = "qwen35moe"
    config_class = Qwen35MoEConfig

    def _bind_ffn(self, ops: Ops, i: int) -> Any:
        cfg = self.cfg
        return (blocks.bind_moe(ops, i, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert,
                                fused_gate_up=True),
                _bind_shared_expert(ops, i, cfg.n_embd, cfg.n_ff_shexp))

    def _ffn(self, b: Any, ffn: Any) -> Any:
        ops, cfg = self.ops, self.cfg
        m, sh = ffn
        routed = blocks.moe_ffn(ops, b, m.ffn_gate_inp, m.ffn_gate_exps, m.ffn_up_exps,
                                m.ffn_down_exps, cfg.n_expert_used, GATING, NORM_TOPK, W_SCALE,
                                groups=(cfg.n_expert_groups, cfg.n_group_used))
        shared = blocks.swiglu_ffn(ops, b, sh.ffn.ffn_gate, sh.ffn.ffn_up, sh.ffn.ffn_down)
        return ops.qwen35_shexp_combine(routed, shared, b, sh.ffn_gate_inp_shexp)

