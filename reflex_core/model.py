"""The model contract: what the class named by an ``ArchSpec.model`` provides.

A plugin subclasses :class:`Model`, reads its hyper-parameters from GGUF metadata, binds its
weights by GGUF tensor name through ``ops.weight(name)``, and writes ``forward`` once against the
ops interface. The engine drives it; the plugin never sees the CLI.
"""

from __future__ import annotations

from typing import Any, Sequence

from .ops import Batch, KVCache, Ops


class Model:
    """Base class of an architecture's model.

    Subclasses set ``arch`` and implement ``__init__(gguf, ops)`` (read hparams, bind weights),
    ``new_cache`` and ``forward``. Attention-only models keep ``supports_tree_mask = True``: the
    system1 scorer then packs prompt + candidates into one batch under a tree mask. A model whose
    state is recurrent (it cannot attend selectively to earlier tokens) sets it to False and
    implements ``snapshot``/``restore``: the scorer then runs the prompt once, snapshots its state,
    and scores each candidate from a restored snapshot.
    """

    arch: str = ""
    supports_tree_mask: bool = True

    def __init__(self, gguf: Any, ops: Ops) -> None:
        self.gguf = gguf
        self.ops = ops
        self.n_vocab: int = 0  # rows of the logits
        self.n_ctx_train: int = 0

    @classmethod
    def load(cls, gguf: Any, ops: Ops) -> "Model":
        """Build the model for an opened GGUF whose tensors ``ops`` has attached."""
        return cls(gguf, ops)

    def new_cache(self, n_cells: int) -> KVCache:
        """State for up to ``n_cells`` tokens (KV cells, recurrent state, ...)."""
        raise NotImplementedError

    def forward(self, batch: Batch, cache: KVCache, out_rows: Sequence[int]) -> Any:
        """Run ``batch`` through the model, updating ``cache``; return the logits of the batch
        rows ``out_rows`` as a backend tensor ``[len(out_rows), n_vocab]``."""
        raise NotImplementedError

    def snapshot(self, cache: KVCache) -> Any:
        """A restorable copy of the state after the tokens processed so far.

        For KV-only state the used cell count suffices: later cells are overwritten on reuse."""
        return cache.n_used

    def restore(self, cache: KVCache, snap: Any) -> None:
        cache.n_used = snap
