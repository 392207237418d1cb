// attend_simd.h: the SIMD attention kernels (scores and value sums straight from the codes) for
// f16, kivi, rotq and crotq, written once over 8-lane primitives that attend_avx2.c and
// attend_neon.c define (as ggml maps its SIMD types), then include this file. The scalar
// oracles live with their codecs (f16.c, kivi.c, rotq.c, crotq.c); these compute the same sums
// with fused multiply-adds in another order, so they agree to float rounding
// (tests/test_attend.py's TOL_SIMD), not bit for bit.
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
#ifndef KVG_SIMD_NAME
#    error "define KVG_SIMD_NAME(name) before including attend_simd.h"
#endif

#ifndef KVG_SIMD_STUBS

#    include <math.h>

// res[g] = dot(q + g * D, the head at row) for g < nq; nq is a constant once inlined.
KVG_INLINE void dot_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row, int64_t D,
                          const float * q, float * res) {
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
KVG_INLINE void axpy_block(int fam, int bits, int nq, const lanes * L, const uint8_t * row0, int64_t stride,
                           int64_t n, const float * w, float * acc, int64_t D) {
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
        axpy_queries(KVG_LANES_F16, 16, &L, src + 2 * (t0 * C + hk * D), 2 * C, n, p + hk * P * n, a->acc + hk * P * D, D, P);
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
            dot_queries(KVG_LANES_CB, bits, &L, codes + (size_t) (v * D / 8) * (size_t) bits, D, a->qr + hk * P * D, P, res);
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
                                const float * w, float * acc, int64_t D, const float * mn, const float * sc,
                                int64_t ng, int64_t c0, int64_t G) {
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
        float *       mn = a->tmp;                          // [n][ng]
        float *       sc = mn + n * ng;                     // [n][ng]
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

#else  // KVG_SIMD_STUBS: a build without this instruction set

void KVG_SIMD_NAME(kvg_attn_softmax)(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv,
                                int rotated) {
    kvg_attn_softmax_ref(a, m, l, s, n, dv, rotated);
}

int KVG_SIMD_NAME(kvg_f16_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                            float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_f16_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                 const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_rotq_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                             float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_rotq_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                  const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_kivi_score)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                             float * out) {
    (void) job; (void) src; (void) t0; (void) n; (void) a; (void) out;
    return KVG_NOT_HANDLED;
}

int KVG_SIMD_NAME(kvg_kivi_accumulate)(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                                  const kvg_attn * a) {
    (void) job; (void) src; (void) t0; (void) n; (void) p; (void) a;
    return KVG_NOT_HANDLED;
}

#endif  // KVG_SIMD_STUBS
