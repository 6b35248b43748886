"""Launchers for the weight-side kernels (``cuda/include/reflex/quant_kernels.cuh``).

Weights stay in their GGUF block layout on the device (the raw tensor bytes, uploaded as they
are in the file); these kernels decode them on the fly. Every launcher takes ``kern`` (the loaded
module that serves the weight's type: ``modules.get_kernels(module_of(ggml_type))``, a
:class:`MatPlan`'s ``module``), device pointers as ints, and sizes. Launches go to the default
stream; nothing here synchronizes or allocates. No numpy (cold path). Each kernel's parameter
signature comes from the package's manifest (``Kernels.launch``).

Two modules serve the types (:data:`MODULES`): ``quant`` (``cuda/quant.cu``: F32, F16, BF16,
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), which the CUDA start loads with the core, and
``quant_lowbit`` (``cuda/quant_lowbit.cu``: Q2_K, Q3_K, the IQ codebook types, TQ1_0, TQ2_0,
MXFP4), about twice its image, which no start loads (``modules.ON_DEMAND``): the CUDA backend
loads it when it attaches a file with one of its types (:func:`modules_for`). A launch combines
weights of one GGML type only, hence of one module.

Types: :data:`SUPPORTED_TYPES` (GGML ids). Anything else raises
:class:`~reflex_core.errors.UnsupportedTensorType`.

Pointer requirements (the backend's buffers from ``memory.alloc`` are 256-byte aligned, and GGUF
tensor data offsets are multiples of the file alignment, 32 by default, so uploading the data
section as one buffer keeps every tensor 32-byte aligned):

* activations (``x``, ``y``, ``out``) 16-byte aligned -- required by the GEMV path; the tiled
  path accepts any 4-byte aligned pointer;
* weights: for the GEMV path 16-byte aligned for Q4_K / Q5_K / F32 / F16 / BF16 (128-bit
  loads), 8-byte for IQ4_XS (its 136-byte blocks keep no more: 64-bit loads), none for Q2_K and
  MXFP4 (word loads from any address; MXFP4's 17-byte blocks keep no alignment at all), 2-byte
  for the others (f16 fields). :func:`matmul_planned` falls back to the (slower for small T)
  tiled kernel when a GEMV requirement does not hold; :func:`moe_matmul` raises ValueError
  instead.

The CUDA backend plans each weight once (:class:`MatPlan`, kept in ``Weight.meta``) and launches
through :func:`matmul_planned`: up to three weights of one type against the same input in one
launch (q/k/v), or gate/up with the SwiGLU product as the output; :func:`moe_matmul` with
``up_ptr`` does the same for expert tensors.
"""

from __future__ import annotations

import os

from ..errors import UnsupportedTensorType
from ..gguf import GGML_TYPES

COMMON_MODULE = "quant"  # loaded at the CUDA start
LOWBIT_MODULE = "quant_lowbit"  # loaded only for a file that has one of its types
MODULES = (COMMON_MODULE, LOWBIT_MODULE)

# The kernel-specific columns of each supported GGML type id: (kernel suffix, weight alignment
# the GEMV lane units need: rx_lu<T>::ALIGN in cuda/include/reflex/quants*.cuh, the module that
# holds its kernels). Names, block sizes and bytes per block come from gguf.GGML_TYPES.
_KERNEL_TYPES: dict[int, tuple[str, int, str]] = {
    0: ("f32", 16, COMMON_MODULE),
    1: ("f16", 16, COMMON_MODULE),
    30: ("bf16", 16, COMMON_MODULE),
    8: ("q8_0", 2, COMMON_MODULE),
    2: ("q4_0", 2, COMMON_MODULE),
    3: ("q4_1", 2, COMMON_MODULE),
    6: ("q5_0", 2, COMMON_MODULE),
    7: ("q5_1", 2, COMMON_MODULE),
    12: ("q4_k", 16, COMMON_MODULE),
    13: ("q5_k", 16, COMMON_MODULE),
    14: ("q6_k", 2, COMMON_MODULE),
    10: ("q2_k", 1, LOWBIT_MODULE),
    11: ("q3_k", 2, LOWBIT_MODULE),
    16: ("iq2_xxs", 2, LOWBIT_MODULE),
    17: ("iq2_xs", 2, LOWBIT_MODULE),
    22: ("iq2_s", 2, LOWBIT_MODULE),
    18: ("iq3_xxs", 2, LOWBIT_MODULE),
    21: ("iq3_s", 2, LOWBIT_MODULE),
    19: ("iq1_s", 2, LOWBIT_MODULE),
    29: ("iq1_m", 2, LOWBIT_MODULE),
    20: ("iq4_nl", 2, LOWBIT_MODULE),
    23: ("iq4_xs", 8, LOWBIT_MODULE),
    34: ("tq1_0", 2, LOWBIT_MODULE),
    35: ("tq2_0", 2, LOWBIT_MODULE),
    39: ("mxfp4", 1, LOWBIT_MODULE),
}
# GGML type id -> (kernel suffix, GGML name, block size, bytes per block, GEMV alignment)
_TYPES: dict[int, tuple[str, str, int, int, int]] = {
    t: (suffix, GGML_TYPES[t].name, GGML_TYPES[t].block_size, GGML_TYPES[t].type_size, align)
    for t, (suffix, align, _) in _KERNEL_TYPES.items()
}
_MODULE_OF: dict[int, str] = {t: module for t, (_, _, module) in _KERNEL_TYPES.items()}

SUPPORTED_TYPES: frozenset[int] = frozenset(_TYPES)

GEMV_MAX_T = 8  # T <= this: GEMV kernels; above: the tiled kernel
_GEMV_THREADS = 128  # 4 warps
_GEMV_WARPS = 4
_GEMV_R = 2  # weight rows per warp (SwiGLU: gate and up of one output row)
_MOE_R = 4  # the MoE GEMV's rows per warp (SwiGLU: gate and up of two output rows)
# Slots a block of the one-token MoE GEMV on staged x takes when its k slots share x (the
# experts' gate/up): x is staged once for them, the grid's height ceil(k / MOE_SLOTS_A_BLOCK).
# On the H200, 30B-A3B-shaped decode (8 slots; BENCHMARKS.md, 2026-12-04): 2 a block 2.202
# ms/token against 2.248 at 1; 3 and 4 a block were slower than 2 in the same builds (too few
# blocks).
MOE_SLOTS_A_BLOCK = 2
# The one-token GEMV with two warps a row group (gemv1s) takes four rows a group instead of two
# (gemv1ws: each x load serves twice the rows, and the L1's traffic in x bounds this GEMV) when
# a launch has at least this many weight rows; fewer rows leave too few warps to cover the
# loads' latency. On the H200 (2026-12-02, ncu, per launch
# of a decode token, two rows -> four): 8B-shaped Q4_K 19.1 -> 18.4 us, Q6_K 22.4 -> 20.9;
# 0.6B-shaped Q8_0 1024 rows 5.8 -> 5.2, 3072 x 2 (gate/up) 5.5 -> 5.4, 151936 (output) 67 -> 57;
# 30B-A3B-shaped Q4_K 2048 rows 6.16 -> 6.13, 5120 6.98 -> 6.52, but its 128-row F32 router
# 3.8 -> 4.9. The rows' outputs are the same bits either way.
GEMV_WIDE_MIN_ROWS = 1024

_TILE_M = 64  # tiled kernel: output rows per block
_TILE_N = 64  # tiled kernel: tokens per block
_TILE_THREADS = 256
_DQ_THREADS = 256
_EMB_THREADS = 128
_MAX_GRID_Y = 65535
_MAX_GRID_X = 2**31 - 1
_INT32_MAX = 2**31 - 1


def lane_unit_elements(ggml_type: int) -> int:
    """Weights one GEMV lane unit covers (rx_lu<T>::QK / LPB): 8 for the float types, 16 for
    Q8_0, 32 for every other type (tests/test_quant_host.py checks it against the decoders)."""
    bs = _TYPES[ggml_type][2]
    return 8 if bs == 1 else 16 if ggml_type == 8 else 32


def gemv_split(ggml_type: int, n_in: int) -> int:
    """How many warps split a row pair's lane units in the one-token GEMV: 2 (the ``gemv1s``
    kernel) when the row has at least 64 units, so both warps' lanes have one, else 1. It depends
    on the type and n_in only, so a weight's outputs are the same whatever launch it is in."""
    return 2 if n_in // lane_unit_elements(ggml_type) >= 64 else 1


def _gemv_grid_x(ks: int, n_outs: tuple, swiglu: bool, rows: int = _GEMV_R,
                 warps: int = _GEMV_WARPS) -> int:
    groups = warps // ks
    if swiglu:
        r = groups * (rows // 2)
        return (n_outs[0] + r - 1) // r
    r = groups * rows
    return sum((n + r - 1) // r for n in n_outs)


def _info(ggml_type: int) -> tuple[str, str, int, int, int]:
    info = _TYPES.get(ggml_type)
    if info is None:
        names = ", ".join(sorted(v[1] for v in _TYPES.values()))
        raise UnsupportedTensorType(
            f"GGML tensor type {ggml_type} is not supported by the CUDA backend "
            f"(supported: {names}); use a file with supported types",
            cpu_hint=", or --backend cpu")
    return info


def type_name(ggml_type: int) -> str:
    """GGML name of a supported type ("Q4_K")."""
    return _info(ggml_type)[1]


def module_of(ggml_type: int) -> str:
    """The kernel module that serves a supported type (``"quant"`` or ``"quant_lowbit"``)."""
    _info(ggml_type)
    return _MODULE_OF[ggml_type]


def modules_for(ggml_types) -> list[str]:
    """The modules (in :data:`MODULES` order) that serve the supported types among
    ``ggml_types``; the others are refused when their tensor is bound, not here."""
    need = {_MODULE_OF.get(t) for t in ggml_types}
    return [m for m in MODULES if m in need]


def row_bytes(ggml_type: int, n_in: int) -> int:
    """Bytes of one row of ``n_in`` elements (n_in a multiple of the block size)."""
    _, name, bs, ts, _ = _info(ggml_type)
    if n_in <= 0 or n_in % bs:
        raise ValueError(f"{name}: row length {n_in} is not a positive multiple of the block "
                         f"size {bs}")
    return n_in // bs * ts


def _check_int32(**kw: int) -> None:
    for k, v in kw.items():
        if not 0 <= v <= _INT32_MAX:
            raise ValueError(f"{k}={v} is out of range for the kernels (0 .. 2**31-1)")


def dequant(kern, w_ptr: int, ggml_type: int, n_elements: int, out_ptr: int) -> None:
    """``out[0:n_elements]`` (float32) = the tensor at ``w_ptr``, bit-exact with
    ``gguf.quants.dequantize``. ``n_elements`` must be a multiple of the block size."""
    suffix, name, bs, _, _ = _info(ggml_type)
    if n_elements < 0 or n_elements % bs:
        raise ValueError(f"{name}: {n_elements} elements is not a multiple of the block size {bs}")
    if n_elements == 0:
        return
    work = n_elements if bs == 1 else n_elements // 4
    grid = min((work + _DQ_THREADS - 1) // _DQ_THREADS, 1 << 20)  # grid-stride loop beyond
    kern.launch(f"reflex_dequant_{suffix}", (grid, 1, 1), (_DQ_THREADS, 1, 1),
                (w_ptr, out_ptr, n_elements))


def embed_blocks(ggml_type: int, n_embd: int) -> int:
    """The blocks of one token's :func:`embed` launch: the block sums its ``norm`` form writes."""
    bs = _TYPES[ggml_type][2]
    work = n_embd if bs == 1 else n_embd // 4
    return min((work + _EMB_THREADS - 1) // _EMB_THREADS, 1024)


def embed(kern, w_ptr: int, ggml_type: int, ids_ptr: int, out_ptr: int, n_tokens: int,
          n_embd: int, n_vocab: int | None = None, norm: tuple | None = None) -> None:
    """``out[t, :] = dequant(W[ids[t], :])`` for ``w`` of ne ``[n_embd, n_vocab]`` (int32 ids on the
    device, float32 ``out [n_tokens, n_embd]``), bit-exact. Pass ``n_vocab``: an id outside
    ``[0, n_vocab)`` then yields a NaN row instead of reading out of bounds. ``norm`` ``(nw, y,
    part)``, one token: also the outputs of a residual-step producer for the RMSNorm of ``out``
    (:func:`matmul_fused`'s): ``y = out * nw`` (nw 0: out) and the launch's
    :func:`embed_blocks` block sums of ``out^2`` at ``part``."""
    suffix, _, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_embd)
    n_rows = _INT32_MAX if n_vocab is None else n_vocab
    _check_int32(n_tokens=n_tokens, n_embd=n_embd, n_vocab=n_rows)
    if norm is not None and n_tokens != 1:
        raise ValueError(f"embed: the norm's form is for one token, not {n_tokens}")
    if n_tokens == 0:
        return
    gx = embed_blocks(ggml_type, n_embd)
    gy = min(n_tokens, _MAX_GRID_Y)
    nw, y, part = norm if norm is not None else (0, 0, 0)
    kern.launch(f"reflex_embed_{suffix}", (gx, gy, 1), (_EMB_THREADS, 1, 1),
                (w_ptr, ids_ptr, out_ptr, n_tokens, n_embd, rb, n_rows, nw, y, part))


def _gemv_ok(ggml_type: int, w_ptr: int, x_ptr: int, n_in: int) -> bool:
    _, _, bs, _, align = _TYPES[ggml_type]
    if x_ptr % 16 or w_ptr % align:
        return False
    return bs > 1 or n_in % 8 == 0


# Types whose one-token GEMV runs on x limbs (reflex_x_limbs, then reflex_matmul_gemvq1{,s}_<t>):
# their weights are small integers times a scale per 32, so each 4-weight product is three byte
# dot products (dp4a) on x's 32-element blocks of 23-bit integers instead of 4 conversions and 4
# FMA, and the limbs lie in the order a warp loads them (512 contiguous bytes a load, where x as
# floats spreads each load over 16 cache lines): the float IQ4_XS decode GEMV is bound by the L1
# and by instruction issue, not by DRAM.
XQ_TYPES = frozenset({23})  # IQ4_XS (the limbs' layout is its lane order)
_XQ_THREADS = 256
_XQ_CHUNK = 512  # RX_XQ_CHUNK


def x_limbs_bytes(n: int) -> int:
    """Bytes of the x limbs of ``n`` activations (a 32-bit word each, in whole chunks of 512)."""
    return 4 * (-(-n // _XQ_CHUNK) * _XQ_CHUNK)


def x_limbs(core, x_ptr: int, out_ptr: int, n: int) -> None:
    """``out`` = the x limbs of the ``n`` floats at ``x_ptr`` (n % 32 == 0; ``core`` the core
    module; ``out`` 16-byte aligned, as the GEMV reads it, and :func:`x_limbs_bytes` long):
    reflex_x_limbs in cuda/core.cu."""
    if n % 32:
        raise ValueError(f"x_limbs: {n} elements is not a multiple of 32")
    if n:
        core.launch("reflex_x_limbs", ((n + _XQ_THREADS - 1) // _XQ_THREADS, 1, 1),
                    (_XQ_THREADS, 1, 1), (x_ptr, out_ptr, n))


# Types whose matmuls of more than GEMV_MAX_T tokens (prefill) run on x halves: their weights are
# small integers with a scale (and a min) per 32 or 16 (reflex/quants.cuh, rx_qi), exact in
# float16, so the tile's products are float16 tensor-core mma of those integers with x split into
# float16 (hi, lo) pairs (reflex_x_halves, then reflex_matmul_xh_<t>): x to about 22 bits, f32
# sums, one FMA per 32 products for the scale, the weights read as their 4.25-8.5 bits (the
# 3xTF32 tiled kernel, the other types' path, reads float32 and multiplies three times).
XH_TYPES = frozenset({2, 6, 8, 12, 13, 14, 23})  # Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS
_XH_THREADS = 256


def x_halves_bytes(T: int, n_in: int) -> int:
    """Bytes of the x halves of ``T`` rows of ``n_in`` activations: 4 a value, then a scale a
    row and a sum a 32-element block."""
    return 4 * (T * n_in + T + T * (n_in // 32))


def x_halves(core, x_ptr: int, out_ptr: int, T: int, n_in: int) -> None:
    """``out`` = the x halves of x [T, n_in] (n_in % 32 == 0; ``core`` the core module; ``out``
    16-byte aligned and :func:`x_halves_bytes` long): reflex_x_halves in cuda/core.cu."""
    if n_in % 32:
        raise ValueError(f"x_halves: a row of {n_in} elements is not a multiple of 32")
    _check_int32(rows=T, elements=T * n_in)
    if T and n_in:
        core.launch("reflex_x_halves", (T, 1, 1), (_XH_THREADS, 1, 1),
                    (x_ptr, out_ptr, out_ptr + 4 * T * n_in, T, n_in))


# Types whose one-token GEMV of many rows runs on x limbs staged in shared memory
# (reflex_matmul_gemv1x_<t>, reflex/quant_kernels.cuh): each block first writes x as scaled
# integers in its lanes' load order, then sums byte products (dp4a, exact) per 16 weights where
# the float GEMV converts every weight to a float and spends two FMA on it; the float K-quant GEMV
# is bound by instruction issue (Nsight Compute on the H200: 70% of issue slots busy, the DRAM
# at 37% of its peak). x to 23 bits of the largest value of each run of 16. A lane taking two of
# Q4_K's units at once (runs of 32, the header and scales once for 64 weights: 30% fewer
# instructions in the streamed loop) made the 8B's decode slower on the H100 and the H200
# (BENCHMARKS.md, 2026-12-06), also at the same two blocks an SM as unpaired units (128
# registers a thread in a build without the copies' warp: 2.520 against 2.512 ms/token, H100,
# forty-first session). Fewer instructions do not make these kernels faster: the tensor-core
# form did not either (STREAM_FORMS' note), nor Q4_K's high nibbles taken in place with each
# run's sum formed in integers (7.5% fewer, the same bits: 2.451 against 2.446 ms/token, H100,
# forty-second session; branch exp/h16).
# type -> elements of x a chunk of the staged order (rx_x_lanes<T>: 32 units of 32).
XS_CHUNK = {12: 1024, 13: 1024, 14: 1024}  # Q4_K, Q5_K, Q6_K
_GEMVX_WARPS = 8  # GEMVX_WARPS
# gemv1x's other block shapes (reflex_matmul_gemv1x4_<t>, gemv1x1_<t>: warps a row group). A launch
# that gemv1x would give at most one block an SM takes x4 where each of its four warps still
# gets a unit a lane (n_in >= GEMVX4_MIN_IN); one of at least GEMVX1_MIN_WAVES blocks an SM in
# the x1 shape takes x1. On the H200 (BENCHMARKS.md, 2026-12-04): the 30B-A3B-shaped output
# projection (2048 rows of 4096, 128 gemv1x blocks) in x4 took a decode step from 2.037 to 2.020
# ms; the Q6_K heads in x1 (151936 rows of 2048 / 4096) took 14-19 us off the 30B-A3B's and the
# 8B's step. x1 on few blocks was slower (the 8B's output and down projections, 128 x1 blocks
# each: 3.16 ms against 2.49), and x4 on more blocks too (the 8B's 256-block ones: 2.65).
GEMVX4_MIN_IN = 4 * 32 * 32
GEMVX1_MIN_WAVES = 12
XS_MAX_SHMEM = 200 << 10  # the staged x of one block (the H100/H200 allow 227 KB; a device that
# allows less than a launch needs gets the float GEMV: Kernels.allow_shmem says so)
# REFLEX_GEMV_XS=0 keeps those types on the float GEMV (an A/B switch: they differ by rounding)
GEMV_XS = os.environ.get("REFLEX_GEMV_XS", "1") != "0"


# Types whose wide one-token GEMVs (gemv1ws, and gemv1x for XS_CHUNK) also come in the residual
# step's two forms (reflex_matmul_gemv1{ws,x}{r,n}_<t>, gemv_body's EPI): "r", an output
# projection that adds the residual itself and leaves h * w and its block sums of h^2; "n", a
# GEMV on that h * w that applies the norm's scale to its sums. A decode step's add + RMSNorm
# then needs no launch of its own (CudaOps.add_rmsnorm, one row). The types a decode step's
# projections mostly have: F32, F16, Q8_0, Q4_K, Q5_K, Q6_K (each form adds to the module image
# the CUDA start loads).
NORM_TYPES = frozenset({0, 1, 8, 12, 13, 14})


# The streamed residual-step GEMVs (reflex_matmul_gemv1xs{n,r}_<t>, gemv_stream_body in
# reflex/quant_kernels.cuh): gemv1xn's SwiGLU reader, gemv1xn's plain reader of one weight where
# the launch takes gemv1x1's shape (an LM head) and gemv1xr's producer, with gemv1x's bits, as a
# persistent grid (one or two blocks an SM) whose weights reach shared memory through the bulk
# copy engine, so the loads in flight cost the compute warps nothing and x is staged once a block.
# sm_90+ SASS only (the copy engine is Hopper's). Form -> the types that have it;
# REFLEX_GEMV_STREAM=0 keeps gemv1x's. On an H100 (BENCHMARKS.md, 2026-12-05) the 8B Q4_K_M's warm
# decode took 2.591 ms/token without the head streamed and 2.560 with it; streaming its q/k/v
# launches too gave nothing more (on x of two limbs: 2.488 -> 2.487) and cost the 30B-A3B 2.078 ->
# 2.113, so those keep gemv1x. The Q6_K forms read their rows from shared memory with LDS (Q6_K
# blocks are 2-byte aligned: rx_ld_words keeps the pointer's space; as generic loads they took
# 128 registers, one block an SM) and take slots of up to 54 KB (the 16 rows of a 4096-wide tile
# in one copy, a 12288-wide row in three chunks instead of six): on an H100 (BENCHMARKS.md
# 2026-12-07, fiftieth session) the 8B's warm decode 2.336 -> 2.283 ms/token with the Q6_K down
# projection streamed and those slots, 2.315 with the streamed producer at 40 KB slots; the Q6_K
# producer at 40 KB slots and generic loads had been slower on the H200 (2.362 -> 2.374). x stays
# on gemv1x's three limbs: two (15 bits a run) took the 8B from 2.591 to 2.547 ms/token but its
# decode logits' error against the NumPy reference (reflex check) from 2e-6 to 1.4e-4 of the
# largest. Q4_K on the integer tensor cores (u8 x s8 mma on x as four digits: 1.5
# SASS instructions a weight-row product a lane instead of 2.8) was slower still: 2.52 against
# 2.41 ms/token on an H100, 2.28 against 2.22 on the H200 (BENCHMARKS.md 2026-12-06, fortieth and
# forty-first sessions; branch exp/mma). The output projection's producer and the gate/up reader
# in one persistent launch, a grid-wide barrier between them, was slower than the two launches
# that programmatic launch overlaps: 2.69 against 2.41 (H100), 2.45 against 2.22 (H200; branch
# exp/fentry). gate/up and the down projection in one persistent launch, per-chunk counters
# instead of a barrier (the down projection's x chunks staged as their tiles are done), was
# slower too: 3.07 against 2.45 (H100, first form), 2.74 against 2.22 (H200, second form; its
# SwiGLU tiles alone took 1.75 times main's gate/up launch; BENCHMARKS.md 2026-12-06,
# forty-fifth and forty-sixth sessions, branch exp/ffn). The copies carry an L2 evict-first
# policy (rx_bulk_load): they read each weight byte once a step, and the L2 then keeps what
# other launches asked it for ahead and the activations (8B 2.416 -> 2.379 ms/token with the
# fused attention prologue, H100, BENCHMARKS.md 2026-12-06, forty-seventh session); the same
# policy on the plain GEMVs' weight loads cost their q/k/v launches 53 us a step (H200).
STREAM_FORMS = {"n": frozenset({12, 14}), "r": frozenset({12, 14})}  # Q4_K, Q6_K
GEMV_STREAM = os.environ.get("REFLEX_GEMV_STREAM", "1") != "0"
_GSTREAM_THREADS = 32 * (8 + 1)  # GSTREAM_WARPS compute warps and the copies' warp
_GSTREAM_ROWS = 16  # GSTREAM_ROWS: rows a tile (gemv1x's block)
# A ring slot holds at most this much of a tile's rows: 16 rows of 4096 Q4_K weights whole. Half
# slots (rows in chunks of 8 blocks, a copy a row) at four to eight slots were slower on the H100
# (BENCHMARKS.md, 2026-12-05: 2.77-2.94 ms/token against 2.60).
# Slots of 54 KB for every type (a Q6_K head's 16 rows of 4096 whole) were slower there too: 2.525
# against 2.489 (thirty-sixth session, generic loads in the Q6_K reader); for Q6_K alone, with its
# LDS reads, they are faster (STREAM_FORMS' note).
_GSTREAM_SLOT_MAX = 40 << 10
_GSTREAM_SLOT_MAX_OF = {14: 54 << 10}  # type -> its own ring slot limit
# Ring slots at most. Three, not four, though four fit the 8B's gate/up rows: the
# smaller block leaves room for the next launch's blocks to start early (programmatic launch)
# and ask the L2 for their rows; on an H100 (BENCHMARKS.md, 2026-12-05) 8B warm decode with the
# streamed gate/up alone took 2.634 ms/token with three, 2.657 with four, 2.970 with two (2.752
# with gemv1xn). More bytes in flight did not help at two blocks an SM either: a tile's rows in
# two slots of 8 rows, five such slots a block, took 2.47 ms/token against 2.41 (H100,
# BENCHMARKS.md 2026-12-06, fortieth session), and nor did asking the L2 for the chunks the next
# refills will copy (bulk prefetches beside the copies): 2.60-2.73 against 2.45 (H100, forty-third
# session), nor asking it for gate/up's first rows from the output projection's copies' lane
# during the attention: 2.31-2.35 against 2.28 (H100, fifty-sixth session, branch exp/l2next;
# gate/up gained 41 us a step, the attention and the output projection lost 88).
_GSTREAM_STAGES = 3
_GSTREAM_BARRIERS = 4  # GSTREAM_STAGES: the kernel's barrier pairs (ring slots at most)
# Blocks of the persistent grid an SM: two where the driver's occupancy count says two fit
# (registers, shared memory; with the most slots that do), else one. Two blocks are 16 compute
# warps an SM on two rings instead of 8 on one: with 8, two a scheduler, there is often none to
# issue while the others wait (on a ring slot, or on their shared loads: Nsight Compute,
# BENCHMARKS.md 2026-12-06). The same tiles and sums, so the same bits. On an H100 (BENCHMARKS.md,
# 2026-12-06) 8B warm decode took 2.472 ms/token at two blocks (two slots each for its gate/up
# and o), 2.561 at one; two blocks with two slots everywhere 2.511. Two blocks of 9 warps fit only
# at 96 registers a thread or fewer (Nsight Compute's occupancy limit: one block at 106; a
# sub-partition's 16K registers hold five warps of 96), so a change that adds registers to these
# kernels halves their warps unless it is capped (__maxnreg__). The blocks take their tiles in a
# fixed order (blockIdx.x, + gridDim.x, ...): claiming them at run time from a counter of the
# launch, to even out the blocks' ends, took the 8B from 2.42 to 2.66 ms/token on an H100
# (BENCHMARKS.md 2026-12-06, forty-fourth session; branch exp/dyn).
_GSTREAM_SM_BLOCKS = 2


def _stream_chunk_blocks(ggml_type: int, n_in: int) -> int:
    """Blocks of a row of ``n_in`` a ring slot holds (the streamed kernels' T): all of them where
    a tile's rows fit a slot, else the most that do in a multiple of 8 (at least 8)."""
    _, _, bs, ts, _ = _info(ggml_type)
    nb = n_in // bs
    slot_max = _GSTREAM_SLOT_MAX_OF.get(ggml_type, _GSTREAM_SLOT_MAX)
    if _GSTREAM_ROWS * nb * ts <= slot_max:
        return nb
    return max(8, (slot_max // (_GSTREAM_ROWS * ts)) & ~7)


def gemv_stream_smem(ggml_type: int, n_in: int, stages: int) -> int:
    """Dynamic shared memory of reflex_matmul_gemv1xs{n,r}_<t> with ``stages`` ring slots: the
    staged x, the slots' barriers, the slots from a 128-byte boundary."""
    ring = (x_staged_bytes(ggml_type, n_in) + 16 * _GSTREAM_BARRIERS + 127) & ~127
    slot = _GSTREAM_ROWS * _stream_chunk_blocks(ggml_type, n_in) * _info(ggml_type)[3]
    return ring + stages * slot


def _stream_launch(kern, p: "MatPlan", form: str, n0: int, swiglu: bool,
                   w_ptrs: tuple) -> tuple | None:
    """(kernel, grid, block, dynamic shared memory) of the streamed form ("n": a reader of ``n0``
    outputs, the SwiGLU's where ``swiglu``; "r": the producer of ``n0`` rows) of ``p``'s weights
    at ``w_ptrs``; None where it does not apply (another type or device, weights or rows the copy
    engine cannot move: it takes 16-byte aligned runs of a multiple of 16 bytes; fewer than two
    ring slots fit)."""
    suffix, _, bs, ts, _ = _info(p.ggml_type)
    nb = p.n_in // bs
    cb = _stream_chunk_blocks(p.ggml_type, p.n_in)
    n_w = 2 if swiglu else 1
    if not (GEMV_STREAM and p.ggml_type in STREAM_FORMS.get(form, ()) and p.row_bytes % 16 == 0
            and (cb == nb or (cb * ts % 16 == 0 and nb % cb * ts % 16 == 0))
            and len(w_ptrs) >= n_w and all(w and w % 16 == 0 for w in w_ptrs[:n_w])
            and kern.image == "sass" and kern.sm() >= 90):
        return None
    name = f"reflex_matmul_gemv1xs{form}_{suffix}"
    tiles = -(-n0 // (_GSTREAM_ROWS // 2 if swiglu else _GSTREAM_ROWS))
    for blocks in range(_GSTREAM_SM_BLOCKS, 0, -1):
        for stages in range(_GSTREAM_STAGES, 1, -1):
            smem = gemv_stream_smem(p.ggml_type, p.n_in, stages)
            if not (smem <= XS_MAX_SHMEM and kern.allow_shmem(name, smem)):
                continue
            if blocks == 1 or kern.blocks_per_sm(name, _GSTREAM_THREADS, smem) >= blocks:
                grid = min(tiles, blocks * kern.multiprocessors())
                return name, (grid, 1, 1), (_GSTREAM_THREADS, 1, 1), smem
    return None


def resnorm_parts(launch: tuple, n_out: int) -> int:
    """The block sums of h^2 that a producer launch (:func:`fused_norm_launch` "r") of ``n_out``
    rows writes: its grid's width, or the streamed producer's tile count (its grid is
    persistent)."""
    if launch[0].startswith("reflex_matmul_gemv1xsr_"):
        return -(-n_out // _GSTREAM_ROWS)
    return launch[1][0]


def x_staged_bytes(ggml_type: int, n_in: int) -> int:
    """Dynamic shared memory of reflex_matmul_gemv1x_<t> for rows of ``n_in``: x in whole chunks."""
    c = XS_CHUNK[ggml_type]
    return 4 * c * (-(-n_in // c))


_TT_INDEX = (0, 0, 1, 2, 2, 3, 3, 3, 3)  # T (1 .. 8) -> index of the gemv1/2/4/8 kernel
MAX_SEGMENTS = 3  # weights per matmul launch


class MatPlan:
    """What a weight's matmul launches need, computed once when the weight is bound (the CUDA
    backend keeps it in ``Weight.meta``): sizes, kernel names, GEMV eligibility of its address.
    ``error`` is why the weight cannot be a matmul operand (None when it can). ``expert_bytes``:
    the distance between a 3-D tensor's experts (its ``n_out`` rows, unless the weight is a row
    view of a larger tensor, ``CudaOps.weight_rows``)."""

    __slots__ = ("ggml_type", "module", "n_in", "n_out", "n_elements", "row_bytes", "gemv",
                 "gemv1s", "gemv1ws", "gemv1x", "gemv1x4", "gemv1x1", "x_staged", "gemvq", "split",
                 "tiled", "xh", "fused", "gemv_w_ok", "expert_bytes", "error")

    def __init__(self, ggml_type: int, ne: tuple[int, ...], w_ptr: int, name: str = "weight",
                 expert_bytes: int = 0):
        suffix, tname, bs, ts, align = _info(ggml_type)
        self.ggml_type = ggml_type
        self.module = _MODULE_OF[ggml_type]  # the kernels' module, for the launch's ``kern``
        self.n_in = ne[0] if ne else 1
        self.n_out = ne[1] if len(ne) > 1 else 1
        n = 1
        for v in ne:
            n *= v
        self.n_elements = n
        self.expert_bytes = expert_bytes or self.n_in // bs * ts * self.n_out
        self.gemv = tuple(f"reflex_matmul_gemv{tt}_{suffix}" for tt in (1, 2, 4, 8))
        self.gemv1s = f"reflex_matmul_gemv1s_{suffix}"  # T = 1, two warps a row pair
        self.gemv1ws = f"reflex_matmul_gemv1ws_{suffix}"  # T = 1, two warps a row group of 4
        # ... on x limbs staged in shared memory (XS_CHUNK types), else None; x_staged: its bytes;
        # gemv1x4 / gemv1x1: its other block shapes (_gemv1_wide picks one)
        self.gemv1x: str | None = None
        self.gemv1x4: str | None = None
        self.gemv1x1: str | None = None
        self.x_staged = 0
        # T = 1 on x limbs (XQ_TYPES): (one warp, two warps) a row pair, else None
        self.gemvq = ((f"reflex_matmul_gemvq1_{suffix}", f"reflex_matmul_gemvq1s_{suffix}")
                      if ggml_type in XQ_TYPES else None)
        self.tiled = f"reflex_matmul_tiled_{suffix}"
        # more than GEMV_MAX_T tokens on x halves (XH_TYPES), else None
        self.xh = f"reflex_matmul_xh_{suffix}" if ggml_type in XH_TYPES else None
        # NORM_TYPES: a one-token GEMV's name -> its residual-step forms {"r": ..., "n": ...}
        # (the narrow gemv1s has the reader's alone)
        self.fused: dict[str, dict[str, str]] | None = None
        if ggml_type in NORM_TYPES:
            self.fused = {f"reflex_matmul_gemv1{f}_{suffix}":
                          {e: f"reflex_matmul_gemv1{f}{e}_{suffix}" for e in "rn"}
                          for f in (("ws", "x", "x4") if ggml_type in XS_CHUNK else ("ws",))}
            self.fused[self.gemv1s] = {"n": f"reflex_matmul_gemv1sn_{suffix}"}
            if ggml_type in XS_CHUNK:  # x1 is for LM heads: no producer form
                x1 = f"reflex_matmul_gemv1x1_{suffix}"
                self.fused[x1] = {"n": f"reflex_matmul_gemv1x1n_{suffix}"}
        self.error: str | None = None
        self.row_bytes = 0
        if len(ne) > 2 and any(v != 1 for v in ne[2:]):
            self.error = f"matmul with 3-D weight {name!r}; use moe_matmul"
        elif self.n_in <= 0 or self.n_in % bs:
            self.error = (f"{name!r} ({tname}): row length {self.n_in} is not a positive multiple "
                          f"of the block size {bs}")
        elif not (0 <= self.n_in <= _INT32_MAX and 0 <= self.n_out <= _INT32_MAX):
            self.error = f"{name!r}: shape {list(ne)} is out of range for the kernels"
        else:
            self.row_bytes = self.n_in // bs * _TYPES[ggml_type][3]
        self.split = gemv_split(ggml_type, self.n_in)
        self.gemv_w_ok = w_ptr % align == 0 and (bs > 1 or self.n_in % 8 == 0)
        if GEMV_XS and ggml_type in XS_CHUNK and self.error is None and self.split == 2:
            nbytes = x_staged_bytes(ggml_type, self.n_in)
            if nbytes <= XS_MAX_SHMEM:
                self.gemv1x, self.x_staged = f"reflex_matmul_gemv1x_{suffix}", nbytes
                self.gemv1x4 = f"reflex_matmul_gemv1x4_{suffix}"
                self.gemv1x1 = f"reflex_matmul_gemv1x1_{suffix}"


def plan(ggml_type: int, ne: tuple[int, ...], w_ptr: int, name: str = "weight",
         expert_bytes: int = 0) -> MatPlan:
    return MatPlan(ggml_type, tuple(int(v) for v in ne), int(w_ptr), name, int(expert_bytes))


def _tile_grid(T: int, n_outs: tuple, swiglu: bool) -> tuple[int, int]:
    """The grid of the prefill tiles (tiled, xh) over ``T`` tokens: blocks of 64 rows of
    each segment (SwiGLU: 32 gate and 32 up rows) by blocks of 64 tokens."""
    if swiglu:
        gx = (n_outs[0] + _TILE_M // 2 - 1) // (_TILE_M // 2)
    else:
        gx = sum((n + _TILE_M - 1) // _TILE_M for n in n_outs)
    gy = (T + _TILE_N - 1) // _TILE_N
    if gy > _MAX_GRID_Y:
        raise ValueError(f"matmul: T={T} tokens is more than the tiled kernel's grid allows")
    return gx, gy


def _gemv1_wide(kern, p: MatPlan, n_outs: tuple, swiglu: bool, gemv_w_ok: bool,
                x_ptr: int, launch_rows: int = 0, shared: bool = False) -> tuple | None:
    """(kernel, grid, block, dynamic shared memory) of the wide one-token GEMV (gemv1x in one of
    its block shapes, or gemv1ws) that :func:`matmul_planned` launches for these weights on float
    x, or None when it launches another kernel. ``shared``: these weights share a launch with
    others (gemv1xn_<a>_<b>: gemv1x's shape); ``launch_rows``: then the launch's rows (they
    choose the form)."""
    n0, n1, n2 = n_outs
    rows = max(launch_rows, 2 * n0 if swiglu else n0 + n1 + n2)
    if not (p.split == 2 and gemv_w_ok and x_ptr % 16 == 0 and rows >= GEMV_WIDE_MIN_ROWS):
        return None
    if p.gemv1x is not None and kern.allow_shmem(p.gemv1x, p.x_staged):
        block = (32 * _GEMVX_WARPS, 1, 1)
        grid = _gemv_grid_x(2, n_outs, swiglu, 4, _GEMVX_WARPS)
        if not shared:
            sms = kern.multiprocessors()
            if grid <= sms and p.n_in >= GEMVX4_MIN_IN and kern.allow_shmem(p.gemv1x4, p.x_staged):
                return (p.gemv1x4, (_gemv_grid_x(4, n_outs, swiglu, 4, _GEMVX_WARPS), 1, 1), block,
                        p.x_staged)
            grid1 = _gemv_grid_x(1, n_outs, swiglu, 4, _GEMVX_WARPS)
            if grid1 >= GEMVX1_MIN_WAVES * sms and kern.allow_shmem(p.gemv1x1, p.x_staged):
                return p.gemv1x1, (grid1, 1, 1), block, p.x_staged
        return p.gemv1x, (grid, 1, 1), block, p.x_staged
    return p.gemv1ws, (_gemv_grid_x(2, n_outs, swiglu, 4), 1, 1), (_GEMV_THREADS, 1, 1), 0


def _gemv_small(p: MatPlan, T: int, n_outs: tuple, swiglu: bool, gemv_w_ok: bool,
                x_ptr: int) -> tuple | None:
    """(kernel, grid, block, dynamic shared memory) of the GEMV that :func:`matmul_planned`
    launches for ``T`` tokens on float x where no wide or x-limbs form applies (one token:
    gemv1s for rows of ``p.split`` 2, else gemv1..8), or None (the tiled kernel's sizes)."""
    if not (T <= GEMV_MAX_T and gemv_w_ok and x_ptr % 16 == 0):
        return None
    ks = p.split if T == 1 else 1
    name = p.gemv1s if ks == 2 else p.gemv[_TT_INDEX[T]]
    return name, (_gemv_grid_x(ks, n_outs, swiglu), 1, 1), (_GEMV_THREADS, 1, 1), 0


def fused_norm_launch(kern, p: MatPlan, n_outs: tuple, swiglu: bool, gemv_w_ok: bool,
                      x_ptr: int, form: str, shared: bool = False,
                      w_ptrs: tuple = ()) -> tuple | None:
    """The residual-step form of the one-token GEMV :func:`matmul_planned` would launch, as
    (kernel, grid, block, dynamic shared memory), or None when that GEMV has none (a type outside
    NORM_TYPES, another GEMV). ``form`` "r": the producer (one weight, plain products; the
    count of block sums it writes is :func:`resnorm_parts`; the wide GEMVs only); "n": the
    reader of a normed x (the wide GEMVs and gemv1s). Where the streamed form applies (gemv1x's
    producer and SwiGLU reader, gemv1x1's reader of one weight; ``w_ptrs``, the launch's weights,
    given and each 16-byte aligned), the streamed form. ``shared`` as
    :func:`_gemv1_wide`'s. Launch it with :func:`matmul_fused`."""
    if p.fused is None or (form == "r" and (swiglu or n_outs[1] or n_outs[2])):
        return None
    c = (_gemv1_wide(kern, p, n_outs, swiglu, gemv_w_ok, x_ptr, shared=shared)
         or _gemv_small(p, 1, n_outs, swiglu, gemv_w_ok, x_ptr))
    # streamed: gemv1x's producer and SwiGLU reader, gemv1x1's plain reader (a head)
    if c is not None and not shared and (
            (c[0] == p.gemv1x and (form == "r" or swiglu))
            or (c[0] == p.gemv1x1 and form == "n" and not (swiglu or n_outs[1] or n_outs[2]))):
        st = _stream_launch(kern, p, form, n_outs[0], swiglu, w_ptrs)
        if st is not None:
            return st
    name = None if c is None else p.fused.get(c[0], {}).get(form)
    if name is None:
        return None
    if c[3] and not kern.allow_shmem(name, c[3]):
        return None
    return (name,) + c[1:]


def matmul_fused(kern, launch: tuple, p: MatPlan, x_ptr: int, w_ptrs: tuple, y_ptrs: tuple,
                 n_outs: tuple, swiglu: bool, resid: int, nw: int, h_out: int, part: int,
                 n_part: int, eps: float) -> None:
    """One token's matmul in a residual-step form (``launch`` from :func:`fused_norm_launch`).
    Producer ("r", one weight): ``h = resid + W x`` is stored at ``h_out``, ``y_ptrs[0]`` gets
    ``h * nw`` (nw 0: h) and ``part`` the launch's grid-x block sums of h^2. Reader ("n"):
    x is such a ``y_ptrs[0]`` and the products are scaled by ``1 / sqrt(sum(part[:n_part]) / n_in
    + eps)``, so that they are those of ``rmsnorm(h) * nw`` (resid, nw, h_out unused: 0)."""
    name, grid, block, smem = launch
    # the streamed forms' T: the blocks of a row a ring slot holds
    T = _stream_chunk_blocks(p.ggml_type, p.n_in) if name.startswith("reflex_matmul_gemv1xs") else 1
    kern.launch(name, grid, block,
                _mm_args(p, x_ptr, T, w_ptrs, y_ptrs, n_outs, swiglu)
                + (resid, nw, h_out, part, n_part, eps), smem)


# One token's q/k/v on a normed x whose v is another K-quant than q and k (a Q4_K_M or Q5_K_M
# file's Q6_K attn_v), in one launch: (type of q and k, type of v) -> the kernel's suffix
MIXED_XS = {12: {14: "q4_k_q6_k"}, 13: {14: "q5_k_q6_k"}}


def mixed_norm_launch(kern, pa: MatPlan, pb: MatPlan, n_outs: tuple, a_w_ok: bool, b_w_ok: bool,
                      x_ptr: int) -> tuple | None:
    """The one launch (kernel, grid, block, dynamic shared memory) of
    reflex_matmul_gemv1xn_<a>_<b> for weights 0 and 1 planned with ``pa`` and weight 2 with
    ``pb`` on a normed x (the reader form), or None unless the two weights of ``pa`` take gemv1xn
    in a launch of its shape (:func:`fused_norm_launch`, shared) and ``pb``'s type has a gemv1xn
    for its weight. Each output has the bits of its type's gemv1xn over its rows. As in one type's q/k/v launch,
    the launch's rows choose the form: a v of fewer rows than the wide forms take alone (a
    30B-A3B file's 512) is read by gemv1xn here too. Launch it with :func:`matmul_mixed`."""
    suffix = MIXED_XS.get(pa.ggml_type, {}).get(pb.ggml_type)
    if suffix is None or pa.n_in != pb.n_in or pa.module != pb.module:
        return None
    n0, n1, n2 = n_outs
    ca = fused_norm_launch(kern, pa, (n0, n1, 0), False, a_w_ok, x_ptr, "n", shared=True)
    cb = _gemv1_wide(kern, pb, (n2, 0, 0), False, b_w_ok, x_ptr, n0 + n1 + n2, shared=True)
    # each the reader form of its plan's gemv1x (p.fused names it)
    if (ca is None or cb is None or ca[0] != pa.fused.get(pa.gemv1x, {}).get("n")
            or cb[0] != pb.gemv1x or not pb.fused.get(pb.gemv1x, {}).get("n")):
        return None
    name, smem = f"reflex_matmul_gemv1xn_{suffix}", max(ca[3], cb[3])
    if not kern.allow_shmem(name, smem):
        return None
    return name, (ca[1][0] + cb[1][0], 1, 1), ca[2], smem


def matmul_mixed(kern, launch: tuple, pa: MatPlan, pb: MatPlan, x_ptr: int, w_ptrs: tuple,
                 y_ptrs: tuple, n_outs: tuple, part: int, n_part: int, eps: float) -> None:
    """:func:`mixed_norm_launch`'s launch: ``y_i = rmsnorm-scaled x . W_i^T`` as
    :func:`matmul_fused`'s reader, weights 0 and 1 of ``pa``'s type, weight 2 of ``pb``'s."""
    name, grid, block, smem = launch
    kern.launch(name, grid, block,
                _mm_args(pa, x_ptr, 1, w_ptrs, y_ptrs, n_outs, False)
                + (0, 0, 0, part, n_part, eps, pb.row_bytes), smem)


def _mm_args(p: MatPlan, x_ptr: int, T: int, w_ptrs: tuple, y_ptrs: tuple, n_outs: tuple,
             swiglu: bool) -> tuple:
    """The weight matmul kernels' 14 arguments (RX_MM_PARAMS): weights, x, outputs, T, n_in,
    the outputs' rows, the row bytes and the mode (1: SwiGLU)."""
    n0, n1, n2 = n_outs
    return (w_ptrs[0], w_ptrs[1], w_ptrs[2], x_ptr, y_ptrs[0], y_ptrs[1], y_ptrs[2], T, p.n_in,
            n0, n1, n2, p.row_bytes, 1 if swiglu else 0)


def matmul_planned(kern, p: MatPlan, x_ptr: int, T: int, w_ptrs: tuple, y_ptrs: tuple,
                   n_outs: tuple, swiglu: bool = False, gemv_w_ok: bool = True,
                   xq_ptr: int = 0) -> None:
    """``y_i [T, n_outs[i]] = x [T, n_in] . W_i^T`` for up to :data:`MAX_SEGMENTS` weights
    planned with ``p`` (all of ``p``'s GGML type and n_in; ``kern`` the module ``p.module``)
    in one launch: ``w_ptrs`` /
    ``y_ptrs`` / ``n_outs`` are 3-tuples (unused segments 0). ``swiglu``: two weights (gate, up)
    of the same n_out and one output ``y_ptrs[0]`` = ``silu(x . W_gate^T) * (x . W_up^T)``.
    T <= 8: a GEMV kernel (each weight byte read once for all T tokens) when ``gemv_w_ok`` (every
    weight pointer suits it) and x is 16-byte aligned; else the tiled kernel. Each output is
    bit-identical to the matmul of its weight alone. ``xq_ptr``: x in the form its token count
    takes (16-byte aligned): for one token its limbs (:func:`x_limbs`), and an ``XQ_TYPES``
    weight then takes the GEMV on them; for more than :data:`GEMV_MAX_T` its halves
    (:func:`x_halves`), and an ``XH_TYPES`` weight takes the float16 tensor-core tile on them
    instead of the tiled kernel.
    No checks here beyond that choice (the caller planned the weights)."""
    if T > _INT32_MAX:
        raise ValueError(f"T={T} is out of range for the kernels (0 .. 2**31-1)")
    if T == 0:  # nothing to compute (and the one-token GEMV reads x row 0 unconditionally)
        return
    args = _mm_args(p, x_ptr, T, w_ptrs, y_ptrs, n_outs, swiglu)
    if T == 1 and xq_ptr and p.gemvq is not None and gemv_w_ok and xq_ptr % 16 == 0:
        args = args[:3] + (xq_ptr,) + args[4:]
        kern.launch(p.gemvq[p.split - 1], (_gemv_grid_x(p.split, n_outs, swiglu), 1, 1),
                    (_GEMV_THREADS, 1, 1), args)
        return
    wide = _gemv1_wide(kern, p, n_outs, swiglu, gemv_w_ok, x_ptr) if T == 1 else None
    if wide is not None:
        name, grid, block, smem = wide
        kern.launch(name, grid, block, args, smem)
        return
    small = _gemv_small(p, T, n_outs, swiglu, gemv_w_ok, x_ptr)
    if small is not None:
        kern.launch(small[0], small[1], small[2], args)
        return
    gx, gy = _tile_grid(T, n_outs, swiglu)
    if T > GEMV_MAX_T and xq_ptr and p.xh is not None and xq_ptr % 16 == 0:
        kern.launch(p.xh, (gx, gy, 1), (_TILE_THREADS, 1, 1), args[:3] + (xq_ptr,) + args[4:])
        return
    kern.launch(p.tiled, (gx, gy, 1), (_TILE_THREADS, 1, 1), args)


def _weight_rows(n_outs: tuple, swiglu: bool) -> list[int]:
    """Output rows of each weight of a launch, in w_ptrs order (SwiGLU: gate and up)."""
    return [n_outs[0], n_outs[0]] if swiglu else [n for n in n_outs if n]


# Prefill from PAIRS_MIN_T tokens, every weight type: x written as float16 pairs in planes
# (reflex_x_pairs, core module), each weight of the launch unpacked into such pairs with a
# power-of-two scale a row (reflex_unpack_pairs_<t>, the weight's module), then one GEMM in the
# common module (reflex_matmul_f16x3: Wh.Xh + Wh.Xl + Wl.Xh as float16 mma with f32 sums, about
# float32's accuracy, nothing decoded or scaled in its loop). The weight is decoded once a
# launch instead of once a tile, and no per-block scale is applied inside the K loop.
PAIRS_MIN_T = 128
PAIRS_MAX_BYTES = 512 << 20  # scratch for one launch's weights
# REFLEX_PREFILL_F16=1: reflex_matmul_f16x1 instead (Wh.Xh only: each operand rounded to float16,
# a relative 2^-11, as llama.cpp's float16 cuBLAS path; a third of the mma)
PAIRS_TERMS = 1 if os.environ.get("REFLEX_PREFILL_F16", "0") == "1" else 3
# kernel suffix -> rows, tokens a block, threads; the wide form runs two blocks an SM, so a launch of
# fewer than PAIRS_WIDE_MIN_BLOCKS wide blocks takes the 64 x 64 form
_PAIRS_FORMS = {"": (128, 128, 256), "_64": (64, 64, 128)}
_PAIRS_STAGES = {3: 3, 1: 4}  # RX_QUANT_PAIRS_KERNEL's ST for each TERMS
PAIRS_WIDE_MIN_BLOCKS = 264
_PAIRS_UNPACK_THREADS = 256
_PAIRS_UNPACK_FILL = 1 << 18  # threads worth keeping busy: about 2048 on each SM of an H100 / H200


def pairs_lo_offset(n_rows: int, n_in: int) -> int:
    """Byte offset of a weight's lo plane in its pairs: after the hi plane and the rows' scales,
    256-aligned."""
    return 2 * n_rows * n_in + ((4 * n_rows + 255) & ~255)


def _pairs_slot_bytes(n_rows: int, n_in: int, terms: int) -> int:
    """Scratch bytes of one weight's pairs (the lo plane only for three terms), rounded up to
    256 (the next weight's alignment)."""
    return (pairs_lo_offset(n_rows, n_in) + (2 * n_rows * n_in if terms == 3 else 0) + 255) & ~255


def x_pairs_bytes(T: int, n_in: int) -> int:
    """Bytes of :func:`x_pairs` of ``T`` rows: the hi and lo planes, then a scale a row."""
    return 4 * T * n_in + 4 * T


def x_pairs(core, x_ptr: int, out_ptr: int, T: int, n_in: int) -> None:
    """``out`` = x [T, n_in] (n_in % 4 == 0, x 16-byte aligned) as float16 pairs: the hi plane
    [T][n_in] halves, the lo plane, then each row's power-of-two scale (reflex_x_pairs in
    cuda/core.cu; ``core`` the core module, ``out`` 16-byte aligned, :func:`x_pairs_bytes`)."""
    if n_in % 4:
        raise ValueError(f"x_pairs: a row of {n_in} elements is not a multiple of 4")
    _check_int32(rows=T, elements=T * n_in)
    if T and n_in:
        core.launch("reflex_x_pairs", (T, 1, 1), (256, 1, 1), (x_ptr, out_ptr, T, n_in))


def unpack_pairs(kern, w_ptr: int, ggml_type: int, out_ptr: int, n_rows: int, n_in: int,
                 lo: bool = True) -> None:
    """``out`` = the weight's ``n_rows`` rows as float16 pairs: the hi plane, the rows' scales,
    then (``lo``) the lo plane at :func:`pairs_lo_offset` (reflex_unpack_pairs_<t>; ``kern`` the
    type's module, ``out`` 256-byte aligned)."""
    _check_int32(rows=n_rows, elements=n_rows * n_in)
    if n_rows and n_in:
        team = unpack_team(n_rows, n_in)
        grid = min(-(-n_rows // (_PAIRS_UNPACK_THREADS // team)), 65535)
        kern.launch(f"reflex_unpack_pairs_{_info(ggml_type)[0]}", (grid, 1, 1),
                    (_PAIRS_UNPACK_THREADS, 1, 1),
                    (w_ptr, out_ptr, n_rows, n_in, row_bytes(ggml_type, n_in),
                     pairs_lo_offset(n_rows, n_in) if lo else 0, team))


def unpack_team(n_rows: int, n_in: int) -> int:
    """Threads that unpack one row (reflex_unpack_pairs_<t>'s team): a warp, or as many warps
    (up to the block's 8) as a launch of few rows needs to fill _PAIRS_UNPACK_FILL threads,
    no more than the row has runs of 8 values for (a thread's step)."""
    team = 32
    while (team < _PAIRS_UNPACK_THREADS and n_rows * team < _PAIRS_UNPACK_FILL
           and 2 * team <= n_in // 8):
        team *= 2
    return team


def pairs_bytes(p: MatPlan, T: int, n_outs: tuple, swiglu: bool, terms: int = PAIRS_TERMS) -> int:
    """The scratch :func:`matmul_pairs` needs for the weights of a matmul of ``T`` tokens, or 0
    when it does not take that path (T below :data:`PAIRS_MIN_T`, rows not a multiple of 32
    elements, or scratch over :data:`PAIRS_MAX_BYTES`)."""
    if T < PAIRS_MIN_T or p.n_in % 32:
        return 0
    nbytes = sum(_pairs_slot_bytes(n, p.n_in, terms) for n in _weight_rows(n_outs, swiglu))
    return nbytes if nbytes <= PAIRS_MAX_BYTES else 0


def pairs_smem_bytes(form: str, terms: int) -> int:
    """Dynamic shared memory of a pairs GEMM block: its stages' weight and x rows (64 bytes a
    row, slice and plane), or the epilogue's float rows of BM + 4 and the tile's row and token
    scales, whichever is larger."""
    bm, bn, _ = _PAIRS_FORMS[form]
    planes = 1 if terms == 1 else 2
    return max(_PAIRS_STAGES[terms] * planes * (bm + bn) * 64, 4 * (bn * (bm + 4) + bm + bn))


def _pairs_blocks(form: str, T: int, n_outs: tuple, swiglu: bool) -> int:
    bm, bn, _ = _PAIRS_FORMS[form]
    rows = -(-n_outs[0] // (bm // 2)) if swiglu else sum(-(-n // bm) for n in n_outs)
    return rows * -(-T // bn)


def matmul_pairs(kern, kern_common, p: MatPlan, xp_ptr: int, T: int, w_ptrs: tuple,
                 y_ptrs: tuple, n_outs: tuple, swiglu: bool, scratch_ptr: int,
                 form: str | None = None, terms: int = PAIRS_TERMS) -> None:
    """:func:`matmul_planned`'s product of ``T`` tokens through float16 pairs: ``xp_ptr`` is
    :func:`x_pairs` of the T rows; each weight is unpacked into ``scratch_ptr``
    (:func:`pairs_bytes` bytes; ``kern`` the weights' module), then ``reflex_matmul_f16x{terms}``
    (``kern_common``; ``form`` a key of ``_PAIRS_FORMS``, None: the wide form when the launch
    has :data:`PAIRS_WIDE_MIN_BLOCKS` of its blocks and the device gives it the shared
    memory)."""
    ptrs, off = [], scratch_ptr
    for w, n in zip(w_ptrs, _weight_rows(n_outs, swiglu)):
        unpack_pairs(kern, w, p.ggml_type, off, n, p.n_in, lo=terms == 3)
        ptrs.append(off)
        off += _pairs_slot_bytes(n, p.n_in, terms)
    ptrs += [0] * (MAX_SEGMENTS - len(ptrs))
    if form is None:
        form = "" if _pairs_blocks("", T, n_outs, swiglu) >= PAIRS_WIDE_MIN_BLOCKS else "_64"
    name = f"reflex_matmul_f16x{terms}{form}"
    smem = pairs_smem_bytes(form, terms)
    if not kern_common.allow_shmem(name, smem):
        form = "_64"
        name, smem = f"reflex_matmul_f16x{terms}_64", pairs_smem_bytes("_64", terms)
        if not kern_common.allow_shmem(name, smem):
            raise RuntimeError(f"{name}: the device does not give a block {smem} bytes of shared memory")
    n0, n1, n2 = n_outs
    kern_common.launch(name, (_pairs_blocks(form, T, n_outs, swiglu), 1, 1),
                       (_PAIRS_FORMS[form][2], 1, 1),
                       (ptrs[0], ptrs[1], ptrs[2], xp_ptr, y_ptrs[0], y_ptrs[1], y_ptrs[2], T,
                        p.n_in, n0, n1, n2, 2 * p.n_in, 1 if swiglu else 0), smem)


def moe_normed_ok(kern, ggml_type: int, n_in: int) -> bool:
    """Whether one token's :func:`moe_matmul` of this type takes x as the output of a
    residual-step GEMV with the norm's scale still to apply (``norm``: reflex_moe_matmulxn_<t>,
    the staged x form of the K-quants with a reader form)."""
    if not (GEMV_XS and ggml_type in XS_CHUNK and ggml_type in NORM_TYPES):
        return False
    nbytes = x_staged_bytes(ggml_type, n_in)
    return nbytes <= XS_MAX_SHMEM and kern.allow_shmem(
        f"reflex_moe_matmulxn_{_info(ggml_type)[0]}", nbytes)


def moe_matmul(kern, w_ptr: int, ggml_type: int, x_ptr: int, ids_ptr: int, y_ptr: int, T: int,
               k: int, n_in: int, n_out: int, n_expert: int, x_per_expert: bool = False,
               up_ptr: int = 0, norm: tuple | None = None, expert_bytes: int = 0) -> None:
    """MoE gather-matmul over the 3-D expert tensor ``w`` (ne ``[n_in, n_out, n_expert]``): for
    token t and slot j, ``y[t, j, :] = W[ids[t, j]] . x_row`` with ``x_row = x[t]`` (``x [T, n_in]``
    shared by the k slots) or ``x[t, j]`` (``x [T, k, n_in]``, ``x_per_expert=True``). ``ids`` is
    the int32 ``[T, k]`` device array from the router (read on the device); ``y`` is
    ``[T, k, n_out]`` float32. Only the selected experts' weights are read. An id outside
    ``[0, n_expert)`` yields NaN outputs for that slot. ``up_ptr`` (an expert tensor of the same
    type and shape): SwiGLU, ``y[t, j, :] = silu(W . x_row) * (W_up . x_row)`` in the same launch
    (``w`` the gate experts). ``norm`` ``(part, n_part, eps)``: x is a residual-step GEMV's
    ``h * w`` whose rows are scaled by the norm (:func:`matmul_fused`'s reader) as they are read;
    only where :func:`moe_normed_ok` and for one token shared by the slots. ``expert_bytes``: the
    distance between experts when not ``n_out`` rows (a row view, ``MatPlan.expert_bytes``)."""
    suffix, name, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_in)
    eb = expert_bytes or n_out * rb
    _check_int32(T=T, k=k, n_in=n_in, n_out=n_out, n_expert=n_expert, slots=T * k)
    if T == 0 or k == 0 or n_out == 0:
        return
    if not _gemv_ok(ggml_type, w_ptr, x_ptr, n_in) or (
            up_ptr and not _gemv_ok(ggml_type, up_ptr, x_ptr, n_in)):
        raise ValueError(f"moe_matmul {name}: weights at {w_ptr:#x} / activations at {x_ptr:#x} "
                         f"are not aligned as the kernel needs (see reflex_core.cuda.quant_ops), "
                         f"or n_in={n_in} is not a multiple of 8")
    gx = _gemv_grid_x(1, (n_out,), bool(up_ptr), _MOE_R)
    grid = (gx, min(T * k, _MAX_GRID_Y), 1)
    # staged x shared by one token's slots: MOE_SLOTS_A_BLOCK slots a block
    grid_xs = (gx, (k + MOE_SLOTS_A_BLOCK - 1) // MOE_SLOTS_A_BLOCK, 1) \
        if T == 1 and not x_per_expert else grid
    args = (w_ptr, up_ptr, x_ptr, ids_ptr, y_ptr, T, k, n_in, n_out, rb, eb,
            1 if x_per_expert else 0, n_expert, 1 if up_ptr else 0)
    if norm is not None:
        if T != 1 or x_per_expert or not moe_normed_ok(kern, ggml_type, n_in):
            raise ValueError(f"moe_matmul {name}: no normed form for T={T}, n_in={n_in}"
                             f"{', x per expert' if x_per_expert else ''}")
        kern.launch(f"reflex_moe_matmulxn_{suffix}", grid_xs, (_GEMV_THREADS, 1, 1),
                    args + tuple(norm), x_staged_bytes(ggml_type, n_in))
        return
    if T == 1 and GEMV_XS and ggml_type in XS_CHUNK:  # on x limbs, as the dense gemv1x
        nbytes = x_staged_bytes(ggml_type, n_in)
        name_x = f"reflex_moe_matmulx_{suffix}"
        if nbytes <= XS_MAX_SHMEM and kern.allow_shmem(name_x, nbytes):
            kern.launch(name_x, grid_xs, (_GEMV_THREADS, 1, 1), args, nbytes)
            return
    kern.launch(f"reflex_moe_matmul_{suffix}", grid, (_GEMV_THREADS, 1, 1), args)


# MoE matmuls of this many tokens or more group their slots by expert (reflex_moe_schedule, then
# the grouped tiled kernels): each expert's weights are then read once per 64 of its slots
# instead of once per slot.
MOE_TILED_MIN_T = 64


def moe_max_tiles(n_slots: int, n_expert: int) -> int:
    """The most tiles reflex_moe_schedule can cut ``n_slots`` slots into (the grouped kernel's
    grid height): one partial tile per used expert on top of the full ones."""
    return (n_slots + _TILE_N - 1) // _TILE_N + min(n_expert, n_slots)


def moe_tiled_ok(T: int, k: int, n_expert: int) -> bool:
    """Whether a MoE matmul of ``T`` tokens takes the grouped path (:func:`moe_matmul_grouped`)."""
    return T >= MOE_TILED_MIN_T and moe_max_tiles(T * k, n_expert) <= _MAX_GRID_Y


def moe_matmul_grouped(kern, core, w_ptr: int, ggml_type: int, x_ptr: int, ids_ptr: int,
                       y_ptr: int, T: int, k: int, n_in: int, n_out: int, n_expert: int,
                       order_ptr: int, tiles_ptr: int, n_tiles_ptr: int,
                       x_per_expert: bool = False, up_ptr: int = 0, xh_ptr: int = 0,
                       expert_bytes: int = 0) -> None:
    """:func:`moe_matmul`'s result through the slots grouped by expert: ``core`` (the core
    module) runs ``reflex_moe_schedule`` into the scratch ``order`` (``T * k`` int32), ``tiles``
    (``3 * moe_max_tiles`` int32) and ``n_tiles`` (one int32), then ``kern`` the grouped tiled
    kernel. Only for :func:`moe_tiled_ok` sizes; no alignment needs (the tiled kernel's).
    ``xh_ptr``: x's halves (:func:`x_halves` of its T, or T * k when ``x_per_expert``, rows;
    16-byte aligned); an ``XH_TYPES`` weight then takes the grouped float16 tensor-core tile.
    ``expert_bytes`` as :func:`moe_matmul`'s."""
    suffix, _, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_in)
    n_slots = T * k
    _check_int32(T=T, k=k, n_in=n_in, n_out=n_out, n_expert=n_expert, slots=n_slots)
    if not moe_tiled_ok(T, k, n_expert):
        raise ValueError(f"moe_matmul_grouped: T={T}, k={k}, {n_expert} experts is not a grouped size")
    if n_out == 0 or k == 0:
        return
    core.launch("reflex_moe_schedule", (1, 1, 1), (1024, 1, 1),
                (ids_ptr, n_slots, n_expert, _TILE_N, order_ptr, tiles_ptr, n_tiles_ptr, y_ptr, n_out))
    gx = (n_out + _TILE_M // 2 - 1) // (_TILE_M // 2) if up_ptr else (n_out + _TILE_M - 1) // _TILE_M
    args = (w_ptr, up_ptr, x_ptr, order_ptr, tiles_ptr, n_tiles_ptr, y_ptr, k, n_in, n_out, rb,
            expert_bytes or n_out * rb, 1 if x_per_expert else 0, 1 if up_ptr else 0)
    grid = (gx, moe_max_tiles(n_slots, n_expert), 1)
    if xh_ptr and ggml_type in XH_TYPES and xh_ptr % 16 == 0:
        kern.launch(f"reflex_moe_xh_{suffix}", grid, (_TILE_THREADS, 1, 1),
                    args[:2] + (xh_ptr,) + args[3:] + (n_slots if x_per_expert else T,))
        return
    kern.launch(f"reflex_moe_tiled_{suffix}", grid, (_TILE_THREADS, 1, 1), args)


def kernel_names(module: str = COMMON_MODULE) -> list[str]:
    """Every kernel name launched from ``module`` (one of :data:`MODULES`; tests check its build
    has them all)."""
    if module not in MODULES:
        raise ValueError(f"{module!r} is not a weight-kernel module ({', '.join(MODULES)})")
    names = []
    for t, (suffix, *_) in _TYPES.items():
        if _MODULE_OF[t] != module:
            continue
        names += [f"reflex_dequant_{suffix}", f"reflex_embed_{suffix}", f"reflex_unpack_pairs_{suffix}",
                  f"reflex_matmul_tiled_{suffix}", f"reflex_moe_matmul_{suffix}",
                  f"reflex_moe_tiled_{suffix}"]
        names += [f"reflex_matmul_gemv{tt}_{suffix}" for tt in (1, 2, 4, 8)]
        names += [f"reflex_matmul_gemv1s_{suffix}", f"reflex_matmul_gemv1ws_{suffix}"]
        if t in XQ_TYPES:
            names += [f"reflex_matmul_gemvq1_{suffix}", f"reflex_matmul_gemvq1s_{suffix}"]
        if t in XS_CHUNK:
            names += [f"reflex_matmul_gemv1x{f}_{suffix}" for f in ("", "4", "1")]
            names.append(f"reflex_moe_matmulx_{suffix}")
        if t in NORM_TYPES:
            names += [f"reflex_matmul_gemv1{f}{e}_{suffix}" for e in "rn"
                      for f in (("ws", "x", "x4") if t in XS_CHUNK else ("ws",))]
            names.append(f"reflex_matmul_gemv1sn_{suffix}")
            if t in XS_CHUNK:
                names += [f"reflex_matmul_gemv1x1n_{suffix}", f"reflex_moe_matmulxn_{suffix}"]
        if t in XH_TYPES:
            names += [f"reflex_matmul_xh_{suffix}", f"reflex_moe_xh_{suffix}"]
        names += [f"reflex_matmul_gemv1xn_{v}" for v in MIXED_XS.get(t, {}).values()]
        names += [f"reflex_matmul_gemv1xs{e}_{suffix}" for e in "nr" if t in STREAM_FORMS[e]]
    if module == COMMON_MODULE:
        names += [f"reflex_matmul_f16x{t}{f}" for t in _PAIRS_STAGES for f in _PAIRS_FORMS]
    return names
