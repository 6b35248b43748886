/*
Reflex core kernels: every op of the ops interface that is not a quantized-weight op.

One fatbin module ("core"), loaded by reflex_core/cuda/driver.py and launched from
reflex_core/backends/cuda_backend.py. Activations are row-major float32, exactly as the NumPy
reference backend (reflex_core/backends/numpy_backend.py) holds them; every kernel here has a
NumPy twin there (the op of the same name) and a GPU test in tests/gpu/test_core_kernels.py.
All kernels are extern "C" (no name mangling), prefixed reflex_, and launched on the default
stream with kernel parameters packed by Kernels.launch (sig chars in brackets below:
P pointer, i int32, f float32, d float64).

Kernels (launch shape)
  reflex_add            y = a + b                         grid ceil(n/256), block 256   [PPPi]
  reflex_swiglu         y = silu(g) * u                   grid ceil(n/256), block 256   [PPPi]
  reflex_rmsnorm        per row x/sqrt(mean(x^2)+eps)*w   grid rows, block 256|1024     [PPPif]
  reflex_add_rmsnorm    s = a + b; n = rmsnorm(s) * w      grid rows, block 256|1024     [PPPPPif]
  reflex_norm_apply     y *= RMSNorm scale from block sums  grid ceil(n/256), block 256   [PPiif]
  reflex_rope           NEOX / NORM rotation, YaRN        grid (H, T), block 128        [PPPiiiidddddd]
  reflex_kv_write       K and V rows into cache cells     grid ceil(n/256)<=4096, 256   [PPPPii]
  reflex_qk_norm_rope_store  per-head RMSNorm + RoPE of q and k, K/V into the cache
                                                          grid (H + H_kv, T), 128|256   [PPPPPPPPPPiiiiiiiifdddddd]
  reflex_qk_norm_rope_rows  the same for many tokens, a warp a head
                                                          grid (ceil((H + H_kv)/8), T), 256  [PPPPPPPPPPiiiiiiiifdddddd]
  reflex_attention      masked GQA softmax attention, S slices of the cells merged by the
                        last block of each (h, t)         grid (H, T, S), block 256     [PPPPPPPPPiiiif]
  reflex_attention_vec128 / _vec256  the same, float4 rows, 4 cells a warp at a time (head
                        sizes a multiple of 4)            grid (H, T, S), block 256     [PPPPPPPPPiiiif]
  reflex_attention_tiled128 / _tiled256  the same for many tokens, query tiles x cell tiles in
                        shared memory                     grid (H, ceil(T/32|16)), 256  [PPPPPPPiiiiif]
  reflex_attention_mma128 / _mma256  the same on the tensor cores (float16 hi/lo pairs, sm_80+)
                                                          grid (H, ceil(T/128|64)), 256|128 [PPPPPPPiiiiif]
  reflex_kv_halves      the K and V caches' cells as float16 pairs (the mma tiles' input)
                                                          grid <= 4096, block 256       [PPPPiiiii]
  reflex_take_rows      y[r] = x[rows[r]]                 grid (ceil(n/256), R), 256    [PPPi]
  reflex_x_limbs        x as 32-element blocks of scaled integers (the one-token GEMV's input
                        for the integer weight types)   grid ceil(n/256), block 256   [PPi]
  reflex_x_halves       x rows as scaled float16 (hi, lo) pairs (the prefill matmul's input
                        for the integer weight types)   grid T, block 256             [PPPii]
  reflex_x_pairs        x rows as scaled float16 pairs in planes (the prefill GEMM's input)
                                                          grid T, block 256             [PPii]
  reflex_argmax         first index of the row maximum    grid rows, block 1024         [PPiP]
  reflex_argmax_split   the same for one row, its blocks' pairs merged by the last one
                                                          grid ceil(n/4096), block 256  [PPiPPP]
  reflex_token_logprobs log_softmax(x)[target] per row    grid rows, block 1024         [PPPi]
  reflex_repeat_penalty x[id] / or * penalty, each id    grid ceil(n/256), block 256   [PPif]
  reflex_sample         temperature/top-k/top-p/min-p draw
                                                          grid 1, block 512             [PididddPPP]
  reflex_copy_words     dst[i] = src[i] (int32; src may be mapped host memory: a chained decode
                        step's inputs)                    grid ceil(n/256), block 256   [PPi]
  The picks (argmax, argmax_split, sample) also write each id to out_host when it is not null:
  mapped host memory, where a chained decode step's id reaches the host without a copy.
  reflex_moe_route      gating, bias, groups, top-k, renorm, scale
                                                          grid T, block 256             [PPPPiiiifii]
  reflex_moe_combine    sum_j w[t,j] * y[t,j,:]           grid (ceil(n/256), T), 256    [PPPii]
  reflex_moe_combine_resnorm  one token's moe_combine, the residual add and the block sums of
                        the next RMSNorm                  grid ceil(n/256), block 256   [PPPPPPPii]
  reflex_moe_schedule   a MoE matmul's slots by expert    grid 1, block 1024            [PiiiPPPPi]
  reflex_lora_add       w += scale * L @ R (LoRA merge)   grid (n_in/32, n_out/32, E), (32, 8)  [PPPiiiiif]

Numerics: float32 everywhere except RoPE angles (float64 so that large positions keep their
precision), the log-sum-exp of token_logprobs (float64 sum) and sampling (float64 as
reflex_core/sampling.py defines it). Reductions use a fixed order (no float atomics), so every
kernel is deterministic run to run.
*/

#include <stdint.h>
#include <math.h>

#include "reflex/common.cuh"  // rx_nan, rx_xq_slot (the x limbs' layout), rx_warp_*

#define FULL_MASK 0xffffffffu

// ------------------------------------------------------------------------------------------
// reduction helpers (local to this module; the warp's butterflies are common.cuh's)

// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024). Every thread gets the
// result. `red` is shared scratch of >= 32 elements; the trailing __syncthreads makes it
// reusable right away.
__device__ __forceinline__ float block_sum_f(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = 0.f;
#pragma unroll 8
    for (int w = 0; w < nw; w++) r += red[w];  // same order in every thread (unrolled: loads first)
    __syncthreads();
    return r;
}

__device__ __forceinline__ double block_sum_d(double v, double* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double r = 0.0;
    for (int w = 0; w < nw; w++) r += red[w];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max_f(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll 8
    for (int w = 1; w < nw; w++) r = fmaxf(r, red[w]);
    __syncthreads();
    return r;
}

__device__ __forceinline__ int block_min_i(int v, int* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_min(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int r = red[0];
    for (int w = 1; w < nw; w++) r = min(r, red[w]);
    __syncthreads();
    return r;
}

__device__ __forceinline__ int block_max_i(int v, int* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int r = red[0];
    for (int w = 1; w < nw; w++) r = max(r, red[w]);
    __syncthreads();
    return r;
}

// (value, index) argmax pair: larger value wins, equal values -> smaller index; idx < 0 = none.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
    if (oi < 0) return;
    if (i < 0 || ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

__device__ __forceinline__ void block_argmax(float& v, int& i, float* redv, int* redi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, v, o);
        int oi = __shfl_xor_sync(FULL_MASK, i, o);
        argmax_merge(v, i, ov, oi);
    }
    if (lane == 0) { redv[warp] = v; redi[warp] = i; }
    __syncthreads();
    v = redv[0];
    i = redi[0];
    for (int w = 1; w < nw; w++) argmax_merge(v, i, redv[w], redi[w]);
    __syncthreads();
}

// ------------------------------------------------------------------------------------------
// elementwise

extern "C" __global__ void reflex_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ y, int n) {
    RX_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

// add_bias: y[r, i] = x[r, i] + b[i] over ``total`` = rows * n elements.
extern "C" __global__ void reflex_add_bias(const float* __restrict__ x, const float* __restrict__ b,
                                           float* __restrict__ y, int n, int total) {
    RX_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] = x[i] + b[i % n];
}

extern "C" __global__ void reflex_swiglu(const float* __restrict__ g, const float* __restrict__ u,
                                         float* __restrict__ y, int n) {
    RX_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = g[i];
        y[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

// ------------------------------------------------------------------------------------------
// rmsnorm: one block per row; sum of squares reduced in float32 (fixed order), then
// y = x * (1 / sqrt(mean + eps)) * w. w == NULL: no weight.

extern "C" __global__ void reflex_rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                          float* __restrict__ y, int n, float eps) {
    RX_PDL_ENTRY();
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_sum_f(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    if (w != nullptr) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r;
    }
}

// ------------------------------------------------------------------------------------------
// add_rmsnorm: the residual add and the next RMSNorm in one pass, one block per row:
// s = a + b (stored), then n = s * (1 / sqrt(mean(s^2) + eps)) * w (w == NULL: no weight) --
// the same arithmetic and reduction order as reflex_add followed by reflex_rmsnorm (same block
// size), so bit-identical to them. Each thread re-reads only the s elements it wrote itself.
// Rows of at most ADD_RMSNORM_REG elements a thread keep them in registers, and read their
// weights (which no kernel writes) before the wait for the kernel ahead (RX_PDL_ENTRY): one
// memory round trip less on the decode path, where this runs once or twice a layer.
#define ADD_RMSNORM_REG 8

extern "C" __global__ void reflex_add_rmsnorm(const float* __restrict__ a, const float* __restrict__ b,
                                              const float* __restrict__ w, float* __restrict__ s,
                                              float* __restrict__ y, int n, float eps) {
    __shared__ float red[32];
    if (n <= ADD_RMSNORM_REG * (int)blockDim.x) {
        const size_t off = (size_t)blockIdx.x * n;
        float wv[ADD_RMSNORM_REG], v[ADD_RMSNORM_REG];
#pragma unroll
        for (int u = 0; u < ADD_RMSNORM_REG; u++) {
            const int i = threadIdx.x + u * blockDim.x;
            wv[u] = (w != nullptr && i < n) ? __ldg(w + i) : 1.0f;
        }
        RX_PDL_ENTRY();
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < ADD_RMSNORM_REG; u++) {
            const int i = threadIdx.x + u * blockDim.x;
            if (i < n) {
                v[u] = a[off + i] + b[off + i];
                s[off + i] = v[u];
                ss += v[u] * v[u];
            }
        }
        ss = block_sum_f(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int u = 0; u < ADD_RMSNORM_REG; u++) {
            const int i = threadIdx.x + u * blockDim.x;
            if (i < n) y[off + i] = w != nullptr ? v[u] * r * wv[u] : v[u] * r;
        }
        return;
    }
    RX_PDL_ENTRY();
    const size_t off = (size_t)blockIdx.x * n;
    const float* ar = a + off;
    const float* br = b + off;
    float* sr = s + off;
    float* yr = y + off;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = ar[i] + br[i];
        sr[i] = v;
        ss += v * v;
    }
    ss = block_sum_f(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    if (w != nullptr) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = sr[i] * r * w[i];
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = sr[i] * r;
    }
}

// norm_apply: y *= 1 / sqrt(sum(part[0 .. n_part)) / n + eps), in place. y and part are a
// residual-step GEMV's outputs (reflex_matmul_gemv1{ws,x}r_<t>: y = h * w, part its block sums of
// h^2), so y becomes rmsnorm(h) * w for a reader that does not apply the scale itself; every warp
// computes the scale in rx_norm_scale's order, the one the GEMV_NORMED GEMVs use.
extern "C" __global__ void reflex_norm_apply(float* __restrict__ y, const float* __restrict__ part,
                                             int n_part, int n, float eps) {
    RX_PDL_ENTRY();
    float pv[RX_NORM_PV];
    rx_norm_load(part, n_part, pv);
    const float r = rx_norm_scale(part, n_part, pv, n, eps);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= r;
}

// ------------------------------------------------------------------------------------------
// rope: block (h, t) rotates head h of token t. Pair i (< n_rot/2) is (i, i + n_rot/2) for
// NEOX and (2i, 2i+1) for NORM; dims >= n_rot are copied. Angles in float64:
//   theta_extrap = pos * base^(-2i/n_rot), theta_interp = freq_scale * theta_extrap,
//   YaRN (ext_factor != 0): mix = ext * (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)),
//   theta = interp * (1 - mix) + extrap * mix, mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)).
// (ggml's rope_yarn; spec section 4.3.)

// Pair i of a head at position p, as above: its dims (i0, i1) and (cos, sin) * mscale.
struct RopeArgs {
    int n_rot, neox;
    double freq_base, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi;
};

// The dims (i0, i1) of pair i: (i, i + n_rot/2) NEOX, (2i, 2i+1) NORM.
__device__ __forceinline__ void rx_rope_dims(const RopeArgs& ra, int i, int& i0, int& i1) {
    const int half = ra.n_rot / 2;
    i0 = ra.neox ? i : 2 * i;
    i1 = ra.neox ? i + half : 2 * i + 1;
}

__device__ __forceinline__ void rx_rope_pair(const RopeArgs& ra, double p, int i, int& i0, int& i1,
                                             float& cs, float& sn) {
    double mscale = ra.attn_factor;
    if (ra.ext_factor != 0.0) mscale *= 1.0 + 0.1 * log(1.0 / ra.freq_scale);
    const double theta_extrap = p * pow(ra.freq_base, -2.0 * (double)i / (double)ra.n_rot);
    const double theta_interp = ra.freq_scale * theta_extrap;
    double theta = theta_interp;
    if (ra.ext_factor != 0.0) {
        const double yv = ((double)i - ra.corr_lo) / fmax(0.001, ra.corr_hi - ra.corr_lo);
        const double ramp = 1.0 - fmin(1.0, fmax(0.0, yv));
        const double mix = ramp * ra.ext_factor;
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
    }
    double sn64, cs64;
    sincos(theta, &sn64, &cs64);
    cs = (float)(cs64 * mscale);
    sn = (float)(sn64 * mscale);
    rx_rope_dims(ra, i, i0, i1);
}

// Dims (i0, i1) of src rotated by (cos, sin) = (cs, sn) into dst.
__device__ __forceinline__ void rx_rope_apply(const float* __restrict__ src,
                                              float* __restrict__ dst, int i0, int i1, float cs,
                                              float sn) {
    const float a = src[i0], b = src[i1];
    dst[i0] = a * cs - b * sn;
    dst[i1] = a * sn + b * cs;
}

// A head's first n_rot dims rotated from src to dst (another row), the block's threads a pair
// each in turn from pair `first` on (threadIdx.x, or beyond the pair a thread did itself); the
// dims past n_rot are the caller's.
__device__ __forceinline__ void rx_rope_head(const RopeArgs& ra, double p,
                                             const float* __restrict__ src,
                                             float* __restrict__ dst, int first) {
    for (int i = first; i < ra.n_rot / 2; i += blockDim.x) {
        int i0, i1;
        float cs, sn;
        rx_rope_pair(ra, p, i, i0, i1, cs, sn);
        rx_rope_apply(src, dst, i0, i1, cs, sn);
    }
}

extern "C" __global__ void reflex_rope(const float* __restrict__ x, float* __restrict__ y,
                                       const int* __restrict__ pos, int H, int d, int n_rot,
                                       int neox, double freq_base, double freq_scale,
                                       double ext_factor, double attn_factor, double corr_lo,
                                       double corr_hi) {
    RX_PDL_ENTRY();
    const int h = blockIdx.x, t = blockIdx.y;
    const size_t base = ((size_t)t * H + h) * d;
    const float* xr = x + base;
    float* yr = y + base;
    const double p = (double)pos[t];
    const RopeArgs ra = {n_rot, neox, freq_base, freq_scale, ext_factor, attn_factor, corr_lo,
                         corr_hi};
    rx_rope_head(ra, p, xr, yr, threadIdx.x);
    for (int i = n_rot + threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i];
}

// ------------------------------------------------------------------------------------------
// kv_write: the batch's K [T, H_kv, d_k] and V [T, H_kv, d_v] into the layer's cache at cell
// cell0 (the host offsets kc/vc by cell0 rows). Grid-stride copy of both in one launch.

extern "C" __global__ void reflex_kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                           float* __restrict__ kc, float* __restrict__ vc,
                                           int nk, int nv) {
    RX_PDL_ENTRY();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nk; i += stride) kc[i] = k[i];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) vc[i] = v[i];
}

// ------------------------------------------------------------------------------------------
// qk_norm_rope_store: the attention prologue after the q/k/v projections, in one launch.
// Block (hh, t), hh < H: query head hh of token t; hh >= H: KV head g = hh - H. The block
//   1. stages the head (d_k floats) in shared memory and, when the norm is on (qn / kn flags),
//      RMS-normalises it over d_k times the weight (weight NULL: none) -- reflex_rmsnorm's
//      arithmetic: float32 sum of squares, x * r * w; with blockDim >= d_k (d_k <= 256) also its
//      reduction order, so bit-identical;
//   2. rotates it as reflex_rope (pairs (i, i + n_rot/2) NEOX / (2i, 2i+1) NORM, dims >= n_rot
//      copied; angles in float64, YaRN);
//   3. query heads: -> q_out [T, H, d_k]; KV heads: -> kc at cell row *cell0 + t and v's head g
//      (d_v floats, unchanged) -> vc. The first cell is read from device memory (the batch's
//      prepared buffer) so that one captured decode step replays for every position.
// q [T, H, d_k], k [T, H_kv, d_k], v [T, H_kv, d_v]; kc [cells, H_kv, d_k], vc [cells, H_kv, d_v].
// d_k <= REFLEX_QKR_MAX_HEAD (the backend reads the limit from the manifest). Block 128 threads
// for d_k <= 128, else 256.

#define REFLEX_QKR_MAX_HEAD 512
// the parameters of reflex_qk_norm_rope_store and reflex_qk_norm_rope_rows
#define RX_QKR_PARAMS                                                                              \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,        \
        const float *__restrict__ qn_w, const float *__restrict__ kn_w,                            \
        float *__restrict__ q_out, float *__restrict__ kc, float *__restrict__ vc,                 \
        const int *__restrict__ cell0, const int *__restrict__ pos, int H, int H_kv, int dk,       \
        int dv, int qn, int kn, int n_rot, int neox, float eps, double freq_base,                  \
        double freq_scale, double ext_factor, double attn_factor, double corr_lo, double corr_hi
// the RopeArgs of those parameters
#define RX_QKR_ROPE \
    RopeArgs { n_rot, neox, freq_base, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi }

// Row hh of token t of the prologue (hh < H: query head hh, else KV head hh - H): where it is
// read from and stored to, and its norm. The KV heads' values are copied by qkr_copy_v.
struct QkrRow {
    const float* src;  // q's or k's head
    float* dst;        // q_out's row, or the key cache's at cell (*cell0 + t)
    const float* nw;   // the norm's weight (null: none)
    bool norm, is_q;
    int h;  // the head among its kind
};

__device__ __forceinline__ QkrRow qkr_row(int hh, int t, size_t cell, const float* q,
                                          const float* k, const float* qn_w, const float* kn_w,
                                          float* q_out, float* kc, int H, int H_kv, int dk, int qn,
                                          int kn) {
    QkrRow r;
    r.is_q = hh < H;
    r.h = r.is_q ? hh : hh - H;
    r.src = (r.is_q ? q + ((size_t)t * H + r.h) * dk : k + ((size_t)t * H_kv + r.h) * dk);
    r.dst = r.is_q ? q_out + ((size_t)t * H + r.h) * dk : kc + (cell * H_kv + r.h) * dk;
    r.norm = r.is_q ? qn != 0 : kn != 0;
    r.nw = r.is_q ? qn_w : kn_w;
    return r;
}
#define RX_QKR_ROW(hh, t, cell) qkr_row(hh, t, cell, q, k, qn_w, kn_w, q_out, kc, H, H_kv, dk, qn, kn)

// KV head h's value of token t into the value cache at `cell`, elements first, first + step, ...
__device__ __forceinline__ void qkr_copy_v(const float* __restrict__ v, float* __restrict__ vc,
                                           int t, size_t cell, int H_kv, int h, int dv, int first,
                                           int step) {
    const float* vs = v + ((size_t)t * H_kv + h) * dv;
    float* vd = vc + (cell * H_kv + h) * dv;
    for (int i = first; i < dv; i += step) vd[i] = vs[i];
}

extern "C" __global__ void reflex_qk_norm_rope_store(RX_QKR_PARAMS) {
    const int t = blockIdx.y;
    // Before the wait for the kernel ahead: the rotation of this thread's pair (threadIdx.x), its
    // float64 pow and sincos, and the norm weight of its first element. The position and cell
    // are the batch's prepared buffer, which only the host's copies write, before a step's
    // kernels, so they may be read before RX_PDL_ENTRY.
    const bool pre = (int)threadIdx.x < n_rot / 2;
    int pi0 = 0, pi1 = 0;
    float pcs = 0.f, psn = 0.f;
    if (pre) rx_rope_pair(RX_QKR_ROPE, (double)pos[t], threadIdx.x, pi0, pi1, pcs, psn);
    const size_t cell = (size_t)cell0[0] + t;
    const QkrRow row = RX_QKR_ROW(blockIdx.x, t, cell);
    const float nw0 = row.norm && row.nw != nullptr && (int)threadIdx.x < dk ? row.nw[threadIdx.x] : 0.f;
    RX_PDL_ENTRY();
    __shared__ float xs[REFLEX_QKR_MAX_HEAD];
    __shared__ float red[32];

    // 1. stage (+ RMSNorm)
    float ss = 0.f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float x = row.src[i];
        xs[i] = x;
        ss += x * x;
    }
    if (row.norm) {  // block-uniform
        ss = block_sum_f(ss, red);  // its __syncthreads also publishes xs
        const float r = 1.0f / sqrtf(ss / (float)dk + eps);
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            // own elements only: no barrier needed between this read and write
            xs[i] = row.nw != nullptr ? xs[i] * r * (i == (int)threadIdx.x ? nw0 : row.nw[i])
                                      : xs[i] * r;
        }
    }
    __syncthreads();

    // 2. RoPE (reflex_rope's arithmetic): the pair rotated above, then any further ones
    if (pre) rx_rope_apply(xs, row.dst, pi0, pi1, pcs, psn);
    rx_rope_head(RX_QKR_ROPE, (double)pos[t], xs, row.dst, threadIdx.x + blockDim.x);
    for (int i = n_rot + threadIdx.x; i < dk; i += blockDim.x) row.dst[i] = xs[i];

    // 3. V of this KV head
    if (!row.is_q) qkr_copy_v(v, vc, t, cell, H_kv, row.h, dv, threadIdx.x, blockDim.x);
}

// qk_norm_rope_rows: reflex_qk_norm_rope_store for a prefill's many (head, token) rows, a warp a
// head and 8 heads of a token a block: grid (ceil((H + H_kv) / 8), T), 256 threads. The block
// computes the rotation of each pair (reflex_rope's float64 angle) once for its 8 heads, in
// shared memory; a warp stages its head, sums the squares in reflex_qk_norm_rope_store's order
// (chunk c < B / 32: the dims 32c + lane + kB of each lane, B = 128 for d_k <= 128, else 256;
// the chunk by the butterfly; the chunks in order), normalises, rotates and stores as there:
// the same bits, one block for 8 heads where that kernel takes a block a head (a decode step's
// few heads finish sooner there, on a thread a dim).
#define QKR_ROWS_WARPS 8

extern "C" __global__ void __launch_bounds__(QKR_ROWS_WARPS * 32)
reflex_qk_norm_rope_rows(RX_QKR_PARAMS) {
    RX_PDL_ENTRY();
    __shared__ float xs[QKR_ROWS_WARPS][REFLEX_QKR_MAX_HEAD];
    __shared__ float2 rot[REFLEX_QKR_MAX_HEAD / 2];  // pair i: (cos, sin) * mscale
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.y;
    const int hh = blockIdx.x * QKR_ROWS_WARPS + warp;
    const double p = (double)pos[t];
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        int i0, i1;
        float cs, sn;
        rx_rope_pair(RX_QKR_ROPE, p, i, i0, i1, cs, sn);
        rot[i] = make_float2(cs, sn);
    }
    const bool live = hh < H + H_kv;
    const size_t cell = (size_t)cell0[0] + t;
    const QkrRow row = RX_QKR_ROW(hh, t, cell);
    float* x = xs[warp];
    if (live) {
        // 1. stage (+ RMSNorm)
        const int B = dk <= 128 ? 128 : 256;
        float ss = 0.f;
        for (int c = 0; c < B / 32; c++) {
            float part = 0.f;
            for (int e = 32 * c + lane; e < dk; e += B) {
                const float xv = row.src[e];
                x[e] = xv;
                part += xv * xv;
            }
            ss += rx_warp_sum(part);
        }
        if (row.norm) {  // each lane its own dims (e % 32 == lane): no barrier
            const float r = 1.0f / sqrtf(ss / (float)dk + eps);
            for (int e = lane; e < dk; e += 32)
                x[e] = row.nw != nullptr ? x[e] * r * row.nw[e] : x[e] * r;
        }
    }
    __syncthreads();  // the rotations and every warp's head
    if (!live) return;
    // 2. RoPE (reflex_rope's arithmetic) into the destination
    float* dst = row.dst;
    const int half = n_rot / 2;
    for (int i = lane; i < half; i += 32) {
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float2 r = rot[i];
        const float a = x[i0], b = x[i1];
        dst[i0] = a * r.x - b * r.y;
        dst[i1] = a * r.y + b * r.x;
    }
    for (int e = n_rot + lane; e < dk; e += 32) dst[e] = x[e];
    // 3. V of this KV head
    if (!row.is_q) qkr_copy_v(v, vc, t, cell, H_kv, row.h, dv, lane, 32);
}

// ------------------------------------------------------------------------------------------
// attention: block (h, t, s), 8 warps. Token t sees cells [0, prefix_end[t]) and
// [max(own_start[t], prefix_end[t]), own_end[t]) -- the visible list, j = 0..n-1. With S =
// gridDim.z splits (flash-decoding: a few tokens over a long cache would otherwise run on only
// H*T blocks), block s takes the visible list's s-th slice of ceil(n / S) cells. Warp w takes
// cells j = w, w+8, ... of that slice; its lanes split head_dim (<= REFLEX_ATT_MAX_HEAD: 8 floats
// per lane) for q.k (then a warp shuffle sum) and for the V accumulator; each warp keeps an
// online softmax (m, l, acc). The 8 partial states merge in shared memory: M = max m_w,
// L = sum l_w e^(m_w-M), acc = sum acc_w e^(m_w-M). S == 1: out = acc / L. S > 1: (M, L, acc)
// go to part [T, H, S, 2 + d_v], and the slice that ends last merges the S slices the same way
// (att_merge_warps; done [T, H] counts the slices that ended, zero between launches). The
// slices depend on n, read on the device, and S on the launch: a captured decode step replays
// for every position. Query head h reads KV head h / (H / H_kv).
// q [T, H, d_k]; kc [cells, H_kv, d_k]; vc [cells, H_kv, d_v]; out [T, H * d_v].

#define ATT_WARPS 8
#define REFLEX_ATT_MAX_HEAD 256  // d_k, d_v (the backend reads it from the manifest)
#define ATT_MAXC (REFLEX_ATT_MAX_HEAD / 32)  // floats per lane

// Token t's visible list for reflex_attention and its vec kernels: cells [0, a_end), then from
// b_start on (j >= a_end is cell b_start + j - a_end); this block's slice of it is [j0, j1), the
// sl-th of S slices of ceil(n / S) entries.
__device__ __forceinline__ void att_slice(const int* __restrict__ prefix_end,
                                          const int* __restrict__ own_start,
                                          const int* __restrict__ own_end, int t, int S, int sl,
                                          int& a_end, int& b_start, int& j0, int& j1) {
    a_end = prefix_end[t];
    b_start = max(own_start[t], a_end);
    const int n = a_end + max(0, own_end[t] - b_start);
    const int chunk = (n + S - 1) / S;
    j0 = sl * chunk;
    j1 = min(n, j0 + chunk);
}

// The S slices' states (M_s, L_s, acc_s rows of part, [S, 2 + dv]) merged into out: M = max M_s,
// f_s = e^(M_s - M), L = sum L_s f_s, out = sum acc_s f_s / L (an empty slice has M_s = -inf and
// counts 0). part is read through the L2 (__ldcg): the other slices' blocks wrote it.
// S <= REFLEX_ATT_MAX_SPLITS.
#define REFLEX_ATT_MAX_SPLITS 64

__device__ __forceinline__ void att_combine_slices(const float* pp, float* __restrict__ o, int S,
                                                   int dv) {
    __shared__ float s_f[REFLEX_ATT_MAX_SPLITS];
    __shared__ float s_invL;
    const size_t w = 2 + (size_t)dv;
    if (threadIdx.x < 32) {  // slice s on lane s % 32
        const int lane = threadIdx.x;
        float ms[REFLEX_ATT_MAX_SPLITS / 32], ls[REFLEX_ATT_MAX_SPLITS / 32];
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < REFLEX_ATT_MAX_SPLITS / 32; i++) {
            const int s = lane + 32 * i;
            ms[i] = s < S ? __ldcg(pp + s * w) : -INFINITY;
            ls[i] = s < S ? __ldcg(pp + s * w + 1) : 0.f;
            M = fmaxf(M, ms[i]);
        }
        M = rx_warp_max(M);
        float L = 0.f;
#pragma unroll
        for (int i = 0; i < REFLEX_ATT_MAX_SPLITS / 32; i++) {
            const int s = lane + 32 * i;
            const float f = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);
            if (s < S) s_f[s] = f;
            L += ls[i] * f;
        }
        L = rx_warp_sum(L);
        if (lane == 0) s_invL = L > 0.f ? 1.0f / L : 0.f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        float acc_e = 0.f;
        for (int s = 0; s < S; s++) acc_e += __ldcg(pp + s * w + 2 + e) * s_f[s];
        o[e] = acc_e * s_invL;
    }
}

// The end of reflex_attention and its vec kernels: the block's ATT_WARPS online-softmax states
// (m, l and the acc rows, in shared memory and synchronized) merged, M = max m_w, L = sum l_w
// e^(m_w - M), acc = sum acc_w e^(m_w - M). S == 1: out = acc / L. S > 1: (M, L, acc) go to this
// slice's row of part, and the block that finishes last of the S (counted in done[t H + h], which
// it sets back to 0 for the next launch) merges the slices into out (att_combine_slices): no
// launch of its own, and the same order of sums whichever block is last.
template <int D>
__device__ __forceinline__ void att_merge_warps(const float* s_m, const float* s_l,
                                                const float (*s_acc)[D], float* __restrict__ out,
                                                float* __restrict__ part, int* __restrict__ done,
                                                int t, int h, int H, int S, int sl, int dv) {
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w]);
    float L = 0.f;
    float f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.f : expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    float* o = out + ((size_t)t * H + h) * dv;
    if (S > 1) {
        float* pp0 = part + ((size_t)t * H + h) * S * (size_t)(2 + dv);
        float* pp = pp0 + sl * (size_t)(2 + dv);
        if (threadIdx.x == 0) { pp[0] = M; pp[1] = L; }
        for (int e = threadIdx.x; e < dv; e += blockDim.x) {
            float acc_e = 0.f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) acc_e += s_acc[w][e] * f[w];
            pp[2 + e] = acc_e;
        }
        __shared__ int s_last;
        __threadfence();  // this block's row of part is visible before its count
        __syncthreads();
        if (threadIdx.x == 0) {
            int* d = done + (size_t)t * H + h;
            s_last = atomicAdd(d, 1) == S - 1;
            if (s_last) *d = 0;
        }
        __syncthreads();
        if (s_last) {
            __threadfence();
            att_combine_slices(pp0, o, S, dv);
        }
        return;
    }
    const float invL = L > 0.f ? 1.0f / L : 0.f;
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        float acc_e = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) acc_e += s_acc[w][e] * f[w];
        o[e] = acc_e * invL;
    }
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
reflex_attention(const float* __restrict__ q, const float* __restrict__ kc,
                 const float* __restrict__ vc, float* __restrict__ out, float* __restrict__ part,
                 int* __restrict__ done, const int* __restrict__ prefix_end,
                 const int* __restrict__ own_start, const int* __restrict__ own_end, int H,
                 int H_kv, int dk, int dv, float scale) {
    RX_PDL_ENTRY();
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * ATT_MAXC];
    const int h = blockIdx.x, t = blockIdx.y, S = gridDim.z, sl = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = h / (H / H_kv);
    int a_end, b_start, j0, j1;
    att_slice(prefix_end, own_start, own_end, t, S, sl, a_end, b_start, j0, j1);

    const float* qh = q + ((size_t)t * H + h) * dk;
    float qr[ATT_MAXC], acc[ATT_MAXC];
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) {
        const int e = lane + 32 * c;
        qr[c] = e < dk ? qh[e] : 0.f;
        acc[c] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const size_t kstride = (size_t)H_kv * dk, vstride = (size_t)H_kv * dv;
    const float* kbase = kc + (size_t)g * dk;
    const float* vbase = vc + (size_t)g * dv;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const int cell = j < a_end ? j : b_start + (j - a_end);
        const float* kp = kbase + (size_t)cell * kstride;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < ATT_MAXC; c++) {
            const int e = lane + 32 * c;
            if (e < dk) s += qr[c] * kp[e];
        }
        s = rx_warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);  // m = -inf on the first cell: 0
        const float p = expf(s - mn);
        l = l * corr + p;
        const float* vp = vbase + (size_t)cell * vstride;
#pragma unroll
        for (int c = 0; c < ATT_MAXC; c++) {
            const int e = lane + 32 * c;
            if (e < dv) acc[c] = acc[c] * corr + p * vp[e];
        }
        m = mn;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) {
        const int e = lane + 32 * c;
        if (e < dv) s_acc[warp][e] = acc[c];
    }
    __syncthreads();
    att_merge_warps(s_m, s_l, s_acc, out, part, done, t, h, H, S, sl, dv);
}

// attention_vec128 / _vec256: reflex_attention for head sizes a multiple of 4 (<= 128 / 256)
// (16-byte aligned q, caches, out), same grid, slices and result. Each warp takes 4 cells at a
// time, 8 lanes a cell: lane (group c4 = lane / 8, li = lane % 8) holds q's dimensions
// 32i + 4li .. +3 (float4, i < d/32) and loads that part of cell j + c4's K and V row at once, and
// it loads the next round's rows before this round's math, so a warp has 8 cells' rows in flight
// where reflex_attention has one (decode over a long cache waits on those loads); a score needs 3
// shuffles instead of 5. Each group keeps its own online softmax; the 4 groups merge by
// shuffles, the 8 warps in shared memory as there. cell0 (may be null): the batch's first cell,
// where the launches just ahead write no cache cells but the batch's T from *cell0; the first
// two rounds of the other cells then load before the programmatic wait.
// ATT_VEC_C4: float4 per lane (head sizes <= 32 * ATT_VEC_C4: 128 or 256).
template <int ATT_VEC_C4, bool FUSED>
struct AttVecRows {
    float4 k[ATT_VEC_C4], v[ATT_VEC_C4];

    // visible entry j's K and V parts of this lane (zeros past j1 or past the head sizes). FUSED:
    // the batch's own cells [c0, c0 + Tn) are not in the caches yet; their K rows are knew's
    // (shared memory, rows of 32 ATT_VEC_C4 floats) and their V rows vnew's (token stride vts).
    __device__ __forceinline__ void load(const float* __restrict__ kbase,
                                         const float* __restrict__ vbase, size_t kstride,
                                         size_t vstride, int j, int j1, int a_end, int b_start,
                                         int li, int dk, int dv, const float* knew,
                                         const float* vnew, size_t vts, int c0, int Tn) {
        const bool valid = j < j1;
        const int cell = !valid ? 0 : j < a_end ? j : b_start + (j - a_end);
        const float* kp = kbase + (size_t)cell * kstride;
        const float* vp = vbase + (size_t)cell * vstride;
        if (FUSED && valid) {
            const unsigned nt = (unsigned)(cell - c0);
            if (nt < (unsigned)Tn) {
                kp = knew + nt * (32 * ATT_VEC_C4);
                vp = vnew + nt * vts;
            }
        }
#pragma unroll
        for (int i = 0; i < ATT_VEC_C4; i++) {
            const int e = 32 * i + 4 * li;
            k[i] = valid && e < dk ? *(const float4*)(kp + e) : make_float4(0.f, 0.f, 0.f, 0.f);
            v[i] = valid && e < dv ? *(const float4*)(vp + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }

    // load's form before the programmatic wait: an entry that is one of the batch's own cells
    // [c0, c0 + Tn), which the launch ahead may still be writing, is left zero (the caller loads
    // it again after the wait); the other cells were written by earlier steps.
    __device__ __forceinline__ void load_past(const float* __restrict__ kbase,
                                              const float* __restrict__ vbase, size_t kstride,
                                              size_t vstride, int j, int j1, int a_end,
                                              int b_start, int li, int dk, int dv, int c0, int Tn) {
        load(kbase, vbase, kstride, vstride, is_new(j, j1, a_end, b_start, c0, Tn) ? j1 : j, j1,
             a_end, b_start, li, dk, dv, nullptr, nullptr, 0, c0, 0);
    }

    // whether visible entry j is one of the batch's own cells [c0, c0 + Tn)
    __device__ __forceinline__ static bool is_new(int j, int j1, int a_end, int b_start, int c0,
                                                  int Tn) {
        if (j >= j1) return false;
        const int cell = j < a_end ? j : b_start + (j - a_end);
        return (unsigned)(cell - c0) < (unsigned)Tn;
    }
};

#define ROPE_ATT_MAX_T 4  // tokens of a reflex_rope_attention_vec launch (gridDim.y)

// What reflex_rope_attention_vec adds to reflex_attention_vec: the projections of the batch's
// keys and values, the norms' weights and flags, the positions and the batch's first cell.
struct RopeAttIn {
    const float *k, *v, *qn_w, *kn_w;
    float *kc, *vc;  // written: the batch's cells
    const int* pos;
    int c0, qn, kn;
    float eps;
    RopeArgs ra;
};

// The prologue of reflex_rope_attention_vec<C4>: reflex_qk_norm_rope_store's work for query
// head h of token t and for KV head g of every token of the batch, in shared memory (rows[0]: the
// query, rows[1 + u]: token u's key), with its arithmetic and order of sums (the sum of squares
// in warps of 32 dims, then over 4 or 8 warps in turn, as its 128 / 256 threads add them), so
// the same values. Block (h = g G, t, slice 0) writes token t's K and V to the caches.
template <int C4>
__device__ __forceinline__ void rope_attention_prologue(float (*rows)[32 * C4],
                                                        const float2* rot,
                                                        const float* __restrict__ q,
                                                        const RopeAttIn& in, int H, int H_kv,
                                                        int dk, int dv) {
    __shared__ float red[(1 + ROPE_ATT_MAX_T) * 8];
    const int h = blockIdx.x, t = blockIdx.y, T = gridDim.y, sl = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = H / H_kv, g = h / G;
    const int nr = 1 + T, nw = dk <= 128 ? 4 : 8;
    for (int task = warp; task < nr * nw; task += ATT_WARPS) {
        const int r = task / nw, e = 32 * (task % nw) + lane;
        const float* src = r == 0 ? q + ((size_t)t * H + h) * dk
                                  : in.k + ((size_t)(r - 1) * H_kv + g) * dk;
        const float x = e < dk ? src[e] : 0.f;
        if (e < dk) rows[r][e] = x;
        const float ss = rx_warp_sum(x * x);
        if (lane == 0) red[task] = ss;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nr * dk; idx += blockDim.x) {
        const int r = idx / dk, e = idx - r * dk;
        if (r == 0 ? in.qn != 0 : in.kn != 0) {
            float ss = 0.f;
            for (int c = 0; c < nw; c++) ss += red[r * nw + c];
            const float rr = 1.0f / sqrtf(ss / (float)dk + in.eps);
            const float* w = r == 0 ? in.qn_w : in.kn_w;
            rows[r][e] = w != nullptr ? rows[r][e] * rr * w[e] : rows[r][e] * rr;
        }
    }
    __syncthreads();
    const int half = in.ra.n_rot / 2;
    for (int idx = threadIdx.x; idx < nr * half; idx += blockDim.x) {
        const int r = idx / half, i = idx - r * half;
        int i0, i1;
        rx_rope_dims(in.ra, i, i0, i1);
        const float cs = rot[idx].x, sn = rot[idx].y;
        const float a = rows[r][i0], b = rows[r][i1];
        rows[r][i0] = a * cs - b * sn;
        rows[r][i1] = a * sn + b * cs;
    }
    __syncthreads();
    if (sl == 0 && h == g * G) {
        const size_t cell = (size_t)in.c0 + t;
        float* kd = in.kc + (cell * H_kv + g) * dk;
        for (int e = threadIdx.x; e < dk; e += blockDim.x) kd[e] = rows[1 + t][e];
        qkr_copy_v(in.v, in.vc, t, cell, H_kv, g, dv, threadIdx.x, blockDim.x);
    }
}

// One round of attention_vec_body: this lane group's cell j (rows r) into its online softmax.
// Every lane runs it (the shuffles); a group past j1 leaves its state as it is.
template <int ATT_VEC_C4, bool FUSED>
__device__ __forceinline__ void att_vec_round(const AttVecRows<ATT_VEC_C4, FUSED>& r,
                                              const float4 (&qr)[ATT_VEC_C4],
                                              float4 (&acc)[ATT_VEC_C4], float& m, float& l,
                                              bool valid, float scale) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ATT_VEC_C4; i++)
        s += qr[i].x * r.k[i].x + qr[i].y * r.k[i].y + qr[i].z * r.k[i].z + qr[i].w * r.k[i].w;
    s += __shfl_xor_sync(FULL_MASK, s, 4);
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    if (!valid) return;
    s *= scale;
    const float mn = fmaxf(m, s);
    const float corr = expf(m - mn);  // m = -inf on the group's first cell: 0
    const float p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < ATT_VEC_C4; i++) {
        acc[i].x = acc[i].x * corr + p * r.v[i].x;
        acc[i].y = acc[i].y * corr + p * r.v[i].y;
        acc[i].z = acc[i].z * corr + p * r.v[i].z;
        acc[i].w = acc[i].w * corr + p * r.v[i].w;
    }
    m = mn;
}

template <int ATT_VEC_C4, bool FUSED>
__device__ __forceinline__ void attention_vec_body(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    float* __restrict__ out, float* __restrict__ part, int* __restrict__ done,
    const int* __restrict__ prefix_end, const int* __restrict__ own_start,
    const int* __restrict__ own_end, const int* __restrict__ cell0, int H, int H_kv, int dk,
    int dv, float scale, const RopeAttIn& in) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ __align__(16) float s_acc[ATT_WARPS][REFLEX_ATT_MAX_HEAD];
    __shared__ __align__(16) float rows[FUSED ? 1 + ROPE_ATT_MAX_T : 1][32 * ATT_VEC_C4];
    __shared__ float2 rot[FUSED ? (1 + ROPE_ATT_MAX_T) * 16 * ATT_VEC_C4 : 1];
    const int h = blockIdx.x, t = blockIdx.y, S = gridDim.z, sl = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c4 = lane >> 3, li = lane & 7;
    const int g = h / (H / H_kv);
    // a trace build's stamps (bench/phase_trace.py's kinds 400 and 401: FUSED): start, after
    // the wait, after the prologue, the batch's rows loaded, the cells summed, end
    RX_TRACE_DECL;
    RX_TRACE_AT(0);
    // Before the wait for the launch ahead: the slice (the batch's prepared buffers, which only
    // the host's copies write), a fused prologue's RoPE pairs (float64 pow and sincos) and, where
    // the launcher says which cells the launches ahead write (cell0: the batch's T cells from
    // *cell0), the first two rounds' rows of the other cells, written by earlier steps.
    int a_end, b_start, j0, j1;
    att_slice(prefix_end, own_start, own_end, t, S, sl, a_end, b_start, j0, j1);
    if (FUSED) {
        const int half = in.ra.n_rot / 2, nr = 1 + gridDim.y;
        for (int idx = threadIdx.x; idx < nr * half; idx += blockDim.x) {
            const int r = idx / half, i = idx - r * half;
            int i0, i1;
            float cs, sn;
            rx_rope_pair(in.ra, (double)in.pos[r == 0 ? t : r - 1], i, i0, i1, cs, sn);
            rot[idx] = make_float2(cs, sn);
        }
    }
    const bool pre = cell0 != nullptr;
    const int c0 = pre ? cell0[0] : 0, Tb = gridDim.y;

    const size_t kstride = (size_t)H_kv * dk, vstride = (size_t)H_kv * dv;
    const float* kbase = kc + (size_t)g * dk;
    const float* vbase = vc + (size_t)g * dv;
    const float* knew = rows[FUSED ? 1 : 0];
    const float* vg = FUSED ? in.v + (size_t)g * dv : nullptr;
    const int Tn = FUSED ? gridDim.y : 0;
    constexpr int ROUND = 4 * ATT_WARPS;  // cells a block takes a round
    // two rounds in flight: a round's rows load while the one before it is summed
    const int base0 = j0 + 4 * warp;
    AttVecRows<ATT_VEC_C4, FUSED> ra, rb;
    if (pre) {
        ra.load_past(kbase, vbase, kstride, vstride, base0 + c4, j1, a_end, b_start, li, dk, dv,
                     c0, Tb);
        rb.load_past(kbase, vbase, kstride, vstride, base0 + ROUND + c4, j1, a_end, b_start, li,
                     dk, dv, c0, Tb);
    }
    RX_PDL_ENTRY();
    RX_TRACE_AT(1);
    if (!pre) {
        ra.load(kbase, vbase, kstride, vstride, base0 + c4, j1, a_end, b_start, li, dk, dv, knew,
                vg, vstride, c0, 0);
        rb.load(kbase, vbase, kstride, vstride, base0 + ROUND + c4, j1, a_end, b_start, li, dk,
                dv, knew, vg, vstride, c0, 0);
    }
    if (FUSED) rope_attention_prologue<ATT_VEC_C4>(rows, rot, q, in, H, H_kv, dk, dv);
    RX_TRACE_AT(2);
    if (FUSED || pre) {  // the batch's cells: the prologue's rows (Tn = Tb), or the caches now
        if (ra.is_new(base0 + c4, j1, a_end, b_start, c0, Tb))
            ra.load(kbase, vbase, kstride, vstride, base0 + c4, j1, a_end, b_start, li, dk, dv,
                    knew, vg, vstride, c0, Tn);
        if (rb.is_new(base0 + ROUND + c4, j1, a_end, b_start, c0, Tb))
            rb.load(kbase, vbase, kstride, vstride, base0 + ROUND + c4, j1, a_end, b_start, li,
                    dk, dv, knew, vg, vstride, c0, Tn);
    }
    RX_TRACE_AT(3);
    const float* qh = FUSED ? rows[0] : q + ((size_t)t * H + h) * dk;
    float4 qr[ATT_VEC_C4], acc[ATT_VEC_C4];
#pragma unroll
    for (int i = 0; i < ATT_VEC_C4; i++) {
        const int e = 32 * i + 4 * li;
        qr[i] = e < dk ? *(const float4*)(qh + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = -INFINITY, l = 0.f;
    for (int base = base0; base < j1; base += 2 * ROUND) {
        att_vec_round(ra, qr, acc, m, l, base + c4 < j1, scale);
        ra.load(kbase, vbase, kstride, vstride, base + 2 * ROUND + c4, j1, a_end, b_start, li, dk,
                dv, knew, vg, vstride, in.c0, Tn);
        if (base + ROUND >= j1) break;
        att_vec_round(rb, qr, acc, m, l, base + ROUND + c4 < j1, scale);
        rb.load(kbase, vbase, kstride, vstride, base + 3 * ROUND + c4, j1, a_end, b_start, li, dk,
                dv, knew, vg, vstride, in.c0, Tn);
    }
    // the warp's 4 groups into one state (lanes li of every group end up equal)
#pragma unroll
    for (int o = 8; o < 32; o <<= 1) {
        const float mo = __shfl_xor_sync(FULL_MASK, m, o), lo = __shfl_xor_sync(FULL_MASK, l, o);
        const float M = fmaxf(m, mo);
        const float f = m == -INFINITY ? 0.f : expf(m - M), fo = mo == -INFINITY ? 0.f : expf(mo - M);
        l = l * f + lo * fo;
#pragma unroll
        for (int i = 0; i < ATT_VEC_C4; i++) {
            acc[i].x = acc[i].x * f + __shfl_xor_sync(FULL_MASK, acc[i].x, o) * fo;
            acc[i].y = acc[i].y * f + __shfl_xor_sync(FULL_MASK, acc[i].y, o) * fo;
            acc[i].z = acc[i].z * f + __shfl_xor_sync(FULL_MASK, acc[i].z, o) * fo;
            acc[i].w = acc[i].w * f + __shfl_xor_sync(FULL_MASK, acc[i].w, o) * fo;
        }
        m = M;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
    if (c4 == 0) {
#pragma unroll
        for (int i = 0; i < ATT_VEC_C4; i++) {
            const int e = 32 * i + 4 * li;
            if (e < dv) *(float4*)&s_acc[warp][e] = acc[i];
        }
    }
    RX_TRACE_AT(4);
    __syncthreads();
    att_merge_warps(s_m, s_l, s_acc, out, part, done, t, h, H, S, sl, dv);
    RX_TRACE_AT(5);
    RX_TRACE_PUT(400 + (FUSED ? 1 : 0), (unsigned)dk | ((unsigned)min(j1 - j0, 255) << 16));
}

#define RX_ATT_VEC(NAME, C4)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                   \
    NAME(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,  \
         float* __restrict__ out, float* __restrict__ part, int* __restrict__ done,                \
         const int* __restrict__ prefix_end, const int* __restrict__ own_start,                    \
         const int* __restrict__ own_end, const int* __restrict__ cell0, int H, int H_kv, int dk,  \
         int dv, float scale) {                                                                    \
        const RopeAttIn none = {};                                                                 \
        attention_vec_body<C4, false>(q, kc, vc, out, part, done, prefix_end, own_start, own_end,  \
                                      cell0, H, H_kv, dk, dv, scale, none);                        \
    }
RX_ATT_VEC(reflex_attention_vec128, 4)
RX_ATT_VEC(reflex_attention_vec256, 8)

// rope_attention_vec128 / _vec256: reflex_qk_norm_rope_store then reflex_attention_vec<C4> in
// one launch, for a batch of at most ROPE_ATT_MAX_T tokens (a decode step): q, k, v are the
// projections (q [T, H, d_k], k [T, H_kv, d_k], v [T, H_kv, d_v]); every block normalises and
// rotates its query and its KV head's keys of the batch (rope_attention_prologue) and reads the
// batch's own cells from them instead of the caches, which one block per (KV head, token) writes
// for the steps after. The same arithmetic as the two launches. MINB: blocks an SM -- two of the
// 128-wide kernel (registers capped at 128, as reflex_attention_vec128's), so that the H x S
// blocks of a decode step over a long cache run in one wave.
#define RX_ROPE_ATT_VEC(NAME, C4, MINB)                                                            \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32, MINB)                             \
    NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,    \
         const float* __restrict__ qn_w, const float* __restrict__ kn_w, float* __restrict__ kc,   \
         float* __restrict__ vc, float* __restrict__ out, float* __restrict__ part,                \
         int* __restrict__ done, const int* __restrict__ cell0, const int* __restrict__ pos,       \
         const int* __restrict__ prefix_end, const int* __restrict__ own_start,                    \
         const int* __restrict__ own_end, int H, int H_kv, int dk, int dv, int qn, int kn,         \
         int n_rot, int neox, float eps, float scale, double freq_base, double freq_scale,         \
         double ext_factor, double attn_factor, double corr_lo, double corr_hi) {                  \
        const RopeAttIn in = {k, v, qn_w, kn_w, kc, vc, pos, cell0[0], qn, kn, eps,                \
                              {n_rot, neox, freq_base, freq_scale, ext_factor, attn_factor,        \
                               corr_lo, corr_hi}};                                                 \
        attention_vec_body<C4, true>(q, kc, vc, out, part, done, prefix_end, own_start, own_end,   \
                                     cell0, H, H_kv, dk, dv, scale, in);                           \
    }
RX_ROPE_ATT_VEC(reflex_rope_attention_vec128, 4, 2)
RX_ROPE_ATT_VEC(reflex_rope_attention_vec256, 8, 1)

// ------------------------------------------------------------------------------------------
// attention_tiled: the prefill's attention (many tokens), same inputs and result as
// reflex_attention with one split. Block (h, query tile): BQ tokens of head h against the cache
// in tiles of BK cells, staged in shared memory once for all BQ queries (reflex_attention reads
// every visible K and V row once per token: at T = 1500 that is most of a prefill's time).
// Cells run in order over [c_lo, c_hi): the smallest first visible cell and the largest end of
// the tile's tokens; a cell a token does not see scores -inf (the same visible set as
// reflex_attention's list, summed in cell order). Online softmax per token in registers and
// shared memory (m, l); scores, then P = e^(s - m), in Ps. 256 threads: thread (a, b) = (tid /
// 16, tid % 16) scores tokens a + 16i against cells b + 16j (i < BQ/16, j < BK/16; rows 4 floats
// of padding apart, so a quarter warp's float4 loads hit distinct banks) and accumulates tokens
// a + 16i's outputs at columns 4b + 64c (float4, c < DMAX/64). K and V share one buffer (V
// loaded after the scores), and a cell no token of the tile sees is staged as zeros (its cache
// row may be uninitialised, and 0 * NaN would poison the sum). Needs d_k, d_v <= DMAX,
// d_k % 4 == d_v % 4 == 0 and 16-byte aligned q, caches, out (the launcher checks; else
// reflex_attention). grid (H, ceil(T / BQ)), block 256.
#define ATT_TILE_THREADS 256

// Token t's visible cells, [0, pe) and [vs, oe) (all empty past T); true, with the first cell
// it sees and the end of the last, when it sees any.
__device__ __forceinline__ bool att_token_cells(const int* __restrict__ prefix_end,
                                                const int* __restrict__ own_start,
                                                const int* __restrict__ own_end, int T, int t, int& pe,
                                                int& vs, int& oe, int& first, int& last) {
    pe = vs = oe = first = last = 0;
    if (t >= T) return false;
    pe = prefix_end[t];
    vs = max(own_start[t], pe);
    oe = max(own_end[t], vs);
    first = pe > 0 ? 0 : vs;
    last = oe > vs ? oe : pe;
    return last > first;
}

template <int BQ, int BK, int DMAX>
__device__ __forceinline__ void attention_tiled_body(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    float* __restrict__ out, const int* __restrict__ prefix_end, const int* __restrict__ own_start,
    const int* __restrict__ own_end, int T, int H, int H_kv, int dk, int dv, float scale) {
    static_assert(BQ % 16 == 0 && BK % 16 == 0 && DMAX % 64 == 0, "tile shapes");
    constexpr int NQ = BQ / 16, NK = BK / 16, NC = DMAX / 64, LD = DMAX + 4;
    constexpr int TPR = ATT_TILE_THREADS / BQ;  // softmax: threads a token row
    static_assert(BK % TPR == 0 && TPR <= 32, "softmax row split");
    __shared__ __align__(16) float Qs[BQ][LD];
    __shared__ __align__(16) float KV[BK][LD];
    __shared__ float Ps[BQ][BK + 1];
    __shared__ float s_m[BQ], s_l[BQ], s_corr[BQ];
    __shared__ int s_pe[BQ], s_vs[BQ], s_oe[BQ];
    __shared__ int s_lo, s_hi;
    __shared__ int s_seen[BK];
    const int tid = threadIdx.x, h = blockIdx.x, t0 = blockIdx.y * BQ;
    const int g = h / (H / H_kv);
    const int a = tid >> 4, b = tid & 15;
    if (tid == 0) { s_lo = 0x7fffffff; s_hi = 0; }
    __syncthreads();
    if (tid < BQ) {
        int pe, vs, oe, first, last;
        if (att_token_cells(prefix_end, own_start, own_end, T, t0 + tid, pe, vs, oe, first, last)) {
            atomicMin(&s_lo, first); atomicMax(&s_hi, last);
        }
        s_pe[tid] = pe; s_vs[tid] = vs; s_oe[tid] = oe;
        s_m[tid] = -INFINITY; s_l[tid] = 0.f;
    }
    // the query tile (zeros past T and past d_k)
    for (int e = tid; e < BQ * (DMAX / 4); e += ATT_TILE_THREADS) {
        const int r = e / (DMAX / 4), c4 = 4 * (e % (DMAX / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + r < T && c4 < dk) v = *(const float4*)(q + ((size_t)(t0 + r) * H + h) * dk + c4);
        *(float4*)&Qs[r][c4] = v;
    }
    float acc[NQ][NC][4];
#pragma unroll
    for (int i = 0; i < NQ; i++)
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int x = 0; x < 4; x++) acc[i][c][x] = 0.f;
    __syncthreads();
    const int c_lo = s_lo, c_hi = s_hi;
    // cells [c0, c0 + BK) of cache c (rows of H_kv heads of d floats, head g) into KV; zeros for
    // the cells no token sees and past d
    auto stage_cells = [&](const float* c, int d, int c0) {
        const size_t stride = (size_t)H_kv * d;
        for (int e = tid; e < BK * (DMAX / 4); e += ATT_TILE_THREADS) {
            const int r = e / (DMAX / 4), c4 = 4 * (e % (DMAX / 4));
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (s_seen[r] && c4 < d) v = *(const float4*)(c + (size_t)(c0 + r) * stride + (size_t)g * d + c4);
            *(float4*)&KV[r][c4] = v;
        }
    };
    for (int c0 = c_lo; c0 < c_hi; c0 += BK) {
        // which of the tile's cells some token sees
        if (tid < BK) {
            const int cell = c0 + tid;
            int seen = 0;
            for (int r = 0; r < BQ; r++)
                seen |= cell < s_pe[r] || (cell >= s_vs[r] && cell < s_oe[r]);
            s_seen[tid] = seen && cell < c_hi;
        }
        __syncthreads();
        stage_cells(kc, dk, c0);
        __syncthreads();
        // scores of tokens a + 16i x cells b + 16j
        float sc[NQ][NK];
#pragma unroll
        for (int i = 0; i < NQ; i++)
#pragma unroll
            for (int j = 0; j < NK; j++) sc[i][j] = 0.f;
        for (int d = 0; d < dk; d += 4) {
            float4 qv[NQ], kv[NK];
#pragma unroll
            for (int i = 0; i < NQ; i++) qv[i] = *(const float4*)&Qs[a + 16 * i][d];
#pragma unroll
            for (int j = 0; j < NK; j++) kv[j] = *(const float4*)&KV[b + 16 * j][d];
#pragma unroll
            for (int i = 0; i < NQ; i++)
#pragma unroll
                for (int j = 0; j < NK; j++) {
                    sc[i][j] = fmaf(qv[i].x, kv[j].x, sc[i][j]);
                    sc[i][j] = fmaf(qv[i].y, kv[j].y, sc[i][j]);
                    sc[i][j] = fmaf(qv[i].z, kv[j].z, sc[i][j]);
                    sc[i][j] = fmaf(qv[i].w, kv[j].w, sc[i][j]);
                }
        }
#pragma unroll
        for (int i = 0; i < NQ; i++)
#pragma unroll
            for (int j = 0; j < NK; j++) {
                const int r = a + 16 * i, cell = c0 + b + 16 * j;
                const bool vis = cell < s_pe[r] || (cell >= s_vs[r] && cell < s_oe[r]);
                Ps[r][b + 16 * j] = vis ? sc[i][j] * scale : -INFINITY;
            }
        __syncthreads();
        stage_cells(vc, dv, c0);  // V into the shared buffer while the softmax runs on Ps
        {  // online softmax: TPR threads a token row, BK / TPR cells each
            const int r = tid / TPR, part = tid % TPR;
            float mx = -INFINITY;
#pragma unroll
            for (int j = part; j < BK; j += TPR) mx = fmaxf(mx, Ps[r][j]);
#pragma unroll
            for (int o = TPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o, TPR));
            const float m_old = s_m[r], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
#pragma unroll
            for (int j = part; j < BK; j += TPR) {
                const float p = m_new == -INFINITY ? 0.f : expf(Ps[r][j] - m_new);
                Ps[r][j] = p;
                sum += p;
            }
#pragma unroll
            for (int o = TPR / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o, TPR);
            __syncwarp();
            if (part == 0) {
                const float corr = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
                s_corr[r] = corr;
                s_l[r] = s_l[r] * corr + sum;
                s_m[r] = m_new;
            }
        }
        __syncthreads();
        // acc = acc * corr + P . V for tokens a + 16i, columns 4b + 64c
#pragma unroll
        for (int i = 0; i < NQ; i++) {
            const float corr = s_corr[a + 16 * i];
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int x = 0; x < 4; x++) acc[i][c][x] *= corr;
        }
        const int nk = min(BK, c_hi - c0);
        for (int k = 0; k < nk; k++) {
            float p[NQ];
#pragma unroll
            for (int i = 0; i < NQ; i++) p[i] = Ps[a + 16 * i][k];
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const float4 v = *(const float4*)&KV[k][4 * b + 64 * c];
#pragma unroll
                for (int i = 0; i < NQ; i++) {
                    acc[i][c][0] = fmaf(p[i], v.x, acc[i][c][0]);
                    acc[i][c][1] = fmaf(p[i], v.y, acc[i][c][1]);
                    acc[i][c][2] = fmaf(p[i], v.z, acc[i][c][2]);
                    acc[i][c][3] = fmaf(p[i], v.w, acc[i][c][3]);
                }
            }
        }
        __syncthreads();  // KV, Ps and s_seen are rewritten by the next tile
    }
#pragma unroll
    for (int i = 0; i < NQ; i++) {
        const int r = a + 16 * i;
        if (t0 + r >= T) continue;
        const float L = s_l[r], invL = L > 0.f ? 1.0f / L : 0.f;
        float* o = out + ((size_t)(t0 + r) * H + h) * dv;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = 4 * b + 64 * c;
            if (col < dv)
                *(float4*)(o + col) = make_float4(acc[i][c][0] * invL, acc[i][c][1] * invL,
                                                  acc[i][c][2] * invL, acc[i][c][3] * invL);
        }
    }
}

// d_k, d_v <= 128: 32 tokens x 32 cells a tile (38 KB of shared memory); <= 256: 16 x 16 (34 KB)
#define RX_ATT_TILED(NAME, BQ, BK, DMAX)                                                            \
    extern "C" __global__ void __launch_bounds__(ATT_TILE_THREADS, 2)                              \
    NAME(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,  \
         float* __restrict__ out, const int* __restrict__ prefix_end,                              \
         const int* __restrict__ own_start, const int* __restrict__ own_end, int T, int H,          \
         int H_kv, int dk, int dv, float scale) {                                                  \
        RX_PDL_ENTRY();                                                                            \
        attention_tiled_body<BQ, BK, DMAX>(q, kc, vc, out, prefix_end, own_start, own_end, T, H,   \
                                           H_kv, dk, dv, scale);                                   \
    }
RX_ATT_TILED(reflex_attention_tiled128, 32, 32, 128)
RX_ATT_TILED(reflex_attention_tiled256, 16, 16, 256)

// ------------------------------------------------------------------------------------------
// attention_mma: the prefill's attention on the tensor cores (sm_80+), same inputs, cells and
// result as attention_tiled to about f32 accuracy. Every value enters the tensor cores as a
// float16 pair (hi, lo), hi = f16(v), lo = f16(v - hi) (about 22 bits; values must stay within
// float16's range, 65504, as llama.cpp's float16 cache also needs): scores S = Qh.Kh + Qh.Kl +
// Ql.Kh and outputs O += Ph.Vh + Ph.Vl + Pl.Vh with m16n8k16 products in f32 (the dropped lo.lo
// terms are ~2^-22 of each product). reflex_kv_halves first writes the cache's visible cells as
// such pairs, once per layer; then block (h, query tile of 16 W tokens), W warps of 16 tokens,
// runs over the cells in tiles of BK, over the same [c_lo, c_hi) with the same visibility as
// attention_tiled. A tile's K and V pairs are copied into shared memory with cp.async one tile
// ahead of the math (a cell no token of the block sees is filled with zeros: its cache row may
// be uninitialised, and 0 * NaN would poison the sum); rows are DMAX + 8 halves apart, so
// ldmatrix's 8 rows hit distinct banks. A warp's scores stay in registers, the online softmax
// runs on them (a row's 4 lanes combine by shuffles) and they become the A fragments of P . V
// directly; a warp skips the tiles none of its tokens sees. Needs d_k, d_v <= DMAX, multiples
// of 4, 16-byte aligned q and out (the launcher checks). grid (H, ceil(T / 16W)), block 32 W,
// dynamic shared memory (16 W + 4 BK) * 2 * (DMAX + 8) * 2 bytes.

// reflex_kv_halves: cells [0, n) of the K and V caches (rows of H_kv heads of d_k / d_v floats)
// as float16 pairs, zeros past d: head g of cell c at kh + ((c H_kv + g) 2 + {0: hi, 1: lo}) DMAX
// halves (vh the same for V). grid-stride over float4s, block 256.
extern "C" __global__ void __launch_bounds__(256)
reflex_kv_halves(const float* __restrict__ kc, const float* __restrict__ vc, uint16_t* __restrict__ kh,
                 uint16_t* __restrict__ vh, int n, int H_kv, int dk, int dv, int dmax) {
    RX_PDL_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const long long per = (long long)n * H_kv * (dmax / 4);  // float4s of one cache
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * per;
         i += (long long)gridDim.x * blockDim.x) {
        const bool v_side = i >= per;
        const long long j = v_side ? i - per : i, row = j / (dmax / 4);  // row = c H_kv + g
        const int c4 = 4 * (int)(j % (dmax / 4)), d = v_side ? dv : dk;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c4 < d) x = __ldg(reinterpret_cast<const float4*>((v_side ? vc : kc) + row * d + c4));
        uint2 hi, lo;
        rx_split_f16x2(x.x, x.y, hi.x, lo.x);
        rx_split_f16x2(x.z, x.w, hi.y, lo.y);
        uint16_t* o = (v_side ? vh : kh) + row * 2 * dmax + c4;
        *reinterpret_cast<uint2*>(o) = hi;
        *reinterpret_cast<uint2*>(o + dmax) = lo;
    }
#endif
}

template <int DMAX, int W, int BK>
__device__ __forceinline__ void attention_mma_body(
    const float* __restrict__ q, const uint16_t* __restrict__ kh, const uint16_t* __restrict__ vh,
    float* __restrict__ out, const int* __restrict__ prefix_end, const int* __restrict__ own_start,
    const int* __restrict__ own_end, int T, int H, int H_kv, int dk, int dv, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BQ = 16 * W, THREADS = 32 * W, LDH = DMAX + 8, NKS = DMAX / 16, NST = BK / 8;
    constexpr int NOT = DMAX / 8, PARTS = THREADS / BK;
    constexpr int CPR = DMAX / 8, NCP = 4 * BK * CPR / THREADS;  // 16-byte copies a row, a thread
    static_assert(DMAX % 16 == 0 && BK % 16 == 0 && BQ <= THREADS, "tile shapes");
    static_assert(PARTS * BK == THREADS && BQ % PARTS == 0 && NCP * THREADS == 4 * BK * CPR,
                  "whole parts and copies");
    extern __shared__ uint4 rx_att_smem[];
    uint16_t* Qh = reinterpret_cast<uint16_t*>(rx_att_smem);  // [BQ][LDH] each
    uint16_t* Ql = Qh + BQ * LDH;
    uint16_t* KV = Ql + BQ * LDH;  // [stage][Kh, Kl, Vh, Vl][BK][LDH]
    __shared__ int s_pe[BQ], s_vs[BQ], s_oe[BQ], s_seen[2][BK];
    __shared__ int s_lo, s_hi, s_wlo[W], s_whi[W];
    // the last query tiles see the most cells: they start first
    const int tid = threadIdx.x, h = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * BQ;
    const int g = h / (H / H_kv);
    const int warp = tid >> 5, lane = tid & 31, wg = lane >> 2, wq = lane & 3;
    if (tid == 0) { s_lo = 0x7fffffff; s_hi = 0; }
    if (tid < W) { s_wlo[tid] = 0x7fffffff; s_whi[tid] = 0; }
    if (tid < BK) { s_seen[0][tid] = 0; s_seen[1][tid] = 0; }
    __syncthreads();
    if (tid < BQ) {
        int pe, vs, oe, first, last;
        if (att_token_cells(prefix_end, own_start, own_end, T, t0 + tid, pe, vs, oe, first, last)) {
            atomicMin(&s_lo, first); atomicMax(&s_hi, last);
            atomicMin(&s_wlo[tid / 16], first); atomicMax(&s_whi[tid / 16], last);
        }
        s_pe[tid] = pe; s_vs[tid] = vs; s_oe[tid] = oe;
    }
    // the query tile as pairs (zeros past T and past d_k)
    for (int e = tid; e < BQ * (DMAX / 4); e += THREADS) {
        const int r = e / (DMAX / 4), c4 = 4 * (e % (DMAX / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + r < T && c4 < dk) v = *reinterpret_cast<const float4*>(q + ((size_t)(t0 + r) * H + h) * dk + c4);
        uint2 vh2, vl2;
        rx_split_f16x2(v.x, v.y, vh2.x, vl2.x);
        rx_split_f16x2(v.z, v.w, vh2.y, vl2.y);
        *reinterpret_cast<uint2*>(Qh + r * LDH + c4) = vh2;
        *reinterpret_cast<uint2*>(Ql + r * LDH + c4) = vl2;
    }
    __syncthreads();
    const int c_lo = s_lo, c_hi = s_hi, w_lo = s_wlo[warp], w_hi = s_whi[warp];
    // which of tile c0's cells some token sees, into s_seen[par] (zero before): PARTS threads a
    // cell, BQ / PARTS rows each
    auto mark_seen = [&](int c0, int par) {
        const int cell = c0 + tid % BK, r0 = (tid / BK) * (BQ / PARTS);
        int seen = 0;
        for (int r = r0; r < r0 + BQ / PARTS; r++)
            seen |= cell < s_pe[r] || (cell >= s_vs[r] && cell < s_oe[r]);
        if (seen && cell < c_hi) atomicOr(&s_seen[par][tid % BK], 1);
    };
    // tile c0's K and V pairs into stage st (zeros for the cells s_seen[par] leaves out)
    auto copy_tile = [&](int c0, int st, int par) {
        uint16_t* dst = KV + st * 4 * BK * LDH;
#pragma unroll
        for (int i = 0; i < NCP; i++) {
            const int e = tid + THREADS * i, a = e / (BK * CPR), r = (e / CPR) % BK, c = e % CPR;
            const bool ok = s_seen[par][r] != 0;  // a: 0 Kh, 1 Kl, 2 Vh, 3 Vl
            const uint16_t* src = (a < 2 ? kh : vh) + (((size_t)(c0 + r) * H_kv + g) * 2 + (a & 1)) * DMAX + 8 * c;
            rx_cp_async16(dst + (a * BK + r) * LDH + 8 * c, ok ? (const void*)src : (const void*)kh, ok);
        }
        rx_cp_async_commit();
    };
    const int ra = 16 * warp + wg, rb = ra + 8;  // this thread's two token rows of the tile
    const int pe_a = s_pe[ra], vs_a = s_vs[ra], oe_a = s_oe[ra];
    const int pe_b = s_pe[rb], vs_b = s_vs[rb], oe_b = s_oe[rb];
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    float o[NOT][4];
#pragma unroll
    for (int n = 0; n < NOT; n++)
#pragma unroll
        for (int x = 0; x < 4; x++) o[n][x] = 0.f;
    // ldmatrix row addresses: lane l gives row l % 8 of matrix l / 8
    const int lr = lane & 7, lm = lane >> 3;
    const uint16_t* qa_h = Qh + (16 * warp + lr + 8 * (lm & 1)) * LDH + 8 * (lm >> 1);
    const uint16_t* qa_l = Ql + (16 * warp + lr + 8 * (lm & 1)) * LDH + 8 * (lm >> 1);
    const int k_off = (lr + 8 * (lm >> 1)) * LDH + 8 * (lm & 1);  // + 16 LDH np + 16 ks
    const int v_off = (lr + 8 * (lm & 1)) * LDH + 8 * (lm >> 1);  // + 16 LDH ks + 16 np
    if (c_lo < c_hi) {
        mark_seen(c_lo, 0);
        __syncthreads();
        copy_tile(c_lo, 0, 0);
    }
    for (int c0 = c_lo, it = 0; c0 < c_hi; c0 += BK, it++) {
        const int st = it & 1;
        const bool more = c0 + BK < c_hi;
        if (more) mark_seen(c0 + BK, st ^ 1);
        __syncthreads();  // s_seen of the next tile; every warp is done with stage st ^ 1
        if (more) copy_tile(c0 + BK, st ^ 1, st ^ 1);
        if (tid < BK) s_seen[st][tid] = 0;  // read by this tile's copies only, issued before
        if (more) asm volatile("cp.async.wait_group 1;\n" ::);  // this thread's copies of c0
        else asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads();  // everyone's
        if (c0 >= w_hi || c0 + BK <= w_lo) continue;  // none of this warp's tokens sees the tile
        const uint16_t* Kh = KV + st * 4 * BK * LDH;
        const uint16_t* Kl = Kh + BK * LDH;
        const uint16_t* Vh = Kl + BK * LDH;
        const uint16_t* Vl = Vh + BK * LDH;
        float sc[NST][4];
#pragma unroll
        for (int j = 0; j < NST; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) sc[j][x] = 0.f;
#pragma unroll
        for (int ks = 0; ks < NKS; ks++) {
            if (16 * ks >= dk) break;
            uint32_t ah[4], al[4];
            rx_ldsm_x4(ah, qa_h + 16 * ks);
            rx_ldsm_x4(al, qa_l + 16 * ks);
#pragma unroll
            for (int np = 0; np < NST / 2; np++) {
                uint32_t bh[4], bl[4];
                rx_ldsm_x4(bh, Kh + k_off + 16 * LDH * np + 16 * ks);
                rx_ldsm_x4(bl, Kl + k_off + 16 * LDH * np + 16 * ks);
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    rx_mma_f16(sc[2 * np + u], ah, bh[2 * u], bh[2 * u + 1]);
                    rx_mma_f16(sc[2 * np + u], ah, bl[2 * u], bl[2 * u + 1]);
                    rx_mma_f16(sc[2 * np + u], al, bh[2 * u], bh[2 * u + 1]);
                }
            }
        }
        // scale and mask (rows ra: x < 2, rb: x >= 2; cell c0 + 8 j + 2 wq + x % 2), then the
        // online softmax of both rows
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < NST; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int cell = c0 + 8 * j + 2 * wq + (x & 1);
                const bool vis = x < 2 ? cell < pe_a || (cell >= vs_a && cell < oe_a)
                                       : cell < pe_b || (cell >= vs_b && cell < oe_b);
                sc[j][x] = vis ? sc[j][x] * scale : -INFINITY;
                if (x < 2) mx_a = fmaxf(mx_a, sc[j][x]); else mx_b = fmaxf(mx_b, sc[j][x]);
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, o2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, o2));
        }
        const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        const float corr_a = m_a == -INFINITY ? 0.f : expf(m_a - mn_a);
        const float corr_b = m_b == -INFINITY ? 0.f : expf(m_b - mn_b);
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int j = 0; j < NST; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const float mn = x < 2 ? mn_a : mn_b;
                const float p = mn == -INFINITY ? 0.f : expf(sc[j][x] - mn);
                sc[j][x] = p;
                if (x < 2) sum_a += p; else sum_b += p;
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            sum_a += __shfl_xor_sync(FULL_MASK, sum_a, o2);
            sum_b += __shfl_xor_sync(FULL_MASK, sum_b, o2);
        }
        l_a = l_a * corr_a + sum_a;
        l_b = l_b * corr_b + sum_b;
        m_a = mn_a;
        m_b = mn_b;
#pragma unroll
        for (int n = 0; n < NOT; n++) {
            o[n][0] *= corr_a; o[n][1] *= corr_a;
            o[n][2] *= corr_b; o[n][3] *= corr_b;
        }
        // O += P . V: the score fragments of cells 16 ks .. + 15 are P's A fragment
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t ph[4], pl[4];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                rx_split_f16x2(sc[2 * ks + u][0], sc[2 * ks + u][1], ph[2 * u], pl[2 * u]);
                rx_split_f16x2(sc[2 * ks + u][2], sc[2 * ks + u][3], ph[2 * u + 1], pl[2 * u + 1]);
            }
#pragma unroll
            for (int np = 0; np < NOT / 2; np++) {
                if (16 * np >= dv) break;
                uint32_t bh[4], bl[4];
                rx_ldsm_x4_t(bh, Vh + v_off + 16 * LDH * ks + 16 * np);
                rx_ldsm_x4_t(bl, Vl + v_off + 16 * LDH * ks + 16 * np);
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    rx_mma_f16(o[2 * np + u], ph, bh[2 * u], bh[2 * u + 1]);
                    rx_mma_f16(o[2 * np + u], ph, bl[2 * u], bl[2 * u + 1]);
                    rx_mma_f16(o[2 * np + u], pl, bh[2 * u], bh[2 * u + 1]);
                }
            }
        }
    }
    const float inv_a = l_a > 0.f ? 1.0f / l_a : 0.f, inv_b = l_b > 0.f ? 1.0f / l_b : 0.f;
#pragma unroll
    for (int n = 0; n < NOT; n++) {
        const int col = 8 * n + 2 * wq;
        if (col >= dv) break;
        if (t0 + ra < T)
            *reinterpret_cast<float2*>(out + ((size_t)(t0 + ra) * H + h) * dv + col) =
                make_float2(o[n][0] * inv_a, o[n][1] * inv_a);
        if (t0 + rb < T)
            *reinterpret_cast<float2*>(out + ((size_t)(t0 + rb) * H + h) * dv + col) =
                make_float2(o[n][2] * inv_b, o[n][3] * inv_b);
    }
#endif
}

// kh, vh: reflex_kv_halves' pairs of the caches. d_k, d_v <= 128: 128 tokens (8 warps) x 32
// cells a tile; <= 256: 64 tokens (4 warps) x 16 cells. MINB blocks an SM (launch bounds).
#define RX_ATT_MMA(NAME, DMAX, W, BK, MINB)                                                         \
    extern "C" __global__ void __launch_bounds__(32 * W, MINB)                                     \
    NAME(const float* __restrict__ q, const uint16_t* __restrict__ kh,                             \
         const uint16_t* __restrict__ vh, float* __restrict__ out,                                 \
         const int* __restrict__ prefix_end, const int* __restrict__ own_start,                    \
         const int* __restrict__ own_end, int T, int H, int H_kv, int dk, int dv, float scale) {   \
        RX_PDL_ENTRY();                                                                            \
        attention_mma_body<DMAX, W, BK>(q, kh, vh, out, prefix_end, own_start, own_end, T, H, H_kv, \
                                        dk, dv, scale);                                            \
    }
RX_ATT_MMA(reflex_attention_mma128, 128, 8, 32, 1)
RX_ATT_MMA(reflex_attention_mma256, 256, 4, 16, 1)

// ------------------------------------------------------------------------------------------
// x_limbs: x (n floats, n % 32 == 0, any number of rows back to back) -> the x limbs the GEMV on
// integer weights reads (layout: reflex/quants.cuh, before rx_gemv_rows_xq). One warp per
// 32-element block, a lane per element: M = the block's largest |x|, e with M < 2^e (frexp; at
// least -127, so that a block of subnormals has s = 2^-149 and its X are exact), s = 2^(e-22),
// X = rint(x * 2^(22-e)), so |X| <= 2^22; M = 0: s = 1, X = 0; a NaN or inf in the block:
// s = NaN, X = 0 (the products then give NaN, as they would with the floats). Lane i of
// group g (lanes 4g..4g+3) writes word i of the group: byte i of each of the four X (i < 3), or s.
// The group's words go to its slot, rx_xq_slot(g) (the one-token IQ4_XS GEMV's load order); out
// holds whole chunks of RX_XQ_CHUNK elements. NumPy twin: reflex_core.testing.x_limbs.x_limbs.

extern "C" __global__ void reflex_x_limbs(const float* __restrict__ x, uint32_t* __restrict__ out, int n) {
    RX_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // n % 32 == 0: whole warps in or out
    if (i >= n) return;
    const float v = x[i];
    const uint32_t mb = __reduce_max_sync(FULL_MASK, __float_as_uint(v) & 0x7fffffffu);
    int X = 0;
    float s = 1.0f;
    if (mb >= 0x7f800000u) {
        s = rx_nan();
    } else if (mb != 0) {
        int e;
        frexpf(__uint_as_float(mb), &e);
        e = max(e, -127);  // subnormal blocks: s = 2^-149 keeps s a float and X = x exactly
        X = __float2int_rn(ldexpf(v, 22 - e));
        s = ldexpf(1.0f, e - 22);
    }
    const int lane = threadIdx.x & 31, base = lane & ~3, part = lane & 3;
    const uint32_t x0 = __shfl_sync(FULL_MASK, X, base), x1 = __shfl_sync(FULL_MASK, X, base + 1);
    const uint32_t x2 = __shfl_sync(FULL_MASK, X, base + 2), x3 = __shfl_sync(FULL_MASK, X, base + 3);
    uint32_t w;
    if (part == 3) {
        w = __float_as_uint(s);
    } else {  // byte `part` of x0..x3 -> bytes 0..3
        const uint32_t sel = (uint32_t)part | ((uint32_t)(part + 4) << 4);
        w = __byte_perm(__byte_perm(x0, x1, sel), __byte_perm(x2, x3, sel), 0x5410u);
    }
    out[4 * rx_xq_slot(i >> 2) + part] = w;
}

// ------------------------------------------------------------------------------------------
// float -> float16 bits, round to nearest even
__device__ __forceinline__ uint32_t rx_f32_to_f16_rn(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

// x_halves: x [T, n_in] (n_in % 32 == 0) -> the prefill matmul's input for the integer weight
// types (reflex_matmul_xh_<t>, reflex/quant_kernels.cuh). Per row a power-of-two scale s: with
// M = the row's largest |x| and M < 2^e (frexp; e at least -112, so s and 1/s are normal floats),
// s = 2^(e-15); M = 0: s = 1; a NaN or inf in the row: s = NaN and every half 0. Each v = x / s
// (|v| < 2^15; x * 2^(15-e), one rounding only where v is subnormal) is the float16 pair
// hi = half(v), lo = half(v - hi) (round to nearest even; v - hi is exact), so hi + lo is v to
// about 22 bits. H, per 32-element block, 32 words: word 16 h + 4 q + i holds, low half first,
// i = 0: hi of elements 16 h + 2 q and +1; i = 1: hi of 16 h + 2 q + 8 and +9; i = 2, 3: the
// same lo's (the m16n8k16 B fragments of half h for lane group q, hi and lo, in one 16-byte
// load). R: s of each row [T], then each block's sum of hi + lo [T][n_in / 32] (float32, the
// butterfly order of a warp's xor shuffles). One 256-thread block per row.
// NumPy twin: reflex_core.testing.x_halves.x_halves.
extern "C" __global__ void __launch_bounds__(256) reflex_x_halves(const float* __restrict__ x, uint32_t* __restrict__ H,
                                                         float* __restrict__ R, int T, int n_in) {
    RX_PDL_ENTRY();
    __shared__ int red[32];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* xr = x + (long long)t * n_in;
    int mbits = 0;  // |x|'s bits: non-negative, ordered as the values (NaN above inf)
    for (int i = tid; i < n_in; i += 256) mbits = max(mbits, __float_as_int(xr[i]) & 0x7fffffff);
    float s, inv;
    const bool finite = rx_pow2_scale((uint32_t)block_max_i(mbits, red), s, inv);
    if (tid == 0) R[t] = s;
    const int nb = n_in >> 5;
    // this lane's word of a block: half h, lane group q, part i; its two elements
    const int h = lane >> 4, q = (lane >> 2) & 3, i = lane & 3;
    const int src = 16 * h + 2 * q + ((i & 1) ? 8 : 0);
    for (int b = warp; b < nb; b += 8) {
        const float v = finite ? xr[32 * b + lane] * inv : 0.0f;
        const uint32_t hi = rx_f32_to_f16_rn(v);
        const float hf = rx_f16_to_f32_fast(hi);
        const uint32_t lo = rx_f32_to_f16_rn(v - hf);
        const uint32_t p = hi | (lo << 16);
        const uint32_t p0 = __shfl_sync(FULL_MASK, p, src), p1 = __shfl_sync(FULL_MASK, p, src + 1);
        H[((long long)t * nb + b) * 32 + lane] = i < 2 ? (p0 & 0xffffu) | (p1 << 16) : (p0 >> 16) | (p1 & 0xffff0000u);
        const float sum = rx_warp_sum(hf + rx_f16_to_f32_fast(lo));
        if (lane == 0) R[T + (long long)t * nb + b] = sum;
    }
}

// x_pairs: x [T, n_in] (n_in % 4 == 0) as the float16 pairs the prefill GEMM reads
// (reflex_matmul_f16x{1,3}, reflex/quant_kernels.cuh): per row x_halves' power-of-two scale s
// (the same rule: rx_pow2_scale) and each v = x / s as hi = half(v), lo = half(v - hi). Three
// planes: hi [T][n_in] halves, then lo [T][n_in] halves, then s [T] floats (out + 4 T n_in
// bytes). A NaN or inf in a row: s = NaN and every half 0. One 256-thread block per row.
// NumPy twin: reflex_core.testing.f16_pairs.pairs.
extern "C" __global__ void __launch_bounds__(256) reflex_x_pairs(const float* __restrict__ x, uint16_t* __restrict__ out,
                                                        int T, int n_in) {
    RX_PDL_ENTRY();
    __shared__ int red[32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float4* xr = reinterpret_cast<const float4*>(x + (long long)t * n_in);
    const int n4 = n_in >> 2;
    int mbits = 0;
    for (int i = tid; i < n4; i += 256) {
        const float4 v = xr[i];
        mbits = max(max(mbits, __float_as_int(v.x) & 0x7fffffff), __float_as_int(v.y) & 0x7fffffff);
        mbits = max(max(mbits, __float_as_int(v.z) & 0x7fffffff), __float_as_int(v.w) & 0x7fffffff);
    }
    float s, inv;
    const bool finite = rx_pow2_scale((uint32_t)block_max_i(mbits, red), s, inv);
    if (tid == 0) reinterpret_cast<float*>(out + 2LL * T * n_in)[t] = s;
    uint2* hi = reinterpret_cast<uint2*>(out + (long long)t * n_in);
    uint2* lo = reinterpret_cast<uint2*>(out + (long long)(T + t) * n_in);
    for (int i = tid; i < n4; i += 256) {
        float4 v = xr[i];
        if (!finite) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        uint2 h, l;
        rx_split_f16x2(v.x * inv, v.y * inv, h.x, l.x);
        rx_split_f16x2(v.z * inv, v.w * inv, h.y, l.y);
        hi[i] = h;
        lo[i] = l;
    }
}

// ------------------------------------------------------------------------------------------
// take_rows: y[r, :] = x[rows[r], :]; grid (ceil(n/256), R).

extern "C" __global__ void reflex_take_rows(const float* __restrict__ x, const int* __restrict__ rows,
                                            float* __restrict__ y, int n) {
    RX_PDL_ENTRY();
    const int r = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[(size_t)r * n + i] = x[(size_t)rows[r] * n + i];
}

// ------------------------------------------------------------------------------------------
// A pick's id also into mapped host memory (out_host, may be null): the store crosses the bus
// and is fenced at system scope, so the host that waits for the launch's completion (an event)
// reads it. A chained decode step's id comes back so, without a copy on the copy engine, which
// started about 5 us after the pick and held up the next step's inputs (BENCHMARKS.md).
__device__ __forceinline__ void rx_put_host(int* out_host, int i, int id) {
    if (out_host != nullptr) {
        *(volatile int*)(out_host + i) = id;
        __threadfence_system();
    }
}

// copy_words: a chained decode step's int32 inputs from mapped host memory to the fixed buffer
// its graph reads (one block reads across the bus; an HtoD copy on the copy engine started about
// 5 us after the kernel before it).
extern "C" __global__ void reflex_copy_words(const int* __restrict__ src, int* __restrict__ dst,
                                             int n) {
    RX_PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// ------------------------------------------------------------------------------------------
// argmax: one block per row; per-thread strided scan keeps the first maximum, then a block
// (value desc, index asc) reduction -> the lowest index among equal maxima (NumPy's argmax).
// The scan loads ARGMAX_UNROLL of its elements before comparing them (in the same order): with a
// compare after each load, one block over a 151936-token row waited on every load in turn
// (60 us on the H200).
#define ARGMAX_UNROLL 16

extern "C" __global__ void reflex_argmax(const float* __restrict__ x, int* __restrict__ out, int n,
                                         int* __restrict__ out_host) {
    RX_PDL_ENTRY();
    __shared__ float rv[32];
    __shared__ int ri[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float best = -INFINITY;
    int bi = -1;
    const int step = blockDim.x;
    int i = threadIdx.x;
    for (; i + (ARGMAX_UNROLL - 1) * step < n; i += ARGMAX_UNROLL * step) {
        float v[ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) v[u] = xr[i + u * step];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++)
            if (bi < 0 || v[u] > best) { best = v[u]; bi = i + u * step; }
    }
    for (; i < n; i += step) {
        const float v = xr[i];
        if (bi < 0 || v > best) { best = v; bi = i; }
    }
    block_argmax(best, bi, rv, ri);
    if (threadIdx.x == 0) {
        const int id = bi < 0 ? 0 : bi;
        out[blockIdx.x] = id;
        rx_put_host(out_host, blockIdx.x, id);
    }
}

// argmax_split: one row over gridDim.x blocks (one block over a decode step's 151936 logits kept
// one SM busy for 12 us). Block b scans its contiguous REFLEX_ARGMAX_SPLIT_CHUNK elements (each
// thread its strided ARGMAX_UNROLL loads at once), leaves its pair in part (value, index as
// bits), counts itself in at done[0], and the last block merges the gridDim.x pairs and sets the
// count back to 0.
// The merge's order (value desc, index asc) is total, so the answer is reflex_argmax's.
#define ARGMAX_SPLIT_THREADS 256
#define REFLEX_ARGMAX_SPLIT_CHUNK 4096  // ARGMAX_SPLIT_THREADS * ARGMAX_UNROLL (the backend reads it)
static_assert(REFLEX_ARGMAX_SPLIT_CHUNK == ARGMAX_SPLIT_THREADS * ARGMAX_UNROLL, "a block's elements");

extern "C" __global__ void __launch_bounds__(ARGMAX_SPLIT_THREADS)
    reflex_argmax_split(const float* __restrict__ x, int* __restrict__ out, int n,
                        float* __restrict__ part, int* __restrict__ done,
                        int* __restrict__ out_host) {
    RX_PDL_ENTRY();
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ int s_last;
    const int base = blockIdx.x * REFLEX_ARGMAX_SPLIT_CHUNK;
    float v[ARGMAX_UNROLL];
#pragma unroll
    for (int u = 0; u < ARGMAX_UNROLL; u++) {
        const int i = base + threadIdx.x + u * ARGMAX_SPLIT_THREADS;
        v[u] = i < n ? x[i] : 0.0f;
    }
    float best = -INFINITY;
    int bi = -1;
#pragma unroll
    for (int u = 0; u < ARGMAX_UNROLL; u++) {
        const int i = base + threadIdx.x + u * ARGMAX_SPLIT_THREADS;
        if (i < n && (bi < 0 || v[u] > best)) { best = v[u]; bi = i; }
    }
    block_argmax(best, bi, rv, ri);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = best;
        part[2 * blockIdx.x + 1] = __int_as_float(bi);
        __threadfence();  // the pair is visible before the count
        s_last = atomicAdd(done, 1) == (int)gridDim.x - 1;
        if (s_last) *done = 0;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    best = -INFINITY;
    bi = -1;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)  // the other blocks' pairs: L2
        argmax_merge(best, bi, __ldcg(part + 2 * b), __float_as_int(__ldcg(part + 2 * b + 1)));
    block_argmax(best, bi, rv, ri);
    if (threadIdx.x == 0) {
        const int id = bi < 0 ? 0 : bi;
        out[0] = id;
        rx_put_host(out_host, 0, id);
    }
}

// ------------------------------------------------------------------------------------------
// token_logprobs: one block per row: out[r] = x[r, tgt] - max - log(sum exp(x - max)), the sum
// accumulated in float64. out is float64.

extern "C" __global__ void reflex_token_logprobs(const float* __restrict__ x,
                                                 const int* __restrict__ targets,
                                                 double* __restrict__ out, int n) {
    RX_PDL_ENTRY();
    __shared__ float redf[32];
    __shared__ double redd[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
    mx = block_max_f(mx, redf);
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)expf(xr[i] - mx);
    s = block_sum_d(s, redd);
    if (threadIdx.x == 0) {
        const int tg = targets[blockIdx.x];
        out[blockIdx.x] = (double)xr[tg] - (double)mx - log(s);
    }
}

// ------------------------------------------------------------------------------------------
// repeat_penalty: step 1 of reflex_core/sampling.py on one row `x`: thread j penalises x[ids[j]]
// (float32, IEEE division: bit for bit the NumPy twin). The launcher uploads distinct ids in
// [0, V), so no two threads touch one logit.

extern "C" __global__ void reflex_repeat_penalty(float* __restrict__ x, const int* __restrict__ ids,
                                                 int n, float penalty) {
    RX_PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        const int i = ids[j];
        const float v = x[i];
        x[i] = v > 0.0f ? v / penalty : v * penalty;
    }
}

// ------------------------------------------------------------------------------------------
// sample: one block of 512 threads draws one token from row `x` (length V) exactly as
// reflex_core/sampling.py defines it (temperature > 0; the host does greedy with argmax):
//   z = f64(x)/f64(temp); p = exp(z - max z) -> scratch (float64, V entries); while top-p runs
//     the scratch holds q = exp(f64(x) - f64(max x)) instead (top-p on the temperature-1
//     probabilities, llama.cpp's chain order), and p after it.
//   top-k (0 < k < V): the k-th largest float32 key by 8 passes of 4-bit radix select (integer
//     counts); kept = key >= key_k (float32 order == z order: no new ties, sampling.py notes).
//   top-p (top_p < 1): t = the largest key v with G(v) = sum_{kept, key >= v} q >= top_p * S,
//     found digit by digit (8 passes x 16 float64 bin sums, reduced in a fixed order); q is
//     strictly increasing in the key where q > 0, so {key >= t} == {q >= q(t)}; if q(t) == 0
//     everything kept stays kept (the reference's q >= 0).
//   min-p (min_p_log > -inf, = ln(min_p) from the host): kept also needs
//     f64(x) - f64(max x) >= min_p_log; it comes after top-p and only narrows the draw.
//   draw: thread r owns indices [r*C, (r+1)*C); exclusive scan of the per-thread kept sums
//     (index order), target = u * total; each thread walks its chunk and the lowest index whose
//     running sum exceeds target wins; none -> the last kept index.

#define SMP_THREADS 512  // 128 registers/thread available: the 16+16 bins stay in registers
#define SMP_WARPS (SMP_THREADS / 32)

__device__ __forceinline__ unsigned f2key(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key2f(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Fixed-order block reduction of 16 float64 bins (when WITH_P) and 16 int bins into tp/tc
// (shared); the trailing __syncthreads publishes them.
template <bool WITH_P>
__device__ __forceinline__ void block_bins(double (&acc)[16], int (&cnt)[16],
                                           double (*wp)[16], int (*wc)[16],
                                           double* tp, int* tc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int b = 0; b < 16; b++) {
        if (WITH_P) acc[b] = rx_warp_sum(acc[b]);
        cnt[b] = rx_warp_sum(cnt[b]);
    }
    if (lane == 0) {
#pragma unroll
        for (int b = 0; b < 16; b++) {
            if (WITH_P) wp[warp][b] = acc[b];
            wc[warp][b] = cnt[b];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        double s = 0.0;
        int c = 0;
        for (int w = 0; w < SMP_WARPS; w++) {
            if (WITH_P) s += wp[w][threadIdx.x];
            c += wc[w][threadIdx.x];
        }
        tp[threadIdx.x] = s;
        tc[threadIdx.x] = c;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
reflex_sample(const float* __restrict__ x, int V, double temp, int top_k, double top_p,
              double min_p_log, double u, double* __restrict__ pbuf, int* __restrict__ out,
              int* __restrict__ out_host) {
    RX_PDL_ENTRY();
    __shared__ float redf[32];
    __shared__ int redi[32];
    __shared__ double wp[SMP_WARPS][16];
    __shared__ int wc[SMP_WARPS][16];
    __shared__ double tp[16];
    __shared__ int tc[16];
    __shared__ double s_scan[SMP_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // 1. z max and p (q while top-p runs: at temp 1 the two are the same numbers)
    float mx = -INFINITY;
    for (int i = tid; i < V; i += SMP_THREADS) mx = fmaxf(mx, x[i]);
    mx = block_max_f(mx, redf);
    const double zmax = (double)mx / temp, lmax = (double)mx;
    const bool q_first = top_p < 1.0;
    for (int i = tid; i < V; i += SMP_THREADS)
        pbuf[i] = q_first ? exp((double)x[i] - lmax) : exp((double)x[i] / temp - zmax);
    __syncthreads();  // pbuf is re-read below by other threads (global memory, same block)

    unsigned thr = 0u;  // kept = key >= thr
    // 2. top-k: the k-th largest key (counting duplicates)
    if (top_k > 0 && top_k < V) {
        unsigned prefix = 0u;
        int kk = top_k;
        for (int pass = 0; pass < 8; pass++) {
            const int shift = 28 - 4 * pass;
            const unsigned hi = pass == 0 ? 0u : (0xFFFFFFFFu << (shift + 4));
            double acc[16];
            int cnt[16];
#pragma unroll
            for (int b = 0; b < 16; b++) { acc[b] = 0.0; cnt[b] = 0; }
            for (int i = tid; i < V; i += SMP_THREADS) {
                const unsigned key = f2key(x[i]);
                if ((key & hi) == prefix) {
                    const unsigned dg = (key >> shift) & 15u;
#pragma unroll
                    for (int b = 0; b < 16; b++) cnt[b] += (dg == (unsigned)b);
                }
            }
            block_bins<false>(acc, cnt, wp, wc, tp, tc);
            int digit = 0;
            for (int b = 15; b >= 0; b--) {
                if (kk <= tc[b]) { digit = b; break; }
                kk -= tc[b];
            }
            prefix |= (unsigned)digit << shift;
            __syncthreads();  // everyone read tc before the next pass overwrites it
        }
        thr = prefix;
    }

    // 3. top-p over the survivors of top-k
    if (top_p < 1.0) {
        unsigned prefix = 0u;
        double above = 0.0, P = 0.0;
        for (int pass = 0; pass < 8; pass++) {
            const int shift = 28 - 4 * pass;
            const unsigned hi = pass == 0 ? 0u : (0xFFFFFFFFu << (shift + 4));
            double acc[16];
            int cnt[16];
#pragma unroll
            for (int b = 0; b < 16; b++) { acc[b] = 0.0; cnt[b] = 0; }
            for (int i = tid; i < V; i += SMP_THREADS) {
                const unsigned key = f2key(x[i]);
                if (key >= thr && (key & hi) == prefix) {
                    const unsigned dg = (key >> shift) & 15u;
                    const double pv = pbuf[i];
#pragma unroll
                    for (int b = 0; b < 16; b++) {
                        const bool hit = dg == (unsigned)b;
                        acc[b] += hit ? pv : 0.0;
                        cnt[b] += hit;
                    }
                }
            }
            block_bins<true>(acc, cnt, wp, wc, tp, tc);
            if (pass == 0) {  // S = all kept p, summed in the order G is summed below
                double S = 0.0;
                for (int b = 15; b >= 0; b--) if (tc[b] > 0) S += tp[b];
                P = top_p * S;
            }
            int digit = -1;
            double run = above, before = above;
            for (int b = 15; b >= 0; b--) {
                if (tc[b] == 0) continue;
                before = run;
                run += tp[b];
                if (run >= P) { digit = b; break; }
            }
            if (digit < 0) {  // rounding only: take the lowest non-empty bin
                run = above;
                for (int b = 15; b >= 0; b--) {
                    if (tc[b] == 0) continue;
                    before = run;
                    run += tp[b];
                    digit = b;
                }
            }
            above = before;
            prefix |= (unsigned)digit << shift;
            __syncthreads();
        }
        const double qt = exp((double)key2f(prefix) - lmax);
        if (qt > 0.0 && prefix > thr) thr = prefix;
        if (temp != 1.0) {  // the draw's p
            for (int i = tid; i < V; i += SMP_THREADS) pbuf[i] = exp((double)x[i] / temp - zmax);
            __syncthreads();
        }
    }

    // 4. min-p: a test per element in the draw (kept below)
    const bool use_min_p = min_p_log > -INFINITY;
    auto kept = [&](int i) {
        const float xi = x[i];
        return f2key(xi) >= thr && (!use_min_p || (double)xi - lmax >= min_p_log);
    };

    // 5. draw in index order
    const int C = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int i0 = min(V, tid * C), i1 = min(V, i0 + C);
    double local = 0.0;
    int last = -1;
    for (int i = i0; i < i1; i++) {
        if (kept(i)) { local += pbuf[i]; last = i; }
    }
    // exclusive scan of `local` over threads (fixed order)
    double incl = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) s_scan[warp] = incl;
    __syncthreads();
    double wbase = 0.0, total = 0.0;
    for (int w = 0; w < SMP_WARPS; w++) {
        if (w < warp) wbase += s_scan[w];
        total += s_scan[w];
    }
    const double excl = wbase + incl - local;
    const double target = u * total;
    int cand = 0x7fffffff;
    double c = excl;
    for (int i = i0; i < i1; i++) {
        if (kept(i)) {
            c += pbuf[i];
            if (c > target) { cand = i; break; }
        }
    }
    cand = block_min_i(cand, redi);
    if (cand == 0x7fffffff) cand = block_max_i(last, redi);
    if (tid == 0) {
        const int id = cand < 0 ? 0 : cand;
        out[0] = id;
        rx_put_host(out_host, 0, id);
    }
}

// ------------------------------------------------------------------------------------------
// moe_route: one block (256 threads) per token. probs (float32) by gating: 1 softmax(logits),
// 2 sigmoid, 3 the logits themselves (softmax_weight), 4 sqrt(softplus) (softplus = z above 20).
// Selection scores sel = probs + bias[e] (bias null: none). n_group > 1 (DeepSeek's
// group-limited routing): each of the n_group consecutive groups of E / n_group (>= 2) experts
// scores the sum of its two largest sel, a group is kept when fewer than n_group_used groups
// beat it (a higher score, or an equal one at a lower index), the sel of the others become
// -inf. The experts are picked in descending order of sel (the lowest index first on ties, NaN
// after every number, as a stable sort of -sel): with at most one expert a thread, each thread
// counts the experts ahead of its own (its rank: one pass over sel, no serial rounds); with more,
// k rounds of argmax over sel in the first warp (taken experts flagged). Weights = their
// unbiased probs (gating 3: softmax over the k picked), / max(sum, 6.103515625e-5) when norm,
// * scale when scale is neither 0 nor 1 (spec section 4.5), each computed by its own lane of the
// first warp (the sums in pick order). ids [T, k] int32, w [T, k] float32.
// E <= REFLEX_MOE_MAX_E, k <= REFLEX_MOE_MAX_K; the launcher validates the groups.

#define REFLEX_MOE_MAX_E 1024  // experts (the backend reads both limits from the manifest)
#define REFLEX_MOE_MAX_K 64  // experts per token

extern "C" __global__ void reflex_moe_route(const float* __restrict__ logits,
                                            const float* __restrict__ bias, int* __restrict__ ids,
                                            float* __restrict__ wout, int E, int k, int gating,
                                            int norm, float scale, int n_group, int n_group_used) {
    RX_PDL_ENTRY();
    __shared__ float sp[REFLEX_MOE_MAX_E];  // probs: the weights
    __shared__ __align__(16) float ss[REFLEX_MOE_MAX_E];  // selection scores (read 4 at a time)
    __shared__ float gscore[REFLEX_MOE_MAX_E / 2];  // groups hold >= 2 experts
    __shared__ unsigned char gkept[REFLEX_MOE_MAX_E / 2];
    __shared__ unsigned char taken[REFLEX_MOE_MAX_E];
    __shared__ float red[32];
    __shared__ float selp[REFLEX_MOE_MAX_K];
    __shared__ int seli[REFLEX_MOE_MAX_K];
    const float* lr = logits + (size_t)blockIdx.x * E;
    if (gating == 1) {
        float mx = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float z = lr[e];
            sp[e] = z;  // read back below by the same thread
            mx = fmaxf(mx, z);
        }
        mx = block_max_f(mx, red);
        float s = 0.f;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float v = expf(sp[e] - mx);
            sp[e] = v;
            s += v;
        }
        s = block_sum_f(s, red);  // its __syncthreads also orders the sp writes
        const float inv = 1.0f / s;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            sp[e] = sp[e] * inv;
            ss[e] = bias ? sp[e] + bias[e] : sp[e];
        }
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float z = lr[e];
            float v;
            if (gating == 2) v = 1.0f / (1.0f + expf(-z));
            else if (gating == 4) v = sqrtf(z > 20.0f ? z : log1pf(expf(fminf(z, 20.0f))));
            else v = z;
            sp[e] = v;
            ss[e] = bias ? v + bias[e] : v;
        }
    }
    __syncthreads();
    if (n_group > 1) {
        const int per = E / n_group;
        for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
            float a = -INFINITY, b = -INFINITY;  // the two largest sel of the group
            for (int i = g * per; i < (g + 1) * per; i++) {
                const float v = ss[i];
                if (v > a) { b = a; a = v; }
                else if (v > b) b = v;
            }
            gscore[g] = a + b;
        }
        __syncthreads();
        for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
            const float s = gscore[g];
            int better = 0;
            for (int h = 0; h < n_group; h++) better += gscore[h] > s || (gscore[h] == s && h < g);
            gkept[g] = better < n_group_used;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (!gkept[e / per]) ss[e] = -INFINITY;
        __syncthreads();
    }
    if (E <= (int)blockDim.x) {
        // rank of expert e: the experts before it in (sel desc, index asc) order, NaN last
        const int e = threadIdx.x;
        if (e < E) {
            const float v = ss[e];
            const bool num = v == v;
            // ahead of e: a larger sel, an equal one at a lower index; for a NaN e every number
            // and the NaNs at a lower index
            auto ahead = [&](float u, int h) -> int {
                return num ? (h < e ? u >= v : u > v) : (u == u || h < e);
            };
            int r = 0;
            const int E4 = E & ~3;
            // four sel a shared load, unrolled so that the loads run ahead of the compares
#pragma unroll 8
            for (int h = 0; h < E4; h += 4) {
                const float4 u = *reinterpret_cast<const float4*>(ss + h);
                r += ahead(u.x, h) + ahead(u.y, h + 1) + ahead(u.z, h + 2) + ahead(u.w, h + 3);
            }
            for (int h = E4; h < E; h++) r += ahead(ss[h], h);
            if (r < k) {
                seli[r] = e;
                selp[r] = sp[e];
            }
        }
    } else if (threadIdx.x < 32) {
        // k rounds in the first warp alone (shuffles, no block barriers): lane l scans experts
        // l, l + 32, ... in order, then the warp's (value desc, index asc) merge -- the same
        // pick as a block argmax over the untaken experts.
        for (int e = threadIdx.x; e < E; e += 32) taken[e] = 0;
        __syncwarp();
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int bi = -1;
            for (int e = threadIdx.x; e < E; e += 32) {
                const float v = ss[e];
                if (!taken[e] && (bi < 0 || v > bv)) { bv = v; bi = e; }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
                const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
                argmax_merge(bv, bi, ov, oi);
            }
            if (threadIdx.x == 0) {
                seli[j] = bi;
                selp[j] = bi < 0 ? 0.f : sp[bi];
                if (bi >= 0) taken[bi] = 1;
            }
            __syncwarp();
        }
    }
    __syncthreads();
    // lane j of the first warp: pick j (and j + 32), its sums in pick order like the others'
    if (threadIdx.x < 32) {
        if (gating == 3) {
            float m = -INFINITY;
            for (int j = 0; j < k; j++) m = fmaxf(m, selp[j]);
            float s = 0.f;
            for (int j = 0; j < k; j++) s += expf(selp[j] - m);
            __syncwarp();
            for (int j = threadIdx.x; j < k; j += 32) selp[j] = expf(selp[j] - m) / s;
            __syncwarp();
        }
        float sum = 0.f;
#pragma unroll 8
        for (int j = 0; j < k; j++) sum += selp[j];
        const float div = fmaxf(sum, 6.103515625e-5f);
        const bool sc = scale != 0.0f && scale != 1.0f;
        for (int j = threadIdx.x; j < k; j += 32) {
            float wv = selp[j];
            if (norm) wv = wv / div;
            if (sc) wv = wv * scale;
            ids[(size_t)blockIdx.x * k + j] = seli[j] < 0 ? 0 : seli[j];
            wout[(size_t)blockIdx.x * k + j] = wv;
        }
    }
}

// ------------------------------------------------------------------------------------------
// moe_combine: out[t, c] = sum_{j<k} w[t, j] * y[t, j, c] (j ascending); grid (ceil(n/256), T).

extern "C" __global__ void reflex_moe_combine(const float* __restrict__ y, const float* __restrict__ w,
                                              float* __restrict__ out, int k, int n) {
    RX_PDL_ENTRY();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const float* yt = y + (size_t)t * k * n + c;
    const float* wt = w + (size_t)t * k;
    float s = 0.f;
    for (int j = 0; j < k; j++) s += wt[j] * yt[(size_t)j * n];
    out[(size_t)t * n + c] = s;
}

// moe_combine_resnorm: a decode step's MoE output taken by the next add_rmsnorm (one token), in
// the residual-step form of the GEMV_RESNORM GEMVs (reflex/quant_kernels.cuh), so that the next
// RMSNorm needs no launch of its own and no one-block pass over the row: h[c] = a[c] + sum_{j<k}
// w[j] * y[j, c] (the sum as reflex_moe_combine, then the add as reflex_add_rmsnorm), stored at
// s; out[c] = h[c] * nw[c] (nw null: h[c]); part[block] = the block's sum of h^2 (its warps'
// sums in order). The readers scale out by rx_norm_scale of part, as after those GEMVs.

extern "C" __global__ void reflex_moe_combine_resnorm(const float* __restrict__ y,
                                                      const float* __restrict__ w,
                                                      const float* __restrict__ a,
                                                      const float* __restrict__ nw,
                                                      float* __restrict__ s, float* __restrict__ out,
                                                      float* __restrict__ part, int k, int n) {
    __shared__ float red[32];
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const float wv = (nw != nullptr && c < n) ? __ldg(nw + c) : 1.0f;  // no kernel writes it
    RX_PDL_ENTRY();
    float h = 0.f;
    if (c < n) {
        float m = 0.f;
        for (int j = 0; j < k; j++) m += w[j] * y[(size_t)j * n + c];
        h = a[c] + m;
        s[c] = h;
        out[c] = nw != nullptr ? h * wv : h;
    }
    const float ss = block_sum_f(h * h, red);
    if (threadIdx.x == 0) part[blockIdx.x] = ss;
}

// ------------------------------------------------------------------------------------------
// moe_schedule: the slots of a MoE matmul (ids [n_slots] int32, n_slots = T * k) grouped by
// expert for the grouped tiled kernels (reflex_moe_tiled_<t>, reflex/quant_kernels.cuh), in one
// block of 1024 threads: order = the slots whose id is in [0, n_expert), expert by expert (in
// no fixed order within an expert: each slot's outputs depend on its own x row only, not on the
// slots that share its tile); tiles[3 i .. 3 i + 2] = expert, first position in order, slot
// count (<= tile) of tile i, experts ascending; *n_tiles = the tile count, at most
// ceil(n_slots / tile) + min(n_expert, n_slots). A slot with an id outside [0, n_expert) gets
// NaN outputs y[s, 0 .. n_out) here (as the GEMV's MoE kernel gives). n_expert <=
// REFLEX_MOE_MAX_E.

extern "C" __global__ void __launch_bounds__(1024)
    reflex_moe_schedule(const int* __restrict__ ids, int n_slots, int n_expert, int tile,
                        int* __restrict__ order, int* __restrict__ tiles, int* __restrict__ n_tiles,
                        float* __restrict__ y, int n_out) {
    RX_PDL_ENTRY();
    __shared__ int count[REFLEX_MOE_MAX_E];  // slots per expert, then the scatter cursors
    __shared__ int start[REFLEX_MOE_MAX_E];  // first position in order
    __shared__ int tile0[REFLEX_MOE_MAX_E];  // first tile
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < n_expert) {
            atomicAdd(&count[e], 1);
        } else {
            for (int o = 0; o < n_out; ++o) y[(size_t)s * n_out + o] = rx_nan();
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int pos = 0, t = 0;
        for (int e = 0; e < n_expert; ++e) {
            start[e] = pos;
            tile0[e] = t;
            pos += count[e];
            t += (count[e] + tile - 1) / tile;
        }
        *n_tiles = t;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {  // one thread per expert
        const int c = count[e];
        for (int i = 0; i * tile < c; ++i) {
            int* tt = tiles + 3 * (tile0[e] + i);
            tt[0] = e;
            tt[1] = start[e] + i * tile;
            tt[2] = min(tile, c - i * tile);
        }
        count[e] = 0;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < n_expert) order[start[e] + atomicAdd(&count[e], 1)] = s;
    }
}

// ------------------------------------------------------------------------------------------
// lora_add: the load-time LoRA merge (reflex_core/lora.py), in place on a float32 weight:
//   w[e, o, i] += scale * sum_{j < rank} l[e, o, j] * R[e](j, i)     (j ascending, fmaf)
// with l [E, n_out, rank] row-major and R[e](j, i) = r[e*rank*n_in + j*rs_j + i*rs_i] (rs_j =
// n_in, rs_i = 1 for B @ A; rs_j = 1, rs_i = rank for the embedding's A @ B^T). Tiles of
// LORA_TILE x LORA_TILE outputs; rank goes through shared memory LORA_TILE at a time.
// Grid (ceil(n_in/LORA_TILE), ceil(n_out/LORA_TILE), E), block (LORA_TILE, LORA_BLOCK_Y). Its
// twin is NumpyOps.merge_lora (tests/gpu/test_lora_gpu.py).

#define LORA_TILE 32
#define LORA_BLOCK_Y 8

extern "C" __global__ void __launch_bounds__(LORA_TILE * LORA_BLOCK_Y)
reflex_lora_add(float* __restrict__ w, const float* __restrict__ l, const float* __restrict__ r,
                int n_out, int n_in, int rank, int rs_j, int rs_i, float scale) {
    RX_PDL_ENTRY();
    __shared__ float ls[LORA_TILE][LORA_TILE + 1];  // [output row][j]
    __shared__ float rs[LORA_TILE][LORA_TILE + 1];  // [j][column]
    constexpr int ROWS = LORA_TILE / LORA_BLOCK_Y;
    const size_t e = blockIdx.z;
    w += e * n_out * (size_t)n_in;
    l += e * n_out * (size_t)rank;
    r += e * rank * (size_t)n_in;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int i = blockIdx.x * LORA_TILE + tx;
    const int o0 = blockIdx.y * LORA_TILE;
    float acc[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; k++) acc[k] = 0.f;
    for (int j0 = 0; j0 < rank; j0 += LORA_TILE) {
        for (int rr = ty; rr < LORA_TILE; rr += LORA_BLOCK_Y) {
            const int o = o0 + rr, j = j0 + tx, jr = j0 + rr;
            ls[rr][tx] = (o < n_out && j < rank) ? l[(size_t)o * rank + j] : 0.f;
            rs[rr][tx] = (jr < rank && i < n_in) ? r[(size_t)jr * rs_j + (size_t)i * rs_i] : 0.f;
        }
        __syncthreads();
        const int jn = min(LORA_TILE, rank - j0);
#pragma unroll
        for (int k = 0; k < ROWS; k++)
            for (int j = 0; j < jn; j++) acc[k] = fmaf(ls[ty + k * LORA_BLOCK_Y][j], rs[j][tx], acc[k]);
        __syncthreads();
    }
    if (i >= n_in) return;
#pragma unroll
    for (int k = 0; k < ROWS; k++) {
        const int o = o0 + ty + k * LORA_BLOCK_Y;
        if (o < n_out) w[(size_t)o * n_in + i] += scale * acc[k];
    }
}
