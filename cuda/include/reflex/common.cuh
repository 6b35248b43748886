// reflex/common.cuh -- small helpers shared by the core's CUDA modules (and by plugins).
//
// Everything here compiles for the device (nvcc) AND for the host (nvcc host pass, or a plain
// C++ compiler with no CUDA at all): the CPU test harness (tests/native/quant_host.cu) runs the
// very same decoders as the kernels. Device-only helpers sit under `#ifdef __CUDACC__`.
//
//   RX_HD / RX_D          __host__ __device__ / __device__ inline qualifiers
//   RX_FMUL/FADD/FSUB     float ops that are never contracted into an FMA (bit-exact paths)
//   rx_as_float/_uint     bit casts
//   rx_f16_to_f32         exact IEEE half -> float, bit level (NaN payloads kept, as NumPy does)
//   rx_bf16_to_f32        exact bfloat16 -> float
//   rx_ld_*               read-only loads: __ldg on the device, memcpy on the host; the
//                         `words` / `u32u` forms accept any address (aligned loads + funnel shift)
//   rx_warp_sum/_max/_min butterfly reductions over a full warp (device)
//   rx_norm_load/_scale   an RMSNorm scale from block sums of squares, in one fixed order (device)
//   rx_cp_async16/8/4     asynchronous global -> shared copies, zeros when refused (sm_80+)
//   rx_mbar_*, rx_bulk_load  shared-memory barriers and the bulk copy engine (sm_90+)
//   rx_mma_f16            one m16n8k16 float16 tensor-core product, f32 accumulation (sm_80+)
//   rx_wg_mma, rx_wg_desc64  Hopper's warpgroup MMA on shared-memory tiles (sm_90a only)
//   RX_PDL_ENTRY()        first statement of a core kernel: programmatic dependent launch
//
// Host builds that use the bit-exact helpers must compile with -ffp-contract=off (GCC contracts
// a*b-c into an FMA across statements when the target has FMA).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RX_HD __host__ __device__ __forceinline__
#define RX_D __device__ __forceinline__
#else
#define RX_HD inline
#define RX_D inline
#endif

// Programmatic dependent launch (sm_90+). The decode graphs launch the core's kernels with
// programmatic stream serialization (reflex_core/cuda/modules.py), so a kernel's blocks may
// start while the kernel before it is still running. RX_PDL_ENTRY() is therefore the first
// statement of every core kernel: wait until the preceding grid has completed and its writes
// are visible (before reading or writing anything it may touch), then let the next kernel's
// launch begin (it waits the same way, so it cannot start work before this one completes).
// Without that launch attribute, or before sm_90, both are no-ops. Only reads of data that no
// kernel writes may come before it: the weights, and the batch's prepared buffer (positions,
// cells, mask), which the host's copies write before a step's kernels run. And data that only
// launches two or more back wrote: a kernel's blocks start once every block of the launch ahead
// has passed this wait, so the launches before that one have completed (the decode attention
// reads the caches' earlier cells so, the batch's own cells after the wait).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RX_PDL_ENTRY()                                                   \
    do {                                                                 \
        asm volatile("griddepcontrol.wait;" ::: "memory");               \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  \
    } while (0)
#else
#define RX_PDL_ENTRY() \
    do {               \
    } while (0)
#endif

// Phase stamps for bench/phase_trace.py, in a trace build only (REFLEX_CUDA_TRACE=1 at build
// time defines RX_TRACE; otherwise the macros are empty). A kernel that uses them records, per
// block, the global timer and its SM's clock at up to six points (RX_TRACE_AT(0..5), thread 0;
// points not reached stay 0), then RX_TRACE_PUT(kind, extra) appends the record to its module's
// rx_trace_buf (16 words: kind << 32 | block, smid << 32 | grid width, six timer values in ns,
// six clocks, extra, 0), rx_trace_n counting the records (past RX_TRACE_RECS they are dropped).
// The one-token GEMVs' points: start, after the programmatic wait, x staged, the first ring slot
// landed (streamed forms), the first tile's (or the row loop's) arithmetic done, end.
#ifdef RX_TRACE
#define RX_TRACE_RECS (1 << 18)
__device__ unsigned long long rx_trace_buf[RX_TRACE_RECS * 16];
__device__ unsigned int rx_trace_n;
__device__ __noinline__ void rx_trace_put(unsigned kind, unsigned extra, const unsigned long long* ts) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned i = atomicAdd(&rx_trace_n, 1u);
    if (i >= RX_TRACE_RECS) return;
    unsigned long long* r = rx_trace_buf + 16ull * i;
    r[0] = ((unsigned long long)kind << 32) | blockIdx.x;
    r[1] = ((unsigned long long)smid << 32) | gridDim.x;
    for (int k = 0; k < 12; ++k) r[2 + k] = ts[k];
    r[14] = extra;
    r[15] = 0;
}
#define RX_TRACE_DECL                            \
    __shared__ unsigned long long rx_ts[12];     \
    if (threadIdx.x == 0)                        \
        for (int k_ = 0; k_ < 12; ++k_) rx_ts[k_] = 0
#define RX_TRACE_AT(i)                                                               \
    do {                                                                             \
        if (threadIdx.x == 0) {                                                      \
            unsigned long long g_;                                                   \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_));                    \
            rx_ts[i] = g_;                                                           \
            rx_ts[6 + (i)] = clock64();                                              \
        }                                                                            \
    } while (0)
#define RX_TRACE_PUT(kind, extra)                               \
    do {                                                        \
        if (threadIdx.x == 0) rx_trace_put(kind, extra, rx_ts); \
    } while (0)
#else
#define RX_TRACE_DECL
#define RX_TRACE_AT(i) \
    do {               \
    } while (0)
#define RX_TRACE_PUT(kind, extra) \
    do {                          \
    } while (0)
#endif

// ------------------------------------------------------------------------------------------
// exact float arithmetic (no FMA contraction), bit casts

#ifdef __CUDA_ARCH__
#define RX_FMUL(a, b) __fmul_rn((a), (b))
#define RX_FADD(a, b) __fadd_rn((a), (b))
#define RX_FSUB(a, b) __fsub_rn((a), (b))
#else
#define RX_FMUL(a, b) ((a) * (b))
#define RX_FADD(a, b) ((a) + (b))
#define RX_FSUB(a, b) ((a) - (b))
#endif

RX_HD float rx_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

RX_HD uint32_t rx_as_uint(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

RX_HD float rx_nan() { return rx_as_float(0x7fc00000u); }

// index of the highest set bit of a non-zero value
RX_HD int rx_hibit(uint32_t v) {
#ifdef __CUDA_ARCH__
    return 31 - __clz((int)v);
#elif defined(__GNUC__)
    return 31 - __builtin_clz(v);
#else
    int p = 31;
    while (!(v >> p)) --p;
    return p;
#endif
}

// IEEE binary16 -> binary32, exact, integer ops only (identical on host and device).
RX_HD float rx_f16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;  // +-0
    } else {  // subnormal half: man * 2^-24, a normal float
        const int p = rx_hibit(man);  // 0..9
        bits = sign | ((uint32_t)(p + 103) << 23) | ((man << (23 - p)) & 0x7fffffu);
    }
    return rx_as_float(bits);
}

// Same value as rx_f16_to_f32 for every non-NaN input; one cvt instruction on the device.
// (Hot matmul paths only: NaN payloads may differ.)
RX_HD float rx_f16_to_f32_fast(uint32_t h) {
#ifdef __CUDA_ARCH__
    float f;
    const unsigned short hs = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
    return f;
#else
    return rx_f16_to_f32(h);
#endif
}

RX_HD float rx_bf16_to_f32(uint32_t h) { return rx_as_float((h & 0xffffu) << 16); }

// ------------------------------------------------------------------------------------------
// read-only loads (weights, activations). Device: through the read-only path (__ldg).

RX_HD uint32_t rx_ld_u8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned char*)p);
#else
    return *p;
#endif
}

// p must be 2-byte aligned on the device
RX_HD uint32_t rx_ld_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned short*)p);
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

// p must be 4-byte aligned on the device
RX_HD uint32_t rx_ld_u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned int*)p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

// N little-endian 32-bit words from ANY address. Device: N aligned word loads, plus one more
// only when p is misaligned (it then holds needed bytes, so nothing outside the words that
// contain [p, p + 4N) is touched), joined with funnel shifts. NC false: generic loads (p may be
// shared memory).
template <int N, bool NC = true>
RX_HD void rx_ld_words(const uint8_t* p, uint32_t (&w)[N]) {
#ifdef __CUDA_ARCH__
    const uint32_t lo = (uint32_t)(uintptr_t)p & 3u;
    // generic loads: the aligned word below p by pointer arithmetic, not an integer cast, so
    // that the compiler still knows which space p is in (rows in shared memory: LDS, not LD)
    const uint32_t* q =
        NC ? (const uint32_t*)((uintptr_t)p & ~(uintptr_t)3) : (const uint32_t*)(p - lo);
    const uint32_t sh = lo * 8u;
    uint32_t r[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = NC ? __ldg(q + i) : q[i];
    r[N] = sh ? (NC ? __ldg(q + N) : q[N]) : 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
#else
    memcpy(w, p, 4 * N);
#endif
}

// one 32-bit word from any address
RX_HD uint32_t rx_ld_u32u(const uint8_t* p) {
    uint32_t w[1];
    rx_ld_words<1>(p, w);
    return w[0];
}

// 16 bytes from a 16-byte aligned address (device: one 128-bit load; NC: read-only, __ldg)
template <bool NC>
RX_HD void rx_ld_16(const void* p, uint32_t (&w)[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = NC ? __ldg((const uint4*)p) : *(const uint4*)p;
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
#else
    memcpy(w, p, 16);
#endif
}
RX_HD void rx_ld_v4(const uint8_t* p, uint32_t (&w)[4]) { rx_ld_16<true>(p, w); }

// __byte_perm: byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {x, y} (x the low 4)
RX_HD uint32_t rx_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
#endif
}

// 4 words from a 16-byte aligned address that may be shared memory (a generic load, not __ldg)
RX_HD void rx_ld_v4_any(const uint32_t* p, uint32_t (&w)[4]) { rx_ld_16<false>(p, w); }

// 4 floats from a 16-byte aligned address
RX_HD void rx_ld_f4(const float* p, float* v) {
#ifdef __CUDA_ARCH__
    const float4 f = __ldg((const float4*)p);
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
#else
    memcpy(v, p, 16);
#endif
}

RX_HD long long rx_ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------------------
// device-only

#ifdef __CUDACC__
// Butterfly reductions over a full warp: every lane gets the result, combined in the same order.
template <typename T, typename Op>
__device__ __forceinline__ T rx_warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T>
__device__ __forceinline__ T rx_warp_sum(T v) {
    return rx_warp_reduce(v, [](T a, T b) { return a + b; });
}
__device__ __forceinline__ float rx_warp_max(float v) {
    return rx_warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}
template <typename T>  // integers
__device__ __forceinline__ T rx_warp_max(T v) {
    return rx_warp_reduce(v, [](T a, T b) { return max(a, b); });
}
template <typename T>  // integers
__device__ __forceinline__ T rx_warp_min(T v) {
    return rx_warp_reduce(v, [](T a, T b) { return min(a, b); });
}

// The RMSNorm scale 1 / sqrt(sum(part) / n + eps) from a residual-step GEMV's block sums
// (reflex/quant_kernels.cuh, GEMV_RESNORM), in one order for every reader (the GEMV_NORMED GEMVs,
// reflex_norm_apply): lane l adds part[l], part[l + 32], ... in turn, then the warp's butterfly
// sum. pv: the first RX_NORM_PV of lane l's terms, loaded (in program order) before a GEMV's main
// loop; the compiler may still place the loads later.
#define RX_NORM_PV 8
__device__ __forceinline__ void rx_norm_load(const float* __restrict__ part, int n_part,
                                             float (&pv)[RX_NORM_PV]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < RX_NORM_PV; ++j) pv[j] = lane + 32 * j < n_part ? part[lane + 32 * j] : 0.0f;
}
__device__ __forceinline__ float rx_norm_scale(const float* __restrict__ part, int n_part,
                                               const float (&pv)[RX_NORM_PV], int n, float eps) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RX_NORM_PV; ++j) ss += pv[j];
    for (int i = lane + 32 * RX_NORM_PV; i < n_part; i += 32) ss += part[i];
    ss = rx_warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)n + eps);
}
#endif

#ifdef __CUDACC__
// Asynchronous global -> shared copies (sm_80+) of 16, 8 or 4 bytes; `ok` false writes zeros
// instead (the source is not read).
__device__ __forceinline__ void rx_cp_async16(void* dst, const void* src, bool ok) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void rx_cp_async8(void* dst, const void* src, bool ok) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 8 : 0));
}
__device__ __forceinline__ void rx_cp_async4(void* dst, const void* src, bool ok) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void rx_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Shared-memory barriers (mbarrier) and the bulk copy engine (sm_90+): rx_bulk_load copies
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory and
// counts them against `bar`'s expected transaction bytes (rx_mbar_expect), so the phase completes
// when they have landed; rx_mbar_wait(bar, p) returns once the phase of parity p has completed.
__device__ __forceinline__ uint32_t rx_smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void rx_mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(rx_smem_addr(bar)), "r"(count) : "memory");
}
// after every rx_mbar_init, before a barrier is used by the copy engine or other threads
__device__ __forceinline__ void rx_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// A ring of `slots` shared-memory slots between one copying thread and `consumers` arrivals:
// full[s] (one arrival, the copier's rx_mbar_expect) completes when slot s has landed, empty[s]
// when the consumers are done with it. Every thread of the block calls it (thread 0 initialises,
// then the block synchronises).
__device__ __forceinline__ void rx_mbar_ring_init(uint64_t* full, uint64_t* empty, int slots,
                                                  int consumers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) {
            rx_mbar_init(full + s, 1);
            rx_mbar_init(empty + s, consumers);
        }
        rx_mbar_init_fence();
    }
    __syncthreads();
}
__device__ __forceinline__ void rx_mbar_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rx_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void rx_mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(rx_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void rx_mbar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(rx_smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
// The bulk copies carry an L2 evict-first policy: they move weights, which a decode step reads
// once, so the L2 keeps the activations, the caches and the rows that other launches asked it for
// ahead of their loads.
__device__ __forceinline__ void rx_bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            rx_smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(rx_smem_addr(bar)), "l"(pol)
        : "memory");
}
// a barrier of the `threads` threads (a multiple of 32) that use the same ID (1 .. 15; 0 is
// __syncthreads'); a constant, so that a block reserves only the barriers it names
template <int ID>
__device__ __forceinline__ void rx_bar_sync(int threads) {
    static_assert(ID >= 1 && ID <= 15, "named barriers 1 .. 15");
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// d (16x8, f32) += a (16x16, f16, row-major fragment) * b (16x8, f16, column fragment)
__device__ __forceinline__ void rx_mma_f16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Hopper warpgroup MMA (sm_90a), float16 operands both in shared memory, f32 accumulators.
// rx_wg_desc64: the descriptor of a K-major tile whose rows are 64 bytes (32 halves) in the
// 64-byte swizzle (16-byte chunk c of row r at chunk c ^ ((r >> 1) & 3)), 8-row groups 512
// bytes apart, the tile 512-byte aligned.
__device__ __forceinline__ uint64_t rx_wg_desc64(const void* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(512 >> 4) << 32) |
           ((uint64_t)2 << 62);
}
#define RX_WG_R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                    "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// d (64 x N of the warpgroup, N / 2 floats a thread: d[4j + e] is row 16 w + lane / 4 + 8 (e / 2),
// column 8 j + 2 (lane % 4) + e % 2, w the warp in the group) += A (64 x 16) B (16 x N)
template <int N>
__device__ __forceinline__ void rx_wg_mma(float (&d)[N / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void rx_wg_mma<128>(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : RX_WG_R8(0), RX_WG_R8(8), RX_WG_R8(16), RX_WG_R8(24), RX_WG_R8(32), RX_WG_R8(40),
          RX_WG_R8(48), RX_WG_R8(56)
        : "l"(da), "l"(db), "n"(1));
}
template <>
__device__ __forceinline__ void rx_wg_mma<64>(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : RX_WG_R8(0), RX_WG_R8(8), RX_WG_R8(16), RX_WG_R8(24)
        : "l"(da), "l"(db), "n"(1));
}
#undef RX_WG_R8
__device__ __forceinline__ void rx_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void rx_wg_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
#endif
__device__ __forceinline__ uint32_t rx_f16x2(float lo, float hi) {  // lo in the low half
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float2 rx_f16x2_to_f32(uint32_t v) {
    float lo, hi;
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi) : "r"(v));
    return make_float2(lo, hi);
}
// (a, b) as the float16 pairs hi = (f16(a), f16(b)) and lo = the rest of each
__device__ __forceinline__ void rx_split_f16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
    hi = rx_f16x2(a, b);
    const float2 h = rx_f16x2_to_f32(hi);
    lo = rx_f16x2(a - h.x, b - h.y);
}
__device__ __forceinline__ void rx_ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void rx_ldsm_x4_t(uint32_t (&r)[4], const uint16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}
#endif

#ifdef __CUDACC__
// The power-of-two scale that brings a row into float16's range, from the float bits mb of its
// largest |value| (a NaN's bits above inf's): with M < 2^e (frexp; e at least -112, so s and 1 / s
// are normal floats) s = 2^(e-15), so every v = value / s has |v| < 2^15; M = 0: s = 1; a NaN or
// inf in the row: s = NaN (and the caller writes zeros). Returns whether the row is finite.
__device__ __forceinline__ bool rx_pow2_scale(uint32_t mb, float& s, float& inv) {
    s = 1.0f;
    inv = 1.0f;
    if (mb >= 0x7f800000u) {
        s = rx_nan();
        return false;
    }
    if (mb != 0) {
        int e;
        frexpf(__uint_as_float(mb), &e);
        e = max(e, -112);
        s = ldexpf(1.0f, e - 15);
        inv = ldexpf(1.0f, 15 - e);
    }
    return true;
}
#endif

// The x limbs' layout (reflex/quants.cuh, before rx_gemv_rows_xq): natural group index (4
// elements) -> its slot, both counted from the start of x. Chunks of 512 elements (128 groups);
// group q of lane unit u of a chunk goes to slot 32 (2k + h) + 2u + p, q = 2p + k + 4h.
#define RX_XQ_CHUNK 512
RX_HD int rx_xq_slot(int group) {
    const int c = group >> 7, g = group & 127, u = g >> 3, q = g & 7;
    return (c << 7) + 32 * (2 * (q & 1) + (q >> 2)) + 2 * u + ((q >> 1) & 1);
}
