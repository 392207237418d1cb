// kvg_cuda.h: libkvgguf's CUDA kernels behind a small C interface (built with -DKVGGUF_CUDA=ON).
//
// The interface a device backend offers the store: a context on a device and a stream,
// device memory, encode rows into a block of codes, decode a block, attend over coded blocks,
// and copies in and out. A Metal backend could offer the same calls.
//
// Blocks in device memory hold exactly the bytes kvg_encode writes for the same rows, codec,
// kind, shape and params (kvgguf.h's layouts): GPU encoders are meant to be byte-identical to
// the scalar reference, so a block moves between host and device unchanged. native/cuda/tests/
// cuda_check.cu checks that on a machine with a GPU.
//
// Codecs on the GPU: f16, kivi2, kivi3, kivi4, kivi8 (any head_dim) and rotq1..rotq4 (head_dim a
// power of two in [8, 4096]) for encode and decode; kvg_cuda_attend takes rotq K and V blocks.
// Anything else is refused with KVG_ERR_UNSUPPORTED (KVG_ERR_SHAPE for a head_dim) before any
// work is queued, and kvg_last_error() names the codecs the GPU runs.
//
// Every function returns a kvgguf.h status and never aborts. CUDA failures map to statuses:
// out of device memory -> KVG_ERR_NO_MEMORY; no device, no driver, or no kernel image for the
// device's architecture -> KVG_ERR_UNSUPPORTED; an invalid pointer or value -> KVG_ERR_INVALID_ARG;
// any other CUDA error (a failed launch, an illegal address) -> KVG_ERR_UNSUPPORTED as well, with
// the CUDA error's name in kvg_last_error(). kvgguf.h has no status of its own for device faults.
//
// Pointers named *_dev are device pointers (kvg_cuda_malloc, or memory llama.cpp allocated on
// the context's device). A context is used by one thread at a time.

#ifndef KVG_CUDA_H
#define KVG_CUDA_H

#include "kvgguf.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(_WIN32)
#    define KVG_CUDA_API __attribute__((visibility("default")))
#else
#    define KVG_CUDA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Element types of the rows encode reads and decode writes.
enum kvg_cuda_type {
    KVG_CUDA_F32 = 0,
    KVG_CUDA_F16 = 1  // IEEE binary16, as llama.cpp's K/V cells hold them
};

typedef struct kvg_cuda_ctx kvg_cuda_ctx;

// Devices the CUDA runtime sees: KVG_OK with 0 where there is no device or no driver.
KVG_CUDA_API int kvg_cuda_device_count(int * out_count);

// A context on `device`, queueing its work on `stream` (a cudaStream_t; NULL: a stream of its own,
// destroyed with the context). KVG_ERR_UNSUPPORTED without a device.
KVG_CUDA_API int  kvg_cuda_ctx_init(int device, void * stream, kvg_cuda_ctx ** out);
KVG_CUDA_API void kvg_cuda_ctx_free(kvg_cuda_ctx * ctx);
// Waits for the context's stream; reports a CUDA error raised by work queued earlier (attend).
KVG_CUDA_API int  kvg_cuda_sync(kvg_cuda_ctx * ctx);

// Device memory on the context's device (bytes > 0); free takes NULL.
KVG_CUDA_API int kvg_cuda_malloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out_dev);
KVG_CUDA_API int kvg_cuda_free(kvg_cuda_ctx * ctx, void * dev);
// Copies that finish before they return (a session saved or restored; a block moved).
KVG_CUDA_API int kvg_cuda_copy_in(kvg_cuda_ctx * ctx, void * dst_dev, const void * src_host, size_t bytes);
KVG_CUDA_API int kvg_cuda_copy_out(kvg_cuda_ctx * ctx, void * dst_host, const void * src_dev, size_t bytes);

// Whether the GPU encodes and decodes `type` at this head_dim: KVG_OK, or KVG_ERR_UNSUPPORTED /
// KVG_ERR_SHAPE / KVG_ERR_UNKNOWN_CODEC with kvg_last_error() naming the codecs it runs. No device
// needed: it reads what this build's kernels take.
KVG_CUDA_API int kvg_cuda_codec_supported(int type, int64_t head_dim);

// Encodes n_tokens rows into the block at dst_dev (dst_bytes >= kvg_encoded_size; exactly that many
// bytes are written). Element i of head h of token t is read at
//   src_dev[t * src_row_stride + (h * head_dim + i) * src_col_stride]   (elements of src_type),
// so rows of llama.cpp's K cells (row stride = n_embd_k_gqa or the cell stride, col stride 1)
// and its transposed V (row stride 1, col stride = the number of cells) are read in place.
// The input is checked as kvg_encode checks it: NaN or Inf -> KVG_ERR_NONFINITE, a norm, min or
// scale beyond f16 -> KVG_ERR_RANGE (dst then unspecified). Waits for the stream to learn the
// status; *out_written (may be NULL) gets the size on success.
KVG_CUDA_API int kvg_cuda_encode(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, int src_type,
                                 int64_t src_row_stride, int64_t src_col_stride, int64_t n_tokens, int64_t n_heads,
                                 int64_t head_dim, const kvg_codec_params * p, void * dst_dev, size_t dst_bytes,
                                 size_t * out_written);

// Decodes the block at src_dev (src_bytes == kvg_encoded_size) into rows of dst_type, element
// (t, h, i) written at dst_dev[t * dst_row_stride + (h * head_dim + i) * dst_col_stride]. Values are
// kvg_decode's floats bit for bit (KVG_CUDA_F16: those rounded to nearest even). Bytes no encoder
// writes -> KVG_ERR_CORRUPT, detected before anything is written (dst unchanged). Waits for the stream.
KVG_CUDA_API int kvg_cuda_decode(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, size_t src_bytes,
                                 int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
                                 void * dst_dev, int dst_type, int64_t dst_row_stride, int64_t dst_col_stride);

// Checks a block in device memory as kvg_decode would before decoding (norms, mins and scales that
// no encoder writes -> KVG_ERR_CORRUPT), without decoding: what a block copied in from a session
// file needs before attend reads it. Waits for the stream.
KVG_CUDA_API int kvg_cuda_check(kvg_cuda_ctx * ctx, int type, int kind, const void * src_dev, size_t src_bytes,
                                int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p);

// One encoded block in device memory: n_rows rows of n_head_kv heads, coded with `codec`.
typedef struct kvg_cuda_block {
    int32_t      codec;
    const void * data_dev;
    size_t       n_bytes;  // kvg_encoded_size of its shape
    int64_t      n_rows;
} kvg_cuda_block;

// Fused attention over coded rows, as kvg_store_hook_attend_capped computes it (kvgguf.h): the
// online-softmax state (m, l, acc) of n_tokens * n_head queries (q: f32 [n_tokens][n_head][head_dim_k],
// m, l: [n_tokens * n_head], acc: [n_tokens * n_head][head_dim_v], all on the device) folds in rows
// [k_row0, k_row0 + n_rows) of block k with rows [v_row0, v_row0 + n_rows) of block v. Keys are
// scored from their codes against queries rotated once per call, values summed in the rotated
// domain and transformed back once per query: no row is expanded in global memory. score =
// scale * q.k, capped to softcap * tanh(score / softcap) when softcap > 0. The caller sets m = -inf,
// l = 0, acc = 0 once; calls over consecutive runs fold into the same state.
// K and V must be rotq1..4 blocks (head dims a power of two in [8, 512]) coded with `seed`.
// Queued on the context's stream without waiting: argument errors and launch failures are
// returned, a fault while running shows at the next kvg_cuda_sync.
typedef struct kvg_cuda_attend_args {
    kvg_cuda_block k, v;
    int64_t        k_row0, v_row0, n_rows;
    int32_t        n_head_kv;
    int64_t        head_dim_k, head_dim_v;
    uint64_t       seed;      // the store's params.codec.seed (KVG_DEFAULT_SEED)
    const float *  q_dev;
    int32_t        n_tokens;
    int32_t        n_head;    // a positive multiple of n_head_kv (GQA)
    float          scale;
    float          softcap;   // 0: none
    float *        m_dev;
    float *        l_dev;
    float *        acc_dev;
} kvg_cuda_attend_args;

KVG_CUDA_API int kvg_cuda_attend(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a);

// A layer's attention on the fused path, on the GPU, is: kvg_cuda_attend_begin (the state empty),
// kvg_cuda_attend over the store's coded rows, kvg_cuda_attend_cells over llama.cpp's own cells,
// kvg_cuda_attend_finish (the output). All queued on the context's stream without waiting.

// The queries as the other calls take them, f32 [n_tokens][n_head][head_dim] at dst_dev, from a
// ggml tensor's f32 elements at any byte strides (element i of head h of token t at src_dev +
// i * nb[0] + h * nb[1] + t * nb[2]); round_f16: each rounded to f16 (to nearest even) and back,
// as llama.cpp's attention over an f16 cache takes its queries.
KVG_CUDA_API int kvg_cuda_gather_q(kvg_cuda_ctx * ctx, const void * src_dev, const size_t * nb, int64_t head_dim, int32_t n_head,
                                   int32_t n_tokens, int32_t round_f16, float * dst_dev);

// m = -inf, l = 0, acc = 0 for n_q queries of head_dim_v values.
KVG_CUDA_API int kvg_cuda_attend_begin(kvg_cuda_ctx * ctx, int64_t n_q, int64_t head_dim_v, float * m_dev, float * l_dev,
                                       float * acc_dev);

// llama.cpp's cells outside the store under a mask, folded into the state: kvg_attend_f16 (kvgguf.h)
// on the device, with the same arguments (cells [c0, c1) of ggml type k_type / v_type, f16 at any
// byte strides k_nb / v_nb, q8_0 in whole blocks per head; mask f32 or f16, NULL for none, the
// value for query token t and cell c at mask + t * mask_nb1 + c * its size; -INFINITY hides a cell,
// and a query that sees no cell keeps its state). Head dims up to 512.
typedef struct kvg_cuda_cells_args {
    const float * q_dev;  // f32 [n_tokens][n_head][head_dim_k], unscaled
    int32_t       n_tokens, n_head, n_head_kv;
    int64_t       head_dim_k, head_dim_v;
    const void *  k_dev;
    int32_t       k_type;  // enum kvg_cell_type
    size_t        k_nb[3];
    const void *  v_dev;
    int32_t       v_type;
    size_t        v_nb[3];
    int64_t       c0, c1;
    const void *  mask_dev;
    int32_t       mask_f16;
    size_t        mask_nb1;
    float         scale;
    float         softcap;  // 0: none
    float *       m_dev;
    float *       l_dev;
    float *       acc_dev;
} kvg_cuda_cells_args;

KVG_CUDA_API int kvg_cuda_attend_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * a);

// The output of each query j (caller order, head j % n_head): acc / l, with the attention sink of
// its head (sinks_dev: f32 [n_head], a logit that joins the softmax's normalizer with no value;
// NULL: none), zeros where no row reached the query. out_dev: f32 [n_tokens][n_head][head_dim_v].
typedef struct kvg_cuda_finish_args {
    const float * m_dev;
    const float * l_dev;
    const float * acc_dev;
    int32_t       n_tokens, n_head;
    int64_t       head_dim_v;
    const float * sinks_dev;
    float *       out_dev;
} kvg_cuda_finish_args;

KVG_CUDA_API int kvg_cuda_attend_finish(kvg_cuda_ctx * ctx, const kvg_cuda_finish_args * a);

#ifdef __cplusplus
}
#endif

#endif  // KVG_CUDA_H
