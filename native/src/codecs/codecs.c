// codecs.c: the codec traits table, argument checking and dispatch.
#include "kvg_internal.h"

#include <stdint.h>

// ---- the traits table ----------------------------------------------------------------------

// What every row of a family holds beside its name and bits: the family's facts (kvgguf.h's
// kvg_codec_info), then its kernels. The SIMD kernels are this build's (KVG_SIMD: AVX2 on x86-64,
// NEON on AArch64).

// The head dims of rotq's rotation (a Walsh-Hadamard transform).
#define KVG_ROTQ_HEAD_DIM .head_dim_pow2 = 1, .head_dim_min = 2, .head_dim_max = KVG_ROTQ_MAX_HEAD_DIM

#define KVG_F16_ROW                                                                                                    \
    .family = "f16", .encoded_size = kvg_f16_size, .encode_ref = kvg_f16_encode_ref, .decode_ref = kvg_f16_decode_ref, \
    .check = kvg_f16_check, .score_ref = kvg_f16_score_ref, .accumulate_ref = kvg_f16_accumulate_ref,                  \
    .score_simd = KVG_SIMD(kvg_f16_score), .accumulate_simd = KVG_SIMD(kvg_f16_accumulate)

// an f16 min and scale per group of params.group_size values
#define KVG_KIVI_ROW                                                                                                   \
    .family = "kivi", .group_bits = 32, .group_values = 0, .encoded_size = kvg_kivi_size,                              \
    .encode_ref = kvg_kivi_encode_ref, .decode_ref = kvg_kivi_decode_ref, .encode_simd = KVG_SIMD(kvg_kivi_encode),    \
    .decode_simd = KVG_SIMD(kvg_kivi_decode), .check = kvg_kivi_check, .score_ref = kvg_kivi_score_ref,                \
    .accumulate_ref = kvg_kivi_accumulate_ref, .score_simd = KVG_SIMD(kvg_kivi_score),                                 \
    .accumulate_simd = KVG_SIMD(kvg_kivi_accumulate)

// an f16 norm per head vector
#define KVG_ROTQ_ROW                                                                                                   \
    .family = "rotq", KVG_ROTQ_HEAD_DIM, .vector_bits = 16, .rotated = 1, .encoded_size = kvg_rotq_size,               \
    .encode_ref = kvg_rotq_encode_ref, .decode_ref = kvg_rotq_decode_ref, .encode_simd = KVG_SIMD(kvg_rotq_encode),    \
    .decode_simd = KVG_SIMD(kvg_rotq_decode), .check = kvg_rotq_check, .score_ref = kvg_rotq_score_ref,                \
    .accumulate_ref = kvg_rotq_accumulate_ref, .score_simd = KVG_SIMD(kvg_rotq_score),                                 \
    .accumulate_simd = KVG_SIMD(kvg_rotq_accumulate)

// rotq's f16 norm per head vector, and an f16 mean per channel per KVG_CROTQ_TOKENS tokens
#define KVG_CROTQ_ROW                                                                                                  \
    .family = "crotq", KVG_ROTQ_HEAD_DIM, .vector_bits = 16, .group_bits = 16, .group_values = KVG_CROTQ_TOKENS,       \
    .rotated = 1, .encoded_size = kvg_crotq_size, .encode_ref = kvg_crotq_encode_ref,                                  \
    .decode_ref = kvg_crotq_decode_ref, .encode_simd = KVG_SIMD(kvg_crotq_encode),                                     \
    .decode_simd = KVG_SIMD(kvg_crotq_decode), .check = kvg_crotq_check, .score_ref = kvg_crotq_score_ref,             \
    .accumulate_ref = kvg_crotq_accumulate_ref, .score_simd = KVG_SIMD(kvg_crotq_score),                               \
    .accumulate_simd = KVG_SIMD(kvg_crotq_accumulate)

// Codecs with side data per block (delta, outliers, low-rank, QJL): scalar encode/decode,
// attention through attend_rows.c's decode-and-dot.
#define KVG_ROWS_ROW(fam)                                                                                              \
    .family = #fam, .block_side_data = 1, .encoded_size = kvg_##fam##_size, .encode_ref = kvg_##fam##_encode_ref,      \
    .decode_ref = kvg_##fam##_decode_ref, .check = kvg_##fam##_check, .score_ref = kvg_rows_score_ref,                 \
    .accumulate_ref = kvg_rows_accumulate_ref

// pq2, vq8, vq8f: a codebook per (layer, kind), rotq's f16 norm per head vector; scalar, scored
// and summed from their codes in the rotated domain (as rotq is).
#define KVG_PQ_ROW                                                                                                     \
    .book = KVG_BOOK_CODEBOOK, .head_dim_pow2 = 1, .head_dim_min = 4, .head_dim_max = KVG_ROTQ_MAX_HEAD_DIM,           \
    .vector_bits = 16, .rotated = 1, .encoded_size = kvg_pq_size, .encode_ref = kvg_pq_encode_ref,                     \
    .decode_ref = kvg_pq_decode_ref, .check = kvg_pq_check, .score_ref = kvg_pq_score_ref,                             \
    .accumulate_ref = kvg_pq_accumulate_ref

// wfq2/3/4: a plan per (layer, kind), the gain inside the B bits; scored and summed from their
// codes in the domain of their plan (kvg_prepare_fn).
#define KVG_WFQ_ROW                                                                                                    \
    .family = "wfq", .book = KVG_BOOK_PLAN, .head_dim_min = 16, .head_dim_max = KVG_WFQ_MAX_HEAD_DIM,                  \
    .encoded_size = kvg_wfq_size, .encode_ref = kvg_wfq_encode_ref, .decode_ref = kvg_wfq_decode_ref,                  \
    .check = kvg_wfq_check, .score_ref = kvg_wfq_score_ref, .accumulate_ref = kvg_wfq_accumulate_ref,                  \
    .score_simd = KVG_SIMD(kvg_wfq_score), .accumulate_simd = KVG_SIMD(kvg_wfq_accumulate),                            \
    .prepare_q = kvg_wfq_prepare_q, .finish_acc = kvg_wfq_finish_acc

// tcq2/3/4: rotq's bytes, encoded by a Viterbi search per head vector (in vectors of 8 lanes
// under AVX2 and NEON); scored and summed from their codes in rotq's rotated domain.
#define KVG_TCQ_ROW                                                                                                    \
    .family = "tcq", KVG_ROTQ_HEAD_DIM, .vector_bits = 16, .rotated = 1, .encoded_size = kvg_rotq_size,                \
    .encode_ref = kvg_tcq_encode_ref, .decode_ref = kvg_tcq_decode_ref, .encode_simd = KVG_SIMD(kvg_tcq_encode),       \
    .check = kvg_rotq_check, .score_ref = kvg_tcq_score_ref, .accumulate_ref = kvg_tcq_accumulate_ref,                 \
    .score_simd = KVG_SIMD(kvg_tcq_score), .accumulate_simd = KVG_SIMD(kvg_tcq_accumulate)

static const kvg_codec_traits k_traits[] = {
    [KVG_CODEC_F16]      = { .name = "f16", .bits = 16, KVG_F16_ROW },
    [KVG_CODEC_KIVI2]    = { .name = "kivi2", .bits = 2, KVG_KIVI_ROW },
    [KVG_CODEC_KIVI3]    = { .name = "kivi3", .bits = 3, KVG_KIVI_ROW },
    [KVG_CODEC_KIVI4]    = { .name = "kivi4", .bits = 4, KVG_KIVI_ROW },
    [KVG_CODEC_KIVI8]    = { .name = "kivi8", .bits = 8, KVG_KIVI_ROW },
    [KVG_CODEC_ROTQ1]    = { .name = "rotq1", .bits = 1, KVG_ROTQ_ROW },
    [KVG_CODEC_ROTQ2]    = { .name = "rotq2", .bits = 2, KVG_ROTQ_ROW },
    [KVG_CODEC_ROTQ3]    = { .name = "rotq3", .bits = 3, KVG_ROTQ_ROW },
    [KVG_CODEC_ROTQ4]    = { .name = "rotq4", .bits = 4, KVG_ROTQ_ROW },
    [KVG_CODEC_CROTQ2]   = { .name = "crotq2", .bits = 2, KVG_CROTQ_ROW },
    [KVG_CODEC_CROTQ3]   = { .name = "crotq3", .bits = 3, KVG_CROTQ_ROW },
    [KVG_CODEC_CROTQ4]   = { .name = "crotq4", .bits = 4, KVG_CROTQ_ROW },
    [KVG_CODEC_DELTA4]   = { .name = "delta4", .bits = 4, KVG_ROWS_ROW(delta) },
    [KVG_CODEC_PDELTA4]  = { .name = "pdelta4", .bits = 4, KVG_ROWS_ROW(pdelta) },
    [KVG_CODEC_OUTL2]    = { .name = "outl2", .bits = 2, KVG_ROWS_ROW(outl), KVG_ROTQ_HEAD_DIM },
    [KVG_CODEC_OUTL3]    = { .name = "outl3", .bits = 3, KVG_ROWS_ROW(outl), KVG_ROTQ_HEAD_DIM },
    [KVG_CODEC_LOWRANK2] = { .name = "lowrank2", .bits = 2, KVG_ROWS_ROW(lowrank), KVG_ROTQ_HEAD_DIM },
    [KVG_CODEC_LOWRANK3] = { .name = "lowrank3", .bits = 3, KVG_ROWS_ROW(lowrank), KVG_ROTQ_HEAD_DIM },
    [KVG_CODEC_QJL3]     = { .name = "qjl3", .bits = 3, KVG_ROWS_ROW(qjl), KVG_ROTQ_HEAD_DIM },
    [KVG_CODEC_QJL4]     = { .name = "qjl4", .bits = 4, KVG_ROWS_ROW(qjl), KVG_ROTQ_HEAD_DIM },
    // pq2 codes sub-vectors of 4 coordinates, a byte each: 2 bits per value
    [KVG_CODEC_PQ2] = { .name = "pq2", .bits = 2, .family = "pq", KVG_PQ_ROW },
    [KVG_CODEC_VQ8] = { .name = "vq8", .bits = 8, .family = "vq", .vector_code = 1, KVG_PQ_ROW },
    // plus its f16 fallback vectors and their bitmask, per block
    [KVG_CODEC_VQ8F] = { .name            = "vq8f",
                         .bits            = 8,
                         .family          = "vq8f",
                         .vector_code     = 1,
                         .block_side_data = 1,
                         KVG_PQ_ROW },
    [KVG_CODEC_WFQ2] = { .name = "wfq2", .bits = 2, KVG_WFQ_ROW },
    [KVG_CODEC_WFQ3] = { .name = "wfq3", .bits = 3, KVG_WFQ_ROW },
    [KVG_CODEC_WFQ4] = { .name = "wfq4", .bits = 4, KVG_WFQ_ROW },
    [KVG_CODEC_TCQ2] = { .name = "tcq2", .bits = 2, KVG_TCQ_ROW },
    [KVG_CODEC_TCQ3] = { .name = "tcq3", .bits = 3, KVG_TCQ_ROW },
    [KVG_CODEC_TCQ4] = { .name = "tcq4", .bits = 4, KVG_TCQ_ROW },
};
_Static_assert(sizeof(k_traits) / sizeof(k_traits[0]) == KVG_CODEC_COUNT_, "one traits row per codec type");

const kvg_codec_traits * kvg_codec_traits_of(int type) {
    return type >= 0 && type < KVG_CODEC_COUNT_ ? &k_traits[type] : NULL;
}

static int is_kivi(int type) {
    return type >= KVG_CODEC_KIVI2 && type <= KVG_CODEC_KIVI8;
}

// ---- queries -------------------------------------------------------------------------------

void kvg_codec_default_params(kvg_codec_params * out) {
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof(*out));
    out->group_size = KVG_DEFAULT_GROUP_SIZE;  // KIVI's G = 32 (Liu et al. 2024, sec. 4)
    out->seed       = KVG_DEFAULT_SEED;
}

int kvg_codec_count(void) {
    return KVG_CODEC_COUNT_;
}

const char * kvg_codec_name(int type) {
    if (type < 0 || type >= KVG_CODEC_COUNT_) {
        return NULL;
    }
    return k_traits[type].name;
}

int kvg_codec_from_name(const char * name, int * out_type) {
    kvg_clear_error();
    if (name == NULL || out_type == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_codec_from_name: NULL argument");
    }
    for (int t = 0; t < KVG_CODEC_COUNT_; t++) {
        if (strcmp(name, k_traits[t].name) == 0) {
            *out_type = t;
            return KVG_OK;
        }
    }
    return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec '%.64s' is unknown", name);
}

int kvg_codec_bits(int type, int * out_bits) {
    kvg_clear_error();
    if (out_bits == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_codec_bits: NULL out_bits");
    }
    if (type < 0 || type >= KVG_CODEC_COUNT_) {
        return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec type %d is unknown", type);
    }
    *out_bits = k_traits[type].bits;
    return KVG_OK;
}

int kvg_codec_describe(int type, kvg_codec_info * out) {
    kvg_clear_error();
    if (out == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_codec_describe: NULL out");
    }
    if (type < 0 || type >= KVG_CODEC_COUNT_) {
        return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec type %d is unknown", type);
    }
    const kvg_codec_traits * tr = &k_traits[type];
    memset(out, 0, sizeof(*out));
    out->name          = tr->name;
    out->family        = tr->family;
    out->bits          = tr->bits;
    out->rotated       = tr->rotated;
    out->book          = tr->book;
    out->head_dim_pow2 = tr->head_dim_pow2;
    out->head_dim_min  = tr->head_dim_min > 0 ? tr->head_dim_min : 1;
    out->head_dim_max  = tr->head_dim_max;
    // vq8's byte codes a head vector: its bits count per vector, not per value
    out->value_bits      = tr->vector_code ? 0 : tr->bits;
    out->vector_bits     = tr->vector_bits + (tr->vector_code ? tr->bits : 0);
    out->group_bits      = tr->group_bits;
    out->group_values    = tr->group_values;
    out->block_side_data = tr->block_side_data;
    // The rest is read off the kernels the row names, so it cannot disagree with them.
    out->fused_codes = tr->score_ref != kvg_rows_score_ref;
    out->simd_ops    = (tr->encode_simd ? KVG_OP_ENCODE : 0) | (tr->decode_simd ? KVG_OP_DECODE : 0) |
                       (tr->score_simd ? KVG_OP_SCORE : 0) | (tr->accumulate_simd ? KVG_OP_ACCUMULATE : 0);
    out->simd_levels = (1 << KVG_SIMD_SCALAR) | (out->simd_ops ? (1 << KVG_SIMD_AVX2) | (1 << KVG_SIMD_NEON) : 0);
    return KVG_OK;
}

// ---- argument checking ---------------------------------------------------------------------

// Validates everything but the buffers and fills job and the exact encoded size.
int kvg_make_job(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
                 kvg_job * job, size_t * size) {
    if (type < 0 || type >= KVG_CODEC_COUNT_) {
        return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec type %d is unknown", type);
    }
    const char * name = k_traits[type].name;
    if (kind != KVG_KIND_K && kind != KVG_KIND_V) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: kind must be KVG_KIND_K (0) or KVG_KIND_V (1), got %d", name, kind);
    }
    if (n_tokens <= 0 || n_heads <= 0 || head_dim <= 0) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: n_tokens, n_heads and head_dim must be > 0, got (%lld, %lld, %lld)", name,
                        (long long) n_tokens, (long long) n_heads, (long long) head_dim);
    }
    if (n_heads > KVG_MAX_VALUES / head_dim || n_tokens > KVG_MAX_VALUES / (n_heads * head_dim)) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: shape (%lld, %lld, %lld) has more than 2^56 values", name,
                        (long long) n_tokens, (long long) n_heads, (long long) head_dim);
    }
    // Every size below (bytes of f32 values, of f16 values, of codes) is at most 4 bytes a value:
    // with a 32-bit size_t that bound is what keeps kvg_f16_size, crotq's residual and the rest exact.
    if ((uint64_t) (n_tokens * n_heads * head_dim) > (uint64_t) (SIZE_MAX / 8)) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: shape (%lld, %lld, %lld) is too large for this platform's size_t", name,
                        (long long) n_tokens, (long long) n_heads, (long long) head_dim);
    }
    kvg_codec_params defaults;
    if (p == NULL) {
        kvg_codec_default_params(&defaults);
        p = &defaults;
    }
    if (is_kivi(type) && p->group_size <= 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: group_size must be > 0, got %d", name, (int) p->group_size);
    }
    memset(job, 0, sizeof(*job));
    job->type       = type;
    job->kind       = kind;
    job->bits       = k_traits[type].bits;
    job->n_tokens   = n_tokens;
    job->n_heads    = n_heads;
    job->head_dim   = head_dim;
    job->n_channels = n_heads * head_dim;
    job->n_values   = n_tokens * n_heads * head_dim;
    job->group_size = p->group_size;
    job->seed       = p->seed;
    job->book       = p->book;
    job->book_count = p->book_count;
    return k_traits[type].encoded_size(job, size);
}

// Index of the first NaN/Inf in x, or -1. Branch-free inner loop so the compiler vectorizes it.
static int64_t first_nonfinite(const float * x, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1  = i0 + 4096 < n ? i0 + 4096 : n;
        uint32_t      bad = 0;
        for (int64_t i = i0; i < i1; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof(u));
            bad |= ((u & 0x7f800000u) + 0x00800000u) & 0x80000000u;  // exponent all ones carries into bit 31
        }
        if (bad) {
            for (int64_t i = i0; i < i1; i++) {
                uint32_t u;
                memcpy(&u, &x[i], sizeof(u));
                if ((u & 0x7f800000u) == 0x7f800000u) {
                    return i;
                }
            }
        }
    }
    return -1;
}

// ---- encode / decode -----------------------------------------------------------------------

int kvg_encoded_size(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     const kvg_codec_params * p, size_t * out_bytes) {
    kvg_clear_error();
    if (out_bytes == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_encoded_size: NULL out_bytes");
    }
    kvg_job job;
    return kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, out_bytes);
}

int kvg_encode(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, const kvg_codec_params * p, void * dst, size_t dst_bytes, size_t * out_written) {
    kvg_clear_error();
    if (out_written != NULL) {
        *out_written = 0;
    }
    kvg_job job;
    size_t  size = 0;
    int     st   = kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, &size);
    if (st != KVG_OK) {
        return st;
    }
    const char * name = k_traits[type].name;
    if (src == NULL || dst == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s encode: NULL src or dst", name);
    }
    if (src_count != (size_t) job.n_values) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s encode: src holds %zu floats, shape (%lld, %lld, %lld) needs %lld",
                        name, src_count, (long long) n_tokens, (long long) n_heads, (long long) head_dim,
                        (long long) job.n_values);
    }
    if (dst_bytes < size) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s encode: dst holds %zu bytes, needs %zu", name, dst_bytes, size);
    }
    const int64_t bad = first_nonfinite(src, job.n_values);
    if (bad >= 0) {
        return kvg_fail(KVG_ERR_NONFINITE, "%s encode: NaN or Inf at token %lld, channel %lld", name,
                        (long long) (bad / job.n_channels), (long long) (bad % job.n_channels));
    }
    const kvg_codec_traits * tr = &k_traits[type];
    st                          = KVG_NOT_HANDLED;
    if (tr->encode_simd != NULL && kvg_simd_on()) {
        st = tr->encode_simd(&job, src, (uint8_t *) dst);
    }
    if (st == KVG_NOT_HANDLED) {
        st = tr->encode_ref(&job, src, (uint8_t *) dst);
    }
    if (st == KVG_OK && out_written != NULL) {
        *out_written = size;
    }
    return st;
}

int kvg_decode(int type, int kind, const void * src, size_t src_bytes, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, const kvg_codec_params * p, float * dst, size_t dst_count) {
    kvg_clear_error();
    kvg_job job;
    size_t  size = 0;
    int     st   = kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, &size);
    if (st != KVG_OK) {
        return st;
    }
    const char * name = k_traits[type].name;
    if (src == NULL || dst == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s decode: NULL src or dst", name);
    }
    if (src_bytes != size) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE,
                        "%s decode: src holds %zu bytes, shape (%lld, %lld, %lld) encodes to exactly %zu", name,
                        src_bytes, (long long) n_tokens, (long long) n_heads, (long long) head_dim, size);
    }
    if (dst_count != (size_t) job.n_values) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s decode: dst holds %zu floats, shape needs %lld", name, dst_count,
                        (long long) job.n_values);
    }
    const kvg_codec_traits * tr = &k_traits[type];
    st                          = KVG_NOT_HANDLED;
    if (tr->decode_simd != NULL && kvg_simd_on()) {
        st = tr->decode_simd(&job, (const uint8_t *) src, dst);
    }
    if (st == KVG_NOT_HANDLED) {
        st = tr->decode_ref(&job, (const uint8_t *) src, dst);
    }
    return st;
}

int kvg_check_encoded(int type, int kind, const void * src, size_t src_bytes, int64_t n_tokens, int64_t n_heads,
                      int64_t head_dim, const kvg_codec_params * p) {
    kvg_job job;
    size_t  size = 0;
    int     st   = kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, &size);
    if (st != KVG_OK) {
        return st;
    }
    if (src == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s check: NULL src", k_traits[type].name);
    }
    if (src_bytes != size) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%s check: %zu bytes, shape (%lld, %lld, %lld) encodes to exactly %zu",
                        k_traits[type].name, src_bytes, (long long) n_tokens, (long long) n_heads, (long long) head_dim,
                        size);
    }
    return k_traits[type].check(&job, (const uint8_t *) src);
}
