/* mla.cu -- the DeepSeek MLA family's own kernels (module "mla"), float32 throughout.
Each has a NumPy twin in reflex_deepseek_mla/ops.py, which documents the exact semantics; the
launchers there check every shape before launching.

  reflex_mla_split_heads    each head's row split at column d0 into a | b    grid T*H, block 128
  reflex_mla_concat_heads   [a_h ; b_h], a one-head side repeated            grid T*H, block 128
  reflex_mla_store_rows     T contiguous rows into the cache's cells         grid <= 4096, block 256
  reflex_mla_attention_<NPL>  MQA over the shared latent rows, V = first n_v  grid (H, T), 256
  reflex_mla_query_temperature  q[t] * tau(position of t)                   grid <= 4096, block 256
  reflex_mla_head_ids       ids[t, h] = h                                    grid ceil(n/256), 256

Reductions use a fixed order (no atomics): every kernel is deterministic run to run.
*/
#include <reflex/common.cuh>

#define REFLEX_MLA_MAX_ROW 1024  // attention row width n (32 floats per lane, the widest kernel)
#define MLA_WARPS 8

// ------------------------------------------------------------------------------------------
// split / concat: block = one (token, head) row, threads stride over its columns.

extern "C" __global__ void __launch_bounds__(128)
reflex_mla_split_heads(const float* __restrict__ x, float* __restrict__ a, float* __restrict__ b,
                       int d, int d0) {
    const size_t r = blockIdx.x;
    const int db = d - d0;
    const float* xr = x + r * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const float v = xr[c];
        if (c < d0) a[r * d0 + c] = v;
        else b[r * db + (c - d0)] = v;
    }
}

// a_heads / b_heads: 1 when that side has H heads, 0 when its one head serves every head
extern "C" __global__ void __launch_bounds__(128)
reflex_mla_concat_heads(const float* __restrict__ a, const float* __restrict__ b,
                        float* __restrict__ c, int H, int a_heads, int b_heads, int da, int db) {
    const int r = blockIdx.x;
    const int t = r / H;
    const float* ar = a + (size_t)(a_heads ? r : t) * da;
    const float* br = b + (size_t)(b_heads ? r : t) * db;
    float* cr = c + (size_t)r * (da + db);
    for (int i = threadIdx.x; i < da + db; i += blockDim.x) cr[i] = i < da ? ar[i] : br[i - da];
}

// ------------------------------------------------------------------------------------------
// store_rows: the batch's rows are contiguous and so are its cells [cell0, cell0 + T): one flat
// copy of total = T * n floats. cell0 is read from the device (the prepared batch), so a captured
// decode step replays at every position.

extern "C" __global__ void __launch_bounds__(256)
reflex_mla_store_rows(const float* __restrict__ rows, float* __restrict__ cache,
                      const int* __restrict__ cell0, int n, int total) {
    float* dst = cache + (size_t)(*cell0) * n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
        dst[i] = rows[i];
}

// ------------------------------------------------------------------------------------------
// attention: block (h, t), 8 warps. Token t sees cells [0, prefix_end[t]) and
// [max(own_start[t], prefix_end[t]), own_end[t]) -- the visible list j = 0..nvis-1. Warp w
// takes cells j = w, w+8, ...; lane l holds columns e = l + 32 c (c < NPL) of q and of the
// cell's row, so each row is read once, coalesced, and serves both q.K (a warp butterfly sum)
// and the V accumulator (columns < n_v). Each warp keeps an online softmax (m, l, acc); the 8
// partial states merge in shared memory: M = max m_w, L = sum l_w e^(m_w - M),
// out = sum acc_w e^(m_w - M) / L.
// q [T, H, n]; cache [cells, n]; out [T, H, n_v].

template <int NPL>
__device__ __forceinline__ void mla_attention_block(
        const float* __restrict__ q, const float* __restrict__ cache, float* __restrict__ out,
        const int* __restrict__ prefix_end, const int* __restrict__ own_start,
        const int* __restrict__ own_end, int H, int n, int n_v, float scale,
        float* s_m, float* s_l, float (*s_acc)[32 * NPL]) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a_end = prefix_end[t];
    const int b_start = max(own_start[t], a_end);
    const int nvis = a_end + max(0, own_end[t] - b_start);

    const float* qh = q + ((size_t)t * H + h) * n;
    float qr[NPL], acc[NPL];
#pragma unroll
    for (int c = 0; c < NPL; c++) {
        const int e = lane + 32 * c;
        qr[c] = e < n ? qh[e] * scale : 0.f;  // the scale folded into q: one multiply per row
        acc[c] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = warp; j < nvis; j += MLA_WARPS) {
        const int cell = j < a_end ? j : b_start + (j - a_end);
        const float* kp = cache + (size_t)cell * n;
        float row[NPL];
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < NPL; c++) {
            const int e = lane + 32 * c;
            row[c] = e < n ? __ldg(kp + e) : 0.f;
            s += qr[c] * row[c];
        }
        s = rx_warp_sum(s);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);  // m = -inf on the warp's first cell: 0
        const float p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int c = 0; c < NPL; c++) acc[c] = acc[c] * corr + p * row[c];
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < NPL; c++) {
        const int e = lane + 32 * c;
        if (e < n_v) s_acc[warp][e] = acc[c];
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < MLA_WARPS; w++) M = fmaxf(M, s_m[w]);
    float f[MLA_WARPS];
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < MLA_WARPS; w++) {
        f[w] = s_m[w] == -INFINITY ? 0.f : expf(s_m[w] - M);  // a warp that saw no cell: 0
        L += s_l[w] * f[w];
    }
    const float invL = 1.0f / L;  // the launcher's mask checks leave every token a cell
    float* o = out + ((size_t)t * H + h) * n_v;
    for (int e = threadIdx.x; e < n_v; e += blockDim.x) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < MLA_WARPS; w++) v += s_acc[w][e] * f[w];
        o[e] = v * invL;
    }
}

// One kernel per lane width NPL (ceil(n / 32) rounded up to one of them, ops.ATT_LANE_FLOATS):
// reflex_mla_attention_<NPL>. Separate kernels, not a switch in one, so each gets the registers
// and shared memory of its own width (576 = 18 floats per lane does not pay for 1024's).
#define MLA_ATTENTION_KERNEL(NPL)                                                              \
    extern "C" __global__ void __launch_bounds__(MLA_WARPS * 32)                               \
    reflex_mla_attention_##NPL(const float* __restrict__ q, const float* __restrict__ cache,   \
                               float* __restrict__ out, const int* __restrict__ prefix_end,    \
                               const int* __restrict__ own_start,                              \
                               const int* __restrict__ own_end, int H, int n, int n_v,         \
                               float scale) {                                                  \
        __shared__ float s_m[MLA_WARPS], s_l[MLA_WARPS];                                       \
        __shared__ float s_acc[MLA_WARPS][32 * NPL];                                           \
        mla_attention_block<NPL>(q, cache, out, prefix_end, own_start, own_end, H, n, n_v,     \
                                 scale, s_m, s_l, s_acc);                                      \
    }

MLA_ATTENTION_KERNEL(2)
MLA_ATTENTION_KERNEL(4)
MLA_ATTENTION_KERNEL(8)
MLA_ATTENTION_KERNEL(12)
MLA_ATTENTION_KERNEL(18)
MLA_ATTENTION_KERNEL(24)
MLA_ATTENTION_KERNEL(32)

// ------------------------------------------------------------------------------------------
// query_temperature: out[t, :] = q[t, :] * tau(pos[t]) over the T * row floats. tau is rounded
// where llama.cpp rounds it (llm_graph_input_attn_temp): the quotient and its floor in float32,
// the logarithm and the rest in double, then float32. Positions come from the device (the
// prepared batch), so a captured decode step replays at every position.

extern "C" __global__ void __launch_bounds__(256)
reflex_mla_query_temperature(const float* __restrict__ q, float* __restrict__ out,
                             const int* __restrict__ pos, int row, int total, float scale,
                             int length) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const float f = floorf((float)pos[i / row] / (float)length);
        const float tau = (float)(log((double)f + 1.0) * (double)scale + 1.0);
        out[i] = q[i] * tau;
    }
}

// ------------------------------------------------------------------------------------------
// head_ids: ids[t, h] = h over the n = T * H entries.

extern "C" __global__ void __launch_bounds__(256)
reflex_mla_head_ids(int* __restrict__ ids, int n, int H) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ids[i] = i % H;
}
