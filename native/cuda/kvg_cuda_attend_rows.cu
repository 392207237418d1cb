// kvg_cuda_attend_rows.cu: when kvg_cuda_attend takes the row-parallel kernel
// (kvg_cuda_attend_rows.cuh), how it splits the rows, and its kernel by head dim.
#include "kvg_cuda_attend.cuh"

#include <stdint.h>

int ka_rows_covers(int dk, int dv, int k_bits, int v_bits) {
    return dk == dv && (dk == 64 || dk == 128 || dk == 256) && k_bits >= 2 && k_bits <= 4 && v_bits >= 2 && v_bits <= 4;
}

int64_t ka_rows_split_rows(int64_t n_rows, int64_t splits_wanted) {
    splits_wanted = splits_wanted < 1 ? 1 : splits_wanted;
    int64_t rows  = (n_rows + splits_wanted - 1) / splits_wanted;
    return (rows + KA_WARPS * 32 - 1) / (KA_WARPS * 32) * (KA_WARPS * 32);  // whole steps of the block's warps
}

ka_rows_kernel_t ka_rows_kernel(int d, int k_bits, int v_bits, int qt) {
    switch (d) {
        case 64:  return ka_rows_kernel_d64(k_bits, v_bits, qt);
        case 128: return ka_rows_kernel_d128(k_bits, v_bits, qt);
        default:  return ka_rows_kernel_d256(k_bits, v_bits, qt);
    }
}

ka_fused_kernel_t ka_fused_kernel(int d, int qt) {
    switch (d) {
        case 64:  return ka_fused_kernel_d64(qt);
        case 128: return ka_fused_kernel_d128(qt);
        default:  return ka_fused_kernel_d256(qt);
    }
}
