// bench/tma_gemv_lab.py compiles this on the GPU machine: a persistent form of the Q4_K one-token
// GEMV on staged x limbs (the module's gemv1x arithmetic, one warp a row group) whose weights
// reach shared memory by the Hopper bulk copy engine (cp.async.bulk with an mbarrier), so that
// the loads in flight cost the compute warps no instructions and no registers, and x is staged
// once a block instead of once every 16 rows.
//
// A block is WARPS compute warps and one producer warp. A tile is WARPS * R consecutive rows
// (mode 1: WARPS * R / 2 outputs, their gate rows then their up rows, two copies); the blocks take
// tiles blockIdx.x, + gridDim.x, ... The producer's lane 0 keeps S tiles in flight in a ring of S
// slots: full[s] completes when a slot's bytes have landed, empty[s] when the WARPS warps are
// done with it. Its first S tiles are asked for before the wait for the kernel ahead (the weights
// are read-only).
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

__device__ __forceinline__ uint32_t lab_sa(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void lab_bar_init(uint64_t* b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lab_sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void lab_bar_expect(uint64_t* b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lab_sa(b)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void lab_bar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(lab_sa(b)) : "memory");
}
__device__ __forceinline__ void lab_bar_wait(uint64_t* b, uint32_t parity) {
    uint32_t ok = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(ok)
            : "r"(lab_sa(b)), "r"(parity)
            : "memory");
    } while (!ok);
}
__device__ __forceinline__ void lab_bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            lab_sa(dst)),
        "l"(src), "r"(bytes), "r"(lab_sa(bar))
        : "memory");
}

// rx_gemv_rows_limbs (Q4_K) with the rows in shared memory
template <int R>
__device__ __forceinline__ void lab_rows_smem(const uint8_t* const (&rp)[R], const uint32_t* xl, int n_in,
                                              int lane, float (&acc)[R][1]) {
    typedef rx_lu<RX_Q4_K> L;
    typedef rx_x_lanes<RX_Q4_K> XL;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    const unsigned n_units = (unsigned)(n_in / L::QK) * (unsigned)L::LPB;
    for (unsigned U = (unsigned)lane; U < n_units; U += 32u) {
        const unsigned blk = U / (unsigned)L::LPB;
        const int j = (int)(U % (unsigned)L::LPB);
        L u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* b = rp[r] + (long long)blk * L::TS;
            rx_ld_v4_any((const uint32_t*)b, u[r].hd);
            rx_ld_v4_any((const uint32_t*)(b + 16 + 16 * j), u[r].q);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].prep(j);
        const uint32_t* xc = xl + 4 * ((long long)(U >> 5) * XL::SLOTS + lane);
        int s0[R][2], s1[R][2], s2[R][2];
#pragma unroll
        for (int r = 0; r < R; ++r) s0[r][0] = s1[r][0] = s2[r][0] = s0[r][1] = s1[r][1] = s2[r][1] = 0;
        float xs[2], xsum[2];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            uint32_t g0[4], g1[4];
            rx_ld_v4_any(xc + 128 * (2 * k), g0);
            rx_ld_v4_any(xc + 128 * (2 * k + 1), g1);
            if (k == 0) {
                xs[0] = rx_as_float(g0[3]);
                xs[1] = rx_as_float(g1[3]);
            } else if (k == 1) {
                xsum[0] = (float)(int)g0[3];
                xsum[1] = (float)(int)g1[3];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                uint32_t lo, hi;
                u[r].ints(j, k, lo, hi);
                s0[r][0] = rx_dp4a<false>(lo, g0[0], s0[r][0]);
                s1[r][0] = rx_dp4a<false>(lo, g0[1], s1[r][0]);
                s2[r][0] = rx_dp4a<true>(lo, g0[2], s2[r][0]);
                s0[r][1] = rx_dp4a<false>(hi, g1[0], s0[r][1]);
                s1[r][1] = rx_dp4a<false>(hi, g1[1], s1[r][1]);
                s2[r][1] = rx_dp4a<true>(hi, g1[2], s2[r][1]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mul, sub;
                u[r].affine(h, mul, sub);
                const float v = fmaf((float)(s2[r][h] * 256 + s1[r][h]), 256.0f, rx_small_int_f(s0[r][h]));
                acc[r][0] = fmaf(mul * xs[h], v, acc[r][0]);
                acc[r][0] = fmaf(-sub * xs[h], xsum[h], acc[r][0]);
            }
        }
    }
}

// PART 0: the whole GEMV; 1: the copies alone (the compute warps release each slot when it has
// landed); 2: the compute alone (no copies: the slots' bytes are whatever shared memory holds)
template <int WARPS, int R, int S, int PART = 0>
__device__ __forceinline__ void lab_tma_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                             const float* __restrict__ x, float* __restrict__ y0,
                                             int n_in, int n0, long long row_bytes, int mode) {
    constexpr int ROWS = WARPS * R;
    const bool swiglu = mode == 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_tile = swiglu ? ROWS / 2 : ROWS;  // outputs a tile
    const int n_tiles = (n0 + per_tile - 1) / per_tile;
    const int rb = (int)row_bytes;
    uint8_t* base = (uint8_t*)rx_x_staged_words();
    const int xb = rx_x_lanes<RX_Q4_K>::chunks(n_in) * rx_x_lanes<RX_Q4_K>::SLOTS * 16;
    uint64_t* full = (uint64_t*)(base + xb);
    uint64_t* empty = full + S;
    uint8_t* ring = base + ((xb + 16 * S + 127) & ~127);
    const int slot_bytes = ROWS * rb;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            lab_bar_init(full + s, 1);
            lab_bar_init(empty + s, WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == WARPS) {  // the producer
        if (PART != 2 && lane == 0) {
            int k = 0;
            for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++k) {
                const int s = k % S;
                if (k >= S) lab_bar_wait(empty + s, (uint32_t)((k / S - 1) & 1));
                const int first = t * per_tile, v = min(per_tile, n0 - first);
                uint8_t* dst = ring + (long long)s * slot_bytes;
                if (swiglu) {
                    lab_bar_expect(full + s, (uint32_t)(2 * v * rb));
                    lab_bulk_load(dst, w0 + (long long)first * rb, (uint32_t)(v * rb), full + s);
                    lab_bulk_load(dst + (long long)per_tile * rb, w1 + (long long)first * rb,
                                  (uint32_t)(v * rb), full + s);
                } else {
                    lab_bar_expect(full + s, (uint32_t)(v * rb));
                    lab_bulk_load(dst, w0 + (long long)first * rb, (uint32_t)(v * rb), full + s);
                }
            }
        }
        return;
    }
    RX_PDL_ENTRY();
    const uint32_t* xl = rx_stage_x_limbs<RX_Q4_K, WARPS * 32, false>(x, n_in);
    asm volatile("bar.sync 1, %0;" ::"r"(WARPS * 32) : "memory");
    int k = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++k) {
        const int s = k % S;
        const int first = t * per_tile, v = min(per_tile, n0 - first);
        if (PART != 2) lab_bar_wait(full + s, (uint32_t)((k / S) & 1));
        if (PART == 1) {
            __syncwarp();
            if (lane == 0) lab_bar_arrive(empty + s);
            continue;
        }
        const uint8_t* slot = ring + (long long)s * slot_bytes;
        const uint8_t* rp[R];
        int row0;
        if (swiglu) {
            row0 = first + warp * (R / 2);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int o = min(warp * (R / 2) + r / 2, v - 1);
                rp[r] = slot + (long long)((r & 1) * per_tile + o) * rb;
            }
        } else {
            row0 = first + warp * R;
#pragma unroll
            for (int r = 0; r < R; ++r) rp[r] = slot + (long long)min(warp * R + r, v - 1) * rb;
        }
        float acc[R][1];
        lab_rows_smem<R>(rp, xl, n_in, lane, acc);
        __syncwarp();
        if (lane == 0) lab_bar_arrive(empty + s);
        gemv_sums<1, 1, R, WARPS>(acc);
        gemv_store<1>(acc, swiglu, y0, 1, n0, row0);
    }
}

#define LAB_TMA(WARPS, R, S, BPS)                                                                    \
    extern "C" __global__ void __launch_bounds__((WARPS + 1) * 32, BPS)                               \
        lab_tma_w##WARPS##r##R##s##S##b##BPS(RX_MM_PARAMS) {                                          \
        lab_tma_body<WARPS, R, S>(w0, w1, x, y0, n_in, n0, row_bytes, mode);                         \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__((WARPS + 1) * 32, BPS)                               \
        lab_tma_w##WARPS##r##R##s##S##b##BPS##_copy(RX_MM_PARAMS) {                                   \
        lab_tma_body<WARPS, R, S, 1>(w0, w1, x, y0, n_in, n0, row_bytes, mode);                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__((WARPS + 1) * 32, BPS)                               \
        lab_tma_w##WARPS##r##R##s##S##b##BPS##_math(RX_MM_PARAMS) {                                   \
        lab_tma_body<WARPS, R, S, 2>(w0, w1, x, y0, n_in, n0, row_bytes, mode);                      \
    }
LAB_TMA(8, 2, 4, 1)
LAB_TMA(8, 2, 2, 2)
LAB_TMA(16, 2, 2, 1)
LAB_TMA(8, 4, 2, 1)
LAB_TMA(4, 2, 4, 2)
LAB_TMA(4, 2, 2, 3)
LAB_TMA(6, 2, 2, 3)
LAB_TMA(12, 2, 3, 1)
