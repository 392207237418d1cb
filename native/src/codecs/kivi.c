// kivi.c: KIVI asymmetric min/max integer quantization (Liu et al. 2024, arXiv:2402.02750).
//
// Keys are quantized per channel over groups of G consecutive tokens (key outliers live in
// fixed channels), values per token over groups of G consecutive channels. Each group
// stores its min and scale as f16 (32 bits) and B-bit codes, so a full group costs
// B + 32/G bits per value (2 + 1 = 3 for kivi2 at G = 32, 4 + 1 = 5 for kivi4).
//
// The stored min and scale are the f16-rounded values and codes are computed against them:
// the min is rounded down and the scale up, so [min, min + (2^B-1)*scale] still covers the
// group and every element decodes within half a (stored) step of its input.
#include "kvg_internal.h"

#include <stdio.h>
#include <stdlib.h>

int kvg_kivi_size(const kvg_job * job, size_t * out_bytes) {
    const int64_t G = job->group_size;
    const int64_t C = job->n_channels;
    const int64_t n_groups =
        job->kind == KVG_KIND_K ? ((job->n_tokens + G - 1) / G) * C : job->n_tokens * ((C + G - 1) / G);
    // n_groups <= N <= KVG_MAX_VALUES, so this cannot overflow 64 bits
    const uint64_t bytes = (uint64_t) n_groups * sizeof(kvg_kivi_group) + kvg_code_bytes(job->n_values, job->bits);
    if (bytes > (uint64_t) SIZE_MAX) {
        return kvg_fail(KVG_ERR_SHAPE, "kivi: encoded size %llu does not fit in size_t", (unsigned long long) bytes);
    }
    *out_bytes = (size_t) bytes;
    return KVG_OK;
}

// The f16 min/scale of a group whose float min and max are mn and mx, and the floats the
// quantizer and dequantizer use (mf, sf, inv = 1/sf or 0 for a constant group).
static int kivi_group_params(float mn, float mx, int bits, kvg_kivi_group * g, float * mf, float * sf, float * inv) {
    const double top = (double) ((1 << bits) - 1);
    mn               = mn + 0.0f;  // -0 -> +0: any min-reduction order then gives the same bytes
    if (!(mn >= -KVG_F16_MAX && mx <= KVG_F16_MAX)) {
        return kvg_fail(KVG_ERR_RANGE, "kivi: group range [%g, %g] does not fit in f16 (|x| <= 65504)", (double) mn,
                        (double) mx);
    }
    uint16_t m16;
    uint16_t s16;
    if (mn == mx) {
        // constant group: nearest f16, scale 0, all codes 0
        m16 = kvg_f32_to_f16(mn);
        s16 = 0;
    } else {
        m16 = kvg_f32_to_f16(mn);
        if (kvg_f16_to_f32(m16) > mn) {
            m16 = kvg_f16_next_down(m16);  // finite: mn >= -65504, the lowest f16
        }
        const double s = ((double) mx - (double) kvg_f16_to_f32(m16)) / top;
        s16            = kvg_f32_to_f16((float) s);
        if ((double) kvg_f16_to_f32(s16) < s) {
            s16 = kvg_f16_next_up(s16);
        }
        if (!kvg_f16_is_finite(s16)) {  // cannot happen for |x| <= 65504 and B >= 2; kept as a guard
            return kvg_fail(KVG_ERR_RANGE, "kivi: scale of group [%g, %g] does not fit in f16", (double) mn,
                            (double) mx);
        }
    }
    kvg_put_u16(g->min_f16, m16);
    kvg_put_u16(g->scale_f16, s16);
    *mf  = kvg_f16_to_f32(m16);
    *sf  = kvg_f16_to_f32(s16);
    *inv = s16 != 0 ? 1.0f / *sf : 0.0f;
    return KVG_OK;
}

// ---- scalar row kernels (the oracle) -------------------------------------------------------

static void minmax_update_ref(const float * x, float * mn, float * mx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        mn[i] = x[i] < mn[i] ? x[i] : mn[i];
        mx[i] = x[i] > mx[i] ? x[i] : mx[i];
    }
}

static void minmax_span_ref(const float * x, int64_t n, float * mn, float * mx) {
    float lo = x[0];
    float hi = x[0];
    for (int64_t i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

static void quant_row_ref(const float * x, const float * mf, const float * inv, int64_t n, int bits, uint8_t * codes,
                          uint64_t bit_off, uint8_t * q) {
    const float top = (float) ((1 << bits) - 1);
    for (int64_t i = 0; i < n; i++) {
        q[i] = kvg_kivi_code(x[i], mf[i], inv[i], top);
    }
    kvg_pack_bits(codes, bit_off, q, (size_t) n, bits);
}

static void dequant_row_ref(const uint8_t * codes, uint64_t bit_off, const float * mf, const float * sf, int64_t n,
                            int bits, float * out, uint8_t * q) {
    kvg_unpack_bits(codes, bit_off, q, (size_t) n, bits);
    for (int64_t i = 0; i < n; i++) {
        out[i] = mf[i] + (float) q[i] * sf[i];
    }
}

static const kvg_kivi_ops k_kivi_ops_ref = {
    minmax_update_ref,
    minmax_span_ref,
    quant_row_ref,
    dequant_row_ref,
};

// ---- drivers, shared by the scalar and SIMD paths ------------------------------------------

// Appends the group's place to the detail message of a failure.
static void where(int st, const char * rows, int64_t r0, int64_t r1, const char * cols, int64_t c0, int64_t c1) {
    char msg[160], rr[48], cc[48];
    snprintf(msg, sizeof(msg), "%s", kvg_last_error());
    snprintf(rr, sizeof(rr), r0 == r1 ? "%lld" : "%lld..%lld", (long long) r0, (long long) r1);
    snprintf(cc, sizeof(cc), c0 == c1 ? "%lld" : "%lld..%lld", (long long) c0, (long long) c1);
    kvg_fail(st, "%s, at %s %s, %s %s", msg, rows, rr, cols, cc);
}

int kvg_kivi_encode_with(const kvg_job * job, const float * src, uint8_t * dst, const kvg_kivi_ops * ops) {
    const int64_t C    = job->n_channels;
    const int64_t T    = job->n_tokens;
    const int64_t G    = job->group_size;
    const int     bits = job->bits;

    const int64_t    n_groups = job->kind == KVG_KIND_K ? ((T + G - 1) / G) * C : T * ((C + G - 1) / G);
    kvg_kivi_group * groups   = (kvg_kivi_group *) dst;
    uint8_t *        codes    = dst + (size_t) n_groups * sizeof(kvg_kivi_group);
    memset(codes, 0, (size_t) kvg_code_bytes(job->n_values, bits));

    // per-channel min, max, quantizer min and 1/scale, then one row of codes
    float * buf = (uint64_t) C <= SIZE_MAX / (4 * sizeof(float) + 1)
                      ? (float *) malloc((size_t) C * (4 * sizeof(float) + 1))
                      : NULL;
    if (buf == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kivi: cannot allocate scratch for %lld channels", (long long) C);
    }
    float *   mn  = buf;
    float *   mx  = buf + C;
    float *   mf  = buf + 2 * C;
    float *   inv = buf + 3 * C;
    uint8_t * q   = (uint8_t *) (buf + 4 * C);
    float     sf;
    int       st = KVG_OK;

    if (job->kind == KVG_KIND_K) {
        for (int64_t t0 = 0, tg = 0; t0 < T; t0 += G, tg++) {
            const int64_t t1 = t0 + G < T ? t0 + G : T;
            memcpy(mn, src + t0 * C, (size_t) C * sizeof(float));
            memcpy(mx, src + t0 * C, (size_t) C * sizeof(float));
            for (int64_t t = t0 + 1; t < t1; t++) {
                ops->minmax_update(src + t * C, mn, mx, C);
            }
            for (int64_t c = 0; c < C; c++) {
                st = kivi_group_params(mn[c], mx[c], bits, &groups[tg * C + c], &mf[c], &sf, &inv[c]);
                if (st != KVG_OK) {
                    where(st, "tokens", t0, t1 - 1, "channel", c, c);
                    goto done;
                }
            }
            for (int64_t t = t0; t < t1; t++) {
                ops->quant_row(src + t * C, mf, inv, C, bits, codes, (uint64_t) (t * C) * (uint64_t) bits, q);
            }
        }
    } else {
        const int64_t n_cg = (C + G - 1) / G;
        for (int64_t t = 0; t < T; t++) {
            const float * row = src + t * C;
            for (int64_t g = 0; g < n_cg; g++) {
                const int64_t c0 = g * G;
                const int64_t n  = C - c0 < G ? C - c0 : G;
                float         lo, hi, gm, gi;
                ops->minmax_span(row + c0, n, &lo, &hi);
                st = kivi_group_params(lo, hi, bits, &groups[t * n_cg + g], &gm, &sf, &gi);
                if (st != KVG_OK) {
                    where(st, "token", t, t, "channels", c0, c0 + n - 1);
                    goto done;
                }
                for (int64_t c = c0; c < c0 + n; c++) {
                    mf[c]  = gm;
                    inv[c] = gi;
                }
            }
            ops->quant_row(row, mf, inv, C, bits, codes, (uint64_t) (t * C) * (uint64_t) bits, q);
        }
    }
done:
    free(buf);
    return st;
}

// The encoder only stores finite mins and finite, non-negative (+0 for constant groups) scales.
int kvg_kivi_check(const kvg_job * job, const uint8_t * src) {
    const int64_t          n_groups = kvg_kivi_n_groups(job);
    const kvg_kivi_group * groups   = (const kvg_kivi_group *) src;
    for (int64_t i = 0; i < n_groups; i++) {
        const uint16_t m16 = kvg_get_u16(groups[i].min_f16);
        const uint16_t s16 = kvg_get_u16(groups[i].scale_f16);
        if (!kvg_f16_is_finite(m16) || !kvg_f16_is_finite(s16) || (s16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT,
                            "kivi: group %lld has min 0x%04x, scale 0x%04x (not finite or negative scale)",
                            (long long) i, m16, s16);
        }
    }
    return KVG_OK;
}

int kvg_kivi_decode_with(const kvg_job * job, const uint8_t * src, float * dst, const kvg_kivi_ops * ops) {
    const int64_t C    = job->n_channels;
    const int64_t T    = job->n_tokens;
    const int64_t G    = job->group_size;
    const int     bits = job->bits;

    const int64_t          n_groups = job->kind == KVG_KIND_K ? ((T + G - 1) / G) * C : T * ((C + G - 1) / G);
    const kvg_kivi_group * groups   = (const kvg_kivi_group *) src;
    const uint8_t *        codes    = src + (size_t) n_groups * sizeof(kvg_kivi_group);

    const int st = kvg_kivi_check(job, src);  // validate every group before writing
    if (st != KVG_OK) {
        return st;
    }

    float * buf = (uint64_t) C <= SIZE_MAX / (2 * sizeof(float) + 1)
                      ? (float *) malloc((size_t) C * (2 * sizeof(float) + 1))
                      : NULL;
    if (buf == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kivi: cannot allocate scratch for %lld channels", (long long) C);
    }
    float *   mf = buf;
    float *   sf = buf + C;
    uint8_t * q  = (uint8_t *) (buf + 2 * C);

    if (job->kind == KVG_KIND_K) {
        for (int64_t t0 = 0, tg = 0; t0 < T; t0 += G, tg++) {
            const int64_t t1 = t0 + G < T ? t0 + G : T;
            for (int64_t c = 0; c < C; c++) {
                mf[c] = kvg_f16_to_f32(kvg_get_u16(groups[tg * C + c].min_f16));
                sf[c] = kvg_f16_to_f32(kvg_get_u16(groups[tg * C + c].scale_f16));
            }
            for (int64_t t = t0; t < t1; t++) {
                ops->dequant_row(codes, (uint64_t) (t * C) * (uint64_t) bits, mf, sf, C, bits, dst + t * C, q);
            }
        }
    } else {
        const int64_t n_cg = (C + G - 1) / G;
        for (int64_t t = 0; t < T; t++) {
            for (int64_t g = 0; g < n_cg; g++) {
                const int64_t c0 = g * G;
                const int64_t n  = C - c0 < G ? C - c0 : G;
                const float   gm = kvg_f16_to_f32(kvg_get_u16(groups[t * n_cg + g].min_f16));
                const float   gs = kvg_f16_to_f32(kvg_get_u16(groups[t * n_cg + g].scale_f16));
                for (int64_t c = c0; c < c0 + n; c++) {
                    mf[c] = gm;
                    sf[c] = gs;
                }
            }
            ops->dequant_row(codes, (uint64_t) (t * C) * (uint64_t) bits, mf, sf, C, bits, dst + t * C, q);
        }
    }
    free(buf);
    return KVG_OK;
}

int kvg_kivi_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    return kvg_kivi_encode_with(job, src, dst, &k_kivi_ops_ref);
}

int kvg_kivi_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    return kvg_kivi_decode_with(job, src, dst, &k_kivi_ops_ref);
}

// ---- attention (scalar oracle) -------------------------------------------------------------
//
// Keys (groups per channel over G tokens): q . x = sum_c q_c * min_c + sum_c (q_c * scale_c) * code_c,
// so within a token group each query is folded with the group's scales once and every row is
// scored from its codes. Values (groups per token over G channels) change scale every row: the
// head's slice of the row is dequantized once and shared by every query of the KV head.

int kvg_kivi_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out) {
    const int64_t          D      = job->head_dim;
    const int64_t          C      = job->n_channels;
    const int64_t          G      = job->group_size;
    const int              bits   = job->bits;
    const kvg_kivi_group * groups = (const kvg_kivi_group *) src;
    const uint8_t *        codes  = src + (size_t) kvg_kivi_n_groups(job) * sizeof(kvg_kivi_group);
    float *                qf     = a->tmp;           // [n_q][D]: q * scale
    float *                qm     = qf + a->n_q * D;  // [n_q]: q . min
    uint8_t *              q      = (uint8_t *) (qm + a->n_q);
    for (int64_t t = t0; t < t0 + n;) {
        const int64_t tg = t / G;
        const int64_t e  = (tg + 1) * G < t0 + n ? (tg + 1) * G : t0 + n;
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const kvg_kivi_group * g = groups + tg * C + hk * D;
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * qj = a->q + j * D;
                float         s  = 0.0f;
                for (int64_t i = 0; i < D; i++) {
                    qf[j * D + i] = qj[i] * kvg_f16_to_f32(kvg_get_u16(g[i].scale_f16));
                    s += qj[i] * kvg_f16_to_f32(kvg_get_u16(g[i].min_f16));
                }
                qm[j] = s;
            }
        }
        for (int64_t u = t; u < e; u++) {
            for (int64_t hk = 0; hk < job->n_heads; hk++) {
                kvg_unpack_bits(codes, (uint64_t) (u * C + hk * D) * (uint64_t) bits, q, (size_t) D, bits);
                for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                    float s = 0.0f;
                    for (int64_t i = 0; i < D; i++) {
                        s += qf[j * D + i] * (float) q[i];
                    }
                    out[j * n + (u - t0)] = qm[j] + s;
                }
            }
        }
        t = e;
    }
    return KVG_OK;
}

int kvg_kivi_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    const int64_t          D      = job->head_dim;
    const int64_t          C      = job->n_channels;
    const int64_t          G      = job->group_size;
    const int64_t          n_cg   = (C + G - 1) / G;
    const int              bits   = job->bits;
    const kvg_kivi_group * groups = (const kvg_kivi_group *) src;
    const uint8_t *        codes  = src + (size_t) kvg_kivi_n_groups(job) * sizeof(kvg_kivi_group);
    float *                row    = a->tmp;
    uint8_t *              q      = (uint8_t *) (row + D);
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            kvg_unpack_bits(codes, (uint64_t) (t * C + hk * D) * (uint64_t) bits, q, (size_t) D, bits);
            for (int64_t i = 0; i < D; i++) {
                const kvg_kivi_group * g = groups + t * n_cg + (hk * D + i) / G;
                row[i] =
                    kvg_f16_to_f32(kvg_get_u16(g->min_f16)) + (float) q[i] * kvg_f16_to_f32(kvg_get_u16(g->scale_f16));
            }
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + (t - t0)];
                float *     acc = a->acc + j * D;
                for (int64_t i = 0; i < D; i++) {
                    acc[i] += w * row[i];
                }
            }
        }
    }
    return KVG_OK;
}
