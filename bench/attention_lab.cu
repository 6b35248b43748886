// bench/attention_lab.py compiles this on the GPU machine: the whole core module (cuda/core.cu)
// plus the prefill's tensor-core attention (attention_mma_body) in other tile shapes, to time
// them side by side. lab_<form>: DMAX, W warps of 16 tokens, BK cells a tile, MINB blocks an SM.
#include "../cuda/core.cu"

RX_ATT_MMA(lab_w8k32, 128, 8, 32, 1)
RX_ATT_MMA(lab_w4k32, 128, 4, 32, 2)
RX_ATT_MMA(lab_w4k64, 128, 4, 64, 1)
RX_ATT_MMA(lab_w8k64, 128, 8, 64, 1)
RX_ATT_MMA(lab_w4k16, 128, 4, 16, 2)
RX_ATT_MMA(lab_d256w4k32, 256, 4, 32, 1)
RX_ATT_MMA(lab_d256w4k16, 256, 4, 16, 1)
RX_ATT_MMA(lab_d256w2k16, 256, 2, 16, 2)
