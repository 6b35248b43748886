/* qwen35.cu -- the Qwen3.5 hybrid family's own kernels (module "qwen35"), float32 throughout.
Each has a NumPy twin in reflex_qwen35_hybrid/ops.py, which documents the exact semantics; the
launchers there check every shape before launching.

  reflex_qwen35_conv            causal depthwise conv + SiLU per run, conv state updated
                                grid (ceil(C/128), ceil(longest run/CHUNK), runs), block 128
  reflex_qwen35_delta_rule      L2 norms, gates, gated delta rule per run, SSM state updated
                                grid (ceil(d/4), H_v, runs), block 128 (a warp per column)
  reflex_qwen35_delta_prep      the chunked form's state-free part, per (chunk, value head)
                                grid (ceil(longest run/CHUNK), H_v, runs), block 256
  reflex_qwen35_delta_chunked   the chunked form's walk over each run's chunks, state updated
                                grid (ceil(d/COLS), H_v, runs), block 256
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
#define REFLEX_QWEN35_DELTA_CHUNK 64   // tokens per chunk of the chunked delta rule
#define REFLEX_QWEN35_DELTA_COLS 16    // value columns of the state per chunked-walk block

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
// delta rule, chunked (spec §7.6 "Chunked form"), for long runs. Chunks of C tokens within each
// run; the last chunk of a run has m < C tokens and its rows m..C-1 are zeros (beta = 0, g = 0,
// q = k = v = 0: they leave S unchanged). Per chunk and value head, with G_t = sum_{u<=t} g_u,
// kn/qn the normalised k/q and k, q the raw conv outputs:
//   A[t,s] = beta_t (kn_t . kn_s) e^{G_t-G_s} (s < t),  X = (I + A)^-1 B by forward substitution
//   U = X for B = diag(beta) V,  W = X for B = diag(beta e^G) Kn
//   QK[t,s] = (qn_t . kn_s) e^{G_t-G_s} (s <= t), qs_t = rq_t e^{G_t}, ks_s = rk_s e^{G_m-1 - G_s}
// depend on the inputs alone: reflex_qwen35_delta_prep computes them for every chunk at once into
// one scratch record per (chunk, value head). reflex_qwen35_delta_chunked then walks each run's
// chunks in order, value columns independent of each other:
//   V' = U - W S,  o_t = qs_t (q_t . S) + sum_s QK[t,s] V'_s,  S <- e^{G_m-1} S + sum_s ks_s k_s V'_s^T
// G is summed in double: the decays are exponentials of differences of G that can reach
// hundreds over a chunk, where float32 sums would lose the differences' low bits.

#define Q35_C REFLEX_QWEN35_DELTA_CHUNK
#define Q35_COLS REFLEX_QWEN35_DELTA_COLS

// floats of one (chunk, value head) record: U [C][d], W [C][d], QK [C][C], qs [C], ks [C],
// e^{G_m-1} (ops.py sizes the scratch by the same count)
__device__ __forceinline__ size_t q35_chunk_record(int d) {
    return (size_t)2 * Q35_C * d + Q35_C * Q35_C + 2 * Q35_C + 1;
}

// the first chunk record of run r: the chunks of the runs before it, in batch order
__device__ __forceinline__ int q35_chunk_base(const int* __restrict__ runs, int r) {
    int base = 0;
    for (int i = 0; i < r; ++i) base += (runs[3 * i + 2] - runs[3 * i + 1] + Q35_C - 1) / Q35_C;
    return base;
}

// block = (chunk, value head j, run), 256 threads. One block per SM: the forward substitution
// keeps a column's 64 values in registers (ptxas spills at the two-block limit of 128).
extern "C" __global__ void __launch_bounds__(256, 1)
reflex_qwen35_delta_prep(const float* __restrict__ y, const float* __restrict__ b,
                         const float* __restrict__ a, const float* __restrict__ ssm_a,
                         const float* __restrict__ dt_bias, const int* __restrict__ runs,
                         float* __restrict__ scratch, int H_k, int H_v, int d, float eps) {
    __shared__ float ksl[Q35_C][33], qsl[Q35_C][33];  // a 32-key slice of the chunk's raw k, q
    __shared__ float amat[Q35_C][Q35_C + 1];
    __shared__ double G[Q35_C];
    __shared__ float beta[Q35_C], rk[Q35_C], rq[Q35_C], wsc[Q35_C];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.y, r = blockIdx.z;
    const int t0 = runs[3 * r + 1], n = runs[3 * r + 2] - t0;
    const int c0 = blockIdx.x * Q35_C;
    if (c0 >= n) return;  // the whole block: this run has fewer chunks
    const int m = min(Q35_C, n - c0);
    const int key_dim = H_k * d, row_len = 2 * key_dim + H_v * d;
    const float* yq = y + (size_t)(t0 + c0) * row_len + (j % H_k) * d;
    const float* yk = yq + key_dim;
    const float* yv = y + (size_t)(t0 + c0) * row_len + 2 * key_dim + j * d;
    float* U = scratch + ((size_t)(q35_chunk_base(runs, r) + blockIdx.x) * H_v + j) *
                             q35_chunk_record(d);
    float* W = U + Q35_C * d;
    float* QK = W + Q35_C * d;
    float* qs = QK + Q35_C * Q35_C;
    float* ks = qs + Q35_C;

    if (tid < Q35_C) {
        float bt = 0.0f, g = 0.0f;
        if (tid < m) {
            const size_t e = (size_t)(t0 + c0 + tid) * H_v + j;
            bt = q35_sigmoid(__ldg(b + e));
            g = __ldg(ssm_a + j) * q35_softplus(__ldg(a + e) + __ldg(dt_bias + j));
        }
        beta[tid] = bt;
        G[tid] = g;
    }
    // the L2 norms' reciprocals (0 on padding rows), summed as the sequential kernel sums them
    const float scale = 1.0f / sqrtf((float)d);
    for (int t = warp; t < Q35_C; t += 8) {
        float kk = 0.0f, qq = 0.0f;
        if (t < m) {
            for (int i = lane; i < d; i += 32) {
                const float kv = __ldg(yk + (size_t)t * row_len + i);
                const float qv = __ldg(yq + (size_t)t * row_len + i);
                kk += kv * kv;
                qq += qv * qv;
            }
        }
        kk = rx_warp_sum(kk);
        qq = rx_warp_sum(qq);
        if (lane == 0) {
            rk[t] = t < m ? 1.0f / sqrtf(kk + eps) : 0.0f;
            rq[t] = t < m ? scale / sqrtf(qq + eps) : 0.0f;
        }
    }
    __syncthreads();
    if (tid == 0) {
        double acc = 0.0;
        for (int t = 0; t < Q35_C; ++t) {
            acc += G[t];
            G[t] = acc;
        }
    }
    __syncthreads();
    if (tid < Q35_C) {
        const double Gl = G[m - 1];
        wsc[tid] = beta[tid] * expf((float)G[tid]);
        qs[tid] = rq[tid] * expf((float)G[tid]);
        ks[tid] = rk[tid] * expf((float)(Gl - G[tid]));
        if (tid == 0) ks[Q35_C] = expf((float)Gl);
    }

    // raw Gram matrices k_t . k_s and q_t . k_s: thread = rows ty + 16u, columns tx + 16w
    const int ty = tid >> 4, tx = tid & 15;
    float kk4[4][4], qk4[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) kk4[u][w] = qk4[u][w] = 0.0f;
    for (int i0 = 0; i0 < d; i0 += 32) {
        for (int e = tid; e < Q35_C * 32; e += 256) {
            const int t = e >> 5, i = i0 + (e & 31);
            const bool in = t < m && i < d;
            ksl[t][e & 31] = in ? __ldg(yk + (size_t)t * row_len + i) : 0.0f;
            qsl[t][e & 31] = in ? __ldg(yq + (size_t)t * row_len + i) : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int i = 0; i < 32; ++i) {
            float kt[4], qt[4], kc[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                kt[u] = ksl[ty + 16 * u][i];
                qt[u] = qsl[ty + 16 * u][i];
                kc[u] = ksl[tx + 16 * u][i];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    kk4[u][w] += kt[u] * kc[w];
                    qk4[u][w] += qt[u] * kc[w];
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int t = ty + 16 * u, s = tx + 16 * w;
            const float decay = s <= t ? expf((float)(G[t] - G[s])) : 0.0f;
            amat[t][s] = s < t ? beta[t] * rk[t] * rk[s] * kk4[u][w] * decay : 0.0f;
            QK[t * Q35_C + s] = rq[t] * rk[s] * qk4[u][w] * decay;
        }
    __syncthreads();

    // X = (I + A)^-1 B, one column of B per thread: U's d columns, then W's
    for (int c = tid; c < 2 * d; c += 256) {
        const bool is_w = c >= d;
        const int i = is_w ? c - d : c;
        float x[Q35_C];
#pragma unroll
        for (int t = 0; t < Q35_C; ++t) {
            float v = 0.0f;
            if (t < m)
                v = is_w ? __ldg(yk + (size_t)t * row_len + i) * rk[t] * wsc[t]
                         : __ldg(yv + (size_t)t * row_len + i) * beta[t];
            x[t] = v;
        }
#pragma unroll
        for (int t = 1; t < Q35_C; ++t) {
            float acc = x[t];
#pragma unroll
            for (int s = 0; s < t; ++s) acc -= amat[t][s] * x[s];
            x[t] = acc;
        }
        float* dst = (is_w ? W : U) + i;
#pragma unroll
        for (int t = 0; t < Q35_C; ++t) dst[(size_t)t * d] = x[t];
    }
}

// block = (COLS value columns, value head j, run), 256 threads. Thread (tt = tid/4, cg = tid%4)
// computes V' and o of chunk row tt, columns 4cg..4cg+3 of the block's, and owns the state rows
// i = tt + 64 mm (mm < MR = ceil(d/64)) of those columns in registers; a copy of the block's
// state columns in shared memory feeds the products with W and q.
template <int MR>
__device__ __forceinline__ void q35_delta_walk(
        const float* __restrict__ y, float* __restrict__ state, float* __restrict__ o,
        const float* __restrict__ rec, int row_len, int key_dim, int qofs, int H_v, int j, int s,
        int t0, int n, int d, float4 (*__restrict__ ssh)[Q35_COLS / 4],
        float4 (*__restrict__ vsh)[Q35_COLS / 4], float* __restrict__ stg) {
    // chunk rows of k per staging round of the S update: a divisor of C, KROWS * 64 MR <= stg
    constexpr int KROWS = Q35_C / (MR == 3 ? 4 : MR);
    float* sa = stg;
    float* sb = stg + Q35_C * 33;
    const int tid = threadIdx.x, tt = tid >> 2, cg = tid & 3;
    const int col0 = blockIdx.x * Q35_COLS + 4 * cg;
    const size_t rec_len = q35_chunk_record(d);
    float* st = state + ((size_t)s * H_v + j) * d * d;

    float S[MR][4];
#pragma unroll
    for (int mm = 0; mm < MR; ++mm) {
        const int i = tt + 64 * mm;
#pragma unroll
        for (int u = 0; u < 4; ++u)
            S[mm][u] = i < d && col0 + u < d ? st[(size_t)(col0 + u) * d + i] : 0.0f;
        ssh[i][cg] = make_float4(S[mm][0], S[mm][1], S[mm][2], S[mm][3]);
    }
    __syncthreads();

    for (int c0 = 0; c0 < n; c0 += Q35_C, rec += (size_t)H_v * rec_len) {
        const int m = min(Q35_C, n - c0);
        const float* U = rec;
        const float* W = U + Q35_C * d;
        const float* QK = W + Q35_C * d;
        const float* qs = QK + Q35_C * Q35_C;
        const float* ks = qs + Q35_C;
        const float* yq = y + (size_t)(t0 + c0) * row_len + qofs;
        const float* yk = yq + key_dim;

        // V' = U - W S and p = q . S (raw q), over 32-key slices
        float v[4], p[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            v[u] = col0 + u < d ? __ldg(U + (size_t)tt * d + col0 + u) : 0.0f;
            p[u] = 0.0f;
        }
        for (int i0 = 0; i0 < d; i0 += 32) {
            for (int e = tid; e < Q35_C * 32; e += 256) {
                const int t = e >> 5, i = i0 + (e & 31);
                sa[t * 33 + (e & 31)] = i < d ? __ldg(W + (size_t)t * d + i) : 0.0f;
                sb[t * 33 + (e & 31)] = i < d && t < m ? __ldg(yq + (size_t)t * row_len + i)
                                                       : 0.0f;
            }
            __syncthreads();
            const int nk = min(32, d - i0);
            for (int k = 0; k < nk; ++k) {
                const float w = sa[tt * 33 + k], q = sb[tt * 33 + k];
                const float4 s4 = ssh[i0 + k][cg];
                v[0] -= w * s4.x; v[1] -= w * s4.y; v[2] -= w * s4.z; v[3] -= w * s4.w;
                p[0] += q * s4.x; p[1] += q * s4.y; p[2] += q * s4.z; p[3] += q * s4.w;
            }
            __syncthreads();
        }
        vsh[tt][cg] = make_float4(v[0], v[1], v[2], v[3]);
        const float qsc = __ldg(qs + tt);
#pragma unroll
        for (int u = 0; u < 4; ++u) p[u] *= qsc;
        __syncthreads();

        // o = qs (q . S) + QK V' (QK is zero above the diagonal and on padding rows)
        for (int s0 = 0; s0 < Q35_C; s0 += 32) {
            for (int e = tid; e < Q35_C * 32; e += 256)
                sa[(e >> 5) * 33 + (e & 31)] = __ldg(QK + (size_t)(e >> 5) * Q35_C + s0 + (e & 31));
            __syncthreads();
#pragma unroll 8
            for (int k = 0; k < 32; ++k) {
                const float qk = sa[tt * 33 + k];
                const float4 v4 = vsh[s0 + k][cg];
                p[0] += qk * v4.x; p[1] += qk * v4.y; p[2] += qk * v4.z; p[3] += qk * v4.w;
            }
            __syncthreads();
        }
        if (tt < m) {
            float* orow = o + (size_t)(t0 + c0 + tt) * H_v * d + (size_t)j * d;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (col0 + u < d) orow[col0 + u] = p[u];
        }

        // S <- e^{G_m-1} S + sum_s (ks_s k_s) V'_s^T, KROWS chunk rows of k per round
        const float eg = __ldg(ks + Q35_C);
#pragma unroll
        for (int mm = 0; mm < MR; ++mm)
#pragma unroll
            for (int u = 0; u < 4; ++u) S[mm][u] *= eg;
        for (int s0 = 0; s0 < Q35_C; s0 += KROWS) {
            for (int e = tid; e < KROWS * 64 * MR; e += 256) {
                const int t = s0 + e / (64 * MR), i = e % (64 * MR);
                stg[e] = i < d && t < m ? __ldg(yk + (size_t)t * row_len + i) * __ldg(ks + t)
                                        : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int k = 0; k < KROWS; ++k) {
                const float4 v4 = vsh[s0 + k][cg];
#pragma unroll
                for (int mm = 0; mm < MR; ++mm) {
                    const float kv = stg[k * 64 * MR + tt + 64 * mm];
                    S[mm][0] += kv * v4.x; S[mm][1] += kv * v4.y;
                    S[mm][2] += kv * v4.z; S[mm][3] += kv * v4.w;
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int mm = 0; mm < MR; ++mm)
            ssh[tt + 64 * mm][cg] = make_float4(S[mm][0], S[mm][1], S[mm][2], S[mm][3]);
        __syncthreads();
    }

#pragma unroll
    for (int mm = 0; mm < MR; ++mm) {
        const int i = tt + 64 * mm;
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i < d && col0 + u < d) st[(size_t)(col0 + u) * d + i] = S[mm][u];
    }
}

// y, state, o as for reflex_qwen35_delta_rule; scratch: reflex_qwen35_delta_prep's records.
extern "C" __global__ void __launch_bounds__(256)
reflex_qwen35_delta_chunked(const float* __restrict__ y, float* __restrict__ state,
                            float* __restrict__ o, const int* __restrict__ runs,
                            const float* __restrict__ scratch, int H_k, int H_v, int d) {
    const int j = blockIdx.y, r = blockIdx.z;
    const int s = runs[3 * r], t0 = runs[3 * r + 1], n = runs[3 * r + 2] - t0;
    const int key_dim = H_k * d, row_len = 2 * key_dim + H_v * d;
    const float* rec = scratch + ((size_t)q35_chunk_base(runs, r) * H_v + j) * q35_chunk_record(d);
    // here, not in the walk: each instantiation would otherwise add its own arrays
    __shared__ float4 ssh[REFLEX_QWEN35_DELTA_MAX_D][Q35_COLS / 4];  // the block's columns of S
    __shared__ float4 vsh[Q35_C][Q35_COLS / 4];                      // V' of the chunk
    __shared__ float stg[2 * Q35_C * 33];  // two [C][33] slices, or KROWS rows of 64 MR keys
    switch ((d + 63) >> 6) {  // the launcher admits d <= REFLEX_QWEN35_DELTA_MAX_D = 256
#define Q35_WALK(MR)                                                                            \
        case MR: q35_delta_walk<MR>(y, state, o, rec, row_len, key_dim, (j % H_k) * d, H_v, j, \
                                    s, t0, n, d, ssh, vsh, stg); break;
        Q35_WALK(1) Q35_WALK(2) Q35_WALK(3) Q35_WALK(4)
#undef Q35_WALK
        default: break;
    }
}

#undef Q35_C
#undef Q35_COLS

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
