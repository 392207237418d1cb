// kvg_cuda_glue.c: the internal pieces of libkvgguf that its CUDA sources read (kvg_cuda_internal.h).
#include "kvg_cuda_internal.h"
#include "kvg_internal.h"

int kvg_cuda_rotq_tables(int bits, int64_t head_dim, float * centroids, float * boundaries) {
    if (bits < 1 || bits > KVG_ROTQ_MAX_BITS) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda: rotq bits must be 1..4, got %d", bits);
    }
    const kvg_rotq_book * book = kvg_rotq_get_book(head_dim);
    if (book == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda: cannot build the rotq codebook for head_dim %lld",
                        (long long) head_dim);
    }
    const int levels = 1 << bits;
    for (int i = 0; i < levels; i++) {
        centroids[i] = book->centroid[bits][i];
    }
    for (int i = 0; i + 1 < levels; i++) {
        boundaries[i] = book->boundary[bits][i];
    }
    return KVG_OK;
}
