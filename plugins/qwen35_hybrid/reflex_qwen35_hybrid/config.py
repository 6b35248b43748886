"""Qwen3.5 hyper-parameters (spec §7.1), read and cross-checked once at load.

A file whose keys contradict each other (``d_k != d_v``, ``H_v % H_k != 0``, a
``recurrent_layers`` array of the wrong length, IMROPE sections that leave pairs unrotated) is a
one-line :class:`ModelError` naming the file and the key, never wrong output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reflex_core.plugin_api import AttentionConfig, Meta, MoEConfig, derived, key

DEFAULT_ATTENTION_INTERVAL = 4  # llama.cpp's default when neither layer key is present


@dataclass(frozen=True)
class Qwen35Config(AttentionConfig):
    """:class:`AttentionConfig` (the full-attention layers) plus the Gated DeltaNet keys."""

    conv_kernel: int = key("ssm.conv_kernel", bound="dim")  # K_c
    d_k: int = key("ssm.state_size", bound="dim")  # GDN key head size
    n_k_heads: int = key("ssm.group_count", bound="dim")  # H_k
    n_v_heads: int = key("ssm.time_step_rank", bound="dim")  # H_v
    d_inner: int = key("ssm.inner_size", bound="dim")  # H_v * d_v
    recurrent: tuple = derived()  # per executed layer: True = Gated DeltaNet, False = attention
    rope_sections: tuple = derived()  # IMROPE sections (4 ints)

    @property
    def d_v(self) -> int:
        return self.d_inner // self.n_v_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: ``[q (H_k d_k) | k (H_k d_k) | v (H_v d_v)]``."""
        return 2 * self.n_k_heads * self.d_k + self.d_inner

    @classmethod
    def derive(cls, meta: Meta, values: dict[str, Any]) -> dict[str, Any]:
        out = super().derive(meta, values)
        n_all, n = values["n_layer_all"], values["n_layer_all"] - values["n_nextn"]
        if meta.has("attention.recurrent_layers"):
            flags = meta.u32_or_array("attention.recurrent_layers", n_all)
            recurrent = tuple(bool(f) for f in flags[:n])
        else:
            interval = meta.u32("full_attention_interval", DEFAULT_ATTENTION_INTERVAL)
            if interval <= 0:
                raise meta.error(f"{meta.key('full_attention_interval')} must be > 0")
            recurrent = tuple((i + 1) % interval != 0 for i in range(n))
        out["recurrent"] = recurrent
        out["rope_sections"] = _rope_sections(meta, values["n_rot"])
        return out

    def check(self, meta: Meta) -> None:
        super().check(meta)
        ssm = meta.key("ssm.")
        if self.conv_kernel < 2:
            raise meta.error(f"{ssm}conv_kernel = {self.conv_kernel} must be >= 2")
        if min(self.d_k, self.n_k_heads, self.n_v_heads, self.d_inner) <= 0:
            raise meta.error(f"{ssm}state_size, group_count, time_step_rank and inner_size "
                             f"must be > 0")
        if self.n_v_heads % self.n_k_heads:
            raise meta.error(f"{ssm}time_step_rank = {self.n_v_heads} (value heads) is not a "
                             f"multiple of {ssm}group_count = {self.n_k_heads} (key heads)")
        if self.d_inner % self.n_v_heads or self.d_inner // self.n_v_heads != self.d_k:
            raise meta.error(f"{ssm}inner_size = {self.d_inner} is not {ssm}time_step_rank "
                             f"({self.n_v_heads}) x {ssm}state_size ({self.d_k}): the value "
                             f"head size must equal the key head size")
        if self.head_dim_k != self.head_dim_v:
            raise meta.error(f"{meta.key('attention.key_length')} = {self.head_dim_k} differs "
                             f"from {meta.key('attention.value_length')} = {self.head_dim_v}")
        if self.n_rot > self.head_dim_k:
            raise meta.error(f"{meta.key('rope.dimension_count')} = {self.n_rot} exceeds the "
                             f"head size {self.head_dim_k}")
        self.check_ffn(meta)

    def check_ffn(self, meta: Meta) -> None:
        """qwen35: a dense SwiGLU FFN in every layer."""
        self.require_dense_ffn(meta)


def _rope_sections(meta: Meta, n_rot: int) -> tuple:
    """``rope.dimension_sections`` (4 ints; an array of another length is an error).

    For text every token's four IMROPE positions are ``(p, p, p, 0)``, so a pair rotates by p
    when its sector falls in the t, h or w section, and not at all (position 0) otherwise
    (spec §4.3). The sections of every released model cover all ``n_rot / 2`` pairs, which makes
    IMROPE exactly NEOX RoPE over the first ``n_rot`` dims; a file whose sections leave a pair
    out is refused rather than computed with the wrong rotation."""
    k = "rope.dimension_sections"
    v = meta.array(k)
    if len(v) != 4 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise meta.error(f"metadata key {meta.key(k)!r} must hold 4 integers")
    s = tuple(int(x) for x in v)
    if min(s) < 0 or sum(s) <= 0:
        raise meta.error(f"metadata key {meta.key(k)!r} = {list(s)} must be >= 0 with a "
                         f"positive sum")
    total = sum(s)
    for i in range(n_rot // 2):
        sector = i % total
        m = sector % 3
        if not ((m == 0 and sector < 3 * s[0]) or (m == 1 and sector < 3 * s[1])
                or (m == 2 and sector < 3 * s[2])):
            raise meta.error(f"metadata key {meta.key(k)!r} = {list(s)} leaves rotary pair {i} "
                             f"of {n_rot // 2} unrotated for text; not supported")
    return s


@dataclass(frozen=True)
class Qwen35MoEConfig(MoEConfig, Qwen35Config):
    """:class:`Qwen35Config` with routed experts and a gated shared expert (spec §7.7)."""

    n_ff_shexp_file: int = key("expert_shared_feed_forward_length", default=0, bound="dim")

    @property
    def n_ff_shexp(self) -> int:
        """F_s: ``expert_shared_feed_forward_length``, else ``feed_forward_length``."""
        return self.n_ff_shexp_file or self.n_ff

    def check(self, meta: Meta) -> None:
        # MoEConfig.check comes first in the MRO and checks nothing (its keys are checked in
        # derive); the hybrid's rules are Qwen35Config's
        Qwen35Config.check(self, meta)

    def check_ffn(self, meta: Meta) -> None:
        if self.n_ff_shexp <= 0:
            raise meta.error(f"the shared expert width is unknown: "
                             f"{meta.key('expert_shared_feed_forward_length')} and "
                             f"{meta.key('feed_forward_length')} are missing or 0")
