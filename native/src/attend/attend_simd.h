// attend_simd.h: the SIMD attention kernels (scores and value sums straight from the codes) for
// f16, kivi, rotq, crotq and wfq, written once over 8-lane primitives that attend_avx2.c and
// attend_neon.c define (as ggml maps its SIMD types), then include this file. The scalar
// oracles live with their codecs (f16.c, kivi.c, rotq.c, crotq.c); these compute the same sums
// with fused multiply-adds in another order, so they agree to float rounding
// (tests/unit/test_attend.py's TOL_SIMD), not bit for bit.
//
// Both kernels dequantize 8 lanes of one row's head at a time and use them for every query
// that reads that KV head (GQA), up to KVG_QB queries held in registers:
// - score: row by row, one accumulator per query, reduced once per row;
// - accumulate: 8 output lanes at a time, rows inner, the accumulators held in registers over
//   the whole chunk.
//
// The includer defines KVG_SIMD_NAME(name) (the kernel's name with its suffix) and either
// KVG_SIMD_STUBS (a build without that instruction set: every kernel declines, the dispatcher
// never selects them) or, with KVG_INLINE and KVG_QB:
//   vf8                      8 floats
//   vf8_zero(), vf8_set1(f), vf8_load(p), vf8_store(p, v)
//   vf8_add(a, b), vf8_sub(a, b), vf8_mul(a, b), vf8_max(a, b)
//   vf8_fma(a, b, c)         a * b + c
//   vf8_fma_s(c, v, w)       c + v * w, w a float
//   vf8_hsum(v), vf8_hmax(v) the sum and the maximum of the 8 lanes
//   vf8_exp_nonpos(x)        exp of lanes <= 0, 0 below -87 (see attend_avx2.c)
//   half_to_float(h)         one stored f16
//   lanes, make_lanes(bits, codebook or NULL), load_lanes(fam, bits, &L, row, i)
//                            lanes i..i+7 of the head at row: halves (KVG_LANES_F16), rotq
//                            codebook values (KVG_LANES_CB) or the codes as floats (KVG_LANES_INT)
//   word_lanes(bits, &L, w)  codebook values of 8 codes of 1..4 bits packed in the word w
//   window_lanes(bits, T, w) T[(w >> (bits * j)) & 255] for lanes j (tcq's windows)
#ifndef KVG_SIMD_NAME
#    error "define KVG_SIMD_NAME(name) before including attend_simd.h"
#endif

#ifndef KVG_SIMD_STUBS

#    include <math.h>

// res[g] = dot(q + g * D, the head at row) for g < nq; nq is a constant once inlined.
KVG_INLINE void dot_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row, int64_t D, const float * q,
                          float * res) {
    vf8 acc[KVG_QB];
    for (int g = 0; g < nq; g++) {
        acc[g] = vf8_zero();
    }
    for (int64_t i = 0; i < D; i += 8) {
        const vf8 k = load_lanes(fam, bits, L, row, i);
        for (int g = 0; g < nq; g++) {
            acc[g] = vf8_fma(vf8_load(q + g * D + i), k, acc[g]);
        }
    }
    for (int g = 0; g < nq; g++) {
        res[g] = vf8_hsum(acc[g]);
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
KVG_INLINE void axpy_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row0, int64_t stride, int64_t n,
                           const float * w, float * acc, int64_t D) {
    for (int64_t i = 0; i < D; i += 8) {
        vf8 a0[KVG_QB], a1[KVG_QB];
        for (int g = 0; g < nq; g++) {
            a0[g] = vf8_load(acc + g * D + i);
            a1[g] = vf8_zero();
        }
        const uint8_t * row = row0;
        int64_t         t   = 0;
        for (; t + 2 <= n; t += 2, row += 2 * stride) {
            const vf8 v0 = load_lanes(fam, bits, L, row, i);
            const vf8 v1 = load_lanes(fam, bits, L, row + stride, i);
            for (int g = 0; g < nq; g++) {
                a0[g] = vf8_fma_s(a0[g], v0, w[g * n + t]);
                a1[g] = vf8_fma_s(a1[g], v1, w[g * n + t + 1]);
            }
        }
        if (t < n) {
            const vf8 v0 = load_lanes(fam, bits, L, row, i);
            for (int g = 0; g < nq; g++) {
                a0[g] = vf8_fma_s(a0[g], v0, w[g * n + t]);
            }
        }
        for (int g = 0; g < nq; g++) {
            vf8_store(acc + g * D + i, vf8_add(a0[g], a1[g]));
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

int KVG_SIMD_NAME(kvg_f16_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    const int64_t D = job->head_dim, C = job->n_channels, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    const lanes L   = make_lanes(1, NULL);
    float *     res = a->tmp;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            dot_queries(KVG_LANES_F16, 16, &L, src + 2 * ((t0 + t) * C + hk * D), D, a->q + hk * P * D, P, res);
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = res[g];
            }
        }
    }
    return KVG_OK;
}

int KVG_SIMD_NAME(kvg_f16_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    const int64_t D = job->head_dim, C = job->n_channels, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    const lanes L = make_lanes(1, NULL);
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        axpy_queries(KVG_LANES_F16, 16, &L, src + 2 * (t0 * C + hk * D), 2 * C, n, p + hk * P * n, a->acc + hk * P * D,
                     D, P);
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
            const float   f = half_to_float(kvg_get_u16(src + 2 * v)) * inv_d;
            dot_queries(KVG_LANES_CB, bits, &L, codes + (size_t) (v * D / 8) * (size_t) bits, D, a->qr + hk * P * D, P,
                        res);
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = f * res[g];
            }
        }
    }
}

int KVG_SIMD_NAME(kvg_rotq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                  float * out) {
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
            const float f = half_to_float(kvg_get_u16(src + 2 * ((t0 + t) * H + hk))) * inv_d;
            for (int64_t g = 0; g < P; g++) {
                w[g * n + t] = p[(hk * P + g) * n + t] * f;
            }
        }
        const uint8_t * row0 = codes + (size_t) ((t0 * H + hk) * D / 8) * (size_t) bits;
        axpy_queries(KVG_LANES_CB, bits, &L, row0, H * D / 8 * bits, n, w, a->accr + hk * P * D, D, P);
    }
}

int KVG_SIMD_NAME(kvg_rotq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
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
                mn[i] = half_to_float(kvg_get_u16(g[i].min_f16));
                sc[i] = half_to_float(kvg_get_u16(g[i].scale_f16));
            }
            for (int64_t j = hk * P; j < (hk + 1) * P; j++) {
                const float * qj = a->q + j * D;
                vf8           s  = vf8_zero();
                for (int64_t i = 0; i < D; i += 8) {
                    const vf8 qv = vf8_load(qj + i);
                    vf8_store(qf + j * D + i, vf8_mul(qv, vf8_load(sc + i)));
                    s = vf8_fma(qv, vf8_load(mn + i), s);
                }
                qm[j] = vf8_hsum(s);
            }
        }
        for (int64_t u = t; u < e; u++) {
            for (int64_t hk = 0; hk < job->n_heads; hk++) {
                const uint8_t * row = codes + (size_t) ((u * C + hk * D) / 8) * (size_t) bits;
                dot_queries(KVG_LANES_INT, bits, &L, row, D, qf + hk * P * D, P, res);
                for (int64_t g = 0; g < P; g++) {
                    out[(hk * P + g) * n + (u - t0)] = qm[hk * P + g] + res[g];
                }
            }
        }
        t = e;
    }
}

int KVG_SIMD_NAME(kvg_kivi_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                  float * out) {
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
                                const float * w, float * acc, int64_t D, const float * mn, const float * sc, int64_t ng,
                                int64_t c0, int64_t G) {
    for (int64_t i = 0; i < D; i += 8) {
        const int64_t k = (c0 + i) / G - c0 / G;
        vf8           s[KVG_QB];
        for (int g = 0; g < nq; g++) {
            s[g] = vf8_load(acc + g * D + i);
        }
        const uint8_t * row = row0;
        for (int64_t t = 0; t < n; t++, row += stride) {
            const vf8 c = load_lanes(KVG_LANES_INT, bits, L, row, i);
            const vf8 v = vf8_fma_s(vf8_set1(mn[t * ng + k]), c, sc[t * ng + k]);
            for (int g = 0; g < nq; g++) {
                s[g] = vf8_fma_s(s[g], v, w[g * n + t]);
            }
        }
        for (int g = 0; g < nq; g++) {
            vf8_store(acc + g * D + i, s[g]);
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
        float *       mn = a->tmp;                         // [n][ng]
        float *       sc = mn + n * ng;                    // [n][ng]
        for (int64_t t = 0; t < n; t++) {
            for (int64_t k = 0; k < ng; k++) {
                const kvg_kivi_group * g = groups + (t0 + t) * n_cg + c0 / G + k;
                mn[t * ng + k]           = half_to_float(kvg_get_u16(g->min_f16));
                sc[t * ng + k]           = half_to_float(kvg_get_u16(g->scale_f16));
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

int KVG_SIMD_NAME(kvg_kivi_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
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

static void scale_row(float * x, int64_t n, float f) {
    const vf8 vf = vf8_set1(f);
    int64_t   i  = 0;
    for (; i + 8 <= n; i += 8) {
        vf8_store(x + i, vf8_mul(vf8_load(x + i), vf));
    }
    for (; i < n; i++) {
        x[i] *= f;
    }
}

void KVG_SIMD_NAME(kvg_attn_softmax)(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv,
                                     int rotated) {
    for (int64_t j = 0; j < a->n_q; j++) {
        float * sj = s + j * n;
        int64_t t  = 0;
        float   mx = sj[0];
        if (n >= 8) {
            vf8 vm = vf8_load(sj);
            for (t = 8; t + 8 <= n; t += 8) {
                vm = vf8_max(vm, vf8_load(sj + t));
            }
            mx = vf8_hmax(vm);
        }
        for (; t < n; t++) {
            mx = sj[t] > mx ? sj[t] : mx;
        }
        if (mx == -INFINITY) {  // every score masked (kvg_attend_f16): nothing to fold in
            memset(sj, 0, (size_t) n * sizeof(float));
            continue;
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
        const vf8 vmj  = vf8_set1(m[j]);
        vf8       vsum = vf8_zero();
        for (t = 0; t + 8 <= n; t += 8) {
            const vf8 e = vf8_exp_nonpos(vf8_sub(vf8_load(sj + t), vmj));
            vf8_store(sj + t, e);
            vsum = vf8_add(vsum, e);
        }
        float sum = vf8_hsum(vsum);
        for (; t < n; t++) {
            sj[t] = expf(sj[t] - m[j]);
            sum += sj[t];
        }
        l[j] += sum;
    }
}

// ---- wfq -----------------------------------------------------------------------------------

// A plan's sets start anywhere in a head vector's bit stream and hold any number of codes. The
// plan of a KV head is first flattened (once per chunk) into groups of 8 positions: a group of
// 1..4 bits is read from a 64-bit load shifted to its first bit and looked up as rotq's codebook
// lanes are (its width's Gaussian levels), the lanes past its set's end multiplied by 0; codes
// of more than 4 bits (a few strong coordinates) are read one at a time into a row of levels
// whose groups are then loaded as f32 lanes. Scores dot those lanes with the queries in the
// plan's domain (kvg_wfq_prepare_q); values are summed from rows of levels (axpy_queries).

static const float k_wfq_tail[9][8] = {
    { 0, 0, 0, 0, 0, 0, 0, 0 }, { 1, 0, 0, 0, 0, 0, 0, 0 }, { 1, 1, 0, 0, 0, 0, 0, 0 },
    { 1, 1, 1, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 0, 0, 0 },
    { 1, 1, 1, 1, 1, 1, 0, 0 }, { 1, 1, 1, 1, 1, 1, 1, 0 }, { 1, 1, 1, 1, 1, 1, 1, 1 },
};

typedef struct wfq_group {
    int32_t a;      // first position
    int32_t byte;   // of its first code in the code bytes (narrow), unused (wide)
    int32_t shift;  // of its first code in that byte
    int32_t bits;   // 1..4: read from the codes; 0: loaded from the row of wide levels
    int32_t valid;  // positions of the group in its set (8 but in a set's last group)
} wfq_group;

typedef struct wfq_code {  // one code of more than 4 bits
    int32_t       pos, byte, shift, mask;
    const float * level;
} wfq_code;

typedef struct wfq_plan {
    wfq_group groups[KVG_WFQ_MAX_HEAD_DIM];
    wfq_code  wide[KVG_WFQ_MAX_HEAD_DIM];
    int       n_groups, n_wide;
    int       has_zero;  // a set of no bits: positions no group covers
    lanes     L[5];      // Gaussian levels of 1..4 bits as codebook lanes
} wfq_plan;

static void wfq_plan_of(const kvg_job * job, int64_t hk, wfq_plan * p) {
    kvg_wfq_set sets[KVG_WFQ_MAX_HEAD_DIM];
    const int   ns = kvg_wfq_sets(job, hk, sets);
    p->n_groups = p->n_wide = p->has_zero = 0;
    for (int k = 0; k < ns; k++) {
        const kvg_wfq_set st = sets[k];
        if (st.bits == 0) {
            p->has_zero = 1;  // levels of 0: nothing to score or add
            continue;
        }
        for (int32_t i = 0; i < st.n; i += 8) {
            const uint32_t bit       = st.bit + (uint32_t) (i * st.bits);
            p->groups[p->n_groups++] = (wfq_group) { st.a + i, (int32_t) (bit >> 3), (int32_t) (bit & 7),
                                                     st.bits <= 4 ? st.bits : 0, st.n - i < 8 ? st.n - i : 8 };
        }
        for (int32_t i = 0; st.bits > 4 && i < st.n; i++) {
            const uint32_t bit   = st.bit + (uint32_t) (i * st.bits);
            p->wide[p->n_wide++] = (wfq_code) { st.a + i, (int32_t) (bit >> 3), (int32_t) (bit & 7), (1 << st.bits) - 1,
                                                kvg_wfq_level_table(st.bits) };
        }
    }
    for (int b = 1; b <= 4; b++) {
        p->L[b] = make_lanes(b, kvg_wfq_level_table(b));
    }
}

// The levels of a group (codes: the vector's code bytes, readable 8 bytes past any code; wide:
// the row's levels of more than 4 bits).
KVG_INLINE vf8 wfq_group_lanes(const wfq_plan * p, const wfq_group * gr, const uint8_t * codes, const float * wide) {
    vf8 v;
    if (gr->bits) {
        uint64_t w;
        memcpy(&w, codes + gr->byte, 8);  // little-endian (both targets)
        v = word_lanes(gr->bits, &p->L[gr->bits], (uint32_t) (w >> gr->shift));
    } else {
        v = vf8_load(wide + gr->a);
    }
    return gr->valid == 8 ? v : vf8_mul(v, vf8_load(k_wfq_tail[gr->valid]));
}

KVG_INLINE void wfq_wide_levels(const wfq_plan * p, const uint8_t * codes, float * wide) {
    for (int k = 0; k < p->n_wide; k++) {
        const wfq_code * c = &p->wide[k];
        const unsigned   w = (unsigned) codes[c->byte] | (unsigned) codes[c->byte + 1] << 8;
        wide[c->pos]       = c->level[(w >> c->shift) & (unsigned) c->mask];
    }
}

// The head vector of row t, KV head hk, in a region of vb bytes per head vector (wfq: the whole
// block; tcq: its codes), or a copy of it padded by 8 bytes where a 64-bit load at its last
// code could pass the end of the region.
KVG_INLINE const uint8_t * padded_vec(const kvg_job * job, const uint8_t * src, int64_t t, int64_t hk, size_t vb,
                                      uint8_t * pad) {
    const size_t    at  = (size_t) (t * job->n_heads + hk) * vb;
    const uint8_t * vec = src + at;
    if (at + vb + 8 > (size_t) (job->n_tokens * job->n_heads) * vb) {
        memcpy(pad, vec, vb);
        memset(pad + vb, 0, 8);
        return pad;
    }
    return vec;
}

// res[g] = dot(q + g * QS, the levels of one head vector) for g < nq (queries padded to QS >= D + 8).
KVG_INLINE void wfq_dot_block(int nq, const wfq_plan * p, const uint8_t * codes, const float * wide, int64_t QS,
                              const float * q, float * res) {
    vf8 acc[KVG_QB];
    for (int g = 0; g < nq; g++) {
        acc[g] = vf8_zero();
    }
    for (int k = 0; k < p->n_groups; k++) {
        const wfq_group * gr = &p->groups[k];
        const vf8         v  = wfq_group_lanes(p, gr, codes, wide);
        for (int g = 0; g < nq; g++) {
            acc[g] = vf8_fma(vf8_load(q + g * QS + gr->a), v, acc[g]);
        }
    }
    for (int g = 0; g < nq; g++) {
        res[g] = vf8_hsum(acc[g]);
    }
}

int KVG_SIMD_NAME(kvg_wfq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    const int64_t D = job->head_dim, P = a->per_head, QS = D + 8;
    float *       qpad = a->tmp;                                      // [P][QS]: a KV head's queries, 0 past D
    float *       res  = qpad + P * QS;                               // [P]
    float *       wide = a->tmp + a->n_q * (D + KVG_ATTN_CHUNK + 2);  // [D + 8]
    const size_t  vb   = kvg_wfq_vec_bytes(job);
    uint8_t       pad[2 + KVG_WFQ_MAX_HEAD_DIM + 8];
    wfq_plan      plan;
    memset(wide, 0, (size_t) (D + 8) * sizeof(float));  // masked lanes read it: finite, whatever the plan
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        wfq_plan_of(job, hk, &plan);
        for (int64_t g = 0; g < P; g++) {
            memcpy(qpad + g * QS, a->qr + (hk * P + g) * D, (size_t) D * sizeof(float));
            memset(qpad + g * QS + D, 0, 8 * sizeof(float));
        }
        for (int64_t t = 0; t < n; t++) {
            const uint8_t * vec = padded_vec(job, src, t0 + t, hk, vb, pad);
            wfq_wide_levels(&plan, vec + 2, wide);
            for (int64_t g0 = 0; g0 < P; g0 += KVG_QB) {
                const float * qg = qpad + g0 * QS;
                float *       rg = res + g0;
                switch (P - g0 < KVG_QB ? P - g0 : KVG_QB) {
                    case 1:  wfq_dot_block(1, &plan, vec + 2, wide, QS, qg, rg); break;
                    case 2:  wfq_dot_block(2, &plan, vec + 2, wide, QS, qg, rg); break;
                    case 3:  wfq_dot_block(3, &plan, vec + 2, wide, QS, qg, rg); break;
                    default: wfq_dot_block(4, &plan, vec + 2, wide, QS, qg, rg); break;
                }
            }
            const float gain = half_to_float(kvg_get_u16(vec));
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = gain * res[g];
            }
        }
    }
    return KVG_OK;
}

int KVG_SIMD_NAME(kvg_wfq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    const int64_t D = job->head_dim, P = a->per_head;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;  // axpy_queries takes 8 lanes at a time
    }
    const lanes  F    = make_lanes(1, NULL);
    float *      w    = a->tmp;                                      // [P][n]: p * gain
    float *      z    = a->tmp + a->n_q * (D + KVG_ATTN_CHUNK + 2);  // [n][D] levels, 8 spare
    float *      gain = z + KVG_ATTN_CHUNK * D + 8;                  // [n]
    float *      wide = gain + KVG_ATTN_CHUNK;                       // [D + 8]
    const size_t vb   = kvg_wfq_vec_bytes(job);
    uint8_t      pad[2 + KVG_WFQ_MAX_HEAD_DIM + 8];
    wfq_plan     plan;
    memset(wide, 0, (size_t) (D + 8) * sizeof(float));
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        wfq_plan_of(job, hk, &plan);
        for (int64_t t = 0; t < n; t++) {  // rows of levels (0 where a set has no bits)
            const uint8_t * vec = padded_vec(job, src, t0 + t, hk, vb, pad);
            float *         zt  = z + t * D;
            gain[t]             = half_to_float(kvg_get_u16(vec));
            if (plan.has_zero) {
                memset(zt, 0, (size_t) D * sizeof(float));
            }
            wfq_wide_levels(&plan, vec + 2, wide);
            // Groups in order of position: a group's masked lanes store zeros over positions of
            // the next group (or the next row), which are stored after them.
            for (int k = 0; k < plan.n_groups; k++) {
                const wfq_group * gr = &plan.groups[k];
                vf8_store(zt + gr->a, wfq_group_lanes(&plan, gr, vec + 2, wide));
            }
        }
        for (int64_t g = 0; g < P; g++) {
            for (int64_t t = 0; t < n; t++) {
                w[g * n + t] = p[(hk * P + g) * n + t] * gain[t];
            }
        }
        axpy_queries(KVG_LANES_F32, 0, &F, (const uint8_t *) z, D * (int64_t) sizeof(float), n, w, a->accr + hk * P * D,
                     D, P);
    }
    return KVG_OK;
}

// ---- tcq -----------------------------------------------------------------------------------

// The levels of values i..i+7 (i a multiple of 8) of a head vector whose codes start at byte
// codes: value i's window starts bits - 8 bits before byte bits * i / 8, so a 64-bit load from
// the byte before, shifted by bits, starts at the first window; the first group has no byte
// before it in the vector and reads zeros there instead.
KVG_INLINE vf8 tcq_lanes(int bits, const float * T, const uint8_t * codes, int64_t i) {
    uint64_t w;
    if (i == 0) {
        memcpy(&w, codes, 8);  // little-endian (both targets)
        w <<= 8 - bits;
    } else {
        memcpy(&w, codes + bits * i / 8 - 1, 8);
        w >>= bits;
    }
    return window_lanes(bits, T, w);
}

// res[g] = dot(q + g * D, the levels of one head vector) for g < nq.
KVG_INLINE void tcq_dot_block(int bits, int nq, const float * T, const uint8_t * vec, int64_t D, const float * q,
                              float * res) {
    vf8 acc[KVG_QB];
    for (int g = 0; g < nq; g++) {
        acc[g] = vf8_zero();
    }
    for (int64_t i = 0; i < D; i += 8) {
        const vf8 v = tcq_lanes(bits, T, vec, i);
        for (int g = 0; g < nq; g++) {
            acc[g] = vf8_fma(vf8_load(q + g * D + i), v, acc[g]);
        }
    }
    for (int g = 0; g < nq; g++) {
        res[g] = vf8_hsum(acc[g]);
    }
}

KVG_INLINE void tcq_score_bits(int bits, const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n,
                               const kvg_attn * a, float * out) {
    const int64_t   D = job->head_dim, H = job->n_heads, P = a->per_head;
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    const float *   T     = kvg_tcq_levels(bits);
    const float     inv_d = 1.0f / (float) D;
    const size_t    vb    = (size_t) (D / 8) * (size_t) bits;  // code bytes per head vector
    float *         res   = a->tmp;
    uint8_t         pad[KVG_ROTQ_MAX_HEAD_DIM / 2 + 8];
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const uint8_t * vec = padded_vec(job, codes, t0 + t, hk, vb, pad);
            const float *   q   = a->qr + hk * P * D;
            for (int64_t g0 = 0; g0 < P; g0 += KVG_QB) {
                switch (P - g0 < KVG_QB ? P - g0 : KVG_QB) {
                    case 1:  tcq_dot_block(bits, 1, T, vec, D, q + g0 * D, res + g0); break;
                    case 2:  tcq_dot_block(bits, 2, T, vec, D, q + g0 * D, res + g0); break;
                    case 3:  tcq_dot_block(bits, 3, T, vec, D, q + g0 * D, res + g0); break;
                    default: tcq_dot_block(bits, 4, T, vec, D, q + g0 * D, res + g0); break;
                }
            }
            const float f = half_to_float(kvg_get_u16(src + 2 * ((t0 + t) * H + hk))) * inv_d;
            for (int64_t g = 0; g < P; g++) {
                out[(hk * P + g) * n + t] = f * res[g];
            }
        }
    }
}

int KVG_SIMD_NAME(kvg_tcq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    if (job->head_dim % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    switch (job->bits) {
        case 2:  tcq_score_bits(2, job, src, t0, n, a, out); break;
        case 3:  tcq_score_bits(3, job, src, t0, n, a, out); break;
        case 4:  tcq_score_bits(4, job, src, t0, n, a, out); break;
        default: return KVG_NOT_HANDLED;
    }
    return KVG_OK;
}

// Values: each row's levels once (rows of z), then summed for every query as f32 lanes.
int KVG_SIMD_NAME(kvg_tcq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    const int64_t D = job->head_dim, H = job->n_heads, P = a->per_head;
    const int     bits = job->bits;
    if (D % 8 != 0 || bits < 2 || bits > 4) {
        return KVG_NOT_HANDLED;
    }
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    const float *   T     = kvg_tcq_levels(bits);
    const float     inv_d = 1.0f / (float) D;
    const lanes     F     = make_lanes(1, NULL);
    const size_t    vb    = (size_t) (D / 8) * (size_t) bits;            // code bytes per head vector
    float *         w     = a->tmp;                                      // [P][n]: p * norm / D
    float *         z     = a->tmp + a->n_q * (D + KVG_ATTN_CHUNK + 2);  // [n][D] levels
    uint8_t         pad[KVG_ROTQ_MAX_HEAD_DIM / 2 + 8];
    for (int64_t hk = 0; hk < H; hk++) {
        for (int64_t t = 0; t < n; t++) {
            const uint8_t * vec = padded_vec(job, codes, t0 + t, hk, vb, pad);
            for (int64_t i = 0; i < D; i += 8) {
                vf8_store(z + t * D + i, tcq_lanes(bits, T, vec, i));
            }
            const float f = half_to_float(kvg_get_u16(src + 2 * ((t0 + t) * H + hk))) * inv_d;
            for (int64_t g = 0; g < P; g++) {
                w[g * n + t] = p[(hk * P + g) * n + t] * f;
            }
        }
        axpy_queries(KVG_LANES_F32, 0, &F, (const uint8_t *) z, D * (int64_t) sizeof(float), n, w, a->accr + hk * P * D,
                     D, P);
    }
    return KVG_OK;
}

// ---- dense tiles: many queries per KV head (a prefill's ubatch) ---------------------------
//
// With P queries per KV head the kernels above dequantize each row's lanes P / KVG_QB times
// and reduce one sum per query and row. attend.c instead decodes a chunk's rows of one KV head
// once into f32 (kvg_dense_rows, in the domain the kernels score in) and multiplies small
// matrices: scores with 8 keys in the lanes (the rows transposed), value sums with 8 output
// dimensions in the lanes, 8 queries' accumulators in registers either way. Same sums in
// another order: they agree with the kernels to float rounding.

// Rows [t0, t0 + n) of KV head hk as the score/accumulate kernels see them: f16 as is, rotq
// and tcq in the rotated domain times norm / D. KVG_NOT_HANDLED (nothing written) for other
// codecs and for head dims that are not a multiple of 8.
int KVG_SIMD_NAME(kvg_dense_rows)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, int64_t hk,
                                  float * out) {
    const int64_t D = job->head_dim, H = job->n_heads;
    const int     bits = job->bits;
    if (D % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    if (job->type == KVG_CODEC_F16) {
        const lanes L = make_lanes(1, NULL);
        for (int64_t t = 0; t < n; t++) {
            const uint8_t * row = src + 2 * ((t0 + t) * job->n_channels + hk * D);
            for (int64_t i = 0; i < D; i += 8) {
                vf8_store(out + t * D + i, load_lanes(KVG_LANES_F16, 16, &L, row, i));
            }
        }
        return KVG_OK;
    }
    const int rotq = job->type >= KVG_CODEC_ROTQ1 && job->type <= KVG_CODEC_ROTQ4;
    const int tcq  = job->type >= KVG_CODEC_TCQ2 && job->type <= KVG_CODEC_TCQ4;
    if (!rotq && !tcq) {
        return KVG_NOT_HANDLED;
    }
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    const float     inv_d = 1.0f / (float) D;
    const size_t    vb    = (size_t) (D / 8) * (size_t) bits;  // code bytes per head vector
    uint8_t         pad[KVG_ROTQ_MAX_HEAD_DIM / 2 + 8];
    const lanes     L = make_lanes(rotq ? bits : 1, rotq ? kvg_rotq_get_book(D)->centroid[bits] : NULL);
    for (int64_t t = 0; t < n; t++) {
        const int64_t v = (t0 + t) * H + hk;
        const vf8     f = vf8_set1(half_to_float(kvg_get_u16(src + 2 * v)) * inv_d);
        float *       o = out + t * D;
        if (rotq) {
            const uint8_t * row = codes + (size_t) v * vb;
            for (int64_t i = 0; i < D; i += 8) {
                vf8 x;
                switch (bits) {  // constant bits: the unpacking is inlined for each
                    case 1:  x = load_lanes(KVG_LANES_CB, 1, &L, row, i); break;
                    case 2:  x = load_lanes(KVG_LANES_CB, 2, &L, row, i); break;
                    case 3:  x = load_lanes(KVG_LANES_CB, 3, &L, row, i); break;
                    default: x = load_lanes(KVG_LANES_CB, 4, &L, row, i); break;
                }
                vf8_store(o + i, vf8_mul(x, f));
            }
        } else {
            const float *   T   = kvg_tcq_levels(bits);
            const uint8_t * vec = padded_vec(job, codes, t0 + t, hk, vb, pad);
            for (int64_t i = 0; i < D; i += 8) {
                vf8_store(o + i, vf8_mul(tcq_lanes(bits, T, vec, i), f));
            }
        }
    }
    return KVG_OK;
}

// out[g * ldo + t] = dot(q + g * D, keys + t * D) for g < nq (<= 8) and the 8 keys t0..t0+7 of
// kt (the keys transposed: kt[i * nk + t], nk a multiple of 8).
KVG_INLINE void dense_score_block(int nq, const float * q, int64_t D, const float * kt, int64_t nk, int64_t t0,
                                  float * res) {
    vf8 acc[8];
    for (int g = 0; g < nq; g++) {
        acc[g] = vf8_zero();
    }
    for (int64_t i = 0; i < D; i++) {
        const vf8 k = vf8_load(kt + i * nk + t0);
        for (int g = 0; g < nq; g++) {
            acc[g] = vf8_fma(vf8_set1(q[g * D + i]), k, acc[g]);
        }
    }
    for (int g = 0; g < nq; g++) {
        vf8_store(res + g * 8, acc[g]);
    }
}

void KVG_SIMD_NAME(kvg_dense_score)(const float * q, int64_t P, const float * keys, int64_t n, int64_t D, float * kt,
                                    float * out, int64_t ldo) {
    const int64_t nk = (n + 7) / 8 * 8;
    for (int64_t i = 0; i < D; i++) {
        for (int64_t t = 0; t < nk; t++) {
            kt[i * nk + t] = t < n ? keys[t * D + i] : 0.0f;
        }
    }
    float res[64];
    for (int64_t t0 = 0; t0 < nk; t0 += 8) {
        const int64_t m = n - t0 < 8 ? n - t0 : 8;
        for (int64_t g0 = 0; g0 < P; g0 += 8) {
            const int nq = P - g0 < 8 ? (int) (P - g0) : 8;
            if (nq == 8) {
                dense_score_block(8, q + g0 * D, D, kt, nk, t0, res);  // constant: held in registers
            } else {
                dense_score_block(nq, q + g0 * D, D, kt, nk, t0, res);
            }
            for (int g = 0; g < nq; g++) {
                memcpy(out + (g0 + g) * ldo + t0, res + g * 8, (size_t) m * sizeof(float));
            }
        }
    }
}

// acc[g * D + i..i+7] += sum over t < n of w[g * ldw + t] * rows[t * D + i..i+7], for g < nq (<= 8).
KVG_INLINE void dense_axpy_block(int nq, const float * w, int64_t ldw, const float * rows, int64_t n, int64_t D,
                                 int64_t i, float * acc) {
    vf8 a[8];
    for (int g = 0; g < nq; g++) {
        a[g] = vf8_load(acc + g * D + i);
    }
    for (int64_t t = 0; t < n; t++) {
        const vf8 v = vf8_load(rows + t * D + i);
        for (int g = 0; g < nq; g++) {
            a[g] = vf8_fma_s(a[g], v, w[g * ldw + t]);
        }
    }
    for (int g = 0; g < nq; g++) {
        vf8_store(acc + g * D + i, a[g]);
    }
}

void KVG_SIMD_NAME(kvg_dense_accumulate)(const float * w, int64_t ldw, int64_t P, const float * rows, int64_t n,
                                         int64_t D, float * acc) {
    for (int64_t g0 = 0; g0 < P; g0 += 8) {
        const int nq = P - g0 < 8 ? (int) (P - g0) : 8;
        for (int64_t i = 0; i < D; i += 8) {
            if (nq == 8) {
                dense_axpy_block(8, w + g0 * ldw, ldw, rows, n, D, i, acc + g0 * D);
            } else {
                dense_axpy_block(nq, w + g0 * ldw, ldw, rows, n, D, i, acc + g0 * D);
            }
        }
    }
}

#else  // KVG_SIMD_STUBS: a build without this instruction set

void KVG_SIMD_NAME(kvg_attn_softmax)(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv,
                                     int rotated) {
    kvg_attn_softmax_ref(a, m, l, s, n, dv, rotated);
}

int KVG_SIMD_NAME(kvg_f16_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) a;
    (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_f16_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) p;
    (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_rotq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                  float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) a;
    (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_rotq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                       const kvg_attn * a) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) p;
    (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_kivi_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                  float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) a;
    (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_kivi_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                       const kvg_attn * a) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) p;
    (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_wfq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) a;
    (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_wfq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) p;
    (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_tcq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                                 float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) a;
    (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_tcq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                      const kvg_attn * a) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) p;
    (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_dense_rows)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, int64_t hk,
                                  float * out) {
    (void) job;
    (void) src;
    (void) t0;
    (void) n;
    (void) hk;
    (void) out;
    return KVG_NOT_HANDLED;
}

void KVG_SIMD_NAME(kvg_dense_score)(const float * q, int64_t P, const float * keys, int64_t n, int64_t D, float * kt,
                                    float * out, int64_t ldo) {
    (void) q;
    (void) P;
    (void) keys;
    (void) n;
    (void) D;
    (void) kt;
    (void) out;
    (void) ldo;
}

void KVG_SIMD_NAME(kvg_dense_accumulate)(const float * w, int64_t ldw, int64_t P, const float * rows, int64_t n,
                                         int64_t D, float * acc) {
    (void) w;
    (void) ldw;
    (void) P;
    (void) rows;
    (void) n;
    (void) D;
    (void) acc;
}

#endif  // KVG_SIMD_STUBS
