// bench/gemv_lab.py compiles this on the GPU machine: forms of the one-token GEMV on x limbs
// staged in shared memory (gemv_body's XS form) in other block shapes than the module's
// reflex_matmul_gemv1x_<t>, to time them side by side. lab_<form>_<t>: KS warps a row group, R
// rows a group, WARPS warps a block.
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

#define LAB(form, name, TYPE, KS, R, WARPS)                                                \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) lab_##form##_##name(RX_MM_PARAMS) { \
        gemv_body<TYPE, 1, KS, false, R, true, WARPS>(RX_MM_ARGS);                         \
    }
#define LAB_ALL(name, TYPE)           \
    LAB(x16, name, TYPE, 2, 4, 16)    \
    LAB(x8k4, name, TYPE, 4, 4, 8)

LAB_ALL(q4_k, RX_Q4_K)
LAB_ALL(q6_k, RX_Q6_K)

// Pipelined forms: lab_rows_limbs is rx_gemv_rows_limbs with the next unit's weights loaded
// (PF) before the current unit's products; lab_pf_body walks row sets blk, blk + gridDim.x, ...
// (LOOP: a block stages x once for several row sets; the launch gives fewer blocks).
template <int TYPE, int R, bool PF>
__device__ __forceinline__ void lab_rows_limbs(const uint8_t* const (&rp)[R], const uint32_t* xl, int n_in,
                                               int first, int stride, float (&acc)[R][1]) {
    typedef rx_lu<TYPE> L;
    typedef rx_x_lanes<TYPE> XL;
    const unsigned n_units = (unsigned)(n_in / L::QK) * (unsigned)L::LPB;
    const int l = first & 31;
    auto load = [&](L (&u)[R], unsigned U) {
        const unsigned blk = U / (unsigned)L::LPB;
        const int j = (int)(U % (unsigned)L::LPB);
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].load(rp[r] + (long long)blk * L::TS, j);
    };
    auto math = [&](L (&u)[R], unsigned U) {
        const int j = (int)(U % (unsigned)L::LPB);
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].prep(j);
        const uint32_t* xc = xl + 4 * ((long long)(U >> 5) * XL::SLOTS + l);
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
    };
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    unsigned U = (unsigned)first;
    if (!PF) {
        for (; U < n_units; U += (unsigned)stride) {
            L u[R];
            load(u, U);
            math(u, U);
        }
        return;
    }
    L a[R], b[R];
    if (U < n_units) load(a, U);
    while (U < n_units) {
        const unsigned Un = U + (unsigned)stride;
        if (Un < n_units) load(b, Un);
        math(a, U);
        if (Un >= n_units) break;
        const unsigned U2 = Un + (unsigned)stride;
        if (U2 < n_units) load(a, U2);
        math(b, Un);
        U = U2;
    }
}

template <int TYPE, int KS, int R, int WARPS, bool PF>
__device__ __forceinline__ void lab_pf_body(RX_MM_PARAMS) {
    constexpr int GROUPS = WARPS / KS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = warp / KS, slice = warp % KS;
    const bool swiglu = mode == 1;
    RX_PDL_ENTRY();
    const uint32_t* xl = rx_stage_x_limbs<TYPE, WARPS * 32>(x, n_in);
    const int per_set = GROUPS * (swiglu ? R / 2 : R);
    const int sets = swiglu ? (n0 + per_set - 1) / per_set
                            : (n0 + per_set - 1) / per_set + (n1 + per_set - 1) / per_set +
                                  (n2 + per_set - 1) / per_set;
    for (int set = blockIdx.x; set < sets; set += gridDim.x) {
        const uint8_t* w;
        float* y;
        int n, row0;
        if (swiglu) {
            w = w0; y = y0; n = n0;
            row0 = (set * GROUPS + group) * (R / 2);
        } else {
            int b;
            seg_select(w0, w1, w2, y0, y1, y2, n0, n1, n2, GROUPS * R, w, y, n, b, set);
            row0 = (b * GROUPS + group) * R;
        }
        const bool live = row0 < n;
        const uint8_t* rp[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (swiglu) {
                rp[r] = (r & 1 ? w1 : w) + (long long)min(row0 + r / 2, n - 1) * row_bytes;
            } else {
                rp[r] = w + (long long)min(row0 + r, n - 1) * row_bytes;
            }
        }
        float acc[R][1];
        lab_rows_limbs<TYPE, R, PF>(rp, xl, live ? n_in : 0, 32 * slice + lane, 32 * KS, acc);
        gemv_sums<1, KS, R, WARPS>(acc);
        if (slice == 0 && live) gemv_store<1>(acc, swiglu, y, 1, n, row0);
        if (KS > 1) __syncthreads();  // gemv_sums' shared partials are reused by the next set
    }
}

#define LABP(form, name, TYPE, KS, R, WARPS, PF)                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) lab_##form##_##name(RX_MM_PARAMS) { \
        lab_pf_body<TYPE, KS, R, WARPS, PF>(RX_MM_ARGS);                                     \
    }
#define LABP_ALL(name, TYPE)                 \
    LABP(loop, name, TYPE, 2, 4, 8, false)   \
    LABP(pf, name, TYPE, 2, 4, 8, true)      \
    LABP(pf1, name, TYPE, 1, 4, 8, true)     \
    LABP(pf4w, name, TYPE, 2, 4, 4, true)    \
    LABP(r8, name, TYPE, 2, 8, 8, false)
LABP_ALL(q4_k, RX_Q4_K)
LABP_ALL(q6_k, RX_Q6_K)

// Float-x forms (gemv_body without XS, the module's gemv1ws being KS 2, R 4, 4 warps) for the
// types without staged limbs (Q8_0): more warps a row group for launches of few rows.
#define LABW(form, name, TYPE, KS, R, WARPS)                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) lab_##form##_##name(RX_MM_PARAMS) { \
        gemv_body<TYPE, 1, KS, false, R, false, WARPS>(RX_MM_ARGS);                        \
    }
LABW(w8k2, q8_0, RX_Q8_0, 2, 4, 8)
LABW(w4k4, q8_0, RX_Q8_0, 4, 4, 4)
LABW(w8k4, q8_0, RX_Q8_0, 4, 4, 8)
LABW(w8k8, q8_0, RX_Q8_0, 8, 4, 8)
LABW(w16k8, q8_0, RX_Q8_0, 8, 4, 16)
LABW(w8k4r2, q8_0, RX_Q8_0, 4, 2, 8)
