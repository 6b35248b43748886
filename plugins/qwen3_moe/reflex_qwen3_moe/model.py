"""Qwen3-MoE (spec §6): Qwen3's attention (GQA, per-head q/k RMSNorm before NEOX RoPE) with a
routed-expert FFN in every block.

FFN of one token ``b`` (the ffn_norm output), spec §6.3 / §4.5 with gating softmax, norm_w true,
no weight scale, no selection bias, no groups, no shared experts:

    probs = softmax(W_gate_inp · b)            over all E experts (router ne [D, E])
    S     = the k largest probs                k = expert_used_count
    w_e   = probs[e] / max(Σ_S probs, 6.103515625e-5)
    out   = Σ_{e∈S} w_e · W_down[e] · (silu(W_gate[e]·b) ⊙ W_up[e]·b)

written with the core ops ``moe_route`` / ``moe_matmul_swiglu`` / ``moe_matmul`` / ``moe_combine``
(``blocks.moe_ffn``): the selected expert ids stay backend tensors, nothing goes to the host
during a forward pass.
The configuration and weight groups come from the core; nothing here depends on another plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reflex_core.plugin_api import (Batch, Meta, MoEConfig, Model, Ops, State, StateSpec, Weight,
                                    attention_kv_spec, blocks)

# spec §6.1 / §13.20: qwen3moe always renormalises the top-k weights; no w_scale
GATING = "softmax"
NORM_TOPK = True
W_SCALE = 0.0


@dataclass(frozen=True)
class Qwen3MoEConfig(MoEConfig):
    """Spec §3 / §6.1: E > 0, 0 < k <= E, F_e from ``expert_feed_forward_length`` (else F / k),
    ``key_length == value_length == rope.dimension_count``, NEOX RoPE."""

    def check(self, meta: Meta) -> None:
        super().check(meta)
        self.require_full_rotary(meta)


@dataclass
class Qwen3MoELayer:
    attn_norm: Weight
    attn: blocks.AttnWeights
    ffn_norm: Weight
    moe: blocks.MoeWeights


class Qwen3MoE(Model):
    """Qwen3-MoE: every block's FFN is a softmax-routed top-k mixture of SwiGLU experts."""

    arch = "qwen3moe"

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        cfg = self.configure(Qwen3MoEConfig)
        D = cfg.n_embd
        self.layers = [
            Qwen3MoELayer(
                attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                attn=blocks.bind_attn(ops, i, D, cfg.n_head, cfg.n_head_kv, cfg.head_dim),
                ffn_norm=blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
                moe=blocks.bind_moe(ops, i, D, cfg.n_ff_exp, cfg.n_expert))
            for i in range(cfg.n_layer)]

    def state_spec(self) -> StateSpec:
        cfg = self.cfg
        return attention_kv_spec(cfg.n_layer, cfg.n_head_kv, cfg.head_dim)

    def forward(self, batch: Batch, state: State, out_rows: Sequence[int]) -> Any:
        ops, cfg = self.ops, self.cfg
        pb = ops.prepare(batch)
        # pre-norm residual blocks; h, the last branch output, is added to x by the next
        # (fused add + RMSNorm) op
        x, h = ops.embed(self.token_embd, pb), None
        for i, layer in enumerate(self.layers):
            x, a = blocks.residual_rmsnorm(ops, x, h, layer.attn_norm, cfg.eps)
            h = blocks.gqa_attention(ops, a, layer.attn, state.kv(i), pb, cfg.rope, cfg.eps,
                                     cfg.n_head, cfg.n_head_kv, cfg.head_dim)
            x, b = ops.add_rmsnorm(x, h, layer.ffn_norm, cfg.eps)
            m = layer.moe
            h = blocks.moe_ffn(ops, b, m.ffn_gate_inp, m.ffn_gate_exps, m.ffn_up_exps,
                               m.ffn_down_exps, cfg.n_expert_used, GATING, NORM_TOPK, W_SCALE,
                               groups=(cfg.n_expert_groups, cfg.n_group_used))
        return blocks.lm_head(ops, x, self.output_norm, self.output, cfg.eps, out_rows,
                              residual=h)
