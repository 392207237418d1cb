// lowrank.c: rotq plus a low-rank correction of the block's residual (a claim of the literature, after
// TurboQuant++: "a rank-4 low-rank correction recovers 96% of 2-bit's perplexity loss"). The
// block X (n_tokens x C, C = n_heads * head_dim) is encoded with rotq at the codec's bits;
// the residual R = X - rotq_decode(rotq(X)) gets a rank-r factorization R ~ U V^T, r = 4
// (fewer when n_tokens or C is smaller), U (n_tokens x r) and V (C x r) kept in f16.
// Decoding is rotq's decode plus U V^T.
//
// One factorization over all C channels, not one per head: U is shared by the heads, and on
// the real rows (SmolLM2, 3 heads of 64) per-head factors reduce the error less per stored bit
// (rank 1 per head, 2.75 bits: rel. MSE 0.091; rank 2 over all channels, 2.92 bits: 0.088).
// The rank is the claim's: no rank we tried (1, 2, 4, 8) beats rotq at the same bits, since
// rotq's residual is close to white noise: rank 4 removes 20-31% of rotq2's error on SmolLM2 and
// Gemma-3 K/V, not 96%, for 1.25-1.33 more bits per value.
//
// The factors come from a fixed number of subspace (block power) iterations in double
// precision (Halko, Martinsson & Tropp 2011, alg. 4.4) from a start drawn with splitmix64
// from job->seed, each step orthonormalized by Gram-Schmidt: deterministic, no library.
// U's columns are an orthonormal basis Q of the subspace and V = R^T Q (column k of each scaled
// by g and 1/g), so U V^T is R's projection onto span(Q): it can only lower the error, however
// far the iterations got.
//
// Layout: the rotq encoding of X (f16 norms, then codes), then U [n_tokens][r] f16, then
// V [C][r] f16.
// Bits per value: B + 16/head_dim + 16 r (n_tokens + C) / (n_tokens C). At the live cache's
// 64-row blocks of one head: head_dim 64: B + 0.25 + 2.0; head_dim 256: B + 0.0625 + 1.25.
// (SmolLM2's blocks, 3 heads of 64: B + 0.25 + 1.333.)

#include "kvg_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOWRANK_RANK 4  // the claim's rank
// Subspace iterations: on the rotq2 residuals of SmolLM2 and Gemma-3 rows, 8 capture 98-99% of
// the exact rank-4 SVD's energy (4: 95-97%, 16: 99.3-99.8%).
#define LOWRANK_ITERS 8

static int64_t rank_of(const kvg_job * job) {
    int64_t r = LOWRANK_RANK;
    r         = job->n_tokens < r ? job->n_tokens : r;
    return job->n_channels < r ? job->n_channels : r;
}

static size_t factor_count(const kvg_job * job) {  // f16 entries of U and V
    return (size_t) rank_of(job) * (size_t) (job->n_tokens + job->n_channels);
}

int kvg_lowrank_size(const kvg_job * job, size_t * out_bytes) {
    size_t    rotq = 0;
    const int st   = kvg_rotq_size(job, &rotq);  // names the codec when head_dim is not a power of two
    if (st != KVG_OK) {
        return st;
    }
    // n_values <= 2^56 keeps r (n + C) <= 4 (2^56 + 1) far from overflowing 64 bits
    const uint64_t bytes = (uint64_t) rotq + 2 * (uint64_t) factor_count(job);
    if (bytes > (uint64_t) SIZE_MAX) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: encoded size %llu does not fit in size_t", kvg_codec_name(job->type),
                        (unsigned long long) bytes);
    }
    *out_bytes = (size_t) bytes;
    return KVG_OK;
}

// ---- the factorization ---------------------------------------------------------------------

// Orthonormalizes the r columns of A (m x r, row-major) in place by modified Gram-Schmidt,
// run twice ("twice is enough", Giraud et al. 2005). A column that is (numerically) in the
// span of the previous ones, or zero, becomes zero: R has rank < r there.
static void orthonormalize(double * A, int64_t m, int64_t r) {
    for (int64_t k = 0; k < r; k++) {
        double n0 = 0.0;
        for (int64_t i = 0; i < m; i++) {
            n0 += A[i * r + k] * A[i * r + k];
        }
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t j = 0; j < k; j++) {
                double d = 0.0;
                for (int64_t i = 0; i < m; i++) {
                    d += A[i * r + j] * A[i * r + k];
                }
                for (int64_t i = 0; i < m; i++) {
                    A[i * r + k] -= d * A[i * r + j];
                }
            }
        }
        double n1 = 0.0;
        for (int64_t i = 0; i < m; i++) {
            n1 += A[i * r + k] * A[i * r + k];
        }
        const double inv = (n1 > 0.0 && n1 > 1e-24 * n0) ? 1.0 / sqrt(n1) : 0.0;
        for (int64_t i = 0; i < m; i++) {
            A[i * r + k] *= inv;
        }
    }
}

// Y (n x r) = R (n x C) Z (C x r)
static void mul_rz(const double * R, const double * Z, double * Y, int64_t n, int64_t C, int64_t r) {
    memset(Y, 0, (size_t) (n * r) * sizeof(double));
    for (int64_t t = 0; t < n; t++) {
        double * y = Y + t * r;
        for (int64_t c = 0; c < C; c++) {
            const double   v = R[t * C + c];
            const double * z = Z + c * r;
            for (int64_t k = 0; k < r; k++) {
                y[k] += v * z[k];
            }
        }
    }
}

// Z (C x r) = R^T (C x n) Q (n x r)
static void mul_rtq(const double * R, const double * Q, double * Z, int64_t n, int64_t C, int64_t r) {
    memset(Z, 0, (size_t) (C * r) * sizeof(double));
    for (int64_t t = 0; t < n; t++) {
        const double * q = Q + t * r;
        for (int64_t c = 0; c < C; c++) {
            const double v = R[t * C + c];
            double *     z = Z + c * r;
            for (int64_t k = 0; k < r; k++) {
                z[k] += v * q[k];
            }
        }
    }
}

// Q (n x r) orthonormal spanning (nearly) R's top-r left singular subspace, then Z = R^T Q.
static void factorize(const kvg_job * job, const double * R, double * Q, double * Z, int64_t r) {
    const int64_t n     = job->n_tokens;
    const int64_t C     = job->n_channels;
    uint64_t      state = job->seed ^ 0x6C6F7772616E6BULL;  // "lowrank": apart from rotq's signs
    for (int64_t i = 0; i < C * r; i++) {
        Z[i] = (double) (kvg_splitmix64(&state) >> 11) * 0x1.0p-52 - 1.0;  // uniform in [-1, 1)
    }
    mul_rz(R, Z, Q, n, C, r);
    orthonormalize(Q, n, r);
    for (int it = 0; it < LOWRANK_ITERS; it++) {
        mul_rtq(R, Q, Z, n, C, r);
        orthonormalize(Z, C, r);
        mul_rz(R, Z, Q, n, C, r);
        orthonormalize(Q, n, r);
    }
    mul_rtq(R, Q, Z, n, C, r);
}

// Column k of U is g Q[:, k] and of V Z[:, k] / g, g chosen so both have the same largest
// magnitude, sqrt(max|Q_k| max|Z_k|): the f16 range is shared evenly between the factors.
static int store_factors(const kvg_job * job, const double * Q, const double * Z, int64_t r, uint8_t * dst) {
    const int64_t n  = job->n_tokens;
    const int64_t C  = job->n_channels;
    uint8_t *     du = dst;
    uint8_t *     dv = dst + 2 * (size_t) (n * r);
    for (int64_t k = 0; k < r; k++) {
        double mu = 0.0, mv = 0.0;
        for (int64_t t = 0; t < n; t++) {
            mu = fmax(mu, fabs(Q[t * r + k]));
        }
        for (int64_t c = 0; c < C; c++) {
            mv = fmax(mv, fabs(Z[c * r + k]));
        }
        const double gu = (mu > 0.0 && mv > 0.0) ? sqrt(mv / mu) : 0.0;  // 0: no such direction
        const double gv = gu > 0.0 ? 1.0 / gu : 0.0;
        if (gu > 0.0 && sqrt(mu * mv) > (double) KVG_F16_MAX) {
            return kvg_fail(KVG_ERR_RANGE, "%s: low-rank factor %lld has entries of %g, beyond f16 (<= 65504)",
                            kvg_codec_name(job->type), (long long) k, sqrt(mu * mv));
        }
        for (int64_t t = 0; t < n; t++) {
            const uint16_t h = kvg_f32_to_f16((float) (Q[t * r + k] * gu));
            if (!kvg_f16_is_finite(h)) {
                return kvg_fail(KVG_ERR_RANGE, "%s: low-rank factor U does not fit in f16", kvg_codec_name(job->type));
            }
            kvg_put_u16(du + 2 * (t * r + k), h);
        }
        for (int64_t c = 0; c < C; c++) {
            const uint16_t h = kvg_f32_to_f16((float) (Z[c * r + k] * gv));
            if (!kvg_f16_is_finite(h)) {
                return kvg_fail(KVG_ERR_RANGE, "%s: low-rank factor V does not fit in f16", kvg_codec_name(job->type));
            }
            kvg_put_u16(dv + 2 * (c * r + k), h);
        }
    }
    return KVG_OK;
}

// ---- drivers -------------------------------------------------------------------------------

int kvg_lowrank_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    const int64_t n          = job->n_tokens;
    const int64_t C          = job->n_channels;
    const int64_t r          = rank_of(job);
    size_t        rotq_bytes = 0;
    int           st         = kvg_rotq_size(job, &rotq_bytes);
    if (st != KVG_OK) {
        return st;
    }
    // The rotq part is the reference rotq encoding of X at the codec's bits (job->bits).
    st = kvg_rotq_encode_ref(job, src, dst);
    if (st != KVG_OK) {
        return st;
    }
    float *  y = (float *) malloc((size_t) job->n_values * sizeof(float));
    double * R = (double *) malloc((size_t) job->n_values * sizeof(double));
    double * Q = (double *) malloc((size_t) (n * r) * sizeof(double));
    double * Z = (double *) malloc((size_t) (C * r) * sizeof(double));
    if (y == NULL || R == NULL || Q == NULL || Z == NULL) {
        st = kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate the residual", kvg_codec_name(job->type));
        goto done;
    }
    st = kvg_rotq_decode_ref(job, dst, y);  // what the decoder will add the correction to
    if (st != KVG_OK) {
        goto done;
    }
    for (int64_t i = 0; i < job->n_values; i++) {
        R[i] = (double) src[i] - (double) y[i];
    }
    factorize(job, R, Q, Z, r);
    st = store_factors(job, Q, Z, r, dst + rotq_bytes);
done:
    free(y);
    free(R);
    free(Q);
    free(Z);
    return st;
}

int kvg_lowrank_check(const kvg_job * job, const uint8_t * src) {
    size_t rotq_bytes = 0;
    int    st         = kvg_rotq_size(job, &rotq_bytes);
    if (st != KVG_OK) {
        return st;
    }
    const size_t nf = factor_count(job);
    for (size_t i = 0; i < nf; i++) {
        if (!kvg_f16_is_finite(kvg_get_u16(src + rotq_bytes + 2 * i))) {
            return kvg_fail(KVG_ERR_CORRUPT, "%s: low-rank factor entry %zu is not finite", kvg_codec_name(job->type),
                            i);
        }
    }
    return kvg_rotq_check(job, src);
}

int kvg_lowrank_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    const int64_t n  = job->n_tokens;
    const int64_t C  = job->n_channels;
    const int64_t r  = rank_of(job);
    int           st = kvg_lowrank_check(job, src);  // validate before writing anything
    if (st != KVG_OK) {
        return st;
    }
    size_t rotq_bytes = 0;
    kvg_rotq_size(job, &rotq_bytes);  // cannot fail: the check above ran it
    float * f = (float *) malloc(factor_count(job) * sizeof(float));
    if (f == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate the factors", kvg_codec_name(job->type));
    }
    for (size_t i = 0; i < factor_count(job); i++) {
        f[i] = kvg_f16_to_f32(kvg_get_u16(src + rotq_bytes + 2 * i));
    }
    st = kvg_rotq_decode_ref(job, src, dst);
    if (st == KVG_OK) {
        const float * U = f;
        const float * V = f + n * r;
        for (int64_t t = 0; t < n; t++) {
            for (int64_t c = 0; c < C; c++) {
                float s = 0.0f;
                for (int64_t k = 0; k < r; k++) {
                    s += U[t * r + k] * V[c * r + k];
                }
                dst[t * C + c] += s;
            }
        }
    }
    free(f);
    return st;
}
