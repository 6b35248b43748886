"""``testgated``: Qwen3's layout and attention; the FFN output of every block is multiplied by
the sigmoid of the FFN input (``ops.testop_sigmoid_mul``, this plugin's op). Test only."""

from __future__ import annotations

from typing import Any, Sequence

from reflex_core.plugin_api import (AttentionConfig, Meta, Model, State, StateSpec,
                                    attention_kv_spec, blocks)


class TestGatedConfig(AttentionConfig):
    def check(self, meta: Meta) -> None:
        super().check(meta)
        self.require_full_rotary(meta)
        self.require_dense_ffn(meta)


class TestGated(Model):
    arch = "testgated"

    def __init__(self, gguf: Any, ops: Any) -> None:
        super().__init__(gguf, ops)
        cfg = self.configure(TestGatedConfig)
        D = cfg.n_embd
        self.layers = [(blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                        blocks.bind_attn(ops, i, D, cfg.n_head, cfg.n_head_kv, cfg.head_dim),
                        blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
                        blocks.bind_ffn(ops, i, D, cfg.n_ff)) for i in range(cfg.n_layer)]

    def state_spec(self) -> StateSpec:
        return attention_kv_spec(self.cfg.n_layer, self.cfg.n_head_kv, self.cfg.head_dim)

    def forward(self, batch, state: State, out_rows: Sequence[int]) -> Any:
        ops, cfg = self.ops, self.cfg
        pb = ops.prepare(batch)
        x, h = ops.embed(self.token_embd, pb), None
        for i, (attn_norm, attn, ffn_norm, f) in enumerate(self.layers):
            x, a = blocks.residual_rmsnorm(ops, x, h, attn_norm, cfg.eps)
            h = blocks.gqa_attention(ops, a, attn, state.kv(i), pb, cfg.rope, cfg.eps,
                                     cfg.n_head, cfg.n_head_kv, cfg.head_dim)
            x, b = ops.add_rmsnorm(x, h, ffn_norm, cfg.eps)
            h = ops.testop_sigmoid_mul(blocks.swiglu_ffn(ops, b, f.ffn_gate, f.ffn_up, f.ffn_down), b)
        return blocks.lm_head(ops, x, self.output_norm, self.output, cfg.eps, out_rows,
                              residual=h)
