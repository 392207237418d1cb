// wfq.c: water-filled quantization (issue 28, transform coding on the coordinates' own axes).
//
// A random rotation (rotq) makes every coordinate look alike, right when nothing is known about
// the rows. K and V rows of one (layer, KV head) are far from that: a few channels (RoPE pairs of
// low frequency, value channels) carry most of the energy. wfq gives each coordinate bits by its
// energy, as reverse water-filling does (in whole bits, each next bit where it removes the most
// squared error on Gaussian Lloyd-Max distortions, at least 1 bit each), so a head vector keeps
// exactly B * head_dim - 16 bits of codes beside its f16 gain: B bits per value held.
// Coordinates that share a bit width are mixed by a random orthogonal matrix (one per set size,
// the same everywhere) so that one row's heavy coordinate spreads over its set instead of
// clipping at the few levels it has: measured through SmolLM2, leaving the mix out cost 0.02 of
// KL at 3 bits (benchmarks/transform_coding.py, pairk against pairk0).
//
// The plan is the list's book (params.book, the store's per layer and kind): per KV head h, at
// book + h * 3 * d, the source coordinate of each position (perm), its scale (sigma > 0) and its
// bits (0..8). Positions of one bit width that follow each other form one set.
// Encode of head vector x: gain n = |x| / sqrt(sum sigma^2) in f16, u_i = x[perm_i] / (n sigma_i),
// z = M_g u per set of g positions, codes = the nearest Gaussian Lloyd-Max level of the set's width.
// Decode: u' = M_g^T z', x'[perm_i] = n sigma_i u'_i.

#include "kvg_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(_WIN32)
#    include <windows.h>
static SRWLOCK g_wfq_lock = SRWLOCK_INIT;
static void    wfq_lock(void) {
    AcquireSRWLockExclusive(&g_wfq_lock);
}
static void wfq_unlock(void) {
    ReleaseSRWLockExclusive(&g_wfq_lock);
}
#else
#    include <pthread.h>
static pthread_mutex_t g_wfq_lock = PTHREAD_MUTEX_INITIALIZER;
static void            wfq_lock(void) {
    pthread_mutex_lock(&g_wfq_lock);
}
static void wfq_unlock(void) {
    pthread_mutex_unlock(&g_wfq_lock);
}
#endif

#define WFQ_GAIN_BYTES 2
#define WFQ_MIX_SEED   0x776671ULL  // "wfq": the mixes are part of the format, not of params.seed

int kvg_wfq_code_bits(const kvg_job * job) {  // code bits per head vector
    return (int) (job->bits * job->head_dim - 16);
}

static size_t vec_bytes(const kvg_job * job) {
    return WFQ_GAIN_BYTES + (size_t) kvg_code_bytes(kvg_wfq_code_bits(job), 1);
}

int kvg_wfq_size(const kvg_job * job, size_t * out_bytes) {
    const int64_t d = job->head_dim;
    // at least 1 bit per coordinate beside the gain, at most 8
    if (d < 16 || d > KVG_WFQ_MAX_HEAD_DIM || job->bits * d - 16 < d) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: head_dim must be in [16, %d], got %lld", kvg_codec_name(job->type),
                        KVG_WFQ_MAX_HEAD_DIM, (long long) d);
    }
    *out_bytes = (size_t) (job->n_tokens * job->n_heads) * vec_bytes(job);
    return KVG_OK;
}

size_t kvg_wfq_book_floats(int64_t n_heads, int64_t head_dim) {
    return (size_t) n_heads * 3 * (size_t) head_dim;
}

// ---- Gaussian Lloyd-Max levels and their distortions -------------------------------------------

typedef struct wfq_levels {
    float  level[KVG_WFQ_MAX_BITS + 1][1 << KVG_WFQ_MAX_BITS];     // ascending
    float  boundary[KVG_WFQ_MAX_BITS + 1][1 << KVG_WFQ_MAX_BITS];  // midpoints, 2^b - 1 of them
    double mse[KVG_WFQ_MAX_BITS + 2];                              // of N(0, 1); mse[0] = 1, mse[9] = mse[8]
} wfq_levels;

static double phi(double x) {
    return exp(-0.5 * x * x) * 0.39894228040143267794;
}
static double cdf(double x) {
    return 0.5 * erfc(-x * 0.70710678118654752440);
}

static void solve_levels(int n, double * c, double * out_mse) {
    for (int i = 0; i < n; i++) {  // start at the quantiles (bisection on the CDF)
        const double p  = (i + 0.5) / n;
        double       lo = -12.0, hi = 12.0;
        for (int it = 0; it < 80; it++) {
            const double mid            = 0.5 * (lo + hi);
            *(cdf(mid) < p ? &lo : &hi) = mid;
        }
        c[i] = 0.5 * (lo + hi);
    }
    double mass[1 << KVG_WFQ_MAX_BITS];
    for (int it = 0; it < 20000; it++) {  // Lloyd: each level to the mean of its cell
        double delta = 0.0, a = -INFINITY;
        for (int i = 0; i < n; i++) {
            const double b = i + 1 < n ? 0.5 * (c[i] + c[i + 1]) : INFINITY;
            mass[i]        = cdf(b) - cdf(a);
            const double v = mass[i] > 0.0 ? (phi(a) - phi(b)) / mass[i] : c[i];
            delta          = fmax(delta, fabs(v - c[i]));
            c[i]           = v;
            a              = b;
        }
        if (delta < 1e-10) {
            break;
        }
    }
    double e2 = 0.0;  // E[Q^2] of the optimal quantizer: its MSE is E[X^2] - E[Q^2]
    for (int i = 0; i < n; i++) {
        e2 += mass[i] * c[i] * c[i];
    }
    *out_mse = 1.0 - e2;
}

static wfq_levels g_levels;
static atomic_int g_levels_ready;

static const wfq_levels * get_levels(void) {
    if (atomic_load_explicit(&g_levels_ready, memory_order_acquire)) {
        return &g_levels;
    }
    wfq_lock();
    if (!atomic_load_explicit(&g_levels_ready, memory_order_relaxed)) {
        g_levels.mse[0] = 1.0;
        for (int b = 1; b <= KVG_WFQ_MAX_BITS; b++) {
            double c[1 << KVG_WFQ_MAX_BITS];
            solve_levels(1 << b, c, &g_levels.mse[b]);
            for (int i = 0; i < (1 << b); i++) {
                g_levels.level[b][i] = (float) c[i];
                if (i + 1 < (1 << b)) {
                    g_levels.boundary[b][i] = (float) (0.5 * (c[i] + c[i + 1]));
                }
            }
        }
        g_levels.mse[KVG_WFQ_MAX_BITS + 1] = g_levels.mse[KVG_WFQ_MAX_BITS];
        atomic_store_explicit(&g_levels_ready, 1, memory_order_release);
    }
    wfq_unlock();
    return &g_levels;
}

// ---- the mixes: one random orthogonal g x g matrix per set size g ------------------------------

static float *    g_mix[KVG_WFQ_MAX_HEAD_DIM + 1];
static atomic_int g_mix_ready[KVG_WFQ_MAX_HEAD_DIM + 1];

static double gauss(uint64_t key) {  // a standard normal draw (Box-Muller) from a counter
    const double u1 = ((double) (kvg_mix64(key + KVG_GOLDEN) >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (double) (kvg_mix64((key ^ 0xD1B54A32D192ED03ULL) + KVG_GOLDEN) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586477 * u2);
}

// Rows of a Gaussian matrix, orthonormalized (modified Gram-Schmidt, twice for accuracy).
static float * build_mix(int g) {
    double * m   = (double *) malloc(sizeof(double) * (size_t) g * (size_t) g);
    float *  out = (float *) malloc(sizeof(float) * (size_t) g * (size_t) g);
    if (!m || !out) {
        free(m);
        free(out);
        return NULL;
    }
    for (int r = 0; r < g; r++) {
        for (uint64_t attempt = 0;; attempt++) {
            double * v = m + (size_t) r * g;
            for (int c = 0; c < g; c++) {
                v[c] = gauss(WFQ_MIX_SEED ^ ((uint64_t) g << 48) ^ ((uint64_t) attempt << 40) ^ ((uint64_t) r << 20) ^
                             (uint64_t) c);
            }
            for (int pass = 0; pass < 2; pass++) {
                for (int k = 0; k < r; k++) {
                    const double * w   = m + (size_t) k * g;
                    double         dot = 0.0;
                    for (int c = 0; c < g; c++) {
                        dot += v[c] * w[c];
                    }
                    for (int c = 0; c < g; c++) {
                        v[c] -= dot * w[c];
                    }
                }
            }
            double nn = 0.0;
            for (int c = 0; c < g; c++) {
                nn += v[c] * v[c];
            }
            if (nn > 1e-6) {  // a draw in the span of the rows before (never in practice): draw again
                const double inv = 1.0 / sqrt(nn);
                for (int c = 0; c < g; c++) {
                    v[c] *= inv;
                }
                break;
            }
        }
    }
    for (size_t i = 0; i < (size_t) g * (size_t) g; i++) {
        out[i] = (float) m[i];
    }
    free(m);
    return out;
}

// Built on first use under the lock and published with release/acquire (as rotq's codebooks).
static const float * get_mix(int g) {
    if (atomic_load_explicit(&g_mix_ready[g], memory_order_acquire)) {
        return g_mix[g];
    }
    wfq_lock();
    if (!atomic_load_explicit(&g_mix_ready[g], memory_order_relaxed)) {
        g_mix[g] = build_mix(g);
        if (g_mix[g]) {
            atomic_store_explicit(&g_mix_ready[g], 1, memory_order_release);
        }
    }
    wfq_unlock();
    return g_mix[g];
}

// ---- the plan --------------------------------------------------------------------------------

typedef struct wfq_head {
    const float * perm;
    const float * sigma;
    const float * bits;
    float         ref;  // sqrt(sum sigma^2)
} wfq_head;

static wfq_head head_plan(const kvg_job * job, int64_t h) {
    const int64_t d = job->head_dim;
    wfq_head      p = { job->book + h * 3 * d, job->book + h * 3 * d + d, job->book + h * 3 * d + 2 * d, 0.0f };
    double        s = 0.0;
    for (int64_t i = 0; i < d; i++) {
        s += (double) p.sigma[i] * p.sigma[i];
    }
    p.ref = (float) sqrt(s);
    return p;
}

// The job's book: present, the right size, a valid plan per head; and the mixes and levels built
// (so a checked block's readers need no lock).
int kvg_wfq_check_book(const kvg_job * job) {
    const char *  name = kvg_codec_name(job->type);
    const int64_t d    = job->head_dim;
    const size_t  want = kvg_wfq_book_floats(job->n_heads, d);
    if (!job->book || job->book_count != want) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%s: needs its plan of %zu floats (params.book), got %zu", name, want,
                        job->book ? job->book_count : (size_t) 0);
    }
    uint8_t seen[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t h = 0; h < job->n_heads; h++) {
        const wfq_head p = head_plan(job, h);
        memset(seen, 0, (size_t) d);
        int64_t total = 0;
        for (int64_t i = 0; i < d; i++) {
            const float src = p.perm[i], b = p.bits[i];
            if (!(src >= 0.0f && src < (float) d && src == floorf(src)) || seen[(int64_t) src]) {
                return kvg_fail(KVG_ERR_INVALID_ARG, "%s: plan of head %lld: position %lld names no unused coordinate",
                                name, (long long) h, (long long) i);
            }
            seen[(int64_t) src] = 1;
            if (!(p.sigma[i] > 0.0f && p.sigma[i] < INFINITY) ||
                !(b >= 0.0f && b <= KVG_WFQ_MAX_BITS && b == floorf(b))) {
                return kvg_fail(KVG_ERR_INVALID_ARG, "%s: plan of head %lld: position %lld has scale %g and %g bits",
                                name, (long long) h, (long long) i, (double) p.sigma[i], (double) b);
            }
            total += (int64_t) b;
        }
        if (total != kvg_wfq_code_bits(job) || !(p.ref < INFINITY)) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "%s: plan of head %lld holds %lld code bits, not %d", name,
                            (long long) h, (long long) total, kvg_wfq_code_bits(job));
        }
        for (int64_t a = 0, g; a < d; a += g) {
            for (g = 1; a + g < d && p.bits[a + g] == p.bits[a]; g++) {
            }
            if (p.bits[a] > 0.0f && !get_mix((int) g)) {
                return kvg_fail(KVG_ERR_NO_MEMORY, "%s: mix of %lld coordinates", name, (long long) g);
            }
        }
    }
    get_levels();
    return KVG_OK;
}

// ---- encode / decode -----------------------------------------------------------------------

static uint8_t nearest(const float * bnd, int bits, float z) {  // index of the nearest level
    int lo = 0, hi = (1 << bits) - 1;                           // answer in [lo, hi]
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (z > bnd[mid]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return (uint8_t) lo;
}

static int encode_vec(const float * x, const wfq_head * p, int64_t d, const wfq_levels * lv, uint8_t * dst, float * u,
                      float * z, uint8_t * codes) {
    double nn = 0.0;
    for (int64_t i = 0; i < d; i++) {
        nn += (double) x[i] * x[i];
    }
    const float    gain = (float) (sqrt(nn) / p->ref);
    const uint16_t g16  = kvg_f32_to_f16(gain);
    if (!kvg_f16_is_finite(g16)) {
        return kvg_fail(KVG_ERR_RANGE, "wfq: a head vector's gain %g does not fit in f16", (double) gain);
    }
    kvg_put_u16(dst, g16);
    const float g = kvg_f16_to_f32(g16);
    for (int64_t i = 0; i < d; i++) {
        u[i] = g > 0.0f ? x[(int64_t) p->perm[i]] / (g * p->sigma[i]) : 0.0f;
    }
    uint64_t off = 0;
    for (int64_t a = 0, n; a < d; a += n) {
        const int bits = (int) p->bits[a];
        for (n = 1; a + n < d && p->bits[a + n] == p->bits[a]; n++) {
        }
        if (bits == 0) {
            continue;
        }
        const float * m = get_mix((int) n);  // built by kvg_wfq_check_book
        for (int64_t r = 0; r < n; r++) {
            float s = 0.0f;
            for (int64_t c = 0; c < n; c++) {
                s += m[r * n + c] * u[a + c];
            }
            z[r] = s;
        }
        for (int64_t r = 0; r < n; r++) {
            codes[r] = nearest(lv->boundary[bits], bits, z[r]);
        }
        kvg_pack_bits(dst + WFQ_GAIN_BYTES, off, codes, (size_t) n, bits);
        off += (uint64_t) n * (uint64_t) bits;
    }
    return KVG_OK;
}

static void decode_vec(const uint8_t * src, const wfq_head * p, int64_t d, const wfq_levels * lv, float * out,
                       float * z, uint8_t * codes) {
    const float g   = kvg_f16_to_f32(kvg_get_u16(src));
    uint64_t    off = 0;
    for (int64_t a = 0, n; a < d; a += n) {
        const int bits = (int) p->bits[a];
        for (n = 1; a + n < d && p->bits[a + n] == p->bits[a]; n++) {
        }
        if (bits == 0) {
            for (int64_t r = 0; r < n; r++) {
                out[(int64_t) p->perm[a + r]] = 0.0f;
            }
            continue;
        }
        kvg_unpack_bits(src + WFQ_GAIN_BYTES, off, codes, (size_t) n, bits);
        off += (uint64_t) n * (uint64_t) bits;
        for (int64_t r = 0; r < n; r++) {
            z[r] = lv->level[bits][codes[r]];
        }
        const float * m = get_mix((int) n);
        for (int64_t c = 0; c < n; c++) {
            float s = 0.0f;
            for (int64_t r = 0; r < n; r++) {
                s += m[r * n + c] * z[r];
            }
            out[(int64_t) p->perm[a + c]] = g * p->sigma[a + c] * s;
        }
    }
}

int kvg_wfq_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    int rc = kvg_wfq_check_book(job);
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t      d  = job->head_dim;
    const size_t       vb = vec_bytes(job);
    const wfq_levels * lv = get_levels();
    float              u[KVG_WFQ_MAX_HEAD_DIM], z[KVG_WFQ_MAX_HEAD_DIM];
    uint8_t            codes[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t h = 0; h < job->n_heads; h++) {
        const wfq_head p = head_plan(job, h);
        for (int64_t t = 0; t < job->n_tokens; t++) {
            uint8_t * out = dst + (size_t) (t * job->n_heads + h) * vb;
            memset(out, 0, vb);
            rc = encode_vec(src + t * job->n_channels + h * d, &p, d, lv, out, u, z, codes);
            if (rc != KVG_OK) {
                return rc;
            }
        }
    }
    return KVG_OK;
}

int kvg_wfq_check(const kvg_job * job, const uint8_t * src) {
    int rc = kvg_wfq_check_book(job);
    if (rc != KVG_OK) {
        return rc;
    }
    const size_t vb = vec_bytes(job);
    for (int64_t v = 0; v < job->n_tokens * job->n_heads; v++) {
        const uint16_t g16 = kvg_get_u16(src + (size_t) v * vb);
        if (!kvg_f16_is_finite(g16) || (g16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT, "%s: vector %lld has gain 0x%04x (negative or not finite)",
                            kvg_codec_name(job->type), (long long) v, g16);
        }
    }
    return KVG_OK;
}

int kvg_wfq_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    int rc = kvg_wfq_check(job, src);  // nothing written before the whole block is known good
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t      d  = job->head_dim;
    const size_t       vb = vec_bytes(job);
    const wfq_levels * lv = get_levels();
    float              z[KVG_WFQ_MAX_HEAD_DIM];
    uint8_t            codes[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t h = 0; h < job->n_heads; h++) {
        const wfq_head p = head_plan(job, h);
        for (int64_t t = 0; t < job->n_tokens; t++) {
            decode_vec(src + (size_t) (t * job->n_heads + h) * vb, &p, d, lv, dst + t * job->n_channels + h * d, z,
                       codes);
        }
    }
    return KVG_OK;
}

// ---- training: the plan of each head from a block of rows ------------------------------------

int kvg_wfq_train(int type, int kind, const float * src, size_t src_count, int64_t n_tokens, int64_t n_heads,
                  int64_t head_dim, const kvg_codec_params * p, float * book, size_t book_count) {
    kvg_clear_error();
    if (type < KVG_CODEC_WFQ2 || type > KVG_CODEC_WFQ4) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_wfq_train: codec type %d is not wfq2, wfq3 or wfq4", type);
    }
    kvg_job job;
    size_t  unused;
    int     rc = kvg_make_job(type, kind, n_tokens, n_heads, head_dim, p, &job, &unused);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!src || !book || src_count != (size_t) job.n_values || book_count != kvg_wfq_book_floats(n_heads, head_dim)) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "kvg_wfq_train: needs %lld values and a plan of %zu floats",
                        (long long) job.n_values, kvg_wfq_book_floats(n_heads, head_dim));
    }
    for (size_t i = 0; i < src_count; i++) {
        if (!isfinite(src[i])) {
            return kvg_fail(KVG_ERR_NONFINITE, "kvg_wfq_train: value %zu is not finite", i);
        }
    }
    const wfq_levels * lv = get_levels();
    const int64_t      d  = head_dim;
    double             energy[KVG_WFQ_MAX_HEAD_DIM];
    int                bits[KVG_WFQ_MAX_HEAD_DIM], order[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t h = 0; h < n_heads; h++) {
        // Mean squared values: the absolute error each coordinate's bits remove. Measured worse
        // (kvgguf eval, ctx 1024 x 2, wfq3): energies of rows scaled to unit norm, so that BOS
        // weighs no more than the rest (KL 0.052 -> 0.071 on SmolLM2; 0.025 -> 0.038 on Gemma-3),
        // and bits in groups of 8 coordinates, which would let codes be read 8 at a time from
        // whole bytes (0.017 -> 0.025 on Gemma-3).
        double top = 0.0;
        for (int64_t i = 0; i < d; i++) {
            double e = 0.0;
            for (int64_t t = 0; t < n_tokens; t++) {
                const double x = src[t * job.n_channels + h * d + i];
                e += x * x;
            }
            energy[i] = e / (double) n_tokens;
            top       = fmax(top, energy[i]);
        }
        // A coordinate no row used still gets a scale: a millionth of the strongest one's energy
        // (or 1 where every row is zero), so a later row that uses it is coded, not divided by 0.
        const double floor_e = top > 0.0 ? top * 1e-6 : 1.0;
        int64_t      left    = kvg_wfq_code_bits(&job) - d;
        for (int64_t i = 0; i < d; i++) {
            energy[i] = fmax(energy[i], floor_e);
            bits[i]   = 1;
        }
        for (; left > 0; left--) {  // the next bit where it removes the most squared error
            int64_t best = -1;
            double  gain = -1.0;
            for (int64_t i = 0; i < d; i++) {
                const double gi =
                    bits[i] < KVG_WFQ_MAX_BITS ? energy[i] * (lv->mse[bits[i]] - lv->mse[bits[i] + 1]) : -1.0;
                if (gi > gain) {
                    gain = gi;
                    best = i;
                }
            }
            if (best < 0) {
                break;
            }
            bits[best]++;
        }
        // positions by bits, most first (ties: coordinate order), so each width is one set
        int64_t n = 0;
        for (int b = KVG_WFQ_MAX_BITS; b >= 1; b--) {
            for (int64_t i = 0; i < d; i++) {
                if (bits[i] == b) {
                    order[n++] = (int) i;
                }
            }
        }
        float * out = book + h * 3 * d;
        for (int64_t k = 0; k < d; k++) {
            out[k]         = (float) order[k];
            out[d + k]     = (float) sqrt(energy[order[k]]);
            out[2 * d + k] = (float) bits[order[k]];
        }
    }
    job.book       = book;
    job.book_count = book_count;
    return kvg_wfq_check_book(&job);  // builds the mixes the plan needs
}

// ---- attention from the codes ----------------------------------------------------------------
//
// Scores: q . x' = n * sum over positions of z'_pos * q'_pos, where q' = M_g (sigma * q[perm]) per
// set. Each query is brought into the plan's domain once per attend call (kvg_wfq_prepare_q),
// after which a row costs one unpack and one dot of head_dim: no row is mixed back on its own.
// Values add up in the same domain (accr, weights times gains times levels) and go back to the
// coordinates once per query when attend.c is done with the domain (kvg_wfq_finish_acc).
// The store checked the plan when it was set or fitted and every block when it was linked, so
// these kernels check nothing again.

// The sets of a head's plan (positions of one width that follow each other), in order, with
// where each one's codes start; their count.
static int plan_runs(const float * bits, int64_t d, kvg_wfq_set * runs) {
    int      k   = 0;
    uint32_t bit = 0;
    for (int64_t a = 0, n; a < d; a += n) {
        for (n = 1; a + n < d && bits[a + n] == bits[a]; n++) {
        }
        runs[k++] = (kvg_wfq_set) { (int32_t) a, (int32_t) n, (int32_t) bits[a], bit };
        bit += (uint32_t) (n * (int64_t) bits[a]);
    }
    return k;
}

// Where each position's code lies in a head vector's code bytes, worked out once per head and
// chunk: reading a row is then one 16-bit load, shift, mask and level per position, with no
// branch (a position of no bits reads 0 from a mask of 0 and a level table of one zero).
typedef struct wfq_layout {
    uint16_t      off[KVG_WFQ_MAX_HEAD_DIM];
    uint8_t       shift[KVG_WFQ_MAX_HEAD_DIM];
    uint8_t       mask[KVG_WFQ_MAX_HEAD_DIM];
    const float * level[KVG_WFQ_MAX_HEAD_DIM];
} wfq_layout;

static const float k_no_level[1] = { 0.0f };

static void plan_layout(const kvg_job * job, const float * bits, const wfq_levels * lv, wfq_layout * L) {
    uint64_t pos = 0;
    for (int64_t k = 0; k < job->head_dim; k++) {
        const int b = (int) bits[k];
        L->off[k]   = (uint16_t) (pos >> 3);
        L->shift[k] = (uint8_t) (pos & 7);
        L->mask[k]  = (uint8_t) ((1u << b) - 1);
        L->level[k] = b ? lv->level[b] : k_no_level;
        pos += (uint64_t) b;
    }
}

// z[k] = the level of position k's code; returns the vector's gain. A 16-bit load may pass the
// vector's last byte by one: the next vector's gain, or a padded copy for a block's last vector.
static float read_levels(const uint8_t * vec, const wfq_layout * L, int64_t d, float * z) {
    const uint8_t * c = vec + WFQ_GAIN_BYTES;
    for (int64_t k = 0; k < d; k++) {
        const unsigned w = (unsigned) c[L->off[k]] | (unsigned) c[L->off[k] + 1] << 8;
        z[k]             = L->level[k][(w >> L->shift[k]) & L->mask[k]];
    }
    return kvg_f16_to_f32(kvg_get_u16(vec));
}

// The head vector of row t, head hk; the block's very last one through a padded copy.
static const uint8_t * vec_at(const kvg_job * job, const uint8_t * src, int64_t t, int64_t hk, size_t vb,
                              uint8_t * pad) {
    const uint8_t * v = src + (size_t) (t * job->n_heads + hk) * vb;
    if (t == job->n_tokens - 1 && hk == job->n_heads - 1) {
        memcpy(pad, v, vb);
        pad[vb] = 0;
        return pad;
    }
    return v;
}

// Eight partial sums, so that the compiler can keep them in one vector register.
static float dot8(const float * a, const float * b, int64_t d) {
    float   s[8] = { 0 };
    int64_t i    = 0;
    for (; i + 8 <= d; i += 8) {
        for (int k = 0; k < 8; k++) {
            s[k] += a[i + k] * b[i + k];
        }
    }
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < d; i++) {
        t += a[i] * b[i];
    }
    return t;
}

int kvg_wfq_prepare_q(const kvg_job * job, const kvg_attn * a, float * qr) {
    const int64_t d = job->head_dim;
    kvg_wfq_set   runs[KVG_WFQ_MAX_HEAD_DIM];
    float         u[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        const float *perm = job->book + hk * 3 * d, *sigma = perm + d, *bits = perm + 2 * d;
        const int    nr = plan_runs(bits, d, runs);
        for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
            const float * q = a->q + j * d;
            float *       y = qr + j * d;
            for (int64_t i = 0; i < d; i++) {
                u[i] = sigma[i] * q[(int64_t) perm[i]];
            }
            for (int k = 0; k < nr; k++) {
                const kvg_wfq_set r = runs[k];
                const float *     m = r.bits ? get_mix(r.n) : NULL;  // built when the plan was checked
                if (r.bits && !m) {
                    return kvg_fail(KVG_ERR_NO_MEMORY, "wfq: mix of %d coordinates", (int) r.n);
                }
                for (int32_t i = 0; i < r.n; i++) {
                    y[r.a + i] = m ? dot8(m + (int64_t) i * r.n, u + r.a, r.n) : 0.0f;
                }
            }
        }
    }
    return KVG_OK;
}

int kvg_wfq_finish_acc(const kvg_job * job, const kvg_attn * a) {
    const int64_t d = job->head_dim;
    kvg_wfq_set   runs[KVG_WFQ_MAX_HEAD_DIM];
    float         u[KVG_WFQ_MAX_HEAD_DIM];
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        const float *perm = job->book + hk * 3 * d, *sigma = perm + d, *bits = perm + 2 * d;
        const int    nr = plan_runs(bits, d, runs);
        for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
            const float * y   = a->accr + j * d;
            float *       out = a->acc + j * d;
            for (int k = 0; k < nr; k++) {
                const kvg_wfq_set r = runs[k];
                const float *     m = r.bits ? get_mix(r.n) : NULL;
                if (!m) {
                    continue;  // no bits, nothing was added (a missing mix failed in prepare_q)
                }
                for (int32_t c = 0; c < r.n; c++) {
                    u[c] = 0.0f;
                }
                for (int32_t i = 0; i < r.n; i++) {  // u = M^T y, row by row of M
                    const float   yi = y[r.a + i];
                    const float * mi = m + (int64_t) i * r.n;
                    for (int32_t c = 0; c < r.n; c++) {
                        u[c] += mi[c] * yi;
                    }
                }
                for (int32_t c = 0; c < r.n; c++) {  // out[perm] += sigma * u
                    out[(int64_t) perm[r.a + c]] += sigma[r.a + c] * u[c];
                }
            }
        }
    }
    return KVG_OK;
}

size_t kvg_wfq_vec_bytes(const kvg_job * job) {
    return vec_bytes(job);
}

const float * kvg_wfq_level_table(int bits) {
    return get_levels()->level[bits];
}

int kvg_wfq_sets(const kvg_job * job, int64_t hk, kvg_wfq_set * sets) {
    return plan_runs(job->book + (hk * 3 + 2) * job->head_dim, job->head_dim, sets);
}

// Levels of rows [t0, t0 + n) of KV head hk into z[t][head_dim], their gains into gain[t] (the
// scalar kernels' first step).
static void levels_of_rows(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, int64_t hk, float * z,
                           float * gain) {
    const int64_t d  = job->head_dim;
    const size_t  vb = vec_bytes(job);
    wfq_layout    L;
    uint8_t       pad[WFQ_GAIN_BYTES + KVG_WFQ_MAX_HEAD_DIM + 1];
    plan_layout(job, job->book + hk * 3 * d + 2 * d, get_levels(), &L);
    for (int64_t t = 0; t < n; t++) {
        gain[t] = read_levels(vec_at(job, src, t0 + t, hk, vb, pad), &L, d, z + t * d);
    }
}

int kvg_wfq_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                      float * out) {
    const int64_t d = job->head_dim;
    float         z[KVG_ATTN_CHUNK * KVG_WFQ_MAX_HEAD_DIM / 4], gain[KVG_ATTN_CHUNK];
    const int64_t rows = (int64_t) (sizeof(z) / sizeof(z[0])) / d;  // rows of levels at a time
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        for (int64_t c = 0; c < n; c += rows) {
            const int64_t m = n - c < rows ? n - c : rows;
            levels_of_rows(job, src, t0 + c, m, hk, z, gain);
            for (int64_t t = 0; t < m; t++) {
                for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                    out[j * n + c + t] = gain[t] * dot8(a->qr + j * d, z + t * d, d);
                }
            }
        }
    }
    return KVG_OK;
}

int kvg_wfq_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a) {
    const int64_t d = job->head_dim;
    float         z[KVG_ATTN_CHUNK * KVG_WFQ_MAX_HEAD_DIM / 4], gain[KVG_ATTN_CHUNK];
    const int64_t rows = (int64_t) (sizeof(z) / sizeof(z[0])) / d;
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        for (int64_t c = 0; c < n; c += rows) {
            const int64_t m = n - c < rows ? n - c : rows;
            levels_of_rows(job, src, t0 + c, m, hk, z, gain);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                float * acc = a->accr + j * d;
                for (int64_t t = 0; t < m; t++) {
                    const float   w  = gain[t] * p[j * n + c + t];
                    const float * zt = z + t * d;
                    for (int64_t i = 0; i < d; i++) {
                        acc[i] += w * zt[i];
                    }
                }
            }
        }
    }
    return KVG_OK;
}
