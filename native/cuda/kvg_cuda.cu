// kvg_cuda.cu: the host side of kvg_cuda.h: contexts, device memory, copies, argument checks and
// CUDA errors as kvgguf.h statuses. The kernels are in kvg_cuda_codecs.cu and kvg_cuda_attend.cu.
#include "kvg_cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- errors --------------------------------------------------------------------------------

static int kc_status_of(cudaError_t e) {
    switch (e) {
        case cudaSuccess:                    return KVG_OK;
        case cudaErrorMemoryAllocation:      return KVG_ERR_NO_MEMORY;
        case cudaErrorInvalidValue:
        case cudaErrorInvalidDevicePointer:
        case cudaErrorInvalidResourceHandle:
        case cudaErrorInvalidDevice:         return KVG_ERR_INVALID_ARG;
        default:  // no device or driver, no kernel image for this GPU, a failed launch, a fault
            return KVG_ERR_UNSUPPORTED;
    }
}

int kc_cuda_fail(cudaError_t e, const char * what) {
    (void) cudaGetLastError();  // clears a non-sticky error so the next call starts clean
    return kvg_fail(kc_status_of(e), "kvg_cuda: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int kc_launch_check(const char * what) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, what);
}

// ---- status words --------------------------------------------------------------------------

static __global__ void kc_status_reset_kernel(kc_status * st) {
    st->flags = 0;
    for (int i = 0; i < KC_N_FLAGS; i++) {
        st->first[i] = ~0ULL;
    }
}

int kc_status_reset(kvg_cuda_ctx * ctx) {
    KVG_LAUNCH(1, 1, 0, ctx->stream, kc_status_reset_kernel)(ctx->d_status);
    return kc_launch_check("status reset launch");
}

static int kc_status_fetch(kvg_cuda_ctx * ctx) {
    cudaError_t e =
        cudaMemcpyAsync(ctx->h_status, ctx->d_status, sizeof(kc_status), cudaMemcpyDeviceToHost, ctx->stream);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(ctx->stream);
    }
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "waiting for the kernels");
}

static const char * kc_codec_name(int type) {
    const char * n = kvg_codec_name(type);
    return n ? n : "?";
}

static int kc_family(int type) {  // 0: f16, 1: kivi, 2: rotq
    return type == KVG_CODEC_F16 ? 0 : (type >= KVG_CODEC_KIVI2 && type <= KVG_CODEC_KIVI8) ? 1 : 2;
}

// The flags of an encode or a decode as the status (and message) the CPU reference gives.
int kc_flags_status(const kc_shape * s, const kc_status * st, int decode) {
    const char * name = kc_codec_name(s->type);
    const int    fam  = kc_family(s->type);
    if (st->flags & (1u << KC_NONFINITE)) {
        const unsigned long long e = st->first[KC_NONFINITE];
        return kvg_fail(KVG_ERR_NONFINITE, "%s encode (cuda): NaN or Inf at token %lld, channel %lld", name,
                        (long long) (e / (unsigned long long) s->n_channels),
                        (long long) (e % (unsigned long long) s->n_channels));
    }
    if (st->flags & (1u << KC_RANGE)) {
        const unsigned long long i = st->first[KC_RANGE];
        if (fam == 2) {
            return kvg_fail(KVG_ERR_RANGE,
                            "%s encode (cuda): vector norm does not fit in f16 (<= 65504), at token %lld, head %lld",
                            name, (long long) (i / (unsigned long long) s->n_heads),
                            (long long) (i % (unsigned long long) s->n_heads));
        }
        if (fam == 1) {
            return kvg_fail(KVG_ERR_RANGE,
                            "%s encode (cuda): the range of group %llu does not fit in f16 (|x| <= 65504)", name, i);
        }
        return kvg_fail(KVG_ERR_RANGE, "f16 encode (cuda): value at index %llu does not fit in f16 (|x| <= 65504)", i);
    }
    if (st->flags & (1u << KC_CORRUPT)) {
        const unsigned long long i = st->first[KC_CORRUPT];
        return kvg_fail(KVG_ERR_CORRUPT, "%s %s (cuda): %s %llu holds bytes no encoder writes", name,
                        decode ? "decode" : "encode",
                        fam == 2   ? "the norm of vector"
                        : fam == 1 ? "group"
                                   : "value",
                        i);
    }
    return KVG_OK;
}

// ---- devices and contexts ------------------------------------------------------------------

extern "C" int kvg_cuda_device_count(int * out_count) {
    kvg_clear_error();
    if (out_count == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_device_count: NULL out_count");
    }
    *out_count          = 0;
    int               n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void) cudaGetLastError();
        kvg_fail(KVG_OK, "kvg_cuda: %s", cudaGetErrorString(e));  // why none, for the curious
        return KVG_OK;
    }
    if (e != cudaSuccess) {
        return kc_cuda_fail(e, "cudaGetDeviceCount");
    }
    *out_count = n;
    return KVG_OK;
}

extern "C" int kvg_cuda_mem_info(int device, size_t * out_free, size_t * out_total) {
    kvg_clear_error();
    if (out_free == NULL || out_total == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_mem_info: NULL out_free or out_total");
    }
    *out_free = *out_total = 0;
    int         prev       = -1;
    cudaError_t e          = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != device) {
        e = cudaSetDevice(device);
    }
    if (e == cudaSuccess) {
        e = cudaMemGetInfo(out_free, out_total);
    }
    if (prev >= 0 && prev != device) {
        cudaSetDevice(prev);
    }
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaMemGetInfo");
}

extern "C" int kvg_cuda_ctx_init(int device, void * stream, kvg_cuda_ctx ** out) {
    kvg_clear_error();
    if (out == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_ctx_init: NULL out");
    }
    *out   = NULL;
    int n  = 0;
    int st = kvg_cuda_device_count(&n);
    if (st != KVG_OK) {
        return st;
    }
    if (n == 0) {
        return kvg_fail(KVG_ERR_UNSUPPORTED, "kvg_cuda_ctx_init: no CUDA device");
    }
    if (device < 0 || device >= n) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_ctx_init: device %d is outside [0, %d)", device, n);
    }
    kvg_cuda_ctx * ctx = (kvg_cuda_ctx *) calloc(1, sizeof(kvg_cuda_ctx));
    if (ctx == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_ctx_init: cannot allocate the context");
    }
    ctx->device         = device;
    const char * which  = getenv("KVGGUF_CUDA_ATTEND");
    ctx->attend_generic = which != NULL && strcmp(which, "generic") == 0;
    ctx->attend_no_tc   = ctx->attend_generic || (which != NULL && strcmp(which, "rows") == 0);
    ctx->attend_parts   = ctx->attend_generic || (which != NULL && strcmp(which, "parts") == 0);
    {
        kc_device_scope scope(ctx);
        st = scope.status;
        if (st == KVG_OK && stream == NULL) {
            const cudaError_t e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
            st                  = e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaStreamCreateWithFlags");
            ctx->own_stream     = e == cudaSuccess;
        } else {
            ctx->stream = (cudaStream_t) stream;
        }
        if (st == KVG_OK) {
            const cudaError_t e = cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, device);
            st = e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaDeviceGetAttribute (multiprocessors)");
        }
        if (st == KVG_OK) {
            cudaError_t e = cudaDeviceGetAttribute(&ctx->cc_major, cudaDevAttrComputeCapabilityMajor, device);
            if (e == cudaSuccess) {
                e = cudaDeviceGetAttribute(&ctx->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
            }
            st = e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaDeviceGetAttribute (compute capability)");
        }
        if (st == KVG_OK) {
            const cudaError_t e = cudaMalloc((void **) &ctx->d_status, sizeof(kc_status));
            st                  = e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaMalloc (status word)");
        }
        if (st == KVG_OK) {
            const cudaError_t e = cudaMallocHost((void **) &ctx->h_status, sizeof(kc_status));
            st                  = e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaMallocHost (status word)");
        }
    }
    if (st != KVG_OK) {
        kvg_cuda_ctx_free(ctx);
        return st;
    }
    *out = ctx;
    return KVG_OK;
}

extern "C" void kvg_cuda_ctx_free(kvg_cuda_ctx * ctx) {
    if (ctx == NULL) {
        return;
    }
    {
        kc_device_scope scope(ctx);
        cudaStreamSynchronize(ctx->stream);
        cudaFree(ctx->scratch);
        cudaFree(ctx->d_status);
        cudaFreeHost(ctx->h_status);
        if (ctx->own_stream) {
            cudaStreamDestroy(ctx->stream);
        }
        (void) cudaGetLastError();
    }
    free(ctx);
}

extern "C" void * kvg_cuda_ctx_set_stream(kvg_cuda_ctx * ctx, void * stream) {
    if (ctx == NULL) {
        return NULL;
    }
    void * prev = (void *) ctx->stream;
    ctx->stream = (cudaStream_t) stream;
    return prev;
}

extern "C" size_t kvg_cuda_ctx_scratch_bytes(const kvg_cuda_ctx * ctx) {
    return ctx ? ctx->scratch_bytes : 0;
}

extern "C" uint64_t kvg_cuda_ctx_scratch_grown(const kvg_cuda_ctx * ctx) {
    return ctx ? ctx->scratch_grown : 0;
}

extern "C" int kvg_cuda_ctx_capturing(const kvg_cuda_ctx * ctx) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return ctx && cudaStreamIsCapturing(ctx->stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

extern "C" int kvg_cuda_ctx_device(const kvg_cuda_ctx * ctx) {
    return ctx ? ctx->device : -1;
}

extern "C" int kvg_cuda_sync(kvg_cuda_ctx * ctx) {
    kvg_clear_error();
    if (ctx == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_sync: NULL ctx");
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const cudaError_t e = cudaStreamSynchronize(ctx->stream);
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaStreamSynchronize");
}

// ---- memory --------------------------------------------------------------------------------

// Device memory, or page-locked host memory (host = 1).
static int kc_alloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out, int host, const char * what) {
    kvg_clear_error();
    if (ctx == NULL || out == NULL || bytes == 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: NULL ctx or out, or 0 bytes", what);
    }
    *out = NULL;
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const cudaError_t e = host ? cudaMallocHost(out, bytes) : cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        return kc_cuda_fail(e, host ? "cudaMallocHost" : "cudaMalloc");
    }
    return KVG_OK;
}

extern "C" int kvg_cuda_malloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out_dev) {
    return kc_alloc(ctx, bytes, out_dev, 0, "kvg_cuda_malloc");
}

extern "C" int kvg_cuda_free(kvg_cuda_ctx * ctx, void * dev) {
    kvg_clear_error();
    if (ctx == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_free: NULL ctx");
    }
    if (dev == NULL) {
        return KVG_OK;
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const cudaError_t e = cudaFree(dev);
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "cudaFree");
}

extern "C" int kvg_cuda_host_alloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out_host) {
    return kc_alloc(ctx, bytes, out_host, 1, "kvg_cuda_host_alloc");
}

extern "C" void kvg_cuda_host_free(kvg_cuda_ctx * ctx, void * host) {
    if (ctx == NULL || host == NULL) {
        return;
    }
    kc_device_scope scope(ctx);
    cudaFreeHost(host);
}

static int kc_copy(kvg_cuda_ctx * ctx, void * dst, const void * src, size_t bytes, cudaMemcpyKind kind,
                   const char * what) {
    kvg_clear_error();
    if (ctx == NULL || ((dst == NULL || src == NULL) && bytes > 0)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: NULL ctx, dst or src", what);
    }
    if (bytes == 0) {
        return KVG_OK;
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(ctx->stream);
    }
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, what);
}

extern "C" int kvg_cuda_copy_queue(kvg_cuda_ctx * ctx, void * dst_dev, const void * src, size_t bytes, int from_host) {
    kvg_clear_error();
    if (ctx == NULL || ((dst_dev == NULL || src == NULL) && bytes > 0)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_copy_queue: NULL ctx, dst or src");
    }
    if (bytes == 0) {
        return KVG_OK;
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const cudaError_t e = cudaMemcpyAsync(dst_dev, src, bytes,
                                          from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, ctx->stream);
    return e == cudaSuccess ? KVG_OK : kc_cuda_fail(e, "kvg_cuda_copy_queue");
}

extern "C" int kvg_cuda_copy_in(kvg_cuda_ctx * ctx, void * dst_dev, const void * src_host, size_t bytes) {
    return kc_copy(ctx, dst_dev, src_host, bytes, cudaMemcpyHostToDevice, "kvg_cuda_copy_in");
}

extern "C" int kvg_cuda_copy_out(kvg_cuda_ctx * ctx, void * dst_host, const void * src_dev, size_t bytes) {
    return kc_copy(ctx, dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, "kvg_cuda_copy_out");
}

extern "C" int kvg_cuda_copy_dev(kvg_cuda_ctx * ctx, void * dst_dev, const void * src_dev, size_t bytes) {
    return kc_copy(ctx, dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, "kvg_cuda_copy_dev");
}

// ---- codecs --------------------------------------------------------------------------------

#define KC_GPU_CODECS "f16, kivi2, kivi3, kivi4, kivi8, rotq1, rotq2, rotq3, rotq4"

extern "C" int kvg_cuda_codec_supported(int type, int64_t head_dim) {
    kvg_clear_error();
    if (type < 0 || type >= kvg_codec_count()) {
        return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "kvg_cuda: codec type %d is unknown; the GPU runs " KC_GPU_CODECS, type);
    }
    if (head_dim <= 0) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda: head_dim must be > 0, got %lld", (long long) head_dim);
    }
    switch (type) {
        case KVG_CODEC_F16:
        case KVG_CODEC_KIVI2:
        case KVG_CODEC_KIVI3:
        case KVG_CODEC_KIVI4:
        case KVG_CODEC_KIVI8: return KVG_OK;
        case KVG_CODEC_ROTQ1:
        case KVG_CODEC_ROTQ2:
        case KVG_CODEC_ROTQ3:
        case KVG_CODEC_ROTQ4:
            // From 8 on a head vector's codes fill whole bytes, so each vector's block writes its own.
            if (head_dim < 8 || head_dim > KVG_ROTQ_MAX_HEAD_DIM || (head_dim & (head_dim - 1)) != 0) {
                return kvg_fail(KVG_ERR_SHAPE,
                                "kvg_cuda: %s needs a power-of-two head_dim in [8, 4096] on the GPU, got %lld",
                                kc_codec_name(type), (long long) head_dim);
            }
            return KVG_OK;
        default:
            return kvg_fail(KVG_ERR_UNSUPPORTED, "kvg_cuda: codec %s has no CUDA kernels; the GPU runs " KC_GPU_CODECS,
                            kc_codec_name(type));
    }
}

// Validates what kvg_encode / kvg_decode validate, plus the GPU's own limits; fills the shape.
int kc_prepare(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
               kc_shape * s, size_t * size) {
    int st = kvg_cuda_codec_supported(type, head_dim);  // first: its message names what the GPU runs
    if (st != KVG_OK) {
        return st;
    }
    st = kvg_encoded_size(type, kind, n_tokens, n_heads, head_dim, p, size);
    if (st != KVG_OK) {
        return st;
    }
    kvg_codec_params defaults;
    kvg_codec_default_params(&defaults);
    if (p == NULL) {
        p = &defaults;
    }
    int bits = 0;
    kvg_codec_bits(type, &bits);
    s->type       = type;
    s->kind       = kind;
    s->bits       = bits;
    s->n_tokens   = n_tokens;
    s->n_heads    = n_heads;
    s->head_dim   = head_dim;
    s->n_channels = n_heads * head_dim;
    s->n_values   = n_tokens * n_heads * head_dim;
    s->group_size = p->group_size;
    s->seed       = p->seed;
    return KVG_OK;
}

// The checks encode and decode share on their float rows (side "src" for encode, "dst" for
// decode): pointers, the rows' type and their strides, with the caller's words in the message.
static int kc_check_rows(const char * name, const char * op, const char * side, kvg_cuda_ctx * ctx, const void * src,
                         const void * dst, int rows_type, int64_t row_stride, int64_t col_stride) {
    if (ctx == NULL || src == NULL || dst == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s %s (cuda): NULL ctx, src or dst", name, op);
    }
    if (rows_type != KVG_CUDA_F32 && rows_type != KVG_CUDA_F16) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s %s (cuda): %s_type must be KVG_CUDA_F32 or KVG_CUDA_F16, got %d", name,
                        op, side, rows_type);
    }
    if (row_stride <= 0 || col_stride <= 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s %s (cuda): strides must be > 0, got %lld, %lld", name, op,
                        (long long) row_stride, (long long) col_stride);
    }
    return KVG_OK;
}

// What kvg_cuda_encode checks of a job before queuing it: its shape (filled), its rows, the room in dst.
static int kc_encode_check(kvg_cuda_ctx * ctx, const kvg_cuda_encode_job * j, kc_shape * s, size_t * size) {
    int st = kc_prepare(j->type, j->kind, j->n_tokens, j->n_heads, j->head_dim, &j->params, s, size);
    if (st != KVG_OK) {
        return st;
    }
    const char * name = kc_codec_name(j->type);
    st = kc_check_rows(name, "encode", "src", ctx, j->src_dev, j->dst_dev, j->src_type, j->src_row_stride,
                       j->src_col_stride);
    if (st == KVG_OK && j->dst_bytes < *size) {
        st = kvg_fail(KVG_ERR_BUFFER_SIZE, "%s encode (cuda): dst holds %zu bytes, needs %zu", name, j->dst_bytes,
                      *size);
    }
    return st;
}

extern "C" int kvg_cuda_encode(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, int src_type,
                               int64_t src_row_stride, int64_t src_col_stride, int64_t n_tokens, int64_t n_heads,
                               int64_t head_dim, const kvg_codec_params * p, void * dst_dev, size_t dst_bytes,
                               size_t * out_written) {
    kvg_clear_error();
    if (out_written != NULL) {
        *out_written = 0;
    }
    kvg_cuda_encode_job j;
    memset(&j, 0, sizeof(j));
    j.type = type, j.kind = kind, j.src_dev = src_dev, j.src_type = src_type;
    j.src_row_stride = src_row_stride, j.src_col_stride = src_col_stride;
    j.n_tokens = n_tokens, j.n_heads = n_heads, j.head_dim = head_dim;
    j.dst_dev = dst_dev, j.dst_bytes = dst_bytes;
    if (p != NULL) {
        j.params = *p;
    } else {
        kvg_codec_default_params(&j.params);
    }
    kc_shape s;
    size_t   size = 0;
    int      st   = kc_encode_check(ctx, &j, &s, &size);
    if (st != KVG_OK) {
        return st;
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    st = kc_status_reset(ctx);
    if (st == KVG_OK) {
        st = kc_encode_launch(ctx, &s, src_dev, src_type == KVG_CUDA_F16, src_row_stride, src_col_stride,
                              (uint8_t *) dst_dev);
    }
    if (st == KVG_OK) {
        st = kc_status_fetch(ctx);
    }
    if (st == KVG_OK) {
        st = kc_flags_status(&s, ctx->h_status, 0);
    }
    if (st == KVG_OK && out_written != NULL) {
        *out_written = size;
    }
    return st;
}

extern "C" int kvg_cuda_encode_batch(kvg_cuda_ctx * ctx, const kvg_cuda_encode_job * jobs, int64_t n,
                                     int64_t * out_failed) {
    kvg_clear_error();
    if (out_failed != NULL) {
        *out_failed = -1;
    }
    if (ctx == NULL || n < 0 || (n > 0 && jobs == NULL)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_encode_batch: NULL ctx or jobs, or n < 0");
    }
    if (n == 0) {
        return KVG_OK;
    }
    kc_shape * shapes = (kc_shape *) malloc((size_t) n * sizeof(kc_shape));
    if (shapes == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_encode_batch: %lld shapes", (long long) n);
    }
    int st = KVG_OK;
    // every job's arguments first, as kvg_cuda_encode checks them: nothing is queued for a bad one
    for (int64_t i = 0; i < n && st == KVG_OK; i++) {
        size_t size = 0;
        st          = kc_encode_check(ctx, &jobs[i], &shapes[i], &size);
        if (st != KVG_OK && out_failed != NULL) {
            *out_failed = i;
        }
    }
    if (st == KVG_OK) {
        kc_device_scope scope(ctx);
        st = scope.status;
        if (st == KVG_OK) {
            st = kc_status_reset(ctx);  // one status word for all: its flags say whether any job failed
        }
        for (int64_t i = 0; i < n && st == KVG_OK; i++) {
            const kvg_cuda_encode_job * j = &jobs[i];
            st = kc_encode_launch(ctx, &shapes[i], j->src_dev, j->src_type == KVG_CUDA_F16, j->src_row_stride,
                                  j->src_col_stride, (uint8_t *) j->dst_dev);
        }
        if (st == KVG_OK) {
            st = kc_status_fetch(ctx);
        }
        if (st == KVG_OK && ctx->h_status->flags != 0) {
            // some job's input was bad: find it, one wait each, for kvg_cuda_encode's own message
            for (int64_t i = 0; i < n && st == KVG_OK; i++) {
                const kvg_cuda_encode_job * j = &jobs[i];
                st = kvg_cuda_encode(ctx, j->type, j->kind, j->src_dev, j->src_type, j->src_row_stride,
                                     j->src_col_stride, j->n_tokens, j->n_heads, j->head_dim, &j->params, j->dst_dev,
                                     j->dst_bytes, NULL);
                if (st != KVG_OK && out_failed != NULL) {
                    *out_failed = i;
                }
            }
        }
    }
    free(shapes);
    return st;
}

extern "C" int kvg_cuda_decode(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, size_t src_bytes,
                               int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
                               void * dst_dev, int dst_type, int64_t dst_row_stride, int64_t dst_col_stride) {
    kvg_clear_error();
    kc_shape s;
    size_t   size = 0;
    int      st   = kc_prepare(type, kind, n_tokens, n_heads, head_dim, p, &s, &size);
    if (st != KVG_OK) {
        return st;
    }
    const char * name = kc_codec_name(type);
    st = kc_check_rows(name, "decode", "dst", ctx, src_dev, dst_dev, dst_type, dst_row_stride, dst_col_stride);
    if (st != KVG_OK) {
        return st;
    }
    if (src_bytes != size) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s decode (cuda): src holds %zu bytes, the shape encodes to exactly %zu",
                        name, src_bytes, size);
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    st = kc_status_reset(ctx);
    if (st == KVG_OK) {
        st = kc_decode_launch(ctx, &s, (const uint8_t *) src_dev, dst_dev, dst_type == KVG_CUDA_F16, dst_row_stride,
                              dst_col_stride);
    }
    if (st == KVG_OK) {
        st = kc_status_fetch(ctx);
    }
    if (st == KVG_OK) {
        st = kc_flags_status(&s, ctx->h_status, 1);
    }
    return st;
}

extern "C" int kvg_cuda_check(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, size_t src_bytes,
                              int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p) {
    kvg_clear_error();
    kc_shape s;
    size_t   size = 0;
    int      st   = kc_prepare(type, kind, n_tokens, n_heads, head_dim, p, &s, &size);
    if (st != KVG_OK) {
        return st;
    }
    if (ctx == NULL || src_dev == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s check (cuda): NULL ctx or src", kc_codec_name(type));
    }
    if (src_bytes != size) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s check (cuda): %zu bytes, the shape encodes to exactly %zu",
                        kc_codec_name(type), src_bytes, size);
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    st = kc_status_reset(ctx);
    if (st == KVG_OK) {
        st = kc_decode_launch(ctx, &s, (const uint8_t *) src_dev, NULL, 0, 1, 1);
    }
    if (st == KVG_OK) {
        st = kc_status_fetch(ctx);
    }
    if (st == KVG_OK) {
        st = kc_flags_status(&s, ctx->h_status, 1);
    }
    return st;
}

int kc_get_rotq_tab(int bits, int64_t head_dim, kc_rotq_tab * tab) {
    memset(tab, 0, sizeof(*tab));
    return kvg_cuda_rotq_tables(bits, head_dim, tab->centroid, tab->boundary);
}
