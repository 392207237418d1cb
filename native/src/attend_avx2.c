// attend_avx2.c: AVX2 attention kernels (scores and value sums straight from the codes) for
// f16, kivi, rotq and crotq. The scalar oracles live with their codecs (f16.c, kivi.c, rotq.c,
// crotq.c); these compute the same sums with fused multiply-adds in another order, so they
// agree to float rounding, not bit for bit.
//
// Both kernels dequantize 8 lanes of one row's head at a time and use them for every query
// that reads that KV head (GQA), up to KVG_QB queries held in registers:
// - score: row by row, one accumulator per query, reduced once per row;
// - accumulate: 8 output lanes at a time, rows inner, the accumulators held in registers over
//   the whole chunk.
#include "kvg_internal.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#    include "kvg_avx2.h"

#    include <math.h>

#    if defined(__GNUC__)
#        define KVG_INLINE static inline __attribute__((always_inline))
#    else
#        define KVG_INLINE static inline
#    endif

#    define KVG_QB 4  // queries per register block

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// What 8 lanes of a row's head are made of.
enum {
    LANES_F16 = 0,  // stored halves
    LANES_CB  = 1,  // rotq codebook values of the codes
    LANES_INT = 2,  // the codes themselves, as floats (kivi: scale and min are folded elsewhere)
};

typedef struct lanes {
    __m256i sh;
    __m256i mask;
    __m256  cb_lo;  // rotq centroids 0..7 and 8..15
    __m256  cb_hi;
} lanes;

static lanes make_lanes(int bits, const float * cb) {
    lanes L;
    L.sh    = lane_shifts(bits);
    L.mask  = _mm256_set1_epi32((1 << bits) - 1);
    L.cb_lo = cb ? _mm256_loadu_ps(cb) : _mm256_setzero_ps();
    L.cb_hi = cb ? _mm256_loadu_ps(cb + 8) : _mm256_setzero_ps();
    return L;
}

// Lanes i..i+7 of the head that starts at `row` (bytes of halves, or of codes starting on a
// byte boundary; i is a multiple of 8, so 8 codes take exactly `bits` bytes).
KVG_INLINE __m256 load_lanes(int fam, int bits, const lanes * L, const uint8_t * row, int64_t i) {
    if (fam == LANES_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (row + 2 * i)));
    }
    const __m256i idx = unpack8(row + (i / 8) * bits, bits, L->sh, L->mask);
    if (fam == LANES_INT) {
        return _mm256_cvtepi32_ps(idx);
    }
    __m256 v = _mm256_permutevar8x32_ps(L->cb_lo, idx);  // uses the low 3 bits of each index
    if (bits == 4) {
        const __m256 hi = _mm256_permutevar8x32_ps(L->cb_hi, idx);
        v               = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> sign
    }
    return v;
}

// res[g] = dot(q + g * D, the head at row) for g < nq; nq is a constant once inlined.
KVG_INLINE void dot_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row, int64_t D,
                          const float * q, float * res) {
    __m256 acc[KVG_QB];
    for (int g = 0; g < nq; g++) {
        acc[g] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < D; i += 8) {
        const __m256 k = load_lanes(fam, bits, L, row, i);
        for (int g = 0; g < nq; g++) {
            acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + i), k, acc[g]);
        }
    }
    for (int g = 0; g < nq; g++) {
        res[g] = hsum8(acc[g]);
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
        __m256 a0[KVG_QB], a1[KVG_QB];
        for (int g = 0; g < nq; g++) {
            a0[g] = _mm256_loadu_ps(acc + g * D + i);
            a1[g] = _mm256_setzero_ps();
        }
        const uint8_t * row = row0;
        int64_t         t   = 0;
        for (; t + 2 <= n; t += 2, row += 2 * stride) {
            const __m256 v0 = load_lanes(fam, bits, L, row, i);
            const __m256 v1 = load_lanes(fam, bits, L, row + stride, i);
            for (int g = 0; g < nq; g++) {
                a0[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + g * n + t), v0, a0[g]);
                a1[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + g * n + t + 1), v1, a1[g]);
            }
        }
        if (t < n) {
            const __m256 v0 = load_lanes(fam, bits, L, row, i);
            for (int g = 0; g < nq; g++) {
                a0[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + g * n + t), v0, a0[g]);
            }
        }
        for (int g = 0; g < nq; g++) {
            _mm256_storeu_ps(acc + g * D + i, _mm256_add_ps(a0[g], a1[g]));
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

int kvg_f16_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    const int64_t D = job->head_dim, C = job->n_channels, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    const lanes L = make_lanes(1, NULL);
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

int kvg_f16_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
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
            const float   f = _cvtsh_ss(kvg_get_u16(src + 2 * v)) * inv_d;
            dot_queries(LANES_CB, bits, &L, codes + (size_t) (v * D / 8) * (size_t) bits, D, a->qr + hk * P * D, P, res);
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = f * res[g];
            }
        }
    }
}

int kvg_rotq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
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
            const float f = _cvtsh_ss(kvg_get_u16(src + 2 * ((t0 + t) * H + hk))) * inv_d;
            for (int64_t g = 0; g < P; g++) {
                w[g * n + t] = p[(hk * P + g) * n + t] * f;
            }
        }
        const uint8_t * row0 = codes + (size_t) ((t0 * H + hk) * D / 8) * (size_t) bits;
        axpy_queries(LANES_CB, bits, &L, row0, H * D / 8 * bits, n, w, a->accr + hk * P * D, D, P);
    }
}

int kvg_rotq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
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
                mn[i] = _cvtsh_ss(kvg_get_u16(g[i].min_f16));
                sc[i] = _cvtsh_ss(kvg_get_u16(g[i].scale_f16));
            }
            for (int64_t j = hk * P; j < (hk + 1) * P; j++) {
                const float * qj = a->q + j * D;
                __m256        s  = _mm256_setzero_ps();
                for (int64_t i = 0; i < D; i += 8) {
                    const __m256 qv = _mm256_loadu_ps(qj + i);
                    _mm256_storeu_ps(qf + j * D + i, _mm256_mul_ps(qv, _mm256_loadu_ps(sc + i)));
                    s = _mm256_fmadd_ps(qv, _mm256_loadu_ps(mn + i), s);
                }
                qm[j] = hsum8(s);
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

int kvg_kivi_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
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
        __m256        s[KVG_QB];
        for (int g = 0; g < nq; g++) {
            s[g] = _mm256_loadu_ps(acc + g * D + i);
        }
        const uint8_t * row = row0;
        for (int64_t t = 0; t < n; t++, row += stride) {
            const __m256 c = load_lanes(LANES_INT, bits, L, row, i);
            const __m256 v = _mm256_fmadd_ps(c, _mm256_broadcast_ss(sc + t * ng + k), _mm256_broadcast_ss(mn + t * ng + k));
            for (int g = 0; g < nq; g++) {
                s[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + g * n + t), v, s[g]);
            }
        }
        for (int g = 0; g < nq; g++) {
            _mm256_storeu_ps(acc + g * D + i, s[g]);
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
                mn[t * ng + k]           = _cvtsh_ss(kvg_get_u16(g->min_f16));
                sc[t * ng + k]           = _cvtsh_ss(kvg_get_u16(g->scale_f16));
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

int kvg_kivi_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
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

// exp(x) for x <= 0 (a score minus the running maximum): x = k ln2 + r with |r| <= ln2 / 2, the
// Taylor series of exp(r) to r^7 (remainder < 0.347^8 / 8! < 6e-9, relative) times 2^k from the
// exponent bits. Below -87 (exp < 2^-125, nothing next to the maximum's weight of 1) gives 0.
static inline __m256 exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 xc = _mm256_max_ps(x, lo);
    const __m256 k  = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);  // ln2 in two parts (Cody and Waite)
    r        = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440054690583e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256  y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
}

static void scale_row(float * x, int64_t n, float f) {
    const __m256 vf = _mm256_set1_ps(f);
    int64_t      i  = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vf));
    }
    for (; i < n; i++) {
        x[i] *= f;
    }
}

void kvg_attn_softmax_avx2(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated) {
    for (int64_t j = 0; j < a->n_q; j++) {
        float * sj = s + j * n;
        int64_t t  = 0;
        float   mx = sj[0];
        if (n >= 8) {
            __m256 vm = _mm256_loadu_ps(sj);
            for (t = 8; t + 8 <= n; t += 8) {
                vm = _mm256_max_ps(vm, _mm256_loadu_ps(sj + t));
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
            h        = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h        = _mm_max_ss(h, _mm_movehdup_ps(h));
            mx       = _mm_cvtss_f32(h);
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
        const __m256 vmj  = _mm256_set1_ps(m[j]);
        __m256       vsum = _mm256_setzero_ps();
        for (t = 0; t + 8 <= n; t += 8) {
            const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(sj + t), vmj));
            _mm256_storeu_ps(sj + t, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum8(vsum);
        for (; t < n; t++) {
            sj[t] = expf(sj[t] - m[j]);
            sum += sj[t];
        }
        l[j] += sum;
    }
}

#else  // not an AVX2 build (or not x86-64): the dispatcher never selects these

void kvg_attn_softmax_avx2(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated) {
    kvg_attn_softmax_ref(a, m, l, s, n, dv, rotated);
}

int kvg_f16_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_f16_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_score_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_accumulate_avx2(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                             const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

#endif
