// bench/wgmma_lab.py compiles this for sm_90a on the GPU machine: the prefill GEMM on float16
// pairs (the module's reflex_matmul_f16x3: y = s_o s_t sum (Wh Xh + Wh Xl + Wl Xh)) with the
// products as Hopper warpgroup MMA (wgmma.mma_async m64n128k16, both operands from shared
// memory through descriptors) instead of mma.sync. One plain segment, no SwiGLU.
// A block: 2 warpgroups, 128 weight rows x 128 tokens (a warpgroup 64 rows); K slices of 64
// halves, each row's 128 bytes a slice and plane stored in the 128-byte swizzle wgmma reads
// (16-byte chunk c of row r at chunk c ^ (r & 7), 1024-byte aligned groups of 8 rows); ST
// slices in flight (cp.async).
#include "reflex/common.cuh"

#define BM 128
#define BK 64

__device__ __forceinline__ uint64_t wg_desc(const void* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    uint64_t d = (uint64_t)((a & 0x3FFFF) >> 4);
    d |= (uint64_t)1 << 16;                 // leading byte offset (unused for swizzled K-major)
    d |= (uint64_t)(1024 >> 4) << 32;       // stride byte offset: 8 rows of 128 bytes
    d |= (uint64_t)1 << 62;                 // 128-byte swizzle
    return d;
}

#define WG_REGS8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

template <int N>
__device__ __forceinline__ void wg_mma(float (&d)[N / 2], uint64_t da, uint64_t db);

template <>
__device__ __forceinline__ void wg_mma<128>(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : WG_REGS8(0), WG_REGS8(8), WG_REGS8(16), WG_REGS8(24), WG_REGS8(32), WG_REGS8(40),
          WG_REGS8(48), WG_REGS8(56)
        : "l"(da), "l"(db), "n"(1));
}

template <>
__device__ __forceinline__ void wg_mma<256>(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : WG_REGS8(0), WG_REGS8(8), WG_REGS8(16), WG_REGS8(24), WG_REGS8(32), WG_REGS8(40),
          WG_REGS8(48), WG_REGS8(56), WG_REGS8(64), WG_REGS8(72), WG_REGS8(80), WG_REGS8(88),
          WG_REGS8(96), WG_REGS8(104), WG_REGS8(112), WG_REGS8(120)
        : "l"(da), "l"(db), "n"(1));
}

// PIPE: a slice's wgmma stay in flight while the block waits for the next slice's copies (two
// barriers a slice: the second frees the stage the slice before read).
template <int TERMS, int BN, int ST, bool PIPE>
__device__ __forceinline__ void wg_body(const uint8_t* __restrict__ W, long long lo_off,
                                        const uint16_t* __restrict__ X, float* __restrict__ y, int T,
                                        int n_in, int n) {
    constexpr int P = TERMS == 1 ? 1 : 2;
    constexpr int SLICE = (BM + BN) * 128;  // bytes a plane and slice
    extern __shared__ uint8_t smem_raw[];
    uint8_t* sm = (uint8_t*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    // stage s, plane p: A at sm + (s * P + p) * SLICE, B right after A's BM rows
    const int tid = threadIdx.x, wg = tid >> 7;
    const int m0 = blockIdx.x * BM, t0 = blockIdx.y * BN;
    const long long plane = 2LL * n * n_in;
    const long long x_lo = 2LL * T * n_in;  // bytes from x's hi plane to its lo plane
    const int nk = n_in / BK;
    auto load = [&](int kb, int s) {
        if (kb < nk) {
            for (int i = tid; i < (BM + BN) * 8; i += 256) {
                const int r = i >> 3, c = i & 7;
                const bool isa = r < BM;
                const int rr = isa ? r : r - BM;
                const bool ok = isa ? m0 + rr < n : t0 + rr < T;
                const uint8_t* src = isa ? W + 2LL * (ok ? m0 + rr : 0) * n_in
                                         : (const uint8_t*)X + 2LL * (ok ? t0 + rr : 0) * n_in;
                src += 128LL * kb + 16 * c;
                uint8_t* dst = sm + (size_t)(s * P) * SLICE + r * 128 + ((c ^ (r & 7)) << 4);
                rx_cp_async16(dst, src, ok);
                if constexpr (P == 2) rx_cp_async16(dst + SLICE, src + (isa ? lo_off : x_lo), ok);
            }
        }
        rx_cp_async_commit();
    };
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) load(s, s);
    for (int kb = 0; kb < nk; ++kb) {
        const int s = kb % ST;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
        __syncthreads();
        if (!PIPE) load(kb + ST - 1, (kb + ST - 1) % ST);
        const uint8_t* Ah = sm + (size_t)(s * P) * SLICE + wg * 64 * 128;
        const uint8_t* Bh = sm + (size_t)(s * P) * SLICE + BM * 128;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const uint64_t ah = wg_desc(Ah + 32 * kk), bh = wg_desc(Bh + 32 * kk);
            wg_mma<BN>(d, ah, bh);
            if constexpr (TERMS == 3) {
                wg_mma<BN>(d, ah, wg_desc(Bh + SLICE + 32 * kk));
                wg_mma<BN>(d, wg_desc(Ah + SLICE + 32 * kk), bh);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (PIPE) {
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            __syncthreads();  // both warpgroups are done with the slice before: its stage is free
            load(kb + ST - 1, (kb + ST - 1) % ST);
        } else {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::);
    // d[4j + e]: row 16 w + g (+ 8 for e >= 2), token 8 j + 2 q + (e & 1), w = warp in the group
    const int lane = tid & 31, w = (tid >> 5) & 3, g = lane >> 2, q = lane & 3;
    const float* rs = (const float*)(W + plane);
    const float* XS = (const float*)(X + 2LL * T * n_in);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = m0 + wg * 64 + 16 * w + g + 8 * (e >> 1), tok = t0 + 8 * j + 2 * q + (e & 1);
            if (row < n && tok < T) y[(long long)tok * n + row] = d[4 * j + e] * rs[row] * XS[tok];
        }
}

#define WG_KERNEL(name, TERMS, BN, ST, PIPE)                                                      \
    extern "C" __global__ void __launch_bounds__(256, 1)                                           \
        name(const uint8_t* W, long long lo_off, const uint16_t* X, float* y, int T, int n_in, int n) { \
        wg_body<TERMS, BN, ST, PIPE>(W, lo_off, X, y, T, n_in, n);                                  \
    }
WG_KERNEL(lab_wg3_n128, 3, 128, 3, false)
WG_KERNEL(lab_wg3_n128p, 3, 128, 3, true)
WG_KERNEL(lab_wg3_n256p, 3, 256, 2, true)
WG_KERNEL(lab_wg1_n128, 1, 128, 3, false)
WG_KERNEL(lab_wg1_n128p, 1, 128, 4, true)
WG_KERNEL(lab_wg1_n256p, 1, 256, 4, true)
