"""Device tensors of the CUDA backend: :class:`DeviceArray` (pointer, NumPy-order shape, dtype,
the owner that keeps its memory alive), allocation from the driver's caching allocator, and
:class:`Prepared` (a batch's token ids, positions, mask and sequence ids on the device). No
numpy: the cold path uses these."""

from __future__ import annotations

from typing import Any, Sequence

from ..cuda import memory
from ..ops import Batch

_ITEMSIZE = {"f32": 4, "i32": 4, "f64": 8}


def prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class Block:
    """Device memory from the caching allocator; returned to it when collected."""

    __slots__ = ("ptr", "nbytes")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = _alloc(nbytes)

    def __del__(self) -> None:
        try:
            _free(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_alloc, _free = memory.alloc, memory.free


class DeviceArray:
    """A row-major device tensor: ``ptr`` (int), NumPy-order ``shape``, ``owner`` (what keeps the
    memory alive: a pool block, another array's owner for views, or None for borrowed memory),
    ``size`` (element count)."""

    __slots__ = ("ptr", "shape", "owner", "dtype", "size")

    def __init__(self, ptr: int, shape: tuple[int, ...], owner: Any, dtype: str = "f32",
                 size: int | None = None):
        self.ptr = ptr
        self.shape = shape
        self.owner = owner
        self.dtype = dtype
        self.size = prod(shape) if size is None else size

    @property
    def nbytes(self) -> int:
        return self.size * _ITEMSIZE[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def address(self) -> int:
        """The address, without making deferred contents ready (:class:`LazyArray`)."""
        return self.ptr

    def __repr__(self) -> str:
        return f"DeviceArray({self.ptr:#x}, shape={self.shape}, {self.dtype})"


_SLOT_PTR = DeviceArray.__dict__["ptr"]  # the base class's address slot


class LazyArray(DeviceArray):
    """A float32 DeviceArray whose contents a deferred launch writes (or finishes): ``pending``
    is the deferral (an object whose ``ready(array)`` does it), or None once done. Reading
    :attr:`ptr` makes it ready first, so every kernel, copy or view that takes the address sees
    the contents; a consumer that computes them itself reads :attr:`address` and leaves
    ``pending`` in place for the readers after it. The deferred launch reads its inputs when it
    runs: the backend defers only launches whose inputs no op writes in place."""

    __slots__ = ("pending",)

    def __init__(self, ptr: int, shape: tuple[int, ...], owner: Any, pending: Any,
                 size: int | None = None):
        super().__init__(ptr, shape, owner, "f32", size)
        self.pending = pending

    @property  # type: ignore[override]
    def ptr(self) -> int:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.ready(self)
        return _SLOT_PTR.__get__(self, DeviceArray)

    @ptr.setter
    def ptr(self, value: int) -> None:
        _SLOT_PTR.__set__(self, value)

    @property
    def address(self) -> int:
        return _SLOT_PTR.__get__(self, DeviceArray)

    def __repr__(self) -> str:
        return (f"LazyArray({self.address:#x}, shape={self.shape}, "
                f"pending={self.pending is not None})")


def empty(shape: Sequence[int], dtype: str = "f32") -> DeviceArray:
    shape = tuple(int(s) for s in shape)
    n = prod(shape)
    blk = Block(max(1, n) * _ITEMSIZE[dtype])
    return DeviceArray(blk.ptr, shape, blk, dtype, n)


def empty_f32(shape: tuple[int, ...], n: int) -> DeviceArray:
    """``empty`` for the hot path: ``shape`` a tuple of ints, ``n`` its product, float32."""
    blk = Block(4 * n if n else 4)
    return DeviceArray(blk.ptr, shape, blk, "f32", n)


class Prepared:
    """A batch on the device (``ops.prepare``): token ids, positions, the three mask arrays,
    the sequence ids (``T`` int32 each), the sequence runs (:attr:`Batch.runs`, ``n_runs``
    triples ``(seq, t0, t1)``) and the first cell (:attr:`Batch.cell0`) in one int32 buffer.
    Kernels that read their step-dependent values (positions, cells, the mask) from this buffer
    rather than from launch parameters can be replayed from a captured graph
    (reflex_core.backends.cuda_graph)."""

    __slots__ = ("batch", "n_tokens", "cell0", "n_kv", "buf", "tokens", "positions",
                 "prefix_end", "own_start", "own_end", "seq_ids", "runs", "n_runs", "cell0_dev",
                 "tok_min", "tok_max")

    def __init__(self, batch: Batch, buf: DeviceArray, n_runs: int):
        T = batch.n_tokens
        self.batch = batch
        self.n_tokens = T
        self.cell0 = batch.cell0
        self.n_kv = batch.n_kv
        self.buf = buf
        b = buf.ptr
        self.tokens, self.positions = b, b + 4 * T
        self.prefix_end, self.own_start, self.own_end = b + 8 * T, b + 12 * T, b + 16 * T
        self.seq_ids = b + 20 * T
        self.runs, self.n_runs = b + 24 * T, n_runs
        self.cell0_dev = b + 4 * (6 * T + 3 * n_runs)  # cell0, for kernels that replay
        self.tok_min = min(batch.tokens) if T else 0
        self.tok_max = max(batch.tokens) if T else 0
