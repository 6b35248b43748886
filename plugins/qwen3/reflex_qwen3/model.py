"""Dense Qwen3 (spec §5): GQA attention with per-head q/k RMSNorm before NEOX RoPE, SwiGLU FFN.

Hyper-parameters (spec §3) and the weight groups come from the core; the forward pass is written
once against the ops interface and runs on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reflex_core.plugin_api import (Batch, KVCache, Model, Ops, TransformerHParams, Weight, blocks,
                                    read_transformer_hparams)


def read_hparams(gguf: Any, arch: str = "qwen3") -> TransformerHParams:
    """Hyper-parameters per spec §3 / §5.1: a dense FFN, ``key_length == value_length ==
    rope.dimension_count``, NEOX RoPE."""
    return read_transformer_hparams(gguf, arch, ffn="dense", full_rotary=True, rope_mode="neox")


@dataclass
class Qwen3Layer:
    attn_norm: Weight
    attn: blocks.AttnWeights
    ffn_norm: Weight
    ffn: blocks.FfnWeights


class Qwen3(Model):
    """Dense Qwen3."""

    arch = "qwen3"
    supports_tree_mask = True

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        arch = gguf.get("general.architecture", self.arch) or self.arch
        self.hp = hp = read_hparams(gguf, arch)
        self.n_vocab = hp.n_vocab
        self.n_ctx_train = hp.n_ctx_train
        D = hp.n_embd
        io = blocks.bind_embed_head(ops, D, hp.n_vocab)
        self.token_embd, self.output_norm, self.output, self.tied = (
            io.token_embd, io.output_norm, io.output, io.tied)
        self.layers = [
            Qwen3Layer(
                attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                attn=blocks.bind_attn(ops, i, D, hp.n_head, hp.n_head_kv, hp.head_dim),
                ffn_norm=blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
                ffn=blocks.bind_ffn(ops, i, D, hp.n_ff))
            for i in range(hp.n_layer)]

    def new_cache(self, n_cells: int) -> KVCache:
        hp = self.hp
        return self.ops.new_kv_cache(hp.n_layer, n_cells, hp.n_head_kv, hp.head_dim, hp.head_dim)

    def forward(self, batch: Batch, cache: KVCache, out_rows: Sequence[int]) -> Any:
        ops, hp = self.ops, self.hp
        pb = ops.prepare(batch)
        # pre-norm residual blocks; h, the last branch output, is added to x by the next
        # (fused add + RMSNorm) op
        x, h = ops.embed(self.token_embd, pb), None
        for i, layer in enumerate(self.layers):
            x, a = blocks.residual_rmsnorm(ops, x, h, layer.attn_norm, hp.eps)
            h = blocks.gqa_attention(ops, a, layer.attn, cache, i, pb, hp.rope, hp.eps,
                                     hp.n_head, hp.n_head_kv, hp.head_dim)
            x, b = ops.add_rmsnorm(x, h, layer.ffn_norm, hp.eps)
            f = layer.ffn
            h = blocks.swiglu_ffn(ops, b, f.ffn_gate, f.ffn_up, f.ffn_down)
        return blocks.lm_head(ops, x, self.output_norm, self.output, hp.eps, out_rows,
                              residual=h)
