// bench/gemv_lab.py compiles this on the GPU machine: forms of the one-token GEMV in other block
// shapes than the module's, to time them side by side. lab_<form>_<t>: KS warps a row group, R
// rows a group, WARPS warps a block; XS: on x limbs staged in shared memory (gemv_body's XS form,
// as the module's reflex_matmul_gemv1x_<t>), else on float x (as reflex_matmul_gemv1ws_<t>).
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

#define LAB(form, name, TYPE, KS, R, WARPS, XS)                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) lab_##form##_##name(RX_MM_PARAMS) { \
        gemv_body<TYPE, 1, KS, false, R, XS, WARPS>(RX_MM_ARGS);                           \
    }
#define LAB_ALL(name, TYPE)           \
    LAB(x16, name, TYPE, 2, 4, 16, true)    \
    LAB(x8k4, name, TYPE, 4, 4, 8, true)

LAB_ALL(q4_k, RX_Q4_K)
LAB_ALL(q6_k, RX_Q6_K)

// Float-x forms (the module's gemv1ws being KS 2, R 4, 4 warps) for the types without staged
// limbs (Q8_0): more warps a row group for launches of few rows.
LAB(w8k2, q8_0, RX_Q8_0, 2, 4, 8, false)
LAB(w4k4, q8_0, RX_Q8_0, 4, 4, 4, false)
LAB(w8k4, q8_0, RX_Q8_0, 4, 4, 8, false)
LAB(w8k8, q8_0, RX_Q8_0, 8, 4, 8, false)
LAB(w16k8, q8_0, RX_Q8_0, 8, 4, 16, false)
LAB(w8k4r2, q8_0, RX_Q8_0, 4, 2, 8, false)
