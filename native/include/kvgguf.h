// kvgguf.h: the public C API of libkvgguf, the KV-cache codec library of kvgguf.
//
// Codecs are stateless: a block of K or V rows goes in as float32 and comes out as bytes,
// and back. The bytes carry no header: the caller keeps the codec type, kind (K or V), shape and
// params and passes the same ones to kvg_decode.
//
// A block is float32 [n_tokens][n_heads][head_dim], row-major: one row per token, as
// llama.cpp stores its K/V rows (n_embd_k_gqa = n_heads * head_dim floats). Below,
// C = n_heads * head_dim is the number of channels of a row and N = n_tokens * C.
//
// Every function that can fail returns an int status: KVG_OK (0) or a negative KVG_ERR_*.
// kvg_strerror() explains a status and kvg_last_error() gives the detail of the last failure
// on the calling thread. The library never aborts on the input it is given.
// Encode and decode may be called concurrently from several threads.
//
// Encoded layouts (all multi-byte fields little-endian, f16 = IEEE 754 binary16):
//
//   f16    N f16 values in row order (round to nearest even). 16 bits per value.
//
//   kiviB  (B = 2, 3, 4, 8; KIVI, Liu et al. 2024, arXiv:2402.02750)
//          [groups: n_groups x {f16 min, f16 scale}] [codes: ceil(N*B/8) bytes]
//          kind K:     one group per channel per G consecutive tokens (the last token group
//                      may be shorter); group index = (t / G) * C + c.
//          kind V:     one group per token per G consecutive channels of its row (the last
//                      channel group may be shorter); group index = t * ceil(C / G) + c / G.
//          value = min + code * scale, code in [0, 2^B - 1].
//          Bits per value: B + 32/G for full groups (plus < 1 byte of tail padding).
//
//   rotqB  (B = 1..4; TurboQuant, Zandieh et al. 2025, arXiv:2504.19874)
//          [norms: n_tokens * n_heads f16 L2 norms, index t * n_heads + h]
//          [codes: ceil(N*B/8) bytes]
//          Each head vector x (head_dim a power of two in [2, 4096]) is stored as its L2
//          norm n (f16, round to nearest) and the Lloyd-Max codes of y = W(s * x) / n, where
//          s are random signs derived from params.seed and W is the unnormalized Walsh-Hadamard
//          transform (Sylvester order, W W = head_dim I), so y has unit variance per coordinate.
//          Decode: x' = s * W(c) * n / head_dim, c the codebook values (kvg_rotq_codebook);
//          n = 0 decodes to zeros. Bits per value: B + 16/head_dim.
//          Sign of coordinate i: negative iff bit 63 of
//          splitmix64_mix(seed + (i + 1) * 0x9E3779B97F4A7C15) is set.
//
//   pq2, vq8  [norms: n_tokens * n_heads f16, as rotq] [codes: one byte per sub-vector of S
//          coordinates of y (rotq's y), vector-major: n_tokens * n_heads * head_dim / S bytes]
//          S = 4 (pq2) or head_dim (vq8). Decode: c = the centroids book[code] side by side,
//          x' = s * W(c) * n / head_dim. The codebook is not in the block (params.book).
//          Bits per value: 8 / S + 16 / head_dim, plus the codebook's 256 * S floats per
//          (layer, kind) the store holds.
//   vq8f   vq8's bytes, then [mask: ceil(n_tokens * n_heads / 8) bytes, bit v (LSB first) set
//          for a head vector kept in f16] [fallback: F = ceil(n_tokens * n_heads / 32) vectors of
//          head_dim f16, y itself, in vector order]. Exactly F bits are set: the F vectors with
//          the largest ||y - book[code]|| (ties: the lower index). Decode takes y for them in
//          place of the centroid. Bits per value: vq8's + 1/head_dim + 16/32 (about 0.52 more).
//
//   wfqB   (B = 2, 3, 4) per head vector, vector index v = t * n_heads + h:
//          [f16 gain][codes: ceil((B * head_dim - 16) / 8) bytes, zero-padded]
//          The plan (params.book) gives, per head and position i, a source coordinate perm_i,
//          a scale sigma_i > 0 and a bit width b_i (0..8, sum B * head_dim - 16); positions of
//          one width that follow each other form a set. Codes are packed position by position
//          (b_i bits each, LSB first). Decode: z = the Gaussian Lloyd-Max levels of the codes,
//          u = M_g^T z per set of g positions (M_g a fixed random orthogonal matrix per size),
//          x'[perm_i] = gain * sigma_i * u_i. head_dim in [16, 512]. Bits per value: B, plus
//          the plan's 3 * head_dim floats per (layer, kind, KV head) the store holds.
//
//   tcqB   (B = 2, 3, 4) rotq's layout: [norms] [codes], the same norms and y. The codes are a
//          bitshift trellis code of y: value i of a head vector reads the 8 bits of the
//          stream that end with its own B bits (bits [e*B + B - 8, e*B + B), those before the
//          vector's first bit read as 0) as a window w, bit j of w being stream bit start + j,
//          and takes level[w] (kvg_tcq_levels: 256 per B). Decode: x' = s * W(c) * n / head_dim
//          as rotq. The encoder picks each vector's codes by a Viterbi search over the windows.
//          Bits per value: B + 16/head_dim.
//
//   codes  One contiguous bitstream per block: the code of element e = (t*n_heads + h)*head_dim + i
//          occupies bits [e*B, e*B + B) of the stream, bit k of the stream being bit (k % 8)
//          of byte k / 8. The final byte is zero-padded.

#ifndef KVGGUF_H
#define KVGGUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The region between cffi-begin and cffi-end is read verbatim by kvgguf/bindings/binding.py as the
// cffi cdef: plain declarations only (no macros, attributes or preprocessor lines).

// cffi-begin

enum kvg_status {
    KVG_OK                = 0,
    KVG_ERR_INVALID_ARG   = -1,  // NULL pointer, bad kind, bad params, bad SIMD level
    KVG_ERR_UNKNOWN_CODEC = -2,  // codec type or name not in the table
    KVG_ERR_SHAPE         = -3,  // non-positive or overflowing dims, or a shape the codec cannot take
    KVG_ERR_BUFFER_SIZE   = -4,  // a buffer is too small or not exactly the size required
    KVG_ERR_NONFINITE     = -5,  // NaN or Inf in the input
    KVG_ERR_CORRUPT       = -6,  // encoded bytes that no encoder writes (bad norm or scale)
    KVG_ERR_NO_MEMORY     = -7,  // allocation failed
    KVG_ERR_RANGE         = -8,  // a value, scale or norm does not fit in f16 (|x| > 65504)
    KVG_ERR_UNSUPPORTED   = -9   // the CPU or this build lacks the requested SIMD level
};

// Append-only: the values are stored with encoded data.
enum kvg_codec_type {
    KVG_CODEC_F16   = 0,
    KVG_CODEC_KIVI2 = 1,
    KVG_CODEC_KIVI3 = 2,
    KVG_CODEC_KIVI4 = 3,
    KVG_CODEC_KIVI8 = 4,
    KVG_CODEC_ROTQ1 = 5,
    KVG_CODEC_ROTQ2 = 6,
    KVG_CODEC_ROTQ3 = 7,
    KVG_CODEC_ROTQ4 = 8,
    // rotq of the residual after subtracting each channel's mean over 128-token groups (f16)
    KVG_CODEC_CROTQ2 = 9,
    KVG_CODEC_CROTQ3 = 10,
    KVG_CODEC_CROTQ4 = 11,
    // Codecs from the literature with side data per block (docs/codecs.md), each self-contained:
    // keyframe every 64 rows in f16 + 4-bit residuals against it (TSC part I)
    KVG_CODEC_DELTA4 = 12,
    // the same, residual against the previous row's reconstruction (predictive, closed loop)
    KVG_CODEC_PDELTA4 = 13,
    // the block's highest-energy channels of each head in f16, the rest through rotq
    KVG_CODEC_OUTL2 = 14,
    KVG_CODEC_OUTL3 = 15,
    // rotq plus a rank-4 f16 correction of the block's residual
    KVG_CODEC_LOWRANK2 = 16,
    KVG_CODEC_LOWRANK3 = 17,
    // rotq at one bit less plus a 1-bit QJL sign sketch of the residual (TurboQuant-prod)
    KVG_CODEC_QJL3 = 18,
    KVG_CODEC_QJL4 = 19,
    // rotq's rotation and norm, then one byte per sub-vector: the nearest of 256 centroids of a
    // codebook trained per (layer, kind) (params.book; the store trains and keeps it):
    // pq2 codes sub-vectors of 4 coordinates (2 bits per value; TurboQuant++'s PQ),
    KVG_CODEC_PQ2 = 20,
    // vq8 the whole head vector (8 bits per head vector; TSC part II's VQ)
    KVG_CODEC_VQ8 = 21,
    // vq8 with TSC part II's fp16 fallback: per block, the 1/32 of head vectors vq8 codes worst
    // are kept in f16 instead (rotated), flagged in a bitmask
    KVG_CODEC_VQ8F = 22,
    // water-filled quantization (classic transform coding; docs/results/quality.md): bits per coordinate by its energy, equal-bit sets
    // mixed, Gaussian Lloyd-Max levels; B bits per value held; the plan per (layer, kind) is
    // params.book (the store fits it on the first block it codes: kvg_wfq_train)
    KVG_CODEC_WFQ2 = 23,
    KVG_CODEC_WFQ3 = 24,
    KVG_CODEC_WFQ4 = 25,
    // rotq's rotation and norm, then a bitshift trellis code (TCQ / QTIP; docs/results/quality.md): B bits per value of a
    // stream in which value i is the level of the 8-bit window ending with its own B bits
    // (bits before a vector's first read as 0; levels: 256 trained per B, tcq_tables.h);
    // B + 16/head_dim bits per value, as rotq
    KVG_CODEC_TCQ2 = 26,
    KVG_CODEC_TCQ3 = 27,
    KVG_CODEC_TCQ4 = 28
};

// Which rows a block holds; the store, the codecs and llama.cpp's hooks use the same numbers.
enum kvg_kind { KVG_KIND_K = 0, KVG_KIND_V = 1 };

// Bumped whenever a declaration in this region changes; kvg_abi_version() returns the value the
// library was built with, and the Python binding refuses a library and header that disagree.
enum kvg_abi { KVG_ABI_VERSION = 19 };

enum kvg_simd {
    KVG_SIMD_SCALAR = 0,
    KVG_SIMD_AVX2   = 1,  // x86-64 with AVX2, FMA and F16C
    KVG_SIMD_NEON   = 2   // AArch64 (Advanced SIMD is part of the base ISA)
};

typedef struct kvg_codec_params {
    int32_t       group_size;  // kivi: G, tokens (K) or channels (V) per group; default 32
    uint64_t      seed;        // rotq: seed of the random signs; default KVG_DEFAULT_SEED
    const float * book;        // pq2, vq8, vq8f: the codebook, [256][S] floats (S = 4, or head_dim for vq8/vq8f);
                               // wfqB: the plan, n_heads x 3 x head_dim floats (kvg_wfq_train); default NULL
    size_t book_count;         // floats at book
} kvg_codec_params;

int32_t kvg_abi_version(void);  // KVG_ABI_VERSION as compiled into the library

const char * kvg_strerror(int status);
// Detail of the last failure on the calling thread ("" if none); valid until the next call.
const char * kvg_last_error(void);

void kvg_codec_default_params(kvg_codec_params * out);

int          kvg_codec_count(void);
const char * kvg_codec_name(int type);  // NULL if out of range
int          kvg_codec_from_name(const char * name, int * out_type);
int          kvg_codec_bits(int type, int * out_bits);  // bits per code (16 for f16)

// ---- what a codec is: the facts of its row in the library's table (kvg_codec_describe) ----

// What params.book must hold for a codec.
enum kvg_book {
    KVG_BOOK_NONE     = 0,
    KVG_BOOK_CODEBOOK = 1,  // pq2, vq8, vq8f: 256 centroids of S coordinates (kvg_pq_train)
    KVG_BOOK_PLAN     = 2   // wfqB: a plan per KV head (kvg_wfq_train)
};

// Bits of kvg_codec_info.simd_ops.
enum kvg_codec_op {
    KVG_OP_ENCODE     = 1,
    KVG_OP_DECODE     = 2,
    KVG_OP_SCORE      = 4,  // fused attention: scores of queries against the coded keys
    KVG_OP_ACCUMULATE = 8   // fused attention: weighted sums of the coded values
};

typedef struct kvg_codec_info {
    const char * name;
    const char * family;   // the name without its bit width ("rotq3": "rotq"; "vq8f" is its own)
    int32_t      bits;     // the B of the name: bits per code (f16: 16; vq8 and vq8f: 8 per head vector)
    int32_t      rotated;  // 1: coded as rotq's rotated head vectors, which the fused attention scores
                           // against rotated queries (rotq, crotq, pq/vq, tcq); outl, lowrank and qjl
                           // rotate inside their blocks but are read decoded (0)
    int32_t book;          // enum kvg_book
    // head_dim must be at least head_dim_min, at most head_dim_max (0: no bound of its own) and a
    // power of two if head_dim_pow2; kvg_encoded_size says KVG_ERR_SHAPE otherwise.
    int32_t head_dim_pow2;
    int64_t head_dim_min;
    int64_t head_dim_max;
    // Bits per value of a long sequence in whole groups:
    //   value_bits + vector_bits / head_dim + group_bits / G,
    // G = group_values, or params.group_size where group_values is 0 (kivi). A codec with
    // block_side_data keeps data per block whose share depends on the block's shape (keyframes,
    // channel lists, factors, fallback vectors): its figure is a block's, measured, and the
    // terms above count its codes alone.
    int32_t value_bits;   // per value: its code (0 where a code stands for a whole head vector)
    int32_t vector_bits;  // per head vector: its f16 norm (rotq), vq8's code
    int32_t group_bits;   // per group: kivi's f16 min and scale, crotq's f16 channel mean
    int32_t group_values;
    int32_t block_side_data;
    int32_t fused_codes;  // 1: the fused attention scores and sums the codes themselves; 0: it
                          // decodes each block and takes exact dots of the rows
    int32_t simd_levels;  // bit (1 << level) per enum kvg_simd level with kernels for the codec:
                          // scalar always; AVX2 and NEON together (every SIMD kernel has both)
    int32_t simd_ops;     // enum kvg_codec_op bits: the operations that have SIMD kernels
} kvg_codec_info;

// KVG_ERR_UNKNOWN_CODEC for a type out of range. The strings are the library's, never freed.
int kvg_codec_describe(int type, kvg_codec_info * out);

int kvg_encoded_size(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     const kvg_codec_params * p, size_t * out_bytes);

// src_count must be n_tokens*n_heads*head_dim; dst_bytes >= kvg_encoded_size. On success
// exactly kvg_encoded_size bytes are written and *out_written (may be NULL) is set to that.
// On failure the contents of dst are unspecified. p may be NULL for the defaults.
int kvg_encode(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, const kvg_codec_params * p, void * dst, size_t dst_bytes, size_t * out_written);

// src_bytes must equal kvg_encoded_size; dst_count must be n_tokens*n_heads*head_dim.
// Corrupt input is detected before anything is written, so dst is unchanged on failure.
int kvg_decode(int type, int kind, const void * src, size_t src_bytes, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, const kvg_codec_params * p, float * dst, size_t dst_count);

// Trains a pq2, vq8 or vq8f codebook (book_count = 256 * S floats) on a block of rows: k-means on the
// rotated, normalized sub-vectors (at most 65536 of them, evenly strided), 10 iterations from
// evenly spaced samples. Deterministic. KVG_ERR_INVALID_ARG if every vector is zero.
int kvg_pq_train(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
                 int64_t head_dim, const kvg_codec_params * p, float * book, size_t book_count);

// Fits a wfq2, wfq3 or wfq4 plan (book_count = n_heads * 3 * head_dim floats) on a block of rows:
// per KV head, each coordinate's mean energy, bits by reverse water-filling (at least 1, at most
// 8, B * head_dim - 16 in all), positions ordered by bits. Deterministic.
int kvg_wfq_train(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
                  int64_t head_dim, const kvg_codec_params * p, float * book, size_t book_count);

// The 2^bits centroids (ascending) that rotq uses for head_dim, in units of y above.
int kvg_rotq_codebook(int bits, int64_t head_dim, float * out, size_t out_count);

// The 256 levels (by window) that tcqB uses, in units of y above; out_count must be 256.
int kvg_tcq_table(int bits, float * out, size_t out_count);

int kvg_simd_level(void);           // the level in use: KVG_SIMD_SCALAR, _AVX2 or _NEON
int kvg_simd_max_level(void);       // the best level this CPU and build support
int kvg_set_simd_level(int level);  // process-wide; for tests and benchmarks

// ---- store: compressed K/V rows of one sequence, per layer, in tiers -------------------------
//
// Rows of a (layer, kind) are numbered from 0 in position order and held in blocks, each
// encoded with one codec and tagged with a tier. Appends go to the end; retier re-encodes
// whole blocks in place (warm -> archive as rows age); truncate drops rows from the end.
// Every mutation is all or nothing: on failure the store is exactly as it was (every layer
// and kind), and kvg_last_error() says why.
// Mutations must not run concurrently with anything else; reads (decode, the hook entry
// points) may run on many threads at once: they take no locks.

typedef struct kvg_store kvg_store;

enum kvg_tier {
    KVG_TIER_SINK    = 0,  // attention sinks: the first tokens, kept exact
    KVG_TIER_WARM    = 1,
    KVG_TIER_ARCHIVE = 2,
    KVG_TIER_COUNT   = 3
};

typedef struct kvg_store_params {
    int32_t          n_layer;  // layers addressed by llama.cpp's il in [0, n_layer)
    int32_t          n_head_kv;
    int32_t          head_dim_k;
    int32_t          head_dim_v;
    kvg_codec_params codec;
} kvg_store_params;

void kvg_store_default_params(kvg_store_params * out);
int  kvg_store_init(const kvg_store_params * p, kvg_store ** out);
void kvg_store_free(kvg_store * s);

// A disabled layer holds no rows and reports none (Gemma 3's sliding-window layers).
int kvg_store_set_layer_enabled(kvg_store * s, int32_t il, int32_t enabled);

// Encodes n_rows rows (count = n_rows * n_head_kv * head_dim floats) at the end of (il, kind).
int kvg_store_append(kvg_store * s, int32_t il, int32_t kind, int32_t tier, int32_t codec, const float * rows,
                     size_t count, int64_t n_rows);

int kvg_store_n_rows(const kvg_store * s, int32_t il, int32_t kind, int64_t * out_rows);

// Decodes rows [r0, r1) of (il, kind) into dst (count = (r1 - r0) * row width).
int kvg_store_decode(const kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, float * dst, size_t count);
int kvg_store_decode_f16(const kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, uint16_t * dst,
                         size_t count);

// Every layer and kind: re-encodes each block that lies wholly inside [r0, r1) and is not
// already in `tier` with `codec`; a block already in `codec` is only retagged (its bytes stay:
// coding them again would cost time and add a second rounding), and rotq into rotq is coded from
// the codes. Fails before changing anything if a block straddles r0 or r1.
int kvg_store_retier(kvg_store * s, int64_t r0, int64_t r1, int32_t tier, int32_t codec);
// The same for one layer (il = -1: every layer) and one kind (kind = -1: K and V): per-layer,
// per-kind plans age each list into its own codec.
int kvg_store_retier_list(kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, int32_t tier, int32_t codec);

// Each list into its own codec: list il * 2 + kind gets codecs[il * 2 + kind] (-1: left as it
// is); n_codecs must be 2 * n_layer. What one eviction's aging needs in one call.
int kvg_store_retier_lists(kvg_store * s, int64_t r0, int64_t r1, int32_t tier, const int32_t * codecs,
                           size_t n_codecs);

// Threads a retier may re-encode lists on at once (1 to 64; 1 when the store is made). The bytes
// are the same whatever the count: each list is coded by one thread, as one thread codes it.
int kvg_store_set_threads(kvg_store * s, int32_t n_threads);

// Every layer and kind: keeps rows [0, n_rows). A block cut in two is re-encoded (a rotq block's
// codes are copied); a cut on a block boundary (undoing appends) allocates nothing and cannot fail.
int  kvg_store_truncate(kvg_store * s, int64_t n_rows);
void kvg_store_clear(kvg_store * s);

// A context shift: drops rows [p0, p1) of every layer and kind, and moves the rows after them back
// by p1 - p0 with their codes as they are (native/src/store/shift.c). p0 and min(p1, the list's
// rows) must start blocks (or end the list) in every list that holds rows past p0; anything else
// is refused and changes nothing. A moved block's keys stay rotated at the positions they had:
// kvg_store_hook_shifts reports them, and the attention rotates its queries to match.
int kvg_store_shift(kvg_store * s, int64_t p0, int64_t p1);

// Sets the shift of layer il's blocks (K and V) in rows [r0, r1) to `shift`: what a restored
// session's blocks had (kvg_store_hook_shifts reports it). r0 and r1 must start blocks (or end
// the list) in both lists; anything else is refused and changes nothing.
int kvg_store_set_shift(kvg_store * s, int32_t il, int64_t r0, int64_t r1, int32_t shift);

// Bytes held in `tier` (KVG_TIER_COUNT: all tiers) by the encoded rows, and the K/V values
// they stand for; out_index_bytes (may be NULL) gets the bookkeeping around them.
int kvg_store_bytes(const kvg_store * s, int32_t tier, uint64_t * out_bytes, uint64_t * out_values,
                    uint64_t * out_index_bytes);

// pq2, vq8 and vq8f codebooks: one per (layer, kind) and codec, trained by the store on the first
// block it encodes there with that codec (kvg_pq_train) and kept until kvg_store_clear.
// kvg_store_book copies it out (dst NULL: only *out_count, 0 when the list has none);
// kvg_store_set_book installs one (a session's), refused while blocks of that codec use another.
int kvg_store_book(const kvg_store * s, int32_t il, int32_t kind, int32_t codec, float * dst, size_t count,
                   size_t * out_count);
int kvg_store_set_book(kvg_store * s, int32_t il, int32_t kind, int32_t codec, const float * book, size_t count);
// Bytes of every codebook the store holds (float32, as allocated).
int kvg_store_book_bytes(const kvg_store * s, uint64_t * out_bytes);

// ---- store blocks, for session files: the encoded bytes leave and come back unchanged ----

typedef struct kvg_block_info {
    int64_t  row0;
    int64_t  n_rows;
    int32_t  codec;
    int32_t  tier;
    uint64_t n_bytes;
} kvg_block_info;

int kvg_store_n_blocks(const kvg_store * s, int32_t il, int32_t kind, int64_t * out_blocks);

// Block `bi` of (il, kind): its info, and (dst != NULL) its encoded bytes; dst_bytes must be
// exactly info.n_bytes then.
int kvg_store_block(const kvg_store * s, int32_t il, int32_t kind, int64_t bi, kvg_block_info * out, void * dst,
                    size_t dst_bytes);

// Appends an already encoded block at the end of (il, kind). The bytes must be exactly
// kvg_encoded_size long and decode without error (checked before anything changes).
int kvg_store_append_encoded(kvg_store * s, int32_t il, int32_t kind, int32_t tier, int32_t codec, int64_t n_rows,
                             const void * data, size_t n_bytes);

// The blocks of every list that start in rows [r0, r1), as one buffer: for each list in (layer,
// kind) order and each block, a kvg_block_record, then its info.n_bytes encoded bytes. *out_bytes
// receives the size; dst == NULL: only that, else dst_bytes must be exactly it.
typedef struct kvg_block_record {
    int32_t        il;
    int32_t        kind;
    kvg_block_info info;
} kvg_block_record;

int kvg_store_copy_blocks(const kvg_store * s, int64_t r0, int64_t r1, void * dst, size_t dst_bytes,
                          size_t * out_bytes);

// Appends the blocks of a kvg_store_copy_blocks buffer, each at the end of its list (its row0
// must be that list's row count then), each checked as kvg_store_append_encoded checks: all of
// them or none.
int kvg_store_append_blocks(kvg_store * s, const void * src, size_t n_bytes);

// Entry points with the signatures of llama_kvgguf_hooks (native/llama/include/llama-kvgguf.h),
// user = the store.
int32_t kvg_store_hook_n_cold(void * user, int32_t il);
// The runs of layer il's cold rows whose keys a kvg_store_shift moved: up to cap of them, run i
// being rows [row_begin[i], row_end[i]) with keys rotated at row + shift[i]. Returns how many
// runs there are (more than cap: only the first cap are written), -1 on bad arguments.
int32_t kvg_store_hook_shifts(void * user, int32_t il, int32_t cap, int64_t * row_begin, int64_t * row_end,
                              int32_t * shift);
int32_t kvg_store_hook_decode(void * user, int32_t il, int32_t kind, int64_t r0, int64_t r1, uint16_t * dst,
                              int64_t n_embd);

// One eviction's plan, for llama.cpp's llama_kvgguf_evict (llama_kvgguf_append_fn; user = the
// plan): the rows handed over for list (il, kind) are split into n_parts runs, part p its rows
// [row0[p], row1[p]) of the call's, appended to `tier[p]` with codec codecs[p * 2 * n_layer +
// il * 2 + kind] (-1: that part is not stored in that list).
typedef struct kvg_evict_plan {
    kvg_store *     store;
    int32_t         n_parts;  // 1 to KVG_TIER_COUNT
    int32_t         tier[3];
    int64_t         row0[3];
    int64_t         row1[3];
    const int32_t * codecs;  // n_parts * 2 * n_layer
    int32_t         status;  // out: the failing append's status, KVG_OK while none has failed
} kvg_evict_plan;

// Appends the parts of rows (n_rows rows of n_embd floats, n_embd the list's row width) to list
// (il, kind) as the plan says: KVG_OK, or the failing status, also kept in plan->status
// (kvg_last_error says why, on this thread). Bad arguments leave the list as it was; an append
// that fails midway keeps the parts before it (kvg_store_truncate to the eviction's first row
// undoes every list at once).
int32_t kvg_store_hook_append(void * plan, int32_t il, int32_t kind, const float * rows, int64_t n_rows,
                              int64_t n_embd);

// Fused attention over the stored rows, scored and summed from their codes without expanding
// them (llama_kvgguf_attend_fn of native/llama/include/llama-kvgguf.h; user = the store).
// Online-softmax attention state of n_q = n_tokens * n_head query vectors over rows of one layer:
// for query j, m[j] is the running maximum of its scores, l[j] = sum over rows of exp(score - m[j]),
// acc[j*head_dim_v + d] = sum over rows of exp(score - m[j]) * v[d]. score = scale * dot(q_j, k_row).
// Query head h reads KV head h / (n_head / n_head_kv) (GQA; n_head must be a multiple of n_head_kv).
// q is f32 [n_tokens][n_head][head_dim_k], contiguous. The caller initializes m = -INFINITY, l = 0,
// acc = 0 once; each call folds the rows [r0, r1) of layer il (K and V) into the state (so a row
// range can be split between threads, each with its own state, merged later by the caller in
// log-sum-exp form). Every row is visible to every query (no mask).
// Returns KVG_OK, or a negative status: for bad arguments (NULL pointers, unknown layer, rows not
// held by both K and V, n_tokens <= 0, n_head not a positive multiple of n_head_kv, a scale that
// is not finite) the state is left unchanged;
// otherwise the rows of the blocks that failed are left out of the state (as if masked with
// -inf), the other rows are folded in, and kvg_last_error() says why.
// Takes no locks and allocates nothing once a thread's scratch has grown to the shape; may run on
// many threads at once on disjoint or overlapping row ranges (like decode, not with mutations).
int32_t kvg_store_hook_attend(void * user, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                              int32_t n_head, float scale, float * m, float * l, float * acc);

// The same with logit soft-capping (Gemma 2): every score s = scale * q.k becomes
// softcap * tanh(s / softcap) before the softmax, as llama.cpp's flash attention caps them.
// softcap == 0: none (hook_attend); negative or not finite: bad argument. llama.cpp's fused path
// calls this one (llama_kvgguf_attend_fn).
int32_t kvg_store_hook_attend_capped(void * user, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                                     int32_t n_head, float scale, float softcap, float * m, float * l, float * acc);

// Attention over llama.cpp's cells outside the store, under a mask, into the same state (q, m, l, acc,
// scale, softcap as kvg_store_hook_attend_capped): llama.cpp's hot cells on the fused path
// (llama_kvgguf_attend_f16_fn of native/llama/include/llama-kvgguf.h). Cells [c0, c1) of n_head_kv KV heads, of
// ggml type k_type / v_type (enum kvg_cell_type). f16: element i of KV head hk of cell c is the f16
// at k + i * k_nb[0] + hk * k_nb[1] + c * k_nb[2] (bytes; v likewise, so a transposed V is a
// matter of strides). q8_0 (ggml's blocks of 32 codes and an f16 scale, k_nb[0] = 34, head dims a
// multiple of 32): KV head hk of cell c is head_dim / 32 blocks from k + hk * k_nb[1] + c * k_nb[2],
// read as their exact values (scale times code), not rounded to f16. mask, when not NULL, is added to the
// scores of query token t: the f32 (or f16, mask_f16 != 0) at mask + t * mask_nb1 + c * its size;
// -INFINITY hides a cell, and a query that sees no cell of the range keeps its state. Returns
// KVG_OK, or KVG_ERR_INVALID_ARG / KVG_ERR_NO_MEMORY with the state unchanged. Takes no locks;
// allocates nothing once a thread's scratch has grown to the shape.
enum kvg_cell_type { KVG_CELLS_F16 = 1, KVG_CELLS_Q8_0 = 8 };  // ggml's type numbers (ggml.h)
int32_t kvg_attend_f16(const float * q, int32_t n_tokens, int32_t n_head, int32_t n_head_kv, int64_t head_dim_k,
                       int64_t head_dim_v, const void * k, int32_t k_type, const size_t * k_nb, const void * v,
                       int32_t v_type, const size_t * v_nb, int64_t c0, int64_t c1, const void * mask, int32_t mask_f16,
                       size_t mask_nb1, float scale, float softcap, float * m, float * l, float * acc);

// Failed reads on llama.cpp's paths since the store was made: KVG_READ_DECODE counts hook_decode
// calls that failed (rows llama.cpp expanded are then zeros: kvgguf drops that ubatch), and
// KVG_READ_ATTEND hook_attend calls that left rows out (as if masked). -1 for bad arguments.
enum kvg_read_path { KVG_READ_DECODE = 0, KVG_READ_ATTEND = 1 };
int64_t kvg_store_read_failures(const kvg_store * s, int32_t path);

// ---- attention mass: how much softmax weight the cold rows receive -------------------------
//
// While collection is on, every attend call also notes, per query and per granule of
// KVG_MASS_ROWS cold rows, the sum of exp(score - m) it folded in; kvg_store_hook_mass then
// brings in the final normalizers of those queries (max and sum over every row they attended
// to, cold and hot) and adds each granule's softmax share, summed over the queries, to its
// counter. So granule g of layer il counts sum over queries j of sum over rows t in
// [g * KVG_MASS_ROWS, (g + 1) * KVG_MASS_ROWS) of softmax_j(t): at most n_head per token attended.

enum kvg_mass { KVG_MASS_ROWS = 64 };

// Turns collection on or off (off by default); either way, notes not yet brought in are dropped.
int kvg_store_set_mass(kvg_store * s, int32_t on);
// Counters of layer il, granules [0, n): out[g] for rows [g * KVG_MASS_ROWS, ...). Granules no
// query has reached read 0.
int kvg_store_mass(const kvg_store * s, int32_t il, double * out, int64_t n);
// Zeroes every counter.
void kvg_store_mass_clear(kvg_store * s);
// llama_kvgguf_mass_fn of native/llama/include/llama-kvgguf.h (user = the store): max[j] and sum[j] are the softmax
// normalizers of the n_tokens * n_head queries (order of attend's q) of layer il whose attend
// calls since the previous kvg_store_hook_mass are brought in. Notes of another layer or shape
// are dropped (counted in kvg_store_mass_dropped). Runs on one thread, with no attend call in flight.
int32_t kvg_store_hook_mass(void * user, int32_t il, int32_t n_tokens, int32_t n_head, const float * max,
                            const float * sum);
// Notes dropped since the store was made: attend calls beyond KVG_MASS_SLOTS between two
// kvg_store_hook_mass calls, out of memory, or never brought in.
int64_t kvg_store_mass_dropped(const kvg_store * s);

// ---- failure injection, for tests ---------------------------------------------------------

// The (n_steps + 1)-th step from now that can fail inside a store mutation (an allocation or an
// encode in append, append_encoded, retier or truncate) fails as out of memory, once; n_steps < 0
// cancels. Process-wide. Returns the countdown it replaces: -1 when none was pending (or it fired).
int64_t kvg_debug_fail_after(int64_t n_steps);
// Every read of the block of (il, kind) holding `row` fails (on != 0) or works again (on == 0):
// decode, the hooks (the fused attend then leaves its rows out), and re-encoding it.
int kvg_store_debug_fail_reads(kvg_store * s, int32_t il, int32_t kind, int64_t row, int32_t on);

// cffi-end

#define KVG_DEFAULT_GROUP_SIZE 32
#define KVG_DEFAULT_SEED       0x6b766767756630ULL  // "kvgguf0"
#define KVG_ROTQ_MAX_HEAD_DIM  4096

#ifdef __cplusplus
}
#endif

#endif  // KVGGUF_H
