// Test plugin kernel: y = x * sigmoid(g), elementwise, float32.
// Launch: grid ceil(n / 256), block 256; one thread per element.
#include <reflex/common.cuh>

extern "C" __global__ void reflex_testop_sigmoid_mul(const float* __restrict__ x,
                                                     const float* __restrict__ g,
                                                     float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-g[i]));
}
