"""Launchers for the weight-side kernels of ``cuda/quant.cu`` (module ``quant``).

Weights stay in their GGUF block layout on the device (the raw tensor bytes, uploaded as they
are in the file); these kernels decode them on the fly. Every launcher takes ``kern`` (the loaded
module: ``driver.get_kernels("quant")``), device pointers as ints, and sizes. Launches go to the
default stream; nothing here synchronizes or allocates. No numpy (cold path).

Types: :data:`SUPPORTED_TYPES` (GGML ids). Anything else raises
:class:`~reflex_core.errors.UnsupportedTensorType`.

Pointer requirements (the backend's buffers from ``driver.alloc`` are 256-byte aligned, and GGUF
tensor data offsets are multiples of the file alignment, 32 by default, so uploading the data
section as one buffer keeps every tensor 32-byte aligned):

* activations (``x``, ``y``, ``out``) 16-byte aligned -- required by the GEMV path; the tiled
  path accepts any 4-byte aligned pointer;
* weights: 16-byte aligned for the GEMV path of Q4_K / Q5_K / F32 / F16 / BF16, 2-byte for the
  others. :func:`matmul` falls back to the (slower for small T) tiled kernel when a GEMV
  requirement does not hold; :func:`moe_matmul` raises ValueError instead.
"""

from __future__ import annotations

from ..errors import UnsupportedTensorType

# GGML type id -> (kernel suffix, GGML name, block size, bytes per block, weight alignment the
# GEMV lane units need)
_TYPES: dict[int, tuple[str, str, int, int, int]] = {
    0: ("f32", "F32", 1, 4, 16),
    1: ("f16", "F16", 1, 2, 16),
    30: ("bf16", "BF16", 1, 2, 16),
    8: ("q8_0", "Q8_0", 32, 34, 2),
    2: ("q4_0", "Q4_0", 32, 18, 2),
    3: ("q4_1", "Q4_1", 32, 20, 2),
    6: ("q5_0", "Q5_0", 32, 22, 2),
    7: ("q5_1", "Q5_1", 32, 24, 2),
    12: ("q4_k", "Q4_K", 256, 144, 16),
    13: ("q5_k", "Q5_K", 256, 176, 16),
    14: ("q6_k", "Q6_K", 256, 210, 2),
}

SUPPORTED_TYPES: frozenset[int] = frozenset(_TYPES)

GEMV_MAX_T = 8  # T <= this: GEMV kernels; above: the tiled kernel
_GEMV_THREADS = 128  # 4 warps
_GEMV_ROWS = 8  # output rows per GEMV block (4 warps x 2 rows)
_TILE_M = 64  # tiled kernel: output rows per block
_TILE_N = 64  # tiled kernel: tokens per block
_TILE_THREADS = 256
_DQ_THREADS = 256
_EMB_THREADS = 128
_MAX_GRID_Y = 65535
_MAX_GRID_X = 2**31 - 1
_INT32_MAX = 2**31 - 1


def _info(ggml_type: int) -> tuple[str, str, int, int, int]:
    info = _TYPES.get(ggml_type)
    if info is None:
        names = ", ".join(sorted(v[1] for v in _TYPES.values()))
        raise UnsupportedTensorType(
            f"GGML tensor type {ggml_type} is not supported by the CUDA backend "
            f"(supported: {names}); use --backend cpu or a file with supported types")
    return info


def type_name(ggml_type: int) -> str:
    """GGML name of a supported type ("Q4_K")."""
    return _info(ggml_type)[1]


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
    kern.launch(f"reflex_dequant_{suffix}", (grid, 1, 1), (_DQ_THREADS, 1, 1), "PPq",
                (w_ptr, out_ptr, n_elements))


def embed(kern, w_ptr: int, ggml_type: int, ids_ptr: int, out_ptr: int, n_tokens: int,
          n_embd: int, n_vocab: int | None = None) -> None:
    """``out[t, :] = dequant(W[ids[t], :])`` for ``w`` of ne ``[n_embd, n_vocab]`` (int32 ids on the
    device, float32 ``out [n_tokens, n_embd]``), bit-exact. Pass ``n_vocab``: an id outside
    ``[0, n_vocab)`` then yields a NaN row instead of reading out of bounds."""
    suffix, _, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_embd)
    n_rows = _INT32_MAX if n_vocab is None else n_vocab
    _check_int32(n_tokens=n_tokens, n_embd=n_embd, n_vocab=n_rows)
    if n_tokens == 0:
        return
    bs = _TYPES[ggml_type][2]
    work = n_embd if bs == 1 else n_embd // 4
    gx = min((work + _EMB_THREADS - 1) // _EMB_THREADS, 1024)
    gy = min(n_tokens, _MAX_GRID_Y)
    kern.launch(f"reflex_embed_{suffix}", (gx, gy, 1), (_EMB_THREADS, 1, 1), "PPPiiqi",
                (w_ptr, ids_ptr, out_ptr, n_tokens, n_embd, rb, n_rows))


def _gemv_ok(ggml_type: int, w_ptr: int, x_ptr: int, n_in: int) -> bool:
    _, _, bs, _, align = _TYPES[ggml_type]
    if x_ptr % 16 or w_ptr % align:
        return False
    return bs > 1 or n_in % 8 == 0


def matmul(kern, w_ptr: int, ggml_type: int, x_ptr: int, y_ptr: int, T: int, n_in: int,
           n_out: int) -> None:
    """``y [T, n_out] = x [T, n_in] . W^T`` for ``w`` of ne ``[n_in, n_out]`` in GGML type
    ``ggml_type`` (float32 activations, float32 accumulation). T <= 8: a GEMV kernel (one warp per
    2 output rows, each weight byte read once for all T tokens); larger T: the tiled kernel."""
    suffix, _, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_in)
    _check_int32(T=T, n_in=n_in, n_out=n_out)
    if T == 0 or n_out == 0:
        return
    if T <= GEMV_MAX_T and _gemv_ok(ggml_type, w_ptr, x_ptr, n_in):
        tt = 1 if T == 1 else 2 if T == 2 else 4 if T <= 4 else 8
        grid = (n_out + _GEMV_ROWS - 1) // _GEMV_ROWS
        kern.launch(f"reflex_matmul_gemv{tt}_{suffix}", (grid, 1, 1), (_GEMV_THREADS, 1, 1),
                    "PPPiiiq", (w_ptr, x_ptr, y_ptr, T, n_in, n_out, rb))
        return
    gx = (n_out + _TILE_M - 1) // _TILE_M
    gy = (T + _TILE_N - 1) // _TILE_N
    if gy > _MAX_GRID_Y:
        raise ValueError(f"matmul: T={T} tokens is more than the tiled kernel's grid allows")
    kern.launch(f"reflex_matmul_tiled_{suffix}", (gx, gy, 1), (_TILE_THREADS, 1, 1), "PPPiiiq",
                (w_ptr, x_ptr, y_ptr, T, n_in, n_out, rb))


def moe_matmul(kern, w_ptr: int, ggml_type: int, x_ptr: int, ids_ptr: int, y_ptr: int, T: int,
               k: int, n_in: int, n_out: int, n_expert: int, x_per_expert: bool = False) -> None:
    """MoE gather-matmul over the 3-D expert tensor ``w`` (ne ``[n_in, n_out, n_expert]``): for
    token t and slot j, ``y[t, j, :] = W[ids[t, j]] . x_row`` with ``x_row = x[t]`` (``x [T, n_in]``
    shared by the k slots) or ``x[t, j]`` (``x [T, k, n_in]``, ``x_per_expert=True``). ``ids`` is
    the int32 ``[T, k]`` device array from the router (read on the device); ``y`` is
    ``[T, k, n_out]`` float32. Only the selected experts' weights are read. An id outside
    ``[0, n_expert)`` yields NaN outputs for that slot."""
    suffix, name, _, _, _ = _info(ggml_type)
    rb = row_bytes(ggml_type, n_in)
    _check_int32(T=T, k=k, n_in=n_in, n_out=n_out, n_expert=n_expert, slots=T * k)
    if T == 0 or k == 0 or n_out == 0:
        return
    if not _gemv_ok(ggml_type, w_ptr, x_ptr, n_in):
        raise ValueError(f"moe_matmul {name}: weights at {w_ptr:#x} / activations at {x_ptr:#x} "
                         f"are not aligned as the kernel needs (see reflex_core.cuda.quant_ops), "
                         f"or n_in={n_in} is not a multiple of 8")
    grid = ((n_out + _GEMV_ROWS - 1) // _GEMV_ROWS, min(T * k, _MAX_GRID_Y), 1)
    kern.launch(f"reflex_moe_matmul_{suffix}", grid, (_GEMV_THREADS, 1, 1), "PPPPiiiiqqii",
                (w_ptr, x_ptr, ids_ptr, y_ptr, T, k, n_in, n_out, rb, n_out * rb,
                 1 if x_per_expert else 0, n_expert))


def kernel_names() -> list[str]:
    """Every kernel name this module launches (tests check the fatbin has them all)."""
    names = []
    for suffix, *_ in _TYPES.values():
        names += [f"reflex_dequant_{suffix}", f"reflex_embed_{suffix}",
                  f"reflex_matmul_tiled_{suffix}", f"reflex_moe_matmul_{suffix}"]
        names += [f"reflex_matmul_gemv{tt}_{suffix}" for tt in (1, 2, 4, 8)]
    return names
