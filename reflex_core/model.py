"""The model contract: what the class named by an ``ArchSpec.model`` provides.

A plugin subclasses :class:`Model`, reads its configuration from GGUF metadata (a typed
:class:`~reflex_core.config.ArchConfig`), binds its weights by GGUF tensor name through
``ops.weight(name)``, declares its state (:meth:`Model.state_spec`) and writes ``forward`` once
against the ops interface. The engine drives it; the plugin never sees the CLI.
"""

from __future__ import annotations

from typing import Any, Sequence

from .ops import Batch, Ops
from .state import State, StateSpec


class Model:
    """Base class of an architecture's model.

    Subclasses set ``arch`` and implement ``__init__(gguf, ops)`` (read the config, bind
    weights), :meth:`state_spec` and :meth:`forward`. The backend allocates the declared state
    (:meth:`new_state`); batches come from the state, so a model never counts cells.
    """

    arch: str = ""

    def __init__(self, gguf: Any, ops: Ops) -> None:
        self.gguf = gguf
        self.ops = ops
        self.n_vocab: int = 0  # rows of the logits
        self.n_ctx_train: int = 0

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
