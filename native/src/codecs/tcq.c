// tcq.c: rotq's random-sign Hadamard rotation and f16 norm per head vector, then a bitshift
// trellis code instead of a scalar one (trellis-coded quantization, Marcellin & Fischer 1990;
// the bitshift trellis of QTIP, Tseng et al. 2024). Each value still costs B bits of the
// stream, but value i is read from the 8-bit window of the stream that ends with its own B
// bits, looked up in a table of 256 trained levels (tcq_tables.h): consecutive values share
// bits, so the encoder picks the whole vector's codes together (Viterbi over the 256 windows)
// and reaches errors a scalar code of the same B bits cannot. Decoding is one window read and
// one table lookup per value, in any order. Bits per value: B + 16/d, as rotq's.
//
// Measured on unit-variance Gaussian rows of 64 (scripts/tcq_tables.py), mean squared error
// against rotq's Lloyd-Max levels: 2 bits 0.085 vs 0.118, 3 bits 0.024 vs 0.035, 4 bits
// 0.0068 vs 0.0095 (a quarter of a bit). A window of 8 bits keeps the search at 256 states
// per value; starting every vector from zero bits (no bits borrowed from its neighbours, so
// any value decodes alone) costs its first values some choice.
#include "kvg_internal.h"
#include "tcq_tables.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// The Viterbi search (tcq_viterbi.h), here in plain loops: the scalar oracle.
#define TCQ_VECTOR_EXT 0
#define TCQ_VITERBI    tcq_viterbi_ref
#include "tcq_viterbi.h"

_Static_assert(sizeof(k_tcq_levels[0]) == sizeof(float) * TCQ_STATES, "a level per window");

const float * kvg_tcq_levels(int bits) {
    return k_tcq_levels[bits - 2];
}

int kvg_tcq_table(int bits, float * out, size_t out_count) {
    kvg_clear_error();
    if (bits < 2 || bits > 4) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "tcq levels: bits must be 2..4, got %d", bits);
    }
    if (out == NULL || out_count != TCQ_STATES) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "tcq levels: out must hold exactly %d floats", TCQ_STATES);
    }
    memcpy(out, kvg_tcq_levels(bits), sizeof(float) * TCQ_STATES);
    return KVG_OK;
}

// Window of value i of a vector whose codes start at bit b0: the TCQ_L bits ending with value
// i's own, the bits before b0 read as 0. Reads only bytes that hold the vector's codes.
static inline unsigned tcq_window(const uint8_t * codes, uint64_t b0, int64_t i, int bits) {
    const uint64_t  end   = b0 + (uint64_t) (bits * (i + 1));
    uint64_t        start = end >= b0 + TCQ_L ? end - TCQ_L : b0;
    const unsigned  lost  = (unsigned) (TCQ_L - (end - start));
    const uint8_t * p     = codes + (start >> 3);
    unsigned        w     = p[0];
    if (((end - 1) >> 3) > (start >> 3)) {
        w |= (unsigned) p[1] << 8;
    }
    w = (w >> (start & 7)) & ((1u << (TCQ_L - lost)) - 1);
    return (w << lost) & (TCQ_STATES - 1);
}

// Levels of values [0, d) of the vector whose codes start at bit b0 of codes.
static void levels_of(const uint8_t * codes, uint64_t b0, int64_t d, int bits, float * out) {
    const float * T = kvg_tcq_levels(bits);
    for (int64_t i = 0; i < d; i++) {
        out[i] = T[tcq_window(codes, b0, i, bits)];
    }
}

// Encodes TCQ_LANES head vectors per search.
int kvg_tcq_encode_with(const kvg_job * job, const float * src, uint8_t * dst, kvg_tcq_viterbi_fn viterbi) {
    const int64_t d    = job->head_dim;
    const int64_t nv   = job->n_tokens * job->n_heads;
    const int     bits = job->bits;
    const int     G    = 1 << (TCQ_L - bits);
    const float * T    = kvg_tcq_levels(bits);

    uint8_t * norms = dst;
    uint8_t * codes = dst + (size_t) nv * 2;
    memset(codes, 0, (size_t) kvg_code_bytes(job->n_values, bits));
    const size_t lanes_f = (size_t) d * TCQ_LANES;
    uint32_t *   back    = (uint32_t *) malloc(sizeof(uint32_t) * lanes_f * (size_t) G);  // [d][G][TCQ_LANES]
    float *      sgn     = (float *) malloc(sizeof(float) * ((size_t) d + lanes_f) + lanes_f * 2);
    if (back == NULL || sgn == NULL) {
        free(back);
        free(sgn);
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate scratch", kvg_codec_name(job->type));
    }
    float *   y  = sgn + d;                    // [d][TCQ_LANES]
    uint8_t * ql = (uint8_t *) (y + lanes_f);  // [d][TCQ_LANES]
    uint8_t * q  = ql + lanes_f;               // one vector's codes (first its d floats of y)
    kvg_rotq_signs(job->seed, d, sgn);

    int st = KVG_OK;
    for (int64_t v0 = 0; v0 < nv && st == KVG_OK; v0 += TCQ_LANES) {
        memset(y, 0, sizeof(float) * lanes_f);  // lanes past the last vector search zeros
        int live = 0;                           // lanes whose vector has a norm: the others are coded as zeros
        for (int l = 0; l < TCQ_LANES && v0 + l < nv; l++) {
            const int64_t v   = v0 + l;
            float *       yl  = (float *) q;  // d floats of scratch: q is not needed until the search is done
            uint16_t      n16 = 0;
            st                = kvg_rotq_rotate(kvg_codec_name(job->type), src + v * d, d, sgn, yl, &n16);
            if (st != KVG_OK) {
                char msg[192];
                snprintf(msg, sizeof(msg), "%s", kvg_last_error());
                kvg_fail(st, "%s, at token %lld, head %lld", msg, (long long) (v / job->n_heads),
                         (long long) (v % job->n_heads));
                break;
            }
            kvg_put_u16(norms + 2 * v, n16);
            live |= (n16 != 0) << l;
            for (int64_t i = 0; i < d; i++) {
                y[i * TCQ_LANES + l] = n16 != 0 ? yl[i] : 0.0f;
            }
        }
        if (st != KVG_OK || live == 0) {
            continue;
        }
        viterbi(y, d, bits, T, back, ql);
        for (int l = 0; l < TCQ_LANES; l++) {
            if (live >> l & 1) {
                for (int64_t i = 0; i < d; i++) {
                    q[i] = ql[i * TCQ_LANES + l];
                }
                kvg_pack_bits(codes, (uint64_t) ((v0 + l) * d) * (uint64_t) bits, q, (size_t) d, bits);
            }
        }
    }
    free(back);
    free(sgn);
    return st;
}

int kvg_tcq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    return kvg_tcq_encode_with(job, src, dst, tcq_viterbi_ref);
}

// Decodes one vector whose f16 norm is the finite, positive nf (kvg_rotq_decode_with's loop):
// its levels in place of rotq's centroids, then rotq's inverse rotation.
static void decode_vec(const uint8_t * codes, uint64_t bit_off, int64_t d, int bits, const kvg_rotq_book * book,
                       const float * sgn, float nf, float * out, uint8_t * q) {
    (void) book;
    (void) q;
    levels_of(codes, bit_off, d, bits, out);
    kvg_fwht_ref(out, d);
    const float f = nf * (1.0f / (float) d);  // W W = d I
    for (int64_t i = 0; i < d; i++) {
        out[i] = (out[i] * f) * sgn[i];
    }
}

static const kvg_rotq_ops k_tcq_ops = { NULL, decode_vec };  // encoding searches 8 vectors at once instead

int kvg_tcq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    return kvg_rotq_decode_with(job, src, dst, &k_tcq_ops);
}

// ---- attention (scalar oracle) -------------------------------------------------------------
//
// In rotq's rotated domain (attend.c's DOM_ROT): keys are scored as (n / d) * qr . levels and
// values add (n / d) * p * levels into accr, exactly as rotq's codes do with their centroids.

// The levels of row t's head hk into lv, and its norm / D (0 for a zero vector: lv untouched).
static float row_levels(const kvg_job * job, const uint8_t * src, int64_t t, int64_t hk, float * lv) {
    const int64_t v = t * job->n_heads + hk;
    const float   f = kvg_f16_to_f32(kvg_get_u16(src + 2 * v)) * (1.0f / (float) job->head_dim);
    if (f != 0.0f) {
        const uint8_t * codes = src + (size_t) (job->n_tokens * job->n_heads) * 2;
        levels_of(codes, (uint64_t) (v * job->head_dim) * (uint64_t) job->bits, job->head_dim, job->bits, lv);
    }
    return f;
}

int kvg_tcq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                      float * out) {
    const int64_t D  = job->head_dim;
    float *       lv = a->tmp;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const float f = row_levels(job, src, t, hk, lv);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * qr = a->qr + j * D;
                float         s  = 0.0f;
                for (int64_t i = 0; i < D && f != 0.0f; i++) {
                    s += qr[i] * lv[i];
                }
                out[j * n + (t - t0)] = f * s;
            }
        }
    }
    return KVG_OK;
}

int kvg_tcq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a) {
    const int64_t D  = job->head_dim;
    float *       lv = a->tmp;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const float f = row_levels(job, src, t, hk, lv);
            if (f == 0.0f) {
                continue;  // a zero vector adds nothing
            }
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + (t - t0)] * f;
                float *     acc = a->accr + j * D;
                for (int64_t i = 0; i < D; i++) {
                    acc[i] += w * lv[i];
                }
            }
        }
    }
    return KVG_OK;
}
