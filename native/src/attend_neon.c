// attend_neon.c: NEON attention kernels (scores and value sums straight from the codes) for
// f16, kivi, rotq and crotq, the AArch64 counterparts of attend_avx2.c with the same structure.
// Like those, they sum with fused multiply-adds in another order than the scalar oracles, so
// they agree with them to float rounding (tests/test_attend.py's TOL_SIMD), not bit for bit.
//
// Both kernels dequantize 8 lanes (two registers) of one row's head at a time and use them for
// every query that reads that KV head (GQA), up to KVG_QB queries held in registers:
// - score: row by row, one accumulator pair per query, reduced once per row;
// - accumulate: 8 output lanes at a time, rows inner, the accumulators held in registers over
//   the whole chunk.
#include "kvg_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

#    include "kvg_neon.h"

#    include <math.h>

#    if defined(__GNUC__)
#        define KVG_INLINE static inline __attribute__((always_inline))
#    else
#        define KVG_INLINE static inline
#    endif

#    define KVG_QB 4  // queries per register block: 4 x 4 accumulators of 32 registers

// What 8 lanes of a row's head are made of.
enum {
    LANES_F16 = 0,  // stored halves
    LANES_CB  = 1,  // rotq codebook values of the codes
    LANES_INT = 2,  // the codes themselves, as floats (kivi: scale and min are folded elsewhere)
};

typedef struct lanes {
    codes8       c;
    uint8x16x4_t cb;  // rotq centroids 0..15 as a byte table
} lanes;

static lanes make_lanes(int bits, const float * cb) {
    static const float zero[16] = { 0 };
    lanes              L;
    L.c  = make_codes8(bits);
    L.cb = load_book(cb ? cb : zero);
    return L;
}

// Lanes i..i+7 of the head that starts at `row` (bytes of halves, or of codes starting on a
// byte boundary; i is a multiple of 8, so 8 codes take exactly `bits` bytes).
KVG_INLINE f32x8 load_lanes(int fam, int bits, const lanes * L, const uint8_t * row, int64_t i) {
    f32x8 v;
    if (fam == LANES_F16) {
        const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(row + 2 * i));  // bytes: rows need no alignment
        v.lo                = vcvt_f32_f16(vget_low_f16(h));
        v.hi                = vcvt_high_f32_f16(h);
        return v;
    }
    const u32x8 idx = unpack8(row + (i / 8) * bits, bits, &L->c);
    if (fam == LANES_INT) {
        v.lo = vcvtq_f32_u32(idx.lo);
        v.hi = vcvtq_f32_u32(idx.hi);
        return v;
    }
    v.lo = book_lookup(&L->cb, idx.lo);
    v.hi = book_lookup(&L->cb, idx.hi);
    return v;
}

// res[g] = dot(q + g * D, the head at row) for g < nq; nq is a constant once inlined.
KVG_INLINE void dot_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row, int64_t D,
                          const float * q, float * res) {
    float32x4_t lo[KVG_QB], hi[KVG_QB];
    for (int g = 0; g < nq; g++) {
        lo[g] = vdupq_n_f32(0.0f);
        hi[g] = vdupq_n_f32(0.0f);
    }
    for (int64_t i = 0; i < D; i += 8) {
        const f32x8 k = load_lanes(fam, bits, L, row, i);
        for (int g = 0; g < nq; g++) {
            lo[g] = vfmaq_f32(lo[g], vld1q_f32(q + g * D + i), k.lo);
            hi[g] = vfmaq_f32(hi[g], vld1q_f32(q + g * D + i + 4), k.hi);
        }
    }
    for (int g = 0; g < nq; g++) {
        res[g] = vaddvq_f32(vaddq_f32(lo[g], hi[g]));
    }
}

// Scores of one head of one row against the per_head queries of its KV head (q: the first of
// them, contiguous): res[g] for g < P.
KVG_INLINE void dot_queries(int fam, int bits, const lanes * L, const uint8_t * row, int64_t D, const float * q,
                            int64_t P, float * res) {
    for (int64_t g0 = 0; g0 < P; g0 += KVG_QB) {
        const float * qg = q + g0 * D;
        float *       rg = res + g0;
        switch (P - g0 < KVG_QB ? P - g0 : KVG_QB) {
            case 1:  dot_block(fam, bits, 1, L, row, D, qg, rg); break;
            case 2:  dot_block(fam, bits, 2, L, row, D, qg, rg); break;
            case 3:  dot_block(fam, bits, 3, L, row, D, qg, rg); break;
            default: dot_block(fam, bits, 4, L, row, D, qg, rg); break;
        }
    }
}

// acc[g * D + i] += sum over t < n of w[g * n + t] * lanes(row t, i), for g < nq, every i.
// Row t's head starts at row0 + t * stride. Two accumulators per query (even and odd rows)
// halve the dependency chain of the sum.
KVG_INLINE void axpy_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row0, int64_t stride,
                           int64_t n, const float * w, float * acc, int64_t D) {
    for (int64_t i = 0; i < D; i += 8) {
        f32x8 a0[KVG_QB], a1[KVG_QB];
        for (int g = 0; g < nq; g++) {
            a0[g].lo = vld1q_f32(acc + g * D + i);
            a0[g].hi = vld1q_f32(acc + g * D + i + 4);
            a1[g].lo = vdupq_n_f32(0.0f);
            a1[g].hi = vdupq_n_f32(0.0f);
        }
        const uint8_t * row = row0;
        int64_t         t   = 0;
        for (; t + 2 <= n; t += 2, row += 2 * stride) {
            const f32x8 v0 = load_lanes(fam, bits, L, row, i);
            const f32x8 v1 = load_lanes(fam, bits, L, row + stride, i);
            for (int g = 0; g < nq; g++) {
                const float w0 = w[g * n + t], w1 = w[g * n + t + 1];
                a0[g].lo       = vfmaq_n_f32(a0[g].lo, v0.lo, w0);
                a0[g].hi       = vfmaq_n_f32(a0[g].hi, v0.hi, w0);
                a1[g].lo       = vfmaq_n_f32(a1[g].lo, v1.lo, w1);
                a1[g].hi       = vfmaq_n_f32(a1[g].hi, v1.hi, w1);
            }
        }
        if (t < n) {
            const f32x8 v0 = load_lanes(fam, bits, L, row, i);
            for (int g = 0; g < nq; g++) {
                a0[g].lo = vfmaq_n_f32(a0[g].lo, v0.lo, w[g * n + t]);
                a0[g].hi = vfmaq_n_f32(a0[g].hi, v0.hi, w[g * n + t]);
            }
        }
        for (int g = 0; g < nq; g++) {
            vst1q_f32(acc + g * D + i, vaddq_f32(a0[g].lo, a1[g].lo));
            vst1q_f32(acc + g * D + i + 4, vaddq_f32(a0[g].hi, a1[g].hi));
        }
    }
}

KVG_INLINE void axpy_queries(int fam, int bits, const lanes * L, const uint8_t * row0, int64_t stride, int64_t n,
                             const float * w, float * acc, int64_t D, int64_t P) {
    for (int64_t g0 = 0; g0 < P; g0 += KVG_QB) {
        const float * wg = w + g0 * n;
        float *       ag = acc + g0 * D;
        switch (P - g0 < KVG_QB ? P - g0 : KVG_QB) {
            case 1:  axpy_block(fam, bits, 1, L, row0, stride, n, wg, ag, D); break;
            case 2:  axpy_block(fam, bits, 2, L, row0, stride, n, wg, ag, D); break;
            case 3:  axpy_block(fam, bits, 3, L, row0, stride, n, wg, ag, D); break;
            default: axpy_block(fam, bits, 4, L, row0, stride, n, wg, ag, D); break;
        }
    }
}

// ---- f16 -----------------------------------------------------------------------------------

int kvg_f16_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    const int64_t D = job->head_dim, C = job->n_channels, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    const lanes L   = make_lanes(1, NULL);
    float *     res = a->tmp;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            dot_queries(LANES_F16, 16, &L, src + 2 * ((t0 + t) * C + hk * D), D, a->q + hk * P * D, P, res);
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = res[g];
            }
        }
    }
    return KVG_OK;
}

int kvg_f16_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    const int64_t D = job->head_dim, C = job->n_channels, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    const lanes L = make_lanes(1, NULL);
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        axpy_queries(LANES_F16, 16, &L, src + 2 * (t0 * C + hk * D), 2 * C, n, p + hk * P * n, a->acc + hk * P * D, D, P);
    }
    return KVG_OK;
}

// ---- rotq ----------------------------------------------------------------------------------

KVG_INLINE void rotq_score_bits(int bits, const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n,
                                const kvg_attn * a, float * out) {
    const int64_t   D = job->head_dim, H = job->n_heads, P = a->per_head;
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    const lanes     L     = make_lanes(bits, kvg_rotq_get_book(D)->centroid[bits]);
    const float     inv_d = 1.0f / (float) D;
    float *         res   = a->tmp;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const int64_t v = (t0 + t) * H + hk;
            const float   f = kvg_f16_to_f32(kvg_get_u16(src + 2 * v)) * inv_d;
            dot_queries(LANES_CB, bits, &L, codes + (size_t) (v * D / 8) * (size_t) bits, D, a->qr + hk * P * D, P, res);
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = f * res[g];
            }
        }
    }
}

int kvg_rotq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    switch (job->bits) {
        case 1:  rotq_score_bits(1, job, src, t0, n, a, out); break;
        case 2:  rotq_score_bits(2, job, src, t0, n, a, out); break;
        case 3:  rotq_score_bits(3, job, src, t0, n, a, out); break;
        case 4:  rotq_score_bits(4, job, src, t0, n, a, out); break;
        default: return KVG_NOT_HANDLED;
    }
    return KVG_OK;
}

KVG_INLINE void rotq_accumulate_bits(int bits, const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n,
                                     const float * p, const kvg_attn * a) {
    const int64_t   D = job->head_dim, H = job->n_heads, P = a->per_head;
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    const lanes     L     = make_lanes(bits, kvg_rotq_get_book(D)->centroid[bits]);
    const float     inv_d = 1.0f / (float) D;
    float *         w     = a->tmp;  // [P][n]: p * norm / D
    for (int64_t hk = 0; hk < H; hk++) {
        for (int64_t t = 0; t < n; t++) {
            const float f = kvg_f16_to_f32(kvg_get_u16(src + 2 * ((t0 + t) * H + hk))) * inv_d;
            for (int64_t g = 0; g < P; g++) {
                w[g * n + t] = p[(hk * P + g) * n + t] * f;
            }
        }
        const uint8_t * row0 = codes + (size_t) ((t0 * H + hk) * D / 8) * (size_t) bits;
        axpy_queries(LANES_CB, bits, &L, row0, H * D / 8 * bits, n, w, a->accr + hk * P * D, D, P);
    }
}

int kvg_rotq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    switch (job->bits) {
        case 1:  rotq_accumulate_bits(1, job, src, t0, n, p, a); break;
        case 2:  rotq_accumulate_bits(2, job, src, t0, n, p, a); break;
        case 3:  rotq_accumulate_bits(3, job, src, t0, n, p, a); break;
        case 4:  rotq_accumulate_bits(4, job, src, t0, n, p, a); break;
        default: return KVG_NOT_HANDLED;
    }
    return KVG_OK;
}

// ---- kivi ----------------------------------------------------------------------------------

// Keys: per token group, q * scale and q . min (as the oracle folds them), then codes only.
KVG_INLINE void kivi_score_bits(int bits, const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n,
                                const kvg_attn * a, float * out) {
    const int64_t          D = job->head_dim, C = job->n_channels, G = job->group_size, P = a->per_head;
    const kvg_kivi_group * groups = (const kvg_kivi_group *) src;
    const uint8_t *        codes  = src + (size_t) kvg_kivi_n_groups(job) * sizeof(kvg_kivi_group);
    const lanes            L      = make_lanes(bits, NULL);
    float *                qf     = a->tmp;           // [n_q][D]
    float *                qm     = qf + a->n_q * D;  // [n_q]
    float *                mn     = qm + a->n_q;      // [D]
    float *                sc     = mn + D;           // [D]
    float *                res    = sc + D;           // [P]
    for (int64_t t = t0; t < t0 + n;) {
        const int64_t tg = t / G;
        const int64_t e  = (tg + 1) * G < t0 + n ? (tg + 1) * G : t0 + n;
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const kvg_kivi_group * g = groups + tg * C + hk * D;
            for (int64_t i = 0; i < D; i++) {
                mn[i] = kvg_f16_to_f32(kvg_get_u16(g[i].min_f16));
                sc[i] = kvg_f16_to_f32(kvg_get_u16(g[i].scale_f16));
            }
            for (int64_t j = hk * P; j < (hk + 1) * P; j++) {
                const float * qj = a->q + j * D;
                float32x4_t   s  = vdupq_n_f32(0.0f);
                for (int64_t i = 0; i < D; i += 4) {
                    const float32x4_t qv = vld1q_f32(qj + i);
                    vst1q_f32(qf + j * D + i, vmulq_f32(qv, vld1q_f32(sc + i)));
                    s = vfmaq_f32(s, qv, vld1q_f32(mn + i));
                }
                qm[j] = vaddvq_f32(s);
            }
        }
        for (int64_t u = t; u < e; u++) {
            for (int64_t hk = 0; hk < job->n_heads; hk++) {
                const uint8_t * row = codes + (size_t) ((u * C + hk * D) / 8) * (size_t) bits;
                dot_queries(LANES_INT, bits, &L, row, D, qf + hk * P * D, P, res);
                for (int64_t g = 0; g < P; g++) {
                    out[(hk * P + g) * n + (u - t0)] = qm[hk * P + g] + res[g];
                }
            }
        }
        t = e;
    }
}

int kvg_kivi_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    if (job->head_dim % 8 != 0) {
        return KVG_NOT_HANDLED;  // heads would not start on byte boundaries
    }
    switch (job->bits) {
        case 2:  kivi_score_bits(2, job, src, t0, n, a, out); break;
        case 3:  kivi_score_bits(3, job, src, t0, n, a, out); break;
        case 4:  kivi_score_bits(4, job, src, t0, n, a, out); break;
        case 8:  kivi_score_bits(8, job, src, t0, n, a, out); break;
        default: return KVG_NOT_HANDLED;
    }
    return KVG_OK;
}

// Values: with G a multiple of 8, each 8 lanes of a row share one group, whose (min, scale) of
// row t are mn[t * ng + k], sc[t * ng + k] with k the group's index among the head's groups.
KVG_INLINE void kivi_axpy_block(int bits, int nq, const lanes * L, const uint8_t * row0, int64_t stride, int64_t n,
                                const float * w, float * acc, int64_t D, const float * mn, const float * sc,
                                int64_t ng, int64_t c0, int64_t G) {
    for (int64_t i = 0; i < D; i += 8) {
        const int64_t k = (c0 + i) / G - c0 / G;
        f32x8         s[KVG_QB];
        for (int g = 0; g < nq; g++) {
            s[g].lo = vld1q_f32(acc + g * D + i);
            s[g].hi = vld1q_f32(acc + g * D + i + 4);
        }
        const uint8_t * row = row0;
        for (int64_t t = 0; t < n; t++, row += stride) {
            const f32x8       c  = load_lanes(LANES_INT, bits, L, row, i);
            const float32x4_t m  = vdupq_n_f32(mn[t * ng + k]);
            const float       sk = sc[t * ng + k];
            const f32x8       v  = { vfmaq_n_f32(m, c.lo, sk), vfmaq_n_f32(m, c.hi, sk) };
            for (int g = 0; g < nq; g++) {
                s[g].lo = vfmaq_n_f32(s[g].lo, v.lo, w[g * n + t]);
                s[g].hi = vfmaq_n_f32(s[g].hi, v.hi, w[g * n + t]);
            }
        }
        for (int g = 0; g < nq; g++) {
            vst1q_f32(acc + g * D + i, s[g].lo);
            vst1q_f32(acc + g * D + i + 4, s[g].hi);
        }
    }
}

KVG_INLINE void kivi_accumulate_bits(int bits, const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n,
                                     const float * p, const kvg_attn * a) {
    const int64_t          D = job->head_dim, C = job->n_channels, G = job->group_size, P = a->per_head;
    const int64_t          n_cg   = (C + G - 1) / G;
    const kvg_kivi_group * groups = (const kvg_kivi_group *) src;
    const uint8_t *        codes  = src + (size_t) kvg_kivi_n_groups(job) * sizeof(kvg_kivi_group);
    const lanes            L      = make_lanes(bits, NULL);
    const int64_t          stride = C / 8 * bits;
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        const int64_t c0 = hk * D;
        const int64_t ng = (c0 + D - 1) / G - c0 / G + 1;  // groups the head touches
        float *       mn = a->tmp;                          // [n][ng]
        float *       sc = mn + n * ng;                     // [n][ng]
        for (int64_t t = 0; t < n; t++) {
            for (int64_t k = 0; k < ng; k++) {
                const kvg_kivi_group * g = groups + (t0 + t) * n_cg + c0 / G + k;
                mn[t * ng + k]           = kvg_f16_to_f32(kvg_get_u16(g->min_f16));
                sc[t * ng + k]           = kvg_f16_to_f32(kvg_get_u16(g->scale_f16));
            }
        }
        const uint8_t * row0 = codes + (size_t) ((t0 * C + c0) / 8) * (size_t) bits;
        for (int64_t g0 = 0; g0 < P; g0 += KVG_QB) {
            const float * w   = p + (hk * P + g0) * n;
            float *       acc = a->acc + (hk * P + g0) * D;
            switch (P - g0 < KVG_QB ? P - g0 : KVG_QB) {
                case 1:  kivi_axpy_block(bits, 1, &L, row0, stride, n, w, acc, D, mn, sc, ng, c0, G); break;
                case 2:  kivi_axpy_block(bits, 2, &L, row0, stride, n, w, acc, D, mn, sc, ng, c0, G); break;
                case 3:  kivi_axpy_block(bits, 3, &L, row0, stride, n, w, acc, D, mn, sc, ng, c0, G); break;
                default: kivi_axpy_block(bits, 4, &L, row0, stride, n, w, acc, D, mn, sc, ng, c0, G); break;
            }
        }
    }
}

int kvg_kivi_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    if (job->head_dim % 8 != 0 || job->group_size % 8 != 0) {
        return KVG_NOT_HANDLED;  // heads off byte boundaries, or 8 lanes spanning two groups
    }
    switch (job->bits) {
        case 2:  kivi_accumulate_bits(2, job, src, t0, n, p, a); break;
        case 3:  kivi_accumulate_bits(3, job, src, t0, n, p, a); break;
        case 4:  kivi_accumulate_bits(4, job, src, t0, n, p, a); break;
        case 8:  kivi_accumulate_bits(8, job, src, t0, n, p, a); break;
        default: return KVG_NOT_HANDLED;
    }
    return KVG_OK;
}

// ---- online softmax ------------------------------------------------------------------------

// exp(x) for x <= 0, as attend_avx2.c computes it: x = k ln2 + r with |r| <= ln2 / 2, the
// Taylor series of exp(r) to r^7 (remainder < 0.347^8 / 8! < 6e-9, relative) times 2^k from the
// exponent bits. Below -87 (exp < 2^-125, nothing next to the maximum's weight of 1) gives 0.
static inline float32x4_t exp_nonpos(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(-87.0f);
    const float32x4_t xc = vmaxq_f32(x, lo);
    const float32x4_t k  = vrndnq_f32(vmulq_n_f32(xc, 1.44269504088896341f));
    float32x4_t       r  = vfmsq_n_f32(xc, k, 0.693359375f);  // ln2 in two parts (Cody and Waite)
    r                    = vfmsq_n_f32(r, k, -2.12194440054690583e-4f);
    float32x4_t p        = vdupq_n_f32(1.0f / 5040.0f);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t   e  = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    const float32x4_t y  = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), vcltq_f32(x, lo)));
}

static void scale_row(float * x, int64_t n, float f) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), f));
    }
    for (; i < n; i++) {
        x[i] *= f;
    }
}

void kvg_attn_softmax_neon(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated) {
    for (int64_t j = 0; j < a->n_q; j++) {
        float * sj = s + j * n;
        int64_t t  = 0;
        float   mx = sj[0];
        if (n >= 4) {
            float32x4_t vm = vld1q_f32(sj);
            for (t = 4; t + 4 <= n; t += 4) {
                vm = vmaxq_f32(vm, vld1q_f32(sj + t));
            }
            mx = vmaxvq_f32(vm);
        }
        for (; t < n; t++) {
            mx = sj[t] > mx ? sj[t] : mx;
        }
        if (mx > m[j]) {
            const float corr = expf(m[j] - mx);  // 0 while m is -inf
            l[j] *= corr;
            scale_row(a->acc + j * dv, dv, corr);
            if (rotated) {
                scale_row(a->accr + j * dv, dv, corr);
            }
            m[j] = mx;
        }
        const float32x4_t vmj  = vdupq_n_f32(m[j]);
        float32x4_t       vsum = vdupq_n_f32(0.0f);
        for (t = 0; t + 4 <= n; t += 4) {
            const float32x4_t e = exp_nonpos(vsubq_f32(vld1q_f32(sj + t), vmj));
            vst1q_f32(sj + t, e);
            vsum = vaddq_f32(vsum, e);
        }
        float sum = vaddvq_f32(vsum);
        for (; t < n; t++) {
            sj[t] = expf(sj[t] - m[j]);
            sum += sj[t];
        }
        l[j] += sum;
    }
}

#else  // not an AArch64 build: the dispatcher never selects these

void kvg_attn_softmax_neon(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated) {
    kvg_attn_softmax_ref(a, m, l, s, n, dv, rotated);
}

int kvg_f16_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_f16_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_score_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_accumulate_neon(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

#endif
