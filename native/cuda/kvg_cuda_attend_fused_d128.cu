// The pass's fused split kernels for head dim 128 (kvg_cuda_attend_fused.cuh), in a file of their own
// so that the head dims compile side by side.
#include "kvg_cuda_attend_fused.cuh"

ka_fused_kernel_t ka_fused_kernel_d128(int qt) {
    return kf_pick<128>(qt);
}
