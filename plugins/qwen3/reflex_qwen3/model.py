"""Dense Qwen3 (spec §5): GQA attention with per-head q/k RMSNorm before NEOX RoPE, SwiGLU FFN.

Written once against the ops interface; runs on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from reflex_core.plugin_api import (Batch, KVCache, Meta, Model, ModelError, Ops, RopeParams,
                                    Weight, blocks, rope_params)


@dataclass(frozen=True)
class Qwen3HParams:
    n_layer: int  # L: blocks executed (block_count - nextn_predict_layers)
    n_layer_all: int  # L_all: blocks in the file
    n_embd: int  # D
    n_head: int  # H
    n_head_kv: int  # H_kv
    head_dim: int  # d_h (key_length == value_length == n_rot)
    n_ff: int  # F
    n_vocab: int  # V
    n_ctx_train: int
    eps: float
    rope: RopeParams


def _uniform(meta: Meta, key: str, values: list[int]) -> int:
    if len(set(values)) != 1:
        raise ModelError(f"{meta.file}: per-layer values of {meta.key(key)!r} differ "
                         f"({values}); not supported for {meta.arch}")
    return values[0]


def read_hparams(gguf: Any, arch: str) -> Qwen3HParams:
    """Hyper-parameters per spec §3 / §5.1."""
    meta = Meta(gguf, arch)
    n_layer_all = meta.u32("block_count")
    n_nextn = meta.u32("nextn_predict_layers", 0)
    if not 0 < n_layer_all or n_nextn >= n_layer_all:
        raise ModelError(f"{meta.file}: block_count {n_layer_all} with {n_nextn} NextN layers "
                         f"leaves no blocks to run")
    n_embd = meta.u32("embedding_length")
    n_head = _uniform(meta, "attention.head_count",
                      meta.u32_or_array("attention.head_count", n_layer_all))
    if n_head <= 0:
        raise ModelError(f"{meta.file}: {meta.key('attention.head_count')} must be > 0")
    n_head_kv = _uniform(meta, "attention.head_count_kv",
                         meta.u32_or_array("attention.head_count_kv", n_layer_all, n_head))
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelError(f"{meta.file}: {n_head} query heads are not a multiple of "
                         f"{n_head_kv} KV heads")
    d_k = meta.u32("attention.key_length", n_embd // n_head)
    d_v = meta.u32("attention.value_length", n_embd // n_head)
    n_rot = meta.u32("rope.dimension_count", d_k)
    if not (d_k == d_v == n_rot) or d_k <= 0:
        raise ModelError(f"{meta.file}: {arch} needs key_length == value_length == "
                         f"rope.dimension_count (got {d_k}, {d_v}, {n_rot})")
    n_ff = _uniform(meta, "feed_forward_length",
                    meta.u32_or_array("feed_forward_length", n_layer_all))
    if n_ff <= 0:
        raise ModelError(f"{meta.file}: {meta.key('feed_forward_length')} must be > 0")
    return Qwen3HParams(
        n_layer=n_layer_all - n_nextn, n_layer_all=n_layer_all, n_embd=n_embd, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=d_k, n_ff=n_ff, n_vocab=meta.vocab_size(),
        n_ctx_train=meta.u32("context_length"), eps=meta.f32("attention.layer_norm_rms_epsilon"),
        rope=rope_params(meta, n_rot, "neox"))


@dataclass
class Qwen3Layer:
    attn_norm: Weight
    attn: blocks.AttnWeights
    ffn_norm: Weight
    ffn: Any  # blocks.FfnWeights here; a subclass may bind something else


class Qwen3(Model):
    """Dense Qwen3. Subclasses (e.g. MoE variants) override :meth:`bind_ffn` and :meth:`ffn`."""

    arch = "qwen3"

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        arch = gguf.get("general.architecture", self.arch) or self.arch
        self.hp = hp = self.read_hparams(gguf, arch)
        self.n_vocab = hp.n_vocab
        self.n_ctx_train = hp.n_ctx_train
        D = hp.n_embd
        self.token_embd = blocks.tensor(ops, "token_embd.weight", [D, hp.n_vocab])
        self.output_norm = blocks.tensor(ops, "output_norm.weight", [D])
        out: Optional[Weight] = blocks.optional_tensor(ops, "output.weight", [D, hp.n_vocab])
        self.tied = out is None
        self.output = self.token_embd if out is None else out
        self.layers = []
        for i in range(hp.n_layer):
            self.layers.append(Qwen3Layer(
                attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
                attn=blocks.bind_attn(ops, i, D, hp.n_head, hp.n_head_kv, hp.head_dim),
                ffn_norm=blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
                ffn=self.bind_ffn(ops, i)))

    # --- hooks for subclasses ------------------------------------------------------------
    def read_hparams(self, gguf: Any, arch: str) -> Qwen3HParams:
        return read_hparams(gguf, arch)

    def bind_ffn(self, ops: Ops, i: int) -> Any:
        return blocks.bind_ffn(ops, i, self.hp.n_embd, self.hp.n_ff)

    def ffn(self, x, layer: Qwen3Layer, i: int):
        f = layer.ffn
        return blocks.swiglu_ffn(self.ops, x, f.ffn_gate, f.ffn_up, f.ffn_down)

    # --- the model contract ----------------------------------------------------------------
    def new_cache(self, n_cells: int) -> KVCache:
        hp = self.hp
        return self.ops.new_kv_cache(hp.n_layer, n_cells, hp.n_head_kv, hp.head_dim, hp.head_dim)

    def forward(self, batch: Batch, cache: KVCache, out_rows: Sequence[int]) -> Any:
        ops, hp = self.ops, self.hp
        pb = ops.prepare(batch)
        x = ops.embed(self.token_embd, pb)
        for i, layer in enumerate(self.layers):
            a = ops.rmsnorm(x, layer.attn_norm, hp.eps)
            x = ops.add(x, blocks.gqa_attention(ops, a, layer.attn, cache, i, pb, hp.rope, hp.eps,
                                                hp.n_head, hp.n_head_kv, hp.head_dim))
            b = ops.rmsnorm(x, layer.ffn_norm, hp.eps)
            x = ops.add(x, self.ffn(b, layer, i))
        return blocks.lm_head(ops, x, self.output_norm, self.output, hp.eps, out_rows)
