"""A model's state: declared by the model, allocated by the backend, owned by a :class:`State`.

The model says which buffers it needs (:meth:`reflex_core.model.Model.state_spec`):

* **per-token buffers** (``per_token=True``): one row per KV cell, ``[n_cells, *shape]`` --
  attention K and V (each with its own head sizes), an MLA latent row with column views;
* **per-sequence buffers** (``per_token=False``): one fixed-size slot per sequence,
  ``[n_seqs, *shape]`` -- a conv window, a recurrent (delta-rule) matrix.

The backend allocates them (its own dtype: float32 on both backends today) and the
:class:`State` owns them together with where each sequence stands: its next RoPE position and
which KV cells it sees. Batches are made by the state (:meth:`State.append`,
:meth:`State.append_tree`, :meth:`State.append_branches`), so the engine and system1 never
count cells. Cells are shared by all sequences of a state and visibility is the batch mask's
business: a sequence sees a shared prefix ``[0, prefix_end)`` plus its own cells
``[own_start, own_end)`` -- exactly the two ranges of :class:`~reflex_core.ops.AttnMask`.

Snapshots are device-side: per-token buffers are append-only (a cell is written before any
mask shows it), so a snapshot of them is the bookkeeping alone; per-sequence buffers are copied
on the device. :meth:`State.dump` / :meth:`State.load` move everything to and from plain bytes
(the used cells and every sequence slot), which is what a state file is made of.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from .errors import ReflexError
from .ops import AttnMask, Batch


# The spec types are NamedTuples and small classes, not dataclasses: they are built when a model
# loads, on the cold path, where a frozen dataclass costs about a millisecond of construction.


class ViewSpec(NamedTuple):
    """Columns ``[col0, col0 + ncols)`` of the last dimension of a buffer, under their own name
    (MLA: V is the first ``kv_lora_rank`` columns of the latent row)."""

    name: str
    col0: int
    ncols: int


class BufferSpec(NamedTuple):
    """One state buffer. ``shape`` is per cell (``per_token``) or per sequence slot."""

    name: str
    shape: tuple[int, ...]
    per_token: bool
    views: tuple[ViewSpec, ...] = ()


class StateSpec:
    """Every buffer a model's state holds (names unique, views included), checked."""

    __slots__ = ("buffers",)

    def __init__(self, buffers: Sequence[BufferSpec]) -> None:
        self.buffers = tuple(buffers)
        for b in self.buffers:
            if not b.shape or any(int(n) <= 0 for n in b.shape):
                raise ValueError(f"state buffer {b.name!r}: shape {b.shape} must be non-empty "
                                 f"and positive")
            for v in b.views:
                if not (0 <= v.col0 and v.ncols > 0 and v.col0 + v.ncols <= b.shape[-1]):
                    raise ValueError(f"state view {v.name!r} [{v.col0}, {v.col0 + v.ncols}) is "
                                     f"outside the {b.shape[-1]} columns of {b.name!r}")
        names = [b.name for b in self.buffers] + [v.name for b in self.buffers for v in b.views]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"state buffer names repeat: {sorted(dup)}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateSpec) and self.buffers == other.buffers

    def __repr__(self) -> str:
        return f"StateSpec({list(self.buffers)!r})"

    @property
    def recurrent(self) -> bool:
        """Whether any buffer is per sequence: such state cannot attend selectively, so
        several continuations of one prompt need one slot each (system1 forks them)."""
        return any(not b.per_token for b in self.buffers)


def attention_kv(layer: int, n_head_kv: int, head_dim_k: int,
                 head_dim_v: int | None = None) -> tuple[BufferSpec, BufferSpec]:
    """K and V of one attention layer: ``k.{layer}`` ``[cells, H_kv, d_k]``, ``v.{layer}``
    ``[cells, H_kv, d_v]``."""
    dv = head_dim_k if head_dim_v is None else head_dim_v
    return (BufferSpec(f"k.{layer}", (n_head_kv, head_dim_k), True),
            BufferSpec(f"v.{layer}", (n_head_kv, dv), True))


def attention_kv_spec(n_layer: int, n_head_kv: int, head_dim_k: int,
                      head_dim_v: int | None = None) -> StateSpec:
    """The state of a model with an attention KV cache in every layer (qwen3, qwen3moe)."""
    return StateSpec(tuple(b for i in range(n_layer)
                           for b in attention_kv(i, n_head_kv, head_dim_k, head_dim_v)))


class _Seq:
    """Where one sequence stands: its next position and the cells it sees."""

    __slots__ = ("pos", "prefix_end", "own_start", "own_end")

    def __init__(self, pos: int = 0, prefix_end: int = 0, own_start: int = 0,
                 own_end: int = 0) -> None:
        self.pos, self.prefix_end, self.own_start, self.own_end = (pos, prefix_end, own_start,
                                                                   own_end)


class Snapshot(NamedTuple):
    """What :meth:`State.snapshot` keeps: the bookkeeping and device copies of the
    per-sequence buffers."""

    n_used: int
    seqs: tuple[tuple[int, int, int, int], ...]
    slots: Mapping[str, Any]


class State:
    """The buffers of ``spec`` for ``n_cells`` KV cells and ``n_seqs`` sequences, allocated by
    ``ops`` (zeroed), and where each sequence stands. Sequence 0 exists from the start."""

    def __init__(self, spec: StateSpec, ops: Any, n_cells: int, n_seqs: int = 1) -> None:
        if n_cells < 0 or n_seqs < 1:
            raise ValueError(f"state for {n_cells} cells and {n_seqs} sequences")
        self.spec = spec
        self.ops = ops
        self.n_cells = n_cells
        self.n_seqs = n_seqs
        self.n_used = 0  # cells [0, n_used) have been written
        self._bufs: dict[str, Any] = {}
        self._views: dict[str, tuple[str, ViewSpec]] = {}
        for b in spec.buffers:
            lead = n_cells if b.per_token else n_seqs
            try:
                self._bufs[b.name] = ops.zeros((lead,) + tuple(b.shape))
            except MemoryError:  # the host's (the NumPy backend); a device's is a CudaError
                self._bufs.clear()
                raise ReflexError(f"not enough memory for the model state of {n_cells} tokens: "
                                  f"give a smaller context (-c) or fewer new tokens (-n)") \
                    from None
            for v in b.views:
                self._views[v.name] = (b.name, v)
        self._seqs = [_Seq() for _ in range(n_seqs)]

    # --- buffers -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        """Buffer ``name`` as a backend tensor (``[n_cells | n_seqs, *shape]``)."""
        try:
            return self._bufs[name]
        except KeyError:
            raise KeyError(f"no state buffer {name!r}") from None

    def view(self, name: str) -> tuple[Any, int, int]:
        """(buffer, col0, ncols) of view ``name``: a kernel reads columns
        ``[col0, col0 + ncols)`` of each row of the buffer."""
        base, v = self._views[name]
        return self._bufs[base], v.col0, v.ncols

    def buffers(self) -> Iterator[tuple[BufferSpec, Any]]:
        """Every buffer with its spec, in declaration order."""
        for b in self.spec.buffers:
            yield b, self._bufs[b.name]

    def kv(self, layer: int) -> tuple[Any, Any]:
        """(K, V) of attention layer ``layer`` (see :func:`attention_kv`)."""
        return self._bufs[f"k.{layer}"], self._bufs[f"v.{layer}"]

    # --- sequences ---------------------------------------------------------------------------
    def position(self, seq: int = 0) -> int:
        """The next RoPE position of sequence ``seq`` (= tokens it has processed)."""
        return self._seqs[seq].pos

    def fork(self, src: int, dst: int) -> None:
        """Make sequence ``dst`` continue from where ``src`` stands: it sees the cells ``src``
        sees (as its shared prefix) and its per-sequence buffers are a device copy of
        ``src``'s. ``src`` must see one contiguous range of cells from cell 0."""
        s = self._seqs[src]
        if s.own_start != s.own_end:
            raise ReflexError(f"sequence {src} sees two separate cell ranges; it cannot be forked")
        self._seqs[dst] = _Seq(s.pos, s.prefix_end, s.prefix_end, s.prefix_end)
        for b in self.spec.buffers:
            if not b.per_token:
                self.ops.copy_rows(self._bufs[b.name], dst, self._bufs[b.name], src, 1)

    def _reserve(self, n: int) -> int:
        c0 = self.n_used
        if c0 + n > self.n_cells:
            raise ReflexError(f"the context is full: {c0 + n} tokens needed, {self.n_cells} "
                              f"cells allocated")
        self.n_used = c0 + n
        return c0

    def append(self, tokens: Sequence[int], seq: int = 0) -> Batch:
        """The batch that feeds ``tokens`` to sequence ``seq`` (left to right, each token seeing
        the sequence's cells and the batch's earlier tokens); reserves its cells."""
        return self.append_branches({seq: tokens})

    def append_branches(self, branches: Mapping[int, Sequence[int]]) -> Batch:
        """One batch feeding several sequences at once, sequence by sequence in the given
        order: each token sees its own sequence's cells only. Reserves the cells."""
        cell = self.n_used
        for seq, toks in branches.items():  # check everything before changing anything
            s = self._seqs[seq]
            if toks and s.own_start != s.own_end and s.own_end != cell:
                raise ReflexError(f"sequence {seq} cannot grow: other sequences' cells follow "
                                  f"its own")
            cell += len(toks)
        c0 = self._reserve(cell - self.n_used)
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        pes: list[int] = []
        os_: list[int] = []
        oe: list[int] = []
        cell = c0
        for seq, toks in branches.items():
            if not toks:
                continue
            s = self._seqs[seq]
            T = len(toks)
            if s.own_start == s.own_end and s.prefix_end == cell:
                # its cells run from 0 up to here: the new ones extend that one range
                pe = range(cell + 1, cell + T + 1)
                os_ += [0] * T
                oe += [0] * T
                s.prefix_end = s.own_start = s.own_end = cell + T
            else:
                if s.own_start == s.own_end:  # first cells of its own, after others' cells
                    s.own_start = cell
                pe = [s.prefix_end] * T
                os_ += [s.own_start] * T
                oe += range(cell + 1, cell + T + 1)
                s.own_end = cell + T
            pes += pe
            tokens += toks
            positions += range(s.pos, s.pos + T)
            seq_ids += [seq] * T
            s.pos += T
            cell += T
        return Batch(tuple(tokens), tuple(positions), c0,
                     AttnMask(tuple(pes), tuple(os_), tuple(oe)), tuple(seq_ids))

    def append_tree(self, prefix: Sequence[int],
                    branches: Mapping[int, Sequence[int]]) -> Batch:
        """ONE batch feeding ``prefix`` to sequence 0 and, after it, each branch to its own
        sequence as a continuation of the prefix (system1's tree batch). Only for attention
        state (``not spec.recurrent``): a branch token attends to the prefix written by the
        same batch; recurrent state would need the prefix's final state first (use
        :meth:`append` + :meth:`fork` + :meth:`append_branches`)."""
        if self.spec.recurrent:
            raise ReflexError("a tree batch needs attention-only state; this model's state is "
                              "recurrent")
        first = self.append(prefix, 0)
        for seq in branches:
            self.fork(0, seq)
        rest = self.append_branches(branches)
        return Batch(first.tokens + rest.tokens, first.positions + rest.positions, first.cell0,
                     AttnMask(first.mask.prefix_end + rest.mask.prefix_end,
                              first.mask.own_start + rest.mask.own_start,
                              first.mask.own_end + rest.mask.own_end),
                     first.seq_ids + rest.seq_ids)

    # --- snapshots -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The state as it is now, restorable with :meth:`restore` (device-side copies)."""
        slots = {b.name: self.ops.clone(self._bufs[b.name])
                 for b in self.spec.buffers if not b.per_token}
        return Snapshot(self.n_used, tuple((s.pos, s.prefix_end, s.own_start, s.own_end)
                                           for s in self._seqs), slots)

    def restore(self, snap: Snapshot) -> None:
        """Back to ``snap`` (taken from this state). Cells written since are forgotten."""
        if len(snap.seqs) != self.n_seqs:
            raise ValueError("snapshot of another state")
        self.n_used = snap.n_used
        self._seqs = [_Seq(*s) for s in snap.seqs]
        for name, copy in snap.slots.items():
            self.ops.copy_rows(self._bufs[name], 0, copy, 0, self.n_seqs)

    # --- to and from bytes (state files) -------------------------------------------------------
    def dump(self) -> dict:
        """Everything needed to rebuild this state, as plain data: the bookkeeping, the
        backend's dtype, and per buffer the bytes of its used cells (per-token) or of every
        sequence slot."""
        data = {}
        for b, buf in self.buffers():
            rows = self.n_used if b.per_token else self.n_seqs
            data[b.name] = self.ops.rows_to_bytes(buf, 0, rows)
        return {"n_cells_used": self.n_used, "n_seqs": self.n_seqs,
                "seqs": [[s.pos, s.prefix_end, s.own_start, s.own_end] for s in self._seqs],
                "dtype": self.ops.state_dtype,
                "buffers": [[b.name, list(b.shape), b.per_token] for b in self.spec.buffers],
                "data": data}

    def dump_prefix(self, n_cells: int) -> dict:
        """Sequence 0 alone as it stood after its first ``n_cells`` cells, as a one-sequence
        :meth:`dump` (a prefix file). Sequence 0 must see one range of cells from cell 0; with
        per-sequence buffers ``n_cells`` must be all of them (a slot holds the latest state
        only), while per-token cells are append-only, so any prefix of them is exact."""
        s = self._seqs[0]
        if s.own_start != s.own_end or not 0 <= n_cells <= s.prefix_end:
            raise ValueError(f"sequence 0 has no prefix of {n_cells} cells")
        if self.spec.recurrent and n_cells != s.prefix_end:
            raise ValueError("per-sequence buffers hold the state after all of sequence 0's cells")
        data = {}
        for b, buf in self.buffers():
            data[b.name] = self.ops.rows_to_bytes(buf, 0, n_cells if b.per_token else 1)
        pos = s.pos - (s.prefix_end - n_cells)
        return {"n_cells_used": n_cells, "n_seqs": 1, "seqs": [[pos, n_cells, n_cells, n_cells]],
                "dtype": self.ops.state_dtype,
                "buffers": [[b.name, list(b.shape), b.per_token] for b in self.spec.buffers],
                "data": data}

    @classmethod
    def load(cls, spec: StateSpec, ops: Any, dumped: Mapping, n_cells: int,
             n_seqs: int = 1) -> "State":
        """A state of ``n_cells`` cells holding what :meth:`dump` wrote, with at least
        ``n_seqs`` sequences (those beyond the dump's start empty). The spec must be the
        same (names, shapes) and the dtype the backend's: a mismatch is a one-line error."""
        want = [[b.name, list(b.shape), b.per_token] for b in spec.buffers]
        if [list(x) for x in dumped.get("buffers", [])] != want:
            raise ReflexError("the saved state was written for another model layout")
        if dumped.get("dtype") != ops.state_dtype:
            raise ReflexError(f"the saved state holds {dumped.get('dtype')} buffers, this backend "
                              f"keeps {ops.state_dtype}")
        used = int(dumped["n_cells_used"])
        if used > n_cells:
            raise ReflexError(f"the saved state holds {used} cells, more than the {n_cells} "
                              f"allocated")
        saved_seqs = int(dumped["n_seqs"])
        st = cls(spec, ops, n_cells, max(n_seqs, saved_seqs))
        for b, buf in st.buffers():
            rows = used if b.per_token else saved_seqs
            ops.rows_from_bytes(buf, 0, rows, dumped["data"][b.name])
        st.n_used = used
        st._seqs[:saved_seqs] = [_Seq(*map(int, s)) for s in dumped["seqs"]]
        return st
