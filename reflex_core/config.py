"""Typed configuration of an architecture, loaded generically from its ``{arch}.*`` metadata.

A family declares a frozen dataclass whose fields say where they come from::

    @dataclass(frozen=True)
    class Mamba9Config(ArchConfig):
        n_layer: int = key("block_count")
        d_state: int = key("ssm.state_size")
        d_conv: int = key("ssm.conv_kernel", default=4)
        eps: float = key("attention.layer_norm_rms_epsilon", kind="f32")

        def check(self, meta):            # cross-field rules, one-line ModelErrors
            if self.d_conv < 2: raise meta.error("ssm.conv_kernel must be >= 2")

    cfg = Mamba9Config.from_gguf(gguf, "mamba9")

:meth:`ArchConfig.from_gguf` reads each ``key`` field in declaration order with
:class:`~reflex_core.hparams.Meta` (type-checked: a missing required key or a key of the wrong
kind is a one-line :class:`~reflex_core.errors.ModelError` naming the file and the key). A
default may be a function of the fields read before it (``default=lambda v: v["n_head"]``).
``per_layer=True`` reads a per-layer key (a scalar, or an array of one entry per block) whose
entries must all be equal; ``per_layer="all"`` keeps the list of every layer's value.
``bound="blocks"`` / ``bound="dim"`` bounds a count by the file's tensor directory as soon as it
is read (:meth:`~reflex_core.hparams.Meta.bounded`): the block count before any per-layer list
is made from it, widths and head / expert counts so that an absurd one is an error naming its
key rather than a failed shape check later. Fields declared with :func:`derived` are computed
by the class's :meth:`ArchConfig.derive` (RoPE parameters, the vocabulary size).

:class:`AttentionConfig` holds the spec §3 fields every attention family reads; :class:`MoEConfig`
adds the routed experts (spec §4.5). A family subclasses them and adds its own keys.
Standard library only (the GPU cold path imports this).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from .hparams import REQUIRED, Meta, rope_params, uniform
from .ops import RopeParams


def key(name: str, *, kind: str = "u32", default: Any = REQUIRED,
        per_layer: bool | str = False, bound: str | None = None) -> Any:
    """A field read from metadata key ``{arch}.{name}``. ``kind``: "u32", "f32", "bool", "str".
    ``default``: a value, a function of the fields read so far, or REQUIRED. ``bound``: None,
    "blocks" or "dim" (see :meth:`Meta.bounded`; u32 keys only)."""
    if kind not in ("u32", "f32", "bool", "str"):
        raise ValueError(f"unknown metadata kind {kind!r}")
    if bound not in (None, "blocks", "dim") or (bound and kind != "u32"):
        raise ValueError(f"bound {bound!r} does not apply to a {kind} key")
    return dataclasses.field(metadata={"key": (name, kind, default, per_layer, bound)})


def derived() -> Any:
    """A field the class computes in :meth:`ArchConfig.derive`."""
    return dataclasses.field(metadata={"derived": True})


@dataclass(frozen=True)
class ArchConfig:
    """Base of every family's configuration (see the module docstring)."""

    arch: str

    @classmethod
    def from_gguf(cls, gguf: Any, arch: str) -> "ArchConfig":
        meta = Meta(gguf, arch)
        values: dict[str, Any] = {"arch": arch}
        for f in dataclasses.fields(cls):
            spec = f.metadata.get("key")
            if spec is not None:
                values[f.name] = _read(meta, values, *spec)
            cls.validate_field(meta, f.name, values)
        values.update(cls.derive(meta, values))
        cfg = cls(**values)
        cfg.check(meta)
        return cfg

    @classmethod
    def validate_field(cls, meta: Meta, name: str, values: dict[str, Any]) -> None:
        """Check field ``name`` just read (``values`` holds it and every earlier field), so
        that errors come in the order the fields are declared. Default: nothing."""

    @classmethod
    def derive(cls, meta: Meta, values: dict[str, Any]) -> dict[str, Any]:
        """Values of the :func:`derived` fields, from the metadata and the fields read."""
        return {}

    def check(self, meta: Meta) -> None:
        """Rules across fields (after everything is read); raise ``meta.error(...)``."""


def _read(meta: Meta, values: dict[str, Any], name: str, kind: str, default: Any,
          per_layer: bool | str, bound: str | None) -> Any:
    if callable(default) and default is not REQUIRED:
        default = default(values) if not meta.has(name) else REQUIRED
    if per_layer:
        n = values.get("n_layer_all")
        if n is None:
            raise TypeError(f"per-layer key {name!r} declared before block_count")
        vals = meta.bounded(name, meta.u32_or_array(name, n, default), bound)
        return uniform(meta, name, vals) if per_layer is True else vals
    read: Callable[..., Any] = getattr(meta, kind)
    return meta.bounded(name, read(name, default), bound)


@dataclass(frozen=True)
class AttentionConfig(ArchConfig):
    """Spec §3: the hyper-parameters every attention family reads, with llama.cpp's checks."""

    n_layer_all: int = key("block_count", bound="blocks")  # L_all: blocks in the file
    n_nextn: int = key("nextn_predict_layers", default=0)  # MTP blocks at the end, not run
    n_embd: int = key("embedding_length", bound="dim")  # D
    n_head: int = key("attention.head_count", per_layer=True, bound="dim")  # H
    n_head_kv: int = key("attention.head_count_kv", per_layer=True, bound="dim",
                         default=lambda v: v["n_head"])  # H_kv
    head_dim_k: int = key("attention.key_length", bound="dim",
                          default=lambda v: v["n_embd"] // v["n_head"])
    head_dim_v: int = key("attention.value_length", bound="dim",
                          default=lambda v: v["n_embd"] // v["n_head"])
    n_rot: int = key("rope.dimension_count", bound="dim", default=lambda v: v["head_dim_k"])
    # F (0: absent). Not bounded: qwen3moe files state a dense width no tensor has.
    n_ff: int = key("feed_forward_length", per_layer=True, default=0)
    n_ctx_train: int = key("context_length")
    eps: float = key("attention.layer_norm_rms_epsilon", kind="f32")
    # false: the prompt attends both ways (llama.cpp's default context then runs it so); read
    # to be refused, every kernel and the NumPy reference being causal
    causal: bool = key("attention.causal", kind="bool", default=True)
    n_layer: int = derived()  # L: blocks executed (L_all minus the MTP blocks)
    n_vocab: int = derived()  # V
    rope: RopeParams = derived()

    rope_mode = "neox"  # class attribute: the family's RoPE pairing

    @classmethod
    def validate_field(cls, meta: Meta, name: str, values: dict[str, Any]) -> None:
        v = values
        if name == "n_nextn":
            if v["n_layer_all"] <= 0 or v["n_nextn"] >= v["n_layer_all"]:
                raise meta.error(f"block_count {v['n_layer_all']} with {v['n_nextn']} NextN "
                                  f"layers leaves no blocks to run")
        elif name == "n_embd" and v["n_embd"] <= 0:
            raise meta.error(f"{meta.key('embedding_length')} must be > 0")
        elif name == "n_head" and v["n_head"] <= 0:
            raise meta.error(f"{meta.key('attention.head_count')} must be > 0")
        elif name == "n_head_kv" and (v["n_head_kv"] <= 0 or v["n_head"] % v["n_head_kv"]):
            raise meta.error(f"{v['n_head']} query heads are not a multiple of "
                              f"{v['n_head_kv']} KV heads")
        elif name == "n_rot" and (v["head_dim_k"] <= 0 or v["head_dim_v"] <= 0):
            raise meta.error(f"head sizes must be > 0 (key_length {v['head_dim_k']}, "
                              f"value_length {v['head_dim_v']})")
        elif name == "eps" and v["eps"] < 0:
            raise meta.error(f"{meta.key('attention.layer_norm_rms_epsilon')} = {v['eps']} "
                              f"must be >= 0")
        elif name == "causal" and not v["causal"]:
            raise meta.error(f"{meta.key('attention.causal')} is false: bidirectional attention "
                             f"(an embedding or encoder model) is not supported; Reflex runs "
                             f"causal language models")

    @classmethod
    def derive(cls, meta: Meta, values: dict[str, Any]) -> dict[str, Any]:
        return {"n_layer": values["n_layer_all"] - values["n_nextn"],
                "n_vocab": meta.vocab_size(),
                "rope": rope_params(meta, values["n_rot"], cls.rope_mode)}

    @property
    def head_dim(self) -> int:
        """d_h for architectures with ``d_k == d_v``."""
        return self.head_dim_k

    def check(self, meta: Meta) -> None:
        _check_experts(meta, self.n_layer_all)

    def require_full_rotary(self, meta: Meta) -> None:
        """The qwen3 graphs assert ``key_length == value_length == rope.dimension_count``."""
        if not self.head_dim_k == self.head_dim_v == self.n_rot:
            raise meta.error(f"{self.arch} needs key_length == value_length == "
                              f"rope.dimension_count (got {self.head_dim_k}, {self.head_dim_v}, "
                              f"{self.n_rot})")

    def require_dense_ffn(self, meta: Meta) -> None:
        if self.n_ff <= 0:
            raise meta.error(f"{meta.key('feed_forward_length')} must be > 0")


def _check_experts(meta: Meta, n_layer_all: int) -> tuple[int, list, int, int]:
    """Spec §3's validation of the expert keys (llama.cpp runs it for every architecture):
    ``k <= E``; with E > 0: ``k > 0``, ``groups < E``, and with groups > 1:
    ``E % groups == 0`` and ``0 < groups_used < groups``. Returns (E, k per layer, groups,
    groups used)."""
    E = meta.bounded("expert_count", meta.u32("expert_count", 0), "dim")
    ks = meta.u32_or_array("expert_used_count", n_layer_all, 0)
    G = meta.u32("expert_group_count", 0)
    G_used = meta.u32("expert_group_used_count", 0)
    if max(ks) > E:
        raise meta.error(f"{meta.key('expert_used_count')} = {max(ks)} exceeds "
                          f"{meta.key('expert_count')} = {E}")
    if E > 0:
        if min(ks) <= 0:
            raise meta.error(f"{meta.key('expert_used_count')} must be > 0 with {E} experts")
        if G >= E or (G > 1 and (E % G or not 0 < G_used < G)):
            raise meta.error(f"{meta.key('expert_group_count')} = {G} (using "
                             f"{meta.key('expert_group_used_count')} = {G_used}) does not divide "
                             f"{meta.key('expert_count')} = {E} into groups of which some but not "
                             f"all are used")
    elif G:
        raise meta.error(f"{meta.key('expert_group_count')} = {G} without experts")
    return E, ks, G, G_used


@dataclass(frozen=True)
class MoEConfig(AttentionConfig):
    """:class:`AttentionConfig` plus routed experts (spec §4.5, §6.1): E > 0, 0 < k <= E on
    every layer (layer 0's k is the one llama.cpp's graphs use), F_e from
    ``expert_feed_forward_length`` or ``F / k``."""

    n_ff_exp_file: int = key("expert_feed_forward_length", per_layer=True, default=0, bound="dim")
    n_expert: int = derived()  # E
    n_expert_used: int = derived()  # k (layer 0's)
    n_ff_exp: int = derived()  # F_e
    n_expert_groups: int = derived()  # expert_group_count (group-limited routing)
    n_group_used: int = derived()  # expert_group_used_count

    @classmethod
    def derive(cls, meta: Meta, values: dict[str, Any]) -> dict[str, Any]:
        out = super().derive(meta, values)
        if meta.u32("expert_count", 0) <= 0:
            raise meta.error(f"{meta.key('expert_count')} must be > 0 for {meta.arch}")
        E, ks, G, G_used = _check_experts(meta, values["n_layer_all"])
        k = ks[0]
        fe = values["n_ff_exp_file"] or values["n_ff"] // k
        if fe <= 0:
            raise meta.error(f"the expert FFN width is unknown: "
                              f"{meta.key('expert_feed_forward_length')} and "
                              f"{meta.key('feed_forward_length')} are missing or 0")
        out.update(n_expert=E, n_expert_used=k, n_ff_exp=fe, n_expert_groups=G,
                   n_group_used=G_used)
        return out

    def check(self, meta: Meta) -> None:
        """Checked in :meth:`derive` already."""
