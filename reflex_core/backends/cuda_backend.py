"""``CudaOps``: the ops interface on the GPU -- device-resident weights and activations, AOT kernels.

* Weights: :meth:`CudaOps.attach` uploads the GGUF's whole tensor-data region once (one
  allocation, one copy straight from the page-locked mmap); a :class:`Weight`'s ``data`` is the
  device address of its bytes inside that blob, still in its GGML type.
* Activations: :class:`DeviceArray` (device pointer, NumPy-order shape, dtype), row-major. Memory
  comes from the driver's caching allocator and goes back to it when the array is garbage
  collected (CPython frees it as soon as the last reference goes).
* Kernels: the core module (``cuda/core.cu``) for everything but the weight ops, which go through
  :mod:`reflex_core.cuda.quant_ops` to the module that serves the weight's type (``quant``, or
  ``quant_lowbit``, loaded by :meth:`CudaOps.attach` for a file that has one of its types).
* Fused ops (``matmul_many``, ``matmul_swiglu``, ``moe_matmul_swiglu``, ``add_rmsnorm``,
  ``qk_norm_rope_store``): one launch each where the unfused ops need 2-6; a dense Qwen3 layer is
  8 launches. Hot-path ops avoid per-call work: weights carry their launch plan
  (``Weight.meta``, a ``quant_ops.MatPlan`` made in :meth:`CudaOps.weight`), RoPE arguments are
  cached per RopeParams object, ops with several outputs take them from one allocation.
* Nothing comes back to the host except ``argmax``/``sample``/``token_logprobs`` results (and
  ``to_numpy`` for tests and ``reflex check``). No numpy import on this path.

Each op's NumPy twin is the NumpyOps op of the same name; tests/gpu/ compares them.
"""

from __future__ import annotations

import os
import time

import struct
from array import array
from typing import Any, Sequence

from .. import sampling
from ..cuda import driver, memory, modules, upload
from ..cuda.modules import limit
from ..errors import ModelError, ReflexError
from ..ggml_types import GGML_TYPES
from ..ops import Batch, Ops, RopeParams, Weight, moe_route_groups, rows_view_shape
from .device_array import Block, DeviceArray, LazyArray, Prepared, empty, empty_f32, prod

_F32, _Q8_0 = 0, 8
_LORA_TILE, _LORA_BLOCK_Y = 32, 8  # cuda/core.cu LORA_TILE, LORA_BLOCK_Y (reflex_lora_add)
# One-token matmuls of the integer-unit weight types (quant_ops.XQ_TYPES) run on x limbs;
# REFLEX_GEMV_XQ=0 keeps them on the float GEMV (an A/B switch: the two differ by rounding only).
_GEMV_XQ = os.environ.get("REFLEX_GEMV_XQ", "1") != "0"
# Prefill matmuls of quant_ops.XH_TYPES below the pairs GEMM's tokens run on x halves (float16
# tensor cores); REFLEX_XH=0 keeps them on the 3xTF32 tiled kernel: an A/B switch.
_XH = os.environ.get("REFLEX_XH", "1") != "0"
# Prefill matmuls of quant_ops.PAIRS_MIN_T tokens or more, every weight type, run as one float16
# GEMM on pairs (quant_ops.matmul_pairs); REFLEX_PAIRS=0 keeps the paths above (an A/B switch:
# they differ by rounding only)
_PAIRS = os.environ.get("REFLEX_PAIRS", "1") != "0"
# A decode step's residual add + RMSNorm runs inside the GEMVs around it (quant_ops.NORM_TYPES):
# the output projection before it adds the residual (after a MoE FFN, the combine of its experts:
# reflex_moe_combine_resnorm), the GEMVs after it apply the norm's scale.
# REFLEX_FUSE_NORM=0 launches reflex_add_rmsnorm instead (an A/B switch: the normed values differ
# by rounding, the residual stream not at all).
FUSE_NORM = os.environ.get("REFLEX_FUSE_NORM", "1") != "0"
# The prefill's attention runs on the tensor cores (reflex_attention_mma128/256); REFLEX_ATT_MMA=0
# keeps the float32 query tiles (an A/B switch: the two differ by rounding only).
ATT_MMA = os.environ.get("REFLEX_ATT_MMA", "1") != "0"
_GATING = {"softmax": 1, "sigmoid": 2, "softmax_weight": 3, "sqrt_softplus": 4}


def tensor_region(tensors: Any, data_offset: int, file_size: int) -> tuple[int, int]:
    """(start, size) of the file's tensor-data region that :meth:`CudaOps.attach` uploads: from
    ``data_offset`` to the end of the last tensor, but never past the end of the file (a
    directory from a cache could claim more; :func:`weight_offset` then refuses the tensors
    that lie outside, as the CPU backend refuses them when they are used)."""
    start = int(data_offset)
    end = max((int(t.offset) + int(t.nbytes) for t in tensors), default=start)
    return start, max(0, min(end, int(file_size)) - start)


def weight_offset(info: Any, ggml_type: int, ne: tuple, start: int, size: int) -> int:
    """Where the bytes of tensor ``info`` (type ``ggml_type``, shape ``ne``) lie in the uploaded
    region ``[start, start + size)`` of the file, as an offset into it -- after the checks
    NumpyOps.weight makes: the tensor's byte size must be what its shape and type take, and its
    bytes must lie inside the region. A kernel handed a pointer past the upload would read
    other memory, so an inconsistent directory is a ModelError here. Pure (no device): tested
    in CI."""
    name = info.name
    t = GGML_TYPES[ggml_type]
    row = ne[0] if ne else 1
    if row % t.block_size:
        raise ModelError(f"tensor {name!r}: row length {row} is not a multiple of the "
                         f"{t.name} block size {t.block_size}")
    want = row // t.block_size * t.type_size
    for n in ne[1:]:
        want *= n
    nbytes, offset = int(info.nbytes), int(info.offset)
    if nbytes != want:
        raise ModelError(f"tensor {name!r}: {nbytes} bytes of data, expected {want}")
    rel = offset - start
    if rel < 0 or rel + nbytes > size:
        raise ModelError(f"tensor {name!r}: its data ({nbytes} bytes at offset {offset}) lies "
                         f"outside the file's tensor data [{start}, {start + size})")
    return rel


# The decode attention's slices of a long cache (attention_splits): caches from SPLIT_MIN_CELLS
# cells are split, a slice to SPLIT_CELLS cells or more, into no more slices than fill
# SPLIT_BLOCKS blocks (two an SM of an H100 / H200). Slices of about 200 cells were the fastest
# after a 1518-token prompt on an H100 (BENCHMARKS.md, 2026-12-06, forty-second session; cache
# of 1582 cells, ms/token): 0.6B 1.030 at slices of 256 cells (6 a head, 96 blocks) against 1.013
# at 192 (8, 128 blocks), 1.077 at 128 (12) and 1.079 at 96 (16); 8B 2.770 against 2.740 at 192
# (8 a head, 256 blocks) and 2.820 at 4 slices a head; 30B-A3B 2.428 against 2.384.
SPLIT_MIN_CELLS = 512
SPLIT_CELLS = 192
SPLIT_BLOCKS = 264
ARGMAX_SPLIT_MAX_BLOCKS = 1024  # rows of up to 4M logits; longer ones take one block
ATT_COUNTERS = 4096  # (token, head) slots of the split attention's counters (CudaOps._att_done)


def attention_splits(T: int, H: int, n_cells: int) -> int:
    """Slices of the visible cells that reflex_attention spreads one (head, token) over
    (flash-decoding): 1 for a prefill, whose H*T blocks fill the GPU already; for a few tokens,
    one per SPLIT_CELLS cells of the cache from SPLIT_MIN_CELLS cells, no more than fills
    SPLIT_BLOCKS blocks or REFLEX_ATT_MAX_SPLITS. From the cache's size, not the tokens'
    context: the same for every step of a job, as a captured decode graph needs
    (docs/internals.md)."""
    if T > 4 or T * H > ATT_COUNTERS or n_cells < SPLIT_MIN_CELLS:
        return 1
    want = min(n_cells // SPLIT_CELLS, max(1, SPLIT_BLOCKS // (H * T)), limit("ATT_MAX_SPLITS"))
    return max(1, want)


QKR_ROWS_MIN_T = 16  # tokens from which the prologue takes reflex_qk_norm_rope_rows


def qkr_kernel(T: int, dk: int) -> tuple[str, int, int]:
    """The attention prologue's kernel for T tokens of head size dk, its heads a block and its
    threads: a prefill's many heads a warp each (reflex_qk_norm_rope_rows, 8 heads a block), a
    decode step's few a block each, a thread a dim (reflex_qk_norm_rope_store): the same bits."""
    if T >= QKR_ROWS_MIN_T:
        return "reflex_qk_norm_rope_rows", 8, 256
    return "reflex_qk_norm_rope_store", 1, 128 if dk <= 128 else 256


ROPE_ATT_MAX_T = 4  # tokens of one reflex_rope_attention_vec launch (cuda/core.cu)
# A decode step's q/k norms, RoPE and cache write run inside its attention launch
# (rope_attention; REFLEX_ROPE_ATT=0: qk_norm_rope_store's launch, then the attention's). Since
# the fused kernel computes its RoPE pairs and loads the caches' earlier cells before its
# programmatic wait, it is the faster form (BENCHMARKS.md 2026-12-06, forty-seventh session: 8B
# 2.405 -> 2.379 ms/token on an H100, 2.214 -> 2.200 on the H200; the 0.6B's decode after 1518
# tokens 1.044 -> 0.958); before that it cost the 8B and 30B-A3B 20-70 us a token (2026-12-03).
ROPE_ATT = os.environ.get("REFLEX_ROPE_ATT", "1") != "0"
# REFLEX_ATT_PRE=0: the decode attention after qk_norm_rope_store reads no cache row before its
# programmatic wait (an A/B switch: the same bits either way)
ATT_PRE = os.environ.get("REFLEX_ATT_PRE", "1") != "0"


ATT_TILED_MIN_T = 16  # tokens from which a forward's attention runs query tiles


def _attention_tiled_kernel(T: int, dk: int, dv: int, *ptrs: int) -> tuple[str, int] | None:
    """The query-tiled attention kernel for T tokens of head sizes dk / dv and its tokens per
    block, or None where reflex_attention serves: fewer than ATT_TILED_MIN_T tokens (decode,
    short batches: the flash-decoding splits), head sizes not a multiple of 4 or over 256, or a
    pointer not 16-byte aligned (the tiles load float4)."""
    if T < ATT_TILED_MIN_T or dk % 4 or dv % 4 or max(dk, dv) > 256 or any(p % 16 for p in ptrs):
        return None
    if max(dk, dv) <= 128:
        return "reflex_attention_tiled128", 32
    return "reflex_attention_tiled256", 16


# The tensor-core attention kernels (cuda/core.cu): largest head size DMAX -> kernel, tokens a
# block, cells a tile
_ATT_MMA_TILES = {128: ("reflex_attention_mma128", 128, 32),
                  256: ("reflex_attention_mma256", 64, 16)}


def _attention_mma_kernel(T: int, dk: int, dv: int,
                          *ptrs: int) -> tuple[str, int, int, int, int] | None:
    """The tensor-core attention kernel for T tokens of head sizes dk / dv: (name, tokens a
    block, threads, dynamic shared memory: the query tile's float16 pairs and two stages of a
    cell tile's K and V pairs, rows of DMAX + 8 halves, and DMAX, the head size its
    reflex_kv_halves rows take), or None where it does not serve (the same bounds as
    :func:`_attention_tiled_kernel`)."""
    if not _attention_tiled_kernel(T, dk, dv, *ptrs):
        return None
    dmax = 128 if max(dk, dv) <= 128 else 256
    name, bq, bk = _ATT_MMA_TILES[dmax]
    return name, bq, 2 * bq, 4 * (bq + 4 * bk) * (dmax + 8), dmax


def _attention_kernel(dk: int, dv: int, *ptrs: int) -> str:
    """The kernel for a few tokens (decode): reflex_attention_vec128/256 (4 cells a warp at a
    time, float4 rows) for head sizes a multiple of 4 and 16-byte aligned buffers, else
    reflex_attention."""
    if dk % 4 or dv % 4 or any(p % 16 for p in ptrs):
        return "reflex_attention"
    return "reflex_attention_vec128" if max(dk, dv) <= 128 else "reflex_attention_vec256"


class _PendingGemv:
    """CudaOps.matmul of one token, deferred (its LazyArray's ``pending``): an add_rmsnorm that
    takes it as the branch output launches its residual-step form (``resnorm``,
    quant_ops.fused_norm_launch "r") instead; a reader of the product itself gets the plain
    GEMV launched first (:meth:`ready`). Holds x until then."""

    __slots__ = ("ops", "m", "x", "w_ptr", "resnorm")

    def __init__(self, ops: "CudaOps", m, x, w_ptr: int, resnorm: tuple):
        self.ops, self.m, self.x, self.w_ptr, self.resnorm = ops, m, x, w_ptr, resnorm

    def ready(self, arr: LazyArray) -> None:
        m = self.m
        self.ops._matmul_launch(m, self.x, 1, (self.w_ptr, 0, 0), (arr.address, 0, 0),
                                (m.n_out, 0, 0), False, m.gemv_w_ok)


class _PendingEmbed:
    """CudaOps.embed of one token, deferred (its LazyArray's ``pending``): an rmsnorm of the row
    launches the embedding's norm form instead (quant_ops.embed ``norm``: the row, y = row * w and
    the norm's block sums in one launch, y's scale left to its readers as after a residual-step
    GEMV), so a decode step's first norm needs no launch of its own; any other reader gets the
    plain embedding launched first (:meth:`ready`)."""

    __slots__ = ("ops", "w", "ids")

    def __init__(self, ops: "CudaOps", w: Weight, ids: int):
        self.ops, self.w, self.ids = ops, w, ids

    def launch(self, out_ptr: int, norm: tuple | None = None) -> None:
        w = self.w
        self.ops._quant_ops.embed(self.ops._qkern_of(w.ggml_type), w.data, w.ggml_type, self.ids,
                                  out_ptr, 1, w.ne[0], w.ne[1], norm)

    def ready(self, arr: LazyArray) -> None:
        self.launch(arr.address)


class _PendingCombine:
    """CudaOps.moe_combine of one token, deferred (its LazyArray's ``pending``): an add_rmsnorm
    that takes it as the branch output launches reflex_moe_combine_resnorm instead (the sum, the
    residual add and the norm's block sums in one launch); a reader of the sum itself gets
    reflex_moe_combine launched first (:meth:`ready`). Holds the expert outputs and weights."""

    __slots__ = ("k", "y", "weights")

    def __init__(self, k, y, weights):
        self.k, self.y, self.weights = k, y, weights

    def ready(self, arr: LazyArray) -> None:
        _combine_launch(self.k, self.y, self.weights, arr.address)


def _combine_launch(k, y, weights, out_ptr: int) -> None:
    """The weighted sum of the expert outputs ``y [T, k, n]`` by ``weights [T, k]`` into
    ``out_ptr`` ([T, n] float32): one reflex_moe_combine launch."""
    T, n_used, n = y.shape
    k.launch("reflex_moe_combine", ((n + 255) // 256, T), 256,
             (y.ptr, weights.ptr, out_ptr, n_used, n))


class _NormScale:
    """The output of a fused add_rmsnorm of one row: the array holds ``h * w``, still to be
    scaled by ``1 / rms(h)`` from the producer's block sums ``part``. A one-token GEMV with a
    normed form (quant_ops.fused_norm_launch "n") applies the scale itself; any other reader gets
    reflex_norm_apply launched first, in place (:meth:`ready`)."""

    __slots__ = ("k", "part", "n_part", "n", "eps")

    def __init__(self, k, part: int, n_part: int, n: int, eps: float):
        self.k, self.part, self.n_part, self.n, self.eps = k, part, n_part, n, eps

    def ready(self, arr: LazyArray) -> None:
        n = self.n
        self.k.launch("reflex_norm_apply", (n + 255) // 256, 256,
                      (arr.address, self.part, self.n_part, n, self.eps))


class CudaOps(Ops):
    """The GPU backend. ``attach`` uploads the weights; every op runs on the device."""

    name = "cuda"

    def __init__(self, device: int = 0) -> None:
        self.device = driver.current_device()
        # self.k (the core module) is fetched on first use (__getattr__): on the cold path the
        # modules are still loading on the init thread while the weights upload.
        self.gguf: Any = None
        self._blob = 0
        self._blob_size = 0
        self._data_offset = 0
        self._registration: Any = None
        self._unpin: Any = None  # the Background unpinning the upload's pages (attach)
        self._fixed_prepared: dict[int, DeviceArray] | None = None  # cuda_graph.DecodeGraph
        self._graph_prepared: tuple | None = None  # (batch, Prepared) while a graph is captured
        self._att_done: Block | None = None  # the split attention's counters (_att_counters)
        self._argmax_part: Block | None = None  # the split argmax's count and pairs (_argmax_row)
        self.upload_info: dict = {}
        self._weights: dict[str, Weight] = {}
        self._f32: dict[str, DeviceArray] = {}
        self._lora_blobs: list[int] = []  # merged LoRA weights (merge_lora), freed by release
        self._after_upload: list = []  # merge_lora launches waiting for the upload
        self._quant_ops: Any = None
        self._quant_k: dict[str, Any] = {}  # weight-kernel module name -> its loaded Kernels
        self._rope_p: Any = None  # the RopeParams whose kernel arguments _rope_a holds
        self._rope_a: tuple = ()
        from ..cuda import quant_ops  # no numpy; its kernels load on first use (_qkern)

        self._quant_ops = quant_ops

    def __getattr__(self, name: str) -> Any:
        if name == "k":
            k = self.k = modules.get_kernels("core")
            return k
        return super().__getattr__(name)  # a registered plugin op

    # --- quantized-weight kernels (reflex_core.cuda.quant_ops) --------------------------------
    def _qkern(self, module: str) -> Any:
        """The loaded weight-kernel module ``module`` (a MatPlan's ``module``), loaded on first
        use when attach has not loaded it."""
        k = self._quant_k.get(module)
        if k is None:
            k = self._quant_k[module] = modules.get_kernels(module)
        return k

    def _qkern_of(self, ggml_type: int) -> Any:
        """The loaded module that serves ``ggml_type``'s kernels."""
        return self._qkern(self._quant_ops.module_of(ggml_type))

    @staticmethod
    def _supported(t: int) -> bool:
        if t == _F32:
            return True
        try:
            from ..cuda import quant_ops
        except ImportError:
            return False
        return t in quant_ops.SUPPORTED_TYPES

    # --- weights and state ----------------------------------------------------------------
    def attach(self, gguf, keep_pinned: bool = False, wait: bool = True) -> None:
        """Upload the file's whole tensor-data region: one cuMemAlloc, then the pipelined
        host-registered copy of :func:`upload.upload_host_region`.

        ``wait=False`` returns once the device memory exists (weights can be bound: their
        addresses are known) and leaves the copy running on a thread; :meth:`wait_attached`
        joins it (the engine binds the model meanwhile). The registration is released as soon as
        the copy is done, unless ``keep_pinned`` (a one-shot process that exits right after its
        first result skips the unpinning). A registration must never outlive its mmap: CUDA
        would keep translating that virtual range to the old pages, and a later mapping at the
        same address would upload stale bytes."""
        self.release()
        self.gguf = gguf
        start, size = tensor_region(gguf.tensors.values(), gguf.data_offset, len(gguf.mm))
        self._data_offset = start
        self._blob_size = size
        if size <= 0:
            return
        # The start loaded the common types' weight kernels only; a module the file's types need
        # beyond those (quant_lowbit) loads now, before the copy: a module load next to the
        # pinning upload is 5-10x slower (cuda/start.py). Timed in driver.INIT_STEPS.
        modules.load_modules(self._quant_ops.modules_for(
            {t.ggml_type for t in gguf.tensors.values()}))
        self._blob = memory.mem_alloc_raw(size)

        def copy() -> None:
            info = upload.upload_host_region(self._blob, gguf.mm, start, size)
            self._registration = info.pop("registration", None)
            self.upload_info = info
            if not keep_pinned:  # unpinned beside the first forward, not before it
                from ..background import Background

                self._unpin = Background(self._unregister)

        if wait:
            copy()
            return
        from ..background import Background

        self._upload = Background(copy)

    def wait_attached(self) -> None:
        """Block until an ``attach(wait=False)`` upload is complete (re-raising its error)."""
        up, self._upload = getattr(self, "_upload", None), None
        if up is not None:
            up.wait()
        pending, self._after_upload = self._after_upload, []
        for run in pending:  # the LoRA merges (merge_lora), in order
            run()

    def _unregister(self) -> None:
        t0 = time.perf_counter()
        self.release_host_registration()
        self.upload_info["unregister_ms"] = (time.perf_counter() - t0) * 1e3

    def release_host_registration(self) -> None:
        """Unpin the mmap pages registered by attach (the upload is complete by then)."""
        reg, self._registration = self._registration, None
        if reg is not None:
            reg.release()

    def release(self) -> None:
        """Free the weights (device) and unpin the host pages; the ops can attach again."""
        self._after_upload = []
        try:
            self.wait_attached()
        except Exception:  # noqa: BLE001 - releasing anyway
            pass
        unpin, self._unpin = self._unpin, None
        if unpin is not None:
            try:
                unpin.wait()
            except Exception:  # noqa: BLE001 - unpinned below, or the error comes again there
                pass
        self.release_host_registration()
        self._weights.clear()
        self._f32.clear()
        if self._blob or self._lora_blobs:
            driver.synchronize()
        if self._blob:
            blob, self._blob = self._blob, 0
            memory.mem_free_raw(blob)
        while self._lora_blobs:
            memory.mem_free_raw(self._lora_blobs.pop())
        self.gguf = None

    def weight(self, name: str) -> Weight:
        w = self._weights.get(name)
        if w is not None:
            return w
        info, t, ne = self._tensor_info(
            name, self._supported, "which the CUDA backend cannot compute with; use --backend "
            "cpu or a file quantized with a supported type")
        from ..cuda import quant_ops

        ptr = self._blob + weight_offset(info, t, ne, self._data_offset, self._blob_size)
        w = Weight(name, t, ne, ptr, quant_ops.plan(t, ne, ptr, name))
        self._weights[name] = w
        return w

    def weight_rows(self, w: Weight, row0: int, n_rows: int) -> Weight:
        """The rows at their address in ``w``'s data (no copy); a 3-D view keeps ``w``'s distance
        between experts (``MatPlan.expert_bytes``), which the MoE kernels take as an argument."""
        from ..cuda import quant_ops

        ne, name = rows_view_shape(w, row0, n_rows)
        ptr = w.data + row0 * quant_ops.row_bytes(w.ggml_type, w.ne[0])
        return Weight(name, w.ggml_type, ne, ptr,
                      quant_ops.plan(w.ggml_type, ne, ptr, name, self._meta(w).expert_bytes))

    def merge_lora(self, adapters: Sequence[Any]) -> None:
        """Merge LoRA adapters (reflex_core.lora.Adapter, in order) into the weights, on the
        device: each target is dequantized to float32 into one allocation for all of them, then
        ``reflex_lora_add`` adds ``scale · B @ A`` (``A @ Bᵀ`` for the embedding) in place. The
        weight table points at the F32 copies at once (every matmul/embed/MoE kernel reads F32),
        so a model bound afterwards binds the merged weights. The blob keeps the originals (one
        allocation: they cannot be freed one by one). Each adapter's tensor data goes up in one
        copy now (the caller may close the adapter on return); F16/BF16 factors are converted on
        the device, one launch per type. The launches that read the base weights wait for the
        upload: after an ``attach(wait=False)`` they run in :meth:`wait_attached`, so the model
        binds while the weights upload, as without adapters."""
        from ..cuda import quant_ops

        slots: dict[str, int] = {}
        total = 0
        for ad in adapters:
            for m in ad.merges:
                if m.name not in slots:
                    slots[m.name] = total
                    total += (4 * prod(m.ne) + 255) & ~255
        if not total:
            return
        blob = memory.mem_alloc_raw(total)
        self._lora_blobs.append(blob)
        bases = {name: self.weight(name) for name in slots}
        factors = [self._lora_factors(ad) for ad in adapters]
        for name, off in slots.items():
            ne, ptr = bases[name].ne, blob + off
            self._weights[name] = Weight(name, _F32, ne, ptr, quant_ops.plan(_F32, ne, ptr, name))
            self._f32.pop(name, None)

        def launch() -> None:
            qo = self._quant_ops
            for name, w in bases.items():  # the base values, as float32
                if w.ggml_type == _F32:
                    memory.dtod(blob + slots[name], w.data, 4 * prod(w.ne))
                else:
                    qo.dequant(self._qkern_of(w.ggml_type), w.data, w.ggml_type, prod(w.ne),
                               blob + slots[name])
            for ad, (ptrs, _held) in zip(adapters, factors):
                for m in ad.merges:
                    n_in, n_out = m.ne[0], m.ne[1]
                    lp, rp = ptrs[m.a.name], ptrs[m.b.name]
                    rs_j, rs_i = 1, m.rank  # the embedding: R(j, i) = B[i, j]
                    if not m.embedding:
                        lp, rp = rp, lp
                        rs_j, rs_i = n_in, 1
                    self.k.launch("reflex_lora_add",
                                  ((n_in + _LORA_TILE - 1) // _LORA_TILE,
                                   (n_out + _LORA_TILE - 1) // _LORA_TILE, m.n_expert),
                                  (_LORA_TILE, _LORA_BLOCK_Y, 1),
                                  (blob + slots[m.name], lp, rp, n_out, n_in, m.rank, rs_j, rs_i,
                                   float(m.scale)))

        if getattr(self, "_upload", None) is not None:
            self._after_upload.append(launch)
        else:
            launch()

    def _lora_factors(self, adapter: Any) -> tuple[dict[str, int], list]:
        """(device float32 address of each of ``adapter``'s factors by tensor name, the buffers
        that hold them): its tensor data goes up in one copy from the mapping; F32 factors are
        read in place, F16/BF16 ones from one conversion of the whole region per type (every
        factor lies a multiple of 4 bytes into the region, lora.py checks, so the region's k-th
        16-bit word is factor byte 2k), Q8_0 ones (blocks of 34 bytes) each dequantized alone."""
        g = adapter.gguf
        start, size = tensor_region(g.tensors.values(), g.data_offset, len(g.mm))
        raw = empty(((size + 3) // 4,))
        addr, _ = upload.buffer_address(g.mm)
        memory.htod(raw.ptr, addr + start, size)
        ptrs: dict[str, int] = {}
        converted: dict[int, DeviceArray] = {}
        held: list[DeviceArray] = [raw]
        for m in adapter.merges:
            for f in (m.a, m.b):
                if f.ggml_type == _F32:
                    ptrs[f.name] = raw.ptr + f.offset
                    continue
                if f.ggml_type == _Q8_0:
                    n = prod(f.ne)
                    one = empty((n,))
                    held.append(one)
                    self._quant_ops.dequant(self._qkern_of(_Q8_0), raw.ptr + f.offset, _Q8_0, n,
                                            one.ptr)
                    ptrs[f.name] = one.ptr
                    continue
                conv = converted.get(f.ggml_type)
                if conv is None:
                    conv = converted[f.ggml_type] = empty((size // 2,))
                    self._quant_ops.dequant(self._qkern_of(f.ggml_type), raw.ptr, f.ggml_type,
                                            size // 2, conv.ptr)
                ptrs[f.name] = conv.ptr + 2 * f.offset
        return ptrs, [*held, *converted.values()]

    def _meta(self, w: Weight):
        """``w.meta`` (the weight's quant_ops.MatPlan), made now for a Weight built elsewhere."""
        m = w.meta
        if m is None or getattr(m, "ggml_type", None) != w.ggml_type:
            from ..cuda import quant_ops

            m = quant_ops.plan(w.ggml_type, w.ne, w.data, w.name)
        return m

    def dequantize(self, w: Weight) -> DeviceArray:
        """The whole weight as float32 ``[ne reversed]`` on the device (``reflex check``); a
        3-D row view expert by expert (its experts lie apart)."""
        shape = tuple(reversed(w.ne))
        out = empty(shape)
        n = prod(w.ne)
        m = self._meta(w)
        parts = [(w.data, out.ptr, n)]
        if len(w.ne) == 3 and n and \
                m.expert_bytes != self._quant_ops.row_bytes(w.ggml_type, w.ne[0]) * w.ne[1]:
            per = w.ne[0] * w.ne[1]
            parts = [(w.data + e * m.expert_bytes, out.ptr + 4 * e * per, per)
                     for e in range(w.ne[2])]
        for src, dst, count in parts:
            if w.ggml_type == _F32:
                memory.dtod(dst, src, 4 * count)
            else:
                self._quant_ops.dequant(self._qkern_of(w.ggml_type), src, w.ggml_type, count,
                                        dst)
        return out

    def _f32_vector(self, w: Weight, n: int) -> int:
        """Device address of ``w`` (ne [n]) as float32 (norm weights are F32 in these files)."""
        if w.ggml_type == _F32 and w.meta is not None and w.meta.n_elements == n:
            return w.data  # the hot path: F32 norm weights
        if prod(w.ne) != n:
            raise ValueError(f"{w.name!r} has {prod(w.ne)} elements, the rows have {n}")
        if w.ggml_type == _F32:
            return w.data
        a = self._f32.get(w.name)
        if a is None:
            a = self._f32[w.name] = self.dequantize(w)
        return a.ptr

    def f32_data(self, w: Weight) -> int:
        return self._f32_vector(w, prod(w.ne))

    # --- state buffers ---------------------------------------------------------------------
    def zeros(self, shape: Sequence[int]) -> DeviceArray:
        out = empty(shape)
        memory.memset(out.ptr, 0, out.nbytes)
        return out

    def empty(self, shape: Sequence[int], dtype: str = "f32") -> DeviceArray:
        if dtype not in ("f32", "i32"):
            raise ValueError(f"empty: dtype {dtype!r} is not f32 or i32")
        return empty(shape, dtype)

    @staticmethod
    def kernels(package: str, module: str) -> Any:
        """Kernel module ``module`` of ``package`` (a plugin's own kernels: its CUDA launchers
        call ``ops.kernels(pkg, mod).launch(...)``)."""
        return modules.get_kernels(module, package)

    def clone(self, x) -> DeviceArray:
        return self._copy(x)

    @staticmethod
    def _row_bytes(x) -> int:
        return x.nbytes // x.shape[0] if x.shape and x.shape[0] else 0

    def copy_rows(self, dst, dst_row: int, src, src_row: int, n_rows: int) -> None:
        rb = self._row_bytes(dst)
        if rb != self._row_bytes(src) or dst.shape[1:] != src.shape[1:]:
            raise ValueError(f"copy_rows: rows of {src.shape[1:]} into rows of {dst.shape[1:]}")
        if not (0 <= dst_row and dst_row + n_rows <= dst.shape[0]
                and 0 <= src_row and src_row + n_rows <= src.shape[0]):
            raise ValueError("copy_rows: rows out of range")
        memory.dtod(dst.ptr + dst_row * rb, src.ptr + src_row * rb, n_rows * rb)

    def rows_to_bytes(self, x, row0: int, n_rows: int) -> bytes:
        rb = self._row_bytes(x)
        return bytes(memory.dtoh(x.ptr + row0 * rb, n_rows * rb))

    def rows_from_bytes(self, x, row0: int, n_rows: int, data: bytes) -> None:
        rb = self._row_bytes(x)
        if len(data) != n_rows * rb or row0 + n_rows > x.shape[0]:
            raise ReflexError(f"state data of {len(data)} bytes does not fill {n_rows} rows of "
                              f"{list(x.shape[1:])}")
        addr, n = upload.buffer_address(data)  # read-only buffers too (a mapped state file)
        memory.htod(x.ptr + row0 * rb, addr, n)

    def prepare(self, batch: Batch) -> Prepared:
        """Token ids, positions and the mask as one int32 buffer, in one host-to-device copy."""
        gp = self._graph_prepared
        if gp is not None and gp[0] is batch:  # a graph's capture: its inputs are in place
            return gp[1]
        buf = self.prepared_words(batch)
        dev = self._prepared_buffer(len(buf))
        memory.htod(dev.ptr, buf)
        return Prepared(batch, dev, len(batch.runs))

    def put_words(self, src_ptr: int, dst_ptr: int, n: int) -> None:
        """``n`` int32 words from ``src_ptr`` (mapped host memory: a chained decode step's
        inputs) to device ``dst_ptr``, as a launch on the current stream."""
        if n > 0:
            self.k.launch("reflex_copy_words", -(-n // 256), 256, (src_ptr, dst_ptr, n))

    def prepared_words(self, batch: Batch) -> array:
        """The int32 words of ``batch``'s Prepared buffer (layout: device_array.Prepared), its
        mask checked against the batch's cells."""
        T = batch.n_tokens
        m = batch.mask
        if len(batch.positions) != T:
            raise ValueError(f"batch has {T} tokens but {len(batch.positions)} positions")
        if not (len(m.prefix_end) == len(m.own_start) == len(m.own_end) == T):
            raise ValueError(f"attention mask covers {len(m.prefix_end)} tokens, batch has {T}")
        n_kv = batch.n_kv
        if T and (min(m.prefix_end) < 0 or max(m.prefix_end) > n_kv or min(m.own_start) < 0
                  or max(m.own_end) > n_kv
                  or any(s > e for s, e in zip(m.own_start, m.own_end))):
            raise ValueError(f"attention mask reaches outside cells [0, {n_kv})")
        buf = array("i", batch.tokens)
        buf.extend(batch.positions)
        buf.extend(m.prefix_end)
        buf.extend(m.own_start)
        buf.extend(m.own_end)
        buf.extend(batch.seq_ids)
        runs = batch.runs
        for r in runs:
            buf.extend(r)
        buf.append(batch.cell0)
        return buf

    def _prepared_buffer(self, n: int) -> DeviceArray:
        """A fresh int32 buffer; while a decode graph is being recorded or replayed
        (cuda_graph.DecodeGraph), the same buffer for every step of its shape."""
        fixed = self._fixed_prepared
        if fixed is not None:
            buf = fixed.get(n)
            if buf is None:
                buf = fixed[n] = empty((n,), "i32")
            return buf
        return empty((n,), "i32")

    # --- tensor ops -------------------------------------------------------------------------
    def shape(self, x) -> tuple[int, ...]:
        return x.shape

    def view(self, x, shape: Sequence[int]):
        shape_t = tuple(shape)
        n = 1
        for v in shape_t:
            if type(v) is not int or v < 0:  # -1, numpy ints: the general path
                return self._view_general(x, shape)
            n *= v
        if n != x.size:
            raise ValueError(f"view: cannot view {x.shape} as {shape_t}")
        return DeviceArray(x.ptr, shape_t, x.owner, x.dtype, n)

    def _view_general(self, x, shape: Sequence[int]):
        shape = [int(s) for s in shape]
        if shape.count(-1) == 1:
            known = prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = x.size // known if known else 0
        shape_t = tuple(shape)
        if prod(shape_t) != x.size or any(s < 0 for s in shape_t):
            raise ValueError(f"view: cannot view {x.shape} as {shape_t}")
        return DeviceArray(x.ptr, shape_t, x.owner, x.dtype)

    @staticmethod
    def _copy(x) -> DeviceArray:
        y = empty(x.shape, x.dtype)
        memory.dtod(y.ptr, x.ptr, x.nbytes)
        return y

    def _rows(self, x) -> tuple[int, int]:
        n = x.shape[-1] if x.shape else 1
        return (x.size // n if n else 0), n

    def embed(self, w: Weight, pb) -> DeviceArray:
        n_embd, n_vocab = w.ne[0], w.ne[1]
        T = pb.n_tokens
        if T and (pb.tok_min < 0 or pb.tok_max >= n_vocab):
            bad = pb.tok_min if pb.tok_min < 0 else pb.tok_max
            raise ReflexError(f"token id {bad} is out of range for {w.name!r} ({n_vocab} rows)")
        if T == 1 and FUSE_NORM:  # one token: deferred, in case an rmsnorm takes it
            blk = Block(4 * n_embd)
            return LazyArray(blk.ptr, (1, n_embd), blk, _PendingEmbed(self, w, pb.tokens), n_embd)
        out = empty((T, n_embd))
        if T:
            self._quant_ops.embed(self._qkern_of(w.ggml_type), w.data, w.ggml_type, pb.tokens,
                                  out.ptr, T, n_embd, n_vocab)
        return out

    def matmul(self, x, w: Weight) -> DeviceArray:
        m = w.meta if w.meta is not None else self._meta(w)
        if m.error is not None:
            raise ValueError(m.error)
        shape = x.shape
        n_in, n_out = m.n_in, m.n_out
        if shape[-1] != n_in:
            raise ValueError(f"matmul: input has {shape[-1]} columns, {w.name!r} expects {n_in}")
        T = x.size // n_in
        if T == 1 and FUSE_NORM and m.fused is not None and n_out:
            # one token: deferred, in case an add_rmsnorm takes it as its branch output
            rn = self._quant_ops.fused_norm_launch(self._qkern(m.module), m, (n_out, 0, 0), False,
                                                   m.gemv_w_ok, x.address, "r",
                                                   w_ptrs=(w.data,))
            if rn is not None:
                blk = Block(4 * n_out)
                return LazyArray(blk.ptr, shape[:-1] + (n_out,), blk,
                                 _PendingGemv(self, m, x, w.data, rn), n_out)
        y = empty_f32(shape[:-1] + (n_out,), T * n_out)
        if T and n_out:
            self._matmul_launch(m, x, T, (w.data, 0, 0), (y.ptr, 0, 0), (n_out, 0, 0), False,
                                m.gemv_w_ok)
        return y

    def _matmul_launch(self, m, x, T: int, w_ptrs: tuple, y_ptrs: tuple,
                       n_outs: tuple, swiglu: bool, gemv_ok: bool) -> None:
        """One matmul launch of up to three weights planned by ``m``: from
        quant_ops.PAIRS_MIN_T tokens as one GEMM on float16 pairs (quant_ops.pairs_bytes), on
        x halves for more than a GEMV's tokens of an XH type, on x limbs for one token of an XQ
        type, else quant_ops' GEMV/tiled choice; an x that a fused
        add_rmsnorm left unscaled (:class:`_NormScale`) by the GEMV's normed form where it has
        one. The scratch goes back to the caching allocator at once: what reuses it runs after
        these launches on the same stream."""
        qo = self._quant_ops
        if T == 1 and type(x) is LazyArray and type(x.pending) is _NormScale and not (
                m.gemvq is not None and gemv_ok and _GEMV_XQ):
            kern = self._qkern(m.module)
            c = qo.fused_norm_launch(kern, m, n_outs, swiglu, gemv_ok, x.address, "n",
                                     w_ptrs=tuple(w for w in w_ptrs if w))
            if c is not None:
                ns = x.pending
                qo.matmul_fused(kern, c, m, x.address, w_ptrs, y_ptrs, n_outs, swiglu, 0, 0, 0,
                                ns.part, ns.n_part, ns.eps)
                return
        x_ptr = x.ptr
        nbytes = qo.pairs_bytes(m, T, n_outs, swiglu) if _PAIRS and x_ptr % 16 == 0 else 0
        if nbytes:
            xp = Block(qo.x_pairs_bytes(T, m.n_in))
            qo.x_pairs(self.k, x_ptr, xp.ptr, T, m.n_in)
            scratch = Block(nbytes)
            qo.matmul_pairs(self._qkern(m.module), self._qkern(qo.COMMON_MODULE), m, xp.ptr, T,
                            w_ptrs, y_ptrs, n_outs, swiglu, scratch.ptr)
            return
        xq = None  # x in the form the chosen kernel reads, in scratch: halves or limbs
        if T > qo.GEMV_MAX_T and m.xh is not None and _XH:
            xq = self._x_halves(x_ptr, T, m.n_in)
        elif T == 1 and m.gemvq is not None and gemv_ok and _GEMV_XQ:
            xq = Block(qo.x_limbs_bytes(m.n_in))
            qo.x_limbs(self.k, x_ptr, xq.ptr, m.n_in)
        qo.matmul_planned(self._qkern(m.module), m, x_ptr, T, w_ptrs, y_ptrs, n_outs, swiglu,
                          gemv_ok, 0 if xq is None else xq.ptr)

    def _x_halves(self, x_ptr: int, rows: int, n_in: int) -> Block:
        """x [rows, n_in] as its halves (quant_ops.x_halves), in scratch as _matmul_launch's."""
        halves = Block(self._quant_ops.x_halves_bytes(rows, n_in))
        self._quant_ops.x_halves(self.k, x_ptr, halves.ptr, rows, n_in)
        return halves

    def matmul_many(self, x, ws: Sequence[Weight]) -> list:
        """Weights of the same GGML type go in one launch (up to three: q/k/v), and one token's
        q/k/v on a fused norm's output whose v is another K-quant too (quant_ops.mixed_norm_launch).
        Each output has the bits of its weight's own matmul, except that the launch's rows choose
        a one-token GEMV's form: a v narrower than the wide GEMVs take alone (fewer than
        quant_ops.GEMV_WIDE_MIN_ROWS rows) is read by the wide form beside q and k. The outputs
        share one allocation (256-byte aligned offsets)."""
        shape = x.shape
        lead, n_in = shape[:-1], shape[-1]
        T = x.size // n_in if n_in else 0
        metas = []
        offs = []
        total = 0
        t0 = ws[0].ggml_type if ws else 0
        one_type = True
        gemv_ok = True
        for w in ws:
            m = w.meta if w.meta is not None else self._meta(w)
            if m.error is not None:
                raise ValueError(m.error)
            if m.n_in != n_in:
                raise ValueError(f"matmul: input has {n_in} columns, {w.name!r} expects {m.n_in}")
            metas.append(m)
            offs.append(total)
            total += (4 * T * m.n_out + 255) & ~255
            one_type = one_type and w.ggml_type == t0
            gemv_ok = gemv_ok and m.gemv_w_ok
        blk = Block(total or 4)
        base = blk.ptr
        outs = [DeviceArray(base + o, lead + (m.n_out,), blk, "f32", T * m.n_out)
                for o, m in zip(offs, metas)]
        if T == 0 or not ws:
            return outs
        n = len(ws)
        if one_type and n <= 3:  # q/k/v of one type (so of one module): one launch
            pad = (0,) * (3 - n)
            self._matmul_launch(metas[0], x, T, tuple(w.data for w in ws) + pad,
                                tuple(y.ptr for y in outs) + pad,
                                tuple(m.n_out for m in metas) + pad, False, gemv_ok)
            return outs
        if (n == 3 and T == 1 and ws[0].ggml_type == ws[1].ggml_type and type(x) is LazyArray
                and type(x.pending) is _NormScale):
            # q and k of one K-quant and v of another (Q6_K) on a fused norm's output: one launch
            # where q and k take gemv1xn
            qo = self._quant_ops
            kern = self._qkern(metas[0].module)
            n_outs = tuple(m.n_out for m in metas)
            c = qo.mixed_norm_launch(kern, metas[0], metas[2], n_outs,
                                     metas[0].gemv_w_ok and metas[1].gemv_w_ok,
                                     metas[2].gemv_w_ok, x.address)
            if c is not None:
                ns = x.pending
                qo.matmul_mixed(kern, c, metas[0], metas[2], x.address,
                                tuple(w.data for w in ws), tuple(y.ptr for y in outs), n_outs,
                                ns.part, ns.n_part, ns.eps)
                return outs
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(ws):
            groups.setdefault(w.ggml_type, []).append(i)
        for idx in groups.values():  # one launch per type and 3 weights
            for c in range(0, len(idx), 3):
                run = idx[c:c + 3]
                pad = (0,) * (3 - len(run))
                self._matmul_launch(metas[run[0]], x, T, tuple(ws[k].data for k in run) + pad,
                                    tuple(outs[k].ptr for k in run) + pad,
                                    tuple(metas[k].n_out for k in run) + pad, False,
                                    all(metas[k].gemv_w_ok for k in run))
        return outs

    def matmul_swiglu(self, x, gate: Weight, up: Weight) -> DeviceArray:
        """One launch when gate and up share a GGML type (bit-identical to matmul, matmul,
        swiglu); otherwise those three ops."""
        mg = gate.meta if gate.meta is not None else self._meta(gate)
        mu = up.meta if up.meta is not None else self._meta(up)
        if (gate.ggml_type != up.ggml_type or mg.error is not None or mu.error is not None
                or mg.n_in != mu.n_in or mg.n_out != mu.n_out):
            return self.swiglu(self.matmul(x, gate), self.matmul(x, up))
        shape = x.shape
        n_in, n_out = mg.n_in, mg.n_out
        if shape[-1] != n_in:
            raise ValueError(f"matmul: input has {shape[-1]} columns, {gate.name!r} expects "
                             f"{n_in}")
        T = x.size // n_in
        y = empty_f32(shape[:-1] + (n_out,), T * n_out)
        if T and n_out:
            self._matmul_launch(mg, x, T, (gate.data, up.data, 0), (y.ptr, 0, 0),
                                (n_out, 0, 0), True, mg.gemv_w_ok and mu.gemv_w_ok)
        return y

    def rmsnorm(self, x, w: Weight | None, eps: float) -> DeviceArray:
        shape = x.shape
        n = shape[-1] if shape else 1
        rows = x.size // n if n else 0
        wp = 0 if w is None else self._f32_vector(w, n)
        if rows == 1 and type(x) is LazyArray and type(x.pending) is _PendingEmbed:
            pe, x.pending = x.pending, None
            n_part = self._quant_ops.embed_blocks(pe.w.ggml_type, n)
            off = (4 * n + 255) & ~255  # y, then the block sums
            blk = Block(off + 4 * n_part)
            pe.launch(x.address, (wp, blk.ptr, blk.ptr + off))
            return LazyArray(blk.ptr, shape, blk,
                             _NormScale(self.k, blk.ptr + off, n_part, n, eps), n)
        y = empty_f32(shape, x.size)
        if rows:
            self.k.launch("reflex_rmsnorm", rows, 1024 if n >= 4096 else 256,
                          (x.ptr, wp, y.ptr, n, eps))
        return y

    def add_rmsnorm(self, a, b, w: Weight | None, eps: float) -> tuple[DeviceArray, DeviceArray]:
        shape = a.shape
        if shape != b.shape:
            raise ValueError(f"add_rmsnorm: shapes {shape} and {b.shape} differ")
        n = shape[-1] if shape else 1
        size = a.size
        rows = size // n if n else 0
        wp = 0 if w is None else self._f32_vector(w, n)
        if rows == 1 and type(b) is LazyArray:
            if type(b.pending) is _PendingGemv:
                return self._add_rmsnorm_fused(a, b.pending, wp, n, eps)
            if type(b.pending) is _PendingCombine:
                return self._combine_resnorm(a, b.pending, wp, n, eps)
        # s and y from one allocation (s at a 256-byte aligned offset after y)
        off = (4 * size + 255) & ~255
        blk = Block(2 * off or 4)
        y = DeviceArray(blk.ptr, shape, blk, "f32", size)
        s = DeviceArray(blk.ptr + off, shape, blk, "f32", size)
        if rows:
            self.k.launch("reflex_add_rmsnorm", rows, 1024 if n >= 4096 else 256,
                          (a.ptr, b.ptr, wp, s.ptr, y.ptr, n, eps))
        return s, y

    def _add_rmsnorm_fused(self, a, pg: _PendingGemv, wp: int, n: int,
                           eps: float) -> tuple[DeviceArray, LazyArray]:
        """add_rmsnorm of one row whose branch output is a deferred GEMV: its residual-step
        form writes s = a + W x and y = s * w with the block sums of s^2; y's scale is left to
        its readers (:class:`_NormScale`). The deferred product itself stays available."""
        m = pg.m
        n_part = self._quant_ops.resnorm_parts(pg.resnorm, n)
        s, y, part = self._resnorm_outputs(a.shape, n, n_part, eps)
        self._quant_ops.matmul_fused(self._qkern(m.module), pg.resnorm, m, pg.x.ptr,
                                     (pg.w_ptr, 0, 0), (y.address, 0, 0), (n, 0, 0), False, a.ptr,
                                     wp, s.ptr, part, n_part, 0.0)
        return s, y

    def _combine_resnorm(self, a, pc: _PendingCombine, wp: int, n: int,
                         eps: float) -> tuple[DeviceArray, LazyArray]:
        """add_rmsnorm of one row whose branch output is a deferred moe_combine: s = a + the
        weighted sum and y = s * w with the block sums of s^2 in one launch; y's scale is left
        to its readers (:class:`_NormScale`). The deferred sum itself stays available."""
        n_part = (n + 255) // 256
        s, y, part = self._resnorm_outputs(a.shape, n, n_part, eps)
        self.k.launch("reflex_moe_combine_resnorm", n_part, 256,
                      (pc.y.ptr, pc.weights.ptr, a.ptr, wp, s.ptr, y.address, part,
                       pc.y.shape[1], n))
        return s, y

    def _resnorm_outputs(self, shape: tuple, n: int, n_part: int,
                         eps: float) -> tuple[DeviceArray, LazyArray, int]:
        """The outputs of a one-row residual step, in one allocation: s (the new residual), y
        (its h * w, the scale left to its readers: :class:`_NormScale`) and the address of the
        ``n_part`` block sums of h^2 that the step's launch writes."""
        off = (4 * n + 255) & ~255
        blk = Block(2 * off + 4 * n_part)
        y, s, part = blk.ptr, blk.ptr + off, blk.ptr + 2 * off
        return (DeviceArray(s, shape, blk, "f32", n),
                LazyArray(y, shape, blk, _NormScale(self.k, part, n_part, n, eps), n), part)

    def _rope_args(self, p: RopeParams) -> tuple:
        """(n_rot, neox, freq_base, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi) of
        ``p``, checked; cached for the last RopeParams object (every layer passes the same)."""
        if p is self._rope_p:
            return self._rope_a
        if p.n_rot % 2:
            raise ValueError(f"rope: n_rot {p.n_rot} must be even")
        if p.mode not in ("neox", "norm"):
            raise ValueError(f"rope: unknown mode {p.mode!r}")
        lo, hi = p.corr_dims() if p.ext_factor != 0.0 else (0.0, 0.0)
        a = (p.n_rot, 1 if p.mode == "neox" else 0, float(p.freq_base), float(p.freq_scale),
             float(p.ext_factor), float(p.attn_factor), float(lo), float(hi))
        self._rope_p, self._rope_a = p, a
        return a

    def rope(self, x, pb, p: RopeParams) -> DeviceArray:
        T, H, d = x.shape
        n = p.n_rot
        if n > d or n % 2:
            raise ValueError(f"rope: n_rot {n} must be even and <= head size {d}")
        if T != pb.n_tokens:
            raise ValueError(f"rope: {T} rows but {pb.n_tokens} positions")
        n_rot, neox, fb, fs, ext, af, lo, hi = self._rope_args(p)
        y = empty_f32(x.shape, x.size)
        if T and H:
            self.k.launch("reflex_rope", (H, T), 64 if n <= 128 else 128,
                          (x.ptr, y.ptr, pb.positions, H, d, n_rot, neox, fb, fs, ext, af, lo,
                           hi))
        return y

    @staticmethod
    def _check_cells(k_cache, v_cache, pb) -> tuple[int, int, int]:
        """(H_kv, d_k, d_v) of a K/V cache pair, checked against the batch's cells."""
        n_cells, Hkv, dk = k_cache.shape
        if v_cache.shape[:2] != (n_cells, Hkv):
            raise ValueError(f"K cache {k_cache.shape} and V cache {v_cache.shape} differ")
        c0, T = pb.cell0, pb.n_tokens
        if c0 + T > n_cells:
            raise ReflexError(f"KV cache full: cells [{c0}, {c0 + T}) requested, "
                              f"{n_cells} allocated")
        return Hkv, dk, v_cache.shape[2]

    def kv_write(self, k_cache, v_cache, k, v, pb) -> None:
        T = pb.n_tokens
        c0 = pb.cell0
        Hkv, dk, dv = self._check_cells(k_cache, v_cache, pb)
        rk = Hkv * dk
        rv = Hkv * dv
        nk, nv = T * rk, T * rv
        if k.size != nk or v.size != nv:
            raise ValueError(f"kv_write: k {k.shape} / v {v.shape} do not match {T} tokens of "
                             f"{Hkv} heads x {dk}/{dv}")
        n = max(nk, nv)
        if n:
            self.k.launch("reflex_kv_write", min(4096, (n + 255) // 256), 256,
                          (k.ptr, v.ptr, k_cache.ptr + 4 * c0 * rk,
                           v_cache.ptr + 4 * c0 * rv, nk, nv))

    def _prologue_args(self, op: str, q, k, v, q_norm: Weight | None, k_norm: Weight | None,
                       pb, rope: RopeParams, k_cache, v_cache) -> tuple:
        """The checks and arguments of the attention prologue (``op``: the op whose error it
        is): (H_kv, d_v, :meth:`_rope_args`, q_norm's and k_norm's device vectors or 0)."""
        T, H, dk = q.shape
        Hkv, cdk, dv = self._check_cells(k_cache, v_cache, pb)
        if k.shape != (T, Hkv, dk) or v.shape != (T, Hkv, dv) or dk != cdk:
            raise ValueError(f"{op}: q {q.shape}, k {k.shape}, v {v.shape} do not "
                             f"match a cache of {Hkv} heads x {cdk}/{dv}")
        if T != pb.n_tokens:
            raise ValueError(f"{op}: {T} rows but {pb.n_tokens} positions")
        if dk > limit("QKR_MAX_HEAD"):
            raise ReflexError(f"{op}: head size {dk} > {limit('QKR_MAX_HEAD')} is "
                              "not supported by the CUDA kernel")
        ra = self._rope_args(rope)
        if ra[0] > dk:
            raise ValueError(f"rope: n_rot {ra[0]} must be even and <= head size {dk}")
        qn = 0 if q_norm is None else self._f32_vector(q_norm, dk)
        kn = 0 if k_norm is None else self._f32_vector(k_norm, dk)
        return Hkv, dv, ra, qn, kn

    def qk_norm_rope_store(self, q, k, v, q_norm: Weight | None, k_norm: Weight | None,
                           eps: float, pb, rope: RopeParams, k_cache, v_cache):
        """One launch: per-head norms, RoPE of q and k, K/V into the cache (reflex_rmsnorm /
        reflex_rope / reflex_kv_write arithmetic; bit-identical for head sizes <= 256)."""
        T, H, dk = q.shape
        Hkv, dv, (n_rot, neox, fb, fs, ext, af, lo, hi), qn, kn = self._prologue_args(
            "qk_norm_rope_store", q, k, v, q_norm, k_norm, pb, rope, k_cache, v_cache)
        out = empty_f32(q.shape, q.size)
        if T:
            kernel, per_block, threads = qkr_kernel(T, dk)
            self.k.launch(kernel, (-(-(H + Hkv) // per_block), T), threads,
                          (q.ptr, k.ptr, v.ptr, qn, kn, out.ptr, k_cache.ptr, v_cache.ptr,
                           pb.cell0_dev, pb.positions, H, Hkv, dk, dv,
                           0 if q_norm is None else 1, 0 if k_norm is None else 1, n_rot, neox,
                           eps, fb, fs, ext, af, lo, hi))
        return out

    def rope_attention(self, q, k, v, q_norm: Weight | None, k_norm: Weight | None, eps: float,
                       pb, rope: RopeParams, k_cache, v_cache, scale: float) -> DeviceArray:
        """With ROPE_ATT, a decode step's batch (ROPE_ATT_MAX_T tokens or fewer, head sizes a
        multiple of 4 up to 256, 16-byte aligned rows) in one launch,
        reflex_rope_attention_vec128/256: the arithmetic of qk_norm_rope_store then attention;
        anything else runs those two."""
        T, H, dk = q.shape
        n_cells, Hkv, _ = k_cache.shape
        dv = v_cache.shape[2]
        if (not ROPE_ATT or not 0 < T <= ROPE_ATT_MAX_T or dk % 4 or dv % 4 or max(dk, dv) > 256
                or H % Hkv or any(a.ptr % 16 for a in (q, k, v, k_cache, v_cache))):
            q = self.qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, pb, rope, k_cache, v_cache)
            return self._attention(q, k_cache, v_cache, pb, scale, batch_cells=True)
        Hkv, dv, (n_rot, neox, fb, fs, ext, af, lo, hi), qn, kn = self._prologue_args(
            "rope_attention", q, k, v, q_norm, k_norm, pb, rope, k_cache, v_cache)
        if pb.n_kv > n_cells:
            raise ReflexError(f"attention over {pb.n_kv} cells, the cache has {n_cells}")
        out = empty_f32((T, H * dv), T * H * dv)
        S = attention_splits(T, H, n_cells)
        part = empty_f32((T, H, S, 2 + dv), T * H * S * (2 + dv)) if S > 1 else None
        self.k.launch("reflex_rope_attention_vec128" if max(dk, dv) <= 128
                      else "reflex_rope_attention_vec256", (H, T, S), 256,
                      (q.ptr, k.ptr, v.ptr, qn, kn, k_cache.ptr, v_cache.ptr, out.ptr,
                       part.ptr if part else 0, self._att_counters() if part else 0,
                       pb.cell0_dev, pb.positions, pb.prefix_end, pb.own_start, pb.own_end, H,
                       Hkv, dk, dv, 0 if q_norm is None else 1, 0 if k_norm is None else 1,
                       n_rot, neox, eps, scale, fb, fs, ext, af, lo, hi))
        return out

    def attention(self, q, k_cache, v_cache, pb, scale: float) -> DeviceArray:
        return self._attention(q, k_cache, v_cache, pb, scale)

    def _attention(self, q, k_cache, v_cache, pb, scale: float,
                   batch_cells: bool = False) -> DeviceArray:
        """:meth:`attention`. ``batch_cells``: the launches just ahead of this one write no cells
        of the caches but the batch's (``pb.cell0`` on), so the decode kernel may read the
        others' first rows before its programmatic wait."""
        T, H, dk = q.shape
        n_cells, Hkv, cdk = k_cache.shape
        dv = v_cache.shape[2]
        if H % Hkv:
            raise ValueError(f"attention: {H} query heads are not a multiple of {Hkv} KV heads")
        if dk != cdk:
            raise ValueError(f"attention: q head size {dk}, cache has {cdk}")
        if max(dk, dv) > limit("ATT_MAX_HEAD"):
            raise ReflexError(f"attention: head size {max(dk, dv)} > {limit('ATT_MAX_HEAD')} is "
                              "not supported by the CUDA kernels")
        if pb.n_kv > n_cells:
            raise ReflexError(f"attention over {pb.n_kv} cells, the cache has {n_cells}")
        if self._att_done is None and attention_splits(1, H, n_cells) > 1:
            # made by the prefill, so that a decode graph's first (traced) step allocates nothing
            # that the captured one would not: else the first capture is dropped
            self._att_counters()
        out = empty_f32((T, H * dv), T * H * dv)
        if T and H:
            ptrs = (q.ptr, k_cache.ptr, v_cache.ptr, out.ptr)
            args = ptrs + (pb.prefix_end, pb.own_start, pb.own_end, T, H, Hkv, dk, dv, scale)
            mma = _attention_mma_kernel(T, dk, dv, *ptrs) if ATT_MMA else None
            if mma and self.k.allow_shmem(mma[0], mma[3]):
                kernel, per_block, threads, smem, dmax = mma
                n = pb.n_kv
                halves = Block(2 * 2 * 2 * n * Hkv * dmax)  # K and V, hi and lo, 16 bits
                kh, vh = halves.ptr, halves.ptr + 2 * 2 * n * Hkv * dmax
                self.k.launch("reflex_kv_halves", (min(-(-n * Hkv * dmax // 512), 4096),), 256,
                              (k_cache.ptr, v_cache.ptr, kh, vh, n, Hkv, dk, dv, dmax))
                self.k.launch(kernel, (H, -(-T // per_block)), threads,
                              (q.ptr, kh, vh) + args[3:], smem)
                return out
            tiled = _attention_tiled_kernel(T, dk, dv, *ptrs)
            if tiled:
                kernel, per_block = tiled
                self.k.launch(kernel, (H, -(-T // per_block)), 256, args)
                return out
            S = attention_splits(T, H, n_cells)
            part = empty_f32((T, H, S, 2 + dv), T * H * S * (2 + dv)) if S > 1 else None
            kernel = _attention_kernel(dk, dv, q.ptr, k_cache.ptr, v_cache.ptr, out.ptr)
            cells = (() if kernel == "reflex_attention"
                     else (pb.cell0_dev if batch_cells and ATT_PRE else 0,))
            self.k.launch(kernel, (H, T, S), 256,
                          (q.ptr, k_cache.ptr, v_cache.ptr, out.ptr, part.ptr if part else 0,
                           self._att_counters() if part else 0, pb.prefix_end, pb.own_start,
                           pb.own_end) + cells + (H, Hkv, dk, dv, scale))
        return out

    def _att_counters(self) -> int:
        """The split attention's counters (ATT_COUNTERS int32, zero between launches: the last
        slice of each (token, head) sets its count back), made once, before any decode graph is
        captured: by the first attention over a cache that a decode step would split (the
        prompt's, as a rule), else by the first eager step of a DecodeGraph."""
        if self._att_done is None:
            self._att_done = Block(4 * ATT_COUNTERS)
            memory.memset(self._att_done.ptr, 0, 4 * ATT_COUNTERS)
        return self._att_done.ptr

    def _elementwise(self, kernel: str, a, b) -> DeviceArray:
        if a.shape != b.shape:
            raise ValueError(f"{kernel[7:]}: shapes {a.shape} and {b.shape} differ")
        n = a.size
        y = empty_f32(a.shape, n)
        if n:
            self.k.launch(kernel, (n + 255) // 256, 256, (a.ptr, b.ptr, y.ptr, n))
        return y

    def swiglu(self, gate, up) -> DeviceArray:
        return self._elementwise("reflex_swiglu", gate, up)

    def add(self, a, b) -> DeviceArray:
        return self._elementwise("reflex_add", a, b)

    def add_bias(self, x, b: Weight, offset: int = 0) -> DeviceArray:
        n_rows, n = self._rows(x)
        if len(x.shape) != 2 or not 0 <= offset <= prod(b.ne) - n:
            raise ValueError(f"add_bias: input {x.shape} from element {offset} of {b.name!r}, "
                             f"which has {prod(b.ne)}")
        y = empty_f32(x.shape, n_rows * n)
        if n_rows * n:
            self.k.launch("reflex_add_bias", (n_rows * n + 255) // 256, 256,
                          (x.ptr, self.f32_data(b) + 4 * offset, y.ptr, n, n_rows * n))
        return y

    def take_rows(self, x, rows: Sequence[int]) -> DeviceArray:
        rows = [int(r) for r in rows]
        R = len(rows)
        n_rows, n = self._rows(x)
        if R and (min(rows) < 0 or max(rows) >= n_rows):
            raise ValueError(f"take_rows: rows {rows} outside [0, {n_rows})")
        if R == 0:
            return empty((0, n))
        r0 = rows[0]
        if r0 == 0 and R == n_rows and x.shape == (R, n):  # all of x: x itself (an x whose
            return x                                          # norm scale is pending keeps it)
        if rows == list(range(r0, r0 + R)):  # a contiguous run: a view, no copy
            return DeviceArray(x.ptr + 4 * r0 * n, (R, n), x.owner, x.dtype)
        idx = empty((R,), "i32")
        memory.htod(idx.ptr, array("i", rows))
        y = empty((R, n))
        self.k.launch("reflex_take_rows", ((n + 255) // 256, R), 256,
                      (x.ptr, idx.ptr, y.ptr, n))
        return y

    # --- MoE --------------------------------------------------------------------------------
    def moe_route(self, logits, k: int, gating: str = "softmax", norm: bool = True,
                  scale: float = 0.0, bias: Weight | None = None,
                  groups: tuple[int, int] = (0, 0)):
        T, E = logits.shape
        G, used = moe_route_groups(E, k, groups)
        g = _GATING.get(gating)
        if g is None:
            raise ValueError(f"moe_route: unknown gating {gating!r}")
        if bias is not None and prod(bias.ne) != E:
            raise ValueError(f"moe_route: bias {bias.name!r} has {prod(bias.ne)} values, not {E}")
        if E > limit("MOE_MAX_E") or k > limit("MOE_MAX_K"):
            raise ReflexError(f"moe_route: {E} experts / top-{k} exceeds the CUDA kernel's "
                              f"{limit('MOE_MAX_E')} / {limit('MOE_MAX_K')}")
        bias_ptr = 0 if bias is None else self.f32_data(bias)  # 0: the kernel adds no bias
        ids = empty((T, k), "i32")
        w = empty((T, k))
        if T:
            self.k.launch("reflex_moe_route", T, 256,
                          (logits.ptr, bias_ptr, ids.ptr, w.ptr, E, k, g, 1 if norm else 0, scale,
                           G, used))
        return ids, w

    def moe_matmul(self, x, w: Weight, ids) -> DeviceArray:
        return self._moe_matmul(x, w, None, ids)

    def moe_matmul_swiglu(self, x, gate: Weight, up: Weight, ids) -> DeviceArray:
        """One launch when gate and up share type and shape (else the three ops)."""
        if gate.ggml_type != up.ggml_type or tuple(gate.ne) != tuple(up.ne) or \
                self._meta(gate).expert_bytes != self._meta(up).expert_bytes:
            return self.swiglu(self.moe_matmul(x, gate, ids), self.moe_matmul(x, up, ids))
        return self._moe_matmul(x, gate, up, ids)

    def _moe_matmul(self, x, w: Weight, up: Weight | None, ids) -> DeviceArray:
        if len(w.ne) != 3:
            raise ValueError(f"moe_matmul: {w.name!r} is not a 3-D expert tensor")
        n_in, n_out, E = w.ne
        T, k = ids.shape
        per_expert = x.ndim == 3
        want = (T, k, n_in) if per_expert else (T, n_in)
        if x.shape != want:
            raise ValueError(f"moe_matmul: input shape {x.shape}, expected {list(want)}")
        y = empty_f32((T, k, n_out), T * k * n_out)
        q = self._quant_ops
        kern = self._qkern_of(w.ggml_type)  # up (if any) is of w's type: the same module
        norm = None
        if T == 1 and type(x) is LazyArray and type(x.pending) is _NormScale \
                and x.address % 16 == 0 and q.moe_normed_ok(kern, w.ggml_type, n_in):
            # x a fused add_rmsnorm's output: the experts' GEMV applies its scale (as the dense
            # GEMVs' normed forms), so no reflex_norm_apply
            ns = x.pending
            norm, x_ptr = (ns.part, ns.n_part, ns.eps), x.address
        else:
            if x.ptr % 16:  # a row view of another array: the MoE kernels need 16-byte alignment
                x = self._copy(x)
            x_ptr = x.ptr
        if T and k and q.moe_tiled_ok(T, k, E):  # long prompts: the slots grouped by expert
            order = empty((T * k,), "i32")
            tiles = empty((3 * q.moe_max_tiles(T * k, E),), "i32")
            n_tiles = empty((1,), "i32")
            halves = None
            if w.ggml_type in q.XH_TYPES and _XH:  # the expert tiles on x halves
                halves = self._x_halves(x_ptr, T * k if per_expert else T, n_in)
            q.moe_matmul_grouped(kern, self.k, w.data, w.ggml_type, x_ptr, ids.ptr, y.ptr, T, k,
                                 n_in, n_out, E, order.ptr, tiles.ptr, n_tiles.ptr, per_expert,
                                 up_ptr=0 if up is None else up.data,
                                 xh_ptr=0 if halves is None else halves.ptr,
                                 expert_bytes=self._meta(w).expert_bytes)
        elif T and k:
            q.moe_matmul(kern, w.data, w.ggml_type, x_ptr, ids.ptr, y.ptr, T, k, n_in, n_out, E,
                         per_expert, up_ptr=0 if up is None else up.data, norm=norm,
                         expert_bytes=self._meta(w).expert_bytes)
        return y

    def moe_combine(self, y, weights) -> DeviceArray:
        T, k, n = y.shape
        if weights.shape != (T, k):
            raise ValueError(f"moe_combine: weights {weights.shape}, expected [{T}, {k}]")
        if T == 1 and FUSE_NORM and n:
            # one token: deferred, in case an add_rmsnorm takes it as its branch output
            blk = Block(4 * n)
            return LazyArray(blk.ptr, (1, n), blk, _PendingCombine(self.k, y, weights), n)
        out = empty((T, n))
        if T and n:
            _combine_launch(self.k, y, weights, out.ptr)
        return out

    # --- results to the host ----------------------------------------------------------------
    def argmax(self, logits) -> list[int]:
        rows, n = self._rows(logits)
        if rows == 0:
            return []
        out = empty((rows,), "i32")
        if rows == 1:
            self._argmax_row(logits.ptr, out.ptr, n)
        else:
            self.k.launch("reflex_argmax", rows, 1024, (logits.ptr, out.ptr, n, 0))
        return list(struct.unpack(f"<{rows}i", memory.dtoh(out.ptr, 4 * rows)))

    def _argmax_row(self, row: int, out_ptr: int, n: int, host_ptr: int = 0) -> None:
        """The first index of one row's maximum into device ``out_ptr`` (and mapped host
        ``host_ptr`` unless 0): over many blocks where the row has many (the last block merges
        their pairs in a scratch made at the first such call; the pick runs after a decode
        graph's replay, never inside a capture), else one block."""
        blocks = -(-n // limit("ARGMAX_SPLIT_CHUNK"))
        if blocks < 2 or blocks > ARGMAX_SPLIT_MAX_BLOCKS:
            self.k.launch("reflex_argmax", 1, 1024, (row, out_ptr, n, host_ptr))
            return
        if self._argmax_part is None:
            # [0]: the blocks' count (back to 0 after each launch); from 16: the pairs
            self._argmax_part = Block(16 + 8 * ARGMAX_SPLIT_MAX_BLOCKS)
            memory.memset(self._argmax_part.ptr, 0, 16)
        p = self._argmax_part.ptr
        self.k.launch("reflex_argmax_split", blocks, 256, (row, out_ptr, n, p + 16, p, host_ptr))

    def sample(self, logits, temperature: float, top_k: int, top_p: float, u: float,
               min_p: float = 0.0) -> int:
        out = empty((1,), "i32")
        scratch = None if temperature <= 0.0 else empty((self._rows(logits)[1],), "f64")
        self.sample_into(logits, out.ptr, temperature, top_k, top_p, u, min_p, scratch)
        return struct.unpack("<i", memory.dtoh(out.ptr, 4))[0]

    def sample_into(self, logits, out_ptr: int, temperature: float, top_k: int, top_p: float,
                    u: float, min_p: float, scratch, host_ptr: int = 0) -> None:
        """:meth:`sample`'s pick of the last row launched, its id written to device ``out_ptr``
        (int32) and not copied back; also to ``host_ptr`` unless 0 (mapped host memory: the
        host reads it once the launch has run). ``scratch``: float64 [V] for a draw
        (temperature > 0), held by the caller until the launch has run."""
        rows, V = self._rows(logits)
        if rows == 0:
            raise ValueError("sample: empty logits")
        row = logits.ptr + 4 * (rows - 1) * V
        if temperature <= 0.0:
            self._argmax_row(row, out_ptr, V, host_ptr)
            return
        if scratch is None or scratch.size < V:
            raise ValueError(f"sample: a draw needs a float64 scratch of {V} values")
        self.k.launch("reflex_sample", 1, 512,
                      (row, V, float(temperature), int(top_k), float(top_p),
                       sampling.min_p_log(float(min_p)), float(u), scratch.ptr, out_ptr,
                       host_ptr))

    def repeat_penalty(self, logits, token_ids: Sequence[int], penalty: float) -> None:
        rows, V = self._rows(logits)
        ids = sorted({int(t) for t in token_ids})  # distinct: one thread per logit
        if rows == 0 or not ids:
            return
        if ids[0] < 0 or ids[-1] >= V:
            raise ValueError(f"repeat_penalty: token id outside [0, {V})")
        dev = empty((len(ids),), "i32")
        memory.htod(dev.ptr, array("i", ids))
        self.k.launch("reflex_repeat_penalty", (len(ids) + 255) // 256, 256,
                      (logits.ptr + 4 * (rows - 1) * V, dev.ptr, len(ids), float(penalty)))

    def token_logprobs(self, logits, targets: Sequence[int]) -> list[float]:
        rows, V = self._rows(logits)
        targets = [int(t) for t in targets]
        if rows != len(targets):
            raise ValueError(f"token_logprobs: {rows} rows, {len(targets)} targets")
        if rows == 0:
            return []
        if min(targets) < 0 or max(targets) >= V:
            raise ValueError(f"token_logprobs: target outside [0, {V})")
        tg = empty((rows,), "i32")
        memory.htod(tg.ptr, array("i", targets))
        out = empty((rows,), "f64")
        self.k.launch("reflex_token_logprobs", rows, 1024, (logits.ptr, tg.ptr, out.ptr, V))
        return list(struct.unpack(f"<{rows}d", memory.dtoh(out.ptr, 8 * rows)))

    def to_numpy(self, x):
        import numpy as np

        out = np.empty(x.shape, {"f32": np.float32, "i32": np.int32, "f64": np.float64}[x.dtype])
        if out.nbytes:
            memory.dtoh(x.ptr, x.nbytes, out.ctypes.data)  # straight into the array: one copy
        return out

    def from_numpy(self, a) -> DeviceArray:
        """Upload a NumPy array: integers as int32, anything else as float32 (tests, ``check``)."""
        import numpy as np

        a = np.asarray(a)
        kind = "i32" if a.dtype.kind in "iub" else "f32"
        a = np.ascontiguousarray(a, dtype=np.int32 if kind == "i32" else np.float32)
        out = empty(a.shape, kind)
        if a.size:
            memory.htod(out.ptr, a.tobytes())
        return out

    def synchronize(self) -> None:
        driver.synchronize()
