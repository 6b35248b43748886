"""Dense Qwen3 (spec §5): GQA attention with per-head q/k RMSNorm before NEOX RoPE, SwiGLU FFN.

The configuration and the weight groups come from the core; the forward pass is written once
against the ops interface and runs on every backend. State: K and V of every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reflex_core.plugin_api import (AttentionConfig, Batch, Meta, Model, Ops, State, StateSpec,
                                    Weight, attention_kv_spec, blocks)


@dataclass(frozen=True)
class Qwen3Config(AttentionConfig):
    """Spec §3 / §5.1: a dense FFN, ``key_length == value_length == rope.dimension_count``,
    NEOX RoPE."""

    def check(self, meta: Meta) -> None:
        super().check(meta)
        self.require_full_rotary(meta)
        self.require_dense_ffn(meta)


@dataclass
class Qwen3Layer:
    attn_norm: Weight
    attn: blocks.AttnWeights
    ffn_norm: Weight
    ffn: blocks.FfnWeights


class Qwen3(Model):
    """Dense Qwen3."""

    arch = "qwen3"

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        cfg = self.configure(Qwen3Config)
        D = cfg.n_embd
        self.layers = [
            Qwen3Layer(
                attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                attn=blocks.bind_attn(ops, i, D, cfg.n_head, cfg.n_head_kv, cfg.head_dim),
                ffn_norm=blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
                ffn=blocks.bind_ffn(ops, i, D, cfg.n_ff))
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
            f = layer.ffn
            h = blocks.swiglu_ffn(ops, b, f.ffn_gate, f.ffn_up, f.ffn_down)
        return blocks.lm_head(ops, x, self.output_norm, self.output, cfg.eps, out_rows,
                              residual=h)
