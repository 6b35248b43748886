// quant_lowbit.cu -- module "quant_lowbit": the weight-side kernels of the low-bit K-quants
// (Q2_K, Q3_K), the codebook types (IQ1_S .. IQ4_XS, IQ4_NL), the ternary types (TQ1_0, TQ2_0)
// and MXFP4. A module of its own so that the cold start of a file without these types never
// loads their code (about twice the common types' image, quant.cu): the CUDA backend loads it
// when it attaches a file that has one of them, and on first use otherwise.
//
// Per type <t>, the same 12 kernels as quant.cu: reflex_dequant_<t>, reflex_unpack_pairs_<t>,
// reflex_embed_<t>, reflex_matmul_gemv{1,2,4,8,1s,1ws}_<t>, reflex_matmul_tiled_<t>,
// reflex_moe_matmul_<t>, reflex_moe_tiled_<t>; algorithm, parameters and launch shapes in
// reflex/quant_kernels.cuh, the codebooks in reflex/iq_tables.cuh. IQ4_XS also has
// reflex_matmul_gemvq1{,s}_iq4_xs, the one-token GEMV on x limbs (reflex_x_limbs, cuda/core.cu),
// and reflex_matmul_xh_iq4_xs / reflex_moe_xh_iq4_xs, the prefill tiles on x halves
// (reflex_x_halves). The prefill GEMM its reflex_unpack_pairs_<t> feed is quant.cu's.
// Launchers: reflex_core/cuda/quant_ops.py.
#include "reflex/quant_kernels.cuh"

RX_QUANT_KERNELS(q2_k, RX_Q2_K)
RX_QUANT_KERNELS(q3_k, RX_Q3_K)
RX_QUANT_KERNELS(iq2_xxs, RX_IQ2_XXS)
RX_QUANT_KERNELS(iq2_xs, RX_IQ2_XS)
RX_QUANT_KERNELS(iq2_s, RX_IQ2_S)
RX_QUANT_KERNELS(iq3_xxs, RX_IQ3_XXS)
RX_QUANT_KERNELS(iq3_s, RX_IQ3_S)
RX_QUANT_KERNELS(iq1_s, RX_IQ1_S)
RX_QUANT_KERNELS(iq1_m, RX_IQ1_M)
RX_QUANT_KERNELS(iq4_nl, RX_IQ4_NL)
RX_QUANT_KERNELS(iq4_xs, RX_IQ4_XS)
RX_QUANT_KERNELS(tq1_0, RX_TQ1_0)
RX_QUANT_KERNELS(tq2_0, RX_TQ2_0)
RX_QUANT_KERNELS(mxfp4, RX_MXFP4)
RX_QUANT_XQ_KERNELS(iq4_xs, RX_IQ4_XS)
RX_QUANT_XH_KERNELS(iq4_xs, RX_IQ4_XS)
