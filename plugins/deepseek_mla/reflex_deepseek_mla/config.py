"""DeepSeek-V2 / V2-Lite / V3 hyper-parameters (spec §8.1, §8.3), read and cross-checked once.

Two kinds of file: **MLA** files (both ``attention.key_length_mla`` and ``value_length_mla``
set; ``attn_k_b`` / ``attn_v_b`` tensors; one KV head whose row is the latent plus the rope key)
and **legacy** files (``attn_kv_b``; plain multi-head K/V). "Lite" files (26 or 27 blocks, or 48
blocks with a 128256-token vocabulary -- llama.cpp's rule) have no query LoRA and do not read
``attention.q_lora_rank``; every other file must have it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reflex_core.plugin_api import Meta, MoEConfig, derived, key, rope_params

# expert_gating_func (llama.cpp's enum) -> the core router's gating name
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}


def is_lite(n_layer: int, n_vocab: int) -> bool:
    """llama.cpp's "lite" rule (DeepSeek-V2-Lite and kin): no query LoRA."""
    return n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)


@dataclass(frozen=True)
class DeepSeek2Config(MoEConfig):
    """Spec §8.1. ``head_dim_k`` / ``head_dim_v`` are the file's ``key_length`` /
    ``value_length`` (576 / 512 in MLA files: the cached row and its V part); ``d_qk`` / ``d_v``
    are the per-head query-key and value sizes (192 / 128)."""

    n_dense: int = key("leading_dense_block_count", default=0, bound="blocks")
    kv_lora_rank: int = key("attention.kv_lora_rank", bound="dim")
    key_length_mla: int = key("attention.key_length_mla", default=0, bound="dim")
    value_length_mla: int = key("attention.value_length_mla", default=0, bound="dim")
    n_shared: int = key("expert_shared_count")
    w_scale: float = key("expert_weights_scale", kind="f32", default=0.0)
    norm_w: bool = key("expert_weights_norm", kind="bool", default=False)
    gating_func: int = key("expert_gating_func", default=0)
    # Llama-4-style query temperature (Mistral-Large-3 files; spec §8.4): 0 = off
    temperature_scale: float = key("attention.temperature_scale", kind="f32", default=0.0)
    temperature_length: int = key("attention.temperature_length", default=0)
    q_lora_rank: int = derived()  # 0 for lite files
    yarn_log_mul: float = derived()  # rope.scaling.yarn_log_multiplier / 0.1
    gating: str = derived()  # the core router's gating name
    kq_scale: float = derived()  # spec §8.3

    rope_mode = "norm"

    @property
    def is_mla(self) -> bool:
        return self.key_length_mla > 0 and self.value_length_mla > 0

    @property
    def d_qk(self) -> int:
        return self.key_length_mla if self.is_mla else self.head_dim_k

    @property
    def d_v(self) -> int:
        return self.value_length_mla if self.is_mla else self.head_dim_v

    @property
    def d_nope(self) -> int:
        return self.d_qk - self.n_rot

    @classmethod
    def derive(cls, meta: Meta, values: dict[str, Any]) -> dict[str, Any]:
        out = super().derive(meta, values)
        n_layer = values["n_layer_all"] - values["n_nextn"]
        q_lora = 0
        if not is_lite(n_layer, out["n_vocab"]):
            q_lora = meta.bounded("attention.q_lora_rank", meta.u32("attention.q_lora_rank"),
                                  "dim")
            if q_lora <= 0:
                raise meta.error(f"{meta.key('attention.q_lora_rank')} must be > 0")
        log_mul = 0.0
        if meta.has("rope.scaling.yarn_log_multiplier"):
            # stored as 0.1 * mscale_all_dim by the converter; llama.cpp divides it back
            log_mul = meta.f32("rope.scaling.yarn_log_multiplier") / 0.1
        rope = rope_params(meta, values["n_rot"], cls.rope_mode, yarn_log_mul=log_mul)
        if rope.ext_factor < 0:
            raise meta.error("deepseek2 needs a non-negative YaRN ext factor")
        gf = values["gating_func"]
        if gf == 0:  # absent: softmax, except llama.cpp's GLM-4.7 "lite" heuristic
            gf = 2 if (n_layer in (47, 48) and out["n_vocab"] == 154880) else 1
        if gf not in GATING:
            raise meta.error(f"{meta.key('expert_gating_func')} = {gf} is not one of "
                             f"{sorted(GATING)}")
        d_qk = values["key_length_mla"] if (values["key_length_mla"] > 0
                                            and values["value_length_mla"] > 0) \
            else values["head_dim_k"]
        s = rope.freq_scale
        af_org = rope.attn_factor * (1.0 + 0.1 * math.log(1.0 / s))
        mscale = af_org * (1.0 + 0.1 * log_mul * math.log(1.0 / s))
        out.update(q_lora_rank=q_lora, yarn_log_mul=log_mul, gating=GATING[gf], rope=rope,
                   kq_scale=mscale * mscale / math.sqrt(max(d_qk, 1)))
        return out

    def check(self, meta: Meta) -> None:
        super().check(meta)
        k = meta.key
        if self.n_ff_exp_file <= 0:
            raise meta.error(f"metadata key {k('expert_feed_forward_length')!r} is missing or 0 "
                             f"(required for deepseek2)")
        if self.n_dense > self.n_layer:
            raise meta.error(f"{k('leading_dense_block_count')} = {self.n_dense} exceeds the "
                             f"{self.n_layer} blocks")
        if self.kv_lora_rank <= 0:
            raise meta.error(f"{k('attention.kv_lora_rank')} must be > 0")
        if (self.key_length_mla > 0) != (self.value_length_mla > 0):
            raise meta.error(f"{k('attention.key_length_mla')} and "
                             f"{k('attention.value_length_mla')} must be given together")
        if self.d_nope < 1 or self.d_v <= 0:
            raise meta.error(f"the query-key head size {self.d_qk} must exceed "
                             f"{k('rope.dimension_count')} = {self.n_rot}")
        if self.is_mla:
            row = self.kv_lora_rank + self.n_rot
            if self.n_head_kv != 1 or self.head_dim_k != row or self.head_dim_v != self.kv_lora_rank:
                raise meta.error(f"an MLA file needs {k('attention.head_count_kv')} = 1, "
                                 f"{k('attention.key_length')} = kv_lora_rank + rope dims "
                                 f"({row}) and {k('attention.value_length')} = kv_lora_rank "
                                 f"({self.kv_lora_rank}); got {self.n_head_kv}, "
                                 f"{self.head_dim_k}, {self.head_dim_v}")
        elif self.n_head_kv != self.n_head:
            raise meta.error(f"a legacy (attn_kv_b) file needs {k('attention.head_count_kv')} = "
                             f"{k('attention.head_count')} ({self.n_head}), got {self.n_head_kv}")
        if self.n_shared <= 0:
            raise meta.error(f"{k('expert_shared_count')} must be > 0")
        if self.temperature_scale != 0.0 and self.temperature_length <= 0:
            # llama.cpp aborts on such a file (an assert when the first batch is set up)
            raise meta.error(f"{k('attention.temperature_scale')} is set but "
                             f"{k('attention.temperature_length')} (its position floor scale) "
                             f"is missing or 0")
        if self.n_dense > 0 and self.n_ff <= 0:
            raise meta.error(f"{k('feed_forward_length')} must be > 0 for the dense lead layers")
