// pq.c: product quantization of rotated, normalized head vectors with a trained codebook
// (TurboQuant++'s PQ, TSC part II's VQ, and vq8f: VQ with TSC II's fp16 fallback bitmask). Each head vector x is stored as its f16 L2 norm n and,
// for y = W(s * x) / n (rotq's rotation: unit variance per coordinate), one byte per sub-vector
// of S coordinates: the index of the nearest of KVG_PQ_CENTROIDS centroids. pq2: S = 4 (2 bits
// per value), vq8: S = head_dim (one byte per head vector). The codebook, [256][S] floats, is
// not in the block: the store keeps one per (layer, kind), trained by k-means on the first rows
// it encodes (kvg_pq_train), and counts its bytes (kvg_store_book_bytes).
// vq8f: one code per head vector loses most on the vectors far from every centroid; each block
// keeps the 1/KVG_VQ8F_SHARE worst of them (largest ||y - centroid||) as y in f16, flagged in a
// bitmask. A fixed share keeps the block's size a function of its shape, as every codec's is.
// Why rotate first: the rotation makes every sub-vector look alike, so one book serves all of
// them (16 per-subspace books of raw keys measured better per row, but cost 16x the book bytes).
#include "kvg_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PQ_TRAIN_ITERS   10
#define PQ_TRAIN_SAMPLES 65536  // sub-vectors k-means looks at, at most (evenly strided)

int64_t kvg_pq_sub_len(int type, int64_t head_dim) {
    return type == KVG_CODEC_VQ8 || type == KVG_CODEC_VQ8F ? head_dim : 4;
}

static const char * pq_name(int type) {
    return type == KVG_CODEC_VQ8F ? "vq8f" : type == KVG_CODEC_VQ8 ? "vq8" : "pq2";
}

// Head vectors vq8f keeps in f16 (0 for pq2 and vq8).
static int64_t n_fallback(int type, int64_t nv) {
    return type == KVG_CODEC_VQ8F ? (nv + KVG_VQ8F_SHARE - 1) / KVG_VQ8F_SHARE : 0;
}

// The block's parts after the norms: codes, then (vq8f) the bitmask and the f16 vectors.
typedef struct pq_layout {
    int64_t nv, M, F;
    size_t  codes, mask, fallback;  // byte offsets
} pq_layout;

static pq_layout layout_of(const kvg_job * job) {
    pq_layout l;
    l.nv       = job->n_tokens * job->n_heads;
    l.M        = job->head_dim / kvg_pq_sub_len(job->type, job->head_dim);
    l.F        = n_fallback(job->type, l.nv);
    l.codes    = (size_t) l.nv * 2;
    l.mask     = l.codes + (size_t) l.nv * (size_t) l.M;
    l.fallback = l.mask + (l.F ? (size_t) (l.nv + 7) / 8 : 0);
    return l;
}

static int flagged(const uint8_t * mask, int64_t v) {
    return (mask[v >> 3] >> (v & 7)) & 1;
}

// Set bits of mask before vector v: the fallback slot of v when v is flagged.
static int64_t ones_before(const uint8_t * mask, int64_t v) {
    int64_t n = 0;
    for (int64_t b = 0; b < (v >> 3); b++) {
        n += __builtin_popcount(mask[b]);
    }
    return (v & 7) ? n + __builtin_popcount(mask[v >> 3] & ((1u << (v & 7)) - 1u)) : n;  // v = nv: no byte past
}

// vq8f's flagged vectors take their f16 y where the others take centroids (NULL for the
// others); *k: the fallback slot of the next flagged vector, advanced past v's.
static const uint8_t * fallback_of(const kvg_job * job, const uint8_t * src, const pq_layout * l, int64_t v,
                                   int64_t * k) {
    if (!l->F || !flagged(src + l->mask, v)) {
        return NULL;
    }
    return src + l->fallback + 2 * ((*k)++) * job->head_dim;
}

static int pow2_dim(int64_t d) {
    return d >= 4 && d <= KVG_ROTQ_MAX_HEAD_DIM && (d & (d - 1)) == 0;
}

int kvg_pq_size(const kvg_job * job, size_t * out_bytes) {
    const char * name = pq_name(job->type);
    if (!pow2_dim(job->head_dim)) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: head_dim must be a power of two in [4, %d], got %lld", name,
                        KVG_ROTQ_MAX_HEAD_DIM, (long long) job->head_dim);
    }
    const pq_layout l = layout_of(job);
    *out_bytes        = l.fallback + (size_t) l.F * (size_t) job->head_dim * 2;
    return KVG_OK;
}

// The codebook the job carries: present, the right size, finite.
static int check_book(const kvg_job * job) {
    const char *  name = pq_name(job->type);
    const int64_t S    = kvg_pq_sub_len(job->type, job->head_dim);
    const size_t  want = (size_t) KVG_PQ_CENTROIDS * (size_t) S;
    if (!job->book || job->book_count != want) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: needs its codebook of %d x %lld floats (params.book), got %zu", name,
                        KVG_PQ_CENTROIDS, (long long) S, job->book ? job->book_count : (size_t) 0);
    }
    for (size_t i = 0; i < want; i++) {
        if (!isfinite(job->book[i])) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "%s: codebook value %zu is not finite", name, i);
        }
    }
    return KVG_OK;
}

int kvg_pq_check(const kvg_job * job, const uint8_t * src) {
    int rc = check_book(job);
    if (rc != KVG_OK) {
        return rc;
    }
    const pq_layout l = layout_of(job);
    for (int64_t v = 0; v < l.nv; v++) {
        const uint16_t n16 = kvg_get_u16(src + 2 * v);
        if (!kvg_f16_is_finite(n16) || (n16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT, "pq: vector %lld has norm 0x%04x (negative or not finite)", (long long) v,
                            n16);
        }
    }
    if (l.F) {  // vq8f: exactly F flags, none past the last vector, finite f16 vectors
        const uint8_t * mask = src + l.mask;
        const int64_t   tail = l.nv & 7;
        if (tail && (mask[l.nv >> 3] >> tail)) {
            return kvg_fail(KVG_ERR_CORRUPT, "vq8f: the fallback bitmask flags a vector past the last (%lld)",
                            (long long) l.nv);
        }
        if (ones_before(mask, l.nv) != l.F) {
            return kvg_fail(KVG_ERR_CORRUPT, "vq8f: the fallback bitmask flags %lld vectors, not %lld",
                            (long long) ones_before(mask, l.nv), (long long) l.F);
        }
        for (int64_t i = 0; i < l.F * job->head_dim; i++) {
            if (!kvg_f16_is_finite(kvg_get_u16(src + l.fallback + 2 * i))) {
                return kvg_fail(KVG_ERR_CORRUPT, "vq8f: fallback value %lld is not finite", (long long) i);
            }
        }
    }
    return KVG_OK;  // every code byte names a centroid
}

// Index of the centroid nearest to v (the lowest on ties); *out_dist (may be NULL) its squared distance.
static uint8_t nearest_dist(const float * book, const float * v, int64_t S, float * out_dist) {
    int   best   = 0;
    float best_d = INFINITY;
    for (int c = 0; c < KVG_PQ_CENTROIDS; c++) {
        const float * b    = book + (size_t) c * (size_t) S;
        float         dist = 0.0f;
        for (int64_t i = 0; i < S; i++) {
            const float e = v[i] - b[i];
            dist += e * e;
        }
        if (dist < best_d) {
            best_d = dist;
            best   = c;
        }
    }
    if (out_dist) {
        *out_dist = best_d;
    }
    return (uint8_t) best;
}

static uint8_t nearest(const float * book, const float * v, int64_t S) {
    return nearest_dist(book, v, S, NULL);
}

typedef struct pq_err {
    float   err;
    int64_t v;
} pq_err;

static int worst_first(const void * a, const void * b) {  // largest error first, then lowest index
    const pq_err * x = (const pq_err *) a;
    const pq_err * y = (const pq_err *) b;
    if (x->err != y->err) {
        return x->err > y->err ? -1 : 1;
    }
    return x->v < y->v ? -1 : x->v > y->v;
}

int kvg_pq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    int rc = check_book(job);
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t   d = job->head_dim, S = kvg_pq_sub_len(job->type, d);
    const pq_layout l = layout_of(job);
    float           sgn[KVG_ROTQ_MAX_HEAD_DIM], y[KVG_ROTQ_MAX_HEAD_DIM];
    kvg_rotq_signs(job->seed, d, sgn);
    pq_err * errs = l.F ? (pq_err *) malloc((size_t) l.nv * sizeof(pq_err)) : NULL;
    if (l.F && !errs) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "vq8f: scratch for %lld vectors", (long long) l.nv);
    }
    uint8_t * codes = dst + l.codes;
    for (int64_t v = 0; v < l.nv; v++) {
        uint16_t n16;
        rc = kvg_rotq_rotate("pq", src + v * d, d, sgn, y, &n16);
        if (rc != KVG_OK) {
            free(errs);
            return rc;
        }
        kvg_put_u16(dst + 2 * v, n16);
        float err = 0.0f;
        for (int64_t m = 0; m < l.M; m++) {
            float e            = 0.0f;
            codes[v * l.M + m] = n16 ? nearest_dist(job->book, y + m * S, S, &e) : 0;
            err += e;
        }
        if (errs) {
            errs[v] = (pq_err) { err, v };
        }
    }
    if (l.F) {  // vq8f: flag the F worst, then store their y (rotated again: cheaper than keeping all)
        qsort(errs, (size_t) l.nv, sizeof(pq_err), worst_first);
        uint8_t * mask = dst + l.mask;
        memset(mask, 0, l.fallback - l.mask);
        for (int64_t i = 0; i < l.F; i++) {
            mask[errs[i].v >> 3] |= (uint8_t) (1u << (errs[i].v & 7));
        }
        free(errs);
        int64_t k = 0;
        for (int64_t v = 0; v < l.nv; v++) {
            if (!flagged(mask, v)) {
                continue;
            }
            uint16_t n16;
            kvg_rotq_rotate("pq", src + v * d, d, sgn, y, &n16);  // succeeded above
            for (int64_t i = 0; i < d; i++) {
                kvg_put_u16(dst + l.fallback + 2 * (k * d + i), n16 ? kvg_f32_to_f16(y[i]) : 0);
            }
            k++;
        }
    }
    return KVG_OK;
}

int kvg_pq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    int rc = kvg_pq_check(job, src);  // before writing anything
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t   d = job->head_dim, S = kvg_pq_sub_len(job->type, d), M = d / S;
    const pq_layout l = layout_of(job);
    float           sgn[KVG_ROTQ_MAX_HEAD_DIM];
    kvg_rotq_signs(job->seed, d, sgn);
    const uint8_t * codes = src + l.codes;
    int64_t         k     = 0;
    for (int64_t v = 0; v < l.nv; v++) {
        float *         out = dst + v * d;
        const float     nf  = kvg_f16_to_f32(kvg_get_u16(src + 2 * v));
        const uint8_t * fb  = fallback_of(job, src, &l, v, &k);  // before skipping: keeps k in step
        if (nf == 0.0f) {
            memset(out, 0, (size_t) d * sizeof(float));
            continue;
        }
        if (fb) {
            for (int64_t i = 0; i < d; i++) {
                out[i] = kvg_f16_to_f32(kvg_get_u16(fb + 2 * i));
            }
        } else {
            for (int64_t m = 0; m < M; m++) {
                memcpy(out + m * S, job->book + (size_t) codes[v * M + m] * (size_t) S, (size_t) S * sizeof(float));
            }
        }
        kvg_fwht_ref(out, d);
        const float f = nf * (1.0f / (float) d);  // W W = d I
        for (int64_t i = 0; i < d; i++) {
            out[i] = (out[i] * f) * sgn[i];
        }
    }
    return KVG_OK;
}

// ---- training: k-means (Lloyd) on the rotated sub-vectors ----------------------------------

int kvg_pq_train(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
                 int64_t head_dim, const kvg_codec_params * p, float * book, size_t book_count) {
    kvg_clear_error();
    if (type != KVG_CODEC_PQ2 && type != KVG_CODEC_VQ8 && type != KVG_CODEC_VQ8F) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_pq_train: codec type %d has no codebook (pq2, vq8 and vq8f do)",
                        type);
    }
    kvg_job job;
    size_t  size = 0;
    int     rc   = kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, &size);
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t d = head_dim, S = kvg_pq_sub_len(type, d), M = d / S;
    if (!src || !book || src_count != (size_t) job.n_values || book_count != (size_t) KVG_PQ_CENTROIDS * (size_t) S) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "kvg_pq_train: needs %lld values and a book of %lld floats",
                        (long long) job.n_values, (long long) (KVG_PQ_CENTROIDS * S));
    }
    const int64_t nv    = n_tokens * n_heads;
    const int64_t n_all = nv * M;
    const int64_t step  = n_all > PQ_TRAIN_SAMPLES ? (n_all + PQ_TRAIN_SAMPLES - 1) / PQ_TRAIN_SAMPLES : 1;
    const int64_t n_max = (n_all + step - 1) / step;
    float *       X     = (float *) malloc((size_t) n_max * (size_t) S * sizeof(float));
    float *       sum   = (float *) malloc((size_t) KVG_PQ_CENTROIDS * (size_t) S * sizeof(float));
    int64_t *     cnt   = (int64_t *) malloc(KVG_PQ_CENTROIDS * sizeof(int64_t));
    uint8_t *     asg   = (uint8_t *) malloc((size_t) n_max);
    float *       sgn   = (float *) malloc((size_t) d * sizeof(float) * 2);
    if (!X || !sum || !cnt || !asg || !sgn) {
        rc = kvg_fail(KVG_ERR_NO_MEMORY, "kvg_pq_train: scratch for %lld sub-vectors", (long long) n_max);
        goto done;
    }
    float * y = sgn + d;
    kvg_rotq_signs(job.seed, d, sgn);
    int64_t n = 0;  // sub-vectors of non-zero vectors, every step-th
    for (int64_t v = 0; v < nv; v++) {
        uint16_t n16;
        rc = kvg_rotq_rotate("pq", src + v * d, d, sgn, y, &n16);
        if (rc != KVG_OK) {
            goto done;
        }
        for (int64_t m = 0; m < M; m++) {
            if (n16 && (v * M + m) % step == 0) {
                memcpy(X + n * S, y + m * S, (size_t) S * sizeof(float));
                n++;
            }
        }
    }
    if (n == 0) {
        rc = kvg_fail(KVG_ERR_INVALID_ARG, "kvg_pq_train: every vector is zero; nothing to train on");
        goto done;
    }
    // Start from samples scattered by a golden-ratio hash (evenly spaced ones would all be the
    // same sub-vector of the same head), or every sample in turn when there are fewer than
    // KVG_PQ_CENTROIDS (the repeats stay duplicates, never chosen: nearest() takes the lowest).
    for (int c = 0; c < KVG_PQ_CENTROIDS; c++) {
        const int64_t i =
            n >= KVG_PQ_CENTROIDS ? (int64_t) (((uint64_t) c * 0x9E3779B97F4A7C15ULL) % (uint64_t) n) : c % n;
        memcpy(book + (size_t) c * (size_t) S, X + i * S, (size_t) S * sizeof(float));
    }
    for (int it = 0; it < PQ_TRAIN_ITERS; it++) {
        memset(sum, 0, (size_t) KVG_PQ_CENTROIDS * (size_t) S * sizeof(float));
        memset(cnt, 0, KVG_PQ_CENTROIDS * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) {
            asg[i]      = nearest(book, X + i * S, S);
            float * acc = sum + (size_t) asg[i] * (size_t) S;
            for (int64_t j = 0; j < S; j++) {
                acc[j] += X[i * S + j];
            }
            cnt[asg[i]]++;
        }
        for (int c = 0; c < KVG_PQ_CENTROIDS; c++) {  // an empty cluster keeps its centroid
            for (int64_t j = 0; cnt[c] && j < S; j++) {
                book[(size_t) c * (size_t) S + j] = sum[(size_t) c * (size_t) S + j] / (float) cnt[c];
            }
        }
    }
    rc = KVG_OK;
done:
    free(X);
    free(sum);
    free(cnt);
    free(asg);
    free(sgn);
    return rc;
}

// ---- attention: scored and summed from the codes, in the rotated domain ----------------------
//
// Like rotq (traits.rotated): q . x' = (n / d) * sum over sub-vectors m of qr_m . book[code_m],
// with qr = W(s * q); values add (n / d) * book[code_m] into accr, which attend.c turns back
// with s * W once per query. No block decode, no transform per row.

int kvg_pq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a, float * out) {
    const int64_t D = job->head_dim, H = job->n_heads, S = kvg_pq_sub_len(job->type, D), M = D / S;
    if (!job->book) {  // the store passes the list's codebook; checked when the block was linked
        return kvg_fail(KVG_ERR_INVALID_ARG, "pq: attend without the codebook");
    }
    const pq_layout l     = layout_of(job);
    const uint8_t * codes = src + l.codes;
    int64_t         k     = l.F ? ones_before(src + l.mask, t0 * H) : 0;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const float     f  = kvg_f16_to_f32(kvg_get_u16(src + 2 * (t * H + hk))) * (1.0f / (float) D);
            const uint8_t * c  = codes + (size_t) (t * H + hk) * (size_t) M;
            const uint8_t * fb = fallback_of(job, src, &l, t * H + hk, &k);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * qr = a->qr + j * D;
                float         s  = 0.0f;
                if (fb) {
                    for (int64_t i = 0; i < D; i++) {
                        s += qr[i] * kvg_f16_to_f32(kvg_get_u16(fb + 2 * i));
                    }
                } else {
                    for (int64_t m = 0; m < M; m++) {
                        const float * b = job->book + (size_t) c[m] * (size_t) S;
                        for (int64_t i = 0; i < S; i++) {
                            s += qr[m * S + i] * b[i];
                        }
                    }
                }
                out[j * n + (t - t0)] = f * s;
            }
        }
    }
    return KVG_OK;
}

int kvg_pq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                          const kvg_attn * a) {
    const int64_t D = job->head_dim, H = job->n_heads, S = kvg_pq_sub_len(job->type, D), M = D / S;
    if (!job->book) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "pq: attend without the codebook");
    }
    const pq_layout l     = layout_of(job);
    const uint8_t * codes = src + l.codes;
    int64_t         k     = l.F ? ones_before(src + l.mask, t0 * H) : 0;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const float     f  = kvg_f16_to_f32(kvg_get_u16(src + 2 * (t * H + hk))) * (1.0f / (float) D);
            const uint8_t * fb = fallback_of(job, src, &l, t * H + hk, &k);  // before skipping: keeps k in step
            if (f == 0.0f) {
                continue;  // a zero vector adds nothing
            }
            const uint8_t * c = codes + (size_t) (t * H + hk) * (size_t) M;
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + (t - t0)] * f;
                float *     acc = a->accr + j * D;
                if (fb) {
                    for (int64_t i = 0; i < D; i++) {
                        acc[i] += w * kvg_f16_to_f32(kvg_get_u16(fb + 2 * i));
                    }
                    continue;
                }
                for (int64_t m = 0; m < M; m++) {
                    const float * b = job->book + (size_t) c[m] * (size_t) S;
                    for (int64_t i = 0; i < S; i++) {
                        acc[m * S + i] += w * b[i];
                    }
                }
            }
        }
    }
    return KVG_OK;
}
