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
assumed: the first steps run eagerly with every launch traced (kernel, grid, block, every
argument) and every copy; the graph is captured from the next step only when the last two
traces are equal and the only host copy was the batch's. Anything else -- a
parameter that moves with the position, a copy to or from the host inside the forward, a
failed capture -- leaves the job eager, with the reason in :attr:`DecodeGraph.note`.

What the check cannot see is a launch that changes only at some later step (a kernel variant
picked by context length, say): ops must pick their launches from the batch's shape alone
(docs/internals.md, "decode graphs"). The blocks a graph's replays write are held back from the
caching allocator until :meth:`DecodeGraph.close`.

On sm_90 and later the captured launches of the core's kernels carry programmatic stream
serialization: each kernel's launch overlaps the tail of the one before it, and its first
statement waits for that one's completion (RX_PDL_ENTRY, reflex/common.cuh).
"""

from __future__ import annotations

import os
from typing import Any

from ..cuda import driver as _drv
from ..cuda import memory, modules

ENV = "REFLEX_CUDA_GRAPHS"
# eager steps traced before a capture: the first one-token step creates what is made once per
# batch shape (workspaces), the last two are compared
EAGER_STEPS = 3
# The captured step's core kernels launch with programmatic dependent launch on sm_90 and later
# (cuda.modules.pdl); REFLEX_PDL=0 captures plain launches.
PDL = os.environ.get("REFLEX_PDL", "1") != "0"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class DecodeGraph:
    """``forward(batch, state)`` = ``model.forward(batch, state, [0])`` for the one-token decode
    steps of one job on ``ops`` (a CudaOps), from a graph once it is safe. ``close()`` frees the
    graph (the job's end)."""

    def __init__(self, ops: Any, model: Any) -> None:
        self.ops, self.model = ops, model
        self.steps = 0
        self.note = "eager (not yet captured)"
        self._traces: list[tuple[list, list]] = []
        self._shape: tuple[int, int] | None = None
        self._stream: Any = None
        self._graph: Any = None
        self._exec: Any = None
        self._out: Any = None
        self._held: list[int] = []
        self._failed = False
        ops._fixed_prepared = {}

    # -- the step ---------------------------------------------------------------------------
    def _forward(self, batch: Any, state: Any) -> Any:
        """The model's forward with its output's contents launched: the backend may defer a
        launch until its output is read (LazyArray), and a capture or trace must hold it."""
        out = self.model.forward(batch, state, [0])
        getattr(out, "ptr", None)
        return out

    def forward(self, batch: Any, state: Any) -> Any:
        self.steps += 1
        shape = (batch.n_tokens, len(batch.runs))
        if self._exec is not None and shape == self._shape:
            self.ops.prepare(batch)  # into the fixed buffer the graph reads
            d = _drv._d
            _drv.check(d.cuGraphLaunch(self._exec, self._stream), "cuGraphLaunch")
            return self._out
        if self._failed or self._exec is not None:  # another shape than the graph's: eager
            return self._forward(batch, state)
        if len(self._traces) < EAGER_STEPS:
            return self._traced(batch, state, shape)
        if self._eligible():
            out = self._capture(batch, state, shape)
            if out is not None:
                return out
        self._failed = True
        return self._forward(batch, state)

    def _traced(self, batch: Any, state: Any, shape: tuple[int, int]) -> Any:
        launches: list = []
        copies: list = []
        modules.launch_trace, memory.copy_trace = launches, copies
        memory.record_begin()
        try:
            out = self._forward(batch, state)
        finally:
            modules.launch_trace, memory.copy_trace = None, None
            temps = memory.record_end()
        if shape != self._shape:
            self._traces.clear()
            self._shape = shape
        self._traces.append(_canonical(launches, copies, temps))
        return out

    def _eligible(self) -> bool:
        (l0, c0), (l1, c1) = self._traces[-2:]
        if not l0:
            self.note = "eager: the step launched no kernels"
            return False
        if l0 != l1:
            i = next((i for i, (a, b) in enumerate(zip(l0, l1)) if a != b), min(len(l0), len(l1)))
            name = l0[i][0] if i < len(l0) else l1[i][0]
            self.note = (f"eager: launch {i} ({name}) differs between two steps (a parameter "
                         "follows the position on the host)")
            return False
        fixed = {buf.ptr for buf in self.ops._fixed_prepared.values()}
        host = [c for c in c0 if c[0] != "dtod"]
        if c0 != c1 or len(host) != 1 or host[0][0] != "htod" or host[0][1] not in fixed:
            self.note = f"eager: the forward copies to or from the host ({len(host)} copies)"
            return False
        return True

    def _capture(self, batch: Any, state: Any, shape: tuple[int, int]) -> Any:
        d = _drv._d
        ops = self.ops
        pb = ops.prepare(batch)  # the step's inputs, before the capture: a copy is not captured
        if self._stream is None:
            # blocking (flags 0): ordered with the legacy stream the eager work and copies use
            self._stream = _drv.check(d.cuStreamCreate(0), "cuStreamCreate")
        legacy = _drv._STREAM
        ops._graph_prepared = (batch, pb)
        memory.record_begin()
        _drv._STREAM = self._stream
        modules.pdl = PDL and _drv.current_device().sm >= 90
        captured = False
        try:
            _drv.check(d.cuStreamBeginCapture(
                self._stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED),
                "cuStreamBeginCapture")
            try:
                out = self._forward(batch, state)
            finally:
                graph = _drv.check(d.cuStreamEndCapture(self._stream), "cuStreamEndCapture")
            self._graph = graph
            self._exec = _drv.check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
            captured = True
        except Exception as e:  # noqa: BLE001 - the job goes on eagerly
            self.note = f"eager: the capture failed ({str(e).splitlines()[0][:200]})"
        finally:
            _drv._STREAM = legacy
            modules.pdl = False
            ops._graph_prepared = None
            self._held = list(memory.record_end())
            memory.hold(self._held)
        if not captured:
            self._drop_graph()
            return None
        self._out = out
        self.note = f"graph (captured at step {self.steps})"
        _drv.check(d.cuGraphLaunch(self._exec, self._stream), "cuGraphLaunch")
        return out

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
        self._drop_graph()
        if self._stream is not None:
            _drv.check(_drv._d.cuStreamDestroy(self._stream), "cuStreamDestroy")
            self._stream = None


def _canonical(launches: list, copies: list, temps: dict[int, int]) -> tuple[list, list]:
    """A step's trace with every address inside a block the step allocated written as (block's
    allocation index, offset): the caching allocator hands the same blocks out in another order
    from one step to the next, and a graph replays whatever blocks its capture got."""
    import bisect

    starts = list(temps)
    order = sorted(range(len(starts)), key=starts.__getitem__)
    lo = [starts[i] for i in order]

    def addr(v: int) -> Any:
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
