// quant.cu -- module "quant": the weight-side kernels of the common GGML types, the ones the CUDA
// start loads with the core (reflex_core/cuda/start.py). The rarer low-bit, codebook, ternary and
// FP4 types are the "quant_lowbit" module (quant_lowbit.cu), loaded only for a file that has one:
// its image is about twice this one's, and module load time grows with the image.
//
// Per type <t>, 12 kernels: reflex_dequant_<t>, reflex_unpack_pairs_<t>, reflex_embed_<t>,
// reflex_matmul_gemv{1,2,4,8,1s,1ws}_<t>, reflex_matmul_tiled_<t>, reflex_moe_matmul_<t>,
// reflex_moe_tiled_<t>; the types with an integer view (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K) also
// reflex_matmul_xh_<t> and reflex_moe_xh_<t>, the prefill tiles on x halves (reflex_x_halves,
// cuda/core.cu); the K-quants (Q4_K, Q5_K, Q6_K) the one-token GEMVs on x limbs staged in shared
// memory, reflex_matmul_gemv1x{,4,1}_<t> and reflex_moe_matmulx_<t>; the types a decode step's
// residual projections and norm readers mostly have (F32, F16, Q8_0 and the K-quants) the residual
// step fused into the wide one-token GEMVs, reflex_matmul_gemv1ws{r,n}_<t> (and
// reflex_matmul_gemv1x{,4}{r,n}_<t> and gemv1x1n_<t> for the K-quants, and
// reflex_matmul_gemv1xn_q{4,5}_k_q6_k for q/k/v launches whose v is Q6_K, and the streamed forms
// reflex_matmul_gemv1xsn_q{4,6}_k and gemv1xsr_q4_k on sm_90+); and once, for every
// type, the prefill GEMM on float16 pairs, reflex_matmul_f16x{3,1}{,_64} (its weights from
// reflex_unpack_pairs_<t>). Their algorithm, parameters and launch shapes are documented with
// their bodies in reflex/quant_kernels.cuh. Launchers (which module serves which type):
// reflex_core/cuda/quant_ops.py.
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

RX_QUANT_KERNELS(f32, RX_F32)
RX_QUANT_KERNELS(f16, RX_F16)
RX_QUANT_KERNELS(bf16, RX_BF16)
RX_QUANT_KERNELS(q8_0, RX_Q8_0)
RX_QUANT_KERNELS(q4_0, RX_Q4_0)
RX_QUANT_KERNELS(q4_1, RX_Q4_1)
RX_QUANT_KERNELS(q5_0, RX_Q5_0)
RX_QUANT_KERNELS(q5_1, RX_Q5_1)
RX_QUANT_KERNELS(q4_k, RX_Q4_K)
RX_QUANT_KERNELS(q5_k, RX_Q5_K)
RX_QUANT_KERNELS(q6_k, RX_Q6_K)
RX_QUANT_NORM_KERNELS(f32, RX_F32)
RX_QUANT_NORM_KERNELS(f16, RX_F16)
RX_QUANT_NORM_KERNELS(q8_0, RX_Q8_0)
RX_QUANT_NORM_KERNELS(q4_k, RX_Q4_K)
RX_QUANT_NORM_KERNELS(q5_k, RX_Q5_K)
RX_QUANT_NORM_KERNELS(q6_k, RX_Q6_K)
RX_QUANT_XS_NORM_KERNELS(q4_k, RX_Q4_K)
RX_QUANT_XS_NORM_KERNELS(q5_k, RX_Q5_K)
RX_QUANT_XS_NORM_KERNELS(q6_k, RX_Q6_K)
RX_QUANT_XS_KERNEL(q4_k, RX_Q4_K)
RX_QUANT_XS_KERNEL(q5_k, RX_Q5_K)
RX_QUANT_XS_KERNEL(q6_k, RX_Q6_K)
RX_QUANT_XS_MIXED_KERNEL(q4_k, RX_Q4_K, q6_k, RX_Q6_K)
RX_QUANT_XS_MIXED_KERNEL(q5_k, RX_Q5_K, q6_k, RX_Q6_K)
RX_QUANT_STREAM_KERNEL(n, GEMV_NORMED, q4_k, RX_Q4_K)
RX_QUANT_STREAM_KERNEL(n, GEMV_NORMED, q6_k, RX_Q6_K)
RX_QUANT_STREAM_KERNEL(r, GEMV_RESNORM, q4_k, RX_Q4_K)
RX_QUANT_STREAM_KERNEL(r, GEMV_RESNORM, q6_k, RX_Q6_K)
RX_QUANT_XH_KERNELS(q8_0, RX_Q8_0)
RX_QUANT_XH_KERNELS(q4_0, RX_Q4_0)
RX_QUANT_XH_KERNELS(q5_0, RX_Q5_0)
RX_QUANT_XH_KERNELS(q4_k, RX_Q4_K)
RX_QUANT_XH_KERNELS(q5_k, RX_Q5_K)
RX_QUANT_XH_KERNELS(q6_k, RX_Q6_K)
RX_QUANT_PAIRS_KERNEL(f16x3, 3, 3)
RX_QUANT_PAIRS_KERNEL(f16x1, 1, 4)
