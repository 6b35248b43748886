"""DeepSeek-V2 / V2-Lite / V3 (spec §8): multi-head latent attention, DeepSeek's MoE.

Attention, MLA files (spec §8.4, llama.cpp's absorbed form for every batch size): each token
caches ONE row per layer, ``[RMSNorm(c_kv) ; RoPE(k_pe)]`` (``kv_lora_rank + n_rot`` values,
shared by every head); the query of head h is ``[W_UK,hᵀ q_nope_h ; RoPE(q_pe_h)]`` (the
absorbed ``attn_k_b``), attention runs over the latent rows with V = their first
``kv_lora_rank`` columns, and ``attn_v_b`` maps each head's latent output to ``d_v``. The
per-head products with ``attn_k_b`` / ``attn_v_b`` (ne ``[n_in, n_out, H]``) are the core's
``moe_matmul`` with head h as "expert" h. Legacy files (spec §8.6) decompress ``attn_kv_b`` into
per-head K/V and use the core's attention; their K/V rows are laid out ``[pe ; nope]`` so that
the core's RoPE (first ``n_rot`` dims, NORM pairs) applies -- dot products do not depend on the
order of the dimensions.

Files with ``attention.temperature_scale`` (Mistral-Large-3) multiply each token's rotated query by
a factor that grows with its position (Llama-4's temperature tuning), in both forms.

FFN (spec §8.5): the first ``leading_dense_block_count`` layers are dense SwiGLU; the others route
with the file's gating, selection bias, expert groups, normalisation and scale, and add the
shared experts (ungated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from reflex_core.plugin_api import (Batch, BufferSpec, Model, ModelError, Ops, State, StateSpec,
                                    ViewSpec, Weight, attention_kv, blocks)

from .config import DeepSeek2Config


@dataclass
class MlaWeights:
    attn_q: Optional[Weight]  # lite files: ne [D, H d_qk]
    attn_q_a: Optional[Weight]  # query LoRA: ne [D, r_q] ...
    attn_q_a_norm: Optional[Weight]
    attn_q_b: Optional[Weight]  # ... and [r_q, H d_qk]
    attn_kv_a_mqa: Weight  # ne [D, r_kv + n_rot]: [c_kv | k_pe]
    attn_kv_a_norm: Weight
    attn_k_b: Optional[Weight]  # MLA files: ne [d_nope, r_kv, H]
    attn_v_b: Optional[Weight]  # MLA files: ne [r_kv, d_v, H]
    attn_kv_b: Optional[Weight]  # legacy files: ne [r_kv, H (d_nope + d_v)]
    attn_output: Weight


@dataclass
class MoeLayerWeights:
    moe: blocks.MoeWeights
    exp_probs_b: Optional[Weight]  # ne [E]: selection bias (V3)
    shared: blocks.FfnWeights  # ffn_{gate,up,down}_shexp, width F_e * n_shared


@dataclass
class DeepSeek2Layer:
    attn_norm: Weight
    attn: MlaWeights
    ffn_norm: Weight
    ffn: Any  # blocks.FfnWeights (dense lead layers) or MoeLayerWeights


def _bind_attn(ops: Ops, i: int, cfg: DeepSeek2Config) -> MlaWeights:
    p = f"blk.{i}."
    D, H = cfg.n_embd, cfg.n_head
    t = blocks.tensor
    r_kv, n_rot = cfg.kv_lora_rank, cfg.n_rot
    lora = cfg.q_lora_rank > 0
    return MlaWeights(
        attn_q=None if lora else t(ops, p + "attn_q.weight", [D, H * cfg.d_qk]),
        attn_q_a=t(ops, p + "attn_q_a.weight", [D, cfg.q_lora_rank]) if lora else None,
        attn_q_a_norm=t(ops, p + "attn_q_a_norm.weight", [cfg.q_lora_rank]) if lora else None,
        attn_q_b=t(ops, p + "attn_q_b.weight", [cfg.q_lora_rank, H * cfg.d_qk]) if lora else None,
        attn_kv_a_mqa=t(ops, p + "attn_kv_a_mqa.weight", [D, r_kv + n_rot]),
        attn_kv_a_norm=t(ops, p + "attn_kv_a_norm.weight", [r_kv]),
        attn_k_b=t(ops, p + "attn_k_b.weight", [cfg.d_nope, r_kv, H]) if cfg.is_mla else None,
        attn_v_b=t(ops, p + "attn_v_b.weight", [r_kv, cfg.d_v, H]) if cfg.is_mla else None,
        attn_kv_b=None if cfg.is_mla else t(ops, p + "attn_kv_b.weight",
                                            [r_kv, H * (cfg.d_nope + cfg.d_v)]),
        attn_output=t(ops, p + "attn_output.weight", [H * cfg.d_v, D]))


def _bind_ffn(ops: Ops, i: int, cfg: DeepSeek2Config) -> Any:
    D = cfg.n_embd
    if i < cfg.n_dense:
        return blocks.bind_ffn(ops, i, D, cfg.n_ff)
    p = f"blk.{i}."
    router = ops.weight(p + "ffn_gate_inp.weight")
    if len(router.ne) == 2 and router.ne[1] != cfg.n_expert:
        raise ModelError(f"tensor {router.name!r} routes to {router.ne[1]} experts but "
                         f"{cfg.arch}.expert_count = {cfg.n_expert}")
    F_sh = cfg.n_ff_exp * cfg.n_shared
    t = blocks.tensor
    return MoeLayerWeights(
        moe=blocks.bind_moe(ops, i, D, cfg.n_ff_exp, cfg.n_expert, fused_gate_up=True),
        exp_probs_b=blocks.optional_tensor(ops, p + "exp_probs_b.bias", [cfg.n_expert]),
        shared=blocks.FfnWeights(ffn_gate=t(ops, p + "ffn_gate_shexp.weight", [D, F_sh]),
                                 ffn_up=t(ops, p + "ffn_up_shexp.weight", [D, F_sh]),
                                 ffn_down=t(ops, p + "ffn_down_shexp.weight", [F_sh, D])))


class DeepSeek2(Model):
    """deepseek2: MLA (or legacy MHA) attention, dense lead layers, routed + shared experts."""

    arch = "deepseek2"

    # llama.cpp's deepseek2 graph multiplies by these with plain ggml_mul_mat (spec §8.7)
    _NO_LORA = ("attn_q.weight", "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
                "attn_kv_b.weight", "attn_k_b.weight", "attn_v_b.weight")

    @classmethod
    def lora_applies(cls, name: str) -> bool:
        return name != "output.weight" and not (name.startswith("blk.")
                                                and name.endswith(cls._NO_LORA))

    def __init__(self, gguf: Any, ops: Ops) -> None:
        super().__init__(gguf, ops)
        cfg = self.configure(DeepSeek2Config)
        D = cfg.n_embd
        self.layers = [DeepSeek2Layer(
            attn_norm=blocks.tensor(ops, f"blk.{i}.attn_norm.weight", [D]),
            attn=_bind_attn(ops, i, cfg),
            ffn_norm=blocks.tensor(ops, f"blk.{i}.ffn_norm.weight", [D]),
            ffn=_bind_ffn(ops, i, cfg)) for i in range(cfg.n_layer)]

    # --- state ---------------------------------------------------------------------------------
    def state_spec(self) -> StateSpec:
        cfg = self.cfg
        if not cfg.is_mla:
            return StateSpec(tuple(b for i in range(cfg.n_layer)
                                   for b in attention_kv(i, cfg.n_head, cfg.d_qk, cfg.d_v)))
        row = cfg.kv_lora_rank + cfg.n_rot
        return StateSpec(tuple(
            BufferSpec(f"kv.{i}", (row,), True,
                       (ViewSpec(f"k.{i}", 0, row), ViewSpec(f"v.{i}", 0, cfg.kv_lora_rank)))
            for i in range(cfg.n_layer)))

    # --- forward -------------------------------------------------------------------------------
    def forward(self, batch: Batch, state: State, out_rows: Sequence[int]) -> Any:
        ops, cfg = self.ops, self.cfg
        pb = ops.prepare(batch)
        ids = ops.mla_head_ids(batch.n_tokens, cfg.n_head) if cfg.is_mla else None
        x, h = ops.embed(self.token_embd, pb), None
        for i, layer in enumerate(self.layers):
            x, a = blocks.residual_rmsnorm(ops, x, h, layer.attn_norm, cfg.eps)
            if cfg.is_mla:
                h = self._mla(a, layer.attn, state[f"kv.{i}"], pb, ids)
            else:
                h = self._legacy(a, layer.attn, state.kv(i), pb)
            x, b = ops.add_rmsnorm(x, h, layer.ffn_norm, cfg.eps)
            h = self._ffn(b, layer.ffn)
        return blocks.lm_head(ops, x, self.output_norm, self.output, cfg.eps, out_rows,
                              residual=h)

    def _q_and_latent(self, a: Any, w: MlaWeights) -> tuple[Any, Any]:
        """(q ``[T, H d_qk]``, c ``[T, r_kv + n_rot]``)."""
        ops, cfg = self.ops, self.cfg
        if w.attn_q is not None:
            return tuple(ops.matmul_many(a, (w.attn_q, w.attn_kv_a_mqa)))
        qa, c = ops.matmul_many(a, (w.attn_q_a, w.attn_kv_a_mqa))
        return ops.matmul(ops.rmsnorm(qa, w.attn_q_a_norm, cfg.eps), w.attn_q_b), c

    def _latent_parts(self, c: Any, w: MlaWeights, pb: Any) -> tuple[Any, Any]:
        """(RMSNorm(c_kv) ``[T, 1, r_kv]``, RoPE(k_pe) ``[T, 1, n_rot]``)."""
        ops, cfg = self.ops, self.cfg
        c_kv, k_pe = ops.mla_split_heads(c, 1, cfg.kv_lora_rank)
        return ops.rmsnorm(c_kv, w.attn_kv_a_norm, cfg.eps), ops.rope(k_pe, pb, cfg.rope)

    def _mla(self, a: Any, w: MlaWeights, latent: Any, pb: Any, ids: Any) -> Any:
        """Spec §8.4: absorbed MLA over this layer's latent rows."""
        ops, cfg = self.ops, self.cfg
        T = ops.shape(a)[0]
        q, c = self._q_and_latent(a, w)
        c_kv, k_pe = self._latent_parts(c, w, pb)
        ops.mla_store_rows(ops.mla_concat_heads(c_kv, k_pe), latent, pb)
        q_nope, q_pe = ops.mla_split_heads(q, cfg.n_head, cfg.d_nope)
        q_abs = ops.moe_matmul(q_nope, w.attn_k_b, ids)  # [T, H, r_kv]
        qq = self._temperature(ops.mla_concat_heads(q_abs, ops.rope(q_pe, pb, cfg.rope)), pb)
        o_lat = ops.mla_attention(qq, latent, pb, cfg.kq_scale, cfg.kv_lora_rank)
        o = ops.moe_matmul(o_lat, w.attn_v_b, ids)  # [T, H, d_v]
        return ops.matmul(ops.view(o, (T, cfg.n_head * cfg.d_v)), w.attn_output)

    def _legacy(self, a: Any, w: MlaWeights, kv: tuple, pb: Any) -> Any:
        """Spec §8.6: decompressed multi-head attention; K and V per head in the state."""
        ops, cfg = self.ops, self.cfg
        H = cfg.n_head
        q, c = self._q_and_latent(a, w)
        c_kv, k_pe = ops.mla_split_heads(c, 1, cfg.kv_lora_rank)
        c_kv = ops.rmsnorm(c_kv, w.attn_kv_a_norm, cfg.eps)
        T = ops.shape(a)[0]
        kvb = ops.matmul(ops.view(c_kv, (T, cfg.kv_lora_rank)), w.attn_kv_b)
        k_nope, v = ops.mla_split_heads(kvb, H, cfg.d_nope)
        q_nope, q_pe = ops.mla_split_heads(q, H, cfg.d_nope)
        # [pe ; nope] rows: the core rotates the first n_rot dims (k_pe is shared by all heads)
        qq = ops.qk_norm_rope_store(ops.mla_concat_heads(q_pe, q_nope),
                                    ops.mla_concat_heads(k_pe, k_nope), v, None, None, cfg.eps,
                                    pb, cfg.rope, kv[0], kv[1])
        o = ops.attention(self._temperature(qq, pb), kv[0], kv[1], pb, cfg.kq_scale)
        return ops.matmul(o, w.attn_output)

    def _temperature(self, q: Any, pb: Any) -> Any:
        """The optional query temperature (spec §8.4), on the whole rotated query as llama.cpp
        applies it: a factor per token that grows with its position."""
        cfg = self.cfg
        if cfg.temperature_scale == 0.0:
            return q
        return self.ops.mla_query_temperature(q, pb, cfg.temperature_scale,
                                              cfg.temperature_length)

    def _ffn(self, b: Any, ffn: Any) -> Any:
        ops, cfg = self.ops, self.cfg
        if isinstance(ffn, blocks.FfnWeights):
            return blocks.swiglu_ffn(ops, b, ffn.ffn_gate, ffn.ffn_up, ffn.ffn_down)
        m = ffn.moe
        routed = blocks.moe_ffn(ops, b, m.ffn_gate_inp, m.ffn_gate_exps, m.ffn_up_exps,
                                m.ffn_down_exps, cfg.n_expert_used, cfg.gating, cfg.norm_w,
                                cfg.w_scale, bias=ffn.exp_probs_b,
                                groups=(cfg.n_expert_groups, cfg.n_group_used))
        sh = ffn.shared
        return ops.add(routed, blocks.swiglu_ffn(ops, b, sh.ffn_gate, sh.ffn_up, sh.ffn_down))
