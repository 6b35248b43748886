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

// rx_gemv_rows_limbs (Q4_K, one warp a row group) with the rows in shared memory
template <int R>
__device__ __forceinline__ void lab_rows_smem(const uint8_t* const (&rp)[R], const uint32_t* xl, int n_in,
                                              int lane, float (&acc)[R][1]) {
    typedef rx_lu<RX_Q4_K> L;
    typedef rx_x_lanes<RX_Q4_K> XL;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    const unsigned n_units = (unsigned)(n_in / L::QK) * (unsigned)L::LPB;
    for (unsigned U = (unsigned)lane; U < n_units; U += 32u)
        rx_limbs_unit<RX_Q4_K, R, true>(rp, (long long)(U / L::LPB) * L::TS, (int)(U % L::LPB),
                                        xl + 4 * ((long long)(U >> 5) * XL::SLOTS + lane), acc);
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
    rx_mbar_ring_init(full, empty, S, WARPS);
    if (warp == WARPS) {  // the producer
        if (PART != 2 && lane == 0) {
            int k = 0;
            for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++k) {
                const int s = k % S;
                if (k >= S) rx_mbar_wait(empty + s, (uint32_t)((k / S - 1) & 1));
                const int first = t * per_tile, v = min(per_tile, n0 - first);
                uint8_t* dst = ring + (long long)s * slot_bytes;
                if (swiglu) {
                    rx_mbar_expect(full + s, (uint32_t)(2 * v * rb));
                    rx_bulk_load(dst, w0 + (long long)first * rb, (uint32_t)(v * rb), full + s);
                    rx_bulk_load(dst + (long long)per_tile * rb, w1 + (long long)first * rb,
                                  (uint32_t)(v * rb), full + s);
                } else {
                    rx_mbar_expect(full + s, (uint32_t)(v * rb));
                    rx_bulk_load(dst, w0 + (long long)first * rb, (uint32_t)(v * rb), full + s);
                }
            }
        }
        return;
    }
    RX_PDL_ENTRY();
    const uint32_t* xl = rx_stage_x_limbs<RX_Q4_K, WARPS * 32, false>(x, n_in);
    rx_bar_sync<1>(WARPS * 32);
    int k = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++k) {
        const int s = k % S;
        const int first = t * per_tile, v = min(per_tile, n0 - first);
        if (PART != 2) rx_mbar_wait(full + s, (uint32_t)((k / S) & 1));
        if (PART == 1) {
            __syncwarp();
            if (lane == 0) rx_mbar_arrive(empty + s);
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
        if (lane == 0) rx_mbar_arrive(empty + s);
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
