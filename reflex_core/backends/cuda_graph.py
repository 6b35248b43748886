"""Single-token decode steps replayed from a captured CUDA graph (the default on the GPU;
REFLEX_CUDA_GRAPHS=0 turns it off).

A decode step of the CUDA backend is hundreds of kernel launches made one by one from Python;
for small models the GPU waits on those launches, not the other way round. A graph captured
once replays the whole step with one ``cuGraphLaunch``.

A replay is only equivalent to running the step if the step's launches do not depend on the
host's view of the step: everything that changes from one token to the next (the token id, its
position, its cache cell, the attention mask) must reach the kernels through device memory --
the batch's prepared buffer (device_array.Prepared), which is the same buffer for every step
while a :class:`DecodeGraph` runs and is rewritten before each replay. That is checked, not
assumed: the first step runs eagerly with every launch traced (kernel, grid, block, every
argument) and every copy, and the next one is captured with the same trace; the graph is kept
only when the two traces are equal and the eager step's only host copy was the batch's. Where
they differ, that step runs eagerly (traced) and the next one is captured and compared again,
once. Anything else -- a parameter that moves with the position, a copy to or from the host
inside the forward, a failed capture -- leaves the job eager, with the reason in
:attr:`DecodeGraph.note`.

Once captured, the steps can also be chained (:meth:`DecodeGraph.queue`): the next token is
picked on the device straight into the slot the next replay reads, and the host queues step
n + 1 before it reads step n's token, so the GPU never waits for the host between tokens.

A job with a long prompt can chain from the prompt on (:meth:`DecodeGraph.pick_first`): the
prompt's next token is picked on the device too, and the first steps -- the eager, traced one
and the capture, whose host time is several GPU steps' -- are queued while the GPU still runs
the prefill, before the host waits for the first token. Their inputs reach the fixed buffer by
asynchronous copies queued with them, so a traced step of such a job has no host copy.

What the check cannot see is a launch that changes only at some later step (a kernel variant
picked by context length, say): ops must pick their launches from the batch's shape alone
(docs/internals.md, "decode graphs"). The blocks a graph's replays write are held back from the
caching allocator until :meth:`DecodeGraph.close`.

On sm_90 and later the captured launches of the core's kernels carry programmatic stream
serialization: each kernel's launch overlaps the tail of the one before it, and its first
statement waits for that one's completion (RX_PDL_ENTRY, reflex/common.cuh).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

from ..cuda import driver as _drv
from ..cuda import memory, modules
from .device_array import Prepared

ENV = "REFLEX_CUDA_GRAPHS"
# eager steps traced before the first capture; the captured step is compared with the last
EAGER_STEPS = 1
# captures tried: a first step that makes something once per batch shape differs from the next
CAPTURES = 2
# chained steps in flight at most (queue); each has its own pinned slot and event
RING = 4
# The captured step's core kernels launch with programmatic dependent launch on sm_90 and later
# (cuda.modules.pdl); REFLEX_PDL=0 captures plain launches.
PDL = os.environ.get("REFLEX_PDL", "1") != "0"
# Chained steps (DecodeGraph.queue); REFLEX_DECODE_CHAIN=0 has every step wait for the host.
CHAIN = os.environ.get("REFLEX_DECODE_CHAIN", "1") != "0"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class DecodeGraph:
    """``forward(batch, state)`` = ``model.forward(batch, state, [0])`` for the one-token decode
    steps of one job on ``ops`` (a CudaOps), from a graph once it is safe. ``close()`` frees the
    graph (the job's end)."""

    def __init__(self, ops: Any, model: Any) -> None:
        self.ops, self.model = ops, model
        self.steps = 0
        self._note = "eager (not yet captured)"
        self._traces: list[tuple[list, list]] = []
        self._shape: tuple[int, int] | None = None
        self._stream: Any = None
        self._graph: Any = None
        self._exec: Any = None
        self._out: Any = None
        self._held: list[int] = []
        self._failed = False
        self._captures = 0
        self._chain: _Chain | None = None
        self._fed = False  # the steps' inputs are placed by queued copies (pick_first)
        ops._fixed_prepared = {}

    # -- the step ---------------------------------------------------------------------------
    def _forward(self, batch: Any, state: Any) -> Any:
        """The model's forward with its output's contents launched: the backend may defer a
        launch until its output is read (LazyArray), and a capture or trace must hold it."""
        out = self.model.forward(batch, state, [0])
        getattr(out, "ptr", None)
        return out

    def forward(self, batch: Any, state: Any) -> Any:
        return self._step(batch, state)[0]

    def _step(self, batch: Any, state: Any,
              feed: tuple[Any, Callable[[Any], None]] | None = None) -> tuple[Any, Any]:
        """One step: (its logits, the stream they are computed on). ``feed``: None when the step
        copies its own inputs (:meth:`forward`); (``dev``, ``place``) when ``place(stream)``
        queues them into ``dev``, the fixed buffer (:meth:`queue`, :meth:`queue_fed`): on the
        graph's stream for a replay or a capture (before it: a copy queued during a capture
        would be captured), else on the legacy stream the eager step runs on."""
        self.steps += 1
        legacy = _drv._STREAM
        shape = (batch.n_tokens, len(batch.runs))
        if self._exec is not None and shape == self._shape:
            if feed is None:
                self.ops.prepare(batch)  # into the fixed buffer the graph reads
            else:
                feed[1](self._stream)
            _drv.check(_drv._d.cuGraphLaunch(self._exec, self._stream), "cuGraphLaunch")
            return self._out, self._stream
        eager = self._failed or self._exec is not None  # or another shape than the graph's
        if not eager and shape != self._shape:
            self._traces.clear()
            self._shape = shape
        capture = not eager and len(self._traces) >= EAGER_STEPS
        pb = None
        if feed is not None:
            pb = Prepared(batch, feed[0], shape[1])
            feed[1](self._graph_stream() if capture else legacy)
        if eager:
            return self._placed(batch, state, pb), legacy
        if not capture:
            return self._traced(batch, state, pb), legacy
        if self._eligible():
            out = self._capture(batch, state, pb)
            if out is not None:
                return out, self._stream
            if self._captures < CAPTURES and not self._failed:
                return self._traced(batch, state, pb), legacy  # the next one captured
        self._failed = True
        return self._placed(batch, state, pb), legacy

    def _traced(self, batch: Any, state: Any, pb: Any = None) -> Any:
        launches: list = []
        copies: list = []
        modules.launch_trace, memory.copy_trace = launches, copies
        memory.record_begin()
        try:
            out = self._placed(batch, state, pb)
        finally:
            modules.launch_trace, memory.copy_trace = None, None
            temps = memory.record_end()
        self._traces.append(_canonical(launches, copies, temps, self._fixed()))
        return out

    def _placed(self, batch: Any, state: Any, pb: Any) -> Any:
        """The forward of a step whose inputs a queued copy puts in ``pb`` (no copy of its own);
        ``pb`` None: the forward copies them."""
        if pb is None:
            return self._forward(batch, state)
        ops = self.ops
        ops._graph_prepared = (batch, pb)
        try:
            return self._forward(batch, state)
        finally:
            ops._graph_prepared = None

    def _fixed(self) -> dict[int, int]:
        """The prepared buffers a replay reads, address -> bytes (the same every step)."""
        return {buf.ptr: buf.nbytes for buf in self.ops._fixed_prepared.values()}

    def _eligible(self) -> bool:
        """Whether the last eager step may be replayed: it launched kernels and its only host
        copy was its batch, into the fixed buffer."""
        launches, copies = self._traces[-1]
        if not launches:
            self._note = "eager: the step launched no kernels"
            return False
        host = [c for c in copies if c[0] != "dtod"]
        # fed: its inputs came by a queued copy, so none of its own; else the batch's one copy
        own = [] if self._fed else [("htod", ("prepared", 0))]
        if [(c[0], c[1]) for c in host] != own:
            self._note = f"eager: the forward copies to or from the host ({len(host)} copies)"
            return False
        return True

    def _graph_stream(self) -> Any:
        if self._stream is None:
            # blocking (flags 0): ordered with the legacy stream the eager work and copies use
            self._stream = _drv.check(_drv._d.cuStreamCreate(0), "cuStreamCreate")
        return self._stream

    def _capture(self, batch: Any, state: Any, pb: Any = None) -> Any:
        """Capture this step, traced; keep the graph and launch it when its trace is the last
        eager step's, else drop it (None; nothing of the step has run). ``pb``: the step's
        inputs, already queued on the graph's stream (else copied here)."""
        d = _drv._d
        ops = self.ops
        self._captures += 1
        if pb is None:
            pb = ops.prepare(batch)  # the step's inputs, before the capture: a copy is not captured
        self._graph_stream()
        legacy = _drv._STREAM
        ops._graph_prepared = (batch, pb)
        launches: list = []
        copies: list = []
        memory.record_begin()
        _drv._STREAM = self._stream
        modules.pdl = PDL and _drv.current_device().sm >= 90
        modules.launch_trace, memory.copy_trace = launches, copies
        graph = None
        try:
            _drv.check(d.cuStreamBeginCapture(
                self._stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED),
                "cuStreamBeginCapture")
            try:
                out = self._forward(batch, state)
            finally:
                graph = _drv.check(d.cuStreamEndCapture(self._stream), "cuStreamEndCapture")
        except Exception as e:  # noqa: BLE001 - the job goes on eagerly
            self._note = f"eager: the capture failed ({str(e).splitlines()[0][:200]})"
            self._failed = True
        finally:
            _drv._STREAM = legacy
            modules.pdl = False
            modules.launch_trace, memory.copy_trace = None, None
            ops._graph_prepared = None
            temps = memory.record_end()
        self._graph = graph
        if not self._failed:
            why = self._differs(_canonical(launches, copies, temps, self._fixed()))
            if why is None:
                try:
                    self._exec = _drv.check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
                except Exception as e:  # noqa: BLE001
                    self._note = f"eager: the capture failed ({str(e).splitlines()[0][:200]})"
                    self._failed = True
            else:
                self._note = why
        if self._exec is None:  # nothing of the step ran: its blocks need no holding
            self._drop_graph()
            return None
        self._held = list(temps)
        memory.hold(self._held)
        self._out = out
        why = self._note.removeprefix("eager: ")
        dropped = "" if self._captures == 1 else f"; the capture before it was dropped: {why}"
        self._note = f"graph (captured at step {self.steps}{dropped})"
        _drv.check(d.cuGraphLaunch(self._exec, self._stream), "cuGraphLaunch")
        return out

    def _differs(self, captured: tuple[list, list]) -> str | None:
        """Why the captured step may not stand for the eager one before it (None: it may)."""
        (l0, _), (l1, c1) = self._traces[-1], captured
        if l0 != l1:
            i = next((i for i, (a, b) in enumerate(zip(l0, l1)) if a != b), min(len(l0), len(l1)))
            name = l0[i][0] if i < len(l0) else l1[i][0]
            return (f"eager: launch {i} ({name}) differs between two steps (a parameter "
                    "follows the position on the host)")
        host = [c for c in c1 if c[0] != "dtod"]
        if host:
            return f"eager: the forward copies to or from the host ({len(host)} copies)"
        return None

    # -- chained steps ------------------------------------------------------------------------
    def device_pick(self, temperature: float, top_k: int, top_p: float, min_p: float,
                    rng: Any) -> "DevicePick | None":
        """What :meth:`queue` needs to pick tokens on the device (draws from ``rng``), or None
        when chaining is off (REFLEX_DECODE_CHAIN=0)."""
        return DevicePick(temperature, top_k, top_p, min_p, rng) if CHAIN else None

    def can_chain(self) -> bool:
        """Whether :meth:`queue` may run the next steps: the graph is captured, and a pick from
        its logits is a row of the model's embedding (the next replay reads it unchecked)."""
        return (self._exec is not None and not self._failed
                and self._out.shape[-1] == getattr(self.model, "n_vocab", None))

    def queue(self, batch: Any, pick: "DevicePick", token: int | None) -> int:
        """Queue one step of the graph's shape without waiting for anything: ``batch``'s
        per-step values put in, the graph replayed, the next token picked on the device
        (``pick``) into the token slot the next replay reads and into the pinned slot the host
        reads. ``token``: the step's own token id when the host has it; None when it is the pick
        of the step queued before (``batch`` then carries any id in its place). Returns the
        ticket that :meth:`result` takes."""
        if not self.can_chain() or (batch.n_tokens, len(batch.runs)) != self._shape:
            raise RuntimeError("queue: no captured graph of this batch's shape")
        # _step replays: the graph is captured for this shape (no state is read)
        return self._chain_of(self._out.shape[-1]).queue(self, batch, None, pick, token)

    def can_feed(self, logits: Any) -> bool:
        """Whether a job may chain from its prompt on (:meth:`pick_first`): its first logits
        (the prompt's last row) pick ids of the model's embedding, and no step ran yet."""
        return (self.steps == 0 and not self._failed and self._exec is None
                and logits.shape[-1] == getattr(self.model, "n_vocab", None))

    def pick_first(self, logits: Any, pick: "DevicePick", batch: Any) -> int:
        """Queue the pick of the prompt's next token from ``logits`` (the prefill's last row,
        launched, maybe still running) straight into the token slot of ``batch``, the job's
        first one-token step (any id in its place), without waiting; the id comes back with
        :meth:`result`. From here every step is :meth:`queue_fed`."""
        if not self.can_feed(logits):
            raise RuntimeError("pick_first: the job has run steps, or its logits are not ids")
        self._fed = True
        return self._chain_of(logits.shape[-1]).pick_first(self, logits, batch, pick)

    def queue_fed(self, batch: Any, state: Any, pick: "DevicePick") -> int:
        """Queue the step of ``batch`` (one token, its id in the device slot that the pick before
        filled) and its pick, without waiting: replayed once captured, else run eagerly --
        traced, then captured -- as :meth:`forward` does. Returns the ticket of its pick."""
        if not self._fed:
            raise RuntimeError("queue_fed: the job's first token was not picked on the device")
        return self._chain.queue(self, batch, state, pick, None)

    def _chain_of(self, n_vocab: int) -> "_Chain":
        if self._chain is None:
            self._chain = _Chain(n_vocab)
        return self._chain

    @property
    def note(self) -> str:
        """How the job's steps ran: eager (and why) or the graph (captured at which step), and
        whether chained on the device (from the prompt on: :meth:`pick_first`)."""
        if self._chain is None:
            return self._note
        return self._note + ", steps chained on the device" + (" from the prompt" if self._fed
                                                              else "")

    def result(self, ticket: int) -> int:
        """The token id picked by the queued step ``ticket`` (waits for that step)."""
        return self._chain.result(ticket)

    # -- the end ------------------------------------------------------------------------------
    def _drop_graph(self) -> None:
        d = _drv._d
        if self._exec is not None:
            _drv.check(d.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
            self._exec = None
        if self._graph is not None:
            _drv.check(d.cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._graph = None
        self._out = None
        if self._held:
            _drv.synchronize()  # a replay may still be writing them
            memory.release_held(self._held)
            self._held = []

    def close(self) -> None:
        """Free the graph and its blocks; the ops go back to a fresh prepared buffer per batch."""
        self.ops._fixed_prepared = None
        if self._chain is not None:
            self._chain.close()  # waits for the steps still queued
            self._chain = None
        self._drop_graph()
        if self._stream is not None:
            _drv.check(_drv._d.cuStreamDestroy(self._stream), "cuStreamDestroy")
            self._stream = None


class DevicePick:
    """How a chained step picks its token on the device: the arguments of
    CudaOps.sample_into (temperature <= 0: argmax), a fresh ``rng.random()`` per draw."""

    def __init__(self, temperature: float, top_k: int, top_p: float, min_p: float,
                 rng: Any) -> None:
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p
        self.rng = rng


class _Chain:
    """The chained steps' host side: per ring slot a pinned area (the batch's words going in,
    the picked id coming back) and an event recorded after the slot's step. The area is mapped
    into the device's address space: a kernel reads the words from it into the fixed buffer
    (CudaOps.put_words) and the pick writes its id into it, with no copies on the copy engine
    between two steps (each started about 5 us after the kernel before it: 16 us between the
    8B's steps, BENCHMARKS.md 2026-12-07, fifty-sixth session)."""

    def __init__(self, n_vocab: int) -> None:
        d = _drv._d
        self.slot_bytes = 4096
        self.host = _drv.check(d.cuMemHostAlloc(RING * self.slot_bytes,
                                                d.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc")
        # the device's address of the same memory (the host's own under unified addressing)
        self.dev = int(_drv.check(d.cuMemHostGetDevicePointer(self.host, 0),
                                  "cuMemHostGetDevicePointer"))
        flags = d.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self.events = [_drv.check(d.cuEventCreate(flags), "cuEventCreate") for _ in range(RING)]
        self.sent = 0  # picks queued; pick t uses slot t % RING
        self.n_vocab = n_vocab
        self.scratch: Any = None

    def _next_slot(self) -> int:
        """The ring slot of the next pick, once its last use has run (its words may still be
        on their way in)."""
        k = self.sent % RING
        if self.sent >= RING:
            _drv.check(_drv._d.cuEventSynchronize(self.events[k]), "cuEventSynchronize")
        return k

    def _words_and_buffer(self, ops: Any, batch: Any) -> tuple[Any, Any]:
        """(``batch``'s words, the fixed buffer of their length: made by the first step)."""
        words = ops.prepared_words(batch)
        if 4 * len(words) + 4 > self.slot_bytes:  # words, then the id in the last word
            raise RuntimeError("queue: the batch does not fit a ring slot")
        return words, ops._prepared_buffer(len(words))

    def queue(self, g: DecodeGraph, batch: Any, state: Any, pick: DevicePick,
              token: int | None) -> int:
        """One step and its pick: DecodeGraph._step with the step's inputs fed (``state``
        None: the graph is captured for ``batch``'s shape, so the step is a replay)."""
        ops = g.ops
        k = self._next_slot()
        words, dev = self._words_and_buffer(ops, batch)
        n = len(words)
        host = self._slot(k)
        ctypes.memmove(host, words.buffer_info()[0], 4 * n)
        skip = 0 if token is not None else batch.n_tokens  # the ids the step before picked

        def place(stream: Any) -> None:
            legacy = _drv._STREAM
            _drv._STREAM = stream
            try:
                ops.put_words(self._dev(host + 4 * skip), dev.ptr + 4 * skip, n - skip)
            finally:
                _drv._STREAM = legacy

        out, s = g._step(batch, state, (dev, place))
        return self._pick(ops, out, dev.ptr, pick, s, k)

    def pick_first(self, g: DecodeGraph, logits: Any, batch: Any, pick: DevicePick) -> int:
        """The prompt's next token picked into the token slot of ``batch``'s fixed buffer."""
        k = self._next_slot()
        _, dev = self._words_and_buffer(g.ops, batch)
        return self._pick(g.ops, logits, dev.ptr, pick, _drv._STREAM, k)

    def _pick(self, ops: Any, logits: Any, dst: int, pick: DevicePick, s: Any, k: int) -> int:
        """Queue on ``s``: the pick from ``logits`` into device ``dst`` (the token slot the next
        step reads) and slot ``k``'s id word, and the slot's event; returns its ticket."""
        d = _drv._d
        u = 0.0
        if pick.temperature > 0.0:
            u = pick.rng.random()
            if self.scratch is None:
                from .device_array import empty

                self.scratch = empty((self.n_vocab,), "f64")
        legacy = _drv._STREAM
        _drv._STREAM = s
        try:
            ops.sample_into(logits, dst, pick.temperature, pick.top_k, pick.top_p, u,
                            pick.min_p, self.scratch, self._dev(self._id(k)))
        finally:
            _drv._STREAM = legacy
        _drv.check(d.cuEventRecord(self.events[k], s), "cuEventRecord")
        ticket = self.sent
        self.sent += 1
        return ticket

    def result(self, ticket: int) -> int:
        if not self.sent - RING <= ticket < self.sent:
            raise RuntimeError(f"result: step {ticket} is not among the last {RING} queued")
        k = ticket % RING
        _drv.check(_drv._d.cuEventSynchronize(self.events[k]),
                   "cuEventSynchronize (a kernel of the decode step may have failed)")
        return ctypes.c_int32.from_address(self._id(k)).value

    def _slot(self, k: int) -> int:
        """Host address of ring slot ``k``: the step's words from its start."""
        return self.host + k * self.slot_bytes

    def _dev(self, addr: int) -> int:
        """The device's address of host address ``addr`` in the ring (the same memory)."""
        return self.dev + (addr - self.host)

    def _id(self, k: int) -> int:
        """Host address of the id slot ``k``'s step picked: the slot's last word."""
        return self._slot(k) + self.slot_bytes - 4

    def close(self) -> None:
        d = _drv._d
        _drv.synchronize()  # the steps still queued, on the graph's stream or the legacy one
        for ev in self.events:
            _drv.check(d.cuEventDestroy(ev), "cuEventDestroy")
        _drv.check(d.cuMemFreeHost(self.host), "cuMemFreeHost")
        self.scratch = None


def _canonical(launches: list, copies: list, temps: dict[int, int],
               fixed: dict[int, int]) -> tuple[list, list]:
    """A step's trace with every address inside a block the step allocated written as (block's
    allocation index, offset), and inside a prepared buffer (``fixed``, made by the first step
    and read by every replay) as ("prepared", offset): the caching allocator hands the same
    blocks out in another order from one step to the next, and a graph replays whatever blocks
    its capture got."""
    import bisect

    starts = [p for p in temps if p not in fixed]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    lo = [starts[i] for i in order]

    def addr(v: int) -> Any:
        for p, n in fixed.items():
            if p <= v < p + n:
                return ("prepared", v - p)
        j = bisect.bisect_right(lo, v) - 1
        if j >= 0:
            k = order[j]
            if v < starts[k] + temps[starts[k]]:
                return ("tmp", k, v - starts[k])
        return v

    out = []
    for name, dims, sig, args in launches:
        out.append((name, dims, sig, tuple(addr(v) if c == "P" else v for c, v in zip(sig, args))))
    cps = [(c[0],) + tuple(addr(v) for v in c[1:-1]) + (c[-1],) for c in copies]
    return out, cps
