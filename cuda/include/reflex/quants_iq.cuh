// reflex/quants_iq.cuh -- block decoders of the codebook types (IQ*), TQ1_0 / TQ2_0 and MXFP4.
//
// Part of reflex/quants.cuh (included from it, after the shared helpers; not a header of its
// own): the same two views per type, rx_q<T>::dec4 (exact) and the GEMV lane units rx_lu<T>, and
// the same rule -- bit-exact with gguf-py's `gguf.quants.dequantize`, whose float32 operation
// order the exact paths mirror (tests/native/quant_host.cu checks it on the CPU):
//
//   IQ2_XXS / IQ2_XS / IQ2_S : ((d * (0.5 + ls)) * 0.25) * g, negated by its sign bit
//   IQ3_XXS                  : ((d * (0.5 + ls)) * 0.5) * g, negated by its sign bit
//   IQ3_S                    : (d * (1 + 2 ls)) * g, negated by its sign bit
//   IQ1_S / IQ1_M            : (d * (2 ls + 1)) * (g + delta), g in -1..1, delta = +-1/8
//   IQ4_NL                   : d * kv[q]                IQ4_XS : (d * (ls - 32)) * kv[q]
//   TQ1_0 / TQ2_0            : d * q, q in -1..1 / -1..2
//   MXFP4                    : e8m0_half(e) * kv[q] (kv: the doubled E2M1 values)
//
// g is a codebook entry (reflex/iq_tables.cuh, generated from gguf-py's tables), ls a block or
// sub-block scale field, and the sign bits of IQ2_XXS / IQ2_XS / IQ3_XXS are 7 stored bits plus
// their parity (rx_ksigns). Multiplying by -1 (gguf-py's sign) is the sign flip done here.
//
// GEMV lane alignment: a unit reads 32-bit words (funnel-shifted on the device, any address),
// f16 fields with 2-byte loads, IQ4_XS 64-bit loads (its 136-byte blocks keep 8-byte alignment).
// No block size here is a multiple of 16 bytes, so none of these types uses the 128-bit loads
// of Q4_K / Q5_K; MXFP4's 17-byte blocks keep no alignment at all (ALIGN 1, byte loads).
#pragma once

#include "reflex/iq_tables.cuh"

// The codebooks: a host copy (the CPU harness) and a device copy in global memory, read through
// the read-only cache (indices diverge across a warp, which constant memory would serialize).
#ifdef __CUDACC__
static __device__ const unsigned long long rx_iq2xxs_grid_d[RX_IQ2XXS_GRID_N] = RX_IQ2XXS_GRID;
static __device__ const unsigned long long rx_iq2xs_grid_d[RX_IQ2XS_GRID_N] = RX_IQ2XS_GRID;
static __device__ const unsigned long long rx_iq2s_grid_d[RX_IQ2S_GRID_N] = RX_IQ2S_GRID;
static __device__ const unsigned int rx_iq3xxs_grid_d[RX_IQ3XXS_GRID_N] = RX_IQ3XXS_GRID;
static __device__ const unsigned int rx_iq3s_grid_d[RX_IQ3S_GRID_N] = RX_IQ3S_GRID;
static __device__ const unsigned short rx_iq1s_grid_d[RX_IQ1S_GRID_N] = RX_IQ1S_GRID;
#endif
static const unsigned long long rx_iq2xxs_grid_h[RX_IQ2XXS_GRID_N] = RX_IQ2XXS_GRID;
static const unsigned long long rx_iq2xs_grid_h[RX_IQ2XS_GRID_N] = RX_IQ2XS_GRID;
static const unsigned long long rx_iq2s_grid_h[RX_IQ2S_GRID_N] = RX_IQ2S_GRID;
static const unsigned int rx_iq3xxs_grid_h[RX_IQ3XXS_GRID_N] = RX_IQ3XXS_GRID;
static const unsigned int rx_iq3s_grid_h[RX_IQ3S_GRID_N] = RX_IQ3S_GRID;
static const unsigned short rx_iq1s_grid_h[RX_IQ1S_GRID_N] = RX_IQ1S_GRID;

#ifdef __CUDA_ARCH__
#define RX_GRID(name, i) __ldg(name##_d + (i))
#else
#define RX_GRID(name, i) (name##_h[i])
#endif

// an IQ2 codebook entry (8 bytes) as its two words
template <int T>
RX_HD void rx_iq2_grid(uint32_t i, uint32_t& lo, uint32_t& hi) {
    unsigned long long g;
    if constexpr (T == RX_IQ2_XXS) g = RX_GRID(rx_iq2xxs_grid, i);
    else if constexpr (T == RX_IQ2_XS) g = RX_GRID(rx_iq2xs_grid, i);
    else g = RX_GRID(rx_iq2s_grid, i);
    lo = (uint32_t)g;
    hi = (uint32_t)(g >> 32);
}

RX_HD uint32_t rx_iq3xxs_grid(uint32_t i) { return RX_GRID(rx_iq3xxs_grid, i); }
RX_HD uint32_t rx_iq3s_grid(uint32_t i) { return RX_GRID(rx_iq3s_grid, i); }
RX_HD uint32_t rx_iq1s_grid(uint32_t i) { return RX_GRID(rx_iq1s_grid, i); }

#undef RX_GRID

// The 8 sign bits of a 7-bit IQ2/IQ3 sign index: the index plus its parity as bit 7 (every
// group of 8 has an even number of negative weights; gguf-py's / llama.cpp's ksigns table).
RX_HD uint32_t rx_ksigns(uint32_t i) {
#ifdef __CUDA_ARCH__
    const uint32_t par = (uint32_t)__popc(i) & 1u;
#elif defined(__GNUC__)
    const uint32_t par = (uint32_t)__builtin_popcount(i) & 1u;
#else
    uint32_t par = 0;
    for (uint32_t v = i; v; v >>= 1) par ^= v & 1u;
#endif
    return i | (par << 7);
}

// v negated when bit 0 of s is set (exactly gguf-py's multiplication by -1.0)
RX_HD float rx_flip(float v, uint32_t s) { return rx_as_float(rx_as_uint(v) ^ ((s & 1u) << 31)); }

// 4 table lookups at once: byte i of idx (0..15) -> byte idx_i of the 16-byte table t0..t3.
RX_HD uint32_t rx_lut16(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t idx) {
#ifdef __CUDA_ARCH__
    // byte_perm picks from 8 bytes with 3-bit selectors: look each index up in both halves
    // (low 3 bits), then keep the half its bit 3 names.
    const uint32_t x = idx & 0x07070707u;
    const uint32_t sel = __byte_perm(x | (x >> 4), 0u, 0x0020u);  // nibble i = low 3 bits of index i
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t m = ((idx >> 3) & 0x01010101u) * 0xffu;
    return lo ^ ((lo ^ hi) & m);
#else
    const uint32_t t[4] = {t0, t1, t2, t3};
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t k = (idx >> (8 * i)) & 15u;
        r |= ((t[k >> 2] >> (8 * (k & 3))) & 0xffu) << (8 * i);
    }
    return r;
#endif
}

// the four 2-bit fields of v (bits 0..7) -> bytes 0..3
RX_HD uint32_t rx_spread2(uint32_t v) {
    return (v & 3u) | ((v & 0xcu) << 6) | ((v & 0x30u) << 12) | ((v & 0xc0u) << 18);
}

// MXFP4's E8M0 scale halved (gguf-py's e8m0_to_fp32_half): 2^(e - 128), e = 0, 1 subnormal
RX_HD float rx_e8m0_half(uint32_t e) { return rx_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23); }

// (d * (0.5 + ls)) * k: the IQ2 (k = 1/4) and IQ3_XXS (k = 1/2) scales
RX_HD float rx_iq_db(float d, uint32_t ls, float k) { return RX_FMUL(RX_FMUL(d, 0.5f + (float)ls), k); }

#define RX_IQ_ONE_EIGHTH 0.125f  // IQ1_S / IQ1_M delta

// ==========================================================================================
// exact decoders (4 consecutive elements [e0, e0 + 4), e0 % 4 == 0)

// y[i] = +-(db * byte i of g), sign bit i of sg
RX_HD void rx_grid4(float db, uint32_t g, uint32_t sg, float* y) {
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = rx_flip(RX_FMUL(db, rx_ubyte_f(g, i, 0.0f)), sg >> i);
}

// y[i] = dl * (g_i + delta), g_i = 2-bit field i of g minus 1
RX_HD void rx_grid1(float dl, uint32_t g, float delta, float* y) {
    const uint32_t w = rx_spread2(g);
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(dl, RX_FADD(rx_ubyte_f(w, i, 1.0f), delta));
}

// IQ2_XXS: d f16, then per 32 elements 8 bytes: 4 codebook indices (one per 8 elements), and a
// word of 4 x 7 sign bits + the 4-bit scale ls (bits 28..31).
template <>
struct rx_q<RX_IQ2_XXS> {
    static constexpr int QK = 256, TS = 66;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        uint32_t a[2];
        rx_ld_words<2>(b + 2 + 8 * ib, a);
        const float db = rx_iq_db(rx_f16_to_f32(rx_ld_u16(b)), a[1] >> 28, 0.25f);
        uint32_t g0, g1;
        rx_iq2_grid<RX_IQ2_XXS>((a[0] >> (8 * l)) & 255u, g0, g1);
        rx_grid4(db, h ? g1 : g0, rx_ksigns((a[1] >> (7 * l)) & 127u) >> (4 * h), y);
    }
};

// IQ2_XS: d f16, qs[32] u16 (9-bit codebook index | 7-bit sign index << 9, one per 8 elements),
// scales[8] @66 (two 4-bit scales per 32 elements).
template <>
struct rx_q<RX_IQ2_XS> {
    static constexpr int QK = 256, TS = 74;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        const uint32_t q = rx_ld_u16(b + 2 + 8 * ib + 2 * l);
        const uint32_t ls = (rx_ld_u8(b + 66 + ib) >> (4 * (l >> 1))) & 15u;
        const float db = rx_iq_db(rx_f16_to_f32(rx_ld_u16(b)), ls, 0.25f);
        uint32_t g0, g1;
        rx_iq2_grid<RX_IQ2_XS>(q & 511u, g0, g1);
        rx_grid4(db, h ? g1 : g0, rx_ksigns(q >> 9) >> (4 * h), y);
    }
};

// IQ2_S: d f16, qs[32] (low 8 bits of the 10-bit index, one per 8 elements), signs[32] @34
// (one byte per 8 elements), qh[8] @66 (2 high index bits per 8 elements), scales[8] @74.
template <>
struct rx_q<RX_IQ2_S> {
    static constexpr int QK = 256, TS = 82;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        const uint32_t gi = rx_ld_u8(b + 2 + 4 * ib + l) | (((rx_ld_u8(b + 66 + ib) >> (2 * l)) & 3u) << 8);
        const uint32_t ls = (rx_ld_u8(b + 74 + ib) >> (4 * (l >> 1))) & 15u;
        const float db = rx_iq_db(rx_f16_to_f32(rx_ld_u16(b)), ls, 0.25f);
        uint32_t g0, g1;
        rx_iq2_grid<RX_IQ2_S>(gi, g0, g1);
        rx_grid4(db, h ? g1 : g0, rx_ld_u8(b + 34 + 4 * ib + l) >> (4 * h), y);
    }
};

// IQ3_XXS: d f16, qs[64] (one codebook index per 4 elements), then per 32 elements a word of
// 4 x 7 sign bits + the 4-bit scale (bits 28..31) @66.
template <>
struct rx_q<RX_IQ3_XXS> {
    static constexpr int QK = 256, TS = 98;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        const uint32_t aux = rx_ld_u32u(b + 66 + 4 * ib);
        const float db = rx_iq_db(rx_f16_to_f32(rx_ld_u16(b)), aux >> 28, 0.5f);
        const uint32_t g = rx_iq3xxs_grid(rx_ld_u8(b + 2 + (e0 >> 2)));
        rx_grid4(db, g, rx_ksigns((aux >> (7 * l)) & 127u) >> (4 * h), y);
    }
};

// IQ3_S: d f16, qs[64] (low 8 bits of the 9-bit index, one per 4 elements), qh[8] @66 (the 9th
// bits), signs[32] @74 (one bit per element), scales[4] @106 (4 bits per 32 elements).
template <>
struct rx_q<RX_IQ3_S> {
    static constexpr int QK = 256, TS = 110;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int k = e0 >> 2, ib = e0 >> 5;
        const uint32_t gi = rx_ld_u8(b + 2 + k) | (((rx_ld_u8(b + 66 + (k >> 3)) >> (k & 7)) & 1u) << 8);
        const uint32_t ls = (rx_ld_u8(b + 106 + (ib >> 1)) >> (4 * (ib & 1))) & 15u;
        const float db = RX_FMUL(rx_f16_to_f32(rx_ld_u16(b)), (float)(1u + 2u * ls));
        rx_grid4(db, rx_iq3s_grid(gi), rx_ld_u8(b + 74 + (e0 >> 3)) >> (e0 & 4), y);
    }
};

// IQ1_S: d f16, qs[32] (low 8 bits of the 11-bit index, one per 8 elements), qh[8] u16 @34
// (per 32 elements: 4 x 3 high index bits, the 3-bit scale at bits 12..14, the delta sign bit 15).
template <>
struct rx_q<RX_IQ1_S> {
    static constexpr int QK = 256, TS = 50;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        const uint32_t qh = rx_ld_u16(b + 34 + 2 * ib);
        const float dl = RX_FMUL(rx_f16_to_f32(rx_ld_u16(b)), (float)(2u * ((qh >> 12) & 7u) + 1u));
        const float delta = qh & 0x8000u ? -RX_IQ_ONE_EIGHTH : RX_IQ_ONE_EIGHTH;
        const uint32_t gi = rx_ld_u8(b + 2 + 4 * ib + l) | (((qh >> (3 * l)) & 7u) << 8);
        rx_grid1(dl, rx_iq1s_grid(gi) >> (8 * h), delta, y);
    }
};

// IQ1_M: qs[32] (low index bits), qh[16] @32 (per 8 elements a nibble: 3 high index bits, the
// delta sign bit 3), scales[8] @48 as 4 u16: 3-bit scales (one per 16 elements, 4 per u16) and
// the f16 d spread over the top nibbles of the 4 u16.
template <>
struct rx_q<RX_IQ1_M> {
    static constexpr int QK = 256, TS = 56;
    static RX_HD uint32_t d_bits(uint32_t s0, uint32_t s1) {
        return ((s0 & 0xffffu) >> 12) | ((s0 >> 24) & 0xf0u) | ((s1 >> 4) & 0xf00u) | ((s1 >> 16) & 0xf000u);
    }
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = (e0 >> 3) & 3, h = (e0 >> 2) & 1;
        uint32_t s[2];
        rx_ld_words<2>(b + 48, s);
        const float d = rx_f16_to_f32(d_bits(s[0], s[1]));
        const uint32_t sc = ((ib >> 2 ? s[1] : s[0]) >> (16 * ((ib >> 1) & 1))) & 0xffffu;  // u16 ib/2
        const float dl = RX_FMUL(d, (float)(2u * ((sc >> (3 * ((e0 >> 4) & 3))) & 7u) + 1u));
        const uint32_t qh = rx_ld_u8(b + 32 + 2 * ib + (l >> 1)) >> (4 * (l & 1));
        const uint32_t gi = rx_ld_u8(b + 4 * ib + l) | ((qh & 7u) << 8);
        rx_grid1(dl, rx_iq1s_grid(gi) >> (8 * h), qh & 8u ? -RX_IQ_ONE_EIGHTH : RX_IQ_ONE_EIGHTH, y);
    }
};

// IQ4_NL: d f16, qs[16]: element j < 16 = low nibble of qs[j], j >= 16 = high nibble of qs[j-16]
// (Q4_0's layout), each an index into the 16 non-linear values. y = d * kv
template <>
struct rx_q<RX_IQ4_NL> {
    static constexpr int QK = 32, TS = 18;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const uint32_t q = rx_nibbles4(b, 2, e0);
        const uint32_t v = rx_lut16(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q) ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(d, rx_ubyte_f(v, i, 128.0f));
    }
};

// IQ4_XS: d f16, scales_h u16 @2 (2 high bits per 32 elements), scales_l[4] @4 (4 low bits),
// qs[128] @8: 32 elements per 16 bytes in IQ4_NL's layout. y = (d * (ls - 32)) * kv
template <>
struct rx_q<RX_IQ4_XS> {
    static constexpr int QK = 256, TS = 136;
    // the 6-bit scale of sub-block ib, before its -32
    static RX_HD uint32_t scale_biased(uint32_t sh, uint32_t sl, int ib) {
        return ((sl >> (4 * ib)) & 15u) | (((sh >> (2 * ib)) & 3u) << 4);
    }
    static RX_HD int scale(uint32_t sh, uint32_t sl, int ib) { return (int)scale_biased(sh, sl, ib) - 32; }
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int ib = e0 >> 5, l = e0 & 31;
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const float a = RX_FMUL(d, (float)scale(rx_ld_u16(b + 2), rx_ld_u32u(b + 4), ib));
        const uint32_t q = rx_nibbles4(b, 8 + 16 * ib, l);
        const uint32_t v = rx_lut16(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q) ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(a, rx_ubyte_f(v, i, 128.0f));
    }
};

// The integer views (rx_qi, reflex/quants.cuh) of the two IQ4 types: their codebook values.
template <>
struct rx_qi<RX_IQ4_NL> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        const uint32_t q = rx_nibbles4(b, 2, e0);
        return rx_lut16(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q);
    }
    static RX_HD float2 scale(const uint8_t* b, int) { return make_float2(rx_f16_to_f32(rx_ld_u16(b)), 0.0f); }
};

template <>
struct rx_qi<RX_IQ4_XS> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        const uint32_t q = rx_nibbles4(b, 8 + 16 * (e0 >> 5), e0 & 31);
        return rx_lut16(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q);
    }
    static RX_HD float2 scale(const uint8_t* b, int e0) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        return make_float2(RX_FMUL(d, (float)rx_q<RX_IQ4_XS>::scale(rx_ld_u16(b + 2), rx_ld_u32u(b + 4), e0 >> 5)),
                           0.0f);
    }
};

// TQ1_0: qs[48] base-3 packed (5 trits per byte: trit n of byte x is ((x * 3^n) mod 256) * 3 >> 8),
// qh[4] @48 (4 trits per byte), d f16 @52. Elements [0, 160): trit e/32 of qs[e % 32];
// [160, 240): trit (e-160)/16 of qs[32 + e % 16]; [240, 256): trit (e-240)/4 of qh[e % 4].
// y = d * (trit - 1)
template <>
struct rx_q<RX_TQ1_0> {
    static constexpr int QK = 256, TS = 54;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b + 52));
        int n, off;
        if (e0 < 160) {
            n = e0 >> 5;
            off = e0 & 31;
        } else if (e0 < 240) {
            n = (e0 - 160) >> 4;
            off = 32 + (e0 & 15);
        } else {
            n = (e0 - 240) >> 2;
            off = 48;
        }
        const uint32_t p = (uint32_t)(0x511b090301ull >> (8 * n)) & 0xffu;  // 3^n
        const uint32_t w = rx_ld_u32u(b + off);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t t = ((((w >> (8 * i)) * p) & 0xffu) * 3u) >> 8;
            y[i] = RX_FMUL(d, (float)((int)t - 1));
        }
    }
};

// TQ2_0: qs[64], d f16 @64. Element 128n + 32j + l = bits 2j.. of qs[32n + l] (Q2_K's layout).
template <>
struct rx_q<RX_TQ2_0> {
    static constexpr int QK = 256, TS = 66;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b + 64));
        const int n = e0 >> 7, j = (e0 >> 5) & 3, l = e0 & 31;
        const uint32_t w = (rx_ld_u32u(b + 32 * n + l) >> (2 * j)) & 0x03030303u;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(d, rx_ubyte_f(w, i, 1.0f));
    }
};

// MXFP4: e (E8M0 scale), qs[16] @1 in Q4_0's nibble layout, each an index into the doubled E2M1
// values; the scale is halved to match. y = e8m0_half(e) * kv
template <>
struct rx_q<RX_MXFP4> {
    static constexpr int QK = 32, TS = 17;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_e8m0_half(rx_ld_u8(b));
        const uint32_t q = rx_nibbles4(b, 1, e0);
        const uint32_t v = rx_lut16(RX_MXFP4_KV0, RX_MXFP4_KV1, RX_MXFP4_KV2, RX_MXFP4_KV3, q) ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(d, rx_ubyte_f(v, i, 128.0f));
    }
};

// ==========================================================================================
// GEMV lane units. The 256-element codebook types use one unit per 32 elements (LPB 8): unit j
// covers [32j, 32j + 32), step s the 8 elements [32j + 8s, +8) (one codebook entry of 8, or two
// of 4). The unit's codebook entries are fetched in prep(), so that a warp's table loads for all
// its rows and steps are in flight together. The scale arithmetic is the exact one (it runs once
// per unit); dec<false> differs from dec<true> only where a multiply-add can be fused.

// IQ2 (XXS / XS / S) step: w = +-(db * g), sign bits of sg, entry (g0, g1)
template <bool EXACT>
RX_HD void rx_iq2_step(float db, uint32_t g0, uint32_t g1, uint32_t sg, float* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = rx_flip(rx_mul<EXACT>(db, rx_ubyte_f(g0, i, 0.0f)), sg >> i);
        w[4 + i] = rx_flip(rx_mul<EXACT>(db, rx_ubyte_f(g1, i, 0.0f)), sg >> (4 + i));
    }
}

template <>
struct rx_lu<RX_IQ2_XXS> {
    static constexpr int QK = 256, TS = 66, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t a[2];
    uint32_t dh;
    uint32_t g[4][2];
    float db;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_words<2>(b + 2 + 8 * j, a);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) {
#pragma unroll
        for (int s = 0; s < 4; ++s) rx_iq2_grid<RX_IQ2_XXS>((a[0] >> (8 * s)) & 255u, g[s][0], g[s][1]);
        db = rx_iq_db(rx_f16_to_f32_fast(dh), a[1] >> 28, 0.25f);
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_iq2_step<EXACT>(db, g[s][0], g[s][1], rx_ksigns((a[1] >> (7 * s)) & 127u), w);
    }
};

template <>
struct rx_lu<RX_IQ2_XS> {
    static constexpr int QK = 256, TS = 74, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t q[2];
    uint32_t dh, sc;
    uint32_t g[4][2];
    float db0, db1;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_words<2>(b + 2 + 8 * j, q);
        dh = rx_ld_u16(b);
        sc = rx_ld_u8(b + 66 + j);
    }
    RX_HD uint32_t q16(int s) const { return (q[s >> 1] >> (16 * (s & 1))) & 0xffffu; }
    RX_HD void prep(int) {
#pragma unroll
        for (int s = 0; s < 4; ++s) rx_iq2_grid<RX_IQ2_XS>(q16(s) & 511u, g[s][0], g[s][1]);
        const float d = rx_f16_to_f32_fast(dh);
        db0 = rx_iq_db(d, sc & 15u, 0.25f);
        db1 = rx_iq_db(d, sc >> 4, 0.25f);
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_iq2_step<EXACT>(s < 2 ? db0 : db1, g[s][0], g[s][1], rx_ksigns(q16(s) >> 9), w);
    }
};

template <>
struct rx_lu<RX_IQ2_S> {
    static constexpr int QK = 256, TS = 82, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t qs, sg, x;  // x: qh byte | scale byte << 8
    uint32_t dh;
    uint32_t g[4][2];
    float db0, db1;
    RX_HD void load(const uint8_t* b, int j) {
        qs = rx_ld_u32u(b + 2 + 4 * j);
        sg = rx_ld_u32u(b + 34 + 4 * j);
        x = rx_ld_u8(b + 66 + j) | (rx_ld_u8(b + 74 + j) << 8);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) {
#pragma unroll
        for (int s = 0; s < 4; ++s)
            rx_iq2_grid<RX_IQ2_S>(((qs >> (8 * s)) & 255u) | (((x >> (2 * s)) & 3u) << 8), g[s][0], g[s][1]);
        const float d = rx_f16_to_f32_fast(dh);
        db0 = rx_iq_db(d, (x >> 8) & 15u, 0.25f);
        db1 = rx_iq_db(d, (x >> 12) & 15u, 0.25f);
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_iq2_step<EXACT>(s < 2 ? db0 : db1, g[s][0], g[s][1], sg >> (8 * s), w);
    }
};

// IQ3 (XXS / S): 8 codebook entries of 4 per unit; step s uses entries 2s and 2s + 1.
template <>
struct rx_lu<RX_IQ3_XXS> {
    static constexpr int QK = 256, TS = 98, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t q[2];
    uint32_t aux, dh;
    uint32_t g[8];
    float db;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_words<2>(b + 2 + 8 * j, q);
        aux = rx_ld_u32u(b + 66 + 4 * j);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) {
#pragma unroll
        for (int m = 0; m < 8; ++m) g[m] = rx_iq3xxs_grid((q[m >> 2] >> (8 * (m & 3))) & 255u);
        db = rx_iq_db(rx_f16_to_f32_fast(dh), aux >> 28, 0.5f);
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_iq2_step<EXACT>(db, g[2 * s], g[2 * s + 1], rx_ksigns((aux >> (7 * s)) & 127u), w);
    }
};

template <>
struct rx_lu<RX_IQ3_S> {
    static constexpr int QK = 256, TS = 110, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t q[2];
    uint32_t sg, x;  // x: qh byte | scale byte << 8
    uint32_t dh;
    uint32_t g[8];
    float db;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_words<2>(b + 2 + 8 * j, q);
        sg = rx_ld_u32u(b + 74 + 4 * j);
        x = rx_ld_u8(b + 66 + j) | (rx_ld_u8(b + 106 + (j >> 1)) << 8);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int j) {
#pragma unroll
        for (int m = 0; m < 8; ++m)
            g[m] = rx_iq3s_grid(((q[m >> 2] >> (8 * (m & 3))) & 255u) | (((x >> m) & 1u) << 8));
        const uint32_t ls = (x >> (8 + 4 * (j & 1))) & 15u;
        db = RX_FMUL(rx_f16_to_f32_fast(dh), (float)(1u + 2u * ls));
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_iq2_step<EXACT>(db, g[2 * s], g[2 * s + 1], sg >> (8 * s), w);
    }
};

// IQ1 (S / M) step: w = dl * (g + delta) for the 8 two-bit fields of entry g (no fusable
// multiply-add: both flavours are exact)
RX_HD void rx_iq1_step(float dl, uint32_t g, float delta, float* w) {
    rx_grid1(dl, g, delta, w);
    rx_grid1(dl, g >> 8, delta, w + 4);
}

template <>
struct rx_lu<RX_IQ1_S> {
    static constexpr int QK = 256, TS = 50, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t qs, qh, dh;
    uint32_t g[4];
    float dl, delta;
    RX_HD void load(const uint8_t* b, int j) {
        qs = rx_ld_u32u(b + 2 + 4 * j);
        qh = rx_ld_u16(b + 34 + 2 * j);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) {
#pragma unroll
        for (int s = 0; s < 4; ++s) g[s] = rx_iq1s_grid(((qs >> (8 * s)) & 255u) | (((qh >> (3 * s)) & 7u) << 8));
        dl = RX_FMUL(rx_f16_to_f32_fast(dh), (float)(2u * ((qh >> 12) & 7u) + 1u));
        delta = qh & 0x8000u ? -RX_IQ_ONE_EIGHTH : RX_IQ_ONE_EIGHTH;
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const { rx_iq1_step(dl, g[s], delta, w); }
};

template <>
struct rx_lu<RX_IQ1_M> {
    static constexpr int QK = 256, TS = 56, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t qs, qh;
    uint32_t sc[2];
    uint32_t g[4];
    float dl0, dl1;
    RX_HD void load(const uint8_t* b, int j) {
        qs = rx_ld_u32u(b + 4 * j);
        qh = rx_ld_u16(b + 32 + 2 * j);
        rx_ld_words<2>(b + 48, sc);
    }
    RX_HD void prep(int j) {
#pragma unroll
        for (int s = 0; s < 4; ++s) g[s] = rx_iq1s_grid(((qs >> (8 * s)) & 255u) | (((qh >> (4 * s)) & 7u) << 8));
        const float d = rx_f16_to_f32_fast(rx_q<RX_IQ1_M>::d_bits(sc[0], sc[1]));
        const uint32_t u = ((j >> 2 ? sc[1] : sc[0]) >> (16 * ((j >> 1) & 1) + 6 * (j & 1))) & 63u;
        dl0 = RX_FMUL(d, (float)(2u * (u & 7u) + 1u));
        dl1 = RX_FMUL(d, (float)(2u * (u >> 3) + 1u));
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const float delta = (qh >> (4 * s)) & 8u ? -RX_IQ_ONE_EIGHTH : RX_IQ_ONE_EIGHTH;
        rx_iq1_step(s < 2 ? dl0 : dl1, g[s], delta, w);
    }
};

// IQ4 (NL / XS) and MXFP4 lookups: the 8 nibbles of word qw -> lo = the table bytes of the low
// nibbles of bytes 0..3, hi = those of the high nibbles. On the device, byte_perm looks up the
// 4 nibbles of each 16-bit half at once (it reads 3 bits of each selector nibble: one lookup in
// each 8-byte half of the table, then a byte_perm keeps the half bit 3 names), and two more
// byte_perms sort the 8 results into lo and hi: about 16 integer instructions per 8 values in
// the PTX (two rx_lut16 calls and their nibble splits took about 26).
RX_HD void rx_nl_pair(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t qw, uint32_t& lo,
                      uint32_t& hi) {
#ifdef __CUDA_ARCH__
    const uint32_t pick = 0x32103210u | ((qw >> 1) & 0x44444444u);  // byte k, or k + 4 if bit 3
    const uint32_t v0 = __byte_perm(__byte_perm(t0, t1, qw), __byte_perm(t2, t3, qw), pick);
    const uint32_t q1 = qw >> 16;
    const uint32_t v1 = __byte_perm(__byte_perm(t0, t1, q1), __byte_perm(t2, t3, q1), pick >> 16);
    lo = __byte_perm(v0, v1, 0x6420u);
    hi = __byte_perm(v0, v1, 0x7531u);
#else
    lo = rx_lut16(t0, t1, t2, t3, qw & 0x0F0F0F0Fu);
    hi = rx_lut16(t0, t1, t2, t3, (qw >> 4) & 0x0F0F0F0Fu);
#endif
}
// The values themselves (exact small integers): the signed table bytes are looked up with their
// sign bit flipped, so each is an unsigned byte 128 too high (the form rx_ubyte_f converts).
RX_HD void rx_nl_values(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t qw, float* w) {
    constexpr uint32_t FLIP = 0x80808080u;
    uint32_t lo, hi;
    rx_nl_pair(t0 ^ FLIP, t1 ^ FLIP, t2 ^ FLIP, t3 ^ FLIP, qw, lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = rx_ubyte_f(lo, i, 128.0f);
        w[4 + i] = rx_ubyte_f(hi, i, 128.0f);
    }
}
// Step: word qw -> low nibbles' values w[0..3], high w[4..7], times a
template <bool EXACT>
RX_HD void rx_nl_step(float a, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t qw, float* w) {
    rx_nl_values(t0, t1, t2, t3, qw, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = rx_mul<EXACT>(a, w[i]);
}

// IQ4_NL: one unit per block (as Q4_0). Step s: word s of qs.
template <>
struct rx_lu<RX_IQ4_NL> {
    static constexpr int QK = 32, TS = 18, LPB = 1, SUB = 4, ALIGN = 2;
    uint32_t q[4];
    uint32_t dh;
    float d;
    RX_HD void load(const uint8_t* b, int) {
        rx_ld_words<4>(b + 2, q);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) { d = rx_f16_to_f32_fast(dh); }
    static RX_HD int e0(int, int s) { return 4 * s; }
    static RX_HD int e1(int, int s) { return 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_nl_step<EXACT>(d, RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q[s], w);
    }
    RX_HD float scale() const { return d; }
    RX_HD void unscaled(int s, float* w) const {
        rx_nl_values(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q[s], w);
    }
};
template <>
struct rx_unit_scaled<RX_IQ4_NL> {
    static constexpr bool value = true;
};

// IQ4_XS: 8 units per block, unit j = qs bytes [16j, +16) (elements [32j, 32j + 32)) plus the
// 8-byte header (64-bit loads). Step s: word s -> elements 32j + 4s + [0,4) and + 16. Lanes
// share a unit (rx_unit_lanes): two lanes of two steps each for one token (one header decode per
// 16 weights), four lanes of one step for more (fewer registers for the tokens' x).
template <>
struct rx_lu<RX_IQ4_XS> {
    static constexpr int QK = 256, TS = 136, LPB = 8, SUB = 4, ALIGN = 8;
    uint32_t hd[2];
    uint32_t q[2];
    float a;
    template <int STEPS>
    RX_HD void load(const uint8_t* b, int j, int part) {
        static_assert(STEPS == 1 || STEPS == 2, "IQ4_XS: two or four lanes a unit");
        rx_ld_v2(b, hd[0], hd[1]);
        if constexpr (STEPS == 2) {
            rx_ld_v2(b + 8 + 16 * j + 8 * part, q[0], q[1]);
        } else {
            q[0] = rx_ld_u32(b + 8 + 16 * j + 4 * part);
        }
    }
    RX_HD void prep(int j) {
        a = RX_FMUL(rx_f16_to_f32_fast(hd[0] & 0xffffu),
                    rx_uint_f(rx_q<RX_IQ4_XS>::scale_biased(hd[0] >> 16, hd[1], j), 32.0f));
    }
    static RX_HD int e0(int j, int s) { return 32 * j + 4 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int k, float* w) const {
        rx_nl_step<EXACT>(a, RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q[k], w);
    }
    RX_HD float scale() const { return a; }
    RX_HD void unscaled(int k, float* w) const {
        rx_nl_values(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q[k], w);
    }
    RX_HD void ints(int k, uint32_t& lo, uint32_t& hi) const {
        rx_nl_pair(RX_IQ4NL_KV0, RX_IQ4NL_KV1, RX_IQ4NL_KV2, RX_IQ4NL_KV3, q[k], lo, hi);
    }
};
template <>
struct rx_unit_scaled<RX_IQ4_XS> {
    static constexpr bool value = true;
};
template <>
struct rx_unit_int<RX_IQ4_XS> {
    static constexpr bool value = true;
};
template <int TT>
struct rx_unit_lanes<RX_IQ4_XS, TT> {
    static constexpr int value = TT == 1 ? 2 : 4;
};

template <>
struct rx_lu<RX_MXFP4> {
    static constexpr int QK = 32, TS = 17, LPB = 1, SUB = 4, ALIGN = 1;
    uint32_t q[4];
    uint32_t e;
    float d;
    RX_HD void load(const uint8_t* b, int) {
        rx_ld_words<4>(b + 1, q);
        e = rx_ld_u8(b);
    }
    RX_HD void prep(int) { d = rx_e8m0_half(e); }
    static RX_HD int e0(int, int s) { return 4 * s; }
    static RX_HD int e1(int, int s) { return 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        rx_nl_step<EXACT>(d, RX_MXFP4_KV0, RX_MXFP4_KV1, RX_MXFP4_KV2, RX_MXFP4_KV3, q[s], w);
    }
};

// TQ2_0: as Q2_K without scales. Unit j (n = j/4, k = j%4): qs bytes [32n + 8k, +8), d.
template <>
struct rx_lu<RX_TQ2_0> {
    static constexpr int QK = 256, TS = 66, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t q[2];
    uint32_t dh;
    float d;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_words<2>(b + 32 * (j >> 2) + 8 * (j & 3), q);
        dh = rx_ld_u16(b + 64);
    }
    RX_HD void prep(int) { d = rx_f16_to_f32_fast(dh); }
    static RX_HD int e0(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3); }
    static RX_HD int e1(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3) + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const uint32_t lo = (q[0] >> (2 * s)) & 0x03030303u, hi = (q[1] >> (2 * s)) & 0x03030303u;
        rx_dec8<EXACT>(lo, hi, 1.0f, d, d, w);
    }
};

// TQ1_0: its base-3 regions do not split into equal register-resident units; each step decodes
// 8 elements straight from the block with dec4 (exact either way). Unit j: elements [32j, +32).
template <>
struct rx_lu<RX_TQ1_0> {
    static constexpr int QK = 256, TS = 54, LPB = 8, SUB = 4, ALIGN = 2;
    const uint8_t* b;
    RX_HD void load(const uint8_t* p, int) { b = p; }
    RX_HD void prep(int) {}
    static RX_HD int e0(int j, int s) { return 32 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 32 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int j, int s, float* w) const {
        rx_q<RX_TQ1_0>::dec4(b, e0(j, s), w);
        rx_q<RX_TQ1_0>::dec4(b, e1(j, s), w + 4);
    }
};
