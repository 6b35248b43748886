// Host-side harness for reflex/quants.cuh: the kernels' decoders and GEMV lane loop, run on the
// CPU (tests/test_quant_host.py builds this with nvcc into a shared library and loads it with
// ctypes). Build flags must include -ffp-contract=off for the host compiler (bit-exact paths).
#include "reflex/quants.cuh"

namespace {

// mode 0: rx_q<T>::dec4 / dec1 (what dequant, embed and the tiled matmul use)
template <int T>
void dequant_dec4(const uint8_t* w, long long n, float* out) {
    typedef rx_q<T> Q;
    if constexpr (Q::QK == 1) {
        for (long long e = 0; e < n; ++e) out[e] = Q::dec1(w, e);
    } else {
        for (long long e = 0; e < n; e += 4) Q::dec4(w + (e / Q::QK) * Q::TS, (int)(e % Q::QK), out + e);
    }
}

// mode 1 / 2: the GEMV lane units as the one-token GEMV splits them, exact or FMA arithmetic;
// mode 3 / 4: the same as the GEMV of TT = 8 tokens splits them (rx_unit_lanes may differ).
// Every unit's 8 values placed at their element positions (the caller pre-fills `out` with a
// sentinel to catch gaps). Types that share a unit between P lanes: each part p < P loads and
// decodes its own steps.
template <int T, bool EXACT, int TT>
void dequant_lu(const uint8_t* w, long long n, float* out) {
    typedef rx_lu<T> L;
    constexpr int P = rx_unit_lanes<T, TT>::value, STEPS = L::SUB / P;
    const long long nb = n / L::QK;
    for (long long b = 0; b < nb; ++b) {
        for (int j = 0; j < L::LPB; ++j) {
            for (int p = 0; p < P; ++p) {
                L u;
                rx_lu_load<P>(u, w + b * L::TS, j, p);
                u.prep(j);
                for (int k = 0; k < STEPS; ++k) {
                    const int s = p * STEPS + k;
                    float v[8];
                    u.template dec<EXACT>(j, k, v);
                    const long long e0 = b * L::QK + L::e0(j, s), e1 = b * L::QK + L::e1(j, s);
                    for (int i = 0; i < 4; ++i) {
                        out[e0 + i] = v[i];
                        out[e1 + i] = v[4 + i];
                    }
                }
            }
        }
    }
}

// The GEMV kernel's arithmetic: per row pair, the partial sums of 32 * ks lanes (ks warps
// splitting the row's units, as the kernels' row groups do), then their sum.
template <int T, int TT>
void gemv(const uint8_t* w, const float* x, float* y, int nt, int n_in, int n_out, long long row_bytes,
          int ks) {
    const int R = 2;
    for (int row0 = 0; row0 < n_out; row0 += R) {
        float tot[R][TT] = {};
        for (int lane = 0; lane < 32 * ks; ++lane) {
            float acc[R][TT];
            rx_gemv_lane<T, TT, R>(w, x, nt, n_in, n_out, row_bytes, row0, lane, 32 * ks, acc);
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < TT; ++t) tot[r][t] += acc[r][t];
        }
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < nt; ++t)
                if (row0 + r < n_out) y[(long long)t * n_out + row0 + r] = tot[r][t];
    }
}

template <int T>
int dequant_any(const uint8_t* w, long long n, float* out, int mode) {
    switch (mode) {
        case 0: dequant_dec4<T>(w, n, out); return 0;
        case 1: dequant_lu<T, true, 1>(w, n, out); return 0;
        case 2: dequant_lu<T, false, 1>(w, n, out); return 0;
        case 3: dequant_lu<T, true, 8>(w, n, out); return 0;
        case 4: dequant_lu<T, false, 8>(w, n, out); return 0;
    }
    return -2;
}

template <int T>
int type_info(int* qk, int* ts, int* align, int* unit) {
    *qk = rx_q<T>::QK;
    *ts = rx_q<T>::TS;
    *align = rx_lu<T>::ALIGN;
    *unit = rx_lu<T>::QK / rx_lu<T>::LPB;
    // float types: the lane units' pseudo-blocks of 8 elements
    const bool tiles = rx_lu<T>::QK == (rx_q<T>::QK == 1 ? 8 : rx_q<T>::QK) &&
                       rx_lu<T>::LPB * rx_lu<T>::SUB * 8 == rx_lu<T>::QK;
    return tiles ? 0 : -4;
}

template <int T>
int gemv_any(int tt, const uint8_t* w, const float* x, float* y, int nt, int n_in, int n_out,
             long long row_bytes, int ks) {
    if (nt > tt) return -3;
    if (ks != 1 && ks != 2 && ks != 4) return -5;
    switch (tt) {
        case 1: gemv<T, 1>(w, x, y, nt, n_in, n_out, row_bytes, ks); return 0;
        case 2: gemv<T, 2>(w, x, y, nt, n_in, n_out, row_bytes, ks); return 0;
        case 4: gemv<T, 4>(w, x, y, nt, n_in, n_out, row_bytes, ks); return 0;
        case 8: gemv<T, 8>(w, x, y, nt, n_in, n_out, row_bytes, ks); return 0;
    }
    return -2;
}

}  // namespace

#define RX_TYPE_SWITCH(type, CALL)      \
    switch (type) {                     \
        case RX_F32: return CALL(RX_F32);   \
        case RX_F16: return CALL(RX_F16);   \
        case RX_BF16: return CALL(RX_BF16); \
        case RX_Q8_0: return CALL(RX_Q8_0); \
        case RX_Q4_0: return CALL(RX_Q4_0); \
        case RX_Q4_1: return CALL(RX_Q4_1); \
        case RX_Q5_0: return CALL(RX_Q5_0); \
        case RX_Q5_1: return CALL(RX_Q5_1); \
        case RX_Q4_K: return CALL(RX_Q4_K); \
        case RX_Q5_K: return CALL(RX_Q5_K); \
        case RX_Q6_K: return CALL(RX_Q6_K); \
        case RX_Q2_K: return CALL(RX_Q2_K); \
        case RX_Q3_K: return CALL(RX_Q3_K); \
        case RX_IQ2_XXS: return CALL(RX_IQ2_XXS); \
        case RX_IQ2_XS: return CALL(RX_IQ2_XS); \
        case RX_IQ2_S: return CALL(RX_IQ2_S); \
        case RX_IQ3_XXS: return CALL(RX_IQ3_XXS); \
        case RX_IQ3_S: return CALL(RX_IQ3_S); \
        case RX_IQ1_S: return CALL(RX_IQ1_S); \
        case RX_IQ1_M: return CALL(RX_IQ1_M); \
        case RX_IQ4_NL: return CALL(RX_IQ4_NL); \
        case RX_IQ4_XS: return CALL(RX_IQ4_XS); \
        case RX_TQ1_0: return CALL(RX_TQ1_0); \
        case RX_TQ2_0: return CALL(RX_TQ2_0); \
        case RX_MXFP4: return CALL(RX_MXFP4); \
    }                                   \
    return -1;

extern "C" int rx_host_dequant(int type, const uint8_t* w, long long n, float* out, int mode) {
#define RX_CALL(T) dequant_any<T>(w, n, out, mode)
    RX_TYPE_SWITCH(type, RX_CALL)
#undef RX_CALL
}

extern "C" int rx_host_gemv(int type, int tt, const uint8_t* w, const float* x, float* y, int nt, int n_in,
                            int n_out, long long row_bytes, int ks) {
#define RX_CALL(T) gemv_any<T>(tt, w, x, y, nt, n_in, n_out, row_bytes, ks)
    RX_TYPE_SWITCH(type, RX_CALL)
#undef RX_CALL
}

// A one-token GEMV by row pairs as the kernels split it: lane(rp, lane, acc) gives lane `lane`'s
// partial sums of the rows at rp[0], rp[1] (the last row repeated past n_out), 32 * ks lanes.
template <typename F>
int row_pairs(const uint8_t* w, float* y, int n_out, long long row_bytes, int ks, F&& lane_sums) {
    const int R = 2;
    if (ks != 1 && ks != 2) return -5;
    for (int row0 = 0; row0 < n_out; row0 += R) {
        float tot[R] = {};
        const uint8_t* rp[R];
        for (int r = 0; r < R; ++r) rp[r] = w + (long long)(row0 + r < n_out ? row0 + r : n_out - 1) * row_bytes;
        for (int lane = 0; lane < 32 * ks; ++lane) {
            float acc[R][1];
            lane_sums(rp, lane, acc);
            for (int r = 0; r < R; ++r) tot[r] += acc[r][0];
        }
        for (int r = 0; r < R; ++r)
            if (row0 + r < n_out) y[row0 + r] = tot[r];
    }
    return 0;
}

// The one-token IQ4_XS GEMV on x limbs (rx_gemv_rows_xq) the same way.
extern "C" int rx_host_gemv_xq(const uint8_t* w, const uint32_t* xq, float* y, int n_in, int n_out,
                               long long row_bytes, int ks) {
    return row_pairs(w, y, n_out, row_bytes, ks, [&](const uint8_t* const (&rp)[2], int lane, float (&acc)[2][1]) {
        rx_gemv_rows_xq<RX_IQ4_XS, 2>(rp, xq, n_in, lane, 32 * ks, acc);
    });
}

// The staging alone (rx_x_limb_run for every lane slot's two runs), and rx_x_lanes<T>::elem: the
// first element of x that slot q of chunk c holds (for the staged-limbs twin test).
template <int T>
void stage_xs(const float* x, int n_in, uint32_t* staged) {
    typedef rx_x_lanes<T> XL;
    for (int i = 0; i < XL::chunks(n_in) * 64; ++i)
        rx_x_limb_run<T>(x, n_in, i >> 6, i & 31, (i >> 5) & 1, staged + 4 * (i >> 6) * XL::SLOTS);
}

extern "C" int rx_host_stage_xs(int type, const float* x, int n_in, uint32_t* staged) {
    switch (type) {
        case RX_Q4_K: stage_xs<RX_Q4_K>(x, n_in, staged); return 0;
        case RX_Q5_K: stage_xs<RX_Q5_K>(x, n_in, staged); return 0;
        case RX_Q6_K: stage_xs<RX_Q6_K>(x, n_in, staged); return 0;
    }
    return -1;
}

extern "C" int rx_host_xs_elem(int type, int c, int q) {
    switch (type) {
        case RX_Q4_K: return rx_x_lanes<RX_Q4_K>::elem(c, q);
        case RX_Q5_K: return rx_x_lanes<RX_Q5_K>::elem(c, q);
        case RX_Q6_K: return rx_x_lanes<RX_Q6_K>::elem(c, q);
    }
    return -1;
}

// The K-quants' one-token GEMV on staged x limbs (gemv_body's XS form) the same way: every lane
// slot's two runs written by rx_x_limb_run into `staged` (rx_x_lanes::chunks(n_in) * SLOTS * 4
// words), then the row pairs on them.
template <int T>
int gemv_xs(const uint8_t* w, const float* x, uint32_t* staged, float* y, int n_in, int n_out,
            long long row_bytes, int ks) {
    stage_xs<T>(x, n_in, staged);
    return row_pairs(w, y, n_out, row_bytes, ks, [&](const uint8_t* const (&rp)[2], int lane, float (&acc)[2][1]) {
        rx_gemv_rows_limbs<T, 2>(rp, staged, n_in, lane, 32 * ks, acc);
    });
}

extern "C" int rx_host_gemv_xs(int type, const uint8_t* w, const float* x, uint32_t* staged, float* y,
                               int n_in, int n_out, long long row_bytes, int ks) {
    switch (type) {
        case RX_Q4_K: return gemv_xs<RX_Q4_K>(w, x, staged, y, n_in, n_out, row_bytes, ks);
        case RX_Q5_K: return gemv_xs<RX_Q5_K>(w, x, staged, y, n_in, n_out, row_bytes, ks);
        case RX_Q6_K: return gemv_xs<RX_Q6_K>(w, x, staged, y, n_in, n_out, row_bytes, ks);
    }
    return -1;
}

// The integer view (rx_qi<T>): every element rebuilt as a * q (+ c) in float32 from ints() and
// scale(), for the bit-for-bit check against dequantize. -1: the type has no integer view.
template <int T>
int int_view(const uint8_t* w, long long n, float* out) {
    typedef rx_q<T> Q;
    typedef rx_qi<T> I;
    for (long long e = 0; e < n; e += 4) {
        const uint8_t* b = w + (e / Q::QK) * Q::TS;
        const int e0 = (int)(e % Q::QK);
        const uint32_t q = I::ints(b, e0);
        for (int i = 0; i < 4; ++i) {
            const float2 ac = I::scale(b, e0 + i);
            float v = RX_FMUL(ac.x, (float)(int8_t)(uint8_t)(q >> (8 * i)));
            if (I::MIN) v = RX_FADD(v, ac.y);
            out[e + i] = v;
        }
    }
    return 0;
}

extern "C" int rx_host_int_view(int type, const uint8_t* w, long long n, float* out) {
    switch (type) {
        case RX_Q8_0: return int_view<RX_Q8_0>(w, n, out);
        case RX_Q4_0: return int_view<RX_Q4_0>(w, n, out);
        case RX_Q5_0: return int_view<RX_Q5_0>(w, n, out);
        case RX_Q4_K: return int_view<RX_Q4_K>(w, n, out);
        case RX_Q5_K: return int_view<RX_Q5_K>(w, n, out);
        case RX_Q6_K: return int_view<RX_Q6_K>(w, n, out);
        case RX_IQ4_NL: return int_view<RX_IQ4_NL>(w, n, out);
        case RX_IQ4_XS: return int_view<RX_IQ4_XS>(w, n, out);
    }
    return -1;
}

// A type's block size, bytes per block, GEMV weight alignment and weights per lane unit as the
// decoders declare them (-4: its lane units do not tile the block into steps of 8 elements).
extern "C" int rx_host_type_info(int type, int* qk, int* ts, int* align, int* unit) {
#define RX_CALL(T) type_info<T>(qk, ts, align, unit)
    RX_TYPE_SWITCH(type, RX_CALL)
#undef RX_CALL
}

// Sanity hook: the f16 converter alone (all 65536 patterns in one call).
extern "C" void rx_host_f16_table(float* out) {
    for (uint32_t h = 0; h < 65536u; ++h) out[h] = rx_f16_to_f32(h);
}

// The computed IQ2/IQ3 sign table (rx_ksigns), all 128 entries, to compare with gguf-py's.
extern "C" void rx_host_ksigns(uint8_t* out) {
    for (uint32_t i = 0; i < 128u; ++i) out[i] = (uint8_t)rx_ksigns(i);
}
