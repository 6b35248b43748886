/* qwen35.cu -- the Qwen3.5 hybrid family's own kernels (module "qwen35"), float32 throughout.
Each has a NumPy twin in reflex_qwen35_hybrid/ops.py, which documents the exact semantics; the
launchers there check every shape before launching.

  reflex_qwen35_conv            causal depthwise conv + SiLU per run, conv state updated
                                grid (ceil(C/128), ceil(longest run/CHUNK), runs), block 128
  reflex_qwen35_delta_rule      L2 norms, gates, gated delta rule per run, SSM state updated
                                grid (ceil(d/4), H_v, runs), block 128 (a warp per column)
  reflex_qwen35_gated_norm      per-head RMSNorm(o) * w * silu(z)   grid ceil(T*H/4), block 128
  reflex_qwen35_take_q          query halves of [q_h, gate_h] rows  grid ceil(n/256), block 256
  reflex_qwen35_gate_output     o * sigmoid(gate halves)            grid ceil(n/256), block 256
  reflex_qwen35_shexp_combine   moe + sigmoid(w . b) * sh per row   grid T, block 256

Sequence runs are int32 triples (seq, t0, t1) (ops.prepare); the launcher has checked on the host
that no sequence appears in two runs, so only the threads of one run touch its state slot.
Reductions use a fixed order (no atomics): every kernel is deterministic run to run.
*/
#include <reflex/common.cuh>

#define REFLEX_QWEN35_CONV_MAX_K 8     // conv width K (taps kept in registers)
#define REFLEX_QWEN35_CONV_CHUNK 64    // tokens per conv thread; >= CONV_MAX_K - 1 (see below)
#define REFLEX_QWEN35_DELTA_MAX_D 256  // d_k = d_v of the delta rule (8 state values per lane)

__device__ __forceinline__ float q35_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float q35_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// ggml's CPU softplus (the threshold keeps expf from overflowing)
__device__ __forceinline__ float q35_softplus(float x) {
    return x > 20.0f ? x : logf(1.0f + expf(x));
}

// ------------------------------------------------------------------------------------------
// conv: thread = (channel c, run, chunk of CHUNK tokens). The window of the K-1 rows before the
// chunk and the K taps live in registers; each token loads one x value (coalesced over c) and
// slides the window. Only a run's first chunk touches its state slot: it reads the old taps,
// then writes the new ones. Later chunks start at least CHUNK >= K-1 tokens into the run, so
// their windows come from x alone and no thread reads a slot another thread writes.

template <int K>
__device__ __forceinline__ void q35_conv_chunk(const float* __restrict__ x,
                                               float* __restrict__ state,
                                               const float* __restrict__ w, float* __restrict__ y,
                                               int C, int c, int s, int t0, int t1, int a, int b) {
    float wk[K], win[K];
#pragma unroll
    for (int tau = 0; tau < K; ++tau) wk[tau] = __ldg(w + (size_t)c * K + tau);
    float* st = state + ((size_t)s * C + c) * (K - 1);
    // row p of the sequence (p < t0: a state tap, p - t0 + K - 1 of them)
#pragma unroll
    for (int tau = 0; tau < K - 1; ++tau) {
        const int p = a - (K - 1) + tau;
        win[tau] = p >= t0 ? __ldg(x + (size_t)p * C + c) : st[p - t0 + K - 1];
    }
    float old[K - 1];  // the slot's taps, for the new state of a run shorter than K-1
#pragma unroll
    for (int tau = 0; tau < K - 1; ++tau) old[tau] = win[tau];

    for (int t = a; t < b; ++t) {
        win[K - 1] = __ldg(x + (size_t)t * C + c);
        float acc = 0.0f;
#pragma unroll
        for (int tau = 0; tau < K; ++tau) acc += wk[tau] * win[tau];
        y[(size_t)t * C + c] = q35_silu(acc);
#pragma unroll
        for (int tau = 0; tau < K - 1; ++tau) win[tau] = win[tau + 1];
    }

    if (a != t0) return;
    // new tap i = sequence row t1 - (K-1) + i: from x, or old tap n + i when the run is short
    const int n = t1 - t0;
#pragma unroll
    for (int i = 0; i < K - 1; ++i) {
        const int src = n + i;
        float v = 0.0f;
        if (src < K - 1) {
#pragma unroll
            for (int m = 0; m < K - 1; ++m)
                if (m == src) v = old[m];
        } else {
            v = __ldg(x + (size_t)(t1 - (K - 1) + i) * C + c);
        }
        st[i] = v;
    }
}

extern "C" __global__ void __launch_bounds__(128)
reflex_qwen35_conv(const float* __restrict__ x, float* __restrict__ state,
                   const float* __restrict__ w, float* __restrict__ y,
                   const int* __restrict__ runs, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int* run = runs + 3 * blockIdx.z;
    const int s = run[0], t0 = run[1], t1 = run[2];
    const int a = t0 + (int)blockIdx.y * REFLEX_QWEN35_CONV_CHUNK;
    if (a >= t1) return;
    const int b = min(a + REFLEX_QWEN35_CONV_CHUNK, t1);
    switch (K) {  // the launcher admits 2 <= K <= REFLEX_QWEN35_CONV_MAX_K
        case 2: q35_conv_chunk<2>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 3: q35_conv_chunk<3>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 4: q35_conv_chunk<4>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 5: q35_conv_chunk<5>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 6: q35_conv_chunk<6>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 7: q35_conv_chunk<7>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        case 8: q35_conv_chunk<8>(x, state, w, y, C, c, s, t0, t1, a, b); break;
        default: break;
    }
}

// ------------------------------------------------------------------------------------------
// delta rule, sequential over the tokens of a run: warp = (value column col, value head j, run).
// Lane l holds S_j[i, col] for keys i = l + 32 m (m < NPL = ceil(d/32)) in registers, read once
// from the slot and written once at the end. Per token everything the update needs is a dot
// product with the state BEFORE the token, so one 5-way butterfly serves them all:
//   kk = |k|^2, qq = |q|^2, kq = k.q (raw conv outputs), sk = S.k, sq = S.q
// with rk = 1/sqrt(kk + eps), rq = 1/sqrt(qq + eps) / sqrt(d) (the L2 norms and the q scale),
//   u = e^g rk sk,  delta = beta (v - u),  S' = e^g S + (rk delta) k,
//   o = S'.q_n = rq (e^g sq + rk delta kq).
// The next token's q, k, v and gates are loaded before this token's reduction.

template <int NPL>
__device__ __forceinline__ void q35_delta_load(const float* __restrict__ qrow,
                                               const float* __restrict__ krow, int d, int lane,
                                               float (&q)[NPL], float (&k)[NPL]) {
#pragma unroll
    for (int m = 0; m < NPL; ++m) {
        const int i = lane + 32 * m;
        q[m] = i < d ? __ldg(qrow + i) : 0.0f;
        k[m] = i < d ? __ldg(krow + i) : 0.0f;
    }
}

// yq: the q of this warp's key head in token 0's row (k follows at +kofs, v at +vofs);
// st: the slot's column col of S_j; o: (token 0, head j, column col) of the output.
template <int NPL>
__device__ __forceinline__ void q35_delta_column(
        const float* __restrict__ yq, int row_len, int kofs, int vofs,
        const float* __restrict__ braw, const float* __restrict__ araw, int H_v,
        float A, float dt, float* __restrict__ st, float* __restrict__ o, int o_row,
        int n, int d, float eps, int lane) {
    float S[NPL], q[NPL], k[NPL], qn[NPL], kn[NPL];
#pragma unroll
    for (int m = 0; m < NPL; ++m) {
        const int i = lane + 32 * m;
        S[m] = i < d ? st[i] : 0.0f;
    }
    const float scale = 1.0f / sqrtf((float)d);
    q35_delta_load<NPL>(yq, yq + kofs, d, lane, qn, kn);
    float vn = __ldg(yq + vofs), bn = __ldg(braw), an = __ldg(araw);

    for (int t = 0; t < n; ++t) {
#pragma unroll
        for (int m = 0; m < NPL; ++m) {
            q[m] = qn[m];
            k[m] = kn[m];
        }
        const float v = vn, bt = bn, at = an;
        if (t + 1 < n) {  // prefetch the next token while this one reduces
            const float* nq = yq + (size_t)(t + 1) * row_len;
            q35_delta_load<NPL>(nq, nq + kofs, d, lane, qn, kn);
            vn = __ldg(nq + vofs);
            bn = __ldg(braw + (size_t)(t + 1) * H_v);
            an = __ldg(araw + (size_t)(t + 1) * H_v);
        }
        float kk = 0.0f, qq = 0.0f, kq = 0.0f, sk = 0.0f, sq = 0.0f;
#pragma unroll
        for (int m = 0; m < NPL; ++m) {
            kk += k[m] * k[m];
            qq += q[m] * q[m];
            kq += k[m] * q[m];
            sk += S[m] * k[m];
            sq += S[m] * q[m];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            kk += __shfl_xor_sync(0xffffffffu, kk, off);
            qq += __shfl_xor_sync(0xffffffffu, qq, off);
            kq += __shfl_xor_sync(0xffffffffu, kq, off);
            sk += __shfl_xor_sync(0xffffffffu, sk, off);
            sq += __shfl_xor_sync(0xffffffffu, sq, off);
        }
        const float rk = 1.0f / sqrtf(kk + eps);
        const float rq = scale / sqrtf(qq + eps);
        const float beta = q35_sigmoid(bt);
        const float eg = expf(A * q35_softplus(at + dt));
        const float delta = beta * (v - eg * rk * sk);
        const float c = rk * delta;
#pragma unroll
        for (int m = 0; m < NPL; ++m) S[m] = eg * S[m] + c * k[m];
        if (lane == 0) o[(size_t)t * o_row] = rq * (eg * sq + c * kq);
    }
#pragma unroll
    for (int m = 0; m < NPL; ++m) {
        const int i = lane + 32 * m;
        if (i < d) st[i] = S[m];
    }
}

// y [T, 2 H_k d + H_v d] (q | k | v), b and a [T, H_v], ssm_a and dt_bias [H_v],
// state [n_seqs, H_v, d (value column), d (key)], o [T, H_v d]. Value head j pairs with key
// head j % H_k (the GGUF's tiled order).
extern "C" __global__ void __launch_bounds__(128)
reflex_qwen35_delta_rule(const float* __restrict__ y, const float* __restrict__ b,
                         const float* __restrict__ a, const float* __restrict__ ssm_a,
                         const float* __restrict__ dt_bias, float* __restrict__ state,
                         float* __restrict__ o, const int* __restrict__ runs, int H_k, int H_v,
                         int d, float eps) {
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (col >= d) return;  // whole warps: nothing below synchronises across warps
    const int j = blockIdx.y;
    const int* run = runs + 3 * blockIdx.z;
    const int s = run[0], t0 = run[1], n = run[2] - run[1];
    const int key_dim = H_k * d;
    const int row_len = 2 * key_dim + H_v * d;
    const float* yq = y + (size_t)t0 * row_len + (j % H_k) * d;
    const int vofs = 2 * key_dim + j * d + col - (j % H_k) * d;
    const float* braw = b + (size_t)t0 * H_v + j;
    const float* araw = a + (size_t)t0 * H_v + j;
    const float A = __ldg(ssm_a + j), dt = __ldg(dt_bias + j);
    float* st = state + (((size_t)s * H_v + j) * d + col) * d;
    float* out = o + (size_t)t0 * H_v * d + (size_t)j * d + col;
    switch ((d + 31) >> 5) {  // the launcher admits d <= REFLEX_QWEN35_DELTA_MAX_D
#define Q35_DELTA(NPL)                                                                          \
        case NPL: q35_delta_column<NPL>(yq, row_len, key_dim, vofs, braw, araw, H_v, A, dt, st, \
                                        out, H_v * d, n, d, eps, lane); break;
        Q35_DELTA(1) Q35_DELTA(2) Q35_DELTA(3) Q35_DELTA(4)
        Q35_DELTA(5) Q35_DELTA(6) Q35_DELTA(7) Q35_DELTA(8)
#undef Q35_DELTA
        default: break;
    }
}

// ------------------------------------------------------------------------------------------
// gated norm: warp = one (token, head) row of d values; four rows per block.
extern "C" __global__ void __launch_bounds__(128)
reflex_qwen35_gated_norm(const float* __restrict__ o, const float* __restrict__ z,
                         const float* __restrict__ w, float* __restrict__ out, int rows, int d,
                         float eps) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* orow = o + (size_t)r * d;
    const float* zrow = z + (size_t)r * d;
    float* yrow = out + (size_t)r * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) {
        const float v = __ldg(orow + i);
        ss += v * v;
    }
    ss = rx_warp_sum(ss);
    const float rn = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32)
        yrow[i] = __ldg(orow + i) * rn * __ldg(w + i) * q35_silu(__ldg(zrow + i));
}

// ------------------------------------------------------------------------------------------
// take_q / gate_output: element e of [T, H, d_h]; its row in qg holds [q_h, gate_h] per head.
extern "C" __global__ void __launch_bounds__(256)
reflex_qwen35_take_q(const float* __restrict__ qg, float* __restrict__ q, int n, int H, int d_h) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int hd = H * d_h;
    const int t = e / hd, r = e - t * hd;
    const int h = r / d_h, i = r - h * d_h;
    q[e] = __ldg(qg + (size_t)t * 2 * hd + (size_t)h * 2 * d_h + i);
}

extern "C" __global__ void __launch_bounds__(256)
reflex_qwen35_gate_output(const float* __restrict__ o, const float* __restrict__ qg,
                          float* __restrict__ out, int n, int H, int d_h) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int hd = H * d_h;
    const int t = e / hd, r = e - t * hd;
    const int h = r / d_h, i = r - h * d_h;
    const float g = __ldg(qg + (size_t)t * 2 * hd + (size_t)h * 2 * d_h + d_h + i);
    out[e] = __ldg(o + e) * q35_sigmoid(g);
}

// ------------------------------------------------------------------------------------------
// shexp_combine: block = one token row of D; the dot product w . b reduced over the block,
// then out = moe + sigmoid(dot) * sh.
extern "C" __global__ void __launch_bounds__(256)
reflex_qwen35_shexp_combine(const float* __restrict__ moe, const float* __restrict__ sh,
                            const float* __restrict__ b, const float* __restrict__ w,
                            float* __restrict__ out, int D) {
    __shared__ float part[8];
    __shared__ float gamma;
    const size_t row = (size_t)blockIdx.x * D;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) acc += __ldg(b + row + i) * __ldg(w + i);
    acc = rx_warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float dot = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); ++i) dot += part[i];
        gamma = q35_sigmoid(dot);
    }
    __syncthreads();
    const float g = gamma;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        out[row + i] = __ldg(moe + row + i) + g * __ldg(sh + row + i);
}
