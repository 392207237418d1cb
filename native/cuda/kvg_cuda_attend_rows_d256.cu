// The row-parallel attention kernels for head dim 256 (kvg_cuda_attend_rows.cuh), in a file of
// their own so that the head dims compile side by side.
#include "kvg_cuda_attend_rows.cuh"

ka_rows_kernel_t ka_rows_kernel_d256(int k_bits, int v_bits, int qt) {
    return kr_pick<256>(k_bits, v_bits, qt);
}
