#pragma once

// Cold-KV extension ("kvgguf"): lets an external library extend attention with
// "cold" K/V rows that live outside llama.cpp (e.g. compressed).
//
// Model: llama.cpp's own KV cache is a hot window with the most recent tokens of ONE
// sequence. Older rows have been read out (llama_kvgguf_read_rows), stored externally and
// removed with llama_memory_seq_rm. While hooks are installed, every full-attention layer
// (all layers of llama, the non-SWA layers of Gemma 3 iSWA) attends over
//     concat(cold rows [0, n_cold), hot cache cells)
// and the cold columns of the KQ mask are visible (0) to every query of the ubatch.
// The caller guarantees that all cold positions are earlier than every hot position.
//
// Rows are in the cache's layout: n_embd_{k,v}_gqa(il) = n_head_kv*head_dim elements,
// head-major, IEEE f16 bit patterns. K rows are post-RoPE (what llama.cpp caches).
// Works with flash attention on and off; CPU backend; one sequence/stream. The cells of the
// full-attention layers are f16 or q8_0 while hooks are installed (q8_0 cells are read as f16
// rows; read_rows copies them raw); the sliding-window cells may be any type llama.cpp's
// attention reads (llama_kvgguf_set_window_types).
//
// This header only adds new functions and a new struct; no existing public struct changes.

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Version of the kvgguf patch set compiled into this library; kvgguf checks it at import.
// "patch 000N" below and in src/ names the version N that added a feature (the list is in
// kvgguf/llamacpp/library.py); since 11 the patches are one per concern (patches/README.md).
#define LLAMA_KVGGUF_PATCH_VERSION 20

#define LLAMA_KVGGUF_K 0
#define LLAMA_KVGGUF_V 1

// Number of cold rows to prepend for layer `il` (0 = none). Called while a graph is
// built and again before every reuse of a cached graph, so it must be cheap and must
// return the same value for the whole duration of one llama_decode() call.
typedef int32_t (*llama_kvgguf_n_cold_fn)(void * user, int32_t il);

// Decode cold rows [row_begin, row_end) of layer `il`, kind LLAMA_KVGGUF_K/V, into `dst`
// as (row_end - row_begin) consecutive rows of n_embd f16 values (uint16 bit patterns).
// Called from ggml compute threads during llama_decode(); up to `n_threads` calls may
// run concurrently (disjoint ranges). Must not call back into llama.cpp.
// Return 0 on success; on failure the rows are zero-filled and an error is counted.
typedef int32_t (*llama_kvgguf_decode_fn)(void * user, int32_t il, int32_t kind, int64_t row_begin, int64_t row_end,
                                          uint16_t * dst, int64_t n_embd);

// (version 20) The cold rows of layer `il` that a context shift moved without rotating their
// keys again: up to `cap` runs, run i being rows [row_begin[i], row_end[i]) whose keys were
// rotated at row + shift[i]. Returns the number of runs (0: none; more than cap: only cap written),
// < 0 on error. The same rules as n_cold: cheap, unchanged during one llama_decode(). The graph
// scores a run's rows with the ubatch's queries rotated by shift[i] more, as llama.cpp's own
// shift (llama_memory_seq_add) rotates its keys: the same RoPE, the same parameters.
typedef int32_t (*llama_kvgguf_shifts_fn)(void * user, int32_t il, int32_t cap, int64_t * row_begin, int64_t * row_end,
                                          int32_t * shift);

struct llama_kvgguf_hooks {
    void *                 user;
    llama_kvgguf_n_cold_fn n_cold;
    llama_kvgguf_decode_fn decode;
    int32_t
        n_threads;  // max concurrent decode() calls; <= 0: all compute threads, 1: serialized (use 1 for Python callbacks)
    int32_t                max_rows_per_call;  // <= 0: whole per-thread range (256 for the transposed V layout)
    llama_kvgguf_shifts_fn shifts;             // (version 20) nullable: no row was ever shifted
};

LLAMA_API int32_t llama_kvgguf_patch_version(void);

// Install (copied) or remove (hooks == NULL) the hooks. Forces the next graph to be rebuilt.
// Returns 0 on success, -1 if the context cannot support cold rows (e.g. no KV cache).
LLAMA_API int32_t llama_kvgguf_set_hooks(struct llama_context * ctx, const struct llama_kvgguf_hooks * hooks);

// Layer info: returns 1 for a full-attention layer with KV (gets cold rows),
// 0 for a SWA layer with KV (never gets cold rows), -1 if the layer has no KV cache.
// n_embd_k / n_embd_v (nullable) receive n_embd_{k,v}_gqa(il).
LLAMA_API int32_t llama_kvgguf_layer_info(const struct llama_context * ctx, int32_t il, int32_t * n_embd_k,
                                          int32_t * n_embd_v);

// Copy the cached rows of layer `il` (kind K or V) for the cells of `seq_id` with positions
// in [p0, p1) (p1 < 0: no upper bound), in ascending position order, into `dst` (raw rows of the
// cache type, f16 by default: n_embd*2 bytes per row). The transposed V layout (flash attention
// off) is gathered back into rows. If pos_out != NULL it receives the position of each row.
// dst == NULL: only count. Returns the number of rows, or < 0 on error
// (-1 bad args / layer, -2 dst too small, -3 unsupported cache type / layout).
LLAMA_API int64_t llama_kvgguf_read_rows(struct llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind,
                                         llama_pos p0, llama_pos p1, void * dst, size_t dst_size, llama_pos * pos_out);

// Moves the cached cells of the full-attention cache to the front, in position order, so that
// after an eviction attention reads the hot rows in the same order as a cache that never
// wrapped around (same float summation order as stock llama.cpp). Returns 0, or -1 if the
// context has no single-stream KV cache.
LLAMA_API int32_t llama_kvgguf_compact(struct llama_context * ctx);

// (patch 0020) A context shift of llama.cpp's cells: removes the cells of seq_id at positions
// [p0, p1) (llama_memory_seq_rm), compacts the rest (llama_kvgguf_compact), moves the positions
// from p1 on back by p1 - p0 (llama_memory_seq_add) and applies that move now (the keys rotated
// by llama.cpp's own RoPE shift), so that what reads the cells next (an eviction) reads rows at
// their new positions. kvgguf shifts its own cold rows apart (kvg_store_shift). Returns 0, -1
// for bad arguments or a memory that cannot shift (llama_kvgguf_can_shift), -2 if a step failed.
LLAMA_API int32_t llama_kvgguf_shift(struct llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1);

// (patch 0020) Whether llama_kvgguf_shift can shift this context's memory: a KV cache whose
// keys llama.cpp can rotate (not M-RoPE, not recurrent), and for an iSWA memory both of its
// caches. llama_memory_can_shift also wants the sliding-window cache as large as the base one
// (swa_full): a query's window must not reach back across the cut to rows that cache dropped.
// kvgguf sizes that cache to its hot window and keeps the window off the cut itself (its
// caller shifts only where the kept front lies a window behind the rows that stay).
LLAMA_API bool llama_kvgguf_can_shift(const struct llama_context * ctx);

// Bytes of the buffers llama.cpp allocated for this context's KV cache (all layers, K and V).
LLAMA_API int64_t llama_kvgguf_kv_bytes(const struct llama_context * ctx);

// Bytes of the compute buffers the scheduler holds for this context (all backends): the
// transient scratch of a graph, cold rows expanded for attention included. The buffers grow
// to the largest graph run so far and never shrink, so this is the peak since creation.
LLAMA_API int64_t llama_kvgguf_compute_bytes(const struct llama_context * ctx);

// Fused attention over cold rows (patch 0004): fold cold rows [r0, r1) of layer il into the
// online-softmax state of n_tokens * n_head queries q (f32 [n_tokens][n_head][head_dim_k]):
// for query j, m[j] the running max of its scores (scale * q.k), l[j] the sum of exp(score - m[j])
// and acc[j*head_dim_v ...] the sum of exp(score - m[j]) * v. Query head h reads KV head
// h / (n_head / n_head_kv). Called from ggml compute threads, each with its own state, on
// disjoint row ranges. Return 0, or nonzero when some rows could not be read: those rows must
// be left out of the state (masked), the others folded in; an error is counted.
typedef int32_t (*llama_kvgguf_attend_fn)(
    void * user, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens, int32_t n_head, float scale,
    float   softcap,  // patch 0008: > 0 caps each score s to softcap*tanh(s/softcap) (Gemma 2)
    float * m, float * l, float * acc);

// Use `attend` (user = the hooks' user) for ubatches of at most max_tokens tokens: the attention
// of a layer with cold rows is then computed over the cold rows as the store holds them and
// the hot cells, without expanding the cold rows to f16. Larger ubatches (prefill) keep the
// expanding path. attend == NULL or max_tokens <= 0 turns it off. Forces a graph rebuild.
// Returns 0, or -1 without a context.
LLAMA_API int32_t llama_kvgguf_set_attend(struct llama_context * ctx, llama_kvgguf_attend_fn attend,
                                          int32_t max_tokens);

// Hot cells on the fused path (patch 0010): fold cells [c0, c1) of K and V (n_head_kv heads, of
// ggml types k_type / v_type: f16, element i of KV head hk of cell c at k + i*k_nb[0] +
// hk*k_nb[1] + c*k_nb[2] bytes, V likewise; or q8_0 (set 13), KV head hk of cell c the head's
// blocks from k + hk*k_nb[1] + c*k_nb[2]) into the same state as attend, with mask (f32, or f16
// when mask_f16; token t's row at mask + t*mask_nb1) added to the scores. Same q, scale,
// softcap, m, l, acc as attend. Return 0, or nonzero (an error is counted; the state must be
// left as it was).
typedef int32_t (*llama_kvgguf_attend_f16_fn)(const float * q, int32_t n_tokens, int32_t n_head, int32_t n_head_kv,
                                              int64_t head_dim_k, int64_t head_dim_v, const void * k, int32_t k_type,
                                              const size_t * k_nb, const void * v, int32_t v_type, const size_t * v_nb,
                                              int64_t c0, int64_t c1, const void * mask, int32_t mask_f16,
                                              size_t mask_nb1, float scale, float softcap, float * m, float * l,
                                              float * acc);

// Attend over the hot cells of the fused path with `attend_f16` (kvgguf's SIMD kernels) instead
// of llama.cpp's own loop; NULL: the loop. Forces a graph rebuild. Returns 0, or -1 without a context.
LLAMA_API int32_t llama_kvgguf_set_attend_f16(struct llama_context * ctx, llama_kvgguf_attend_f16_fn attend_f16);

// Attention mass (patch 0005): after the fused path has folded all rows of layer il into the
// states of a ubatch, `mass` receives, for each of its n_tokens * n_head queries (same order as
// attend's q), the final softmax max[j] and sum[j] over every row, cold and hot. With them the
// store turns what attend saw into each cold row's share of the softmax. Called once per layer
// and ubatch, on one thread, after every attend call of that layer has returned. Return 0, or
// nonzero to count an error.
typedef int32_t (*llama_kvgguf_mass_fn)(void * user, int32_t il, int32_t n_tokens, int32_t n_head, const float * max,
                                        const float * sum);

// Report the fused path's softmax normalizers to `mass` (user = the hooks' user); NULL turns
// it off. Forces a graph rebuild. Returns 0, or -1 without a context.
LLAMA_API int32_t llama_kvgguf_set_mass(struct llama_context * ctx, llama_kvgguf_mass_fn mass);

// The logical context (patch 0006): with cold rows, llama.cpp's cells hold only the hot window,
// but what depends on the context size must see the context the application holds. In
// llama.cpp 0c1e570 that is LongRoPE's choice of long or short rope factors (get_rope_factors).
// n_ctx = 0 goes back to llama.cpp's own n_ctx_seq. Forces a graph rebuild. Returns 0, or -1
// without a context.
LLAMA_API int32_t llama_kvgguf_set_n_ctx(struct llama_context * ctx, uint32_t n_ctx);

// How each layer's attention was built (patch 0007), recorded by every graph llama.cpp builds
// (the context reserves its graphs when it is created, so this answers before any token):
// 0 when the layer's attention never went through the KV-cache build_attn that kvgguf hooks
// (no attention, a recurrent layer, MLA's K-only cache, sparse attention, a hybrid memory),
// else LLAMA_KVGGUF_PATH_KV and any of the others. -1 for a bad context or layer.
#define LLAMA_KVGGUF_PATH_KV     1  // attention over a KV cache through the hooked build_attn
#define LLAMA_KVGGUF_PATH_SWA    2  // on the sliding-window cache: never gets cold rows
#define LLAMA_KVGGUF_PATH_EXPAND 4  // the fused path cannot take it (KQ bias, ALiBi, MLA, Grok's capping)
#define LLAMA_KVGGUF_PATH_SHARED 8  // writes no K/V of its own (reads another layer's cache)
LLAMA_API int32_t llama_kvgguf_attention_path(const struct llama_context * ctx, int32_t il);

// Number of failed decode() calls since the hooks were installed.
LLAMA_API int64_t llama_kvgguf_n_errors(const struct llama_context * ctx);

// The cache types of the sliding-window cells (llama_kv_cache_iswa's window cache) of the
// contexts this thread creates from now on (patch 0012): llama_context_params has one
// type_k / type_v for both caches and cannot grow a field without breaking the bindings.
// GGML_TYPE_COUNT (the default): the context's type_k / type_v. The window cache keeps the
// context's types where the asked ones cannot serve (a quantized V with flash attention off,
// a head dim the type's block does not divide); llama_kvgguf_layer_cells tells which it got.
// Returns 0, or -1 for a type that is not a ggml type.
LLAMA_API int32_t llama_kvgguf_set_window_types(enum ggml_type type_k, enum ggml_type type_v);

// The cells of the sliding-window cache of the contexts this thread creates from now on
// (patch 0014): n_cells, raised to the n_swa + n_ubatch cells a ring needs (n_swa for each
// sequence of a unified cache) and lowered to the full-attention cache's size. 0 (the
// default): llama.cpp's choice, the full cache's size with swa_full, else n_swa + n_ubatch
// rounded up to a multiple of 256 for its GPU kernels' sake. kvgguf evicts a position from
// every layer at once, so its window layers need no more cells than its hot window: on
// Gemma-3 608 of llama.cpp's 768.
LLAMA_API void llama_kvgguf_set_window_cells(uint32_t n_cells);

// Whether the full-attention cells of the contexts this thread creates from now on may hold
// quantized rows rotated (llama.cpp's Hadamard rotation of quantized caches, with Q rotated to
// match): 1 (the default) as llama.cpp decides, 0 never. kvgguf's store codes rows in their
// own domain (its codecs rotate where they gain, and calibrations measure unrotated rows), so
// it turns the rotation off for q8_0 hot cells. Sliding-window cells keep llama.cpp's choice.
LLAMA_API void llama_kvgguf_set_full_rotation(bool rotate);

// The cells of layer il: the ggml types of its K and V and the bytes both tensors hold, all
// streams (each nullable). Returns 0, or -1 for a bad context or a layer without cells of its
// own (KV sharing).
LLAMA_API int32_t llama_kvgguf_layer_cells(const struct llama_context * ctx, int32_t il, int32_t * type_k,
                                           int32_t * type_v, int64_t * n_bytes);

// (patch 0015) Where layer il's cells live: the name of their buffer type ("CPU", "CUDA0",
// ...) into name (nullable, cut to size with its NUL). Returns 1 for memory the host reads, 0
// for a device's, -1 for a bad context or a layer without cells of its own.
LLAMA_API int32_t llama_kvgguf_layer_buffer(const struct llama_context * ctx, int32_t il, char * name, size_t size);

// (patch 0016) Where the cells of layer il (kind K or V) for the positions [p0, p1) of seq_id
// lie, so that a library reads them in place (on a GPU: encodes them there, and the rows never
// cross to the host). Element e of the n-th of them (ascending positions) is at
//     (const char *) data + (n*row_stride + e*col_stride) * ggml_type_size(type)
// for f16/f32 cells (a transposed V: row_stride 1, col_stride the cells' count). is_host: 1 for
// memory the host reads, 0 for a device's (device: its buffer type's name, e.g. "CUDA0").
struct llama_kvgguf_cells_view {
    const void * data;
    int32_t      type;        // enum ggml_type of the cells
    int64_t      row_stride;  // in elements
    int64_t      col_stride;  // in elements
    int64_t      n_rows;
    int32_t      is_host;
    char         device[32];
};

// Fills *view and returns the number of rows: the cells of [p0, p1) (p1 < 0: no upper bound)
// must be one run of consecutive cells in position order (as llama_kvgguf_compact leaves them)
// of an unquantized type. Waits for the context's queued work first. Returns -1 for bad
// arguments or a layer without cells, -3 for quantized cells, -4 when the cells are not one
// run (llama_kvgguf_read_rows copies them then); *view is unchanged on an error.
LLAMA_API int64_t llama_kvgguf_view_cells(struct llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind,
                                          llama_pos p0, llama_pos p1, struct llama_kvgguf_cells_view * view);

// (patch 0018) llama_kvgguf_read_rows, converted to f32 as ggml converts the cells' type (f16,
// q8_0, ...): exactly p1 - p0 rows of n_embd values (K post-RoPE) for positions [p0, p1) in
// order into dst (room for dst_count floats). Returns the number of rows, or -1 bad arguments or
// a layer without cells, -2 the cells hold other rows than [p0, p1) in order, -3 a cell type or
// layout ggml cannot convert, -4 dst too small.
LLAMA_API int64_t llama_kvgguf_read_rows_f32(struct llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind,
                                             llama_pos p0, llama_pos p1, float * dst, size_t dst_count);

// (patch 0018) One list's rows of an eviction, as f32: n_rows consecutive rows of n_embd values
// (K rows post-RoPE). Called on the thread that called llama_kvgguf_evict; must not call back into
// llama.cpp. Returns 0, or nonzero to stop the eviction.
typedef int32_t (*llama_kvgguf_append_fn)(void * user, int32_t il, int32_t kind, const float * rows, int64_t n_rows,
                                          int64_t n_embd);

// (patch 0018) One eviction in one call: for each of the n_layers layers in `layers` (each with
// cells of its own) and for K then V, the rows of positions [p0, p1) of seq_id, converted to f32
// from the cells' type (f16, q8_0, ... as ggml converts them; a transposed V gathered into rows),
// go to append(user, ...); then the positions are removed (llama_memory_seq_rm) and the cells
// compacted (llama_kvgguf_compact). Returns 0, or:
//   -1 bad arguments or a layer without cells; -2 a layer holds other rows than p1 - p0 in
//   position order; -3 a cell type ggml cannot convert; -4 append returned nonzero; -5 the
//   removal failed. On these llama.cpp's cells are as they were (what append took, the caller
//   undoes: the rows of every list begin at p0).
//   -6 the compaction failed: the positions were removed, every row appended.
LLAMA_API int32_t llama_kvgguf_evict(struct llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1,
                                     const int32_t * layers, int32_t n_layers, llama_kvgguf_append_fn append,
                                     void * user);

// (patch 0019) The sequence state of seq_id restricted to its cells at positions [p0, p1), in
// llama_state_seq_get_data's layout (magic, seq_id, then each KV cache's record; a cell a sliding
// window masks is left out as there). What an eviction with prefix reuse keeps, without writing
// every cell's rows, in one pass over the cells. Returns its size in bytes, and dst holds it
// when that size is at most size (dst NULL: only the size; a smaller dst holds an unspecified
// prefix); -1 for bad arguments or a memory that is not a KV cache. Waits for the context's
// queued work first.
LLAMA_API int64_t llama_kvgguf_state_range(struct llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1,
                                           uint8_t * dst, size_t size);

// (patch 0015) The fused path on a GPU. Where a layer's cells live in CUDA memory and these
// hooks are set, its two custom ops run on that device (ggml-cuda's custom-op dispatch,
// patch 0006) instead of on the CPU: attend writes one online-softmax state over [the store's
// rows | the cells], finish the output from it. All pointers are device pointers, the work
// is queued on `stream` (a cudaStream_t) of `device`, and a nonzero return is counted in
// llama_kvgguf_n_errors. A layer supports() refuses, and every op of a context without these
// hooks, stays on the CPU path.
struct llama_kvgguf_cuda_attn {
    int32_t      il;
    int64_t      n_cold;  // the store's rows [0, n_cold) of layer il
    const void * q;       // f32: element i of head h of token t at q + i*q_nb[0] + h*q_nb[1] + t*q_nb[2]
    size_t       q_nb[3];
    int32_t      n_tokens, n_head, n_head_kv;
    int64_t      head_dim_k, head_dim_v;
    const void * k;       // the cells [0, n_kv): ggml type k_type, element i of KV head h of cell c at
    int32_t      k_type;  // k + i*k_nb[0] + h*k_nb[1] + c*k_nb[2] (q8_0: whole blocks per head)
    size_t       k_nb[3];
    const void * v;  // the same for V (a transposed V is a matter of strides)
    int32_t      v_type;
    size_t       v_nb[3];
    int64_t      n_kv;
    const void * mask;  // f32 or f16 [n_kv, >= n_tokens]: query token t's at mask + t*mask_nb1
    int32_t      mask_f16;
    size_t       mask_nb1;
    float        scale;
    float        softcap;  // 0: none
    float *      m;        // the state out: [n_tokens * n_head] in (token, head) order,
    float *      l;        //   the same,
    float *      acc;      //   [n_tokens * n_head][head_dim_v], unnormalized
};

struct llama_kvgguf_cuda_finish {
    const float * m;
    const float * l;
    const float * acc;
    int32_t       n_tokens, n_head;
    int64_t       head_dim_v;
    const float * sinks;  // f32 [n_head], or NULL
    float *       out;    // f32 [n_tokens][n_head][head_dim_v]
};

typedef int32_t (*llama_kvgguf_cuda_attend_fn)(void * user, const struct llama_kvgguf_cuda_attn * a, int32_t device,
                                               void * stream);
typedef int32_t (*llama_kvgguf_cuda_finish_fn)(void * user, const struct llama_kvgguf_cuda_finish * a, int32_t device,
                                               void * stream);
// 1 where layer il's attention can run on `device` (-1: while the graph is built, any device)
typedef int32_t (*llama_kvgguf_cuda_supports_fn)(void * user, int32_t il, int32_t device);
// (patch 0017) A number that changes whenever what attend queues for the same arguments would
// change (the store's device copy synced, its scratch grown); 0: keep the ops out of CUDA graphs.
// With it, a graph holding the ops is captured once and replayed without calling the hooks,
// until it changes; NULL: never captured (each op is launched every time, as before).
typedef uint64_t (*llama_kvgguf_cuda_generation_fn)(void * user);

struct llama_kvgguf_cuda {
    void *                          user;
    llama_kvgguf_cuda_attend_fn     attend;
    llama_kvgguf_cuda_finish_fn     finish;
    llama_kvgguf_cuda_supports_fn   supports;
    llama_kvgguf_cuda_generation_fn generation;  // (patch 0017) may be NULL
};

// Sets (a copy of) or clears (NULL) the context's GPU hooks. Returns 0; -1 for a bad context
// or a hook missing; -2 where this libllama has no CUDA backend that takes custom ops.
LLAMA_API int32_t llama_kvgguf_set_cuda(struct llama_context * ctx, const struct llama_kvgguf_cuda * cuda);

#ifdef __cplusplus
}
#endif
