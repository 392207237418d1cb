// rotq.c: random-sign Walsh-Hadamard rotation, then a Lloyd-Max scalar quantizer per
// coordinate and an f16 norm per head vector (TurboQuant-MSE, Zandieh et al. 2025,
// arXiv:2504.19874). After a random rotation, each coordinate of a unit vector in R^d
// follows f(u) ~ (1 - u^2)^((d-3)/2) on (-1, 1), nearly independently of the others, so one
// scalar codebook per (d, bits), optimal for that density, is near-optimal for every vector.
// Bits per value: B + 16/d.
#include "kvg_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(_WIN32)
#    include <windows.h>
static SRWLOCK g_book_lock = SRWLOCK_INIT;
static void    book_lock(void) {
    AcquireSRWLockExclusive(&g_book_lock);
}
static void book_unlock(void) {
    ReleaseSRWLockExclusive(&g_book_lock);
}
#else
#    include <pthread.h>
static pthread_mutex_t g_book_lock = PTHREAD_MUTEX_INITIALIZER;
static void            book_lock(void) {
    pthread_mutex_lock(&g_book_lock);
}
static void book_unlock(void) {
    pthread_mutex_unlock(&g_book_lock);
}
#endif

#define KVG_PI 3.14159265358979323846

static int log2_exact(int64_t d) {  // log2(d) if d is a power of two in [2, 4096], else -1
    if (d < 2 || d > KVG_ROTQ_MAX_HEAD_DIM || (d & (d - 1)) != 0) {
        return -1;
    }
    int l = 0;
    while (((int64_t) 1 << l) < d) {
        l++;
    }
    return l;
}

// ---- Lloyd-Max codebooks -------------------------------------------------------------------
//
// The codebook is for y = sqrt(d) * u, which has unit variance. With u = sin(theta) the
// density becomes cos(theta)^(d-2) d(theta), smooth for every d >= 2 (for d = 2 the density
// of u itself is singular at +-1). We integrate on a fine theta grid (midpoint rule, mass
// spread uniformly in y over each cell so partial cells are exact to second order) and run
// Lloyd's iterations in double precision until the centroids move less than 1e-12.

#define LM_GRID  (1 << 16)
#define LM_ITERS 200000
#define LM_TOL   1e-12

typedef struct lm_grid {
    int      n;
    double * ye;  // y at the n+1 cell edges, ascending
    double * m0;  // cumulative mass up to edge k (normalized to 1 at the end)
    double * m1;  // cumulative first moment up to edge k
} lm_grid;

// Mass and first moment of the part of the distribution below t.
static void lm_below(const lm_grid * g, double t, double * M0, double * M1) {
    const int n = g->n;
    if (t <= g->ye[0]) {
        *M0 = 0.0;
        *M1 = 0.0;
        return;
    }
    if (t >= g->ye[n]) {
        *M0 = g->m0[n];
        *M1 = g->m1[n];
        return;
    }
    int lo = 0;
    int hi = n;  // invariant: ye[lo] <= t < ye[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (g->ye[mid] <= t) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    const double w    = g->m0[lo + 1] - g->m0[lo];
    const double frac = (t - g->ye[lo]) / (g->ye[lo + 1] - g->ye[lo]);
    *M0               = g->m0[lo] + w * frac;
    *M1               = g->m1[lo] + w * frac * 0.5 * (g->ye[lo] + t);
}

// Value t with mass p below it (bisection), for the initial centroids.
static double lm_quantile(const lm_grid * g, double p) {
    double lo = g->ye[0];
    double hi = g->ye[g->n];
    for (int it = 0; it < 200; it++) {
        const double mid = 0.5 * (lo + hi);
        double       M0, M1;
        lm_below(g, mid, &M0, &M1);
        if (M0 < p) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return 0.5 * (lo + hi);
}

static void lm_solve(const lm_grid * g, int levels, double * c) {
    double nc[1 << KVG_ROTQ_MAX_BITS];
    for (int i = 0; i < levels; i++) {
        c[i] = lm_quantile(g, (i + 0.5) / levels);
    }
    for (int it = 0; it < LM_ITERS; it++) {
        double lo0 = 0.0, lo1 = 0.0;  // mass and moment below the current cell
        for (int i = 0; i < levels; i++) {
            double hi0, hi1;
            if (i == levels - 1) {
                hi0 = g->m0[g->n];
                hi1 = g->m1[g->n];
            } else {
                lm_below(g, 0.5 * (c[i] + c[i + 1]), &hi0, &hi1);
            }
            nc[i] = hi0 > lo0 ? (hi1 - lo1) / (hi0 - lo0) : c[i];
            lo0   = hi0;
            lo1   = hi1;
        }
        // the density is even: keep the codebook exactly symmetric
        for (int i = 0; i < levels / 2; i++) {
            const double v     = 0.5 * (nc[levels - 1 - i] - nc[i]);
            nc[i]              = -v;
            nc[levels - 1 - i] = v;
        }
        double delta = 0.0;
        for (int i = 0; i < levels; i++) {
            const double dd = fabs(nc[i] - c[i]);
            delta           = dd > delta ? dd : delta;
            c[i]            = nc[i];
        }
        if (delta < LM_TOL) {
            break;
        }
    }
}

static int build_book(int64_t d, kvg_rotq_book * book) {
    lm_grid g;
    g.n  = LM_GRID;
    g.ye = (double *) malloc(sizeof(double) * (size_t) (g.n + 1) * 3);
    if (g.ye == NULL) {
        return KVG_ERR_NO_MEMORY;
    }
    g.m0 = g.ye + (g.n + 1);
    g.m1 = g.m0 + (g.n + 1);

    // cos^(d-2) ~ exp(-(d-2) theta^2 / 2): beyond 20 standard deviations the mass is < 1e-80
    double th_max = KVG_PI / 2;
    if (d > 2) {
        const double w = 20.0 / sqrt((double) (d - 2));
        th_max         = w < th_max ? w : th_max;
    }
    const double sd  = sqrt((double) d);
    const double dth = 2.0 * th_max / g.n;
    for (int k = 0; k <= g.n; k++) {
        g.ye[k] = sd * sin(-th_max + k * dth);
    }
    g.m0[0] = 0.0;
    g.m1[0] = 0.0;
    for (int k = 0; k < g.n; k++) {
        const double th = -th_max + (k + 0.5) * dth;
        const double w  = pow(cos(th), (double) (d - 2)) * dth;
        g.m0[k + 1]     = g.m0[k] + w;
        g.m1[k + 1]     = g.m1[k] + w * 0.5 * (g.ye[k] + g.ye[k + 1]);
    }
    const double total = g.m0[g.n];
    for (int k = 0; k <= g.n; k++) {
        g.m0[k] /= total;
        g.m1[k] /= total;
    }

    memset(book, 0, sizeof(*book));
    for (int bits = 1; bits <= KVG_ROTQ_MAX_BITS; bits++) {
        const int levels = 1 << bits;
        double    c[1 << KVG_ROTQ_MAX_BITS];
        lm_solve(&g, levels, c);
        for (int i = 0; i < levels; i++) {
            book->centroid[bits][i] = (float) c[i];
        }
        for (int i = 0; i + 1 < levels; i++) {
            book->boundary[bits][i] = (float) (0.5 * (c[i] + c[i + 1]));
        }
    }
    free(g.ye);
    return KVG_OK;
}

// One book per head_dim = 2^1 .. 2^12, built on first use under a lock and published with
// release/acquire so later readers need no lock.
static kvg_rotq_book g_books[13];
static atomic_int    g_book_ready[13];

const kvg_rotq_book * kvg_rotq_get_book(int64_t head_dim) {
    const int l = log2_exact(head_dim);
    if (l < 0) {
        return NULL;
    }
    if (atomic_load_explicit(&g_book_ready[l], memory_order_acquire)) {
        return &g_books[l];
    }
    book_lock();
    int ok = atomic_load_explicit(&g_book_ready[l], memory_order_relaxed);
    if (!ok && build_book(head_dim, &g_books[l]) == KVG_OK) {
        atomic_store_explicit(&g_book_ready[l], 1, memory_order_release);
        ok = 1;
    }
    book_unlock();
    return ok ? &g_books[l] : NULL;
}

int kvg_rotq_codebook(int bits, int64_t head_dim, float * out, size_t out_count) {
    kvg_clear_error();
    if (bits < 1 || bits > KVG_ROTQ_MAX_BITS) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "rotq codebook: bits must be 1..4, got %d", bits);
    }
    if (log2_exact(head_dim) < 0) {
        return kvg_fail(KVG_ERR_SHAPE, "rotq codebook: head_dim must be a power of two in [2, 4096], got %lld",
                        (long long) head_dim);
    }
    if (out == NULL || out_count != ((size_t) 1 << bits)) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "rotq codebook: out must hold exactly %d floats", 1 << bits);
    }
    const kvg_rotq_book * book = kvg_rotq_get_book(head_dim);
    if (book == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate the codebook grid");
    }
    memcpy(out, book->centroid[bits], sizeof(float) * out_count);
    return KVG_OK;
}

// ---- signs, norm, transform ----------------------------------------------------------------

void kvg_rotq_signs(uint64_t seed, int64_t d, float * sgn) {
    for (int64_t i = 0; i < d; i++) {
        sgn[i] = (kvg_mix64(seed + (uint64_t) (i + 1) * KVG_GOLDEN) >> 63) ? -1.0f : 1.0f;
    }
}

float kvg_rotq_sumsq_ref(const float * x, int64_t d) {
    float l[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t i = 0; i < d; i++) {
        l[i & 7] = l[i & 7] + x[i] * x[i];
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

void kvg_fwht_ref(float * x, int64_t d) {
    for (int64_t h = 1; h < d; h <<= 1) {
        for (int64_t i = 0; i < d; i += 2 * h) {
            for (int64_t j = i; j < i + h; j++) {
                const float a = x[j];
                const float b = x[j + h];
                x[j]          = a + b;
                x[j + h]      = a - b;
            }
        }
    }
}

void kvg_fwht(float * x, int64_t d) {
    if (d >= 8 && kvg_simd_on()) {
        KVG_SIMD(kvg_fwht)(x, d);
    } else {
        kvg_fwht_ref(x, d);
    }
}

// ---- scalar vector kernels (the oracle) ----------------------------------------------------

// y = W(s * x) / n for the f16-rounded norm n of x (*n16; 0: the vector is stored as zero and y
// is left as it was): unit variance per coordinate, normalized by the stored norm so that
// decoding multiplies by exactly what was divided by. rotq, pq/vq and tcq code this y.
int kvg_rotq_rotate(const char * name, const float * x, int64_t d, const float * sgn, float * y, uint16_t * n16) {
    const float norm = sqrtf(kvg_rotq_sumsq_ref(x, d));
    *n16             = kvg_f32_to_f16(norm);
    if (!kvg_f16_is_finite(*n16)) {
        return kvg_fail(KVG_ERR_RANGE, "%s: vector norm %g does not fit in f16 (<= 65504)", name, (double) norm);
    }
    if (*n16 == 0) {
        return KVG_OK;
    }
    const float inv = 1.0f / kvg_f16_to_f32(*n16);
    for (int64_t i = 0; i < d; i++) {
        y[i] = x[i] * sgn[i];
    }
    kvg_fwht_ref(y, d);
    for (int64_t i = 0; i < d; i++) {
        y[i] *= inv;
    }
    return KVG_OK;
}

static int encode_vec_ref(const float * x, int64_t d, const float * sgn, const kvg_rotq_book * book, int bits,
                          float * tmp, uint8_t * q, uint8_t * codes, uint64_t bit_off, uint16_t * norm16) {
    const int st = kvg_rotq_rotate("rotq", x, d, sgn, tmp, norm16);
    if (st != KVG_OK || *norm16 == 0) {
        return st;  // a zero vector (or below f16 resolution) decodes to zeros
    }
    const float * bnd = book->boundary[bits];
    const int     nb  = (1 << bits) - 1;
    // code = number of boundaries below y; boundary-major loops so compilers vectorize them
    memset(q, 0, (size_t) d);
    for (int k = 0; k < nb; k++) {
        const float b = bnd[k];
        for (int64_t i = 0; i < d; i++) {
            q[i] = (uint8_t) (q[i] + (tmp[i] > b));
        }
    }
    kvg_pack_bits(codes, bit_off, q, (size_t) d, bits);
    return KVG_OK;
}

static void decode_vec_ref(const uint8_t * codes, uint64_t bit_off, int64_t d, int bits, const kvg_rotq_book * book,
                           const float * sgn, float nf, float * out, uint8_t * q) {
    const float * cb = book->centroid[bits];
    kvg_unpack_bits(codes, bit_off, q, (size_t) d, bits);
    for (int64_t i = 0; i < d; i++) {
        out[i] = cb[q[i]];
    }
    kvg_fwht_ref(out, d);
    const float f = nf * (1.0f / (float) d);  // W W = d I; exact: d is a power of two
    for (int64_t i = 0; i < d; i++) {
        out[i] = (out[i] * f) * sgn[i];
    }
}

static const kvg_rotq_ops k_rotq_ops_ref = { encode_vec_ref, decode_vec_ref };

// ---- drivers -------------------------------------------------------------------------------

int kvg_rotq_size(const kvg_job * job, size_t * out_bytes) {
    if (log2_exact(job->head_dim) < 0) {
        return kvg_fail(KVG_ERR_SHAPE, "%s needs a power-of-two head_dim in [2, 4096], got %lld",
                        kvg_codec_name(job->type), (long long) job->head_dim);
    }
    const uint64_t bytes = (uint64_t) (job->n_tokens * job->n_heads) * 2 + kvg_code_bytes(job->n_values, job->bits);
    if (bytes > (uint64_t) SIZE_MAX) {
        return kvg_fail(KVG_ERR_SHAPE, "rotq: encoded size %llu does not fit in size_t", (unsigned long long) bytes);
    }
    *out_bytes = (size_t) bytes;
    return KVG_OK;
}

int kvg_rotq_encode_with(const kvg_job * job, const float * src, uint8_t * dst, const kvg_rotq_ops * ops) {
    const int64_t d    = job->head_dim;
    const int64_t nv   = job->n_tokens * job->n_heads;
    const int     bits = job->bits;

    const kvg_rotq_book * book = kvg_rotq_get_book(d);
    if (book == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate the codebook grid");
    }
    uint8_t * norms = dst;
    uint8_t * codes = dst + (size_t) nv * 2;
    memset(codes, 0, (size_t) kvg_code_bytes(job->n_values, bits));

    float * buf = (float *) malloc((size_t) d * (2 * sizeof(float) + 1));
    if (buf == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate scratch");
    }
    float *   sgn = buf;
    float *   tmp = buf + d;
    uint8_t * q   = (uint8_t *) (buf + 2 * d);
    kvg_rotq_signs(job->seed, d, sgn);

    int st = KVG_OK;
    for (int64_t v = 0; v < nv; v++) {
        uint16_t n16 = 0;
        st =
            ops->encode_vec(src + v * d, d, sgn, book, bits, tmp, q, codes, (uint64_t) (v * d) * (uint64_t) bits, &n16);
        if (st != KVG_OK) {
            char msg[192];
            snprintf(msg, sizeof(msg), "%s", kvg_last_error());
            kvg_fail(st, "%s, at token %lld, head %lld", msg, (long long) (v / job->n_heads),
                     (long long) (v % job->n_heads));
            break;
        }
        kvg_put_u16(norms + 2 * v, n16);
    }
    free(buf);
    return st;
}

int kvg_rotq_check(const kvg_job * job, const uint8_t * src) {
    const int64_t nv = job->n_tokens * job->n_heads;
    for (int64_t v = 0; v < nv; v++) {
        const uint16_t n16 = kvg_get_u16(src + 2 * v);
        if (!kvg_f16_is_finite(n16) || (n16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT, "rotq: vector %lld has norm 0x%04x (negative or not finite)",
                            (long long) v, n16);
        }
    }
    // Readers of a checked block (the attend kernels) then find the codebook built, lock-free.
    if (kvg_rotq_get_book(job->head_dim) == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate the codebook grid");
    }
    return KVG_OK;
}

int kvg_rotq_decode_with(const kvg_job * job, const uint8_t * src, float * dst, const kvg_rotq_ops * ops) {
    const int64_t d    = job->head_dim;
    const int64_t nv   = job->n_tokens * job->n_heads;
    const int     bits = job->bits;

    const uint8_t * norms = src;
    const uint8_t * codes = src + (size_t) nv * 2;
    const int       st    = kvg_rotq_check(job, src);  // validate before writing anything
    if (st != KVG_OK) {
        return st;
    }
    const kvg_rotq_book * book = kvg_rotq_get_book(d);
    if (book == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate the codebook grid");
    }
    float * buf = (float *) malloc((size_t) d * (sizeof(float) + 1));
    if (buf == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq: cannot allocate scratch");
    }
    float *   sgn = buf;
    uint8_t * q   = (uint8_t *) (buf + d);
    kvg_rotq_signs(job->seed, d, sgn);

    for (int64_t v = 0; v < nv; v++) {
        const uint16_t n16 = kvg_get_u16(norms + 2 * v);
        float *        out = dst + v * d;
        if (n16 == 0) {
            memset(out, 0, (size_t) d * sizeof(float));
            continue;
        }
        ops->decode_vec(codes, (uint64_t) (v * d) * (uint64_t) bits, d, bits, book, sgn, kvg_f16_to_f32(n16), out, q);
    }
    free(buf);
    return KVG_OK;
}

int kvg_rotq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    return kvg_rotq_encode_with(job, src, dst, &k_rotq_ops_ref);
}

int kvg_rotq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    return kvg_rotq_decode_with(job, src, dst, &k_rotq_ops_ref);
}

// ---- transcoding (retier between rotq widths) -----------------------------------------------

// A decoded vector is x' = s * W(c) * n / d, and coding it again rotates it back: W(s * x') = n c
// (W W = d I), so its codes are those of y = c * n / n' with n' = f16(|x'|) = f16(n |c| / sqrt(d)).
// The codes come from the codes: no rotation either way, and no rounding from the two transforms.
// The same width copies the codes (a block cut by truncate): exact, where coding again would not be.
int kvg_rotq_transcode(int64_t nv_src, int64_t nv, int64_t d, int bits_in, const uint8_t * src, int bits_out,
                       uint8_t * dst) {
    if (nv < 0 || nv > nv_src || bits_in < 1 || bits_in > KVG_ROTQ_MAX_BITS || bits_out < 1 ||
        bits_out > KVG_ROTQ_MAX_BITS || log2_exact(d) < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "rotq transcode: %lld of %lld vectors, head_dim %lld, %d -> %d bits",
                        (long long) nv, (long long) nv_src, (long long) d, bits_in, bits_out);
    }
    const uint8_t * codes_in  = src + (size_t) nv_src * 2;
    uint8_t *       codes_out = dst + (size_t) nv * 2;
    if (bits_in == bits_out) {  // the same width: the vectors' norms and codes as they are
        memcpy(dst, src, (size_t) nv * 2);
        const uint64_t bits = (uint64_t) (nv * d) * (uint64_t) bits_in;
        memcpy(codes_out, codes_in, (size_t) (bits / 8));
        if (bits % 8) {  // the last byte's codes past the prefix are cleared
            codes_out[bits / 8] = (uint8_t) (codes_in[bits / 8] & ((1u << (bits % 8)) - 1u));
        }
        return KVG_OK;
    }
    const kvg_rotq_book * book = kvg_rotq_get_book(d);
    uint8_t *             q    = (uint8_t *) malloc((size_t) d);
    if (book == NULL || q == NULL) {
        free(q);
        return kvg_fail(KVG_ERR_NO_MEMORY, "rotq transcode: codebook or scratch");
    }
    memset(codes_out, 0, (size_t) kvg_code_bytes(nv * d, bits_out));
    const float * cb     = book->centroid[bits_in];
    const float * bnd    = book->boundary[bits_out];
    const int     nb     = (1 << bits_out) - 1;
    const float   inv_sd = 1.0f / sqrtf((float) d);
    int           st     = KVG_OK;
    const int     levels = 1 << bits_in;
    float         csq[1 << KVG_ROTQ_MAX_BITS];
    for (int k = 0; k < levels; k++) {
        csq[k] = cb[k] * cb[k];
    }
    // 4-bit codes (warm rotq4, the presets' aging source) a byte at a time: |c|^2 of both nibbles
    // from one table, and 2- or 1-bit codes written a byte at a time, without unpacking
    const int nibbles = bits_in == 4 && d >= 8;
    float     pair[256];
    if (nibbles) {
        for (int b = 0; b < 256; b++) {
            pair[b] = csq[b & 15] + csq[b >> 4];
        }
    }
    for (int64_t v = 0; v < nv && st == KVG_OK; v++) {
        const uint16_t  n16      = kvg_get_u16(src + 2 * v);
        const uint8_t * in       = codes_in + (size_t) ((uint64_t) (v * d) * (uint64_t) bits_in / 8);
        uint16_t        m16      = 0;
        int             unpacked = 0;
        if (n16 != 0) {
            float part[4] = { 0.0f, 0.0f, 0.0f, 0.0f };  // |c|^2 in four chains
            if (nibbles) {
                for (int64_t i = 0; i < d / 2; i += 4) {  // d / 2 bytes, a multiple of 4 (d >= 8)
                    for (int k = 0; k < 4; k++) {
                        part[k] += pair[in[i + k]];
                    }
                }
            } else {
                kvg_unpack_bits(codes_in, (uint64_t) (v * d) * (uint64_t) bits_in, q, (size_t) d, bits_in);
                unpacked = 1;
                for (int64_t i = 0; i < d; i++) {
                    part[i & 3] += csq[q[i]];
                }
            }
            const float ss = (part[0] + part[1]) + (part[2] + part[3]);
            m16            = kvg_f32_to_f16(kvg_f16_to_f32(n16) * sqrtf(ss) * inv_sd);
            if (!kvg_f16_is_finite(m16)) {
                st = kvg_fail(KVG_ERR_RANGE, "rotq transcode: vector %lld's norm does not fit in f16", (long long) v);
                break;
            }
        }
        if (m16 != 0) {
            // each input level's new code: the number of new boundaries below its scaled value
            const float f = kvg_f16_to_f32(n16) / kvg_f16_to_f32(m16);
            uint8_t     map[1 << KVG_ROTQ_MAX_BITS];
            for (int k = 0; k < levels; k++) {
                const float y = cb[k] * f;
                uint8_t     c = 0;
                for (int j = 0; j < nb; j++) {
                    c = (uint8_t) (c + (y > bnd[j]));
                }
                map[k] = c;
            }
            uint8_t * out = codes_out + (size_t) ((uint64_t) (v * d) * (uint64_t) bits_out / 8);
            if (nibbles && bits_out == 2) {  // 2 input bytes -> 1 output byte (d * 2 bits: whole bytes)
                for (int64_t i = 0; i < d / 4; i++) {
                    const uint8_t a = in[2 * i], b = in[2 * i + 1];
                    out[i] = (uint8_t) (map[a & 15] | map[a >> 4] << 2 | map[b & 15] << 4 | map[b >> 4] << 6);
                }
            } else if (nibbles && bits_out == 1) {  // 4 input bytes -> 1 output byte
                for (int64_t i = 0; i < d / 8; i++) {
                    uint8_t o = 0;
                    for (int k = 0; k < 4; k++) {
                        const uint8_t a = in[4 * i + k];
                        o               = (uint8_t) (o | map[a & 15] << (2 * k) | map[a >> 4] << (2 * k + 1));
                    }
                    out[i] = o;
                }
            } else {
                if (!unpacked) {
                    kvg_unpack_bits(codes_in, (uint64_t) (v * d) * (uint64_t) bits_in, q, (size_t) d, bits_in);
                }
                for (int64_t i = 0; i < d; i++) {
                    q[i] = map[q[i]];
                }
                kvg_pack_bits(codes_out, (uint64_t) (v * d) * (uint64_t) bits_out, q, (size_t) d, bits_out);
            }
        }
        kvg_put_u16(dst + 2 * v, m16);
    }
    free(q);
    return st;
}

// ---- attention (scalar oracle) -------------------------------------------------------------
//
// x' = s * W(c) * n / d and W is symmetric, so q . x' = (n / d) * (W(s * q)) . c: attend.c
// rotates each query once per call and every row is scored from its codes. For values the sum
// of p * x' over rows is s * W(sum of p * (n / d) * c): rows add up in the rotated domain and
// attend.c transforms the sum once per query at the end of the call.

int kvg_rotq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out) {
    const int64_t   D     = job->head_dim;
    const int64_t   H     = job->n_heads;
    const int       bits  = job->bits;
    const float *   cb    = kvg_rotq_get_book(D)->centroid[bits];  // built when the block was encoded or checked
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    uint8_t *       q     = (uint8_t *) a->tmp;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const float f = kvg_f16_to_f32(kvg_get_u16(src + 2 * (t * H + hk))) * (1.0f / (float) D);
            kvg_unpack_bits(codes, (uint64_t) (t * H + hk) * (uint64_t) D * (uint64_t) bits, q, (size_t) D, bits);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * qr = a->qr + j * D;
                float         s  = 0.0f;
                for (int64_t i = 0; i < D; i++) {
                    s += qr[i] * cb[q[i]];
                }
                out[j * n + (t - t0)] = f * s;
            }
        }
    }
    return KVG_OK;
}

int kvg_rotq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    const int64_t   D     = job->head_dim;
    const int64_t   H     = job->n_heads;
    const int       bits  = job->bits;
    const float *   cb    = kvg_rotq_get_book(D)->centroid[bits];
    const uint8_t * codes = src + (size_t) (job->n_tokens * H) * 2;
    uint8_t *       q     = (uint8_t *) a->tmp;
    for (int64_t t = t0; t < t0 + n; t++) {
        for (int64_t hk = 0; hk < H; hk++) {
            const float f = kvg_f16_to_f32(kvg_get_u16(src + 2 * (t * H + hk))) * (1.0f / (float) D);
            if (f == 0.0f) {
                continue;  // a zero vector adds nothing
            }
            kvg_unpack_bits(codes, (uint64_t) (t * H + hk) * (uint64_t) D * (uint64_t) bits, q, (size_t) D, bits);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + (t - t0)] * f;
                float *     acc = a->accr + j * D;
                for (int64_t i = 0; i < D; i++) {
                    acc[i] += w * cb[q[i]];
                }
            }
        }
    }
    return KVG_OK;
}
