// bench/gemv_lab.py compiles this on the GPU machine: forms of the one-token GEMV on x limbs
// staged in shared memory (gemv_body's XS form) in other block shapes than the module's
// reflex_matmul_gemv1x_<t>, to time them side by side. lab_<form>_<t>: KS warps a row group, R
// rows a group, WARPS warps a block.
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

#define LAB(form, name, TYPE, KS, R, WARPS)                                                \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) lab_##form##_##name(RX_MM_PARAMS) { \
        gemv_body<TYPE, 1, KS, false, R, true, WARPS>(RX_MM_ARGS);                         \
    }
#define LAB_ALL(name, TYPE)           \
    LAB(x4, name, TYPE, 2, 4, 4)      \
    LAB(x16, name, TYPE, 2, 4, 16)    \
    LAB(x8k1, name, TYPE, 1, 4, 8)    \
    LAB(x8k4, name, TYPE, 4, 4, 8)    \
    LAB(x16k4, name, TYPE, 4, 4, 16)  \
    LAB(x8r2, name, TYPE, 2, 2, 8)

LAB_ALL(q4_k, RX_Q4_K)
LAB_ALL(q6_k, RX_Q6_K)
