"""Everything an architecture plugin imports from the core, in one place.

    from reflex_core.plugin_api import ArchSpec, hookimpl, Model, AttentionConfig, blocks, ...
"""

from . import blocks
from .config import ArchConfig, AttentionConfig, MoEConfig, derived, key
from .errors import ModelError, ReflexError, UnsupportedTensorType
from .hookspecs import hookimpl
from .hparams import Meta, rope_params, uniform, vocab_size
from .model import Model
from .opreg import BatchArg, OpCase, OpDef, WeightArg
from .ops import AttnMask, Batch, Ops, RopeParams, Weight
from .registry import ArchSpec
from .state import BufferSpec, State, StateSpec, ViewSpec, attention_kv, attention_kv_spec

__all__ = [
    "ArchConfig", "ArchSpec", "AttentionConfig", "AttnMask", "Batch", "BatchArg", "BufferSpec",
    "Meta", "MoEConfig", "Model", "ModelError", "OpCase", "OpDef", "Ops", "ReflexError",
    "RopeParams", "State", "StateSpec", "UnsupportedTensorType", "ViewSpec", "Weight",
    "WeightArg", "attention_kv", "attention_kv_spec", "blocks", "derived", "hookimpl", "key",
    "rope_params", "uniform", "vocab_size",
]
