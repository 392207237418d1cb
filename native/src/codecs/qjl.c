// qjl.c: TurboQuant's inner-product quantizer (Q_prod, Zandieh et al. 2025, arXiv:2504.19874,
// Algorithm 2), built on QJL (Zandieh et al. 2024, arXiv:2406.03482). Each head vector x is
// coded by rotq at one bit less (qjl3 -> rotq2, qjl4 -> rotq3), giving x_hat; the residual
// r = x - x_hat keeps a 1-bit sketch z = sign(S r), S an m x d matrix of i.i.d. N(0, 1) entries
// (m = d = head_dim), and ||r|| in f16. Decode returns
//
//     x' = x_hat + sqrt(pi/2) / m * ||r|| * S^T z.
//
// For any query q, q . x' = q . x_hat + sqrt(pi/2) / m * ||r|| * <S q, sign(S r)>, which is
// exactly QJL's estimator of q . r (QJL Lemma 3.2): unbiased over S, E[q . x'] = q . x, with
// variance at most pi / (2m) * ||r||^2 * ||q||^2. attend_rows.c dots decoded rows, so the
// attention scores are that estimator. rotq alone is biased (it shrinks inner products by about
// its relative MSE); the price of unbiasedness is variance, and the reconstruction error is
// (pi/2) ||r||^2, worse than rotq(B - 1)'s own. Measured on SmolLM2's keys (issue 13): qjl3
// (3.5 bits) removes rotq's bias but its variance alone is 3.5x rotq3's (3.25 bits) whole score
// error, and softmax weights move more than with rotq2; spending the bit in rotq wins.
//
// Layout of a block of nv = n_tokens * n_heads vectors:
//   residual norms [nv] f16, then rotq's encoding at bits - 1 (its own norms [nv] f16 and
//   codes), then the sign bits [nv][d] (bit 1: (S r)_i >= 0), packed as kvg_pack_bits does.
// Bits per value: (B - 1) + 1 + 16/d (rotq's norm) + 16/d (the residual norm) = B + 32/d;
// at a 64-row block, exactly: qjl3 3.5 (d = 64), 3.125 (d = 256); qjl4 4.5, 4.125.
//
// S depends only on (head_dim, seed): generated with splitmix64 + Box-Muller in double and
// rounded to float, so encoder and decoder rebuild the same matrix. libm's log/cos may differ
// in the last bit across platforms; that can flip an entry's float rounding, which moves a
// decoded value by far less than the estimator's own noise.

#include "kvg_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(_WIN32)
#    include <windows.h>
static SRWLOCK g_mat_lock = SRWLOCK_INIT;
static void    mat_lock(void) {
    AcquireSRWLockExclusive(&g_mat_lock);
}
static void mat_unlock(void) {
    ReleaseSRWLockExclusive(&g_mat_lock);
}
#else
#    include <pthread.h>
static pthread_mutex_t g_mat_lock = PTHREAD_MUTEX_INITIALIZER;
static void            mat_lock(void) {
    pthread_mutex_lock(&g_mat_lock);
}
static void mat_unlock(void) {
    pthread_mutex_unlock(&g_mat_lock);
}
#endif

#define QJL_PI 3.14159265358979323846

// A tag that separates S's random stream from rotq's sign stream for the same seed: the
// estimator is unbiased only if S is independent of r (which depends on rotq's signs).
#define QJL_STREAM 0x514a4c5f534b4554ULL  // "QJL_SKET"

// ---- the Gaussian matrix S -----------------------------------------------------------------

// S row-major, d x d floats, or NULL if out of memory.
static float * build_matrix(int64_t d, uint64_t seed) {
    const size_t n = (size_t) d * (size_t) d;  // even: d is a power of two >= 2
    float *      s = (float *) malloc(n * sizeof(float));
    if (s == NULL) {
        return NULL;
    }
    uint64_t state = kvg_mix64(seed ^ QJL_STREAM);
    for (size_t k = 0; k < n; k += 2) {
        const uint64_t a = kvg_splitmix64(&state);
        const uint64_t b = kvg_splitmix64(&state);
        // Box-Muller: u1 in (0, 1) so log never sees 0; u2 in [0, 1)
        const double u1  = ((double) (a >> 11) + 0.5) * 0x1.0p-53;
        const double u2  = (double) (b >> 11) * 0x1.0p-53;
        const double rad = sqrt(-2.0 * log(u1));
        s[k]             = (float) (rad * cos(2.0 * QJL_PI * u2));
        s[k + 1]         = (float) (rad * sin(2.0 * QJL_PI * u2));
    }
    return s;
}

// Matrices built once per (head_dim, seed) and never freed, as rotq's codebooks: a few slots
// and a byte budget, so a process that cycles through many seeds (or huge head_dims) does not
// grow without bound; beyond them each call builds a private copy (d^2 Gaussians, about as
// much work as sketching d vectors). Published slots are read without the lock.
#define QJL_CACHE_SLOTS 16
#define QJL_CACHE_BYTES ((size_t) 64 << 20)

typedef struct qjl_mat {
    int64_t  d;
    uint64_t seed;
    float *  s;
} qjl_mat;

static qjl_mat    g_mats[QJL_CACHE_SLOTS];
static atomic_int g_n_mats;     // slots [0, g_n_mats) are filled; release/acquire publishes them
static size_t     g_mat_bytes;  // under the lock

static const float * find_cached(int64_t d, uint64_t seed, int n) {
    for (int i = 0; i < n; i++) {
        if (g_mats[i].d == d && g_mats[i].seed == seed) {
            return g_mats[i].s;
        }
    }
    return NULL;
}

// S for (d, seed); *owned says whether the caller must free it. NULL if out of memory.
static const float * get_matrix(int64_t d, uint64_t seed, int * owned) {
    *owned          = 0;
    const float * s = find_cached(d, seed, atomic_load_explicit(&g_n_mats, memory_order_acquire));
    if (s != NULL) {
        return s;
    }
    const size_t bytes = (size_t) d * (size_t) d * sizeof(float);
    mat_lock();
    const int n = atomic_load_explicit(&g_n_mats, memory_order_relaxed);
    s           = find_cached(d, seed, n);
    if (s == NULL && n < QJL_CACHE_SLOTS && g_mat_bytes + bytes <= QJL_CACHE_BYTES) {
        float * m = build_matrix(d, seed);
        if (m != NULL) {
            g_mats[n] = (qjl_mat) { d, seed, m };
            g_mat_bytes += bytes;
            atomic_store_explicit(&g_n_mats, n + 1, memory_order_release);
            s = m;
        }
    }
    mat_unlock();
    if (s == NULL) {  // cache full (or out of memory for it): a private copy
        s      = build_matrix(d, seed);
        *owned = s != NULL;
    }
    return s;
}

// ---- layout --------------------------------------------------------------------------------

static int64_t n_vectors(const kvg_job * job) {
    return job->n_tokens * job->n_heads;
}

// The rotq sub-encoding: the same shape and seed at one bit less.
static kvg_job rotq_job(const kvg_job * job) {
    kvg_job r = *job;
    r.bits    = job->bits - 1;
    return r;
}

static size_t rnorm_bytes(const kvg_job * job) {
    return (size_t) n_vectors(job) * 2;
}

int kvg_qjl_size(const kvg_job * job, size_t * out_bytes) {
    const kvg_job sub  = rotq_job(job);
    size_t        rotq = 0;
    const int     st   = kvg_rotq_size(&sub, &rotq);  // names this codec if head_dim is not a power of two
    if (st != KVG_OK) {
        return st;
    }
    const uint64_t bytes = (uint64_t) rnorm_bytes(job) + (uint64_t) rotq + kvg_code_bytes(job->n_values, 1);
    if (bytes > (uint64_t) SIZE_MAX) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: encoded size %llu does not fit in size_t", kvg_codec_name(job->type),
                        (unsigned long long) bytes);
    }
    *out_bytes = (size_t) bytes;
    return KVG_OK;
}

static size_t rotq_bytes(const kvg_job * job) {
    const kvg_job sub = rotq_job(job);
    size_t        n   = 0;
    kvg_rotq_size(&sub, &n);  // the job's shape was validated by kvg_qjl_size
    return n;
}

// ---- encode / check / decode ---------------------------------------------------------------

// a . b in 8 interleaved lanes, a fixed order the compiler can vectorize without reassociating
// (d is a power of two; below 8, one lane).
static float dot(const float * a, const float * b, int64_t d) {
    if (d < 8) {
        float s = 0.0f;
        for (int64_t j = 0; j < d; j++) {
            s += a[j] * b[j];
        }
        return s;
    }
    float l[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t j = 0; j < d; j += 8) {
        for (int k = 0; k < 8; k++) {
            l[k] += a[j + k] * b[j + k];
        }
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

int kvg_qjl_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    const int64_t d   = job->head_dim;
    const int64_t nv  = n_vectors(job);
    const kvg_job sub = rotq_job(job);
    uint8_t *     rn  = dst;
    uint8_t *     rq  = dst + rnorm_bytes(job);
    uint8_t *     sg  = rq + rotq_bytes(job);

    int           owned = 0;
    const float * S     = get_matrix(d, job->seed, &owned);
    if (S == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate the sketch matrix", kvg_codec_name(job->type));
    }
    float * xh  = (float *) malloc((size_t) job->n_values * sizeof(float));
    float * buf = (float *) malloc((size_t) d * (sizeof(float) + 1));
    int     st  = KVG_OK;
    if (xh == NULL || buf == NULL) {
        st = kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate scratch", kvg_codec_name(job->type));
        goto done;
    }
    // x_hat as the decoder will see it, so r is the residual of what is actually stored
    st = kvg_rotq_encode_ref(&sub, src, rq);
    if (st == KVG_OK) {
        st = kvg_rotq_decode_ref(&sub, rq, xh);
    }
    if (st != KVG_OK) {
        goto done;
    }
    memset(sg, 0, (size_t) kvg_code_bytes(job->n_values, 1));
    float *   r = buf;
    uint8_t * z = (uint8_t *) (buf + d);
    for (int64_t v = 0; v < nv; v++) {
        for (int64_t i = 0; i < d; i++) {
            r[i] = src[v * d + i] - xh[v * d + i];
        }
        const float    norm = sqrtf(kvg_rotq_sumsq_ref(r, d));
        const uint16_t n16  = kvg_f32_to_f16(norm);
        if (!kvg_f16_is_finite(n16)) {
            st =
                kvg_fail(KVG_ERR_RANGE, "%s: residual norm %g does not fit in f16 (<= 65504), at token %lld, head %lld",
                         kvg_codec_name(job->type), (double) norm, (long long) (v / job->n_heads),
                         (long long) (v % job->n_heads));
            goto done;
        }
        kvg_put_u16(rn + 2 * v, n16);
        if (n16 == 0) {
            continue;  // no residual to sketch: its sign bits stay zero and decode skips them
        }
        for (int64_t i = 0; i < d; i++) {  // z_i = sign((S r)_i), sign(0) = +1
            z[i] = (uint8_t) (dot(S + i * d, r, d) >= 0.0f);
        }
        kvg_pack_bits(sg, (uint64_t) (v * d), z, (size_t) d, 1);
    }
done:
    free(buf);
    free(xh);
    if (owned) {
        free((void *) S);
    }
    return st;
}

int kvg_qjl_check(const kvg_job * job, const uint8_t * src) {
    const int64_t nv = n_vectors(job);
    for (int64_t v = 0; v < nv; v++) {
        const uint16_t n16 = kvg_get_u16(src + 2 * v);
        if (!kvg_f16_is_finite(n16) || (n16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT, "%s: vector %lld has residual norm 0x%04x (negative or not finite)",
                            kvg_codec_name(job->type), (long long) v, n16);
        }
    }
    const kvg_job sub = rotq_job(job);
    return kvg_rotq_check(&sub, src + rnorm_bytes(job));
}

int kvg_qjl_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    const int64_t   d   = job->head_dim;
    const int64_t   nv  = n_vectors(job);
    const kvg_job   sub = rotq_job(job);
    const uint8_t * rn  = src;
    const uint8_t * rq  = src + rnorm_bytes(job);
    const uint8_t * sg  = rq + rotq_bytes(job);

    int st = kvg_qjl_check(job, src);  // validate before writing anything
    if (st != KVG_OK) {
        return st;
    }
    int           owned = 0;
    const float * S     = get_matrix(d, job->seed, &owned);
    if (S == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate the sketch matrix", kvg_codec_name(job->type));
    }
    float * buf = (float *) malloc((size_t) d * (sizeof(float) + 1));
    if (buf == NULL) {
        st = kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate scratch", kvg_codec_name(job->type));
        goto done;
    }
    st = kvg_rotq_decode_ref(&sub, rq, dst);  // fails (memory) before it writes dst
    if (st != KVG_OK) {
        goto done;
    }
    float *   t = buf;
    uint8_t * z = (uint8_t *) (buf + d);
    // sqrt(pi/2) / m: QJL's dequantization constant (QJL Lemma 3.2; TurboQuant Algorithm 2)
    const float k = (float) (sqrt(QJL_PI / 2.0) / (double) d);
    for (int64_t v = 0; v < nv; v++) {
        const uint16_t n16 = kvg_get_u16(rn + 2 * v);
        if (n16 == 0) {
            continue;
        }
        kvg_unpack_bits(sg, (uint64_t) (v * d), z, (size_t) d, 1);
        for (int64_t j = 0; j < d; j++) {
            t[j] = 0.0f;
        }
        for (int64_t i = 0; i < d; i++) {  // t = S^T z, row by row of S
            const float * row = S + i * d;
            if (z[i]) {
                for (int64_t j = 0; j < d; j++) {
                    t[j] += row[j];
                }
            } else {
                for (int64_t j = 0; j < d; j++) {
                    t[j] -= row[j];
                }
            }
        }
        const float c   = k * kvg_f16_to_f32(n16);
        float *     out = dst + v * d;
        for (int64_t j = 0; j < d; j++) {
            out[j] += c * t[j];
        }
    }
done:
    free(buf);
    if (owned) {
        free((void *) S);
    }
    return st;
}
