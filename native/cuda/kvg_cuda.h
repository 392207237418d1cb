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
// power of two in [8, 4096]) for encode and decode; kvg_cuda_attend takes each of K and V as f16,
// kivi or rotq (rotq up to head_dim 512), in any mix.
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

// cffi-cuda-begin (kvgguf/bindings/cuda_store.py gives cffi the regions so marked, KVG_CUDA_API dropped)
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
// Free and total bytes of `device`'s memory (cudaMemGetInfo): what the process and every other
// one left; benchmarks/live_cache.py measures a run's VRAM with it.
KVG_CUDA_API int kvg_cuda_mem_info(int device, size_t * out_free, size_t * out_total);
// cffi-cuda-end
// Queues the context's work on `stream` from now on (a cudaStream_t of the context's device:
// llama.cpp's, for the calls of one op); returns the stream it used before, to put back.
KVG_CUDA_API void * kvg_cuda_ctx_set_stream(kvg_cuda_ctx * ctx, void * stream);
// The context's device (-1 for NULL).
KVG_CUDA_API int kvg_cuda_ctx_device(const kvg_cuda_ctx * ctx);
// Waits for the context's stream; reports a CUDA error raised by work queued earlier (attend).
KVG_CUDA_API int kvg_cuda_sync(kvg_cuda_ctx * ctx);

// Device memory on the context's device (bytes > 0); free takes NULL.
KVG_CUDA_API int kvg_cuda_malloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out_dev);
KVG_CUDA_API int kvg_cuda_free(kvg_cuda_ctx * ctx, void * dev);
// Copies that finish before they return (a session saved or restored; a block moved).
KVG_CUDA_API int kvg_cuda_copy_in(kvg_cuda_ctx * ctx, void * dst_dev, const void * src_host, size_t bytes);
KVG_CUDA_API int kvg_cuda_copy_out(kvg_cuda_ctx * ctx, void * dst_host, const void * src_dev, size_t bytes);
KVG_CUDA_API int kvg_cuda_copy_dev(kvg_cuda_ctx * ctx, void * dst_dev, const void * src_dev, size_t bytes);

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

// kvg_cuda_encode's arguments, for kvg_cuda_encode_batch.
typedef struct kvg_cuda_encode_job {
    int              type, kind;
    const void *     src_dev;
    int              src_type;
    int64_t          src_row_stride, src_col_stride;
    int64_t          n_tokens, n_heads, head_dim;
    kvg_codec_params params;
    void *           dst_dev;
    size_t           dst_bytes;
} kvg_cuda_encode_job;

// n encodes queued back to back, with one wait at the end instead of one each (an eviction codes
// every layer's K and V): the same bytes and the same checks as kvg_cuda_encode, job by job. On a
// failure, the first failing job's status and message as kvg_cuda_encode gives them, its index in
// *out_failed (may be NULL; -1 on success); what the jobs before it wrote stays written.
KVG_CUDA_API int kvg_cuda_encode_batch(kvg_cuda_ctx * ctx, const kvg_cuda_encode_job * jobs, int64_t n,
                                       int64_t * out_failed);

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
// scored from their codes (rotq's against queries rotated once per call), values summed (rotq's in
// the rotated domain, transformed back once per query): no row is expanded in global memory.
// score = scale * q.k, capped to softcap * tanh(score / softcap) when softcap > 0. The caller sets
// m = -inf, l = 0, acc = 0 once; calls over consecutive runs fold into the same state.
// K and V are each rotq1..4 (head dim a power of two in [8, 512], coded with `seed`), kivi2, kivi3,
// kivi4 or kivi8 (groups of group_size) or f16 (head dims up to 512), in any mix.
// Queued on the context's stream without waiting: argument errors and launch failures are
// returned, a fault while running shows at the next kvg_cuda_sync.
typedef struct kvg_cuda_attend_args {
    kvg_cuda_block k, v;
    int64_t        k_row0, v_row0, n_rows;
    int32_t        n_head_kv;
    int64_t        head_dim_k, head_dim_v;
    uint64_t       seed;        // the store's params.codec.seed (KVG_DEFAULT_SEED)
    int32_t        group_size;  // the store's params.codec.group_size (kivi; 0: KVG_DEFAULT_GROUP_SIZE)
    const float *  q_dev;
    int32_t        n_tokens;
    int32_t        n_head;  // a positive multiple of n_head_kv (GQA)
    float          scale;
    float          softcap;  // 0: none
    float *        m_dev;
    float *        l_dev;
    float *        acc_dev;
} kvg_cuda_attend_args;

KVG_CUDA_API int kvg_cuda_attend(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a);

// A layer's attention on the fused path, on the GPU, is: kvg_cuda_attend_pass over the store's
// coded rows and llama.cpp's own cells into a fresh state (gathering the queries itself, as
// kvg_cuda_gather_q would), then kvg_cuda_attend_finish (the output). All queued on the context's
// stream without waiting.

// The queries as the other calls take them, f32 [n_tokens][n_head][head_dim] at dst_dev, from a
// ggml tensor's f32 elements at any byte strides (element i of head h of token t at src_dev +
// i * nb[0] + h * nb[1] + t * nb[2]); round_f16: each rounded to f16 (to nearest even) and back,
// as llama.cpp's attention over an f16 cache takes its queries.
KVG_CUDA_API int kvg_cuda_gather_q(kvg_cuda_ctx * ctx, const void * src_dev, const size_t * nb, int64_t head_dim,
                                   int32_t n_head, int32_t n_tokens, int32_t round_f16, float * dst_dev);

// m = -inf, l = 0, acc = 0 for n_q queries of head_dim_v values.
KVG_CUDA_API int kvg_cuda_attend_begin(kvg_cuda_ctx * ctx, int64_t n_q, int64_t head_dim_v, float * m_dev,
                                       float * l_dev, float * acc_dev);

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

// A layer's attention over several parts in one pass: runs of coded rows (kvg_cuda_attend's
// arguments) and cells (kvg_cuda_attend_cells'), in any number and order, folded into one state with
// one merge at the end, instead of a merge per call: what the calls one after the other compute,
// in another order of float sums. Every part's q_dev, n_tokens, n_head, n_head_kv, head dims,
// scale, softcap and state pointers must be the pass's; the runs' seed one seed. fresh: the state
// is written, not read (no kvg_cuda_attend_begin first; with no part, it is emptied); else the
// parts fold into the state as it is. Checked whole before anything is queued: a part that one call
// would refuse fails the pass, with that call's message, and leaves the state as it was.
typedef struct kvg_cuda_part {
    const kvg_cuda_attend_args * run;    // coded rows, or NULL
    const kvg_cuda_cells_args *  cells;  // cells, where run is NULL
} kvg_cuda_part;

typedef struct kvg_cuda_pass_args {
    const kvg_cuda_part * parts;
    int32_t               n_parts;
    int64_t               n_q;  // n_tokens * n_head
    int64_t               head_dim_v;
    float *               m_dev;
    float *               l_dev;
    float *               acc_dev;
    int32_t               fresh;
    // Optional: the queries as llama.cpp holds them (f32, element i of head h of token t at q_src +
    // i * q_nb[0] + h * q_nb[1] + t * q_nb[2]). The pass gathers them into q_dst, rounded to f16 as
    // kvg_cuda_gather_q(..., round_f16 = 1) does, in the kernel that scales and rotates them; every
    // part's q_dev must then be q_dst. NULL: the parts' q_dev hold the queries already.
    const void * q_src;
    size_t       q_nb[3];
    float *      q_dst;
} kvg_cuda_pass_args;

KVG_CUDA_API int kvg_cuda_attend_pass(kvg_cuda_ctx * ctx, const kvg_cuda_pass_args * p);

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

// ---- A store's coded blocks on the device (kvg_cuda_store.c) --------------------------------
//
// A copy of a kvg_store's blocks in device memory, byte for byte, for attention on the GPU. The
// host store stays the store: every change goes through kvgguf.h's calls (append, retier,
// truncate, a session restored), then kvg_cuda_store_sync brings the copy up to date, copying in
// only blocks it does not hold yet (each block has an id that changes with its bytes).
// llama.cpp's CUDA op calls the three hooks below with the kvg_cuda_store as `user`.

// cffi-cuda-begin
typedef struct kvg_cuda_store kvg_cuda_store;

// An empty copy of host's blocks on ctx's device. The copy owns ctx from then on (freed with it)
// and reads host, which must outlive it. Every layer is on; kvg_cuda_store_set_layer turns one off.
KVG_CUDA_API int  kvg_cuda_store_init(kvg_cuda_ctx * ctx, const kvg_store * host, kvg_cuda_store ** out);
KVG_CUDA_API void kvg_cuda_store_free(kvg_cuda_store * d);
// Whether layer il's attention runs on the GPU (hook_supports); an off layer's blocks are freed at
// the next sync, and llama.cpp then runs that layer's op on the CPU, through the host store.
KVG_CUDA_API int kvg_cuda_store_set_layer(kvg_cuda_store * d, int32_t il, int32_t on);
// Makes the copy hold host's blocks as they are now, and waits for the copies. All or nothing: on
// a failure (out of device memory) the copy keeps what it held, marked stale, and attend leaves
// the store's rows out (counted as failed reads) until a sync succeeds.
KVG_CUDA_API int kvg_cuda_store_sync(kvg_cuda_store * d);
// Encodes n_rows rows on the device (kvg_cuda_encode: the bytes the CPU's encoders write) and appends
// them to list (il, kind) of the host store, as kvg_store_append_encoded does: the rows never reach
// the host, only their codes, and the next sync takes the block from the device. Element i of head h
// of row t is read at src_dev[t * row_stride + (h * head_dim + i) * col_stride] (elements of
// src_type), so llama.cpp's cells are read in place (a transposed V too). All or nothing.
KVG_CUDA_API int kvg_cuda_store_encode(kvg_cuda_store * d, int32_t il, int32_t kind, int32_t tier, int32_t codec,
                                       const void * src_dev, int src_type, int64_t row_stride, int64_t col_stride,
                                       int64_t n_rows);
// One list's rows for kvg_cuda_store_encode_many: kvg_cuda_store_encode's arguments.
typedef struct kvg_cuda_store_item {
    int32_t      il, kind, tier, codec;
    const void * src_dev;
    int32_t      src_type;
    int64_t      row_stride, col_stride, n_rows;
} kvg_cuda_store_item;
// kvg_cuda_store_encode for n lists (an eviction: every GPU layer's K and V) with one wait for the
// device instead of two each, and one allocation. Appended in order; on a failure the items before
// it stay appended (the caller cuts the store back), the failing one and those after it do not.
KVG_CUDA_API int kvg_cuda_store_encode_many(kvg_cuda_store * d, const kvg_cuda_store_item * items, int64_t n);
// Device memory held: the segments (the blocks, with room to grow) and the blocks coded since the
// last sync; the scratch of the queries and of attend's splits.
KVG_CUDA_API int kvg_cuda_store_bytes(const kvg_cuda_store * d, uint64_t * out_blocks, uint64_t * out_scratch);
// How often llama.cpp called hook_attend and hook_finish: where a layer's ops ran on the GPU.
KVG_CUDA_API int kvg_cuda_store_calls(const kvg_cuda_store * d, uint64_t * out_attend, uint64_t * out_finish);

// One layer's attention on the fused path, as llama.cpp's CUDA op hands it over (the patched
// llama.cpp's struct llama_kvgguf_cuda_attn, field for field). Everything is on the device.
typedef struct kvg_cuda_layer_args {
    int32_t      il;
    int64_t      n_cold;  // the store's rows [0, n_cold) of layer il
    const void * q_dev;   // f32: element i of head h of token t at q_dev + i*q_nb[0] + h*q_nb[1] + t*q_nb[2]
    size_t       q_nb[3];
    int32_t      n_tokens, n_head, n_head_kv;
    int64_t      head_dim_k, head_dim_v;
    const void * k_dev;  // llama.cpp's cells [0, n_kv), as kvg_cuda_cells_args takes them
    int32_t      k_type;
    size_t       k_nb[3];
    const void * v_dev;
    int32_t      v_type;
    size_t       v_nb[3];
    int64_t      n_kv;
    const void * mask_dev;  // f32 or f16 [n_kv, >= n_tokens], NULL: none
    int32_t      mask_f16;
    size_t       mask_nb1;
    float        scale;
    float        softcap;  // 0: none
    float *      m_dev;    // the state out: [n_tokens * n_head], queries in (token, head) order
    float *      l_dev;
    float *      acc_dev;  // [n_tokens * n_head][head_dim_v]
} kvg_cuda_layer_args;

// The state of layer il's queries over [the store's rows | llama.cpp's cells], on `stream` of
// `device` (llama.cpp's): one pass (kvg_cuda_attend_pass) over a part per run of blocks and the
// cells, into a fresh state, the queries gathered by it and rounded to f16 as the CPU's fused path
// takes them.
// Rows that cannot be read (a stale copy, a codec the GPU does not attend)
// are left out, as if masked, counted in host's kvg_store_read_failures(KVG_READ_ATTEND), and the
// status says why; the cells are attended all the same. Queued without waiting.
KVG_CUDA_API int32_t kvg_cuda_store_hook_attend(void * user, const kvg_cuda_layer_args * a, int32_t device,
                                                void * stream);
// The output from that state (kvg_cuda_attend_finish), on `stream`.
KVG_CUDA_API int32_t kvg_cuda_store_hook_finish(void * user, const kvg_cuda_finish_args * a, int32_t device,
                                                void * stream);
// 1 where layer il's attention runs on the GPU of `device` (-1: any of the copy's), else 0.
KVG_CUDA_API int32_t kvg_cuda_store_hook_supports(void * user, int32_t il, int32_t device);
// A number that changes whenever what hook_attend queues for the same arguments would change: a
// sync that changed the copy, a layer turned off or on, the queries' or the context's scratch grown
// (llama.cpp's CUDA graphs are captured again when it changes). 0 where KVGGUF_CUDA_GRAPHS=0 was set
// when the copy was made: the ops then stay out of CUDA graphs.
KVG_CUDA_API uint64_t kvg_cuda_store_hook_generation(void * user);
// cffi-cuda-end

#ifdef __cplusplus
}
#endif

#endif  // KVG_CUDA_H
