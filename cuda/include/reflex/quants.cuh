// reflex/quants.cuh -- GGML block decoders, host and device (one source of truth).
//
// Weights stay in their GGUF layout on the device; kernels decode them on the fly. Every
// function here is __host__ __device__: tests/native/quant_host.cu runs them on the CPU and
// checks them BIT FOR BIT against gguf-py's `gguf.quants.dequantize` (a `reflex check`
// requirement), so the float operations below mirror gguf-py's float32 operation order exactly
// and use RX_FMUL/RX_FADD/RX_FSUB (never contracted into an FMA) on the exact paths:
//
//   F16  : half -> float (exact)            BF16 : bits << 16
//   Q8_0 : q * d                            Q4_0 : d * (q - 8)        Q5_0 : d * (q - 16)
//   Q4_1 : (d * q) + m                      Q5_1 : (d * q) + m
//   Q4_K : (d * sc) * q - (dmin * m)        Q5_K : same, 5-bit q
//   Q6_K : (d * sc) * (q - 32)              (integers -> float exactly; sc of Q6_K is int8)
//   Q2_K : (d * sc) * q - (dmin * m)        Q3_K : (d * (sc - 32)) * q, q in -4..3
//   the codebook types (IQ*), TQ1_0 / TQ2_0 and MXFP4: reflex/quants_iq.cuh (included below)
//
// Two views of each quantized type:
//
//   rx_q<T>::dec4(blk, e0, y)  the 4 consecutive elements [e0, e0+4) of one block (e0 % 4 == 0),
//                              exact. Loads accept any byte address (aligned words + funnel
//                              shift), so no alignment is assumed beyond 2 bytes for f16 fields.
//                              Used by dequant, embed and the tiled matmul's tile fill.
//   rx_q<T>::dec1(row, e)      float types (block size 1): element e of a row.
//
//   rx_lu<T>                   the GEMV "lane unit": what one lane decodes from one set of wide
//                              loads (16-byte vectors where the block layout allows it, else
//                              funnel-shifted word loads), as SUB steps of 8 weights each:
//                              w[0..3] are elements e0(j,s)+0..3, w[4..7] are e1(j,s)+0..3 of
//                              the block, for lane unit j (0 <= j < LPB) and step s (< SUB).
//                              Consecutive j read consecutive bytes, so a warp's lanes
//                              (unit = lane, lane + 32, ...) read memory contiguously.
//                              dec<true> is bit-exact (tested on the host; on the device f16
//                              scales use the cvt instruction, which differs only for NaNs),
//                              dec<false> uses FMA.
//                              ALIGN: byte alignment the weight pointer needs on the device.
//
// Magic-number int -> float: (as_float(0x4B000000 | u) - (2^23 + off)) == u - off exactly for
// 0 <= u < 256, one byte-permute + one add instead of a (slower) I2F conversion.
#pragma once

#include "reflex/common.cuh"

enum : int {
    RX_F32 = 0,
    RX_F16 = 1,
    RX_Q4_0 = 2,
    RX_Q4_1 = 3,
    RX_Q5_0 = 6,
    RX_Q5_1 = 7,
    RX_Q8_0 = 8,
    RX_Q2_K = 10,
    RX_Q3_K = 11,
    RX_Q4_K = 12,
    RX_Q5_K = 13,
    RX_Q6_K = 14,
    RX_IQ2_XXS = 16,
    RX_IQ2_XS = 17,
    RX_IQ3_XXS = 18,
    RX_IQ1_S = 19,
    RX_IQ4_NL = 20,
    RX_IQ3_S = 21,
    RX_IQ2_S = 22,
    RX_IQ4_XS = 23,
    RX_IQ1_M = 29,
    RX_BF16 = 30,
    RX_TQ1_0 = 34,
    RX_TQ2_0 = 35,
    RX_MXFP4 = 39,
};

#ifdef __CUDACC__
// 0x4B000000 (2^23 as a float) from constant memory, so that ptxas keeps it in one register and
// encodes the byte-permute selector as an immediate (with a literal it does the opposite and
// re-materializes the selector before every PRMT: one extra instruction per weight).
static __constant__ uint32_t rx_c_magic = 0x4B000000u;
#endif

// float(v) - off for v < 2^23 (exact for integer off): the bits of 2^23 + v, then one subtraction
// (no integer-to-float conversion, which runs at a quarter of the FP32 rate)
RX_HD float rx_uint_f(uint32_t v, float off) { return rx_as_float(0x4B000000u | v) - (8388608.0f + off); }

// (unsigned byte i of w) - off, as float, exactly (off an integer, 0 <= off <= 255)
RX_HD float rx_ubyte_f(uint32_t w, int i, float off) {
#ifdef __CUDA_ARCH__
    const uint32_t u = __byte_perm(w, rx_c_magic, 0x7540u | (uint32_t)i);
    return __uint_as_float(u) - (8388608.0f + off);
#else
    return (float)(int)((w >> (8 * i)) & 0xffu) - off;
#endif
}

// y = a*q (exact: one rounding either way)
template <bool EXACT>
RX_HD float rx_mul(float a, float q) {
    return EXACT ? RX_FMUL(a, q) : a * q;
}
// y = (a*q) + b   (exact: two roundings; fast: one FMA)
template <bool EXACT>
RX_HD float rx_mad(float a, float q, float b) {
    return EXACT ? RX_FADD(RX_FMUL(a, q), b) : fmaf(a, q, b);
}
// y = (a*q) - b
template <bool EXACT>
RX_HD float rx_msub(float a, float q, float b) {
    return EXACT ? RX_FSUB(RX_FMUL(a, q), b) : fmaf(a, q, -b);
}

// A lane unit's step (rx_lu's dec): 8 values from the unsigned bytes b of lo (the 4 at e0) and
// hi (the 4 at e1). rx_dec8: a0 * (b - off) for lo's, a1 * (b - off) for hi's; rx_dec8_affine:
// a0 * b + c0 and a1 * b + c1, or with SUB minus c0 and c1.
template <bool EXACT>
RX_HD void rx_dec8(uint32_t lo, uint32_t hi, float off, float a0, float a1, float* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = rx_mul<EXACT>(a0, rx_ubyte_f(lo, i, off));
        w[4 + i] = rx_mul<EXACT>(a1, rx_ubyte_f(hi, i, off));
    }
}
template <bool EXACT, bool SUB>
RX_HD void rx_dec8_affine(uint32_t lo, uint32_t hi, float a0, float c0, float a1, float c1, float* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (SUB) {
            w[i] = rx_msub<EXACT>(a0, rx_ubyte_f(lo, i, 0.0f), c0);
            w[4 + i] = rx_msub<EXACT>(a1, rx_ubyte_f(hi, i, 0.0f), c1);
        } else {
            w[i] = rx_mad<EXACT>(a0, rx_ubyte_f(lo, i, 0.0f), c0);
            w[4 + i] = rx_mad<EXACT>(a1, rx_ubyte_f(hi, i, 0.0f), c1);
        }
    }
}

// 8 bytes from an 8-byte aligned address (device: one 64-bit load)
RX_HD void rx_ld_v2(const uint8_t* p, uint32_t& w0, uint32_t& w1) {
#ifdef __CUDA_ARCH__
    const uint2 v = __ldg((const uint2*)p);
    w0 = v.x;
    w1 = v.y;
#else
    uint32_t w[2];
    memcpy(w, p, 8);
    w0 = w[0];
    w1 = w[1];
#endif
}

// Q3_K's 6-bit signed scale of sub-block is (0..15) from the 12 scale bytes as the words
// S0 = s[0..3], S1 = s[4..7], S2 = s[8..11]: low 4 bits = nibble is/8 of s[is % 8], high 2
// bits = bits 2(is/4).. of s[8 + is % 4]; minus 32.
RX_HD int rx_q3k_scale(uint32_t S0, uint32_t S1, uint32_t S2, int is) {
    const uint32_t lo = (((is & 4) ? S1 : S0) >> (8 * (is & 3) + 4 * (is >> 3))) & 15u;
    const uint32_t hi = (S2 >> (8 * (is & 3) + 2 * (is >> 2))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}

// Q4_K / Q5_K 6-bit (scale, min) of sub-block j (0..7) from the 12 scale bytes, given as the
// little-endian words Y = s[0..3], Z = s[4..7], W = s[8..11]:
//   j < 4 : sc = s[j] & 63,                          m = s[j+4] & 63
//   j >= 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m = (s[j+4] >> 4) | ((s[j] >> 6) << 4)
RX_HD void rx_k4_scale_min(uint32_t Y, uint32_t Z, uint32_t W, int j, int& sc, int& m) {
    const int sh = 8 * (j & 3);
    const uint32_t y = Y >> sh, z = Z >> sh;
    if (j < 4) {
        sc = (int)(y & 63u);
        m = (int)(z & 63u);
    } else {
        const uint32_t w = W >> sh;
        sc = (int)((w & 15u) | (((y >> 6) & 3u) << 4));
        m = (int)(((w >> 4) & 15u) | (((z >> 6) & 3u) << 4));
    }
}

// The same for the pair of sub-blocks (2t, 2t+1), branch-free, packed: byte 0 of sc2/m2 is
// sub-block 2t's, byte 1 sub-block 2t+1's.
RX_HD void rx_k4_scale_min2(uint32_t Y, uint32_t Z, uint32_t W, int t, uint32_t& sc2, uint32_t& m2) {
    const int sh = 16 * (t & 1);
    const uint32_t y = (Y >> sh) & 0xffffu, z = (Z >> sh) & 0xffffu, w = (W >> sh) & 0xffffu;
    const uint32_t sc_lo = y & 0x3f3fu, m_lo = z & 0x3f3fu;
    const uint32_t sc_hi = (w & 0x0f0fu) | ((y >> 2) & 0x3030u);
    const uint32_t m_hi = ((w >> 4) & 0x0f0fu) | ((z >> 2) & 0x3030u);
    sc2 = t < 2 ? sc_lo : sc_hi;
    m2 = t < 2 ? m_lo : m_hi;
}

// 4 bits b0..b3 -> bit 4 of bytes 0..3 (the 5th bit of Q5_0 / Q5_1 quants)
RX_HD uint32_t rx_spread4_bit4(uint32_t b) {
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4;
}

// Elements e .. e+3 (e % 4 == 0) of a 32-element run of 4-bit quants at byte `at` of b (element
// j < 16 in the low nibble of byte j, element j + 16 in its high nibble), one to a byte
RX_HD uint32_t rx_nibbles4(const uint8_t* b, int at, int e) {
    return (rx_ld_u32u(b + (at + (e & 15))) >> (e & 16 ? 4 : 0)) & 0x0F0F0F0Fu;
}

// ==========================================================================================
// rx_q<T>: block size QK (elements), type size TS (bytes), exact decoders

template <int T>
struct rx_q;

template <>
struct rx_q<RX_F32> {
    static constexpr int QK = 1, TS = 4;
    static RX_HD float dec1(const uint8_t* row, long long e) { return rx_as_float(rx_ld_u32u(row + 4 * e)); }
};

template <>
struct rx_q<RX_F16> {
    static constexpr int QK = 1, TS = 2;
    static RX_HD float dec1(const uint8_t* row, long long e) { return rx_f16_to_f32(rx_ld_u16(row + 2 * e)); }
};

template <>
struct rx_q<RX_BF16> {
    static constexpr int QK = 1, TS = 2;
    static RX_HD float dec1(const uint8_t* row, long long e) { return rx_bf16_to_f32(rx_ld_u16(row + 2 * e)); }
};

// Q8_0: d f16, qs[32] int8.  y[j] = qs[j] * d
template <>
struct rx_q<RX_Q8_0> {
    static constexpr int QK = 32, TS = 34;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const uint32_t w = rx_ld_u32u(b + 2 + e0) ^ 0x80808080u;  // int8 + 128
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(rx_ubyte_f(w, i, 128.0f), d);
    }
};

// Q4_0: d f16, qs[16]. y[j] = d*((qs[j] & 15) - 8), y[j+16] = d*((qs[j] >> 4) - 8)
template <>
struct rx_q<RX_Q4_0> {
    static constexpr int QK = 32, TS = 18;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const uint32_t w = rx_nibbles4(b, 2, e0);
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(d, rx_ubyte_f(w, i, 8.0f));
    }
};

// Q4_1: d f16, m f16, qs[16]. y = d*q + m
template <>
struct rx_q<RX_Q4_1> {
    static constexpr int QK = 32, TS = 20;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const float m = rx_f16_to_f32(rx_ld_u16(b + 2));
        const uint32_t w = rx_nibbles4(b, 4, e0);
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FADD(RX_FMUL(d, rx_ubyte_f(w, i, 0.0f)), m);
    }
};

// Q5_0: d f16, qh u32 (bit j = 5th bit of element j), qs[16]. y = d*(q - 16)
template <>
struct rx_q<RX_Q5_0> {
    static constexpr int QK = 32, TS = 22;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const uint32_t qh = rx_ld_u32u(b + 2);
        uint32_t w = rx_nibbles4(b, 6, e0);
        w |= rx_spread4_bit4((qh >> e0) & 15u);
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(d, rx_ubyte_f(w, i, 16.0f));
    }
};

// Q5_1: d f16, m f16, qh u32, qs[16]. y = d*q + m
template <>
struct rx_q<RX_Q5_1> {
    static constexpr int QK = 32, TS = 24;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const float m = rx_f16_to_f32(rx_ld_u16(b + 2));
        const uint32_t qh = rx_ld_u32u(b + 4);
        uint32_t w = rx_nibbles4(b, 8, e0);
        w |= rx_spread4_bit4((qh >> e0) & 15u);
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FADD(RX_FMUL(d, rx_ubyte_f(w, i, 0.0f)), m);
    }
};

// Q4_K: d f16, dmin f16, scales[12], qs[128]. Sub-block j (32 elements) = low (j even) or high
// (j odd) nibbles of qs[32*(j/2) .. +32]. y = (d*sc_j)*q - (dmin*m_j)
template <>
struct rx_q<RX_Q4_K> {
    static constexpr int QK = 256, TS = 144;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const float dmin = rx_f16_to_f32(rx_ld_u16(b + 2));
        uint32_t s[3];
        rx_ld_words<3>(b + 4, s);
        const int j = e0 >> 5, l = e0 & 31;
        int sc, m;
        rx_k4_scale_min(s[0], s[1], s[2], j, sc, m);
        const float a = RX_FMUL(d, (float)sc), c = RX_FMUL(dmin, (float)m);
        const uint32_t w = (rx_ld_u32u(b + 16 + 32 * (j >> 1) + l) >> ((j & 1) * 4)) & 0x0F0F0F0Fu;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FSUB(RX_FMUL(a, rx_ubyte_f(w, i, 0.0f)), c);
    }
};

// Q5_K: d, dmin, scales[12], qh[32], qs[128]. As Q4_K; bit j of qh[l] is the 5th bit of
// element 32j + l.
template <>
struct rx_q<RX_Q5_K> {
    static constexpr int QK = 256, TS = 176;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b));
        const float dmin = rx_f16_to_f32(rx_ld_u16(b + 2));
        uint32_t s[3];
        rx_ld_words<3>(b + 4, s);
        const int j = e0 >> 5, l = e0 & 31;
        int sc, m;
        rx_k4_scale_min(s[0], s[1], s[2], j, sc, m);
        const float a = RX_FMUL(d, (float)sc), c = RX_FMUL(dmin, (float)m);
        uint32_t w = (rx_ld_u32u(b + 48 + 32 * (j >> 1) + l) >> ((j & 1) * 4)) & 0x0F0F0F0Fu;
        w |= ((rx_ld_u32u(b + 16 + l) >> j) & 0x01010101u) << 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FSUB(RX_FMUL(a, rx_ubyte_f(w, i, 0.0f)), c);
    }
};

// Q6_K: ql[128], qh[64], scales[16] int8, d f16. Element 128h + 32c + l (h < 2, c < 4, l < 32):
// low 4 bits = nibble (c >> 1) of ql[64h + 32(c & 1) + l], high 2 bits = (qh[32h + l] >> 2c) & 3,
// scale sc[(128h + 32c + l) / 16]. y = (d*sc)*(q - 32)
template <>
struct rx_q<RX_Q6_K> {
    static constexpr int QK = 256, TS = 210;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const int h = e0 >> 7, c = (e0 >> 5) & 3, l = e0 & 31;
        const float d = rx_f16_to_f32(rx_ld_u16(b + 208));
        const int sc = (int)(int8_t)(uint8_t)rx_ld_u8(b + 192 + (e0 >> 4));
        const float a = RX_FMUL(d, (float)sc);
        uint32_t w = (rx_ld_u32u(b + 64 * h + 32 * (c & 1) + l) >> ((c >> 1) * 4)) & 0x0F0F0F0Fu;
        w |= ((rx_ld_u32u(b + 128 + 32 * h + l) >> (2 * c)) & 0x03030303u) << 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(a, rx_ubyte_f(w, i, 32.0f));
    }
};

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d f16 @80, dmin f16 @82.
// Element 128n + 32j + l (n < 2, j < 4, l < 32) = bits 2j.. of qs[32n + l]; its sub-block (16
// elements) is e / 16. y = (d*sc)*q - (dmin*m)
template <>
struct rx_q<RX_Q2_K> {
    static constexpr int QK = 256, TS = 84;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b + 80));
        const float dmin = rx_f16_to_f32(rx_ld_u16(b + 82));
        const uint32_t sc = rx_ld_u8(b + (e0 >> 4));
        const float a = RX_FMUL(d, rx_ubyte_f(sc & 15u, 0, 0.0f)), c = RX_FMUL(dmin, rx_ubyte_f(sc >> 4, 0, 0.0f));
        const int n = e0 >> 7, j = (e0 >> 5) & 3, l = e0 & 31;
        const uint32_t w = (rx_ld_u32u(b + 16 + 32 * n + l) >> (2 * j)) & 0x03030303u;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FSUB(RX_FMUL(a, rx_ubyte_f(w, i, 0.0f)), c);
    }
};

// Q3_K: hmask[32], qs[64] @32, scales[12] @96 (rx_q3k_scale), d f16 @108. Element 128n + 32j + l:
// low 2 bits = bits 2j.. of qs[32n + l], q = that - 4 unless bit 4n + j of hmask[l] is set;
// sub-block e / 16. y = (d*(sc - 32))*q
template <>
struct rx_q<RX_Q3_K> {
    static constexpr int QK = 256, TS = 110;
    static RX_HD void dec4(const uint8_t* b, int e0, float* y) {
        const float d = rx_f16_to_f32(rx_ld_u16(b + 108));
        uint32_t s[3];
        rx_ld_words<3>(b + 96, s);
        const float a = RX_FMUL(d, (float)rx_q3k_scale(s[0], s[1], s[2], e0 >> 4));
        const int n = e0 >> 7, j = (e0 >> 5) & 3, l = e0 & 31;
        uint32_t w = (rx_ld_u32u(b + 32 + 32 * n + l) >> (2 * j)) & 0x03030303u;
        w |= ((rx_ld_u32u(b + l) >> (4 * n + j)) & 0x01010101u) << 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = RX_FMUL(a, rx_ubyte_f(w, i, 4.0f));
    }
};

// ==========================================================================================
// rx_qi<T>: the integer view of a block, for the prefill matmul on x halves (reflex_matmul_xh_<t>,
// reflex/quant_kernels.cuh). Element e = a * q + c with q a small integer and (a, c) per
// sub-block of SUB (32 or 16) elements, and a * q + c in float32 (product, then sum) gives
// rx_q<T>::dec4's value bit for bit (the host tests check it), so the integer products are the
// weights' own.
//   ints(b, e0)    the q of elements [e0, e0+4) of the block at b (e0 % 4 == 0) as the four
//                  signed bytes of one word, byte i = element e0 + i
//   scale(b, e0)   (a, c) of the sub-block holding e0
//   MIN            whether there is a c (false: c = 0 and the value is a * q alone)

template <int T>
struct rx_qi;

// (v | 0x80) - k per byte, then the top bit back: byte-wise v - k as signed bytes, no borrow
// between bytes (0 <= v < 128, 0 <= k <= 128)
RX_HD uint32_t rx_bytes_minus(uint32_t v, uint32_t k) {
    return ((v | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u;
}

template <>
struct rx_qi<RX_Q8_0> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) { return rx_ld_u32u(b + 2 + e0); }
    static RX_HD float2 scale(const uint8_t* b, int) { return make_float2(rx_f16_to_f32(rx_ld_u16(b)), 0.0f); }
};

template <>
struct rx_qi<RX_Q4_0> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        return rx_bytes_minus(rx_nibbles4(b, 2, e0), 8);
    }
    static RX_HD float2 scale(const uint8_t* b, int) { return make_float2(rx_f16_to_f32(rx_ld_u16(b)), 0.0f); }
};

template <>
struct rx_qi<RX_Q5_0> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        uint32_t w = rx_nibbles4(b, 6, e0);
        w |= rx_spread4_bit4((rx_ld_u32u(b + 2) >> e0) & 15u);
        return rx_bytes_minus(w, 16);
    }
    static RX_HD float2 scale(const uint8_t* b, int) { return make_float2(rx_f16_to_f32(rx_ld_u16(b)), 0.0f); }
};

template <>
struct rx_qi<RX_Q4_K> {
    static constexpr bool MIN = true;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        const int j = e0 >> 5, l = e0 & 31;
        return (rx_ld_u32u(b + 16 + 32 * (j >> 1) + l) >> ((j & 1) * 4)) & 0x0F0F0F0Fu;
    }
    static RX_HD float2 scale(const uint8_t* b, int e0) {
        uint32_t s[3];
        rx_ld_words<3>(b + 4, s);
        int sc, m;
        rx_k4_scale_min(s[0], s[1], s[2], e0 >> 5, sc, m);
        return make_float2(RX_FMUL(rx_f16_to_f32(rx_ld_u16(b)), (float)sc),
                           -RX_FMUL(rx_f16_to_f32(rx_ld_u16(b + 2)), (float)m));
    }
};

template <>
struct rx_qi<RX_Q5_K> {
    static constexpr bool MIN = true;
    static constexpr int SUB = 32;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        const int j = e0 >> 5, l = e0 & 31;
        const uint32_t w = (rx_ld_u32u(b + 48 + 32 * (j >> 1) + l) >> ((j & 1) * 4)) & 0x0F0F0F0Fu;
        return w | ((rx_ld_u32u(b + 16 + l) >> j) & 0x01010101u) << 4;
    }
    static RX_HD float2 scale(const uint8_t* b, int e0) { return rx_qi<RX_Q4_K>::scale(b, e0); }
};

template <>
struct rx_qi<RX_Q6_K> {
    static constexpr bool MIN = false;
    static constexpr int SUB = 16;
    static RX_HD uint32_t ints(const uint8_t* b, int e0) {
        const int h = e0 >> 7, c = (e0 >> 5) & 3, l = e0 & 31;
        uint32_t w = (rx_ld_u32u(b + 64 * h + 32 * (c & 1) + l) >> ((c >> 1) * 4)) & 0x0F0F0F0Fu;
        w |= ((rx_ld_u32u(b + 128 + 32 * h + l) >> (2 * c)) & 0x03030303u) << 4;
        return rx_bytes_minus(w, 32);
    }
    static RX_HD float2 scale(const uint8_t* b, int e0) {
        const int sc = (int)(int8_t)(uint8_t)rx_ld_u8(b + 192 + (e0 >> 4));
        return make_float2(RX_FMUL(rx_f16_to_f32(rx_ld_u16(b + 208)), (float)sc), 0.0f);
    }
};

// ==========================================================================================
// rx_lu<T>: GEMV lane units (see the header comment). Usage, per lane and weight row:
//   rx_lu<T> u; u.load(block_ptr, j); u.prep(j);
//   for s < SUB: u.dec<EXACT>(j, s, w)  -> w[0..3] at e0(j,s)+0..3, w[4..7] at e1(j,s)+0..3
// (types that share a unit between lanes: rx_unit_lanes below).
// rx_unit_scaled<T>::value: every value of a unit is scale() * (what unscaled(s, w) gives), so
// the GEMV multiplies once per unit (rx_gemv_rows below).

template <int T>
struct rx_lu;

template <int TYPE>
struct rx_unit_scaled {
    static constexpr bool value = false;
};

// rx_unit_int<T>::value: the unit's unscaled values are small integers that its rx_lu gives as
// signed bytes, ints(k, lo, hi) (the lane's step k: the four values at e0 in lo, at e1 in hi), so
// the one-token GEMV can run on x limbs (rx_gemv_rows_xq). Needs rx_unit_scaled.
template <int TYPE>
struct rx_unit_int {
    static constexpr bool value = false;
};

// rx_unit_lanes<T, TT>::value = P: how many lanes share one unit in a GEMV of TT tokens (1, 2 or
// 4; divides SUB). Lane part p < P of a unit takes its steps p * SUB/P + k, k < SUB/P, and its
// rx_lu has load<SUB/P>(block_ptr, j, p) (only those steps' bytes); dec<EXACT>(j, k, w) /
// unscaled(k, w) then name the lane's k-th step (e0 / e1 still take the step itself). Why: with
// one lane a unit, a warp's x load touches one 128-byte line per lane for types whose unit spans
// a line of x (IQ4_XS: 32 lanes, 32 lines), and the L1's lines per wavefront bind the GEMV long
// before the DRAM does; P lanes a unit read x P times more densely. The price: each lane of a
// unit loads its header and runs prep(). P may depend on TT: a lane holds SUB/P steps' weights
// against TT tokens' x, and more tokens want fewer steps a lane (registers).
template <int TYPE, int TT>
struct rx_unit_lanes {
    static constexpr int value = 1;
};

// Load lane part `part` of unit j of the block at b, for P = rx_unit_lanes lanes a unit (the
// GEMV loop and the host harness's lane-unit dequantization both load through this).
template <int P, typename L>
RX_HD void rx_lu_load(L& u, const uint8_t* b, int j, int part) {
    if constexpr (P == 1) {
        u.load(b, j);
    } else {
        u.template load<L::SUB / P>(b, j, part);
    }
}

// Float types: pseudo-blocks of 8 elements (the GEMV needs n_in % 8 == 0 and 16B rows).
template <>
struct rx_lu<RX_F32> {
    static constexpr int QK = 8, TS = 32, LPB = 1, SUB = 1, ALIGN = 16;
    uint32_t v[8];
    RX_HD void load(const uint8_t* b, int) {
        uint32_t a[4], c[4];
        rx_ld_v4(b, a);
        rx_ld_v4(b + 16, c);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[i] = a[i];
            v[4 + i] = c[i];
        }
    }
    RX_HD void prep(int) {}
    static RX_HD int e0(int, int) { return 0; }
    static RX_HD int e1(int, int) { return 4; }
    template <bool EXACT>
    RX_HD void dec(int, int, float* w) const {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = rx_as_float(v[i]);
    }
};

template <>
struct rx_lu<RX_F16> {
    static constexpr int QK = 8, TS = 16, LPB = 1, SUB = 1, ALIGN = 16;
    uint32_t v[4];
    RX_HD void load(const uint8_t* b, int) { rx_ld_v4(b, v); }
    RX_HD void prep(int) {}
    static RX_HD int e0(int, int) { return 0; }
    static RX_HD int e1(int, int) { return 4; }
    template <bool EXACT>
    RX_HD void dec(int, int, float* w) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[2 * i] = EXACT ? rx_f16_to_f32(v[i] & 0xffffu) : rx_f16_to_f32_fast(v[i] & 0xffffu);
            w[2 * i + 1] = EXACT ? rx_f16_to_f32(v[i] >> 16) : rx_f16_to_f32_fast(v[i] >> 16);
        }
    }
};

template <>
struct rx_lu<RX_BF16> {
    static constexpr int QK = 8, TS = 16, LPB = 1, SUB = 1, ALIGN = 16;
    uint32_t v[4];
    RX_HD void load(const uint8_t* b, int) { rx_ld_v4(b, v); }
    RX_HD void prep(int) {}
    static RX_HD int e0(int, int) { return 0; }
    static RX_HD int e1(int, int) { return 4; }
    template <bool EXACT>
    RX_HD void dec(int, int, float* w) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[2 * i] = rx_as_float(v[i] << 16);
            w[2 * i + 1] = rx_as_float(v[i] & 0xffff0000u);
        }
    }
};

// Q8_0: 2 units per block, 16 quants each (funnel-shifted word loads: blocks are 2-aligned).
// j: qs[16j .. 16j+16); step s: elements 16j + 8s + [0, 8). Two lanes a unit, a step each.
template <>
struct rx_lu<RX_Q8_0> {
    static constexpr int QK = 32, TS = 34, LPB = 2, SUB = 2, ALIGN = 2;
    uint32_t q[2];
    uint32_t dh;
    float d;
    template <int STEPS>
    RX_HD void load(const uint8_t* b, int j, int part) {
        static_assert(STEPS == 1, "Q8_0: two lanes a unit, a step each");
        rx_ld_words<2>(b + 2 + 16 * j + 8 * part, q);
        dh = rx_ld_u16(b);
    }
    RX_HD void prep(int) { d = rx_f16_to_f32_fast(dh); }
    static RX_HD int e0(int j, int s) { return 16 * j + 8 * s; }
    static RX_HD int e1(int j, int s) { return 16 * j + 8 * s + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int k, float* w) const {
        unscaled(k, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = rx_mul<EXACT>(w[i], d);
    }
    RX_HD float scale() const { return d; }
    RX_HD void unscaled(int, float* w) const {
        const uint32_t a = q[0] ^ 0x80808080u, c = q[1] ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = rx_ubyte_f(a, i, 128.0f);
            w[4 + i] = rx_ubyte_f(c, i, 128.0f);
        }
    }
};
template <>
struct rx_unit_scaled<RX_Q8_0> {
    static constexpr bool value = true;
};
template <int TT>
struct rx_unit_lanes<RX_Q8_0, TT> {
    static constexpr int value = 2;
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1: one unit per block. Step s: word s of qs -> low nibbles are
// elements 4s + [0,4), high nibbles 16 + 4s + [0,4).
template <>
struct rx_lu<RX_Q4_0> {
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
        const uint32_t lo = q[s] & 0x0F0F0F0Fu, hi = (q[s] >> 4) & 0x0F0F0F0Fu;
        rx_dec8<EXACT>(lo, hi, 8.0f, d, d, w);
    }
};

template <>
struct rx_lu<RX_Q4_1> {
    static constexpr int QK = 32, TS = 20, LPB = 1, SUB = 4, ALIGN = 2;
    uint32_t q[4];
    uint32_t dm[1];
    float d, m;
    RX_HD void load(const uint8_t* b, int) {
        rx_ld_words<1>(b, dm);
        rx_ld_words<4>(b + 4, q);
    }
    RX_HD void prep(int) {
        d = rx_f16_to_f32_fast(dm[0] & 0xffffu);
        m = rx_f16_to_f32_fast(dm[0] >> 16);
    }
    static RX_HD int e0(int, int s) { return 4 * s; }
    static RX_HD int e1(int, int s) { return 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const uint32_t lo = q[s] & 0x0F0F0F0Fu, hi = (q[s] >> 4) & 0x0F0F0F0Fu;
        rx_dec8_affine<EXACT, false>(lo, hi, d, m, d, m, w);
    }
};

template <>
struct rx_lu<RX_Q5_0> {
    static constexpr int QK = 32, TS = 22, LPB = 1, SUB = 4, ALIGN = 2;
    uint32_t q[4];
    uint32_t qh[1];
    uint32_t dh;
    float d;
    RX_HD void load(const uint8_t* b, int) {
        dh = rx_ld_u16(b);
        rx_ld_words<1>(b + 2, qh);
        rx_ld_words<4>(b + 6, q);
    }
    RX_HD void prep(int) { d = rx_f16_to_f32_fast(dh); }
    static RX_HD int e0(int, int s) { return 4 * s; }
    static RX_HD int e1(int, int s) { return 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const uint32_t lo = (q[s] & 0x0F0F0F0Fu) | rx_spread4_bit4((qh[0] >> (4 * s)) & 15u);
        const uint32_t hi = ((q[s] >> 4) & 0x0F0F0F0Fu) | rx_spread4_bit4((qh[0] >> (16 + 4 * s)) & 15u);
        rx_dec8<EXACT>(lo, hi, 16.0f, d, d, w);
    }
};

template <>
struct rx_lu<RX_Q5_1> {
    static constexpr int QK = 32, TS = 24, LPB = 1, SUB = 4, ALIGN = 2;
    uint32_t q[4];
    uint32_t hd[2];  // d|m, qh
    float d, m;
    RX_HD void load(const uint8_t* b, int) {
        rx_ld_words<2>(b, hd);
        rx_ld_words<4>(b + 8, q);
    }
    RX_HD void prep(int) {
        d = rx_f16_to_f32_fast(hd[0] & 0xffffu);
        m = rx_f16_to_f32_fast(hd[0] >> 16);
    }
    static RX_HD int e0(int, int s) { return 4 * s; }
    static RX_HD int e1(int, int s) { return 16 + 4 * s; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const uint32_t lo = (q[s] & 0x0F0F0F0Fu) | rx_spread4_bit4((hd[1] >> (4 * s)) & 15u);
        const uint32_t hi = ((q[s] >> 4) & 0x0F0F0F0Fu) | rx_spread4_bit4((hd[1] >> (16 + 4 * s)) & 15u);
        rx_dec8_affine<EXACT, false>(lo, hi, d, m, d, m, w);
    }
};

// What the Q4_K and Q5_K lane units share: unit j's two affine maps (an element is a * q - c;
// the low nibbles' sub-block 2(j/2) takes a0, c0, the high ones' 2(j/2)+1 a1, c1) from the
// block's 16-byte header hd (d, dmin, the 12 scale bytes).
RX_HD void rx_k4_unit_affine(const uint32_t (&hd)[4], int j, float& a0, float& c0, float& a1, float& c1) {
    const float d = rx_f16_to_f32_fast(hd[0] & 0xffffu), dmin = rx_f16_to_f32_fast(hd[0] >> 16);
    uint32_t sc2, m2;
    rx_k4_scale_min2(hd[1], hd[2], hd[3], j >> 1, sc2, m2);
    a0 = RX_FMUL(d, rx_ubyte_f(sc2, 0, 0.0f));
    c0 = RX_FMUL(dmin, rx_ubyte_f(m2, 0, 0.0f));
    a1 = RX_FMUL(d, rx_ubyte_f(sc2, 1, 0.0f));
    c1 = RX_FMUL(dmin, rx_ubyte_f(m2, 1, 0.0f));
}

// Q4_K: 8 units per block, unit j = 16 bytes qs[16j .. 16j+16) (t = j/2, h = j%2) plus the
// 16-byte header (d, dmin, scales), both one 128-bit load (144 = 9*16: blocks stay 16B-aligned).
// Step s: word s -> low nibbles are elements 64t + 16h + 4s + [0,4) (sub-block 2t), high
// nibbles the same + 32 (sub-block 2t+1).
template <>
struct rx_lu<RX_Q4_K> {
    static constexpr int QK = 256, TS = 144, LPB = 8, SUB = 4, ALIGN = 16;
    uint32_t hd[4];
    uint32_t q[4];
    float a0, c0, a1, c1;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_v4(b, hd);
        rx_ld_v4(b + 16 + 16 * j, q);
    }
    // the same from a block that may be in shared memory (16-byte aligned)
    RX_HD void load_any(const uint8_t* b, int j) {
        rx_ld_v4_any((const uint32_t*)b, hd);
        rx_ld_v4_any((const uint32_t*)(b + 16 + 16 * j), q);
    }
    RX_HD void prep(int j) { rx_k4_unit_affine(hd, j, a0, c0, a1, c1); }
    static RX_HD int e0(int j, int s) { return 64 * (j >> 1) + 16 * (j & 1) + 4 * s; }
    static RX_HD int e1(int j, int s) { return 64 * (j >> 1) + 16 * (j & 1) + 4 * s + 32; }
    RX_HD void ints(int, int s, uint32_t& lo, uint32_t& hi) const {
        lo = q[s] & 0x0F0F0F0Fu;
        hi = (q[s] >> 4) & 0x0F0F0F0Fu;
    }
    RX_HD void affine(int h, float& mul, float& sub) const {
        mul = h ? a1 : a0;
        sub = h ? c1 : c0;
    }
    template <bool EXACT>
    RX_HD void dec(int j, int s, float* w) const {
        uint32_t lo, hi;
        ints(j, s, lo, hi);
        rx_dec8_affine<EXACT, true>(lo, hi, a0, c0, a1, c1, w);
    }
};

// Q5_K: as Q4_K (qs at byte 48 + 16j), plus qh bytes [16h, 16h+16) (byte 16 + 16h): bit 2t /
// 2t+1 of qh[16h + 4s + i] is the 5th bit of the low / high nibble element.
template <>
struct rx_lu<RX_Q5_K> {
    static constexpr int QK = 256, TS = 176, LPB = 8, SUB = 4, ALIGN = 16;
    uint32_t hd[4];
    uint32_t qh[4];
    uint32_t q[4];
    float a0, c0, a1, c1;
    RX_HD void load(const uint8_t* b, int j) {
        rx_ld_v4(b, hd);
        rx_ld_v4(b + 16 + 16 * (j & 1), qh);
        rx_ld_v4(b + 48 + 16 * j, q);
    }
    RX_HD void prep(int j) { rx_k4_unit_affine(hd, j, a0, c0, a1, c1); }
    static RX_HD int e0(int j, int s) { return 64 * (j >> 1) + 16 * (j & 1) + 4 * s; }
    static RX_HD int e1(int j, int s) { return 64 * (j >> 1) + 16 * (j & 1) + 4 * s + 32; }
    RX_HD void ints(int j, int s, uint32_t& lo, uint32_t& hi) const {
        const int t2 = 2 * (j >> 1);
        lo = (q[s] & 0x0F0F0F0Fu) | (((qh[s] >> t2) & 0x01010101u) << 4);
        hi = ((q[s] >> 4) & 0x0F0F0F0Fu) | (((qh[s] >> (t2 + 1)) & 0x01010101u) << 4);
    }
    RX_HD void affine(int h, float& mul, float& sub) const {
        mul = h ? a1 : a0;
        sub = h ? c1 : c0;
    }
    template <bool EXACT>
    RX_HD void dec(int j, int s, float* w) const {
        uint32_t lo, hi;
        ints(j, s, lo, hi);
        rx_dec8_affine<EXACT, true>(lo, hi, a0, c0, a1, c1, w);
    }
};

// Q6_K: 8 units per block (blocks are only 2-aligned: funnel-shifted word loads). Unit j
// (h = j/4, k = j%4): ql bytes [64h + 16k, +16), qh bytes [32h + 16(k&1), +16), scales
// sc[8h + k] (low nibbles) and sc[8h + 4 + k] (high nibbles). Step s: low nibbles of ql word s
// are elements 128h + 16k + 4s + [0,4) (qh shift 2(k/2)), high nibbles the same + 64
// (qh shift 4 + 2(k/2)).
template <>
struct rx_lu<RX_Q6_K> {
    static constexpr int QK = 256, TS = 210, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t ql[4];
    uint32_t qh[4];
    uint32_t scb, dh;
    float a0, a1;
    RX_HD void load(const uint8_t* b, int j) {
        const int h = j >> 2, k = j & 3;
        rx_ld_words<4>(b + 64 * h + 16 * k, ql);
        rx_ld_words<4>(b + 128 + 32 * h + 16 * (k & 1), qh);
        scb = rx_ld_u8(b + 192 + 8 * h + k) | (rx_ld_u8(b + 196 + 8 * h + k) << 8);
        dh = rx_ld_u16(b + 208);
    }
    // the same from a block that may be in shared memory (2-byte aligned, as in a row)
    RX_HD void load_any(const uint8_t* b, int j) {
        const int h = j >> 2, k = j & 3;
        rx_ld_words<4, false>(b + 64 * h + 16 * k, ql);
        rx_ld_words<4, false>(b + 128 + 32 * h + 16 * (k & 1), qh);
        scb = (uint32_t)b[192 + 8 * h + k] | ((uint32_t)b[196 + 8 * h + k] << 8);
        dh = (uint32_t)*(const uint16_t*)(b + 208);
    }
    RX_HD void prep(int) {
        const float d = rx_f16_to_f32_fast(dh);
        a0 = RX_FMUL(d, (float)(int)(int8_t)(uint8_t)(scb & 0xffu));
        a1 = RX_FMUL(d, (float)(int)(int8_t)(uint8_t)(scb >> 8));
    }
    static RX_HD int e0(int j, int s) { return 128 * (j >> 2) + 16 * (j & 3) + 4 * s; }
    static RX_HD int e1(int j, int s) { return 128 * (j >> 2) + 16 * (j & 3) + 4 * s + 64; }
    // the unsigned 6-bit values b (the weight is a * (b - 32): affine's sub = 32 a, exact)
    RX_HD void ints(int j, int s, uint32_t& lo, uint32_t& hi) const {
        const int sh = 2 * ((j & 3) >> 1);
        lo = (ql[s] & 0x0F0F0F0Fu) | (((qh[s] >> sh) & 0x03030303u) << 4);
        hi = ((ql[s] >> 4) & 0x0F0F0F0Fu) | (((qh[s] >> (sh + 4)) & 0x03030303u) << 4);
    }
    RX_HD void affine(int h, float& mul, float& sub) const {
        mul = h ? a1 : a0;
        sub = RX_FMUL(32.0f, mul);
    }
    template <bool EXACT>
    RX_HD void dec(int j, int s, float* w) const {
        const int sh = 2 * ((j & 3) >> 1);
        const uint32_t lo = (ql[s] & 0x0F0F0F0Fu) | (((qh[s] >> sh) & 0x03030303u) << 4);
        const uint32_t hi = ((ql[s] >> 4) & 0x0F0F0F0Fu) | (((qh[s] >> (sh + 4)) & 0x03030303u) << 4);
        rx_dec8<EXACT>(lo, hi, 32.0f, a0, a1, w);
    }
};

// Q2_K: 8 units per block (84-byte blocks are 4-aligned at best: word loads). Unit j (n = j/4,
// k = j%4): qs bytes [32n + 8k, +8), the 8 scale bytes of half n, d|dmin. Step s (the 2-bit
// field 2s.. of each byte): elements 128n + 32s + 8k + [0, 8), sub-block 8n + 2s + k/2.
template <>
struct rx_lu<RX_Q2_K> {
    static constexpr int QK = 256, TS = 84, LPB = 8, SUB = 4, ALIGN = 1;
    uint32_t q[2];
    uint32_t sc[2];
    uint32_t dm[1];
    float a[4], c[4];
    RX_HD void load(const uint8_t* b, int j) {
        const int n = j >> 2, k = j & 3;
        rx_ld_words<2>(b + 16 + 32 * n + 8 * k, q);
        rx_ld_words<2>(b + 8 * n, sc);
        rx_ld_words<1>(b + 80, dm);
    }
    RX_HD void prep(int j) {
        const float d = rx_f16_to_f32_fast(dm[0] & 0xffffu), dmin = rx_f16_to_f32_fast(dm[0] >> 16);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint32_t v = sc[s >> 1] >> (16 * (s & 1) + 8 * ((j & 3) >> 1));
            a[s] = RX_FMUL(d, rx_ubyte_f(v & 15u, 0, 0.0f));
            c[s] = RX_FMUL(dmin, rx_ubyte_f((v >> 4) & 15u, 0, 0.0f));
        }
    }
    static RX_HD int e0(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3); }
    static RX_HD int e1(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3) + 4; }
    template <bool EXACT>
    RX_HD void dec(int, int s, float* w) const {
        const uint32_t lo = (q[0] >> (2 * s)) & 0x03030303u, hi = (q[1] >> (2 * s)) & 0x03030303u;
        rx_dec8_affine<EXACT, true>(lo, hi, a[s], c[s], a[s], c[s], w);
    }
};

// Q3_K: 8 units per block (110-byte blocks are only 2-aligned: funnel-shifted word loads). Unit
// j (n = j/4, k = j%4): qs bytes [32n + 8k, +8), hmask bytes [8k, +8), the 12 scale bytes, d.
// Step s: elements 128n + 32s + 8k + [0, 8) (hmask bit 4n + s), sub-block 8n + 2s + k/2.
template <>
struct rx_lu<RX_Q3_K> {
    static constexpr int QK = 256, TS = 110, LPB = 8, SUB = 4, ALIGN = 2;
    uint32_t q[2];
    uint32_t hm[2];
    uint32_t sc[3];
    uint32_t dh;
    float a[4];
    RX_HD void load(const uint8_t* b, int j) {
        const int n = j >> 2, k = j & 3;
        rx_ld_words<2>(b + 32 + 32 * n + 8 * k, q);
        rx_ld_words<2>(b + 8 * k, hm);
        rx_ld_words<3>(b + 96, sc);
        dh = rx_ld_u16(b + 108);
    }
    RX_HD void prep(int j) {
        const float d = rx_f16_to_f32_fast(dh);
#pragma unroll
        for (int s = 0; s < 4; ++s)
            a[s] = RX_FMUL(d, (float)rx_q3k_scale(sc[0], sc[1], sc[2], 8 * (j >> 2) + 2 * s + ((j & 3) >> 1)));
    }
    static RX_HD int e0(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3); }
    static RX_HD int e1(int j, int s) { return 128 * (j >> 2) + 32 * s + 8 * (j & 3) + 4; }
    template <bool EXACT>
    RX_HD void dec(int j, int s, float* w) const {
        const int hb = 4 * (j >> 2) + s;
        const uint32_t lo = ((q[0] >> (2 * s)) & 0x03030303u) | (((hm[0] >> hb) & 0x01010101u) << 2);
        const uint32_t hi = ((q[1] >> (2 * s)) & 0x03030303u) | (((hm[1] >> hb) & 0x01010101u) << 2);
        rx_dec8<EXACT>(lo, hi, 4.0f, a[s], a[s], w);
    }
};

// The codebook types (IQ*), TQ1_0 / TQ2_0 and MXFP4: their rx_q / rx_lu specializations. A unit
// that instantiates none of them (quant.cu) defines REFLEX_QUANTS_COMMON_ONLY first, so that
// its image does not carry their codebook tables.
#ifndef REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quants_iq.cuh"
#endif

// The unit loop both GEMV forms share: calls unit(bp, xb, j, part) for each lane unit of the lane's
// share (rx_gemv_rows' slots): bp[r] its block in row r, xb the block's first element of x (XT: one
// 32-bit word an element, so float x and the x limbs index alike), j its place in the block, part
// the lane's part of it.
template <typename L, int P, int R, typename XT, typename F>
RX_HD void rx_gemv_units(const uint8_t* const (&rp)[R], const XT* __restrict__ x, int n_in, int first,
                         int stride, F&& unit) {
    if constexpr (P == 1) {
        // Block and place recomputed per unit: with the place hoisted (the loop below), ptxas
        // keeps a pointer per load of the unit and the many-load K-quants lose occupancy (the
        // one-token Q6_K GEMV: 72 registers instead of 43, and 25% slower on the H200).
        const unsigned n_lu = (unsigned)(n_in / L::QK) * (unsigned)L::LPB;
        for (unsigned lu = (unsigned)first; lu < n_lu; lu += (unsigned)stride) {
            const unsigned blk = lu / (unsigned)L::LPB;
            const uint8_t* bp[R];
#pragma unroll
            for (int r = 0; r < R; ++r) bp[r] = rp[r] + (long long)blk * L::TS;
            unit(bp, x + (long long)blk * L::QK, (int)(lu % (unsigned)L::LPB), 0);
        }
    } else {
        // The lane's units are unit0, unit0 + stride / P, ...: stride is a multiple of 32 and
        // P <= 4, so the step is a multiple of LPB (<= 8) units, a whole number of blocks; the
        // place j in the block stays the same and the loop just advances pointers.
        const int unit0 = first / P, j = unit0 % L::LPB;
        const int blk_step = stride / P / L::LPB, n_blk = n_in / L::QK;
        const uint8_t* bp[R];
#pragma unroll
        for (int r = 0; r < R; ++r) bp[r] = rp[r] + (long long)(unit0 / L::LPB) * L::TS;
        const XT* xb = x + (long long)(unit0 / L::LPB) * L::QK;
        for (int blk = unit0 / L::LPB; blk < n_blk; blk += blk_step) {
            unit(bp, xb, j, first % P);
#pragma unroll
            for (int r = 0; r < R; ++r) bp[r] += (long long)blk_step * L::TS;
            xb += (long long)blk_step * L::QK;
        }
    }
}

// ==========================================================================================
// The GEMV lane loop, shared by the kernels (cuda/quant.cu) and the host harness (which runs it
// for every lane and sums): a lane that owns R weight rows (row r starts at rp[r]; the rows may
// come from different matrices of the same type and n_in) accumulates its partial dot products
// acc[r][t] = sum over its share of W_r[i] * x[t, i], for t < T (TT >= T; tokens t >= T
// contribute zeros). Its share is given in lane slots: slot first, first + stride, ... (a
// warp's lanes take consecutive slots, stride 32, or the ks warps that split a row take
// interleaved runs of 32: first = 32 * slice + lane, stride 32 * ks). With P =
// rx_unit_lanes<T, TT> lanes a unit, slot k is part k % P of unit k / P. x rows are n_in floats
// apart and 16-byte aligned.
//
// Types whose unit has one scale (rx_unit_scaled<T>: a unit's values are a * v_i) accumulate
// sum v_i * x_i per unit and add a * that sum: one multiply per unit and token instead of one
// per element (the GEMV is not bit-exact with the dequantization anyway; tests bound it).

template <int TYPE, int TT, int R, bool EXACT = false>
RX_HD void rx_gemv_rows(const uint8_t* const (&rp)[R], const float* __restrict__ x, int T, int n_in,
                        int first, int stride, float (&acc)[R][TT]) {
    typedef rx_lu<TYPE> L;
    constexpr bool SCALED = rx_unit_scaled<TYPE>::value;
    constexpr int P = rx_unit_lanes<TYPE, TT>::value;
    static_assert(P == 1 || P == 2 || P == 4, "lanes a unit: 1, 2 or 4");
    static_assert(L::SUB % P == 0, "every lane of a unit takes as many steps");
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;
    }
    constexpr int STEPS = L::SUB / P;  // steps a lane takes of each unit
    // One unit (block pointers bp, its x at xb, place j in the block, the lane's part of it)
    auto unit = [&](const uint8_t* const (&bp)[R], const float* xb, int j, int my_part) {
        L u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) rx_lu_load<P>(u[r], bp[r], j, my_part);
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].prep(j);
        float part[R][TT];  // SCALED: this unit's sums of v_i * x_i
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int t = 0; t < TT; ++t) part[r][t] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < STEPS; ++k) {
            const int s = my_part * STEPS + k;
            const int e0 = L::e0(j, s), e1 = L::e1(j, s);
            float xv[TT][8];
#pragma unroll
            for (int t = 0; t < TT; ++t) {
                if (t < T) {
                    rx_ld_f4(xb + (long long)t * n_in + e0, &xv[t][0]);
                    rx_ld_f4(xb + (long long)t * n_in + e1, &xv[t][4]);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) xv[t][i] = 0.0f;
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float wv[8];
                if constexpr (SCALED) {
                    u[r].unscaled(k, wv);
                } else {
                    u[r].template dec<EXACT>(j, k, wv);
                }
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    float& a = SCALED ? part[r][t] : acc[r][t];
#pragma unroll
                    for (int i = 0; i < 8; ++i) a = fmaf(wv[i], xv[t][i], a);
                }
            }
        }
        if constexpr (SCALED) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int t = 0; t < TT; ++t) acc[r][t] = fmaf(u[r].scale(), part[r][t], acc[r][t]);
            }
        }
    };
    rx_gemv_units<L, P, R>(rp, x, n_in, first, stride, unit);
}

// x limbs (written by reflex_x_limbs, cuda/core.cu): each 32-element block of x has a power-of-two
// scale s and integers X_i = rint(x_i / s) with |X_i| <= 2^22 (s from the block's largest |x|), so
// x_i = s * X_i to 23 significant bits of that largest value. A group of 4 elements is 4 words
// (16 bytes): words 0 and 1 hold bytes 0 and 1 of its four X (unsigned), word 2 their byte 2
// (signed: X >> 16), word 3 s. Sum w_i X_i is then three byte dot products (dp4a) per 4 weights,
// exact in int32: X = 65536 * byte2 + 256 * byte1 + byte0.
// The groups are laid out in the order the one-token IQ4_XS GEMV's warp loads them, so that each
// of its x loads reads 512 contiguous bytes (4 cache lines; x as floats: 16 lines, and the L1's
// lines per wavefront bound that GEMV): per chunk of 512 elements (16 lane units, what a warp's
// 32 lanes take at a time: lane L = 2u + p, part p of unit u), load i = 2k + h of lane L (step k,
// h = 0 the e0 group, 1 the e1 one) is the 16 bytes at chunk + 16 (32 i + L). So group q (< 8) of
// unit u, q = 2p + k + 4h, sits at slot 32 (2k + h) + 2u + p. A last partial chunk keeps its
// places (the buffer holds whole chunks). rx_xq_slot (reflex/common.cuh) maps a group to its slot.
template <bool SIGNED_B>
RX_HD int rx_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    int d;
    if constexpr (SIGNED_B) {
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    } else {
        asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    }
    return d;
#else
    for (int i = 0; i < 4; ++i) {
        const int ai = (int)(int8_t)(a >> (8 * i));
        const int bi = SIGNED_B ? (int)(int8_t)(b >> (8 * i)) : (int)((b >> (8 * i)) & 0xffu);
        c += ai * bi;
    }
    return c;
#endif
}
// |v| < 2^22 -> float, exactly, without the quarter-rate integer conversion
RX_HD float rx_small_int_f(int v) {
#ifdef __CUDA_ARCH__
    return __int_as_float(0x4B400000 + v) - 12582912.0f;
#else
    return (float)v;
#endif
}

// x in the lanes' load order: the one-token GEMV of the K-quants stages x in shared memory
// (gemv_body's XS form, reflex/quant_kernels.cuh) so that each of a warp's x loads reads 512
// contiguous bytes. A chunk is the UNITS lane units that a warp's 32 lane slots take at a time;
// its slot q = 32 (2k + h) + l holds the 4 values that slot l's step k pairs with its weights at
// e0 (h = 0) or e1 (h = 1).
template <int TYPE>
struct rx_x_lanes {
    typedef rx_lu<TYPE> L;
    static constexpr int P = rx_unit_lanes<TYPE, 1>::value;
    static constexpr int STEPS = L::SUB / P;
    static constexpr int UNITS = 32 / P;          // lane units a chunk
    static constexpr int SLOTS = 2 * STEPS * 32;  // 4-value slots a chunk
    static RX_HD int chunks(int n_in) { return (n_in / L::QK * L::LPB + UNITS - 1) / UNITS; }
    // the first of the 4 elements of x that slot q of chunk c holds (n_in or more: none)
    static RX_HD int elem(int c, int q) {
        const int k = q >> 6, h = (q >> 5) & 1, l = q & 31;
        const int unit = c * UNITS + l / P, s = (l % P) * STEPS + k;
        const int blk = unit / L::LPB, j = unit % L::LPB;
        return blk * L::QK + (h ? L::e1(j, s) : L::e0(j, s));
    }
};

// The staged x of the K-quants' one-token GEMV are limbs in that order: each lane run (the 16
// elements a lane unit pairs with its e0 weights, or with its e1 weights: 4 slots of one lane)
// has a power-of-two scale s and integers X_i = rint(x_i / s), |X_i| <= 2^22, s from the run's
// largest |x| as in reflex_x_limbs (cuda/core.cu): M < 2^e, s = 2^(e-22); M = 0: s = 1, X = 0; a
// NaN or inf in the run: s = NaN, X = 0. A slot is 4 words: bytes 0, 1 and 2 of its four X
// (the last signed), then in the run's first slot s and in its second s * (the run's sum of X,
// rounded to a float), the weights' min term (s a power of two: an exact scaling). rx_x_limb_run
// writes run h of lane l of chunk c (x has n_in elements, out is the chunk's first word); a run
// past the row's end is zeros.
template <int TYPE>
RX_HD void rx_x_limb_run(const float* __restrict__ x, int n_in, int c, int l, int h, uint32_t* out) {
    typedef rx_x_lanes<TYPE> XL;
    static_assert(XL::P == 1 && XL::STEPS == 4, "a lane run is its unit's 4 steps");
    const int e = XL::elem(c, 32 * h + l);  // the run's first element; its steps follow on
    float v[16];
    uint32_t mb = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (e < n_in) {
            rx_ld_f4(x + e + 4 * k, v + 4 * k);
        } else {
            v[4 * k] = v[4 * k + 1] = v[4 * k + 2] = v[4 * k + 3] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = rx_as_uint(v[4 * k + i]) & 0x7fffffffu;
            mb = b > mb ? b : mb;
        }
    }
    // M < 2^ex: ex = the exponent field - 126 (frexp's) for a normal M; for a subnormal one -126,
    // or -127 below 2^-127 (then s = 2^-149 and X = x exactly)
    const bool bad = mb >= 0x7f800000u, zero = mb == 0;
    const int ex = mb >= 0x00800000u ? (int)(mb >> 23) - 126 : mb >= 0x00400000u ? -126 : -127;
    // x * 2^(22-ex) and s = 2^(ex-22) through two power-of-two factors each (22 - ex is
    // -106 .. 149: each factor a normal float, the products exact)
    const int p = 22 - ex, p1 = p >> 1, p2 = p - p1;
    const float f1 = rx_as_float((uint32_t)(p1 + 127) << 23), f2 = rx_as_float((uint32_t)(p2 + 127) << 23);
    const float s = bad ? rx_nan()
                        : zero ? 1.0f
                               : RX_FMUL(rx_as_float((uint32_t)(127 - p1) << 23),
                                         rx_as_float((uint32_t)(127 - p2) << 23));
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int X[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // rint by the 1.5 * 2^23 bias (|x * 2^(22-ex)| <= 2^22)
            const float r = RX_FADD(RX_FMUL(RX_FMUL(v[4 * k + i], f1), f2), 12582912.0f);
            X[i] = (bad || zero) ? 0 : (int)rx_as_uint(r) - 0x4B400000;
            sum += X[i];
        }
        uint32_t* w = out + 4 * (32 * (2 * k + h) + l);
        // bytes 0, 1, 2 of X[0..3] -> words 0, 1, 2
        const uint32_t lo01 = rx_byte_perm((uint32_t)X[0], (uint32_t)X[1], 0x5140u);  // b0 b0' b1 b1'
        const uint32_t lo23 = rx_byte_perm((uint32_t)X[2], (uint32_t)X[3], 0x5140u);
        const uint32_t hi01 = rx_byte_perm((uint32_t)X[0], (uint32_t)X[1], 0x0062u);  // b2 b2'
        const uint32_t hi23 = rx_byte_perm((uint32_t)X[2], (uint32_t)X[3], 0x0062u);
        w[0] = rx_byte_perm(lo01, lo23, 0x5410u);
        w[1] = rx_byte_perm(lo01, lo23, 0x7632u);
        w[2] = rx_byte_perm(hi01, hi23, 0x5410u);
        w[3] = k == 0 ? rx_as_uint(s) : 0u;
    }
    out[4 * (32 * (2 + h) + l) + 3] = rx_as_uint(RX_FMUL(s, (float)sum));  // step 1's slot
}

// The one-token GEMV of rx_gemv_rows (the same lane slots) on the staged limbs xl (the chunks
// rx_x_limb_run wrote) for the K-quants with an integer view (rx_lu's ints / affine: the weight
// is mul * b - sub for the unsigned bytes b): per lane run, sum b_i X_i in three int32 limb sums
// (dp4a, exact: |S| < 2^22; S = 65536 S2 + 256 S1 + S0 rounded once to a float), then
// acc += (mul * s) * S - (sub * s) * sum X. rx_limbs_unit adds one lane unit U's terms (its
// block at byte `boff` of each row, j = U % LPB, xc its x slots: xl + 4 (U / 32 * SLOTS + U % 32));
// SHARED: the rows may be in shared memory (generic loads, rx_lu's load_any: the types that have
// one).
template <int TYPE, int R, bool SHARED = false>
RX_HD void rx_limbs_unit(const uint8_t* const (&rp)[R], long long boff, int j, const uint32_t* xc,
                         float (&acc)[R][1]) {
    typedef rx_lu<TYPE> L;
    L u[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if constexpr (SHARED) {
            u[r].load_any(rp[r] + boff, j);
        } else {
            u[r].load(rp[r] + boff, j);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) u[r].prep(j);
    int s0[R][2], s1[R][2], s2[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        s0[r][0] = s1[r][0] = s2[r][0] = s0[r][1] = s1[r][1] = s2[r][1] = 0;
    }
    float xs[2], xsum[2];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint32_t g0[4], g1[4];  // xl is shared memory in the kernels
        rx_ld_v4_any(xc + 128 * (2 * k), g0);
        rx_ld_v4_any(xc + 128 * (2 * k + 1), g1);
        if (k == 0) {
            xs[0] = rx_as_float(g0[3]);
            xs[1] = rx_as_float(g1[3]);
        } else if (k == 1) {
            xsum[0] = rx_as_float(g0[3]);  // s * sum X
            xsum[1] = rx_as_float(g1[3]);
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
            // 256 S2 + S1 is below 2^24 (b <= 63: 16 * 63 * (64 * 256 + 255)): exact as a float
            const float v = fmaf((float)(s2[r][h] * 256 + s1[r][h]), 256.0f, rx_small_int_f(s0[r][h]));
            acc[r][0] = fmaf(mul * xs[h], v, acc[r][0]);
            // = fmaf(-sub * s, sum X, acc): both products exact scalings by a power of two
            acc[r][0] = fmaf(-sub, xsum[h], acc[r][0]);
        }
    }
}
template <int TYPE, int R>
RX_HD void rx_gemv_rows_limbs(const uint8_t* const (&rp)[R], const uint32_t* xl, int n_in, int first,
                              int stride, float (&acc)[R][1]) {
    typedef rx_lu<TYPE> L;
    typedef rx_x_lanes<TYPE> XL;
    static_assert(XL::P == 1 && XL::STEPS == 4, "the limb runs' lane order");
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    const unsigned n_units = (unsigned)(n_in / L::QK) * (unsigned)L::LPB;
    const int l = first & 31;  // the stride is a multiple of 32: the lane's slot in every chunk
    for (unsigned U = (unsigned)first; U < n_units; U += (unsigned)stride) {
        const unsigned blk = U / (unsigned)L::LPB;
        const int j = (int)(U % (unsigned)L::LPB);
        rx_limbs_unit<TYPE, R>(rp, (long long)blk * L::TS, j,
                               xl + 4 * ((long long)(U >> 5) * XL::SLOTS + l), acc);
    }
}

// The one-token GEMV of rx_gemv_rows (TT = 1, the same lane slots and unit loop) on x limbs xq
// for rx_unit_int types (the limb layout above is IQ4_XS's lane order: two lanes a unit, two steps
// each): each lane unit's sum w_i X_i in three int32 limb sums (exact), then
// acc += (a * s) * (65536 * S2 + 256 * S1 + S0) in float (a the unit's scale, s x's).
template <int TYPE, int R>
RX_HD void rx_gemv_rows_xq(const uint8_t* const (&rp)[R], const uint32_t* __restrict__ xq, int n_in,
                           int first, int stride, float (&acc)[R][1]) {
    typedef rx_lu<TYPE> L;
    static_assert(rx_unit_int<TYPE>::value && rx_unit_scaled<TYPE>::value, "a type with integer units");
    constexpr int P = rx_unit_lanes<TYPE, 1>::value;
    constexpr int STEPS = L::SUB / P;
    static_assert(P == 2 && STEPS == 2 && L::QK == 256 && L::LPB == 8, "the x limbs' lane order");
    // per lane unit |S0|, |S1| <= 16 * 127 * 255 and |S2| <= 16 * 127 * 64: below 2^22
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
    // The lane's words in each chunk: xb (the unit's block) is at chunk + 256 (blk & 1), and
    // blk & 1 = (first >> 4) & 1 for all the lane's units (the loop steps 2 * ks blocks).
    const int lane = first & 31;
    const int off = 4 * lane - 256 * ((lane >> 4) & 1);
    auto unit = [&](const uint8_t* const (&bp)[R], const uint32_t* xb, int j, int my_part) {
        L u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) rx_lu_load<P>(u[r], bp[r], j, my_part);
#pragma unroll
        for (int r = 0; r < R; ++r) u[r].prep(j);
        int s0[R], s1[R], s2[R];
#pragma unroll
        for (int r = 0; r < R; ++r) s0[r] = s1[r] = s2[r] = 0;
        float xs = 0.0f;
#pragma unroll
        for (int k = 0; k < STEPS; ++k) {
            uint32_t g0[4], g1[4];
            rx_ld_v4((const uint8_t*)(xb + off + 128 * (2 * k)), g0);
            rx_ld_v4((const uint8_t*)(xb + off + 128 * (2 * k + 1)), g1);
            if (k == 0) xs = rx_as_float(g0[3]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                uint32_t lo, hi;
                u[r].ints(k, lo, hi);
                s0[r] = rx_dp4a<false>(hi, g1[0], rx_dp4a<false>(lo, g0[0], s0[r]));
                s1[r] = rx_dp4a<false>(hi, g1[1], rx_dp4a<false>(lo, g0[1], s1[r]));
                s2[r] = rx_dp4a<true>(hi, g1[2], rx_dp4a<true>(lo, g0[2], s2[r]));
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = fmaf(rx_small_int_f(s2[r]), 65536.0f,
                                 fmaf(rx_small_int_f(s1[r]), 256.0f, rx_small_int_f(s0[r])));
            acc[r][0] = fmaf(u[r].scale() * xs, v, acc[r][0]);
        }
    };
    rx_gemv_units<L, P, R>(rp, xq, n_in, first, stride, unit);
}

// The same for the R consecutive rows [row0, row0 + R) of one matrix w, lane `lane` of a warp
// that owns them; rows past n_out read row n_out - 1 (the caller does not store them).
template <int TYPE, int TT, int R, bool EXACT = false>
RX_HD void rx_gemv_lane(const uint8_t* __restrict__ w, const float* __restrict__ x, int T, int n_in,
                        int n_out, long long row_bytes, int row0, int lane, int stride,
                        float (&acc)[R][TT]) {
    const uint8_t* rp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r < n_out ? row0 + r : n_out - 1;
        rp[r] = w + (long long)row * row_bytes;
    }
    rx_gemv_rows<TYPE, TT, R, EXACT>(rp, x, T, n_in, lane, stride, acc);
}
