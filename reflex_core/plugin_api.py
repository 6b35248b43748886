"""Everything an architecture plugin imports from the core, in one place.

    from reflex_core.plugin_api import ArchSpec, hookimpl, Model, Meta, blocks, ...
"""

from . import blocks
from .errors import ModelError, ReflexError, UnsupportedTensorType
from .hookspecs import hookimpl
from .hparams import (Meta, TransformerHParams, read_transformer_hparams, rope_params, uniform,
                      vocab_size)
from .model import Model
from .ops import AttnMask, Batch, KVCache, Ops, RopeParams, Weight
from .registry import ArchSpec

__all__ = [
    "ArchSpec", "AttnMask", "Batch", "KVCache", "Meta", "Model", "ModelError", "Ops",
    "ReflexError", "RopeParams", "TransformerHParams", "UnsupportedTensorType", "Weight", "blocks",
    "hookimpl", "read_transformer_hparams", "rope_params", "uniform", "vocab_size",
]
