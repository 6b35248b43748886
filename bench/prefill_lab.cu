// bench/prefill_lab.py compiles this on the GPU machine: the prefill tile on x halves from
// unpacked weights (xhu_body, reflex/quant_kernels.cuh) in other block shapes than the module's
// reflex_matmul_xhu{,64}_<v>, to time them side by side. lab_<form>_<v>: BM rows x BN tokens a
// block, WM x WN warps, ST stages, GROUP row tiles a raster group.
#define REFLEX_QUANTS_COMMON_ONLY
#include "reflex/quant_kernels.cuh"

#define LAB(form, v, SUB, MIN, BM, BN, WM, WN, ST, GROUP)                                             \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 1) lab_##form##_##v(RX_MM_PARAMS) {    \
        xhu_body<SUB, MIN, BM, BN, WM, WN, ST, GROUP>(w0, w1, w2, reinterpret_cast<const uint32_t*>(x), \
                                                      y0, y1, y2, T, n_in, n0, n1, n2, mode);          \
    }
#define LAB_ALL(v, SUB, MIN)                              \
    LAB(a4, v, SUB, MIN, 128, 128, 2, 4, 4, 8)            \
    LAB(arows, v, SUB, MIN, 128, 128, 2, 4, 3, 1 << 20)   \
    LAB(b, v, SUB, MIN, 128, 128, 4, 2, 3, 8)             \
    LAB(c, v, SUB, MIN, 256, 64, 4, 2, 3, 8)              \
    LAB(d, v, SUB, MIN, 128, 64, 2, 2, 4, 8)              \
    LAB(f4, v, SUB, MIN, 64, 64, 2, 2, 4, 8)

LAB_ALL(s32, 32, false)
LAB_ALL(m32, 32, true)
LAB_ALL(s16, 16, false)
