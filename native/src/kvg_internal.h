// kvg_internal.h: declarations shared by the libkvgguf sources (not installed).
#ifndef KVG_INTERNAL_H
#define KVG_INTERNAL_H

#include "core/status.h"
#include "kvgguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Everything declared here stays inside the library; only kvgguf.h is its ABI.
#if defined(__GNUC__) && !defined(_WIN32)
#    pragma GCC visibility push(hidden)
#endif

#define KVG_CODEC_COUNT_ 29

// A SIMD kernel returns this when the shape is outside its fast path; the caller then
// runs the reference. Positive, so it can never be mistaken for a public status.
#define KVG_NOT_HANDLED 1

// Upper bound on values per block: keeps every bit offset (N * 8) and byte count far from
// overflowing 64 bits.
#define KVG_MAX_VALUES ((int64_t) 1 << 56)

#define KVG_F16_MAX 65504.0f

// One encode/decode/size request, validated by codecs.c before any kernel sees it:
// dims are positive and their product is at most KVG_MAX_VALUES.
typedef struct kvg_job {
    int           type;
    int           kind;
    int           bits;  // bits per code
    int64_t       n_tokens;
    int64_t       n_heads;
    int64_t       head_dim;
    int64_t       n_channels;  // C = n_heads * head_dim: one K/V row
    int64_t       n_values;    // N = n_tokens * C
    int32_t       group_size;
    uint64_t      seed;
    const float * book;  // pq2, vq8: params.book (checked by the codec, not here)
    size_t        book_count;
} kvg_job;

// ---- attention over encoded rows (attend.c drives; each codec scores and accumulates) -------

// Rows per online-softmax update: a chunk's scores (n_q x 64 floats) stay in L1.
#define KVG_ATTN_CHUNK 64

// The queries and accumulators of one kvg_store_hook_attend call as the kernels see them.
// Queries are ordered by KV head: query j reads KV head j / per_head (attend.c maps them back
// to the caller's [token][head] order).
typedef struct kvg_attn {
    int64_t       n_q;
    int64_t       per_head;  // n_tokens * (n_head / n_head_kv)
    const float * q;         // [n_q][head_dim_k]: the caller's queries times the softmax scale
    const float * qr;        // [n_q][head_dim_k]: W(s * q), what rotated (rotq) keys are scored against
    float *       acc;       // [n_q][head_dim_v]
    float *       accr;      // [n_q][head_dim_v]: rotated values; attend.c adds s * W(accr) to acc at the end
    float *       tmp;       // kernel scratch of KVG_ATTN_TMP(n_q, max(head_dim_k, head_dim_v)) floats
} kvg_attn;

#define KVG_ATTN_TMP(n_q, d) ((n_q) * ((d) + KVG_ATTN_CHUNK + 2) + 2 * KVG_ATTN_CHUNK * ((d) + 2) + 4 * (d) + 64)

// Kernels read rows [t0, t0 + n) of one block (0 < n <= KVG_ATTN_CHUNK) whose bytes passed the
// codec's check when they were appended, so they cannot fail; a SIMD kernel may return
// KVG_NOT_HANDLED (before touching anything) for a shape outside its fast path.
// score: out[j * n + t] = dot(q_j, key row t0 + t, KV head j / per_head); rotated codecs use qr.
typedef int (*kvg_score_fn)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                            float * out);
// accumulate: acc_j += p[j * n + t] * value row t0 + t (rotated codecs: their rotated part into accr).
typedef int (*kvg_accumulate_fn)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                 const kvg_attn * a);
// Codecs with a domain of their own per (layer, kind) (wfq: the plan's sets): prepare writes
// qr[j] for every query (what the codec's score reads), finish adds the codec's accr back into
// acc. attend.c calls them when a block's domain is not the one qr or accr holds.
typedef int (*kvg_prepare_fn)(const kvg_job * job, const kvg_attn * a, float * qr);
typedef int (*kvg_finish_fn)(const kvg_job * job, const kvg_attn * a);

// The online-softmax step of one chunk (attend.c; SIMD in attend_simd.h): folds the chunk's
// scores s[j * n + t] into m, l and the accumulators (rescaled when m grows; accr too when
// `rotated`), and turns the scores into the weights exp(s - m) the values are summed with.
void kvg_attn_softmax_ref(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated);

// attend.c: the caller's queries (times scale) and state into the internal order, by KV head
// (kvg_attn), and the state back; shared by the store's attend and kvg_attend_f16.
void kvg_attn_gather(const float * q, const float * m, const float * l, const float * acc, int64_t n_tokens,
                     int64_t n_head, int64_t gqa, int64_t dk, int64_t dv, float scale, float * wq, float * wm,
                     float * wl, float * wacc);
// attend.c: soft-capping as llama.cpp's flash attention does it, on scores already taken with
// scale / softcap: each becomes softcap * tanh(score).
void kvg_attn_cap_scores(float * sc, int64_t n, float softcap);
void kvg_attn_scatter(const float * wm, const float * wl, const float * wacc, int64_t n_tokens, int64_t n_head,
                      int64_t gqa, int64_t dv, float * m, float * l, float * acc);
void kvg_attn_softmax_avx2(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated);
void kvg_attn_softmax_neon(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated);

// Queries per KV head from which attend.c and attend_f16.c decode a chunk's rows once and
// multiply dense tiles; a decode step's few queries keep the per-row kernels, which measured
// faster below it (benchmarks/attend_kernels.py --tokens). A build with
// CMAKE_ARGS="-DCMAKE_C_FLAGS=-DKVG_DENSE_MIN_QUERIES=1000000" times the per-row kernels alone.
#ifndef KVG_DENSE_MIN_QUERIES
#    define KVG_DENSE_MIN_QUERIES 16
#endif

// Dense tiles (attend_simd.h) for many queries per KV head, a prefill's ubatch: attend.c decodes
// a chunk's rows of one KV head once (rows: out[t * D + i], in the domain the kernels score in;
// KVG_NOT_HANDLED for codecs other than f16, rotq and tcq), then scores them as one small
// matrix product (out[g * ldo + t] = q_g . row t; kt: scratch of D * (n rounded up to 8)) and
// sums values as another (acc[g * D + i] += sum_t w[g * ldw + t] * row t). SIMD builds only.
int  kvg_dense_rows_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, int64_t hk, float * out);
int  kvg_dense_rows_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, int64_t hk, float * out);
void kvg_dense_score_avx2(const float * q, int64_t P, const float * keys, int64_t n, int64_t D, float * kt, float * out,
                          int64_t ldo);
void kvg_dense_score_neon(const float * q, int64_t P, const float * keys, int64_t n, int64_t D, float * kt, float * out,
                          int64_t ldo);
void kvg_dense_accumulate_avx2(const float * w, int64_t ldw, int64_t P, const float * rows, int64_t n, int64_t D,
                               float * acc);
void kvg_dense_accumulate_neon(const float * w, int64_t ldw, int64_t P, const float * rows, int64_t n, int64_t D,
                               float * acc);

// What the 8 lanes that attend_simd.h's kernels load at a time (load_lanes of attend_avx2.c and
// attend_neon.c) are made of.
enum {
    KVG_LANES_F16 = 0,  // stored halves
    KVG_LANES_CB  = 1,  // rotq codebook values of the codes
    KVG_LANES_INT = 2,  // the codes themselves, as floats (kivi: scale and min are folded elsewhere)
    KVG_LANES_F32 = 3,  // floats a scalar step has decoded (wfq's levels)
};

typedef int (*kvg_size_fn)(const kvg_job * job, size_t * out_bytes);
typedef int (*kvg_encode_fn)(const kvg_job * job, const float * src, uint8_t * dst);
typedef int (*kvg_decode_fn)(const kvg_job * job, const uint8_t * src, float * dst);
// KVG_ERR_CORRUPT for bytes no encoder writes (what decode would refuse), without decoding.
typedef int (*kvg_check_fn)(const kvg_job * job, const uint8_t * src);

// One row per codec type, in the manner of ggml's type_traits: what the codec is (reported by
// kvg_codec_describe; kvgguf.h's kvg_codec_info says what each fact means), then its kernels.
// Kernels get buffers whose sizes codecs.c has already checked against encoded_size.
typedef struct kvg_codec_traits {
    const char *      name;
    const char *      family;
    int               bits;
    int               rotated;  // attention: keys scored against qr, values (partly) into accr
    int               book;     // enum kvg_book
    int               head_dim_pow2;
    int64_t           head_dim_min;  // 0: 1
    int64_t           head_dim_max;  // 0: no bound of its own
    int               vector_code;   // `bits` code a whole head vector (vq8), not each value
    int               vector_bits;   // per head vector besides the codes
    int               group_bits;
    int               group_values;  // 0: params.group_size
    int               block_side_data;
    kvg_size_fn       encoded_size;  // may reject a shape (rotq: head_dim)
    kvg_encode_fn     encode_ref;    // scalar oracle
    kvg_decode_fn     decode_ref;
    kvg_encode_fn     encode_simd;  // KVG_SIMD(...): NULL where none exists; may return KVG_NOT_HANDLED
    kvg_decode_fn     decode_simd;
    kvg_check_fn      check;
    kvg_score_fn      score_ref;  // scalar oracle of the attention kernels (kvg_rows_*: decode and dot)
    kvg_accumulate_fn accumulate_ref;
    kvg_score_fn      score_simd;  // KVG_SIMD(...): may return KVG_NOT_HANDLED
    kvg_accumulate_fn accumulate_simd;
    kvg_prepare_fn    prepare_q;  // a domain of its own (NULL: none, or rotq's when `rotated`)
    kvg_finish_fn     finish_acc;
} kvg_codec_traits;

// codecs.c: the row of a codec type (NULL if out of range), and a job for an already valid
// shape (the store's blocks); fails as kvg_encoded_size does.
const kvg_codec_traits * kvg_codec_traits_of(int type);
int kvg_make_job(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
                 kvg_job * job, size_t * size);
// make_job, exact size, then the codec's check: what the store runs once on every block it links.
int kvg_check_encoded(int type, int kind, const void * src, size_t src_bytes, int64_t n_tokens, int64_t n_heads,
                      int64_t head_dim, const kvg_codec_params * p);

// splitmix64 (Steele, Lea & Flood 2014): the finalizer, and the generator that steps its state by
// the golden-ratio increment first. Every random stream of the library (rotq's signs, QJL's and
// wfq's Gaussian matrices, low-rank's start) is drawn from these.
#define KVG_GOLDEN 0x9E3779B97F4A7C15ULL
static inline uint64_t kvg_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static inline uint64_t kvg_splitmix64(uint64_t * state) {
    return kvg_mix64(*state += KVG_GOLDEN);
}

// cpu.c
int kvg_cpu_has_avx2_fma(void);

// ---- f16 (f16.c) ---------------------------------------------------------------------------

uint16_t kvg_f32_to_f16(float f);  // round to nearest even; overflow gives +-Inf
float    kvg_f16_to_f32(uint16_t h);
void     kvg_f32_to_f16_row(const float * x, uint16_t * y, int64_t n);       // dispatches to F16C / NEON
void     kvg_f32_to_f16_row_avx2(const float * x, uint16_t * y, int64_t n);  // simd_avx2.c
void     kvg_f32_to_f16_row_neon(const float * x, uint16_t * y, int64_t n);  // simd_neon.c
uint16_t kvg_f16_next_up(uint16_t h);                                        // next f16 towards +Inf (finite input)
uint16_t kvg_f16_next_down(uint16_t h);                                      // next f16 towards -Inf (finite input)

static inline int kvg_f16_is_finite(uint16_t h) {
    return (h & 0x7c00) != 0x7c00;
}

static inline void kvg_put_u16(uint8_t * p, uint16_t v) {
    p[0] = (uint8_t) (v & 0xff);
    p[1] = (uint8_t) (v >> 8);
}
static inline uint16_t kvg_get_u16(const uint8_t * p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}

int kvg_f16_size(const kvg_job * job, size_t * out_bytes);
int kvg_f16_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_f16_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_f16_check(const kvg_job * job, const uint8_t * src);
int kvg_f16_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out);
int kvg_f16_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a);
int kvg_f16_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_f16_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);
int kvg_f16_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_f16_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);

// ---- bit packing (pack.c) ------------------------------------------------------------------

static inline uint64_t kvg_code_bytes(int64_t n_values, int bits) {
    return ((uint64_t) n_values * (uint64_t) bits + 7) / 8;
}

// Packs n codes of `bits` bits (1..8) into the little-endian bitstream dst from bit
// bit_off on. Codes are OR-ed in, so the target bits must be zero (callers clear the code
// region first). Codes must be < 2^bits.
void kvg_pack_bits(uint8_t * dst, uint64_t bit_off, const uint8_t * codes, size_t n, int bits);
// Inverse of kvg_pack_bits; reads only the bytes that hold the n codes.
void kvg_unpack_bits(const uint8_t * src, uint64_t bit_off, uint8_t * codes, size_t n, int bits);

// ---- kivi (kivi.c) -------------------------------------------------------------------------

// A kivi group header as stored: f16 min then f16 scale. 32 bits per group is what gives
// kivi its B + 32/G bits per value.
typedef struct kvg_kivi_group {
    uint8_t min_f16[2];
    uint8_t scale_f16[2];
} kvg_kivi_group;
_Static_assert(sizeof(kvg_kivi_group) == 4, "kivi group header must be 32 bits");

// Row kernels the kivi drivers call; scalar ones in kivi.c, SIMD ones in simd_avx2.c and simd_neon.c.
// All must compute exactly what the scalar ones compute.
typedef struct kvg_kivi_ops {
    // mn[c] = min(mn[c], x[c]), mx[c] = max(mx[c], x[c]) as (x < mn ? x : mn), (x > mx ? x : mx)
    void (*minmax_update)(const float * x, float * mn, float * mx, int64_t n);
    // min and max of x[0..n), n >= 1
    void (*minmax_span)(const float * x, int64_t n, float * mn, float * mx);
    // codes of x[0..n) against per-channel min/1-over-scale, packed at bit_off of `codes`
    void (*quant_row)(const float * x, const float * mf, const float * inv, int64_t n, int bits, uint8_t * codes,
                      uint64_t bit_off, uint8_t * scratch);
    // out[c] = mf[c] + code * sf[c] for the n codes at bit_off
    void (*dequant_row)(const uint8_t * codes, uint64_t bit_off, const float * mf, const float * sf, int64_t n,
                        int bits, float * out, uint8_t * scratch);
} kvg_kivi_ops;

// Quantizes one element; the SIMD kernels do the same float operations in the same order.
static inline uint8_t kvg_kivi_code(float x, float mf, float inv, float top) {
    float v = (x - mf) * inv;
    v       = v > 0.0f ? v : 0.0f;
    v       = v < top ? v : top;
    return (uint8_t) (int) (v + 0.5f);
}

int kvg_kivi_size(const kvg_job * job, size_t * out_bytes);
int kvg_kivi_encode_with(const kvg_job * job, const float * src, uint8_t * dst, const kvg_kivi_ops * ops);
int kvg_kivi_decode_with(const kvg_job * job, const uint8_t * src, float * dst, const kvg_kivi_ops * ops);
int kvg_kivi_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_kivi_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_kivi_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_kivi_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_kivi_encode_neon(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_kivi_decode_neon(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_kivi_check(const kvg_job * job, const uint8_t * src);
int kvg_kivi_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_kivi_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);
int kvg_kivi_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                        float * out);
int kvg_kivi_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a);
int kvg_kivi_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                        float * out);
int kvg_kivi_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a);

static inline int64_t kvg_kivi_n_groups(const kvg_job * job) {
    const int64_t G = job->group_size;
    return job->kind == KVG_KIND_K ? ((job->n_tokens + G - 1) / G) * job->n_channels
                                   : job->n_tokens * ((job->n_channels + G - 1) / G);
}

// ---- rotq (rotq.c) -------------------------------------------------------------------------

#define KVG_ROTQ_MAX_BITS 4

// Lloyd-Max codebooks for one head_dim, all bit widths; built once and never freed.
typedef struct kvg_rotq_book {
    float centroid[KVG_ROTQ_MAX_BITS + 1][1 << KVG_ROTQ_MAX_BITS];  // [bits][level], ascending
    float boundary[KVG_ROTQ_MAX_BITS + 1][1 << KVG_ROTQ_MAX_BITS];  // [bits][k], 2^bits - 1 used
} kvg_rotq_book;

typedef struct kvg_rotq_ops {
    // Encodes one vector: returns its f16 norm in *norm16 and packs its codes at bit_off
    // (when the norm rounds to zero it writes no codes). tmp holds d floats, q d bytes.
    int (*encode_vec)(const float * x, int64_t d, const float * sgn, const kvg_rotq_book * book, int bits, float * tmp,
                      uint8_t * q, uint8_t * codes, uint64_t bit_off, uint16_t * norm16);
    // Decodes one vector whose f16 norm is the finite, positive nf.
    void (*decode_vec)(const uint8_t * codes, uint64_t bit_off, int64_t d, int bits, const kvg_rotq_book * book,
                       const float * sgn, float nf, float * out, uint8_t * q);
} kvg_rotq_ops;

const kvg_rotq_book * kvg_rotq_get_book(int64_t head_dim);  // NULL if out of memory
// The first nv of the nv_src vectors of a rotq block (src) coded again with bits_out bits into a
// block of nv vectors (dst): what decoding and encoding them gives, from the codes (rotq.c).
int  kvg_rotq_transcode(int64_t nv_src, int64_t nv, int64_t d, int bits_in, const uint8_t * src, int bits_out,
                        uint8_t * dst);
void kvg_rotq_signs(uint64_t seed, int64_t d, float * sgn);  // +-1.0f per coordinate
// Sum of squares in 8 interleaved float lanes (lane i % 8) reduced as
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), the order an AVX2 register reduction takes (and the
// NEON kernel copies), so every path computes the same norm.
float kvg_rotq_sumsq_ref(const float * x, int64_t d);
// y = W(s * x) / n, n the f16 norm of x into *n16 (y untouched when it is 0); KVG_ERR_RANGE
// "<name>: vector norm ..." when n does not fit in f16.
int  kvg_rotq_rotate(const char * name, const float * x, int64_t d, const float * sgn, float * y, uint16_t * n16);
void kvg_fwht_ref(float * x, int64_t d);   // unnormalized, in place, d a power of two
void kvg_fwht_avx2(float * x, int64_t d);  // simd_avx2.c; the same butterflies, d >= 8
void kvg_fwht_neon(float * x, int64_t d);  // simd_neon.c; likewise
void kvg_fwht(float * x, int64_t d);       // dispatches on the SIMD level

int kvg_rotq_size(const kvg_job * job, size_t * out_bytes);
int kvg_rotq_encode_with(const kvg_job * job, const float * src, uint8_t * dst, const kvg_rotq_ops * ops);
int kvg_rotq_decode_with(const kvg_job * job, const uint8_t * src, float * dst, const kvg_rotq_ops * ops);
int kvg_rotq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_rotq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_rotq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_rotq_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_rotq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_rotq_decode_neon(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_rotq_check(const kvg_job * job, const uint8_t * src);
// Keys: q . x' = (n / d) * sum_i qr_i * cb[code_i] with qr = W(s * q), since W is symmetric.
// Values: accr_j += p * (n / d) * cb[codes]; s * W(accr) is the sum of p * x'.
int kvg_rotq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_rotq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);
int kvg_rotq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                        float * out);
int kvg_rotq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a);
int kvg_rotq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                        float * out);
int kvg_rotq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a);

// ---- crotq: rotq of the residual after per-channel group means (crotq.c) ----------------

#define KVG_CROTQ_TOKENS 128  // tokens per group of channel means

// Bytes of the f16 channel means in front of the rotq encoding of the residual.
static inline size_t kvg_crotq_means_bytes(const kvg_job * job) {
    return (size_t) ((job->n_tokens + KVG_CROTQ_TOKENS - 1) / KVG_CROTQ_TOKENS) * (size_t) job->n_channels * 2;
}

int kvg_crotq_size(const kvg_job * job, size_t * out_bytes);
int kvg_crotq_check(const kvg_job * job, const uint8_t * src);
int kvg_crotq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                        float * out);
int kvg_crotq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a);
int kvg_crotq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                         float * out);
int kvg_crotq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                              const kvg_attn * a);
int kvg_crotq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                         float * out);
int kvg_crotq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                              const kvg_attn * a);
int kvg_crotq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_crotq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_crotq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_crotq_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_crotq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_crotq_decode_neon(const kvg_job * job, const uint8_t * src, float * dst);

// ---- codecs with side data per block (issue 13): delta.c, outliers.c, lowrank.c, qjl.c ----------------------
//
// Each is self-contained per block (keyframes, channel lists, factors and norms live in the
// block and are counted in its bytes) and has scalar kernels only for now. Attention reads
// them through attend_rows.c: the block decoded into per-thread scratch, then exact dots.

#define KVG_DELTA_KEYFRAME 64  // rows per keyframe (TSC part I's interval)

int kvg_delta_size(const kvg_job * job, size_t * out_bytes);
int kvg_delta_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_delta_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_delta_check(const kvg_job * job, const uint8_t * src);
int kvg_pdelta_size(const kvg_job * job, size_t * out_bytes);
int kvg_pdelta_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_pdelta_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_pdelta_check(const kvg_job * job, const uint8_t * src);

int kvg_outl_size(const kvg_job * job, size_t * out_bytes);
int kvg_outl_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_outl_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_outl_check(const kvg_job * job, const uint8_t * src);

int kvg_lowrank_size(const kvg_job * job, size_t * out_bytes);
int kvg_lowrank_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_lowrank_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_lowrank_check(const kvg_job * job, const uint8_t * src);

int kvg_qjl_size(const kvg_job * job, size_t * out_bytes);
int kvg_qjl_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_qjl_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_qjl_check(const kvg_job * job, const uint8_t * src);
// pq.c: pq2, vq8 and vq8f, whose codebook comes with the job (the store's, per layer and kind).
#define KVG_PQ_CENTROIDS 256
#define KVG_BOOK_SLOTS   6                           // codecs with a codebook or plan: KVG_CODEC_PQ2 .. KVG_CODEC_WFQ4
#define KVG_VQ8F_SHARE   32                          // vq8f keeps 1 head vector in this many in f16
int64_t kvg_pq_sub_len(int type, int64_t head_dim);  // S: coordinates per code
int     kvg_pq_size(const kvg_job * job, size_t * out_bytes);
int     kvg_pq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int     kvg_pq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int     kvg_pq_check(const kvg_job * job, const uint8_t * src);
int kvg_pq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out);
int kvg_pq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                          const kvg_attn * a);

// tcq.c: tcq2, tcq3 and tcq4 (rotq's rotation and norms, checked by kvg_rotq_check).
#define KVG_TCQ_WINDOW 8                 // bits a value's level is read from: 256 levels per B (tcq_tables.h)
#define KVG_TCQ_LANES  8                 // head vectors one Viterbi search codes at once
const float * kvg_tcq_levels(int bits);  // the 256 levels of a B-bit code, by window
// The search (tcq_viterbi.h): codes q[i * LANES + l] for the rotated, normalized values
// y[i * LANES + l] of LANES head vectors of d values; back: d * 2^(8 - B) * LANES scratch.
typedef void (*kvg_tcq_viterbi_fn)(const float * y, int64_t d, int bits, const float * T, uint32_t * back, uint8_t * q);
int kvg_tcq_encode_with(const kvg_job * job, const float * src, uint8_t * dst, kvg_tcq_viterbi_fn viterbi);
int kvg_tcq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_tcq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_tcq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_tcq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_tcq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out);
int kvg_tcq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a);
int kvg_tcq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_tcq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);
int kvg_tcq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_tcq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);

// wfq.c: wfq2, wfq3 and wfq4, whose plan comes with the job (the store's, per layer and kind).
#define KVG_WFQ_MAX_BITS     8
#define KVG_WFQ_MAX_HEAD_DIM 512
size_t kvg_wfq_book_floats(int64_t n_heads, int64_t head_dim);
int    kvg_wfq_code_bits(const kvg_job * job);
// The job's plan: present, the right size and valid for every head (a permutation, scales > 0,
// whole bit widths summing right); builds the mixes it needs.
int kvg_wfq_check_book(const kvg_job * job);
int kvg_wfq_size(const kvg_job * job, size_t * out_bytes);
int kvg_wfq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst);
int kvg_wfq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst);
int kvg_wfq_check(const kvg_job * job, const uint8_t * src);
int kvg_wfq_prepare_q(const kvg_job * job, const kvg_attn * a, float * qr);
int kvg_wfq_finish_acc(const kvg_job * job, const kvg_attn * a);
// A set of a plan: positions [a, a + n) of `bits` bits each, whose codes start `bit` bits into
// a head vector's code bytes.
typedef struct kvg_wfq_set {
    int32_t  a, n, bits;
    uint32_t bit;
} kvg_wfq_set;
int           kvg_wfq_sets(const kvg_job * job, int64_t hk, kvg_wfq_set * sets);  // head hk's, in order; their count
size_t        kvg_wfq_vec_bytes(const kvg_job * job);
const float * kvg_wfq_level_table(int bits);  // 2^bits levels, 256 floats readable
int           kvg_wfq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out);
int           kvg_wfq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a);
int           kvg_wfq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out);
int           kvg_wfq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a);
int kvg_wfq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out);
int kvg_wfq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a);

// attend_rows.c: score/accumulate for codecs without their own kernels: decodes the block
// (the job's whole shape) into per-thread scratch, then dots rows [t0, t0 + n) exactly as f16's
// kernels do. KVG_ERR_NO_MEMORY if the scratch cannot grow.
int kvg_rows_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out);
int kvg_rows_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a);

// ---- store (store.c; attend.c reads its blocks) --------------------------------------------

typedef struct kvg_block {
    int64_t   row0;
    int64_t   n_rows;
    int32_t   codec;
    int32_t   tier;
    size_t    n_bytes;
    uint8_t * data;
    int32_t   fail_reads;  // kvg_store_debug_fail_reads: every read of this block fails (tests)
    int32_t   shift;       // kvg_store_shift: row r's key was rotated at position r + shift (0: at r)
    uint64_t  id;          // set when its bytes are: no other block of the process has had it, so a
                           // device copy (native/cuda/kvg_cuda_store.c) knows whether it is current
} kvg_block;

// kvgguf/policy/held.py plans the store's block tables at BLOCK_ENTRY_BYTES an entry.
_Static_assert(sizeof(void *) != 8 || sizeof(kvg_block) == 56, "change BLOCK_ENTRY_BYTES in kvgguf/policy/held.py too");

// The next block id (kvg_block.id), never 0.
uint64_t kvg_block_new_id(void);

typedef struct kvg_rows {
    float *     book[KVG_BOOK_SLOTS];  // pq2's, vq8's, vq8f's codebooks, wfq's plans (NULL: none yet)
    kvg_block * blocks;
    int64_t     n_blocks;
    int64_t     cap;
    int64_t     n_rows;
    uint64_t    version;  // bumped by every change to the blocks: a device copy skips a list it holds as is
} kvg_rows;

// What one attend call saw for the attention mass (mass.c), until the layer's normalizers
// arrive: n_rec records, each a granule index and, per query (attend's internal order), the
// reference max m and the sum S of exp(score - m) over the granule's rows the call folded in.
typedef struct kvg_mass_notes {
    int32_t   il;
    int32_t   n_tokens;
    int32_t   n_head;
    int64_t   n_q;
    int64_t   n_rec;    // -1: these notes are lost (out of memory)
    int64_t * gran;     // [n_rec]
    float *   ms;       // [n_rec][2][n_q]: m then S
    size_t    cap_rec;  // records gran and ms have room for
    size_t    cap_q;    // ... with this n_q
} kvg_mass_notes;

// Attend calls whose notes one layer's merge can bring in (one per ggml thread, usually).
#define KVG_MASS_SLOTS 256

struct kvg_store {
    kvg_store_params p;
    int32_t *        enabled;  // [n_layer]
    kvg_rows *       rows;     // [n_layer * 2]: K then V of each layer
    float *          sgn;      // rotq's signs for params.codec.seed, max(head_dim_k, head_dim_v) of them
    // attention mass (mass.c)
    int32_t          mass_on;
    double **        mass;      // [n_layer][mass_cap[il]] counters per KVG_MASS_ROWS rows
    int64_t *        mass_cap;  // [n_layer]
    kvg_mass_notes * notes;     // [KVG_MASS_SLOTS], allocated with the store
    _Atomic int32_t  n_notes;   // slots taken by attend calls since the last hook_mass
    _Atomic int64_t  mass_dropped;
    _Atomic int64_t  read_failures[2];  // kvg_store_read_failures, by enum kvg_read_path
    int32_t          n_threads;         // kvg_store_set_threads: threads of a retier's re-encodes
    // A pthread_rwlock_t (store.c's, behind a pointer: a strict C11 build of another file would
    // not see the type), held for reading by the hooks that read blocks while llama.cpp computes
    // (attend, decode), for writing by a retier's commit: aging may run on another thread beside
    // a GPU's batch, and a layer that falls back to the CPU path would read the blocks it swaps.
    void * swap_lock;
};

// The hooks' side of swap_lock: KVG_OK once held for reading (else a status to return).
int  kvg_store_read_begin(const kvg_store * s);
void kvg_store_read_end(const kvg_store * s);

// mass.c: a slot for an attend call's notes (NULL when collection is off or none is left) with
// room for the granules of rows [r0, r1); kvg_mass_note folds the weights of a chunk's rows
// [t0, t1) in (w: [n_q][n], the chunk's n rows per query), all of them in one granule.
kvg_mass_notes * kvg_mass_begin(kvg_store * s, int32_t il, int32_t n_tokens, int32_t n_head, int64_t n_q, int64_t r0,
                                int64_t r1);
void kvg_mass_note(kvg_mass_notes * nt, int64_t granule, const float * m, const float * w, int64_t n, int64_t t0,
                   int64_t t1);
// After a successful truncate to n_rows: counters of rows >= n_rows go (a cut granule keeps its count).
void kvg_mass_forget_from(kvg_store * s, int64_t n_rows);
// The counters of a kvg_store_shift: rows [p0, p1) dropped, the ones after moved back.
void kvg_mass_shift(kvg_store * s, int64_t p0, int64_t p1);
void kvg_mass_free(kvg_store * s);

// The codec params of a block of list li (layer li / 2, kind li % 2) with `codec`: the store's,
// with the list's codebook for pq2 and vq8 (`fresh` where the list has none yet; may be NULL).
kvg_codec_params kvg_store_list_params(const kvg_store * s, int64_t li, int32_t codec, const float * fresh);

// Index of the block holding row `row` (0 <= row < n_rows).
int64_t kvg_rows_find_block(const kvg_rows * r, int64_t row);

// ---- scratch.c: per-thread scratch, grown and never shrunk, freed when the thread ends --------

enum {
    KVG_SCRATCH_STORE  = 0,
    KVG_SCRATCH_ATTEND = 1,
    KVG_SCRATCH_ROWS   = 2,
    KVG_SCRATCH_DENSE  = 3,
    KVG_SCRATCH_SLOTS  = 4
};
float * kvg_thread_scratch(int slot, size_t n_floats);  // NULL when out of memory

// ---- store.c: failure injection (kvg_debug_fail_after) -------------------------------------

// KVG_OK, or the injected failure when the countdown kvg_debug_fail_after set reaches it. Every
// step of a store mutation that could fail for real (an allocation, an encode) calls it first.
int kvg_injected_failure(const char * where);

// ---- SIMD: which kernels this build has (cpu.c chooses whether they run) -------------------

int kvg_avx2_built(void);  // 1 if simd_avx2.c was compiled with AVX2 and FMA enabled
int kvg_neon_built(void);  // 1 if simd_neon.c was compiled for (little-endian) AArch64

// Every SIMD kernel exists as *_avx2 and *_neon, each a stub outside its own ISA, so a build
// carries one working set: KVG_SIMD(kvg_fwht) names this build's. It runs when kvg_simd_level()
// is not KVG_SIMD_SCALAR, which cpu.c allows only where the set works.
#if defined(__aarch64__)
#    define KVG_SIMD(fn) fn##_neon
#else
#    define KVG_SIMD(fn) fn##_avx2
#endif

// kvg_simd_level() != KVG_SIMD_SCALAR: the KVG_SIMD kernels are to run.
static inline int kvg_simd_on(void) {
    return kvg_simd_level() != KVG_SIMD_SCALAR;
}

#if defined(__GNUC__) && !defined(_WIN32)
#    pragma GCC visibility pop
#endif

#endif  // KVG_INTERNAL_H
