// simd_check.c: this build's SIMD kernels (AVX2 on x86-64, NEON on AArch64) against the scalar
// oracle, in C, so that a cross-compiled library can be checked where Python and its wheels are
// not at hand (scripts/neon_check.sh runs it for AArch64 under qemu-user).
//
// - every codec, both kinds, head dims on and off the fast paths, odd token counts, kivi group
//   sizes, values from Gaussian to f16 subnormal and overflow: encode bytes and statuses equal,
//   decoded floats equal bit for bit (as tests/unit/test_codecs.py asks of the AVX2 kernels);
// - the store's f16 read path (kvg_store_decode_f16) and, since the program links the library
//   statically, the internal row kernels kvg_f32_to_f16_row and kvg_fwht on their edge cases;
// - kvg_store_hook_attend for every codec pair: m, l and the output within the bounds
//   tests/unit/test_attend.py holds the SIMD levels to (the attention kernels sum in another order).
//
//   simd_check [LEVEL]   LEVEL (avx2 / neon): fail unless that is the level compared
//
// Prints a summary and exits 1 on any mismatch.
#include "kvg_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long g_checks, g_bad;

#define MAX_REPORTS 25

static void mismatch(const char * fmt, ...) __attribute__((format(printf, 1, 2)));

static void mismatch(const char * fmt, ...) {
    if (++g_bad <= MAX_REPORTS) {
        va_list ap;
        va_start(ap, fmt);
        fputs("MISMATCH ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

static const char * level_name(int level) {
    return level == KVG_SIMD_AVX2 ? "avx2" : level == KVG_SIMD_NEON ? "neon" : "scalar";
}

static void set_level(int level) {
    if (kvg_set_simd_level(level) != KVG_OK) {
        fprintf(stderr, "simd_check: cannot set level %d: %s\n", level, kvg_last_error());
        exit(2);
    }
}

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "simd_check: out of memory\n");
        exit(2);
    }
    return p;
}

// ---- deterministic inputs (splitmix64; Gaussian pairs) -------------------------------------------

static uint64_t g_rng = 0x5eed;

static uint64_t next_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(void) {  // (0, 1)
    return ((double) (next_u64() >> 11) + 0.5) / 9007199254740992.0;
}

// Marsaglia's polar form, both values of a pair used: no trigonometry and one log per two
// values, which under qemu is most of what making the inputs costs
static float gauss(void) {
    static int    have_spare;
    static double spare;
    if (have_spare) {
        have_spare = 0;
        return (float) spare;
    }
    double u, v, s;
    do {
        u = 2.0 * uniform() - 1.0;
        v = 2.0 * uniform() - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = sqrt(-2.0 * log(s) / s);
    spare          = v * f;
    have_spare     = 1;
    return (float) (u * f);
}

enum { VALS_KV, VALS_SPECIAL, VALS_TINY, VALS_LARGE, VALS_COUNT };
static const char * const k_vals[VALS_COUNT] = { "kv", "special", "tiny", "large" };

// T rows of C values: Gaussian with a few 8x channels (keys' outliers, KIVI fig. 2), then the
// pattern's own values.
static void fill(float * x, int64_t T, int64_t C, int pattern) {
    for (int64_t i = 0; i < T * C; i++) {
        x[i] = gauss();
    }
    for (int64_t c = (int64_t) (next_u64() % 32); c < C; c += 32) {
        for (int64_t t = 0; t < T; t++) {
            x[t * C + c] *= 8.0f;
        }
    }
    const int64_t n = T * C;
    switch (pattern) {
        case VALS_SPECIAL:
            for (int64_t k = 0; k < n / 50 + 1; k++) {
                x[next_u64() % n] = 0.0f;
                x[next_u64() % n] = -0.0f;
                x[next_u64() % n] = 1e-40f;  // float32 subnormal
                x[next_u64() % n] = -3000.0f;
            }
            if (T > 3) {
                for (int64_t c = 0; c < C; c++) {
                    x[2 * C + c] = 0.0f;  // zero rows / vectors
                    x[1 * C + c] = -0.0f;
                    x[3 * C + c] = c % 3 == 0 ? -0.0f : c % 3 == 1 ? 0.0f : fabsf(x[3 * C + c]);  // min of both zeros
                }
            }
            if (T > 5) {
                for (int64_t c = 0; c < C; c++) {
                    x[5 * C + c] = 0.25f;  // constant row: kivi's scale-0 groups
                }
            }
            break;
        case VALS_TINY:  // near and below f16's smallest normal: subnormal mins, scales and norms
            for (int64_t i = 0; i < n; i++) {
                x[i] *= (i % 7 == 0) ? 1e-9f : 3e-6f;
            }
            break;
        case VALS_LARGE:  // up to f16's limit; some rotq norms overflow (both levels must refuse)
            for (int64_t i = 0; i < n; i++) {
                x[i] *= 4000.0f;
                x[i] = x[i] > 65504.0f ? 65504.0f : x[i] < -65504.0f ? -65504.0f : x[i];
            }
            break;
        default: break;
    }
}

// ---- codecs: encode / decode at both levels --------------------------------------------------

static void check_codec(int simd, int type, int kind, int64_t T, int64_t H, int64_t D, int32_t G, int pattern) {
    const char *     name = kvg_codec_name(type);
    kvg_codec_params p;
    kvg_codec_default_params(&p);
    p.group_size = G;
    size_t size  = 0;
    int    st    = kvg_encoded_size(type, kind, T, H, D, &p, &size);
    if (st != KVG_OK) {
        return;  // a shape the codec refuses (rotq: head_dim not a power of two)
    }
    const int64_t n  = T * H * D;
    float *       x  = xmalloc((size_t) n * sizeof(float));
    uint8_t *     b0 = xmalloc(size);
    uint8_t *     b1 = xmalloc(size);
    float *       y0 = xmalloc((size_t) n * sizeof(float));
    float *       y1 = xmalloc((size_t) n * sizeof(float));
    fill(x, T, H * D, pattern);
    memset(b0, 0xa5, size);
    memset(b1, 0x5a, size);

    char where[160];
    snprintf(where, sizeof(where), "%s %s T=%lld H=%lld D=%lld G=%d %s", name, kind ? "V" : "K", (long long) T,
             (long long) H, (long long) D, (int) G, k_vals[pattern]);

    set_level(KVG_SIMD_SCALAR);
    const int s0 = kvg_encode(type, kind, x, (size_t) n, T, H, D, &p, b0, size, NULL);
    set_level(simd);
    const int s1 = kvg_encode(type, kind, x, (size_t) n, T, H, D, &p, b1, size, NULL);
    g_checks++;
    if (s0 != s1) {
        mismatch("%s: encode status %d (scalar) vs %d", where, s0, s1);
    } else if (s0 == KVG_OK) {
        g_checks++;
        if (memcmp(b0, b1, size) != 0) {
            size_t i = 0;
            while (b0[i] == b1[i]) {
                i++;
            }
            mismatch("%s: encoded byte %zu of %zu: 0x%02x (scalar) vs 0x%02x", where, i, size, b0[i], b1[i]);
        }
        set_level(KVG_SIMD_SCALAR);
        const int d0 = kvg_decode(type, kind, b0, size, T, H, D, &p, y0, (size_t) n);
        set_level(simd);
        const int d1 = kvg_decode(type, kind, b0, size, T, H, D, &p, y1, (size_t) n);
        g_checks++;
        if (d0 != KVG_OK || d1 != KVG_OK) {
            mismatch("%s: decode status %d (scalar) and %d", where, d0, d1);
        } else if (memcmp(y0, y1, (size_t) n * sizeof(float)) != 0) {  // bit for bit: -0 is not 0
            int64_t i = 0;
            while (memcmp(y0 + i, y1 + i, sizeof(float)) == 0) {
                i++;
            }
            mismatch("%s: decoded value %lld: %.9g (scalar) vs %.9g", where, (long long) i, (double) y0[i],
                     (double) y1[i]);
        }
    }
    free(x);
    free(b0);
    free(b1);
    free(y0);
    free(y1);
}

// ---- internal row kernels: f32 -> f16 rows and the Walsh-Hadamard transform -------------------

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void check_f16_row(int simd) {
    // Every rounding region of kvg_f32_to_f16: ties either way, subnormal results, the overflow
    // threshold 65520, Inf, and NaNs with payloads (the oracle writes one quiet NaN per sign).
    const uint32_t edge[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x337fffffu, 0x38800000u,
        0x387fffffu, 0x387fe000u, 0x387ff000u, 0x38801000u, 0x38803000u, 0x3f801000u, 0x3f803000u, 0x3f800fffu,
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
        0x7fc00000u, 0xffc00000u, 0x7fc12345u, 0xffd00001u, 0x7f800001u, 0xff812345u, 0x35555555u,
    };
    enum { N = 1000 };
    float     x[N];
    uint16_t  y0[N], y1[N];
    const int n_edge = (int) (sizeof(edge) / sizeof(edge[0]));
    for (int i = 0; i < N; i++) {
        // edge cases at every offset mod 4 and 8 (vector lanes and the scalar tail), then noise
        // over all exponents
        x[i] = i < 4 * n_edge ? from_bits(edge[i % n_edge] ^ (uint32_t) (i / n_edge % 2) << 31)
                              : from_bits((uint32_t) next_u64());
    }
    for (int64_t n = N - 3; n <= N; n++) {
        set_level(KVG_SIMD_SCALAR);
        kvg_f32_to_f16_row(x, y0, n);
        set_level(simd);
        kvg_f32_to_f16_row(x, y1, n);
        for (int64_t i = 0; i < n; i++) {
            g_checks++;
            if (y0[i] != y1[i] || y0[i] != kvg_f32_to_f16(x[i])) {
                uint32_t u;
                memcpy(&u, &x[i], sizeof(u));
                mismatch("f32_to_f16_row: x = 0x%08x: 0x%04x (scalar) vs 0x%04x", (unsigned) u, y0[i], y1[i]);
            }
        }
    }
}

static void check_fwht(int simd) {
    for (int64_t d = 8; d <= 4096; d *= 2) {
        float * a = xmalloc((size_t) d * sizeof(float));
        float * b = xmalloc((size_t) d * sizeof(float));
        for (int64_t i = 0; i < d; i++) {
            a[i] = b[i] = gauss() * (i % 5 == 0 ? 1000.0f : 1.0f);
        }
        kvg_fwht_ref(a, d);
        set_level(simd);
        kvg_fwht(b, d);
        g_checks++;
        if (memcmp(a, b, (size_t) d * sizeof(float)) != 0) {
            mismatch("fwht d=%lld differs from the reference", (long long) d);
        }
        free(a);
        free(b);
    }
}

// ---- the store: f16 reads and fused attention --------------------------------------------------

enum { N_ROWS = 263 };
// Blocks cut differently for K and V, never at multiples of 8 (tests/unit/test_attend.py): an f16
// sink, two blocks of the codec under test (the second spans crotq's group boundary at 128),
// a last block of the other side's codec.
static const int64_t k_cuts[]      = { 0, 4, 77, 205, N_ROWS };
static const int64_t v_cuts[]      = { 0, 4, 40, 170, N_ROWS };
static const int64_t k_ranges[][2] = { { 0, N_ROWS }, { 3, 197 }, { 100, 101 }, { 61, 250 }, { 130, 139 } };

// tests/unit/test_attend.py: l to rtol 1e-4, the output to TOL_SIMD of the largest |v| between the
// levels; m (the largest score) to rtol and atol 2e-5: the side-data codecs added to the table shift
// this program's random data, and with it came a case at 1.15e-5 (kivi8 keys, D = 256, the
// folded scale and min rounding apart from the scalar dot of decoded rows); a wrong row or
// head moves m by orders of magnitude more.
#define ATTN_M_TOL    2e-5
#define ATTN_L_RTOL   1e-4
#define ATTN_TOL_SIMD 3e-5

static kvg_store * build_store(int kc, int vc, int64_t D, int32_t hkv, int32_t G) {
    kvg_store_params p;
    kvg_store_default_params(&p);
    p.n_layer          = 2;
    p.n_head_kv        = hkv;
    p.head_dim_k       = (int32_t) D;
    p.head_dim_v       = (int32_t) D;
    p.codec.group_size = G;
    kvg_store * s      = NULL;
    if (kvg_store_init(&p, &s) != KVG_OK) {
        fprintf(stderr, "simd_check: store init: %s\n", kvg_last_error());
        exit(2);
    }
    const int64_t W = hkv * D;
    float *       x = xmalloc((size_t) (N_ROWS * W) * sizeof(float));
    for (int kind = 0; kind < 2; kind++) {
        const int64_t * cuts = kind == KVG_KIND_K ? k_cuts : v_cuts;
        const int       main = kind == KVG_KIND_K ? kc : vc, last = kind == KVG_KIND_K ? vc : kc;
        fill(x, N_ROWS, W, VALS_KV);
        memset(x + 10 * W, 0, (size_t) W * sizeof(float));  // a zero row: rotq stores norm 0 and no codes
        for (int b = 0; b < 4; b++) {
            const int     codec = b == 0 ? KVG_CODEC_F16 : b == 3 ? last : main;
            const int     tier  = b == 0 ? KVG_TIER_SINK : b == 3 ? KVG_TIER_ARCHIVE : KVG_TIER_WARM;
            const int64_t r0 = cuts[b], r1 = cuts[b + 1];
            if (kvg_store_append(s, 1, kind, tier, codec, x + r0 * W, (size_t) ((r1 - r0) * W), r1 - r0) != KVG_OK) {
                fprintf(stderr, "simd_check: append %s: %s\n", kvg_codec_name(codec), kvg_last_error());
                exit(2);
            }
        }
    }
    free(x);
    return s;
}

typedef struct attn_out {
    float * m;
    float * l;
    float * acc;
} attn_out;

static int attend_at(int level, kvg_store * s, int64_t r0, int64_t r1, const float * q, int32_t nt, int32_t nh,
                     float scale, int64_t D, attn_out * o) {
    for (int64_t j = 0; j < (int64_t) nt * nh; j++) {
        o->m[j] = -INFINITY;
        o->l[j] = 0.0f;
    }
    memset(o->acc, 0, (size_t) ((int64_t) nt * nh * D) * sizeof(float));
    set_level(level);
    return kvg_store_hook_attend(s, 1, r0, r1, q, nt, nh, scale, o->m, o->l, o->acc);
}

// Query tokens of check_attend: a decode step, a small batch and, where many > 0, a batch whose
// queries per KV head take attend.c's dense tiles (KVG_DENSE_MIN_QUERIES).
static void check_attend_tokens(int simd, int kc, int vc, int64_t D, int32_t hkv, int32_t nh, int32_t G, int32_t many);

static void check_attend(int simd, int kc, int vc, int64_t D, int32_t hkv, int32_t nh, int32_t G) {
    check_attend_tokens(simd, kc, vc, D, hkv, nh, G, 0);
}

static void check_attend_tokens(int simd, int kc, int vc, int64_t D, int32_t hkv, int32_t nh, int32_t G, int32_t many) {
    set_level(KVG_SIMD_SCALAR);
    kvg_store *   s = build_store(kc, vc, D, hkv, G);
    const int64_t W = hkv * D;
    float *       v = xmalloc((size_t) (N_ROWS * W) * sizeof(float));
    if (kvg_store_decode(s, 1, KVG_KIND_V, 0, N_ROWS, v, (size_t) (N_ROWS * W)) != KVG_OK) {
        fprintf(stderr, "simd_check: decode: %s\n", kvg_last_error());
        exit(2);
    }

    // the f16 read path (cold rows back to llama.cpp) goes through kvg_f32_to_f16_row
    for (int kind = 0; kind < 2; kind++) {
        uint16_t * h0 = xmalloc((size_t) (N_ROWS * W) * sizeof(uint16_t));
        uint16_t * h1 = xmalloc((size_t) (N_ROWS * W) * sizeof(uint16_t));
        set_level(KVG_SIMD_SCALAR);
        const int s0 = kvg_store_decode_f16(s, 1, kind, 0, N_ROWS, h0, (size_t) (N_ROWS * W));
        set_level(simd);
        const int s1 = kvg_store_decode_f16(s, 1, kind, 0, N_ROWS, h1, (size_t) (N_ROWS * W));
        g_checks++;
        if (s0 != KVG_OK || s1 != KVG_OK || memcmp(h0, h1, (size_t) (N_ROWS * W) * sizeof(uint16_t)) != 0) {
            mismatch("decode_f16 %s/%s D=%lld %s: statuses %d, %d or halves differ", kvg_codec_name(kc),
                     kvg_codec_name(vc), (long long) D, kind ? "V" : "K", s0, s1);
        }
        free(h0);
        free(h1);
    }

    const float   scale     = (float) (1.0 / sqrt((double) D));
    const int32_t tokens[3] = { 1, 3, many };
    for (int ti = 0; ti < 3 && tokens[ti] > 0; ti++) {
        const int32_t nt = tokens[ti];
        const int64_t nq = (int64_t) nt * nh;
        float *       q  = xmalloc((size_t) (nq * D) * sizeof(float));
        for (int64_t i = 0; i < nq * D; i++) {
            q[i] = 2.0f * gauss();
        }
        attn_out o[2];
        for (int k = 0; k < 2; k++) {
            o[k].m   = xmalloc((size_t) nq * sizeof(float));
            o[k].l   = xmalloc((size_t) nq * sizeof(float));
            o[k].acc = xmalloc((size_t) (nq * D) * sizeof(float));
        }
        for (size_t ri = 0; ri < sizeof(k_ranges) / sizeof(k_ranges[0]); ri++) {
            const int64_t r0 = k_ranges[ri][0], r1 = k_ranges[ri][1];
            float         vmax = 0.0f;
            for (int64_t i = r0 * W; i < r1 * W; i++) {
                vmax = fabsf(v[i]) > vmax ? fabsf(v[i]) : vmax;
            }
            const int s0 = attend_at(KVG_SIMD_SCALAR, s, r0, r1, q, nt, nh, scale, D, &o[0]);
            const int s1 = attend_at(simd, s, r0, r1, q, nt, nh, scale, D, &o[1]);
            char      where[160];
            snprintf(where, sizeof(where), "attend %s/%s D=%lld heads=%d/%d G=%d T=%d [%lld,%lld)", kvg_codec_name(kc),
                     kvg_codec_name(vc), (long long) D, (int) hkv, (int) nh, (int) G, (int) nt, (long long) r0,
                     (long long) r1);
            g_checks++;
            if (s0 != KVG_OK || s1 != KVG_OK) {
                mismatch("%s: status %d (scalar), %d", where, s0, s1);
                continue;
            }
            double worst_m = 0.0, worst_l = 0.0, worst_out = 0.0;
            for (int64_t j = 0; j < nq; j++) {
                const double dm = fabs((double) o[0].m[j] - o[1].m[j]) / (ATTN_M_TOL + ATTN_M_TOL * fabs(o[0].m[j]));
                const double dl = fabs((double) o[0].l[j] - o[1].l[j]) / (ATTN_L_RTOL * fabs(o[0].l[j]));
                worst_m         = dm > worst_m ? dm : worst_m;
                worst_l         = dl > worst_l ? dl : worst_l;
                for (int64_t i = 0; i < D; i++) {
                    const double a = (double) o[0].acc[j * D + i] / o[0].l[j];
                    const double b = (double) o[1].acc[j * D + i] / o[1].l[j];
                    const double e = fabs(a - b) / (ATTN_TOL_SIMD * vmax);
                    worst_out      = e > worst_out || e != e ? e : worst_out;
                }
            }
            if (!(worst_m <= 1.0 && worst_l <= 1.0 && worst_out <= 1.0)) {
                mismatch("%s: m, l, out at %.3g, %.3g, %.3g of their bounds", where, worst_m, worst_l, worst_out);
            }
        }
        for (int k = 0; k < 2; k++) {
            free(o[k].m);
            free(o[k].l);
            free(o[k].acc);
        }
        free(q);
    }
    free(v);
    kvg_store_free(s);
}

// ---- driver ------------------------------------------------------------------------------------

// The side-data codecs (delta4 .. qjl4) have no kernel of their own: the store decodes their rows with
// the scalar reference at every level and attends over them with the rows kernels, so wider heads
// would check the same SIMD code again at the price of minutes of reference decoding under qemu.
static int decoded_to_rows(int codec) {
    return codec >= KVG_CODEC_DELTA4 && codec <= KVG_CODEC_QJL4;
}

int main(int argc, char ** argv) {
    const clock_t t_start = clock();
    const int     simd    = kvg_simd_max_level();
    printf("simd_check: comparing %s (level %d) against scalar\n", level_name(simd), simd);
    if (argc > 1 && strcmp(argv[1], level_name(simd)) != 0) {
        printf("simd_check: FAIL: expected level %s, this build and CPU give %s\n", argv[1], level_name(simd));
        return 1;
    }
    if (simd == KVG_SIMD_SCALAR) {
        printf("simd_check: no SIMD level here: nothing to compare\n");
        return 0;
    }

    check_f16_row(simd);
    check_fwht(simd);
    const long rows_checks = g_checks, rows_bad = g_bad;

    // (T, H, D): decode-step sizes, odd token counts, crotq's 128-token group edge, heads that
    // are off the fast paths (D = 24, 4: not a multiple of 8; D = 8: rotq's smallest vector path)
    static const int64_t shapes[][3] = {
        { 1, 1, 64 },    { 7, 3, 64 }, { 33, 2, 128 }, { 129, 1, 128 }, { 5, 2, 256 },
        { 131, 3, 256 }, { 9, 3, 8 },  { 17, 2, 24 },  { 6, 5, 4 },     { 40, 1, 512 },
    };
    static const int32_t groups[] = { 32, 7, 128 };
    for (int type = 0; type < KVG_CODEC_PQ2; type++) {  // pq2, vq8: no SIMD kernels (and a codebook to train)
        int bits = 0;
        kvg_codec_bits(type, &bits);
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            for (int kind = 0; kind < 2; kind++) {
                for (int pattern = 0; pattern < VALS_COUNT; pattern++) {
                    for (size_t gi = 0; gi < sizeof(groups) / sizeof(groups[0]); gi++) {
                        const int kivi = type >= KVG_CODEC_KIVI2 && type <= KVG_CODEC_KIVI8;
                        if (gi > 0 && !kivi) {
                            break;  // the group size is kivi's alone
                        }
                        check_codec(simd, type, kind, shapes[si][0], shapes[si][1], shapes[si][2], groups[gi], pattern);
                    }
                }
            }
        }
    }
    // tcq: the Viterbi search in vectors of 8 lanes against its plain loops (the largest shape
    // left out: a search costs 256 states a value, slow under qemu)
    for (int type = KVG_CODEC_TCQ2; type <= KVG_CODEC_TCQ4; type++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            for (int kind = 0; kind < 2 && shapes[si][0] * shapes[si][1] * shapes[si][2] < 50000; kind++) {
                for (int pattern = 0; pattern < VALS_COUNT; pattern++) {
                    check_codec(simd, type, kind, shapes[si][0], shapes[si][1], shapes[si][2], 32, pattern);
                }
            }
        }
    }
    const long codec_checks = g_checks - rows_checks, codec_bad = g_bad - rows_bad;

    // every codec with itself and with one of another family (tests/unit/test_attend.py's PAIRS), but
    // pq2 and vq8 (the last types): their decode-and-dot path has no SIMD kernel of its own, and
    // training their codebooks under qemu costs minutes (tests/unit/test_attend.py runs them)
    const int            n_codecs   = KVG_CODEC_PQ2;
    static const int32_t heads[][2] = { { 1, 1 }, { 1, 3 }, { 3, 3 }, { 3, 9 } };
    static const int64_t dims[]     = { 64, 128, 256 };
    for (int i = 0; i < 2 * n_codecs; i++) {
        const int kc = i % n_codecs, vc = i < n_codecs ? kc : (kc + 6) % n_codecs;
        for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
            if (di > 0 && (decoded_to_rows(kc) || decoded_to_rows(vc)) && !(kc == KVG_CODEC_DELTA4 && vc == kc)) {
                break;  // see decoded_to_rows: delta4 alone takes the rows kernels to the wider heads
            }
            for (size_t hi = 0; hi < sizeof(heads) / sizeof(heads[0]); hi++) {
                check_attend(simd, kc, vc, dims[di], heads[hi][0], heads[hi][1], 32);
            }
        }
    }
    // off the attention kernels' fast paths: they hand these to the reference
    check_attend(simd, KVG_CODEC_ROTQ3, KVG_CODEC_CROTQ2, 8, 3, 9, 32);
    check_attend(simd, KVG_CODEC_KIVI3, KVG_CODEC_F16, 8, 3, 9, 32);
    check_attend(simd, KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ4, 4, 3, 9, 32);
    check_attend(simd, KVG_CODEC_KIVI4, KVG_CODEC_KIVI3, 24, 3, 9, 7);
    check_attend(simd, KVG_CODEC_F16, KVG_CODEC_KIVI8, 24, 3, 9, 7);
    // wfq (the store fits its plans on the first block, cheaply): its own kernels, next to the
    // rotation's domain, and at head dims that are not multiples of 8 (scores only)
    for (int kc = KVG_CODEC_WFQ2; kc <= KVG_CODEC_WFQ4; kc++) {
        check_attend(simd, kc, kc, 64, 3, 9, 32);
        check_attend(simd, kc, KVG_CODEC_ROTQ3, 128, 1, 3, 32);
        check_attend(simd, KVG_CODEC_ROTQ4, kc, 256, 3, 9, 32);
        check_attend(simd, kc, kc, 100, 2, 6, 32);
    }
    // tcq, in the rotation's domain beside rotq and wfq's
    for (int kc = KVG_CODEC_TCQ2; kc <= KVG_CODEC_TCQ4; kc++) {
        check_attend(simd, kc, kc, 64, 3, 9, 32);
        check_attend(simd, kc, KVG_CODEC_ROTQ3, 128, 1, 3, 32);
        check_attend(simd, KVG_CODEC_WFQ4, kc, 256, 3, 9, 32);
    }

    // many queries per KV head: f16, rotq and tcq rows as dense tiles, beside kernels (7 tokens
    // of groups of 3: 21 queries, a tail after the tiles of 8; 16 without GQA: two whole tiles)
    static const int32_t dense_pairs[][2] = { { KVG_CODEC_F16, KVG_CODEC_F16 },    { KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ2 },
                                              { KVG_CODEC_TCQ3, KVG_CODEC_TCQ4 },  { KVG_CODEC_ROTQ4, KVG_CODEC_KIVI2 },
                                              { KVG_CODEC_KIVI4, KVG_CODEC_TCQ2 }, { KVG_CODEC_ROTQ1, KVG_CODEC_F16 } };
    for (size_t i = 0; i < sizeof(dense_pairs) / sizeof(dense_pairs[0]); i++) {
        check_attend_tokens(simd, dense_pairs[i][0], dense_pairs[i][1], 64, 3, 9, 32, 7);
        check_attend_tokens(simd, dense_pairs[i][0], dense_pairs[i][1], 128, 1, 1, 32, 16);
    }

    const double secs = (double) (clock() - t_start) / CLOCKS_PER_SEC;
    printf("simd_check: row kernels %ld checks, %ld mismatches; codecs %ld, %ld; store and attention %ld, %ld\n",
           rows_checks, rows_bad, codec_checks, codec_bad, g_checks - rows_checks - codec_checks,
           g_bad - rows_bad - codec_bad);
    printf("simd_check: %s vs scalar: %ld checks, %ld mismatches, %.1f s CPU\n", level_name(simd), g_checks, g_bad,
           secs);
    if (g_bad > MAX_REPORTS) {
        printf("simd_check: (only the first %d mismatches are shown)\n", MAX_REPORTS);
    }
    printf("simd_check: %s\n", g_bad ? "FAIL" : "OK");
    return g_bad ? 1 : 0;
}
