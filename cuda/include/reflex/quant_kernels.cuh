// reflex/quant_kernels.cuh -- the weight-side kernels: GGUF-typed weights (raw blocks as
// uploaded from the file) times float32 activations. Decoders live in reflex/quants.cuh (host +
// device; the CPU tests check them bit for bit against gguf-py). Launchers:
// reflex_core/cuda/quant_ops.py.
//
// RX_QUANT_KERNELS(t, RX_<T>) defines the 10 extern "C" kernels below for one GGML type <t>; the
// modules instantiate it for their types: cuda/quant.cu (the common types, loaded at start) and
// cuda/quant_lowbit.cu (the low-bit, codebook, ternary and FP4 types, loaded only for a file that
// has one). `w` points at the tensor's raw bytes, `row_bytes` = n_in / QK * TS.
//
// reflex_dequant_<t>(w, out, n)
//   Whole tensor -> float32, bit-exact with gguf.quants.dequantize (reflex check, tests).
//   Grid-stride loop, 256 threads/block; one thread per 4 consecutive elements (one float4
//   store) for quantized types, one element per thread for float types.
//
// reflex_embed_<t>(w, ids, out, n_tokens, n_embd, row_bytes, n_rows, nw, y, part)
//   out[t, :] = dequant(row ids[t]) (bit-exact). grid.y strides over tokens, grid.x over the row
//   (128 threads/block, 4 elements per thread). An id outside [0, n_rows) gives a NaN row.
//   part not null (one token, grid.y 1): also the first RMSNorm's residual-step outputs, as a
//   GEMV_RESNORM producer leaves them (h = out): y = h * nw (nw null: h) and part[block] = the
//   block's sum of h^2 (each thread's elements in order, the warps' butterfly sums in order).
//
// Matmuls: up to 3 weights of the same type and n_in against one x, in one launch. Segment i
// (i < 3) is w_i (n_i output rows) -> y_i [T, n_i]; n_i = 0 leaves a segment out (one weight:
// n1 = n2 = 0). mode 0: those plain products. mode 1 (SwiGLU): w0 = gate, w1 = up, both n0
// rows, y0[t, o] = silu(g) * u with g = W0[o] . x[t], u = W1[o] . x[t] (silu(g) = g / (1 +
// exp(-g)), as reflex_swiglu); n1, n2, y1, y2, w2 are ignored. Every output is bit-identical to
// the separate matmul (and swiglu) of each weight: the same per-row arithmetic.
//
// reflex_matmul_gemv{1,2,4,8}_<t>(w0, w1, w2, x, y0, y1, y2, T, n_in, n0, n1, n2, row_bytes,
//                                 mode)                                   (T <= 1, 2, 4, 8)
// reflex_matmul_gemv1s_<t>(the same)                                     (T <= 1)
// reflex_matmul_gemv1ws_<t>(the same)                                    (T <= 1)
//   y[t, o] = sum_i W[o, i] x[t, i] for small T (decode, short batches). 128 threads = 4 warps
//   in 4 / KS row groups of KS warps: KS = 1 for gemv{1,2,4,8}, 2 for gemv1s and gemv1ws (the
//   launcher's choice for one token and rows of 64 lane units or more: twice the warps on a
//   matrix keep more loads in flight). A group owns R weight rows, R = 2 (4 for gemv1ws, the
//   launcher's choice for such launches of many rows): mode 0, R consecutive
//   output rows of one segment; mode 1, rows o .. o + R/2 - 1 of gate and of up (R/2 output
//   rows). Each row's arithmetic is the same whatever R, KS aside. Its KS warps split the
//   rows' units (warp s takes the runs of 32 units s, s + KS, ...) and their sums meet in shared
//   memory. Each warp's lanes stride over the rows' "lane units"
//   (rx_lu<t>: 16-byte vector loads where the block layout keeps 16-byte alignment -- Q4_K,
//   Q5_K, float types --, 8-byte loads for IQ4_XS's header, else funnel-shifted 32-bit loads;
//   the codebook types look their grid entries up in global-memory tables,
//   reflex/iq_tables.cuh). Unit u of a row sits right after unit u-1, so lane L reading unit L
//   (+32k) makes each warp load instruction contiguous. Q8_0 and IQ4_XS share a unit between
//   2 and 4 lanes (rx_unit_lanes: each lane some of its steps), so a warp's x loads touch 2-4
//   times fewer 128-byte lines (the L1, not the DRAM, limited them with a lane a unit). Each
//   weight byte is read once and used for all T tokens; each x value is loaded (float4) once
//   per unit step and used for both rows. f32 accumulation with FMA (types with one scale per
//   unit: the unit's sum of values * x, then one FMA with the scale), a butterfly shuffle sum per
//   warp, the group's warps added in order; lane r*TT+t of the group's first warp stores
//   y[t, row0+r] (mode 1: lane m*TT+t stores y0[t, o+m]).
//   mode 0: grid.x = sum_i ceil(n_i / (R * 4 / KS)), segment i owning a contiguous run of
//   blocks; mode 1: grid.x = ceil(n0 / (R/2 * 4 / KS)). Needs x 16-byte aligned, every w_i aligned to
//   rx_lu<t>::ALIGN, and n_in % 8 == 0 for float types (the launcher falls back to the tiled
//   kernel otherwise).
//
// reflex_matmul_gemvq1_<t>, reflex_matmul_gemvq1s_<t>(the same, x = the x limbs)   (T = 1)
//   IQ4_XS only (RX_QUANT_XQ_KERNELS): gemv1 / gemv1s with each 4-weight product three dp4a on
//   x's limbs (reflex_x_limbs in cuda/core.cu writes them; layout and numerics in
//   reflex/quants.cuh, before rx_gemv_rows_xq). The CUDA backend launches both for one token.
//
// reflex_matmul_gemv1x_<t>(as gemv1ws; dynamic shared memory: rx_x_lanes<t>::chunks(n_in) *
//   SLOTS * 16 bytes)                                                           (T = 1)
//   Q4_K, Q5_K, Q6_K (RX_QUANT_XS_KERNEL): 8 warps a block, two a row group of 4 rows. The block
//   writes x's limbs in its lanes' load order to shared memory (rx_x_limb_run, a thread a run of
//   16), then each lane sums byte products on them (rx_gemv_rows_limbs). Grid as gemv1ws with
//   16 rows a block (mode 1: 8 outputs). reflex_moe_matmulx_<t>: reflex_moe_matmul_<t> (below)
//   the same way, for one token; a block restages x only when its next slot's x differs, so
//   where the slots share x the launcher gives a block several (quant_ops.MOE_SLOTS_A_BLOCK:
//   grid.y = ceil(k / it)).
//
// reflex_matmul_gemv1x4_<t>, reflex_matmul_gemv1x1_<t>(as gemv1x)                    (T = 1)
//   gemv1x with four warps a row group (8 rows a block, mode 1: 4 outputs) and with one (32
//   rows, mode 1: 16 outputs), three blocks an SM (80 registers; rx_sm_blocks). The launcher
//   takes x4 for a launch that gemv1x would give one block an SM or less (an output projection
//   of a model narrower than its attention: each warp's chain of units is half as long, two
//   blocks an SM instead of one) and x1 for a launch of many waves (an LM head: x staged once
//   for 32 rows instead of 16); quant_ops._gemv1_wide has the rule. Each has its own
//   summation order. Residual-step forms: gemv1x4{r,n}, gemv1x1n (below).
//
// reflex_matmul_gemv1{ws,x,x4}{r,n}_<t>, reflex_matmul_gemv1x1n_<t>(the same, resid, nw, h_out,
//   part, n_part, eps)                                                          (T = 1)
//   The types of RX_QUANT_NORM_KERNELS / RX_QUANT_XS_NORM_KERNELS (cuda/quant.cu): gemv1ws /
//   gemv1x (x4, x1) with a decode step's residual add and RMSNorm folded in (gemv_body's EPI).
//   "r", one weight, mode 0: h = resid + W x (h_out), y0 = h * nw (nw null: h), part[block] = the
//   block's sum of h^2. "n": x is such a y0; the sums are scaled by rx_norm_scale(part, n_part,
//   n_in, eps) before the stores (and the SwiGLU), so the outputs are those of rmsnorm(h) * nw.
//   Launch shapes as gemv1ws / gemv1x. The same types' reflex_matmul_gemv1sn_<t>: "n" of gemv1s
//   (fewer rows than the wide forms take), launched as gemv1s.
//
// reflex_moe_matmulxn_<t>(reflex_moe_matmulx_<t>'s parameters, part, n_part, eps)    (T = 1)
//   Q4_K, Q5_K, Q6_K: reflex_moe_matmulx_<t> on such a y0, its sums scaled as the "n" forms'.
//
// reflex_matmul_tiled_<t>(w0, w1, w2, x, y0, y1, y2, T, n_in, n0, n1, n2, row_bytes, mode)
//   (any T; prefill) Shared-memory GEMM tile: a 256-thread block computes 64 weight rows x 64
//   tokens; per K slice it dequantizes the weight tile (rx_q<t>::dec4, groups of 4 elements,
//   threads sharing a row read its contiguous bytes; float32 weights as float4 loads) and
//   stages the x tile, both row-major in shared memory. sm_80
//   and later: tensor cores, each warp a 16 rows x 32 tokens block of mma.m16n8k8 TF32 products
//   in the 3xTF32 split (big*big + big*small + small*big, f32 accumulation: close to f32 FMA
//   accuracy; small*small, ~2^-22 of a product, is dropped); values are staged once as their
//   (big, small) pairs, K slices of 32 (37 KB), and the next slice loads into registers while
//   the current one is multiplied. Before sm_80: K slices of 64, float tiles, each thread a
//   4 rows x 4 tokens outer product per k (16 FMA).
//   Warps whose tokens are all >= T skip the math. The results go through shared memory and
//   out one token row at a time.
//   mode 0: the 64 rows of a block are consecutive rows of one segment, grid = (sum_i
//   ceil(n_i/64), ceil(T/64)). mode 1: tile rows 0..31 are gate rows [o0, o0+32), rows 32..63
//   the same up rows; the block stages its 64x64 results in shared memory and writes the 32x64
//   outputs silu(g) * u; grid = (ceil(n0/32), ceil(T/64)).
//   No alignment assumptions (also the fallback for misaligned inputs).
//
// reflex_unpack_pairs_<t>(w, out, n_rows, n_in, row_bytes, lo_off, team)
//   The weight's rows as the float16 pairs of the prefill GEMM below: a power-of-two scale a
//   row, hi and lo planes (unpack_pairs_body). Every type.
//
// reflex_matmul_f16x{3,1}{,_64}(w0, w1, w2, x, y0, y1, y2, T, n_in, n0, n1, n2, row_bytes, mode)
//   (cuda/quant.cu only; prefill from quant_ops.PAIRS_MIN_T tokens, any weight type) The GEMM on
//   float16 pairs (pairs_body): w_i = reflex_unpack_pairs_<t>'s output, x = reflex_x_pairs'
//   (cuda/core.cu); three float16 mma a product (f16x3, about f32 accuracy) or one (f16x1).
//   Segments and modes as above; one-dimensional grid (quant_ops.matmul_pairs).
//
// reflex_moe_matmul_<t>(w, w_up, x, ids, y, T, k, n_in, n_out, row_bytes, expert_bytes,
//                       x_per_expert, n_expert, mode)
//   MoE gather: slot s = t*k + j uses expert e = ids[s] (read on the device) of the 3-D tensor
//   (E matrices of expert_bytes each): y[s, :] = W_e . x_row, x_row = x[t] (x_per_expert = 0)
//   or x[s] (1). The GEMV above with T = 1 per slot and R = 4 rows a warp, grid.y striding over
//   slots, so only the selected experts' rows are read. mode 0: grid = (ceil(n_out/16),
//   min(T*k, 65535)), w_up unused. mode 1 (SwiGLU): w = gate experts, w_up = up experts (same
//   type and shape); a warp owns output rows o, o + 1 (their gate and up rows),
//   y[s, o] = silu(g) * u; grid = (ceil(n_out/8), min(T*k, 65535)). An id outside
//   [0, n_expert) gives NaN outputs.
//
// reflex_moe_tiled_<t>(w, w_up, x, order, tiles, n_tiles, y, k, n_in, n_out, row_bytes,
//                      expert_bytes, x_per_expert, mode)
//   The same products for many tokens, grouped by expert: reflex_moe_schedule (cuda/core.cu)
//   sorts the slots by expert into `order` and cuts each expert's run into tiles of <= 64
//   slots; block (x, i) runs tile i as the tiled kernel above over that expert's matrix (mode
//   1: gate and up), its x rows gathered (x[s / k], or x[s] when x_per_expert) and its outputs
//   scattered to y[s]. Each expert's weights are read once per tile instead of once per slot.
//   grid = (ceil(n_out/64) (mode 1: ceil(n_out/32)), the schedule's tile bound); blocks past
//   *n_tiles return. Slots with invalid ids were given their NaN rows by the schedule.
#pragma once

#include "reflex/quants.cuh"

#define GEMV_WARPS 4
#define GEMV_R 2
#define TILE_M 64
#define TILE_N 64
#define TILE_K 64
#define TILE_THREADS 256
#define DQ_THREADS 256
#define EMB_THREADS 128

// ------------------------------------------------------------------------------------------
// dequant / embed

template <int TYPE>
__device__ __forceinline__ void dequant_body(const uint8_t* __restrict__ w, float* __restrict__ out,
                                             long long n) {
    typedef rx_q<TYPE> Q;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (Q::QK == 1) {
        for (; i < n; i += stride) out[i] = Q::dec1(w, i);
    } else {
        const long long ng = n / 4;  // n % QK == 0 (checked by the launcher)
        const bool vec = ((uintptr_t)out & 15u) == 0;
        for (; i < ng; i += stride) {
            const long long e = 4 * i;
            float y[4];
            Q::dec4(w + (e / Q::QK) * Q::TS, (int)(e % Q::QK), y);
            if (vec) {
                *(float4*)(out + e) = make_float4(y[0], y[1], y[2], y[3]);
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) out[e + c] = y[c];
            }
        }
    }
}

template <int TYPE>
__device__ __forceinline__ void embed_body(const uint8_t* __restrict__ w, const int* __restrict__ ids,
                                           float* __restrict__ out, int n_tokens, int n_embd,
                                           long long row_bytes, int n_rows,
                                           const float* __restrict__ nw, float* __restrict__ yn,
                                           float* __restrict__ part) {
    typedef rx_q<TYPE> Q;
    const int stride = gridDim.x * blockDim.x;
    const int i0 = blockIdx.x * blockDim.x + threadIdx.x;
    const bool norm = part != nullptr;  // the launcher passes it for one token only
    float sq = 0.0f;
    // the norm's outputs of element e (value h)
    auto normed = [&](int e, float h) {
        yn[e] = nw != nullptr ? h * __ldg(nw + e) : h;
        sq += h * h;
    };
    for (int tok = blockIdx.y; tok < n_tokens; tok += gridDim.y) {
        const int id = __ldg(ids + tok);
        const bool ok = id >= 0 && id < n_rows;
        const uint8_t* row = w + (long long)(ok ? id : 0) * row_bytes;
        float* o = out + (long long)tok * n_embd;
        if constexpr (Q::QK == 1) {
            for (int e = i0; e < n_embd; e += stride) {
                const float h = ok ? Q::dec1(row, e) : rx_nan();
                o[e] = h;
                if (norm) normed(e, h);
            }
        } else {
            const bool vec = ((uintptr_t)o & 15u) == 0;
            for (int g = i0; g < n_embd / 4; g += stride) {
                const int e = 4 * g;
                float y[4];
                if (ok) {
                    Q::dec4(row + (long long)(e / Q::QK) * Q::TS, e % Q::QK, y);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c) y[c] = rx_nan();
                }
                if (vec) {
                    *(float4*)(o + e) = make_float4(y[0], y[1], y[2], y[3]);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c) o[e + c] = y[c];
                }
                if (norm) {
#pragma unroll
                    for (int c = 0; c < 4; ++c) normed(e + c, y[c]);
                }
            }
        }
    }
    if (norm) {  // block-uniform
        __shared__ float wsum[EMB_THREADS / 32];
        sq = rx_warp_sum(sq);
        if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = sq;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < EMB_THREADS / 32; ++i) t += wsum[i];
            part[blockIdx.x] = t;
        }
    }
}

// ------------------------------------------------------------------------------------------
// GEMV (small T) and the MoE gather GEMV

__device__ __forceinline__ float rx_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The one-token GEMVs' XS form (gemv_body, moe_body): the block's threads write x's limbs in the
// lanes' load order to the dynamic shared memory (rx_x_limb_run, a thread a run; THREADS the
// block's), then the block synchronizes. Returns the staged words.
__device__ __forceinline__ uint32_t* rx_x_staged_words() {
    extern __shared__ uint4 rx_x_staged[];
    return (uint32_t*)rx_x_staged;
}
// SYNC false: the caller synchronizes the block before the limbs are read. (x copied raw by the
// bulk copy engine and converted in place, a warp a chunk, was slower in the decode step: 2.79
// against 2.45 ms/token on an H100, BENCHMARKS.md 2026-12-06, forty-sixth session, exp/xbulk; so
// was asking the L1 for a thread's later runs before the loop, so that a 12288-wide x's three
// runs a thread go to the L2 together: 2.353 against 2.325, 2026-12-07, fifty-third session,
// exp/xpf.)
template <int TYPE, int THREADS, bool SYNC = true>
__device__ __forceinline__ const uint32_t* rx_stage_x_limbs(const float* __restrict__ x, int n_in) {
    typedef rx_x_lanes<TYPE> XL;
    uint32_t* xl = rx_x_staged_words();
    for (int i = threadIdx.x; i < XL::chunks(n_in) * 64; i += THREADS)  // i: (chunk, h, lane slot)
        rx_x_limb_run<TYPE>(x, n_in, i >> 6, i & 31, (i >> 5) & 1, xl + 4 * (i >> 6) * XL::SLOTS);
    if (SYNC) __syncthreads();
    return xl;
}

// The sums of a row group's partial dot products: each warp's lanes (butterfly: every lane gets
// every sum), then, when KS > 1 warps split the rows' units, the other slices' sums added to
// slice 0's in slice order through shared memory (every thread of the block calls it then: it
// synchronizes the block). Afterwards slice 0's lanes hold the totals.
template <int TT, int KS, int R, int WARPS = GEMV_WARPS>
__device__ __forceinline__ void gemv_sums(float (&acc)[R][TT]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < TT; ++t) acc[r][t] = rx_warp_sum(acc[r][t]);
    }
    if constexpr (KS > 1) {
        __shared__ float part[WARPS][R * TT];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % KS;
        if (slice > 0 && lane < R * TT) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int t = 0; t < TT; ++t)
                    if (lane == r * TT + t) part[warp][lane] = acc[r][t];
            }
        }
        __syncthreads();
        if (slice == 0) {
#pragma unroll
            for (int p = 1; p < KS; ++p) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
#pragma unroll
                    for (int t = 0; t < TT; ++t) acc[r][t] += part[warp + p][r * TT + t];
                }
            }
        }
    }
}

// The stores, from the totals: plain, lane r*TT+t stores y[t, row0+r] (rows past n_out
// skipped); SwiGLU (acc[2m] = gate row row0 + m, acc[2m+1] = its up row), lane m*TT+t stores
// y[t, row0+m] = silu(g) * u.
template <int TT, int R>
__device__ __forceinline__ void gemv_store(const float (&acc)[R][TT], bool swiglu,
                                           float* __restrict__ y, int T, int n_out, int row0) {
    const int lane = threadIdx.x & 31;
    if (swiglu) {
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int m = 0; m < R / 2; ++m) {
#pragma unroll
            for (int t = 0; t < TT; ++t)
                if (lane == m * TT + t) {
                    g = acc[2 * m][t];
                    u = acc[2 * m + 1][t];
                }
        }
        const int m = lane / TT, t = lane % TT;
        if (m < R / 2 && t < T && row0 + m < n_out) y[(long long)t * n_out + row0 + m] = rx_silu_mul(g, u);
    } else {
        float mine = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int t = 0; t < TT; ++t)
                if (lane == r * TT + t) mine = acc[r][t];
        }
        const int r = lane / TT, t = lane % TT;
        if (r < R && t < T && row0 + r < n_out) y[(long long)t * n_out + row0 + r] = mine;
    }
}

// A residual step's producer, one row group (GEMV_RESNORM; lane r < R holds row row0 + r's
// product): h = resid + product stored at h_out, y = h * nw (nw null: h), rows past n skipped.
// Returns the group's sum of h^2, rows in order (every lane of the warp).
template <int R>
__device__ __forceinline__ float rx_resnorm_rows(const float (&acc)[R][1], int row0, int n,
                                                 const float* __restrict__ resid,
                                                 const float* __restrict__ nw, float* __restrict__ h_out,
                                                 float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    float v = 0.0f, sq = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (lane == r) v = acc[r][0];
    const int row = row0 + lane;
    if (lane < R && row < n) {
        const float h = resid[row] + v;
        h_out[row] = h;
        y[row] = nw != nullptr ? h * nw[row] : h;
        sq = h * h;
    }
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) s += __shfl_sync(0xffffffffu, sq, r);
    return s;
}

// Which segment block blk of a multi-segment launch works on (blocks_i = ceil(n_i / rows per
// block)): its weight, output, row count, and the block index b within the segment.
__device__ __forceinline__ void seg_select(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2,
                                           float* y0, float* y1, float* y2, int n0, int n1, int n2,
                                           int rows_per_block, const uint8_t*& w, float*& y, int& n,
                                           int& b, int blk) {
    b = blk;
    const int b0 = (n0 + rows_per_block - 1) / rows_per_block;
    const int b1 = (n1 + rows_per_block - 1) / rows_per_block;
    if (b < b0) {
        w = w0; y = y0; n = n0;
    } else if (b - b0 < b1) {
        b -= b0; w = w1; y = y1; n = n1;
    } else {
        b -= b0 + b1; w = w2; y = y2; n = n2;
    }
}

// A block's WARPS warps form WARPS / KS row groups of KS warps each; the KS warps ("slices")
// of a group split its R rows' units (rx_gemv_rows' first / stride). Mode 0: the group's rows
// are R consecutive rows of one segment; mode 1: gate and up rows of R / 2 consecutive outputs.
// XQ: x is the x limbs (T = 1). XS (T = 1, the K-quants): the block first writes x's limbs in
// the lanes' load order to shared memory (rx_x_limb_run; the launch gives
// rx_x_lanes<TYPE>::chunks(n_in) * SLOTS * 16 bytes of dynamic shared memory), one copy for its
// WARPS / KS * R rows, then the lane loop runs on them (rx_gemv_rows_limbs: byte dot products
// instead of a float conversion and two FMA per weight).
// EPI (one token, KS > 1): GEMV_PLAIN; GEMV_RESNORM, the producer of a residual step (mode 0,
// one segment): h = resid + W x is stored at h_out, y0 gets h * nw (nw null: h) and part[block]
// the block's sum of h^2 over its rows (rows in order within a group, the groups in order);
// GEMV_NORMED, the consumer: x is such a y0 and every output is scaled by
// 1 / sqrt(sum(part[0 .. n_part)) / n_in + eps) (rx_norm_scale's order), so y = rmsnorm(h) * nw
// is never written out.
#define GEMV_PLAIN 0
#define GEMV_RESNORM 1
#define GEMV_NORMED 2

template <int TYPE, int TT, int KS, bool XQ = false, int R = GEMV_R, bool XS = false,
          int WARPS = GEMV_WARPS, int EPI = GEMV_PLAIN>
__device__ __forceinline__ void gemv_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                          const uint8_t* __restrict__ w2, const float* __restrict__ x,
                                          float* __restrict__ y0, float* __restrict__ y1,
                                          float* __restrict__ y2, int T, int n_in, int n0, int n1,
                                          int n2, long long row_bytes, int mode,
                                          const float* __restrict__ resid = nullptr,
                                          const float* __restrict__ nw = nullptr,
                                          float* __restrict__ h_out = nullptr,
                                          float* __restrict__ part = nullptr, int n_part = 0,
                                          float eps = 0.0f) {
    static_assert(R % 2 == 0 && R * TT <= 32, "row pairs; a lane an output");
    static_assert(!(XQ && XS) && (!XS || TT == 1), "one x form; staged x: one token");
    static_assert(EPI == GEMV_PLAIN || (TT == 1 && (KS > 1 || XS) && !XQ),
                  "fused norm: one token, on float x KS > 1");
    constexpr int GROUPS = WARPS / KS;
    // a trace build's stamps (bench/phase_trace.py's kinds: 200 + 10 EPI + mode, + 100 for XS)
    RX_TRACE_DECL;
    RX_TRACE_AT(0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = warp / KS, slice = warp % KS;
    const bool swiglu = mode == 1;
    const uint8_t* w;
    float* y;
    int n, row0;
    if (swiglu) {  // gate rows and up rows o .. o + R/2 - 1
        w = w0; y = y0; n = n0;
        row0 = (blockIdx.x * GROUPS + group) * (R / 2);
    } else {
        int b;
        seg_select(w0, w1, w2, y0, y1, y2, n0, n1, n2, GROUPS * R, w, y, n, b, blockIdx.x);
        row0 = (b * GROUPS + group) * R;
    }
    // with KS > 1 or XS, a group past n still joins the block's barriers
    const bool live = row0 < n;
    if (KS == 1 && !XS && !live) return;
    // rows past n read row n - 1 (not stored): one copy of the main loop for both modes
    const uint8_t* rp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (swiglu) {
            rp[r] = (r & 1 ? w1 : w) + (long long)min(row0 + r / 2, n - 1) * row_bytes;
        } else {
            rp[r] = w + (long long)min(row0 + r, n - 1) * row_bytes;
        }
    }
    // The weights are read-only: before the wait for the kernel ahead of this one (which only
    // a programmatic launch makes this overlap), the group's lanes ask the L2 for its rows'
    // bytes, one 128-byte line a lane at a time.
    if (live) {
        const int gl = 32 * slice + lane;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            for (long long b = 128LL * gl; b < row_bytes; b += 128LL * 32 * KS)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[r] + b));
        }
    }
    RX_PDL_ENTRY();
    RX_TRACE_AT(1);
    // GEMV_NORMED: the norm scale. Float x: each storing warp's own, its block sums loaded here
    // and added after the main loop. Staged x: warp 0's, through shared memory, computed while
    // the block stages x (no registers held across the main loop).
    float pv[RX_NORM_PV];
    __shared__ float norm_r;
    if constexpr (EPI == GEMV_NORMED) {
        if ((XS ? warp == 0 : slice == 0 && live)) rx_norm_load(part, n_part, pv);
    }
    float acc[R][TT];
    if constexpr (XQ) {  // x is the x limbs (rx_gemv_rows_xq), T = 1
        rx_gemv_rows_xq<TYPE, R>(rp, (const uint32_t*)x, live ? n_in : 0, 32 * slice + lane,
                                 32 * KS, acc);
    } else if constexpr (XS) {  // x as limbs in the lanes' order, in shared memory
        const uint32_t* xl = rx_stage_x_limbs<TYPE, WARPS * 32, false>(x, n_in);
        if constexpr (EPI == GEMV_NORMED) {
            if (warp == 0) {
                const float r = rx_norm_scale(part, n_part, pv, n_in, eps);
                if (lane == 0) norm_r = r;
            }
        }
        __syncthreads();
        RX_TRACE_AT(2);
        rx_gemv_rows_limbs<TYPE, R>(rp, xl, live ? n_in : 0, 32 * slice + lane, 32 * KS, acc);
    } else {
        rx_gemv_rows<TYPE, TT, R>(rp, x, T, live ? n_in : 0, 32 * slice + lane, 32 * KS, acc);
    }
    RX_TRACE_AT(4);
    gemv_sums<TT, KS, R, WARPS>(acc);
    if constexpr (EPI == GEMV_RESNORM) {
        // lane r < R of a live group's slice 0 holds row row0 + r's product
        __shared__ float gss[GROUPS];
        if (slice == 0 && live) {
            const float s = rx_resnorm_rows<R>(acc, row0, n, resid, nw, h_out, y);
            if (lane == 0) gss[group] = s;
        } else if (slice == 0 && lane == 0) {
            gss[group] = 0.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 0.0f;
#pragma unroll
            for (int g = 0; g < GROUPS; ++g) s += gss[g];
            part[blockIdx.x] = s;
        }
        RX_TRACE_AT(5);
        RX_TRACE_PUT(200 + 10 * EPI + mode + 100 * XS, (unsigned)n_in | ((unsigned)TYPE << 24));
        return;
    } else if constexpr (EPI == GEMV_NORMED) {
        if (slice == 0 && live) {
            const float rn = XS ? norm_r : rx_norm_scale(part, n_part, pv, n_in, eps);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][0] *= rn;
        }
    }
    if (slice == 0 && live) gemv_store<TT>(acc, swiglu, y, T, n, row0);
    RX_TRACE_AT(5);
    RX_TRACE_PUT(200 + 10 * EPI + mode + 100 * XS, (unsigned)n_in | ((unsigned)TYPE << 24));
}

// XS (one token, the K-quants of XS_CHUNK): x as limbs staged in shared memory, as gemv_body's
// XS form (the block's warps write them for each slot whose x differs from the last one's).
// NORMED (XS only): x is the output of a residual-step GEMV (GEMV_RESNORM's y0); as in gemv_body's
// GEMV_NORMED, the sums are scaled by rx_norm_scale(part[0 .. n_part)) before the stores (and the
// SwiGLU), the scale computed by warp 0 while the block stages x.
template <int TYPE, int R = GEMV_R, bool XS = false, bool NORMED = false>
__device__ __forceinline__ void moe_body(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up,
                                         const float* __restrict__ x, const int* __restrict__ ids,
                                         float* __restrict__ y, int T, int k, int n_in, int n_out,
                                         long long row_bytes, long long expert_bytes,
                                         int x_per_expert, int n_expert, int mode,
                                         const float* __restrict__ part = nullptr, int n_part = 0,
                                         float eps = 0.0f) {
    static_assert(!NORMED || XS, "the normed form stages x");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float pv[RX_NORM_PV];
    __shared__ float norm_r;
    if constexpr (NORMED) {
        if (warp == 0) rx_norm_load(part, n_part, pv);
    }
    // mode 0: rows row0 .. row0 + R - 1 of W_e; mode 1: gate_e and up_e rows row0 .. + R/2 - 1
    const int nr = mode == 1 ? R / 2 : R;  // output rows a warp
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * nr;
    const bool live = row0 < n_out;  // XS: a warp past n_out still joins the block's barriers
    if (!XS && !live) return;  // warp-uniform; no block-level sync below
    const int n_slots = T * k;
    int staged = -1;  // XS: the x row whose limbs are in shared memory
    for (int slot = blockIdx.y; slot < n_slots; slot += gridDim.y) {
        const int e = __ldg(ids + slot);  // same for the whole block
        float* ys = y + (long long)slot * n_out;
        const int xrow = x_per_expert ? slot : slot / k;
        const float* xs = x + (long long)xrow * n_in;
        if constexpr (XS) {
            // x is staged before e is used, so that x's loads overlap the load of e (x does not
            // depend on it)
            if (xrow != staged) {
                __syncthreads();  // the last slot's readers are done
                rx_stage_x_limbs<TYPE, GEMV_WARPS * 32, false>(xs, n_in);
                if constexpr (NORMED) {
                    if (warp == 0 && staged < 0) {
                        const float r = rx_norm_scale(part, n_part, pv, n_in, eps);
                        if (lane == 0) norm_r = r;
                    }
                }
                __syncthreads();
                staged = xrow;
            }
        }
        if (e < 0 || e >= n_expert) {
            if (live && lane < nr && row0 + lane < n_out) ys[row0 + lane] = rx_nan();
            continue;
        }
        const long long eo = (long long)e * expert_bytes;
        const uint8_t* rp[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (mode == 1) {
                rp[r] = (r & 1 ? w_up : w) + eo + (long long)min(row0 + r / 2, n_out - 1) * row_bytes;
            } else {
                rp[r] = w + eo + (long long)min(row0 + r, n_out - 1) * row_bytes;
            }
        }
        float acc[R][1];
        if constexpr (XS) {
            rx_gemv_rows_limbs<TYPE, R>(rp, rx_x_staged_words(), live ? n_in : 0, lane, 32, acc);
        } else {
            rx_gemv_rows<TYPE, 1, R>(rp, xs, 1, n_in, lane, 32, acc);
        }
        gemv_sums<1, 1>(acc);
        if constexpr (NORMED) {
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][0] *= norm_r;
        }
        if (live) gemv_store<1>(acc, mode == 1, ys, 1, n_out, row0);
    }
}

// ------------------------------------------------------------------------------------------
// tiled matmul (prefill)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// 3xTF32: v = big + small with both halves TF32 (10-bit mantissa) and big * big + big * small +
// small * big in f32 accumulation loses about what f32 FMA does (small * small, ~2^-22 of the
// product, is dropped) while running on the tensor cores.
__device__ __forceinline__ void rx_tf32_split(float v, uint32_t& big, uint32_t& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(v));
    const float rest = v - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
}

// d (16x8, f32) += a (16x8, tf32, row-major fragment) * b (8x8, tf32, column fragment)
__device__ __forceinline__ void rx_mma_tf32(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#define RX_TILED_MMA 1
#else
#define RX_TILED_MMA 0
#endif

// The weight, output and rows of a tile block (blockIdx.x): mode 0, tile row m is row m0 + m of w
// (n rows; the segment seg_select picks); mode 1, tile rows m < 32 are gate rows m0 + m of w0 and
// rows m >= 32 the same rows of the up weight w1 (n = n0 rows, output y0).
__device__ __forceinline__ void tile_rows(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, float* y0,
                                          float* y1, float* y2, int n0, int n1, int n2, int mode,
                                          const uint8_t*& w, float*& y, int& n, int& m0) {
    if (mode == 1) {
        w = w0; y = y0; n = n0;
        m0 = blockIdx.x * (TILE_M / 2);
    } else {
        int b;
        seg_select(w0, w1, w2, y0, y1, y2, n0, n1, n2, TILE_M, w, y, n, b, blockIdx.x);
        m0 = b * TILE_M;
    }
}

// A tile's outputs from E[token][tile row] (shared memory, complete; BM rows x BN tokens, BM a
// power of two, THREADS threads): mode 0, y[token, m0 + r] = E[nn][r]; mode 1, y[token, m0 + r]
// = silu(E[nn][r]) * E[nn][r + BM / 2] (rows below BM / 2 gate, the rest up). Token nn of the
// tile is y row n0t + nn, or slots[nn] (GATHER). Rows >= n and tokens >= T are left out; a token
// row at a time, so the stores are row-contiguous.
template <bool GATHER, int BM = TILE_M, int BN = TILE_N, int THREADS = TILE_THREADS>
__device__ __forceinline__ void tile_store(const float (*E)[BM + 4], float* __restrict__ y, int T, int n,
                                           int m0, int n0t, int mode, const int* __restrict__ slots) {
    static_assert((BM & (BM - 1)) == 0 && (BM / 2) * BN % THREADS == 0, "whole passes");
    const int tid = threadIdx.x;
    auto y_row = [&](int nn) -> long long {
        return GATHER ? (long long)__ldg(slots + nn) : (long long)(n0t + nn);
    };
    if (mode == 1) {  // output (token nn, row r < BM / 2) = silu(E[nn][r]) * E[nn][r + BM / 2]
#pragma unroll 1
        for (int p = 0; p < (BM / 2) * BN / THREADS; ++p) {
            const int g = tid + p * THREADS;
            const int r = g & (BM / 2 - 1), nn = g / (BM / 2);
            const int row = m0 + r, tok = n0t + nn;
            if (row < n && tok < T) y[y_row(nn) * n + row] = rx_silu_mul(E[nn][r], E[nn][r + BM / 2]);
        }
        return;
    }
#pragma unroll 1
    for (int p = 0; p < BM * BN / THREADS; ++p) {
        const int g = tid + p * THREADS;
        const int r = g & (BM - 1), nn = g / BM;
        const int row = m0 + r, tok = n0t + nn;
        if (row < n && tok < T) y[y_row(nn) * n + row] = E[nn][r];
    }
}

// GATHER (the grouped MoE kernel): the tile's T (<= 64) tokens are slots[0 .. T): token nn
// reads x row slots[nn] / kdiv and writes y row slots[nn]; otherwise token nn of the block is
// blockIdx.y * 64 + nn for both.
template <int TYPE, bool GATHER = false>
__device__ __forceinline__ void tiled_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                           const uint8_t* __restrict__ w2, const float* __restrict__ x,
                                           float* __restrict__ y0, float* __restrict__ y1,
                                           float* __restrict__ y2, int T, int n_in, int n0, int n1,
                                           int n2, long long row_bytes, int mode,
                                           const int* __restrict__ slots = nullptr, int kdiv = 1) {
    typedef rx_q<TYPE> Q;
    // Both tiles row-major (a weight row / a token's k values contiguous), rows padded so that
    // the mma fragments' loads (lane 4g + q reads row g, column q) hit 32 different banks. The
    // epilogue reuses Ws as E[token][tile row].
#if RX_TILED_MMA
    // Tensor cores: each value staged once as its 3xTF32 pair (big, small), so the mma loop only
    // loads fragments (splitting at every fragment load cost 2 cvt + 1 sub per value and warp).
    // K slices of 32 keep the pairs in 37 KB; a lane's 64-bit fragment loads (row g, column q)
    // hit 32 different banks with rows 36 pairs apart.
    constexpr int KT = 32;
    __shared__ __align__(16) uint2 Ws[TILE_M][KT + 4];
    __shared__ __align__(16) uint2 Xs[TILE_N][KT + 4];
    static_assert(sizeof(Ws) >= sizeof(float) * TILE_N * (TILE_M + 4), "the epilogue reuses Ws");
#else
    constexpr int KT = TILE_K;
    static_assert(TILE_M == TILE_K && TILE_N == TILE_K, "square tiles (the epilogue reuses Ws)");
    __shared__ __align__(16) float Ws[TILE_M][TILE_K + 4];
    __shared__ __align__(16) float Xs[TILE_N][TILE_K + 4];
#endif
    const int tid = threadIdx.x;
    const uint8_t* w;
    float* y;
    int n, m0;
    tile_rows(w0, w1, w2, y0, y1, y2, n0, n1, n2, mode, w, y, n, m0);
    const int n0t = GATHER ? 0 : blockIdx.y * TILE_N;
    // the x row of the tile's token nn (< T)
    auto x_row = [&](int nn) -> long long {
        return GATHER ? (long long)(__ldg(slots + nn) / kdiv) : (long long)(n0t + nn);
    };
    const bool xvec = (n_in & 3) == 0 && ((uintptr_t)x & 15u) == 0;
#if RX_TILED_MMA
    // warp w: tile rows 16 (w % 4) .. +16 x tokens 32 (w / 4) .. +32, four m16n8k8 tiles;
    // lane = 4 g + q holds, per token tile j, rows r0 + g (+8) x tokens 8 j + 2 q (+1)
    const int lane = tid & 31, wg = lane >> 2, wq = lane & 3;
    const int wr = 16 * ((tid >> 5) & 3), wt = 32 * (tid >> 7);
    const bool active = n0t + wt < T;
    float acc[4][4];
#else
    const int ty = tid & 15;  // rows ty*4 .. +4 of the tile
    const int tx = tid >> 4;  // tokens tx*4 .. +4 (a warp: tokens 8w .. 8w+8)
    const bool active = n0t + (tid >> 5) * 8 < T;
    float acc[4][4];  // rows ty*4 + i x tokens tx*4 + j
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    // The tiles' values, a thread's share: weight groups g = tid + p * TILE_THREADS (row g / G,
    // k group g % G: each warp reads whole rows' contiguous bytes), x groups likewise by token.
    constexpr int G = KT / 4, PW = TILE_M * G / TILE_THREADS, PX = TILE_N * G / TILE_THREADS;
    float wv[PW][4], xv[PX][4];
    auto load_w = [&](int k0) {
#pragma unroll
        for (int p = 0; p < PW; ++p) {
            const int g = tid + p * TILE_THREADS;
            const int m = g / G, kg = g % G;
            const int row = mode == 1 ? m0 + (m & (TILE_M / 2 - 1)) : m0 + m;
            const uint8_t* wm = mode == 1 && m >= TILE_M / 2 ? w1 : w;
            const int k = k0 + 4 * kg;
            float* v = wv[p];
            v[0] = v[1] = v[2] = v[3] = 0.0f;
            if (row < n && k < n_in) {
                const uint8_t* rp = wm + (long long)row * row_bytes;
                if constexpr (Q::QK == 1) {
                    // float32 (the dequantize-first scratch): float4 loads where aligned
                    if (TYPE == RX_F32 && ((uintptr_t)(rp + 4LL * k) & 15u) == 0 && k + 4 <= n_in) {
                        const float4 f = __ldg((const float4*)(rp + 4LL * k));
                        v[0] = f.x;
                        v[1] = f.y;
                        v[2] = f.z;
                        v[3] = f.w;
                    } else {
#pragma unroll
                        for (int c = 0; c < 4; ++c)
                            if (k + c < n_in) v[c] = Q::dec1(rp, k + c);
                    }
                } else {  // n_in % QK == 0, QK % 32 == 0: a group is all inside or all past the row
                    Q::dec4(rp + (long long)(k / Q::QK) * Q::TS, k % Q::QK, v);
                }
            }
        }
    };
    auto load_x = [&](int k0) {
#pragma unroll
        for (int p = 0; p < PX; ++p) {
            const int g = tid + p * TILE_THREADS;
            const int nn = g / G, kg = g % G;
            const int tok = n0t + nn, k = k0 + 4 * kg;
            float* v = xv[p];
            v[0] = v[1] = v[2] = v[3] = 0.0f;
            if (tok < T) {
                const float* xr = x + x_row(nn) * n_in + k;
                if (xvec && k + 4 <= n_in) {
                    rx_ld_f4(xr, v);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (k + c < n_in) v[c] = __ldg(xr + c);
                }
            }
        }
    };
    // a group of 4 values into a tile: tensor cores, as (big, small) pairs
    auto stage = [&](auto& tile, int r, int kg, const float* v) {
#if RX_TILED_MMA
        uint32_t big[4], small[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) rx_tf32_split(v[c], big[c], small[c]);
        *(uint4*)&tile[r][4 * kg] = make_uint4(big[0], small[0], big[1], small[1]);
        *(uint4*)&tile[r][4 * kg + 2] = make_uint4(big[2], small[2], big[3], small[3]);
#else
        *(float4*)&tile[r][4 * kg] = make_float4(v[0], v[1], v[2], v[3]);
#endif
    };

    // The next slice's values load (float32 and x: into registers, in flight during the math)
    // while the current one's are multiplied.
    load_w(0);
    load_x(0);
    for (int k0 = 0; k0 < n_in; k0 += KT) {
#pragma unroll
        for (int p = 0; p < PW; ++p) {
            const int g = tid + p * TILE_THREADS;
            stage(Ws, g / G, g % G, wv[p]);
        }
#pragma unroll
        for (int p = 0; p < PX; ++p) {
            const int g = tid + p * TILE_THREADS;
            stage(Xs, g / G, g % G, xv[p]);
        }
        __syncthreads();
        if (k0 + KT < n_in) {
            load_w(k0 + KT);
            load_x(k0 + KT);
        }
#if RX_TILED_MMA
        if (active) {
#pragma unroll
            for (int kk = 0; kk < KT; kk += 8) {
                const uint2 a0 = Ws[wr + wg][kk + wq], a1 = Ws[wr + wg + 8][kk + wq];
                const uint2 a2 = Ws[wr + wg][kk + wq + 4], a3 = Ws[wr + wg + 8][kk + wq + 4];
                const uint32_t ab[4] = {a0.x, a1.x, a2.x, a3.x}, as[4] = {a0.y, a1.y, a2.y, a3.y};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint2 b0 = Xs[wt + 8 * j + wg][kk + wq], b1 = Xs[wt + 8 * j + wg][kk + wq + 4];
                    const uint32_t bb[2] = {b0.x, b1.x}, bs[2] = {b0.y, b1.y};
                    rx_mma_tf32(acc[j], as, bb);
                    rx_mma_tf32(acc[j], ab, bs);
                    rx_mma_tf32(acc[j], ab, bb);
                }
            }
        }
#else
        if (active) {
#pragma unroll 8
            for (int kk = 0; kk < KT; ++kk) {
                float av[4], bv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    av[i] = Ws[ty * 4 + i][kk];
                    bv[i] = Xs[tx * 4 + i][kk];
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
        }
#endif
        __syncthreads();
    }
    // E[token][tile row] (reuses Ws: 64 x 68 floats; the loop's last __syncthreads made it
    // free), then written out row-contiguous per token.
    float (*E)[TILE_M + 4] = reinterpret_cast<float (*)[TILE_M + 4]>(&Ws[0][0]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#if RX_TILED_MMA
            E[wt + 8 * i + 2 * wq + (j & 1)][wr + wg + 8 * (j >> 1)] = acc[i][j];
#else
            E[tx * 4 + j][ty * 4 + i] = acc[i][j];
#endif
        }
    __syncthreads();
    tile_store<GATHER>(E, y, T, n, m0, n0t, mode, slots);
}

// The grouped MoE matmul: block (x, tile) runs tile `tile` of reflex_moe_schedule's schedule (an
// expert e and up to 64 of its slots) as the tiled kernel over W_e (mode 1: gate_e and up_e).
// Blocks past the schedule's tile count return at once.
template <int TYPE>
__device__ __forceinline__ void moe_tiled_body(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up,
                                               const float* __restrict__ x, const int* __restrict__ order,
                                               const int* __restrict__ tiles, const int* __restrict__ n_tiles,
                                               float* __restrict__ y, int k, int n_in, int n_out,
                                               long long row_bytes, long long expert_bytes,
                                               int x_per_expert, int mode) {
    const int tile = blockIdx.y;
    if (tile >= __ldg(n_tiles)) return;  // the whole block: before any barrier
    const int e = __ldg(tiles + 3 * tile), first = __ldg(tiles + 3 * tile + 1);
    const int count = __ldg(tiles + 3 * tile + 2);
    const long long eo = (long long)e * expert_bytes;
    tiled_body<TYPE, true>(w + eo, mode == 1 ? w_up + eo : nullptr, nullptr, x, y, nullptr, nullptr,
                           count, n_in, n_out, 0, 0, row_bytes, mode, order + first,
                           x_per_expert ? 1 : k);
}

// ------------------------------------------------------------------------------------------
// the prefill matmul of the integer weight types on x halves (xh): float16 tensor-core products

// Four signed bytes (a word of rx_qi<T>::ints) as two float16 pairs, exactly: each byte + 128 as
// the low bits of 1024's float16 (0x6400 | u = 1024 + u), then 1152 off.
__device__ __forceinline__ void rx_i8x4_to_f16x4(uint32_t w, uint32_t& p01, uint32_t& p23) {
    const uint32_t u = w ^ 0x80808080u;
    uint32_t a = __byte_perm(u, 0x64646464u, 0x5140u), b = __byte_perm(u, 0x64646464u, 0x7362u);
    asm("sub.f16x2 %0, %0, %1;" : "+r"(a) : "r"(0x64806480u));
    asm("sub.f16x2 %0, %0, %1;" : "+r"(b) : "r"(0x64806480u));
    p01 = a;
    p23 = b;
}

#if RX_TILED_MMA
// The x-halves tiles' A fragments of weight rows r0 and r0 + 8 (per half h of the block: k 2q..,
// 2q + 8.. of lane group wq) from W, the block's weight tile (float16 q pairs, row-major, halves
// swizzled by row).
__device__ __forceinline__ void xh_frag_a(const uint32_t (*__restrict__ W)[16], int r0, int wq,
                                          uint32_t (&a)[2][4]) {
    const int r1 = r0 + 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint2 lo = *reinterpret_cast<const uint2*>(&W[r0][8 * (h ^ ((r0 >> 1) & 1)) + 2 * wq]);
        const uint2 hi = *reinterpret_cast<const uint2*>(&W[r1][8 * (h ^ ((r1 >> 1) & 1)) + 2 * wq]);
        a[h][0] = lo.x;
        a[h][1] = hi.x;
        a[h][2] = lo.y;
        a[h][3] = hi.y;
    }
}

// One m16n8 fragment's products of a 32-element block: per sub-block, the m16n8k16 products of q
// (a) with hi and with lo (b: per half, b0, b1 of hi, then of lo) chained into one f32 fragment
// D, then acc += a_sb * D (rows g: e < 2, g + 8) and, with a min, + c_sb * the tokens' block sums
// of x / s (xs, tokens 2q + e % 2).
template <int NS, bool MIN>
__device__ __forceinline__ void xh_frag_products(const uint32_t (&a)[2][4], const float2 (&ws)[NS][2],
                                                 const uint4 (&b)[2], const float (&xs)[2],
                                                 float (&acc)[4]) {
#pragma unroll
    for (int sb = 0; sb < NS; ++sb) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int h = sb * 2 / NS; h < (sb + 1) * 2 / NS; ++h) {
            rx_mma_f16(d, a[h], b[h].x, b[h].y);
            rx_mma_f16(d, a[h], b[h].z, b[h].w);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            acc[e] = fmaf(ws[sb][e >> 1].x, d[e], acc[e]);
            if constexpr (MIN) acc[e] = fmaf(ws[sb][e >> 1].y, xs[e & 1], acc[e]);
        }
    }
}

// One 32-element block of the x-halves tiles' products, for a warp's 16 rows (wr + g, + 8) and
// 32 tokens (wt + ..): W the block's weight tile, WS its (a, c) per sub-block and row, X its x
// tile (hi and lo halves, swizzled by token), XS the tokens' block sums of x / s (MIN).
template <int NS, bool MIN>
__device__ __forceinline__ void xh_block_products(const uint32_t (*__restrict__ W)[16],
                                                  const float2 (*__restrict__ WS)[TILE_M],
                                                  const uint32_t (*__restrict__ X)[32],
                                                  const float* __restrict__ XS, int wr, int wt,
                                                  int wg, int wq, float (&acc)[4][4]) {
    uint32_t a[2][4];
    xh_frag_a(W, wr + wg, wq, a);
    float2 ws[NS][2];
#pragma unroll
    for (int h = 0; h < NS; ++h) {
        ws[h][0] = WS[h][wr + wg];
        ws[h][1] = WS[h][wr + wg + 8];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int tk = wt + 8 * j + wg;
        uint4 b[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) b[h] = *reinterpret_cast<const uint4*>(&X[tk][16 * (h ^ (tk & 1)) + 4 * wq]);
        float xs[2] = {0.0f, 0.0f};
        if constexpr (MIN) {
            const float2 v = *reinterpret_cast<const float2*>(&XS[wt + 8 * j + 2 * wq]);
            xs[0] = v.x;
            xs[1] = v.y;
        }
        xh_frag_products<NS, MIN>(a, ws, b, xs, acc[j]);
    }
}
#endif

// The tiled matmul's products (same segments, modes, tile of 64 rows x 64 tokens, warps and
// epilogue as tiled_body) from the weights' integer view (rx_qi<TYPE>) and x as halves
// (reflex_x_halves: H, then the rows' scales s and the blocks' sums). Per K slice of KB blocks of
// 32: each weight word's four small integers become float16 (exact) in shared memory with their
// sub-block's (a, c); x's half words are copied there. Per block, per 8 tokens and per sub-block
// of SUB elements, each warp chains the m16n8k16 products of q with hi and with lo into one f32
// fragment D (the integers and halves are exact and the tensor cores add in f32), then adds
// a * D + c * (the block's sum of x / s) to its accumulators; the epilogue multiplies by s. So
// each output is the dot product of the weights with x to about 22 bits a value, summed in f32,
// from 4.25-8.5 bits a weight instead of a float32 copy, and one FMA (two with a min) a block.
template <int TYPE, bool GATHER = false>
__device__ __forceinline__ void xh_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                        const uint8_t* __restrict__ w2, const uint32_t* __restrict__ H,
                                        float* __restrict__ y0, float* __restrict__ y1,
                                        float* __restrict__ y2, int T, int n_in, int n0, int n1, int n2,
                                        long long row_bytes, int mode, long long x_rows,
                                        const int* __restrict__ slots = nullptr, int kdiv = 1) {
#if RX_TILED_MMA
    typedef rx_q<TYPE> Q;
    typedef rx_qi<TYPE> I;
    constexpr int KB = 2;                                  // blocks of 32 per K slice
    constexpr int NS = 32 / I::SUB;                        // sub-blocks per block
    constexpr int PW = TILE_M * KB * 8 / TILE_THREADS;     // weight words a thread loads
    constexpr int NWS = TILE_M * KB * NS;                  // weight scales per slice
    constexpr int PX = TILE_N * KB * 8 / TILE_THREADS;     // 16-byte pieces of x a thread loads
    constexpr int NXS = TILE_N * KB;                       // x block sums per slice
    static_assert(PW * TILE_THREADS == TILE_M * KB * 8 && PX * TILE_THREADS == TILE_N * KB * 8, "");
    static_assert(NWS <= TILE_THREADS && NXS <= TILE_THREADS, "one scale a thread");
    // A row (of weights or of a token's x) per block is 16 words: two 8-word halves of the
    // block's k (half h: the words of lane groups q = 0..3, each 2 words: a0/a2 or b0/b1, hi
    // then lo for x, which takes 4 words a group and so 32 words a block). Half h of row r sits
    // at slot h ^ (r >> 1 & 1) (weights) or h ^ (r & 1) (x): the 16 lanes of a 64-bit (the 8 of a
    // 128-bit) fragment load then cover 32 banks.
    struct Tiles {
        uint32_t w[KB][TILE_M][16];
        float2 ws[KB][NS][TILE_M];
        uint32_t x[2][KB][TILE_N][32];  // two slices: the next one copies in during the math
        float xs[2][KB][TILE_N];
    };
    constexpr size_t E_BYTES = sizeof(float) * TILE_N * (TILE_M + 4);
    __shared__ __align__(16) unsigned char smem[sizeof(Tiles) > E_BYTES ? sizeof(Tiles) : E_BYTES];
    Tiles& sm = *reinterpret_cast<Tiles*>(smem);

    const int tid = threadIdx.x;
    const uint8_t* w;
    float* y;
    int n, m0;
    tile_rows(w0, w1, w2, y0, y1, y2, n0, n1, n2, mode, w, y, n, m0);
    const int n0t = GATHER ? 0 : blockIdx.y * TILE_N;
    const int nb = n_in >> 5;
    const float* __restrict__ S = reinterpret_cast<const float*>(H + x_rows * n_in);
    const float* __restrict__ XS = S + x_rows;
    auto x_row = [&](int nn) -> long long {
        return GATHER ? (long long)(__ldg(slots + nn) / kdiv) : (long long)(n0t + nn);
    };
    auto tok_ok = [&](int nn) -> bool { return (GATHER ? nn : n0t + nn) < T; };
    auto w_row = [&](int m, const uint8_t*& rp) -> bool {  // tile row m's bytes, false past n
        const int row = mode == 1 ? m0 + (m & (TILE_M / 2 - 1)) : m0 + m;
        rp = (mode == 1 && m >= TILE_M / 2 ? w1 : w) + (long long)row * row_bytes;
        return row < n;
    };
    const int lane = tid & 31, wg = lane >> 2, wq = lane & 3;
    const int wr = 16 * ((tid >> 5) & 3), wt = 32 * (tid >> 7);
    const bool active = n0t + wt < T;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    // A thread's loads of a slice, in flight during the previous slice's math: into registers,
    // weight word g = tid + 256 p (row g / 16, block (g / 8) % 2, word g % 8: a warp reads two
    // rows' contiguous bytes) and one (a, c); copied straight into shared memory (buffer `buf`),
    // x piece g (token g / 16: 256 contiguous bytes a token, piece i = g % 8 to half i / 4, lane
    // group i % 4) and one x block sum.
    uint32_t wv[PW];
    float2 wsv = make_float2(0.0f, 0.0f);
    auto load = [&](int kb0, int buf) {
#pragma unroll
        for (int p = 0; p < PW; ++p) {
            const int g = tid + p * TILE_THREADS, m = g / (KB * 8), kb = kb0 + (g / 8) % KB;
            const uint8_t* rp;
            wv[p] = 0;
            if (w_row(m, rp) && kb < nb) {
                const int k = 32 * kb + 4 * (g % 8);
                wv[p] = I::ints(rp + (long long)(k / Q::QK) * Q::TS, k % Q::QK);
            }
        }
        if (tid < NWS) {
            const int m = tid % TILE_M, kb = kb0 + tid / (TILE_M * NS), h = (tid / TILE_M) % NS;
            const uint8_t* rp;
            wsv = make_float2(0.0f, 0.0f);
            if (w_row(m, rp) && kb < nb) {
                const int k = 32 * kb + I::SUB * h;
                wsv = I::scale(rp + (long long)(k / Q::QK) * Q::TS, k % Q::QK);
            }
        }
#pragma unroll
        for (int p = 0; p < PX; ++p) {
            const int g = tid + p * TILE_THREADS, nn = g / (KB * 8), kl = (g / 8) % KB, kb = kb0 + kl, i = g % 8;
            const bool ok = tok_ok(nn) && kb < nb;
            rx_cp_async16(&sm.x[buf][kl][nn][16 * ((i >> 2) ^ (nn & 1)) + 4 * (i & 3)],
                          ok ? (const void*)(H + (x_row(nn) * nb + kb) * 32 + 4 * i) : (const void*)H, ok);
        }
        if (I::MIN && tid < NXS) {
            const int nn = tid % TILE_N, kl = tid / TILE_N, kb = kb0 + kl;
            const bool ok = tok_ok(nn) && kb < nb;
            rx_cp_async4(&sm.xs[buf][kl][nn], ok ? (const void*)(XS + x_row(nn) * nb + kb) : (const void*)XS, ok);
        }
        rx_cp_async_commit();
    };

    load(0, 0);
    for (int kb0 = 0, buf = 0; kb0 < nb; kb0 += KB, buf ^= 1) {
#pragma unroll
        for (int p = 0; p < PW; ++p) {
            // word j = elements 4j..4j+3 of the block: half h = j / 4; its pairs (4j, 4j+1) and
            // (4j+2, 4j+3) are a0 (j % 4 < 2) or a2 of lane groups q = 2 (j % 2) and +1
            const int g = tid + p * TILE_THREADS, j = g % 8, m = g / (KB * 8), kb = (g / 8) % KB;
            const int h = j >> 2, part = (j >> 1) & 1, q = 2 * (j & 1);
            uint32_t* row = &sm.w[kb][m][8 * (h ^ ((m >> 1) & 1))];
            uint32_t p01, p23;
            rx_i8x4_to_f16x4(wv[p], p01, p23);
            row[2 * q + part] = p01;
            row[2 * q + 2 + part] = p23;
        }
        if (tid < NWS) sm.ws[tid / (TILE_M * NS)][(tid / TILE_M) % NS][tid % TILE_M] = wsv;
        asm volatile("cp.async.wait_group 0;\n" ::);  // this thread's copies of the slice
        __syncthreads();
        if (kb0 + KB < nb) load(kb0 + KB, buf ^ 1);
        if (active) {
#pragma unroll
            for (int kb = 0; kb < KB; ++kb)
                xh_block_products<NS, I::MIN>(sm.w[kb], sm.ws[kb], sm.x[buf][kb], sm.xs[buf][kb], wr,
                                              wt, wg, wq, acc);
        }
        __syncthreads();
    }
    float (*E)[TILE_M + 4] = reinterpret_cast<float (*)[TILE_M + 4]>(smem);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t0 = wt + 8 * i + 2 * wq;  // tokens t0, t0 + 1: their rows' scales s
        const float s0 = tok_ok(t0) ? __ldg(S + x_row(t0)) : 0.0f;
        const float s1 = tok_ok(t0 + 1) ? __ldg(S + x_row(t0 + 1)) : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) E[t0 + (j & 1)][wr + wg + 8 * (j >> 1)] = acc[i][j] * (j & 1 ? s1 : s0);
    }
    __syncthreads();
    tile_store<GATHER>(E, y, T, n, m0, n0t, mode, slots);
#endif
}

// ------------------------------------------------------------------------------------------
// the prefill GEMM on float16 pairs (f16x3, f16x1)

// A weight as float16 pairs (reflex_unpack_pairs_<t>), at `out`: the hi plane [n_rows][n_in]
// halves, the rows' scales [n_rows] floats at byte 2 n_rows n_in, and (lo_off > 0) the lo plane
// [n_rows][n_in] halves at byte lo_off (quant_ops.pairs_lo_offset: after the scales, 256-aligned).
// Row r's values w (decoded exactly, rx_q::dec4 / dec1) get reflex_x_pairs' rule: the power-of-two
// scale s of the row's largest |w| (rx_pow2_scale), v = w / s, hi = half(v), lo = half(v - hi);
// a row with a NaN or inf: s = NaN and zeros. Every type has it (the decode is the dequant's).
// A row takes a team of `team` threads (32, 64, 128 or 256: quant_ops.unpack_pairs picks it so
// that a launch of few rows still keeps the GPU's threads busy), 256 / team rows a block, the
// blocks striding over the rows. The team decodes its row twice, once for the largest |w| and
// once for the pairs (the second reading hits the caches): no values held in registers between
// the two, so 2048 threads an SM fit, the row's loads spread over them. A thread takes 8
// consecutive values at a time (two decodes that share their block's header loads, one 16-byte
// store a plane).
#define PAIRS_UNPACK_THREADS 256
template <int TYPE>
__device__ __forceinline__ void unpack_pairs_body(const uint8_t* __restrict__ w, uint16_t* __restrict__ out,
                                                  int n_rows, int n_in, long long row_bytes,
                                                  long long lo_off, int team) {
    typedef rx_q<TYPE> Q;
    __shared__ int red[PAIRS_UNPACK_THREADS / 32];
    const int tid = threadIdx.x, n8 = n_in >> 3;  // a thread takes 8 values (n_in % 32 == 0)
    const int teams = PAIRS_UNPACK_THREADS / team, me = tid % team, warps = team >> 5;
    float* scales = reinterpret_cast<float*>(out + (long long)n_rows * n_in);
    // values k .. k + 7 of row wr (two decodes of 4: a block's header loads serve both)
    auto dec8 = [&](const uint8_t* wr, int k, float (&v)[8]) {
        float(&a)[4] = *reinterpret_cast<float(*)[4]>(v);
        float(&b)[4] = *reinterpret_cast<float(*)[4]>(v + 4);
        if constexpr (Q::QK == 1) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                a[c] = Q::dec1(wr, k + c);
                b[c] = Q::dec1(wr, k + 4 + c);
            }
        } else {
            Q::dec4(wr + (k / Q::QK) * Q::TS, k % Q::QK, a);
            Q::dec4(wr + ((k + 4) / Q::QK) * Q::TS, (k + 4) % Q::QK, b);
        }
    };
    // every block runs the same number of rounds (the team reduction synchronizes the block)
    for (int base = blockIdx.x * teams; base < n_rows; base += gridDim.x * teams) {
        const int r = base + tid / team;
        const bool live = r < n_rows;
        const uint8_t* wr = w + (long long)(live ? r : 0) * row_bytes;
        int mb = 0;
        if (live) {
#pragma unroll 2
            for (int g = me; g < n8; g += team) {
                float v[8];
                dec8(wr, 8 * g, v);
#pragma unroll
                for (int c = 0; c < 8; ++c) mb = max(mb, __float_as_int(v[c]) & 0x7fffffff);
            }
        }
        mb = rx_warp_max(mb);
        if (warps > 1) {
            if ((tid & 31) == 0) red[tid >> 5] = mb;
            __syncthreads();
            const int w0 = (tid >> 5) / warps * warps;
            for (int i = 0; i < warps; ++i) mb = max(mb, red[w0 + i]);
            __syncthreads();  // red is the next round's
        }
        if (!live) continue;
        float s, inv;
        const bool finite = rx_pow2_scale((uint32_t)mb, s, inv);
        if (me == 0) scales[r] = s;
        uint4* hi = reinterpret_cast<uint4*>(out + (long long)r * n_in);
        uint4* lo = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(out) + lo_off) + (long long)r * n8;
#pragma unroll 2
        for (int g = me; g < n8; g += team) {
            float v[8];
            dec8(wr, 8 * g, v);
            uint32_t h[4], l[4];  // a non-finite row: zeros (0 * inf would be NaN)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                rx_split_f16x2(finite ? v[2 * c] * inv : 0.0f, finite ? v[2 * c + 1] * inv : 0.0f, h[c], l[c]);
            hi[g] = make_uint4(h[0], h[1], h[2], h[3]);
            if (lo_off) lo[g] = make_uint4(l[0], l[1], l[2], l[3]);
        }
    }
}

// The prefill GEMM on float16 pairs: y[t, o] = s_o s_t sum_k (Wh Xh + Wh Xl + Wl Xh) for TERMS 3
// (about float32's accuracy: the dropped Wl Xl is ~2^-22 of each product), Wh Xh alone for
// TERMS 1 (each operand rounded to float16: 2^-11 relative). W: weights unpacked by
// reflex_unpack_pairs_<t> (w0..w2 point at each weight's pairs; segments and SwiGLU as
// reflex_matmul_xh_<t>: tile rows below BM / 2 are gate rows); X: reflex_x_pairs of the T rows.
// The products run as m16n8k16 mma in f32, K in slices of 32: per slice every tile row's 64
// bytes (a plane) are copied in with cp.async, ST slices ahead of the math, chunk c of row m at
// c ^ ((m >> 1) & 3) so that ldmatrix's 8 rows hit distinct banks; fragments come by ldmatrix.
// Nothing is decoded in the loop: the weights' scales are the rows' s (every other scale is
// inside the pairs). Built for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL), the products are warpgroup MMA
// on the same tiles instead (a warpgroup 64 tile rows and every token; the chunk swizzle above is
// wgmma's 64-byte swizzle), the sums in the same order: the same bits. A block takes BM rows x BN tokens with WM x WN warps; the grid is
// one-dimensional, row tiles in groups of GROUP varying fastest, so that the blocks running
// together share their weight tiles and read x once a group. Each output's sums
// run in the same order whatever the tile shape or segment, so every form and launch gives the
// same bits. Dynamic shared memory (quant_ops.pairs_smem_bytes): the ST slices' tiles, or the
// epilogue's E [BN][BM + 4] floats and the BM rows' and BN tokens' scales, whichever is larger.
template <int TERMS, int BM, int BN, int WM, int WN, int ST, int GROUP>
__device__ __forceinline__ void pairs_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                           const uint8_t* __restrict__ w2, const uint16_t* __restrict__ X,
                                           float* __restrict__ y0, float* __restrict__ y1,
                                           float* __restrict__ y2, int T, int n_in, int n0, int n1,
                                           int n2, int mode) {
#if RX_TILED_MMA
    constexpr int THREADS = 32 * WM * WN, P = TERMS == 1 ? 1 : 2;
    constexpr int MT = BM / WM / 16, NT = BN / WN / 8;
    constexpr int CA = BM * 4 / THREADS, CB = BN * 4 / THREADS;  // 16-byte copies a thread and plane
    static_assert(MT * 16 * WM == BM && NT * 8 * WN == BN && NT % 2 == 0, "whole fragments");
    static_assert(CA * THREADS == BM * 4 && CB * THREADS == BN * 4, "whole copies");
    struct Tiles {
        uint4 a[ST][P][BM][4];
        uint4 b[ST][P][BN][4];
    };
    extern __shared__ uint4 rx_pairs_smem[];
    Tiles& sm = *reinterpret_cast<Tiles*>(rx_pairs_smem);

    const int tid = threadIdx.x;
    const int n_rt = mode == 1 ? (n0 + BM / 2 - 1) / (BM / 2)
                               : (n0 + BM - 1) / BM + (n1 + BM - 1) / BM + (n2 + BM - 1) / BM;
    const int n_tt = (T + BN - 1) / BN;
    const int grp = blockIdx.x / (GROUP * n_tt), first = grp * GROUP;
    const int gsz = min(GROUP, n_rt - first), idx = blockIdx.x - grp * GROUP * n_tt;
    const int rt = first + idx % gsz, n0t = (idx / gsz) * BN;
    const uint8_t* w;
    float* y;
    int n, m0;
    if (mode == 1) {
        w = w0; y = y0; n = n0;
        m0 = rt * (BM / 2);
    } else {
        int b;
        seg_select(w0, w1, w2, y0, y1, y2, n0, n1, n2, BM, w, y, n, b, rt);
        m0 = b * BM;
    }
    const int nb = n_in >> 5;
    const long long plane = 2LL * n * n_in;  // bytes of a weight's hi plane (gate, up: n rows each)
    const long long lo_off = plane + ((4LL * n + 255) & ~255LL);
    auto row_of = [&](int m, const uint8_t*& base) -> int {  // tile row m: its weight and row
        base = mode == 1 && m >= BM / 2 ? w1 : w;
        return mode == 1 ? m0 + (m & (BM / 2 - 1)) : m0 + m;
    };
    // this thread's copies, i = tid + THREADS p: weight row i / 4 and x token i / 4, chunk i % 4
    const uint8_t* ap[CA];
    bool a_ok[CA];
#pragma unroll
    for (int p = 0; p < CA; ++p) {
        const int i = tid + THREADS * p;
        const uint8_t* base;
        const int row = row_of(i >> 2, base);
        a_ok[p] = row < n;
        ap[p] = base + 2LL * (a_ok[p] ? row : 0) * n_in + 16 * (i & 3);
    }
    const uint16_t* bp[CB];
    bool b_ok[CB];
#pragma unroll
    for (int p = 0; p < CB; ++p) {
        const int i = tid + THREADS * p, tok = n0t + (i >> 2);
        b_ok[p] = tok < T;
        bp[p] = X + (long long)(b_ok[p] ? tok : 0) * n_in + 8 * (i & 3);
    }
    const long long x_lo = (long long)T * n_in;  // halves from a hi to its lo
    auto load = [&](int kb, int st) {
        if (kb < nb) {
#pragma unroll
            for (int p = 0; p < CA; ++p) {
                const int i = tid + THREADS * p, m = i >> 2, c = (i & 3) ^ ((m >> 1) & 3);
                rx_cp_async16(&sm.a[st][0][m][c], ap[p] + 64LL * kb, a_ok[p]);
                if constexpr (P == 2) rx_cp_async16(&sm.a[st][1][m][c], ap[p] + lo_off + 64LL * kb, a_ok[p]);
            }
#pragma unroll
            for (int p = 0; p < CB; ++p) {
                const int i = tid + THREADS * p, nn = i >> 2, c = (i & 3) ^ ((nn >> 1) & 3);
                rx_cp_async16(&sm.b[st][0][nn][c], bp[p] + 32LL * kb, b_ok[p]);
                if constexpr (P == 2) rx_cp_async16(&sm.b[st][1][nn][c], bp[p] + x_lo + 32LL * kb, b_ok[p]);
            }
        }
        rx_cp_async_commit();
    };

    const int lane = tid & 31, warp = tid >> 5;
    const int wr = (warp % WM) * (BM / WM), wt = (warp / WM) * (BN / WN);
    const bool active = n0t + wt < T;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // sm_90a: the same products as warpgroup MMA on the same tiles (they are the 64-byte
    // swizzle's layout), warpgroup w taking tile rows 64 w .. 64 w + 63 and every token; each
    // output's sums run in the same order (hh, hl, lh a k step of 16), so the bits are the same
    constexpr bool WG = THREADS == 2 * BM && BM == BN && (BM == 128 || BM == 64);
    float d[WG ? BN / 2 : 1] = {};
#else
    constexpr bool WG = false;
#endif
    float acc[WG ? 1 : MT][WG ? 1 : NT][4] = {};
#pragma unroll
    for (int st = 0; st < ST - 1; ++st) load(st, st);
    for (int kb = 0; kb < nb; ++kb) {
        const int st = kb % ST;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));  // this thread's copies of kb
        __syncthreads();  // everyone's; and stage (kb - 1) % ST is free again
        load(kb + ST - 1, (kb + ST - 1) % ST);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (WG) {
            const int wg = warp >> 2;
            rx_wg_fence();
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const uint64_t ah = rx_wg_desc64((const uint8_t*)&sm.a[st][0][64 * wg][0] + 32 * ks);
                const uint64_t bh = rx_wg_desc64((const uint8_t*)&sm.b[st][0][0][0] + 32 * ks);
                rx_wg_mma<BN>(d, ah, bh);
                if constexpr (TERMS == 3) {
                    rx_wg_mma<BN>(d, ah, rx_wg_desc64((const uint8_t*)&sm.b[st][1][0][0] + 32 * ks));
                    rx_wg_mma<BN>(d, rx_wg_desc64((const uint8_t*)&sm.a[st][1][64 * wg][0] + 32 * ks), bh);
                }
            }
            rx_wg_commit_wait();
            continue;
        }
#endif
        if (!active) continue;
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            uint32_t b[P][NT][2];
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                const int tok = wt + 16 * jp + (lane & 7) + 8 * (lane >> 4);
                const int c = (2 * ks + ((lane >> 3) & 1)) ^ ((tok >> 1) & 3);
#pragma unroll
                for (int pl = 0; pl < P; ++pl) {
                    uint32_t r[4];
                    rx_ldsm_x4(r, reinterpret_cast<const uint16_t*>(&sm.b[st][pl][tok][c]));
                    b[pl][2 * jp][0] = r[0];
                    b[pl][2 * jp][1] = r[1];
                    b[pl][2 * jp + 1][0] = r[2];
                    b[pl][2 * jp + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int row = wr + 16 * i + (lane & 15);
                const int c = (2 * ks + (lane >> 4)) ^ ((row >> 1) & 3);
                uint32_t a[P][4];
#pragma unroll
                for (int pl = 0; pl < P; ++pl) rx_ldsm_x4(a[pl], reinterpret_cast<const uint16_t*>(&sm.a[st][pl][row][c]));
#pragma unroll
                for (int j = 0; j < NT; ++j) rx_mma_f16(acc[i][j], a[0], b[0][j][0], b[0][j][1]);
                if constexpr (TERMS == 3) {
#pragma unroll
                    for (int j = 0; j < NT; ++j) rx_mma_f16(acc[i][j], a[0], b[1][j][0], b[1][j][1]);
#pragma unroll
                    for (int j = 0; j < NT; ++j) rx_mma_f16(acc[i][j], a[1], b[0][j][0], b[0][j][1]);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();  // the tiles' memory becomes the epilogue's: E, then the rows' and tokens' scales
    float (*E)[BM + 4] = reinterpret_cast<float (*)[BM + 4]>(rx_pairs_smem);
    float* rs = reinterpret_cast<float*>(rx_pairs_smem) + BN * (BM + 4);
    float* ts = rs + BM;
    const float* XS = reinterpret_cast<const float*>(X + 2LL * T * n_in);
    for (int m = tid; m < BM; m += THREADS) {
        const uint8_t* base;
        const int row = row_of(m, base);
        rs[m] = row < n ? reinterpret_cast<const float*>(base + plane)[row] : 0.0f;
    }
    for (int nn = tid; nn < BN; nn += THREADS) ts[nn] = n0t + nn < T ? XS[n0t + nn] : 0.0f;
    __syncthreads();
    const int g = lane >> 2, q = lane & 3;
    if constexpr (WG) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        const int r0 = 64 * (warp >> 2) + 16 * (warp & 3) + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + 8 * (e >> 1), t = 8 * j + 2 * q + (e & 1);
                E[t][r] = d[4 * j + e] * rs[r] * ts[t];
            }
#endif
    } else {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = wr + 16 * i + g + 8 * (e >> 1), t = wt + 8 * j + 2 * q + (e & 1);
                    E[t][r] = acc[i][j][e] * rs[r] * ts[t];
                }
    }
    __syncthreads();
    tile_store<false, BM, BN, THREADS>(E, y, T, n, m0, n0t, mode, nullptr);
#endif
}

// ------------------------------------------------------------------------------------------
// extern "C" entry points, one set per type

#define RX_MM_PARAMS                                                                                  \
    const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1, const uint8_t *__restrict__ w2,   \
        const float *__restrict__ x, float *__restrict__ y0, float *__restrict__ y1,                  \
        float *__restrict__ y2, int T, int n_in, int n0, int n1, int n2, long long row_bytes, int mode
#define RX_MM_ARGS w0, w1, w2, x, y0, y1, y2, T, n_in, n0, n1, n2, row_bytes, mode
#define RX_MOE_PARAMS                                                                                 \
    const uint8_t *__restrict__ w, const uint8_t *__restrict__ w_up, const float *__restrict__ x,     \
        const int *__restrict__ ids, float *__restrict__ y, int T, int k, int n_in, int n_out,        \
        long long row_bytes, long long expert_bytes, int x_per_expert, int n_expert, int mode
#define RX_MOE_ARGS w, w_up, x, ids, y, T, k, n_in, n_out, row_bytes, expert_bytes, x_per_expert, n_expert, mode

#define RX_QUANT_KERNELS(name, TYPE)                                                                  \
    extern "C" __global__ void __launch_bounds__(DQ_THREADS)                                          \
        reflex_dequant_##name(const uint8_t* __restrict__ w, float* __restrict__ out, long long n) { \
        RX_PDL_ENTRY();                                                                              \
        dequant_body<TYPE>(w, out, n);                                                                \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(PAIRS_UNPACK_THREADS)                                \
        reflex_unpack_pairs_##name(const uint8_t* __restrict__ w, uint16_t* __restrict__ out,          \
                                   int n_rows, int n_in, long long row_bytes, long long lo_off,      \
                                   int team) {                                                       \
        RX_PDL_ENTRY();                                                                              \
        unpack_pairs_body<TYPE>(w, out, n_rows, n_in, row_bytes, lo_off, team);                       \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(EMB_THREADS)                                         \
        reflex_embed_##name(const uint8_t* __restrict__ w, const int* __restrict__ ids,               \
                            float* __restrict__ out, int n_tokens, int n_embd, long long row_bytes,   \
                            int n_rows, const float* __restrict__ nw, float* __restrict__ y,          \
                            float* __restrict__ part) {                                               \
        RX_PDL_ENTRY();                                                                              \
        embed_body<TYPE>(w, ids, out, n_tokens, n_embd, row_bytes, n_rows, nw, y, part);              \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv1_##name(RX_MM_PARAMS) {                                                   \
        gemv_body<TYPE, 1, 1>(RX_MM_ARGS);                                           \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv2_##name(RX_MM_PARAMS) {                                                   \
        gemv_body<TYPE, 2, 1>(RX_MM_ARGS);                                           \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv4_##name(RX_MM_PARAMS) {                                                   \
        gemv_body<TYPE, 4, 1>(RX_MM_ARGS);                                           \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv8_##name(RX_MM_PARAMS) {                                                   \
        gemv_body<TYPE, 8, 1>(RX_MM_ARGS);                                           \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv1s_##name(RX_MM_PARAMS) {                                                  \
        gemv_body<TYPE, 1, 2>(RX_MM_ARGS);                                           \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv1ws_##name(RX_MM_PARAMS) {                                                 \
        gemv_body<TYPE, 1, 2, false, 4>(RX_MM_ARGS);                                                  \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)                                     \
        reflex_matmul_tiled_##name(RX_MM_PARAMS) {                                                   \
        RX_PDL_ENTRY();                                                                              \
        tiled_body<TYPE>(RX_MM_ARGS);                                                               \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 4)                                  \
        reflex_moe_matmul_##name(RX_MOE_PARAMS) {                                                    \
        RX_PDL_ENTRY();                                                                              \
        moe_body<TYPE, 4>(RX_MOE_ARGS);                                                               \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)                                     \
        reflex_moe_tiled_##name(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up,      \
                                const float* __restrict__ x, const int* __restrict__ order,           \
                                const int* __restrict__ tiles, const int* __restrict__ n_tiles,       \
                                float* __restrict__ y, int k, int n_in, int n_out,                    \
                                long long row_bytes, long long expert_bytes, int x_per_expert,        \
                                int mode) {                                                          \
        RX_PDL_ENTRY();                                                                              \
        moe_tiled_body<TYPE>(w, w_up, x, order, tiles, n_tiles, y, k, n_in, n_out, row_bytes,         \
                             expert_bytes, x_per_expert, mode);                                       \
    }

// The prefill matmul on x halves (xh_body) for the types with an integer view (rx_qi): x points at
// reflex_x_halves' output for the T rows of x (the halves, the scales, the block sums); otherwise
// as reflex_matmul_tiled_<t>. reflex_moe_xh_<t>: reflex_moe_tiled_<t> on x halves, whose x rows
// (x_rows: T, or T * k when x_per_expert) reflex_x_halves wrote. Need n_in % 32 == 0 (every such
// type's rows are whole blocks).
#define RX_QUANT_XH_KERNELS(name, TYPE)                                                               \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)                                     \
        reflex_matmul_xh_##name(RX_MM_PARAMS) {                                                      \
        RX_PDL_ENTRY();                                                                              \
        xh_body<TYPE>(w0, w1, w2, reinterpret_cast<const uint32_t*>(x), y0, y1, y2, T, n_in, n0, n1,  \
                      n2, row_bytes, mode, T);                                                        \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)                                     \
        reflex_moe_xh_##name(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up,         \
                             const uint32_t* __restrict__ x, const int* __restrict__ order,           \
                             const int* __restrict__ tiles, const int* __restrict__ n_tiles,          \
                             float* __restrict__ y, int k, int n_in, int n_out, long long row_bytes,  \
                             long long expert_bytes, int x_per_expert, int mode, int x_rows) {       \
        RX_PDL_ENTRY();                                                                              \
        const int tile = blockIdx.y;                                                                  \
        if (tile >= __ldg(n_tiles)) return;                                                           \
        const int e = __ldg(tiles + 3 * tile), first = __ldg(tiles + 3 * tile + 1);                   \
        const long long eo = (long long)e * expert_bytes;                                             \
        xh_body<TYPE, true>(w + eo, mode == 1 ? w_up + eo : nullptr, nullptr, x, y, nullptr, nullptr, \
                            __ldg(tiles + 3 * tile + 2), n_in, n_out, 0, 0, row_bytes, mode, x_rows,  \
                            order + first, x_per_expert ? 1 : k);                                     \
    }

// The one-token GEMV on x limbs, for the rx_unit_int types (cuda/quant_lowbit.cu instantiates it
// for IQ4_XS): x points at reflex_x_limbs' output; otherwise as gemv1 / gemv1s.
#define RX_QUANT_XQ_KERNELS(name, TYPE)                                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemvq1_##name(RX_MM_PARAMS) {                                                  \
        gemv_body<TYPE, 1, 1, true>(RX_MM_ARGS);                                                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemvq1s_##name(RX_MM_PARAMS) {                                                 \
        gemv_body<TYPE, 1, 2, true>(RX_MM_ARGS);                                                      \
    }

// The residual step fused into the wide one-token GEMVs (gemv_body's EPI forms), for the types
// cuda/quant.cu lists: reflex_matmul_gemv1wsr_<t> / gemv1xr_<t> (GEMV_RESNORM: the branch's
// output projection adds the residual and leaves what the next RMSNorm needs) and
// reflex_matmul_gemv1wsn_<t> / gemv1xn_<t> (GEMV_NORMED: the GEMVs that read the norm's output
// apply it themselves). Launches as gemv1ws / gemv1x; the extra parameters are gemv_body's.
#define RX_MM_NORM_PARAMS                                                                             \
    RX_MM_PARAMS, const float *__restrict__ resid, const float *__restrict__ nw,                      \
        float *__restrict__ h_out, float *__restrict__ part, int n_part, float eps
#define RX_MM_NORM_ARGS RX_MM_ARGS, resid, nw, h_out, part, n_part, eps
// FORM: ws (float x, GEMV_WARPS) or x (x limbs, XS, GEMVX_WARPS)
#define RX_QUANT_NORM_FORMS(FORM, name, TYPE, XS, WARPS)                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                          \
        reflex_matmul_gemv1##FORM##r_##name(RX_MM_NORM_PARAMS) {                                     \
        gemv_body<TYPE, 1, 2, false, 4, XS, WARPS, GEMV_RESNORM>(RX_MM_NORM_ARGS);                    \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                          \
        reflex_matmul_gemv1##FORM##n_##name(RX_MM_NORM_PARAMS) {                                     \
        gemv_body<TYPE, 1, 2, false, 4, XS, WARPS, GEMV_NORMED>(RX_MM_NORM_ARGS);                     \
    }
// reflex_matmul_gemv1sn_<t>: the reader form of gemv1s (launches with fewer rows than
// quant_ops.GEMV_WIDE_MIN_ROWS: a MoE router, a narrow v); no producer form (an output projection
// has the model's width).
#define RX_QUANT_NORM_KERNELS(name, TYPE)                                                             \
    RX_QUANT_NORM_FORMS(ws, name, TYPE, false, GEMV_WARPS)                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                     \
        reflex_matmul_gemv1sn_##name(RX_MM_NORM_PARAMS) {                                            \
        gemv_body<TYPE, 1, 2, false, GEMV_R, false, GEMV_WARPS, GEMV_NORMED>(RX_MM_NORM_ARGS);         \
    }
// reflex_moe_matmulxn_<t>: reflex_moe_matmulx_<t> on the output of a residual-step GEMV (moe_body's
// NORMED form; the norm's arguments after the MoE ones).
#define RX_QUANT_XS_NORM_KERNELS(name, TYPE)                                                          \
    RX_QUANT_NORM_FORMS(x, name, TYPE, true, GEMVX_WARPS)                                             \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, rx_sm_blocks<TYPE, 3>::value)      \
        reflex_matmul_gemv1x4r_##name(RX_MM_NORM_PARAMS) {                                           \
        gemv_body<TYPE, 1, 4, false, 4, true, GEMVX_WARPS, GEMV_RESNORM>(RX_MM_NORM_ARGS);            \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, rx_sm_blocks<TYPE, 3>::value)      \
        reflex_matmul_gemv1x4n_##name(RX_MM_NORM_PARAMS) {                                           \
        gemv_body<TYPE, 1, 4, false, 4, true, GEMVX_WARPS, GEMV_NORMED>(RX_MM_NORM_ARGS);             \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, rx_sm_blocks<TYPE, 3>::value)      \
        reflex_matmul_gemv1x1n_##name(RX_MM_NORM_PARAMS) {                                           \
        gemv_body<TYPE, 1, 1, false, 4, true, GEMVX_WARPS, GEMV_NORMED>(RX_MM_NORM_ARGS);             \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 4)                                  \
        reflex_moe_matmulxn_##name(RX_MOE_PARAMS, const float* __restrict__ part, int n_part,         \
                                   float eps) {                                                       \
        RX_PDL_ENTRY();                                                                              \
        moe_body<TYPE, 4, true, true>(RX_MOE_ARGS, part, n_part, eps);                                \
    }

// The one-token GEMV on x limbs staged in shared memory (gemv_body's XS form), for the K-quants
// with an integer view (cuda/quant.cu: Q4_K, Q5_K, Q6_K): GEMVX_WARPS warps a block, two a row
// group of 4 rows, so one staged copy serves 16 rows. Launch with rx_x_lanes<TYPE>::chunks(n_in)
// * SLOTS * 16 bytes of dynamic shared memory; otherwise as gemv1ws (not the same bits: x to 23
// bits of its run's largest value, the products exact). reflex_moe_matmulx_<t>: the MoE gather
// GEMV the same way (moe_body's XS form; as reflex_moe_matmul_<t>, for one token).
#define GEMVX_WARPS 8
// Blocks an SM that a staged-x GEMV is compiled for (N, its launch bounds): N = 3 for the 8-warp
// gemv1x4 / gemv1x1, 6 for the 4-warp moe_matmulx, both 80 registers a thread. (A 30B-A3B-shaped
// down projection, 8 slots of 2048 rows of 768, is 1024 blocks: at the 4 an SM that the registers
// the compiler takes when free allow, two waves on an H200; at 6, 1.3.) Q5_K's units hold one
// more 16-byte load (the high bits) and spill at 80 registers: two thirds of N.
template <int TYPE, int N>
struct rx_sm_blocks {
    static constexpr int value = TYPE == RX_Q5_K ? N * 2 / 3 : N;
};
#define RX_QUANT_XS_KERNEL(name, TYPE)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32)                                    \
        reflex_matmul_gemv1x_##name(RX_MM_PARAMS) {                                                  \
        gemv_body<TYPE, 1, 2, false, 4, true, GEMVX_WARPS>(RX_MM_ARGS);                               \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, rx_sm_blocks<TYPE, 3>::value)      \
        reflex_matmul_gemv1x4_##name(RX_MM_PARAMS) {                                                 \
        gemv_body<TYPE, 1, 4, false, 4, true, GEMVX_WARPS>(RX_MM_ARGS);                               \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, rx_sm_blocks<TYPE, 3>::value)      \
        reflex_matmul_gemv1x1_##name(RX_MM_PARAMS) {                                                 \
        gemv_body<TYPE, 1, 1, false, 4, true, GEMVX_WARPS>(RX_MM_ARGS);                               \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, rx_sm_blocks<TYPE, 6>::value)        \
        reflex_moe_matmulx_##name(RX_MOE_PARAMS) {                                                   \
        RX_PDL_ENTRY();                                                                              \
        moe_body<TYPE, 4, true>(RX_MOE_ARGS);                                                         \
    }

// reflex_matmul_gemv1xn_<a>_<b>: one token's q/k/v GEMV on a normed x (gemv1xn) whose third
// weight is of another K-quant (a Q4_K_M file's Q6_K attn_v): blocks below b01 = the block count
// of segments 0 and 1 are gemv1xn_<a>'s over them (w0, w1; row_bytes), the rest gemv1xn_<b>'s
// over segment 2 (w2; row_bytes_b), so each output has the bits of its weight's own gemv1xn
// launch (whatever v's rows: the launcher's rule, quant_ops.mixed_norm_launch) and the step saves
// a launch. Dynamic shared memory: the larger of the two types' staged
// x. Three blocks an SM, as each type's own form.
#define RX_QUANT_XS_MIXED_KERNEL(na, TA, nb, TB)                                                      \
    extern "C" __global__ void __launch_bounds__(GEMVX_WARPS * 32, 3)                                 \
        reflex_matmul_gemv1xn_##na##_##nb(RX_MM_NORM_PARAMS, long long row_bytes_b) {               \
        constexpr int RPB = GEMVX_WARPS / 2 * 4; /* rows a block: its row groups of 4 */              \
        const int b01 = (n0 + RPB - 1) / RPB + (n1 + RPB - 1) / RPB;                                  \
        if ((int)blockIdx.x < b01) {                                                                  \
            gemv_body<TA, 1, 2, false, 4, true, GEMVX_WARPS, GEMV_NORMED>(                           \
                w0, w1, w2, x, y0, y1, y2, T, n_in, n0, n1, 0, row_bytes, mode, resid, nw, h_out,     \
                part, n_part, eps);                                                                   \
        } else { /* segment 0 stands for the blocks below b01: seg_select gives segment 2 the rest */ \
            gemv_body<TB, 1, 2, false, 4, true, GEMVX_WARPS, GEMV_NORMED>(                           \
                w2, w2, w2, x, y2, y2, y2, T, n_in, b01 * RPB, 0, n2, row_bytes_b, mode, resid, nw,   \
                h_out, part, n_part, eps);                                                            \
        }                                                                                             \
    }

// The streamed residual-step GEMVs (sm_90+; the K-quants whose rx_lu has load_any: Q4_K, Q6_K),
// a persistent grid (one or two blocks an SM, as the occupancy count allows) whose weights reach
// shared memory through the bulk copy engine. reflex_matmul_gemv1xsn_<t> is the reader of a
// normed x (x the y0 of a residual step, products scaled by rx_norm_scale of part): mode 1 the
// SwiGLU (gate rows w0, up rows w1, n0 outputs), mode 0 one weight's plain products (w0's n0
// rows to y0: an LM head);
// reflex_matmul_gemv1xsr_<t> the producer (one weight, n0 rows: h = resid + W x at h_out,
// y0 = h * nw, part[tile] the tile's sum of h^2). Each has the bits of gemv1xn_<t> (mode 1 or
// 0) or gemv1xr_<t>. A tile is gemv1x's block: 4 row groups of 4 rows, two warps a group, the
// same row groups and sums (mode 1: 8 outputs, their gate rows then their up rows). The blocks
// take tiles blockIdx.x, + gridDim.x, ... and each tile's rows arrive in chunks of T blocks (one
// chunk where the rows fit a slot: one copy a weight, else a copy a row), each chunk in one slot
// of a ring. An extra warp's lane 0 keeps the ring full (its first chunks are asked for before
// the wait for the kernel ahead: weights are read-only; asked after it, each kind of launch made
// the 8B's step slower, BENCHMARKS.md 2026-12-06, forty-first session; and so did holding the
// copies past a block's first chunk until its x was staged, so that x's loads do not queue behind
// the ring's: 2.410 against 2.325 ms/token, H100, 2026-12-07, fifty-third session, exp/xready):
// full[s] completes when
// slot s has landed, empty[s] when the compute warps are done with it. So the loads in flight
// take no registers and no instructions of the compute warps (the last compute warp done with a
// slot refilling it instead was 4% slower there), and x is staged once a block instead of once
// every 16 rows. The producer's n_part is its tile count (quant_ops.resnorm_parts).
// T is the blocks of a row a slot holds (quant_ops._stream_chunk_blocks: all of them, or a
// multiple of 8). Dynamic shared memory (quant_ops.gemv_stream_smem): x's limbs (rx_x_lanes'
// chunks), the barriers, then 2 to GSTREAM_STAGES slots from a 128-byte boundary (the kernel
// takes as many whole slots as it is given). row_bytes a multiple of 16, and so each chunk's
// bytes where a row takes several; the weights 16-byte aligned.
#define GSTREAM_WARPS 8
#define GSTREAM_ROWS 16
#define GSTREAM_STAGES 4
template <int TYPE, int EPI>
__device__ __forceinline__ void gemv_stream_body(RX_MM_NORM_PARAMS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(EPI == GEMV_NORMED || EPI == GEMV_RESNORM, "the residual step's two forms");
    typedef rx_lu<TYPE> L;
    typedef rx_x_lanes<TYPE> XL;
    constexpr int KS = 2, R = 4, WARPS = GSTREAM_WARPS, GROUPS = WARPS / KS;
    static_assert(GROUPS * R == GSTREAM_ROWS, "a tile is gemv1x's block");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / KS, slice = warp % KS;
    const bool swiglu = EPI == GEMV_NORMED && mode == 1;
    const int per_tile = swiglu ? GSTREAM_ROWS / 2 : GSTREAM_ROWS;  // outputs a tile
    const int n = n0, n_tiles = (n + per_tile - 1) / per_tile;
    const int nb = n_in / L::QK, cb = T;  // T: the blocks of a row a slot holds
    const int n_chunks = (nb + cb - 1) / cb;
    const long long rb = row_bytes, srow = (long long)cb * L::TS;  // a row's bytes in a slot
    const long long slot_bytes = GSTREAM_ROWS * srow;
    uint8_t* base = (uint8_t*)rx_x_staged_words();
    const int xb = XL::chunks(n_in) * XL::SLOTS * 16;
    uint64_t* full = (uint64_t*)(base + xb);
    uint64_t* empty = full + GSTREAM_STAGES;
    const int ring_off = (xb + 16 * GSTREAM_STAGES + 127) & ~127;
    uint8_t* ring = base + ring_off;
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const int S = min(GSTREAM_STAGES, (int)(((long long)dyn - ring_off) / slot_bytes));
    __shared__ float part_s[2][WARPS][R];  // slice 1's sums, by tile parity
    __shared__ float gss[2][GROUPS];       // the producer's group sums of h^2, by tile parity
    __shared__ float norm_r;
    RX_TRACE_DECL;  // a trace build's stamps (bench/phase_trace.py's kinds: 100 + 10 EPI + mode)
    RX_TRACE_AT(0);
    rx_mbar_ring_init(full, empty, S, WARPS);
    if (warp == WARPS) {  // the copies
        if (lane == 0) {
            int k = 0;
            for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
                const int first = t * per_tile, v = min(per_tile, n - first);
                for (int c = 0; c < n_chunks; ++c, ++k) {
                    const int s = k % S, b0 = c * cb;
                    const uint32_t bytes = (uint32_t)(min(cb, nb - b0) * L::TS);
                    if (k >= S) rx_mbar_wait(empty + s, (uint32_t)((k / S - 1) & 1));
                    uint8_t* dst = ring + s * slot_bytes;
                    rx_mbar_expect(full + s, (uint32_t)((swiglu ? 2 : 1) * v) * bytes);
                    if (n_chunks == 1) {  // the tile's rows are one run of each weight
                        rx_bulk_load(dst, w0 + first * rb, (uint32_t)(v * rb), full + s);
                        if (swiglu)
                            rx_bulk_load(dst + per_tile * srow, w1 + first * rb, (uint32_t)(v * rb),
                                         full + s);
                    } else {
                        for (int i = 0; i < v; ++i) {
                            const long long src = (first + i) * rb + (long long)b0 * L::TS;
                            rx_bulk_load(dst + i * srow, w0 + src, bytes, full + s);
                            if (swiglu) rx_bulk_load(dst + (per_tile + i) * srow, w1 + src, bytes, full + s);
                        }
                    }
                }
            }
        }
        return;
    }
    RX_PDL_ENTRY();
    RX_TRACE_AT(1);
    float pv[RX_NORM_PV];
    if (EPI == GEMV_NORMED && warp == 0) rx_norm_load(part, n_part, pv);
    const uint32_t* xl = rx_stage_x_limbs<TYPE, WARPS * 32, false>(x, n_in);
    if (EPI == GEMV_NORMED && warp == 0) {
        const float r = rx_norm_scale(part, n_part, pv, n_in, eps);
        if (lane == 0) norm_r = r;
    }
    rx_bar_sync<1>(WARPS * 32);
    RX_TRACE_AT(2);
    const float rn = EPI == GEMV_NORMED ? norm_r : 1.0f;
    const int l = lane;  // the lane's slot in every x chunk (stride 64)
    int k = 0, it = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++it) {
        const int first = t * per_tile, v = min(per_tile, n - first);
        // the group's rows within the tile's slots; rows past n read the tile's last row (not
        // stored)
        int ri[R];
        const int row0 = first + group * (swiglu ? R / 2 : R);
#pragma unroll
        for (int r = 0; r < R; ++r)
            ri[r] = swiglu ? (r & 1) * per_tile + min(group * (R / 2) + r / 2, v - 1)
                           : min(group * R + r, v - 1);
        float acc[R][1];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
        unsigned U = 32 * slice + lane;
        for (int c = 0; c < n_chunks; ++c, ++k) {
            const int s = k % S;
            const unsigned u_end = (unsigned)min((c + 1) * cb, nb) * L::LPB;
            const uint8_t* slot = ring + s * slot_bytes;
            const uint8_t* rp[R];
#pragma unroll
            for (int r = 0; r < R; ++r) rp[r] = slot + ri[r] * srow;
            rx_mbar_wait(full + s, (uint32_t)((k / S) & 1));
            if (it == 0 && c == 0) RX_TRACE_AT(3);
            for (; U < u_end; U += 32 * KS) {
                const int blk = (int)(U / L::LPB) - c * cb;
                rx_limbs_unit<TYPE, R, true>(rp, (long long)blk * L::TS, (int)(U % L::LPB),
                                             xl + 4 * ((long long)(U >> 5) * XL::SLOTS + l), acc);
            }
            __syncwarp();
            if (lane == 0) rx_mbar_arrive(empty + s);
        }
        if (it == 0) RX_TRACE_AT(4);
        // gemv_sums' order: each warp's butterfly, then slice 1's sums added to slice 0's
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = rx_warp_sum(acc[r][0]);
        if (slice == 1) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (lane == r) part_s[it & 1][warp][r] = acc[r][0];
        }
        static_assert(GROUPS == 4, "a pair barrier a group");
        switch (group) {  // constant ids: a block reserves only the barriers it names
            case 0: rx_bar_sync<2>(64); break;
            case 1: rx_bar_sync<3>(64); break;
            case 2: rx_bar_sync<4>(64); break;
            default: rx_bar_sync<5>(64); break;
        }
        if (slice == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][0] += part_s[it & 1][warp + 1][r];
        }
        if constexpr (EPI == GEMV_NORMED) {
            if (slice == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][0] *= rn;
                gemv_store<1>(acc, swiglu, y0, 1, n, row0);
            }
        } else {  // gemv_body's GEMV_RESNORM epilogue, the tile for the block
            if (slice == 0) {
                const float gs = rx_resnorm_rows<R>(acc, row0, n, resid, nw, h_out, y0);
                if (lane == 0) gss[it & 1][group] = gs;
            }
            rx_bar_sync<1>(WARPS * 32);
            if (threadIdx.x == 0) {
                float ts = 0.0f;
#pragma unroll
                for (int g = 0; g < GROUPS; ++g) ts += gss[it & 1][g];
                part[t] = ts;
            }
        }
    }
    RX_TRACE_AT(5);
    RX_TRACE_PUT(100 + 10 * EPI + mode, (unsigned)n_in | ((unsigned)TYPE << 24) | ((unsigned)it << 16));
#else
    __trap();  // the launcher picks it on sm_90+ SASS only
#endif
}
// FORM n: the reader (GEMV_NORMED), r: the producer (GEMV_RESNORM). A trace build's stamps take
// registers: there the forms are capped at the 96 that let two blocks share an SM
// (quant_ops._GSTREAM_SM_BLOCKS), so that the trace runs the release build's grid.
#ifdef RX_TRACE
#define RX_STREAM_BOUNDS __maxnreg__(96)
#else
#define RX_STREAM_BOUNDS __launch_bounds__((GSTREAM_WARPS + 1) * 32, 1)
#endif
#define RX_QUANT_STREAM_KERNEL(FORM, EPI, name, TYPE)                                                 \
    extern "C" __global__ void RX_STREAM_BOUNDS                                                       \
        reflex_matmul_gemv1xs##FORM##_##name(RX_MM_NORM_PARAMS) {                                    \
        gemv_stream_body<TYPE, EPI>(RX_MM_NORM_ARGS);                                                 \
    }

// The prefill GEMM on float16 pairs (pairs_body), in the common module (cuda/quant.cu): x and
// segments as reflex_matmul_xh_<t>, x = reflex_x_pairs' planes, w_i = reflex_unpack_pairs_<t>'s.
// reflex_matmul_f16x3 (three products a pair, ~float32) and reflex_matmul_f16x1 (hi only): 128 x
// 128 tiles, 8 warps of 64 rows x 32 tokens, two blocks an SM; the _64 forms: 64 x 64 tiles, 4
// warps of 32 x 32, for launches of too few wide tiles to fill the GPU. Shapes:
// quant_ops._PAIRS_FORMS.
#define RX_QUANT_PAIRS_KERNEL(name, TERMS, ST)                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2) reflex_matmul_##name(RX_MM_PARAMS) {         \
        RX_PDL_ENTRY();                                                                              \
        pairs_body<TERMS, 128, 128, 2, 4, ST, 8>(w0, w1, w2, reinterpret_cast<const uint16_t*>(x), y0, \
                                                 y1, y2, T, n_in, n0, n1, n2, mode);                 \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128, 4) reflex_matmul_##name##_64(RX_MM_PARAMS) {    \
        RX_PDL_ENTRY();                                                                              \
        pairs_body<TERMS, 64, 64, 2, 2, ST, 8>(w0, w1, w2, reinterpret_cast<const uint16_t*>(x), y0,   \
                                               y1, y2, T, n_in, n0, n1, n2, mode);                   \
    }
