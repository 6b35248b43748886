"""The model contract: what the class named by an ``ArchSpec.model`` provides.

A plugin subclasses :class:`Model`, reads its configuration from GGUF metadata (a typed
:class:`~reflex_core.config.ArchConfig`), binds its weights by GGUF tensor name through
``ops.weight(name)``, declares its state (:meth:`Model.state_spec`) and writes ``forward`` once
against the ops interface. The engine drives it; the plugin never sees the CLI.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import blocks
from .ops import Batch, Ops, Weight
from .state import State, StateSpec


class Model:
    """Base class of an architecture's model.

    Subclasses set ``arch`` and implement ``__init__(gguf, ops)`` (read the config, bind
    weights: :meth:`configure` does the part every family shares), :meth:`state_spec` and
    :meth:`forward`. The backend allocates the declared state (:meth:`new_state`); batches come
    from the state, so a model never counts cells.
    """

    arch: str = ""

    def __init__(self, gguf: Any, ops: Ops) -> None:
        self.gguf = gguf
        self.ops = ops
        self.n_vocab: int = 0  # rows of the logits
        self.n_ctx_train: int = 0

    def configure(self, config_class: type) -> Any:
        """The start of a transformer family's ``__init__``: ``self.cfg``, the file's
        configuration (``config_class.from_gguf`` under its ``general.architecture``, this
        class's ``arch`` where the key is missing), ``n_vocab`` and ``n_ctx_train`` from it, and
        the embedding and head bound (``token_embd``, ``output_norm``, ``output``, ``tied``:
        :func:`blocks.bind_embed_head`; ``cfg.n_embd`` and ``cfg.n_vocab``). Returns the config."""
        arch = self.gguf.get("general.architecture", self.arch) or self.arch
        self.cfg = cfg = config_class.from_gguf(self.gguf, arch)
        self.n_vocab, self.n_ctx_train = cfg.n_vocab, cfg.n_ctx_train
        io = blocks.bind_embed_head(self.ops, cfg.n_embd, cfg.n_vocab)
        self.token_embd: Weight = io.token_embd
        self.output_norm: Weight = io.output_norm
        self.output: Weight = io.output
        self.tied: bool = io.tied
        return cfg

    @classmethod
    def load(cls, gguf: Any, ops: Ops) -> "Model":
        """Build the model for an opened GGUF whose tensors ``ops`` has attached."""
        return cls(gguf, ops)

    @classmethod
    def lora_applies(cls, name: str) -> bool:
        """Whether llama.cpp's graph for this architecture applies a LoRA pair that targets base
        tensor ``name`` (its matmul goes through ``build_lora_mm``, or it is the embedding).
        Pairs for other tensors are checked against the base like any, then left unmerged: llama.cpp
        loads them and never uses them (spec §4.6). Every tensor by default."""
        return True

    def state_spec(self) -> StateSpec:
        """The buffers this model's state holds (see :mod:`reflex_core.state`)."""
        raise NotImplementedError

    def new_state(self, n_cells: int, n_seqs: int = 1) -> State:
        """Zeroed state for up to ``n_cells`` tokens in all and ``n_seqs`` sequences."""
        return State(self.state_spec(), self.ops, n_cells, n_seqs)

    def forward(self, batch: Batch, state: State, out_rows: Sequence[int]) -> Any:
        """Run ``batch`` (made by ``state``) through the model, updating ``state``; return the
        logits of the batch rows ``out_rows`` as a backend tensor ``[len(out_rows), n_vocab]``."""
        raise NotImplementedError
