// kvg_cuda_internal.h: what the CUDA sources need from the rest of libkvgguf (not installed).
//
// The .cu files are compiled as C++ and cannot include kvg_internal.h (C11: _Atomic,
// _Static_assert), so kvg_cuda_glue.c (C, beside them) hands them the few internal pieces.
#ifndef KVG_CUDA_INTERNAL_H
#define KVG_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(_WIN32)
#    define KVG_CUDA_HIDDEN __attribute__((visibility("hidden")))
#else
#    define KVG_CUDA_HIDDEN
#endif

#ifdef __cplusplus
extern "C" {
#endif

// codecs.c: the detail message of kvg_last_error(), and clearing it.
KVG_CUDA_HIDDEN int kvg_fail(int status, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
KVG_CUDA_HIDDEN void kvg_clear_error(void);

// rotq's Lloyd-Max centroids (2^bits) and decision boundaries (2^bits - 1) for head_dim, the very
// floats the CPU encoder compares against (rotq.c computes them in double, so they cannot be
// recomputed from the public centroids). KVG_ERR_NO_MEMORY if the book cannot be built.
KVG_CUDA_HIDDEN int kvg_cuda_rotq_tables(int bits, int64_t head_dim, float * centroids, float * boundaries);

// kvg_cuda.cu: the bytes of a context's attention scratch (kvg_cuda_store_bytes counts them).
struct kvg_cuda_ctx;
KVG_CUDA_HIDDEN size_t kvg_cuda_ctx_scratch_bytes(const struct kvg_cuda_ctx * ctx);
// How often that scratch was reallocated (kernels captured in a CUDA graph hold its address).
KVG_CUDA_HIDDEN uint64_t kvg_cuda_ctx_scratch_grown(const struct kvg_cuda_ctx * ctx);
// 1 while the context's stream is being captured into a CUDA graph: no waits, no frees then.
KVG_CUDA_HIDDEN int kvg_cuda_ctx_capturing(const struct kvg_cuda_ctx * ctx);
// A copy queued on the context's stream without waiting (from_host: src is host memory, which
// may be reused once this returns; else device to device); kvg_cuda_sync waits for it and
// reports a failure. kvg_cuda_store_sync queues a sync's copies and waits once.
KVG_CUDA_HIDDEN int kvg_cuda_copy_queue(struct kvg_cuda_ctx * ctx, void * dst_dev, const void * src, size_t bytes,
                                        int from_host);
// Page-locked host memory (cudaMallocHost): copies out of the device into it run at the bus's
// speed, where pageable memory goes through a bounce buffer. Freeing it waits on the device.
KVG_CUDA_HIDDEN int  kvg_cuda_host_alloc(struct kvg_cuda_ctx * ctx, size_t bytes, void ** out_host);
KVG_CUDA_HIDDEN void kvg_cuda_host_free(struct kvg_cuda_ctx * ctx, void * host);

#ifdef __cplusplus
}
#endif

#endif  // KVG_CUDA_INTERNAL_H
