// cuda_check.cu: libkvgguf's CUDA kernels against the scalar C reference, without a model.
//
// Codecs (f16, kivi2/3/4/8, rotq1/2/3/4), both kinds, head dims 8..256 and odd ones for kivi and
// f16, token counts from 1 to 257 (odd ones among them), kivi group sizes 32, 17 and 64, values
// from Gaussian rows with outlier channels to zero rows, -0, constant groups, f16 subnormal norms:
// - encode: the status and every byte equal to kvg_encode's at the scalar level, from f32 rows,
//   from f16 rows (against the reference on their f32 widening), from padded and from transposed
//   rows (llama.cpp's transposed V), and no byte written past the block;
// - decode: kvg_decode's floats bit for bit (f32 out, contiguous and transposed; f16 out equal to
//   those floats rounded to nearest even by cuda_fp16.h's __float2half_rn), nothing written in a
//   padded layout's gaps;
// - refused input as the CPU refuses it: NaN/Inf (KVG_ERR_NONFINITE), norms, mins, scales or values
//   beyond f16 (KVG_ERR_RANGE), corrupt blocks (KVG_ERR_CORRUPT, dst unchanged), bad arguments,
//   codecs and head dims the GPU does not run (named in the message);
// - attention (GPU only): kvg_cuda_attend over rotq K/V blocks against a float64 softmax over the
//   rows kvg_decode gives and against kvg_store_hook_attend_capped, within the bounds
//   tests/unit/test_attend.py holds the CPU paths to (m: 1e-5 rel + 1e-5 abs, l: 1e-4 rel, output:
//   5e-5 of max |v|), GQA and not, 1 and 3 query tokens, soft-capping, a state folded over two
//   calls, K and V rows at different offsets of their blocks;
// - llama.cpp's cells (GPU only): kvg_cuda_attend_cells against kvg_attend_f16 from the same
//   state (f16 cells, V transposed, q8_0 K and V; f32 and f16 masks with hidden cells, a token that
//   sees none keeping its state bit for bit; GQA; soft-capping; head dims 64-512), and
//   kvg_cuda_attend_finish against the patched llama.cpp's merge with and without sinks;
// - timings (GPU only; reported, never asserted): attention at a Llama-3.2-3B layer's shape at 8K
//   and 32K rows, encode and decode of an eviction batch.
//
//   cuda_check            the GPU run; exits 77 saying "no CUDA device" where there is none
//   cuda_check --emulate  no GPU needed: the kernels' bodies (kvg_cuda_kernels.cuh) run on the host
//                         in the kernels' order, against the same reference, plus the host-side API
//   --quick               fewer shapes;  --no-timing  skip the timings
//
// Exit: 0 all equal, 1 a mismatch (each printed with its place, the first 40 in full), 2 a setup
// failure, 77 no CUDA device.
#include "kvg_cuda_attend.cuh"  // KA_FUSE_PARTS
#include "kvg_cuda_kernels.cuh"

#include <cuda_fp16.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

static int  g_emulate;
static int  g_quick;
static long g_checks, g_bad;

#define MAX_REPORTS 40

static void mismatch(const char * fmt, ...) __attribute__((format(printf, 1, 2)));
static void mismatch(const char * fmt, ...) {
    if (++g_bad <= MAX_REPORTS) {
        va_list ap;
        va_start(ap, fmt);
        fputs("MISMATCH ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
        fflush(stdout);
    }
}

static void die(const char * fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda_check: setup failed: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    exit(2);
}

// ---- data ----------------------------------------------------------------------------------

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
        z          = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z          = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    double uniform() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
    float  gauss() { return (float) (sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }
};

// Rows like K/V: Gaussian, a few channels x8 (kv_like), plus the edge cases the reference treats
// specially: a zero row (rotq: norm 0, no codes), a row of -0 and +0, a row of 1e-6 values (rotq
// norms in f16's subnormal range), and a constant stretch (kivi: constant groups, scale 0).
static std::vector<float> kv_rows(Rng & rng, int64_t T, int64_t C, int64_t D) {
    std::vector<float> x((size_t) (T * C));
    for (auto & v : x) {
        v = rng.gauss();
    }
    for (int64_t c = 0; c < C; c += D / 4 > 0 ? D / 4 : 1) {
        for (int64_t t = 0; t < T; t++) {
            x[(size_t) (t * C + c)] *= 8.0f;
        }
    }
    if (T > 1) {
        for (int64_t c = 0; c < C; c++) {
            x[(size_t) (1 * C + c)] = 0.0f;
        }
    }
    if (T > 2) {
        for (int64_t c = 0; c < C; c++) {
            x[(size_t) (2 * C + c)] = (c & 1) ? -0.0f : 0.0f;
        }
    }
    if (T > 3) {
        for (int64_t c = 0; c < C; c++) {
            x[(size_t) (3 * C + c)] = 1e-6f * rng.gauss();
        }
    }
    for (int64_t t = 0; t < T; t++) {  // channel 1 constant over all tokens
        if (C > 1) {
            x[(size_t) (t * C + 1)] = 0.375f;
        }
    }
    return x;
}

static uint16_t host_f16(float x) {
    const __half_raw r = __float2half_rn(x);
    return r.x;
}

static float host_f32(uint16_t u) {
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// ---- the device side of a case: the GPU, or the kernels' bodies on the host ------------------

static kvg_cuda_ctx * g_ctx;
static kvg_cuda_ctx * g_attend_ctx;  // g_ctx, or a context held to the generic attention kernel
static cudaStream_t   g_stream;      // the context's stream, for the timings' events

struct DevBuf {
    void * p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t bytes) : n(bytes) {
        if (g_emulate) {
            p = malloc(bytes ? bytes : 1);
            if (!p) {
                die("host malloc of %zu bytes", bytes);
            }
        } else if (kvg_cuda_malloc(g_ctx, bytes ? bytes : 1, &p) != KVG_OK) {
            die("kvg_cuda_malloc(%zu): %s", bytes, kvg_last_error());
        }
    }
    ~DevBuf() {
        if (g_emulate) {
            free(p);
        } else {
            kvg_cuda_free(g_ctx, p);
        }
    }
    void put(const void * src, size_t bytes) {
        if (g_emulate) {
            memcpy(p, src, bytes);
        } else if (kvg_cuda_copy_in(g_ctx, p, src, bytes) != KVG_OK) {
            die("kvg_cuda_copy_in: %s", kvg_last_error());
        }
    }
    void get(void * dst, size_t bytes) const {
        if (g_emulate) {
            memcpy(dst, p, bytes);
        } else if (kvg_cuda_copy_out(g_ctx, dst, p, bytes) != KVG_OK) {
            die("kvg_cuda_copy_out: %s", kvg_last_error());
        }
    }
    void fill(uint8_t byte) {
        std::vector<uint8_t> v(n, byte);
        put(v.data(), n);
    }
    DevBuf(const DevBuf &)             = delete;
    DevBuf & operator=(const DevBuf &) = delete;
};

static kc_status emu_status_init() {
    kc_status s;
    s.flags = 0;
    s.pad   = 0;
    for (int i = 0; i < KC_N_FLAGS; i++) {
        s.first[i] = ~0ULL;
    }
    return s;
}

// kvg_cuda_encode with its kernels' bodies run on the host, in the kernels' order.
static int emu_encode(int type, int kind, const void * src, int src_type, int64_t rs, int64_t cs, int64_t T, int64_t H,
                      int64_t D, const kvg_codec_params * p, void * dst, size_t dst_bytes) {
    kc_shape s;
    size_t   size = 0;
    int      st   = kc_prepare(type, kind, T, H, D, p, &s, &size);
    if (st != KVG_OK) {
        return st;
    }
    if (src == NULL || dst == NULL || (src_type != KVG_CUDA_F32 && src_type != KVG_CUDA_F16) || rs <= 0 || cs <= 0) {
        return KVG_ERR_INVALID_ARG;
    }
    if (dst_bytes < size) {
        return KVG_ERR_BUFFER_SIZE;
    }
    const int f16 = src_type == KVG_CUDA_F16;
    uint8_t * out = (uint8_t *) dst;
    kc_status k   = emu_status_init();
    if (type == KVG_CODEC_F16) {
        for (int64_t e = 0; e < s.n_values; e++) {
            kc_f16_encode_at(e, src, f16, rs, cs, s.n_channels, out, &k);
        }
    } else if (type <= KVG_CODEC_KIVI8) {
        const kc_kivi kv = kc_kivi_of(&s);
        for (int64_t g = 0; g < kv.n_groups; g++) {
            kc_kivi_group_at(g, kv, src, f16, rs, cs, out, &k);
        }
        for (int64_t b = 0; b < kv.code_bytes; b++) {
            out[4 * kv.n_groups + b] = kc_kivi_code_byte_at(b, kv, src, f16, rs, cs, out);
        }
    } else {
        kc_rotq r;
        st = kc_rotq_of(&s, &r);
        if (st != KVG_OK) {
            return st;
        }
        std::vector<float>   y((size_t) r.D);
        std::vector<uint8_t> q((size_t) r.D);
        float                lanes[8];
        for (int64_t v = 0; v < r.n_vec; v++) {
            for (int i = 0; i < r.D; i++) {
                kc_rotq_load_at(i, v, r, src, f16, rs, cs, y.data(), &k);
            }
            for (int l = 0; l < 8; l++) {
                lanes[l] = kc_rotq_lane_at(l, r, y.data());
            }
            int   skip = 0;
            float inv  = 0.0f;
            kc_rotq_norm(v, lanes, out, &k, &skip, &inv);
            if (!skip) {
                for (int i = 0; i < r.D; i++) {
                    kc_rotq_sign_at(i, r, y.data());
                }
                for (int h = 1; h < r.D; h <<= 1) {
                    for (int pp = 0; pp < r.D / 2; pp++) {
                        kc_fwht_pair(y.data(), pp, h);
                    }
                }
                for (int i = 0; i < r.D; i++) {
                    kc_rotq_quant_at(i, r, y.data(), inv, q.data());
                }
            }
            for (int64_t b = 0; b < r.vbytes; b++) {
                out[2 * r.n_vec + v * r.vbytes + b] = kc_rotq_pack_at(b, r, q.data(), skip);
            }
        }
    }
    return kc_flags_status(&s, &k, 0);
}

static int emu_decode(int type, int kind, const void * src, size_t src_bytes, int64_t T, int64_t H, int64_t D,
                      const kvg_codec_params * p, void * dst, int dst_type, int64_t rs, int64_t cs) {
    kc_shape s;
    size_t   size = 0;
    int      st   = kc_prepare(type, kind, T, H, D, p, &s, &size);
    if (st != KVG_OK) {
        return st;
    }
    if (src == NULL || dst == NULL || (dst_type != KVG_CUDA_F32 && dst_type != KVG_CUDA_F16) || rs <= 0 || cs <= 0) {
        return KVG_ERR_INVALID_ARG;
    }
    if (src_bytes != size) {
        return KVG_ERR_BUFFER_SIZE;
    }
    const int       f16 = dst_type == KVG_CUDA_F16;
    const uint8_t * in  = (const uint8_t *) src;
    kc_status       k   = emu_status_init();
    if (type == KVG_CODEC_F16) {
        for (int64_t e = 0; e < s.n_values; e++) {
            kc_f16_check_at(e, in, &k);
        }
        if (k.flags == 0) {
            for (int64_t e = 0; e < s.n_values; e++) {
                kc_f16_decode_at(e, in, s.n_channels, dst, f16, rs, cs);
            }
        }
    } else if (type <= KVG_CODEC_KIVI8) {
        const kc_kivi kv = kc_kivi_of(&s);
        for (int64_t g = 0; g < kv.n_groups; g++) {
            kc_kivi_check_at(g, in, &k);
        }
        if (k.flags == 0) {
            for (int64_t e = 0; e < kv.n_values; e++) {
                kc_kivi_decode_at(e, kv, in, in + 4 * kv.n_groups, dst, f16, rs, cs);
            }
        }
    } else {
        kc_rotq r;
        st = kc_rotq_of(&s, &r);
        if (st != KVG_OK) {
            return st;
        }
        for (int64_t v = 0; v < r.n_vec; v++) {
            kc_rotq_check_at(v, in, &k);
        }
        if (k.flags == 0) {
            std::vector<float> y((size_t) r.D);
            const float        inv_d = 1.0f / (float) r.D;
            for (int64_t v = 0; v < r.n_vec; v++) {
                const uint16_t n16 = kc_get_u16(in + 2 * v);
                if (n16 != 0) {
                    for (int i = 0; i < r.D; i++) {
                        kc_rotq_centroid_at(i, v, r, in + 2 * r.n_vec, y.data());
                    }
                    for (int h = 1; h < r.D; h <<= 1) {
                        for (int pp = 0; pp < r.D / 2; pp++) {
                            kc_fwht_pair(y.data(), pp, h);
                        }
                    }
                }
                for (int i = 0; i < r.D; i++) {
                    kc_rotq_out_at(i, v, r, y.data(), n16, inv_d, dst, f16, rs, cs);
                }
            }
        }
    }
    return kc_flags_status(&s, &k, 1);
}

static int be_encode(int type, int kind, const DevBuf & src, int src_type, int64_t rs, int64_t cs, int64_t T, int64_t H,
                     int64_t D, const kvg_codec_params * p, DevBuf & dst, size_t dst_bytes) {
    if (g_emulate) {
        return emu_encode(type, kind, src.p, src_type, rs, cs, T, H, D, p, dst.p, dst_bytes);
    }
    size_t written = 0;
    return kvg_cuda_encode(g_ctx, type, kind, src.p, src_type, rs, cs, T, H, D, p, dst.p, dst_bytes, &written);
}

static int be_decode(int type, int kind, const DevBuf & src, size_t src_bytes, int64_t T, int64_t H, int64_t D,
                     const kvg_codec_params * p, DevBuf & dst, int dst_type, int64_t rs, int64_t cs) {
    if (g_emulate) {
        return emu_decode(type, kind, src.p, src_bytes, T, H, D, p, dst.p, dst_type, rs, cs);
    }
    return kvg_cuda_decode(g_ctx, type, kind, src.p, src_bytes, T, H, D, p, dst.p, dst_type, rs, cs);
}

// ---- codec cases ---------------------------------------------------------------------------

static const char * st_name(int st) {
    switch (st) {
        case KVG_OK:                return "KVG_OK";
        case KVG_ERR_INVALID_ARG:   return "INVALID_ARG";
        case KVG_ERR_UNKNOWN_CODEC: return "UNKNOWN_CODEC";
        case KVG_ERR_SHAPE:         return "SHAPE";
        case KVG_ERR_BUFFER_SIZE:   return "BUFFER_SIZE";
        case KVG_ERR_NONFINITE:     return "NONFINITE";
        case KVG_ERR_CORRUPT:       return "CORRUPT";
        case KVG_ERR_NO_MEMORY:     return "NO_MEMORY";
        case KVG_ERR_RANGE:         return "RANGE";
        case KVG_ERR_UNSUPPORTED:   return "UNSUPPORTED";
        default:                    return "?";
    }
}

struct Case {
    int              type, kind;
    int64_t          T, H, D;
    kvg_codec_params p;
    std::string      where() const {
        char buf[160];
        snprintf(buf, sizeof(buf), "%s kind=%s T=%lld H=%lld D=%lld G=%d", kvg_codec_name(type), kind ? "V" : "K",
                 (long long) T, (long long) H, (long long) D, (int) p.group_size);
        return buf;
    }
    int64_t C() const { return H * D; }
    int64_t N() const { return T * H * D; }
};

// What byte `off` of a block is, for a mismatch report.
static std::string byte_place(const Case & c, size_t off) {
    char buf[128];
    int  bits = 0;
    kvg_codec_bits(c.type, &bits);
    if (c.type == KVG_CODEC_F16) {
        snprintf(buf, sizeof(buf), "value %zu (token %lld)", off / 2, (long long) (off / 2 / c.C()));
    } else if (c.type <= KVG_CODEC_KIVI8) {
        const int64_t G        = c.p.group_size;
        const int64_t n_groups = c.kind == KVG_KIND_K ? ((c.T + G - 1) / G) * c.C() : c.T * ((c.C() + G - 1) / G);
        if ((int64_t) off < 4 * n_groups) {
            snprintf(buf, sizeof(buf), "group %lld's %s", (long long) (off / 4), (off % 4) < 2 ? "min" : "scale");
        } else {
            const int64_t e = (int64_t) (off - 4 * n_groups) * 8 / bits;
            snprintf(buf, sizeof(buf), "codes near value %lld (token %lld, channel %lld)", (long long) e,
                     (long long) (e / c.C()), (long long) (e % c.C()));
        }
    } else {
        const int64_t nv = c.T * c.H;
        if ((int64_t) off < 2 * nv) {
            snprintf(buf, sizeof(buf), "norm of vector %lld (token %lld, head %lld)", (long long) (off / 2),
                     (long long) (off / 2 / c.H), (long long) (off / 2 % c.H));
        } else {
            const int64_t v = (int64_t) (off - 2 * nv) / (c.D * bits / 8);
            snprintf(buf, sizeof(buf), "codes of vector %lld (token %lld, head %lld)", (long long) v,
                     (long long) (v / c.H), (long long) (v % c.H));
        }
    }
    return buf;
}

static void compare_bytes(const Case & c, const char * what, const std::vector<uint8_t> & want,
                          const std::vector<uint8_t> & got) {
    g_checks++;
    size_t first = SIZE_MAX, n_diff = 0;
    for (size_t i = 0; i < want.size(); i++) {
        if (want[i] != got[i]) {
            n_diff++;
            first = first == SIZE_MAX ? i : first;
        }
    }
    if (n_diff) {
        mismatch("%s %s: %zu of %zu bytes differ, first at byte %zu (%s): reference 0x%02x, cuda 0x%02x",
                 c.where().c_str(), what, n_diff, want.size(), first, byte_place(c, first).c_str(), want[first],
                 got[first]);
    }
}

static void expect_status(const std::string & where, const char * what, int want, int got) {
    g_checks++;
    if (want != got) {
        mismatch("%s %s: status %s, the reference %s (%s)", where.c_str(), what, st_name(got), st_name(want),
                 kvg_last_error());
    }
}

// The reference: kvg_encode at the scalar level (the oracle). Also checks this build's SIMD level
// agrees, as the library promises (a failure there is the C library's, reported as such).
static int ref_encode(const Case & c, const float * x, std::vector<uint8_t> & out) {
    size_t size = 0;
    int    st   = kvg_encoded_size(c.type, c.kind, c.T, c.H, c.D, &c.p, &size);
    out.assign(size, 0);
    if (st != KVG_OK) {
        return st;
    }
    kvg_set_simd_level(KVG_SIMD_SCALAR);
    st = kvg_encode(c.type, c.kind, x, (size_t) c.N(), c.T, c.H, c.D, &c.p, out.data(), size, NULL);
    kvg_set_simd_level(kvg_simd_max_level());
    if (kvg_simd_level() != KVG_SIMD_SCALAR) {
        std::vector<uint8_t> simd(size, 0);
        const int st2 = kvg_encode(c.type, c.kind, x, (size_t) c.N(), c.T, c.H, c.D, &c.p, simd.data(), size, NULL);
        g_checks++;
        if (st2 != st || (st == KVG_OK && simd != out)) {
            mismatch("%s: the C library's SIMD encode differs from its scalar reference (not a CUDA fault)",
                     c.where().c_str());
        }
    }
    return st;
}

// Encodes x with the GPU in one layout and compares with the reference's bytes and status.
static void check_encode_layout(const Case & c, const char * layout, const std::vector<float> & x, int use_f16,
                                int64_t rs, int64_t cs, int ref_st, const std::vector<uint8_t> & ref) {
    const int64_t T = c.T, C = c.C();
    // the source in that layout
    const int64_t         n_src = (T - 1) * rs + (C - 1) * cs + 1;
    std::vector<float>    xs((size_t) n_src, 12345.0f);
    std::vector<uint16_t> xh((size_t) n_src, host_f16(12345.0f));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t ch = 0; ch < C; ch++) {
            const float v = x[(size_t) (t * C + ch)];
            if (use_f16) {
                xh[(size_t) (t * rs + ch * cs)] = host_f16(v);
            } else {
                xs[(size_t) (t * rs + ch * cs)] = v;
            }
        }
    }
    const size_t esz = use_f16 ? 2 : 4;
    DevBuf       src((size_t) n_src * esz);
    src.put(use_f16 ? (const void *) xh.data() : (const void *) xs.data(), (size_t) n_src * esz);
    const size_t size = ref.size();
    DevBuf       dst(size + 64);
    dst.fill(0xCD);
    const int st = be_encode(c.type, c.kind, src, use_f16 ? KVG_CUDA_F16 : KVG_CUDA_F32, rs, cs, c.T, c.H, c.D, &c.p,
                             dst, size + 64);
    const std::string where = c.where() + " " + layout;
    expect_status(where, "encode", ref_st, st);
    if (st != KVG_OK || ref_st != KVG_OK) {
        return;
    }
    std::vector<uint8_t> got(size + 64);
    dst.get(got.data(), size + 64);
    std::vector<uint8_t> block(got.begin(), got.begin() + (long) size);
    compare_bytes(c, (std::string("encode ") + layout).c_str(), ref, block);
    g_checks++;
    for (size_t i = size; i < size + 64; i++) {
        if (got[i] != 0xCD) {
            mismatch("%s: encode wrote byte %zu past the block's %zu", where.c_str(), i, size);
            break;
        }
    }
}

// Decodes the reference's bytes with the GPU into one layout and compares with kvg_decode.
static void check_decode_layout(const Case & c, const char * layout, const std::vector<uint8_t> & bytes,
                                const std::vector<float> & want, int to_f16, int64_t rs, int64_t cs) {
    const int64_t T = c.T, C = c.C();
    const int64_t n_dst = (T - 1) * rs + (C - 1) * cs + 1;
    const size_t  esz   = to_f16 ? 2 : 4;
    DevBuf        src(bytes.size());
    src.put(bytes.data(), bytes.size());
    DevBuf dst((size_t) n_dst * esz);
    dst.fill(0x7F);
    const int         st    = be_decode(c.type, c.kind, src, bytes.size(), c.T, c.H, c.D, &c.p, dst,
                                        to_f16 ? KVG_CUDA_F16 : KVG_CUDA_F32, rs, cs);
    const std::string where = c.where() + " decode " + layout;
    expect_status(where, "decode", KVG_OK, st);
    if (st != KVG_OK) {
        return;
    }
    std::vector<uint8_t> raw((size_t) n_dst * esz);
    dst.get(raw.data(), raw.size());
    std::vector<char> hit((size_t) n_dst, 0);
    long              n_bad = 0;
    g_checks++;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t ch = 0; ch < C; ch++) {
            const int64_t idx = t * rs + ch * cs;
            hit[(size_t) idx] = 1;
            const float w     = want[(size_t) (t * C + ch)];
            if (to_f16) {
                uint16_t g;
                memcpy(&g, &raw[(size_t) idx * 2], 2);
                if (g != host_f16(w) && n_bad++ == 0) {
                    mismatch(
                        "%s: token %lld channel %lld: f16 0x%04x (%g), the reference's float %.9g rounds to 0x%04x",
                        where.c_str(), (long long) t, (long long) ch, g, (double) host_f32(g), (double) w, host_f16(w));
                }
            } else {
                float g;
                memcpy(&g, &raw[(size_t) idx * 4], 4);
                if (fbits(g) != fbits(w) && n_bad++ == 0) {
                    mismatch("%s: token %lld channel %lld: %.9g (0x%08x), the reference %.9g (0x%08x)", where.c_str(),
                             (long long) t, (long long) ch, (double) g, fbits(g), (double) w, fbits(w));
                }
            }
        }
    }
    if (n_bad > 1) {
        mismatch("%s: %ld of %lld values differ in all", where.c_str(), n_bad, (long long) (T * C));
    }
    for (int64_t i = 0; i < n_dst; i++) {
        if (!hit[(size_t) i]) {
            for (size_t b = 0; b < esz; b++) {
                if (raw[(size_t) i * esz + b] != 0x7F) {
                    mismatch("%s: wrote element %lld, a gap of the layout", where.c_str(), (long long) i);
                    i = n_dst;
                    break;
                }
            }
        }
    }
}

// A block with one norm, min or scale no encoder writes: CORRUPT from both, and dst unchanged.
static void check_corrupt(const Case & c, std::vector<uint8_t> bytes) {
    if (c.type == KVG_CODEC_F16) {
        kc_put_u16(bytes.data(), 0x7C00);  // +Inf
    } else if (c.type <= KVG_CODEC_KIVI8) {
        kc_put_u16(bytes.data() + 2, 0x8001);  // a negative scale
    } else {
        kc_put_u16(bytes.data() + 2 * (c.T * c.H - 1), 0xFC00);  // -Inf norm, last vector
    }
    std::vector<float> cpu((size_t) c.N());
    const int cst = kvg_decode(c.type, c.kind, bytes.data(), bytes.size(), c.T, c.H, c.D, &c.p, cpu.data(), cpu.size());
    DevBuf    src(bytes.size());
    src.put(bytes.data(), bytes.size());
    DevBuf dst((size_t) c.N() * 4);
    dst.fill(0x7F);
    const int st = be_decode(c.type, c.kind, src, bytes.size(), c.T, c.H, c.D, &c.p, dst, KVG_CUDA_F32, c.C(), 1);
    expect_status(c.where() + " corrupt block", "decode", cst, st);
    std::vector<uint8_t> raw((size_t) c.N() * 4);
    dst.get(raw.data(), raw.size());
    g_checks++;
    for (size_t i = 0; i < raw.size(); i++) {
        if (raw[i] != 0x7F) {
            mismatch("%s corrupt block: decode wrote dst (byte %zu) though it failed", c.where().c_str(), i);
            break;
        }
    }
    if (!g_emulate) {
        const int cst2 = kvg_cuda_check(g_ctx, c.type, c.kind, src.p, bytes.size(), c.T, c.H, c.D, &c.p);
        expect_status(c.where() + " corrupt block", "kvg_cuda_check", KVG_ERR_CORRUPT, cst2);
    }
}

static void run_case(const Case & c, Rng & rng) {
    const std::vector<float> x = kv_rows(rng, c.T, c.C(), c.D);
    std::vector<uint8_t>     ref, ref_h;
    const int                st = ref_encode(c, x.data(), ref);
    // f16 rows: the reference encodes their exact f32 widening
    std::vector<float> xw(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        xw[i] = host_f32(host_f16(x[i]));
    }
    const int st_h = ref_encode(c, xw.data(), ref_h);

    const int64_t T = c.T, C = c.C();
    check_encode_layout(c, "f32", x, 0, C, 1, st, ref);
    check_encode_layout(c, "f16", xw, 1, C, 1, st_h, ref_h);
    check_encode_layout(c, "f32 padded rows", x, 0, C + 3, 1, st, ref);
    check_encode_layout(c, "f32 transposed", x, 0, 1, T, st, ref);
    if (st != KVG_OK) {
        mismatch("%s: the reference refused the case (%s: %s)", c.where().c_str(), st_name(st), kvg_last_error());
        return;
    }
    if (!g_emulate) {
        DevBuf blk(ref.size());
        blk.put(ref.data(), ref.size());
        expect_status(c.where(), "kvg_cuda_check", KVG_OK,
                      kvg_cuda_check(g_ctx, c.type, c.kind, blk.p, ref.size(), c.T, c.H, c.D, &c.p));
    }
    std::vector<float> dec((size_t) c.N());
    kvg_set_simd_level(KVG_SIMD_SCALAR);
    const int dst_ = kvg_decode(c.type, c.kind, ref.data(), ref.size(), c.T, c.H, c.D, &c.p, dec.data(), dec.size());
    kvg_set_simd_level(kvg_simd_max_level());
    if (dst_ != KVG_OK) {
        mismatch("%s: the reference cannot decode its own block (%s)", c.where().c_str(), kvg_last_error());
        return;
    }
    check_decode_layout(c, "f32", ref, dec, 0, C, 1);
    check_decode_layout(c, "f16", ref, dec, 1, C, 1);
    check_decode_layout(c, "f32 transposed", ref, dec, 0, 1, T);
    check_decode_layout(c, "f16 padded rows", ref, dec, 1, C + 5, 1);
    check_corrupt(c, ref);
}

// Input the reference refuses, refused the same way.
static void run_refusals(Rng & rng) {
    struct R {
        int          type;
        int          kind;
        int64_t      D;
        const char * what;
    };
    const R rs[] = {
        { KVG_CODEC_ROTQ3, KVG_KIND_K, 64, "nan" },        { KVG_CODEC_KIVI2, KVG_KIND_V, 64, "nan" },
        { KVG_CODEC_KIVI4, KVG_KIND_K, 64, "inf" },        { KVG_CODEC_F16, KVG_KIND_K, 64, "nan" },
        { KVG_CODEC_ROTQ2, KVG_KIND_V, 128, "big norm" },  { KVG_CODEC_KIVI2, KVG_KIND_K, 64, "big value" },
        { KVG_CODEC_KIVI4, KVG_KIND_V, 64, "big value" },  { KVG_CODEC_F16, KVG_KIND_V, 64, "big value" },
        { KVG_CODEC_KIVI8, KVG_KIND_V, 64, "edge 65504" }, { KVG_CODEC_ROTQ4, KVG_KIND_K, 64, "edge 65504" },
    };
    for (const R & r : rs) {
        Case c;
        c.type = r.type;
        c.kind = r.kind;
        c.T    = 9;
        c.H    = 2;
        c.D    = r.D;
        kvg_codec_default_params(&c.p);
        std::vector<float> x  = kv_rows(rng, c.T, c.C(), c.D);
        const int64_t      at = 5 * c.C() + 7;
        if (!strcmp(r.what, "nan")) {
            x[(size_t) at] = NAN;
        } else if (!strcmp(r.what, "inf")) {
            x[(size_t) at] = -INFINITY;
        } else if (!strcmp(r.what, "big norm")) {
            for (int64_t i = 0; i < c.D; i++) {
                x[(size_t) (6 * c.C() + i)] = 9000.0f;  // norm 9000 * sqrt(128) > 65504
            }
        } else if (!strcmp(r.what, "big value")) {
            x[(size_t) at] = 70000.0f;
        } else {
            x[(size_t) at]     = 65504.0f;
            x[(size_t) at + 1] = -65504.0f;
        }
        std::vector<uint8_t> ref;
        const int            st = ref_encode(c, x.data(), ref);
        check_encode_layout(c, r.what, x, 0, c.C(), 1, st, ref);
        check_encode_layout(c, (std::string(r.what) + " transposed").c_str(), x, 0, 1, c.T, st, ref);
        if (!strcmp(r.what, "nan") || !strcmp(r.what, "inf")) {  // from f16 rows too
            check_encode_layout(c, (std::string(r.what) + " f16").c_str(), x, 1, c.C(), 1, st, ref);
        }
    }
}

// Arguments the API refuses before anything runs (no device needed for most).
static void run_api() {
    char msg[300];
    g_checks++;
    if (kvg_cuda_codec_supported(KVG_CODEC_TCQ3, 128) != KVG_ERR_UNSUPPORTED || !strstr(kvg_last_error(), "rotq2") ||
        !strstr(kvg_last_error(), "kivi4")) {
        mismatch("kvg_cuda_codec_supported(tcq3): want UNSUPPORTED naming the GPU's codecs, got '%s'",
                 kvg_last_error());
    }
    const int cases[][3] = {
        { KVG_CODEC_ROTQ3, 4, KVG_ERR_SHAPE },
        { KVG_CODEC_ROTQ3, 96, KVG_ERR_SHAPE },
        { KVG_CODEC_ROTQ3, 8, KVG_OK },
        { KVG_CODEC_KIVI2, 7, KVG_OK },
        { KVG_CODEC_PQ2, 64, KVG_ERR_UNSUPPORTED },
        { KVG_CODEC_WFQ3, 64, KVG_ERR_UNSUPPORTED },
        { 999, 64, KVG_ERR_UNKNOWN_CODEC },
    };
    for (const auto & cs : cases) {
        const int st = kvg_cuda_codec_supported(cs[0], cs[1]);
        snprintf(msg, sizeof(msg), "kvg_cuda_codec_supported(%d, %d)", cs[0], cs[1]);
        expect_status(msg, "", cs[2], st);
    }
    if (g_emulate) {
        int n = -1;
        g_checks++;
        if (kvg_cuda_device_count(&n) != KVG_OK || n < 0) {
            mismatch("kvg_cuda_device_count: %s", kvg_last_error());
        }
        kvg_cuda_ctx * ctx = NULL;
        const int      st  = kvg_cuda_ctx_init(0, NULL, &ctx);
        g_checks++;
        if (n == 0 && (st != KVG_ERR_UNSUPPORTED || ctx != NULL)) {
            mismatch("kvg_cuda_ctx_init without a device: status %s, want UNSUPPORTED and no context", st_name(st));
        }
        kvg_cuda_ctx_free(ctx);
        void * p = NULL;
        expect_status("kvg_cuda_malloc(NULL ctx)", "", KVG_ERR_INVALID_ARG, kvg_cuda_malloc(NULL, 16, &p));
        expect_status(
            "kvg_cuda_encode(NULL ctx)", "", KVG_ERR_INVALID_ARG,
            kvg_cuda_encode(NULL, KVG_CODEC_ROTQ2, 0, &n, KVG_CUDA_F32, 64, 1, 1, 1, 64, NULL, &n, 100, NULL));
        return;
    }
    // with a device: refusals of kvg_cuda_encode / decode / attend
    DevBuf src(64 * 4 * 4), dst(4096);
    size_t w = 0;
    expect_status(
        "encode pq2", "", KVG_ERR_UNSUPPORTED,
        kvg_cuda_encode(g_ctx, KVG_CODEC_PQ2, 0, src.p, KVG_CUDA_F32, 64, 1, 4, 1, 64, NULL, dst.p, 4096, &w));
    expect_status(
        "encode rotq3 d=4", "", KVG_ERR_SHAPE,
        kvg_cuda_encode(g_ctx, KVG_CODEC_ROTQ3, 0, src.p, KVG_CUDA_F32, 4, 1, 4, 1, 4, NULL, dst.p, 4096, &w));
    expect_status(
        "encode rotq3 small dst", "", KVG_ERR_BUFFER_SIZE,
        kvg_cuda_encode(g_ctx, KVG_CODEC_ROTQ3, 0, src.p, KVG_CUDA_F32, 64, 1, 4, 1, 64, NULL, dst.p, 10, &w));
    expect_status(
        "encode NULL src", "", KVG_ERR_INVALID_ARG,
        kvg_cuda_encode(g_ctx, KVG_CODEC_ROTQ3, 0, NULL, KVG_CUDA_F32, 64, 1, 4, 1, 64, NULL, dst.p, 4096, &w));
    expect_status("encode src_type 7", "", KVG_ERR_INVALID_ARG,
                  kvg_cuda_encode(g_ctx, KVG_CODEC_ROTQ3, 0, src.p, 7, 64, 1, 4, 1, 64, NULL, dst.p, 4096, &w));
    expect_status(
        "encode stride 0", "", KVG_ERR_INVALID_ARG,
        kvg_cuda_encode(g_ctx, KVG_CODEC_ROTQ3, 0, src.p, KVG_CUDA_F32, 0, 1, 4, 1, 64, NULL, dst.p, 4096, &w));
    expect_status("decode wrong size", "", KVG_ERR_BUFFER_SIZE,
                  kvg_cuda_decode(g_ctx, KVG_CODEC_KIVI2, 0, dst.p, 100, 4, 1, 64, NULL, src.p, KVG_CUDA_F32, 64, 1));
    void * big = NULL;
    expect_status("malloc 1 PiB", "", KVG_ERR_NO_MEMORY, kvg_cuda_malloc(g_ctx, (size_t) 1 << 50, &big));
    g_checks++;
    if (kvg_cuda_sync(g_ctx) != KVG_OK) {
        mismatch("kvg_cuda_sync after refusals: %s", kvg_last_error());
    }
}

// ---- attention (GPU) -----------------------------------------------------------------------

struct AttnCase {
    int     k_codec, v_codec, n_head_kv, n_head, n_tokens;
    int64_t dk, dv, n_rows;
    float   softcap;
    int     group = 0;  // kivi's group size; 0: KVG_DEFAULT_GROUP_SIZE
};

// float64 softmax attention over decoded rows: m, l, out per query (caller order).
static void attn_reference(const AttnCase & a, const std::vector<float> & q, const std::vector<float> & k,
                           const std::vector<float> & v, int64_t r0, int64_t r1, float scale, std::vector<double> & m,
                           std::vector<double> & l, std::vector<double> & out) {
    const int64_t n_q = (int64_t) a.n_tokens * a.n_head, gqa = a.n_head / a.n_head_kv;
    m.assign((size_t) n_q, -INFINITY);
    l.assign((size_t) n_q, 0.0);
    out.assign((size_t) (n_q * a.dv), 0.0);
    std::vector<double> s((size_t) (r1 - r0));
    for (int64_t j = 0; j < n_q; j++) {
        const int64_t h = j % a.n_head, hk = h / gqa;
        for (int64_t r = r0; r < r1; r++) {
            double d = 0.0;
            for (int64_t i = 0; i < a.dk; i++) {
                d += (double) q[(size_t) (j * a.dk + i)] * k[(size_t) ((r * a.n_head_kv + hk) * a.dk + i)];
            }
            d *= scale;
            if (a.softcap > 0.0f) {
                d = a.softcap * tanh(d / a.softcap);
            }
            s[(size_t) (r - r0)] = d;
            m[(size_t) j]        = d > m[(size_t) j] ? d : m[(size_t) j];
        }
        for (int64_t r = r0; r < r1; r++) {
            const double p = exp(s[(size_t) (r - r0)] - m[(size_t) j]);
            l[(size_t) j] += p;
            for (int64_t i = 0; i < a.dv; i++) {
                out[(size_t) (j * a.dv + i)] += p * v[(size_t) ((r * a.n_head_kv + hk) * a.dv + i)];
            }
        }
        for (int64_t i = 0; i < a.dv; i++) {
            out[(size_t) (j * a.dv + i)] /= l[(size_t) j];
        }
    }
}

// The bounds of attn_compare and of the GPU against the CPU's fused path: the scalar kernels' by
// default; the tensor-core kernel's (f16 queries, codebook values and weights) in run_attend_prefill.
struct AttnTol {
    double m_abs, m_rel, l_rel, out;
};
static const AttnTol k_tol_exact = { 1e-5, 1e-5, 1e-4, 5e-5 };
static const AttnTol k_tol_f16   = { 5e-3, 5e-3, 2e-2, 4e-3 };
static AttnTol       g_tol       = k_tol_exact;

static void attn_compare(const char * who, const std::string & where, const std::vector<float> & m,
                         const std::vector<float> & l, const std::vector<float> & acc,
                         const std::vector<double> & m_ref, const std::vector<double> & l_ref,
                         const std::vector<double> & out_ref, int64_t dv, double vmax, double * worst) {
    g_checks++;
    double err = 0.0;
    for (size_t j = 0; j < m.size(); j++) {
        if (!(fabs(m[j] - m_ref[j]) <= g_tol.m_abs + g_tol.m_rel * fabs(m_ref[j]))) {
            mismatch("%s %s: m[%zu] = %.9g, reference %.9g", who, where.c_str(), j, (double) m[j], m_ref[j]);
            return;
        }
        if (!(fabs(l[j] - l_ref[j]) <= g_tol.l_rel * fabs(l_ref[j]))) {
            mismatch("%s %s: l[%zu] = %.9g, reference %.9g", who, where.c_str(), j, (double) l[j], l_ref[j]);
            return;
        }
        for (int64_t i = 0; i < dv; i++) {
            const double o = (double) acc[j * (size_t) dv + (size_t) i] / l[j];
            const double e = fabs(o - out_ref[j * (size_t) dv + (size_t) i]);
            err            = e > err || e != e ? e : err;
        }
    }
    if (worst) {
        *worst = err / vmax > *worst ? err / vmax : *worst;
    }
    if (!(err <= g_tol.out * vmax)) {
        mismatch("%s %s: output error %.3g > %.3g * max|v| (%.3g)", who, where.c_str(), err, g_tol.out, vmax);
    }
}

// A one-layer store (the CPU path's view) holding a.n_rows random rows of a's codecs in one warm
// block each side: kx, vx the rows, kb, vb the blocks' bytes, kd, vd the rows decoded, vmax the
// largest |v| decoded. The caller frees the store.
static kvg_store * coded_store(const AttnCase & a, Rng & rng, std::vector<float> & kx, std::vector<float> & vx,
                               std::vector<uint8_t> & kb, std::vector<uint8_t> & vb, std::vector<float> & kd,
                               std::vector<float> & vd, double * vmax) {
    const int64_t    R = a.n_rows, Hk = a.n_head_kv;
    kvg_store_params sp;
    kvg_store_default_params(&sp);
    sp.n_layer    = 1;
    sp.n_head_kv  = a.n_head_kv;
    sp.head_dim_k = (int32_t) a.dk;
    sp.head_dim_v = (int32_t) a.dv;
    if (a.group > 0) {
        sp.codec.group_size = a.group;
    }
    kvg_store * store = NULL;
    if (kvg_store_init(&sp, &store) != KVG_OK) {
        die("kvg_store_init: %s", kvg_last_error());
    }
    kx = kv_rows(rng, R, Hk * a.dk, a.dk);
    vx = kv_rows(rng, R, Hk * a.dv, a.dv);
    if (kvg_store_append(store, 0, KVG_KIND_K, KVG_TIER_WARM, a.k_codec, kx.data(), kx.size(), R) != KVG_OK ||
        kvg_store_append(store, 0, KVG_KIND_V, KVG_TIER_WARM, a.v_codec, vx.data(), vx.size(), R) != KVG_OK) {
        die("kvg_store_append: %s", kvg_last_error());
    }
    for (int kind = 0; kind < 2; kind++) {
        kvg_block_info info;
        kvg_store_block(store, 0, kind, 0, &info, NULL, 0);
        std::vector<uint8_t> & b = kind ? vb : kb;
        b.resize(info.n_bytes);
        kvg_store_block(store, 0, kind, 0, &info, b.data(), b.size());
    }
    kd.assign((size_t) (R * Hk * a.dk), 0.0f);
    vd.assign((size_t) (R * Hk * a.dv), 0.0f);
    kvg_store_decode(store, 0, KVG_KIND_K, 0, R, kd.data(), kd.size());
    kvg_store_decode(store, 0, KVG_KIND_V, 0, R, vd.data(), vd.size());
    *vmax = 0.0;
    for (float x : vd) {
        *vmax = fabs(x) > *vmax ? fabs(x) : *vmax;
    }
    return store;
}

static void run_attend_case(const AttnCase & a, Rng & rng, double * worst_gpu, double * worst_cpu_gpu) {
    char buf[256];
    snprintf(buf, sizeof(buf), "attend K %s / V %s dk=%lld dv=%lld heads=%d/%d T=%d rows=%lld softcap=%g group=%d",
             kvg_codec_name(a.k_codec), kvg_codec_name(a.v_codec), (long long) a.dk, (long long) a.dv, a.n_head_kv,
             a.n_head, a.n_tokens, (long long) a.n_rows, (double) a.softcap, a.group);
    const std::string where = buf;
    const int64_t     R = a.n_rows, Hk = a.n_head_kv;
    // a store holding the rows, as the CPU path sees them
    std::vector<float>   kx, vx, kd, vd;
    std::vector<uint8_t> kb, vb;
    double               vmax  = 0.0;
    kvg_store *          store = coded_store(a, rng, kx, vx, kb, vb, kd, vd, &vmax);
    kvg_codec_params     vcp;  // the store's, for V's block of its own below
    kvg_codec_default_params(&vcp);
    if (a.group > 0) {
        vcp.group_size = a.group;
    }

    const int64_t      n_q = (int64_t) a.n_tokens * a.n_head;
    std::vector<float> q((size_t) (n_q * a.dk));
    for (auto & x : q) {
        x = 2.0f * rng.gauss();
    }
    const float scale = 1.0f / sqrtf((float) a.dk);
    // rows [r0, r1): the whole block, or a middle part
    const int64_t r0 = R > 8 ? R / 7 : 0, r1 = R > 8 ? R - R / 5 : R;

    std::vector<double> m_ref, l_ref, out_ref;
    attn_reference(a, q, kd, vd, r0, r1, scale, m_ref, l_ref, out_ref);

    // the CPU's fused path
    std::vector<float> m((size_t) n_q, -INFINITY), l((size_t) n_q, 0.0f), acc((size_t) (n_q * a.dv), 0.0f);
    if (kvg_store_hook_attend_capped(store, 0, r0, r1, q.data(), a.n_tokens, a.n_head, scale, a.softcap, m.data(),
                                     l.data(), acc.data()) != KVG_OK) {
        die("kvg_store_hook_attend_capped: %s", kvg_last_error());
    }
    double cpu_err = 0.0;
    attn_compare("cpu", where, m, l, acc, m_ref, l_ref, out_ref, a.dv, vmax, &cpu_err);

    // the GPU: one call over [r0, r1), then two calls folding into one state, with V read from a
    // block that holds only rows [r0, r1) (different row offsets for K and V)
    DevBuf dk_(kb.size()), dv_(vb.size()), dq(q.size() * 4), dm(m.size() * 4), dl(l.size() * 4), dacc(acc.size() * 4);
    dk_.put(kb.data(), kb.size());
    dv_.put(vb.data(), vb.size());
    dq.put(q.data(), q.size() * 4);
    for (int variant = 0; variant < 2; variant++) {
        std::vector<float> m0((size_t) n_q, -INFINITY), z((size_t) (n_q * a.dv), 0.0f);
        dm.put(m0.data(), m0.size() * 4);
        std::vector<float> l0((size_t) n_q, 0.0f);
        dl.put(l0.data(), l0.size() * 4);
        dacc.put(z.data(), z.size() * 4);
        kvg_cuda_attend_args args;
        memset(&args, 0, sizeof(args));
        args.k          = { a.k_codec, dk_.p, kb.size(), R };
        args.v          = { a.v_codec, dv_.p, vb.size(), R };
        args.n_head_kv  = a.n_head_kv;
        args.head_dim_k = a.dk;
        args.head_dim_v = a.dv;
        args.seed       = KVG_DEFAULT_SEED;
        args.group_size = a.group;
        args.q_dev      = (const float *) dq.p;
        args.n_tokens   = a.n_tokens;
        args.n_head     = a.n_head;
        args.scale      = scale;
        args.softcap    = a.softcap;
        args.m_dev      = (float *) dm.p;
        args.l_dev      = (float *) dl.p;
        args.acc_dev    = (float *) dacc.p;
        std::string w   = where;
        int         st  = KVG_OK;
        if (variant == 0) {
            args.k_row0 = r0;
            args.v_row0 = r0;
            args.n_rows = r1 - r0;
            st          = kvg_cuda_attend(g_attend_ctx, &args);
            w += " one call";
        } else {
            // V from its own block of rows [r0, r1), encoded by the GPU itself
            std::vector<float> vpart(vx.begin() + (long) (r0 * Hk * a.dv), vx.begin() + (long) (r1 * Hk * a.dv));
            size_t             vsz = 0;
            kvg_codec_params   vp  = vcp;
            kvg_encoded_size(a.v_codec, KVG_KIND_V, r1 - r0, Hk, a.dv, &vp, &vsz);
            DevBuf vsrc(vpart.size() * 4), vblk(vsz);
            vsrc.put(vpart.data(), vpart.size() * 4);
            st = kvg_cuda_encode(g_ctx, a.v_codec, KVG_KIND_V, vsrc.p, KVG_CUDA_F32, Hk * a.dv, 1, r1 - r0, Hk, a.dv,
                                 &vp, vblk.p, vsz, NULL);
            args.v            = { a.v_codec, vblk.p, vsz, r1 - r0 };
            const int64_t mid = r0 + (r1 - r0) / 3;
            if (st == KVG_OK) {
                args.k_row0 = r0;
                args.v_row0 = 0;
                args.n_rows = mid - r0;
                st          = kvg_cuda_attend(g_attend_ctx, &args);
            }
            if (st == KVG_OK) {
                args.k_row0 = mid;
                args.v_row0 = mid - r0;
                args.n_rows = r1 - mid;
                st          = kvg_cuda_attend(g_attend_ctx, &args);
            }
            if (st == KVG_OK) {
                st = kvg_cuda_sync(g_ctx);  // before vblk goes
            }
            w += " two calls, V block of its own";
        }
        if (st == KVG_OK) {
            st = kvg_cuda_sync(g_ctx);
        }
        expect_status(w, "kvg_cuda_attend", KVG_OK, st);
        if (st != KVG_OK) {
            continue;
        }
        std::vector<float> gm((size_t) n_q), gl((size_t) n_q), gacc((size_t) (n_q * a.dv));
        dm.get(gm.data(), gm.size() * 4);
        dl.get(gl.data(), gl.size() * 4);
        dacc.get(gacc.data(), gacc.size() * 4);
        attn_compare("cuda", w, gm, gl, gacc, m_ref, l_ref, out_ref, a.dv, vmax, worst_gpu);
        // and against the CPU's fused path, as tests/unit/test_attend.py compares SIMD with scalar
        double e = 0.0;
        for (size_t j = 0; j < gm.size(); j++) {
            for (int64_t i = 0; i < a.dv; i++) {
                const double d = fabs((double) gacc[j * (size_t) a.dv + (size_t) i] / gl[j] -
                                      (double) acc[j * (size_t) a.dv + (size_t) i] / l[j]);
                e              = d > e || d != d ? d : e;
            }
        }
        *worst_cpu_gpu = e / vmax > *worst_cpu_gpu ? e / vmax : *worst_cpu_gpu;
        g_checks++;
        if (!(e <= g_tol.out * vmax)) {
            mismatch("cuda vs cpu %s: output differs by %.3g > %.3g * max|v|", w.c_str(), e, g_tol.out);
        }
    }
    kvg_store_free(store);
}

// Many queries a KV head (a prefill ubatch): the tensor-core kernel where the context takes it
// (f16 bounds), else the scalar kernels (their own bounds). Tiles of 64 queries, full and partial,
// head dims 64, 128 and 256, rotq1-4, soft-capping, chunks of 64 rows full and partial.
static void run_attend_prefill(const char * which, const AttnTol & tol) {
    Rng            rng(0x9ef111);
    const AttnCase cases[] = {
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2, 8, 24, 32, 128, 128, 700, 0.0f },   // 96 queries a KV head
        { KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ3, 2, 8, 40, 64, 64, 2000, 30.0f },    // 160: a last tile of 32
        { KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ4, 1, 4, 16, 256, 256, 300, 0.0f },    // 64: one tile
        { KVG_CODEC_ROTQ1, KVG_CODEC_ROTQ4, 4, 16, 20, 128, 128, 1500, 0.0f },  // rotq1 keys
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ4, 8, 32, 24, 64, 64, 4100, 50.0f },   // 96, many rows, capped
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2, 2, 6, 30, 128, 128, 37, 0.0f },     // 90, fewer rows than a chunk
        // kivi and mixed sources, a coordinate a thread: head dims 80 and 96 (kivi's), group 64,
        // rotq on one side only (rotated queries with plain values, and the reverse), f16 keys,
        // and head dim 112, which the tensor cores are not built for (the generic kernel)
        { KVG_CODEC_KIVI4, KVG_CODEC_KIVI2, 8, 24, 32, 128, 128, 700, 0.0f },
        { KVG_CODEC_KIVI2, KVG_CODEC_KIVI4, 2, 8, 40, 80, 80, 300, 30.0f },
        { KVG_CODEC_KIVI8, KVG_CODEC_KIVI8, 1, 4, 16, 96, 96, 500, 0.0f, 64 },
        { KVG_CODEC_ROTQ4, KVG_CODEC_KIVI2, 4, 16, 20, 64, 64, 900, 0.0f },
        { KVG_CODEC_KIVI4, KVG_CODEC_ROTQ3, 2, 6, 30, 128, 128, 250, 0.0f },
        { KVG_CODEC_F16, KVG_CODEC_ROTQ3, 2, 6, 30, 256, 256, 200, 50.0f },
        { KVG_CODEC_KIVI3, KVG_CODEC_KIVI3, 1, 4, 16, 112, 112, 200, 0.0f },
    };
    const AttnTol saved = g_tol;
    g_tol               = tol;
    double worst = 0.0, worst_cc = 0.0;
    int    n = 0;
    for (const AttnCase & a : cases) {
        if (g_quick && a.n_rows > 2000) {
            continue;
        }
        run_attend_case(a, rng, &worst, &worst_cc);
        n++;
    }
    g_tol = saved;
    printf("attend, many queries (%s): %d cases; worst output error %.3g of max|v| against float64, %.3g against the "
           "CPU's fused path (bound %.3g)\n",
           which, n, worst, worst_cc, tol.out);
}

static void run_attend(const char * which) {
    Rng           rng(0xa77e4d);
    const int     pairs[][2] = { { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2 },
                                 { KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ3 },
                                 { KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ4 },
                                 { KVG_CODEC_ROTQ1, KVG_CODEC_ROTQ4 } };
    const int64_t dims[][2]  = { { 64, 64 }, { 128, 128 }, { 256, 256 }, { 128, 64 } };
    const int     heads[][2] = { { 1, 1 }, { 2, 6 }, { 8, 24 }, { 4, 4 } };
    const int64_t rows[]     = { 1, 37, 263, 700, 4100 };
    double        worst = 0.0, worst_cc = 0.0;
    int           n = 0;
    for (int pi = 0; pi < 4; pi++) {
        for (int di = 0; di < 4; di++) {
            for (int hi = 0; hi < 4; hi++) {
                if (g_quick && (di + hi) % 2) {
                    continue;
                }
                AttnCase a;
                a.k_codec   = pairs[pi][0];
                a.v_codec   = pairs[pi][1];
                a.dk        = dims[di][0];
                a.dv        = dims[di][1];
                a.n_head_kv = heads[hi][0];
                a.n_head    = heads[hi][1];
                a.n_tokens  = (pi + hi) % 2 ? 3 : 1;
                a.n_rows    = rows[(pi + di + hi) % 5];
                a.softcap   = (di + hi) % 3 == 0 ? 30.0f : 0.0f;
                run_attend_case(a, rng, &worst, &worst_cc);
                n++;
            }
        }
    }
    // Shapes the grid above misses: many rows a warp (several chunks each, a part-filled last one),
    // 7 and 8 queries a KV head (tiles of 8, one padded), head dim 256 with 8 queries, 2 queries a
    // KV head (a tile of 4, padded), rotq3 values.
    const AttnCase extra[] = {
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2, 8, 24, 1, 128, 128, 30001, 0.0f },
        { KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ3, 2, 14, 1, 64, 64, 9001, 0.0f },
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ4, 1, 8, 1, 256, 256, 3000, 50.0f },
        { KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ3, 4, 32, 2, 128, 128, 5003, 0.0f },
        { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ3, 2, 4, 1, 64, 64, 1500, 0.0f },
        // kivi (head dims 64-320, groups of 32 and 64, a row and a few thousand), and the mixes a
        // calibrated plan may choose: rotq or f16 on one side, kivi or rotq on the other
        { KVG_CODEC_KIVI4, KVG_CODEC_KIVI2, 8, 24, 1, 128, 128, 700, 0.0f },
        { KVG_CODEC_KIVI2, KVG_CODEC_KIVI4, 2, 6, 1, 80, 80, 263, 30.0f },
        { KVG_CODEC_KIVI8, KVG_CODEC_KIVI8, 4, 4, 3, 96, 96, 1000, 0.0f, 64 },
        { KVG_CODEC_KIVI3, KVG_CODEC_KIVI3, 1, 1, 1, 64, 64, 37, 0.0f },
        { KVG_CODEC_KIVI4, KVG_CODEC_KIVI2, 1, 2, 1, 80, 80, 1, 0.0f },
        { KVG_CODEC_KIVI2, KVG_CODEC_KIVI2, 8, 32, 1, 112, 112, 2049, 0.0f, 64 },
        { KVG_CODEC_KIVI4, KVG_CODEC_KIVI4, 1, 8, 1, 320, 320, 100, 0.0f },
        { KVG_CODEC_ROTQ4, KVG_CODEC_KIVI2, 2, 14, 1, 128, 128, 1500, 0.0f },
        { KVG_CODEC_KIVI4, KVG_CODEC_ROTQ3, 4, 16, 2, 64, 64, 500, 0.0f },
        { KVG_CODEC_F16, KVG_CODEC_ROTQ2, 8, 24, 1, 128, 128, 300, 0.0f },
        { KVG_CODEC_ROTQ4, KVG_CODEC_F16, 1, 8, 1, 256, 256, 200, 50.0f },
        { KVG_CODEC_F16, KVG_CODEC_KIVI4, 2, 4, 1, 96, 64, 129, 0.0f },
    };
    for (const AttnCase & a : extra) {
        if (g_quick && a.n_rows > 10000) {
            continue;
        }
        run_attend_case(a, rng, &worst, &worst_cc);
        n++;
    }
    printf(
        "attend (%s): %d cases; worst output error %.3g of max|v| against float64 (bound 5e-5), %.3g against the CPU's "
        "fused path\n",
        which, n, worst, worst_cc);
}

// kvg_cuda_attend_pass where one call a part would not show it: a fresh state that starts as NaN
// (the pass must not read it), more slots than one combine merges (4,500 runs of a row each: the
// pass then merges in chunks, the later ones into the state), an empty run, a pass of no part (an
// empty state), and a part whose state is not the pass's (refused before anything is queued:
// the state keeps its bytes).
static void run_pass() {
    Rng      rng(0x9a55);
    AttnCase a;
    a.k_codec   = KVG_CODEC_ROTQ4;
    a.v_codec   = KVG_CODEC_ROTQ3;
    a.n_head_kv = 2;
    a.n_head    = 4;
    a.n_tokens  = 2;
    a.dk = a.dv            = 64;
    a.n_rows               = 4500;
    a.softcap              = 0.0f;
    const int64_t        R = a.n_rows, n_q = (int64_t) a.n_tokens * a.n_head;
    std::vector<float>   kx, vx, kd, vd;
    std::vector<uint8_t> kb, vb;
    double               vmax = 0.0;
    kvg_store_free(coded_store(a, rng, kx, vx, kb, vb, kd, vd, &vmax));
    std::vector<float> q((size_t) (n_q * a.dk));
    for (auto & x : q) {
        x = 2.0f * rng.gauss();
    }
    const float         scale = 1.0f / sqrtf((float) a.dk);
    std::vector<double> m_ref, l_ref, out_ref;
    attn_reference(a, q, kd, vd, 0, R, scale, m_ref, l_ref, out_ref);

    DevBuf dk_(kb.size()), dv_(vb.size()), dq(q.size() * 4), dm((size_t) n_q * 4), dl((size_t) n_q * 4),
        dacc((size_t) (n_q * a.dv) * 4);
    dk_.put(kb.data(), kb.size());
    dv_.put(vb.data(), vb.size());
    dq.put(q.data(), q.size() * 4);
    // a run of one row per part, and an empty one
    std::vector<kvg_cuda_attend_args> runs((size_t) R + 1);
    std::vector<kvg_cuda_part>        parts((size_t) R + 1);
    for (int64_t i = 0; i <= R; i++) {
        kvg_cuda_attend_args & x = runs[(size_t) i];
        memset(&x, 0, sizeof(x));
        x.k                                   = { a.k_codec, dk_.p, kb.size(), R };
        x.v                                   = { a.v_codec, dv_.p, vb.size(), R };
        x.k_row0                              = i < R ? i : 0;
        x.v_row0                              = x.k_row0;
        x.n_rows                              = i < R ? 1 : 0;
        x.n_head_kv                           = a.n_head_kv;
        x.head_dim_k                          = a.dk;
        x.head_dim_v                          = a.dv;
        x.seed                                = KVG_DEFAULT_SEED;
        x.q_dev                               = (const float *) dq.p;
        x.n_tokens                            = a.n_tokens;
        x.n_head                              = a.n_head;
        x.scale                               = scale;
        x.m_dev                               = (float *) dm.p;
        x.l_dev                               = (float *) dl.p;
        x.acc_dev                             = (float *) dacc.p;
        parts[(size_t) (i == R      ? R / 2
                        : i < R / 2 ? i
                                    : i + 1)] = { &runs[(size_t) i], NULL };  // the empty run mid-way
    }
    kvg_cuda_pass_args p;
    memset(&p, 0, sizeof(p));
    p.parts      = parts.data();
    p.n_parts    = (int32_t) parts.size();
    p.n_q        = n_q;
    p.head_dim_v = a.dv;
    p.m_dev      = (float *) dm.p;
    p.l_dev      = (float *) dl.p;
    p.acc_dev    = (float *) dacc.p;
    p.fresh      = 1;
    dm.fill(0xff);  // NaN: a fresh pass must not read them
    dl.fill(0xff);
    dacc.fill(0xff);
    int st = kvg_cuda_attend_pass(g_attend_ctx, &p);
    if (st == KVG_OK) {
        st = kvg_cuda_sync(g_ctx);
    }
    expect_status("pass of 4,501 runs", "kvg_cuda_attend_pass", KVG_OK, st);
    std::vector<float> gm((size_t) n_q), gl((size_t) n_q), gacc((size_t) (n_q * a.dv));
    double             worst = 0.0;
    if (st == KVG_OK) {
        dm.get(gm.data(), gm.size() * 4);
        dl.get(gl.data(), gl.size() * 4);
        dacc.get(gacc.data(), gacc.size() * 4);
        attn_compare("cuda", "pass of 4,501 runs (chunks), fresh over NaN", gm, gl, gacc, m_ref, l_ref, out_ref, a.dv,
                     vmax, &worst);
    }

    // no part: the state emptied
    p.n_parts = 0;
    dacc.fill(0xff);
    st = kvg_cuda_attend_pass(g_attend_ctx, &p);
    if (st == KVG_OK) {
        st = kvg_cuda_sync(g_ctx);
    }
    expect_status("pass of no part", "kvg_cuda_attend_pass", KVG_OK, st);
    if (st == KVG_OK) {
        dm.get(gm.data(), gm.size() * 4);
        dl.get(gl.data(), gl.size() * 4);
        dacc.get(gacc.data(), gacc.size() * 4);
        g_checks++;
        for (size_t j = 0; j < gm.size(); j++) {
            if (gm[j] != -INFINITY || gl[j] != 0.0f) {
                mismatch("pass of no part: m[%zu] = %g, l = %g, not -inf and 0", j, (double) gm[j], (double) gl[j]);
                break;
            }
        }
        for (float x : gacc) {
            if (x != 0.0f) {
                mismatch("pass of no part: acc %g, not 0", (double) x);
                break;
            }
        }
    }

    // a part whose state is not the pass's: refused, the state as it was
    p.n_parts = 3;
    dacc.fill(0x5a);
    float * other   = (float *) dacc.p + 1;
    runs[2].acc_dev = other;
    st              = kvg_cuda_attend_pass(g_attend_ctx, &p);
    runs[2].acc_dev = (float *) dacc.p;
    if (st == KVG_OK) {
        kvg_cuda_sync(g_ctx);
    }
    expect_status("pass with a part of another state", "kvg_cuda_attend_pass", KVG_ERR_INVALID_ARG, st);
    std::vector<uint8_t> bytes(dacc.n);
    dacc.get(bytes.data(), bytes.size());
    g_checks++;
    for (uint8_t b : bytes) {
        if (b != 0x5a) {
            mismatch("pass refused: the state changed");
            break;
        }
    }

    // the pass gathering the queries from llama.cpp's strides (padded heads and tokens) must give
    // what kvg_cuda_gather_q then a pass over the gathered queries gives, bit for bit
    const size_t       nb[3] = { 4, (size_t) (a.dk + 3) * 4, (size_t) ((a.dk + 3) * a.n_head + 5) * 4 };
    std::vector<float> src_h(nb[2] / 4 * (size_t) a.n_tokens);
    for (auto & x : src_h) {
        x = 2.0f * rng.gauss();
    }
    DevBuf src(src_h.size() * 4), qa(q.size() * 4), qb(q.size() * 4);
    src.put(src_h.data(), src_h.size() * 4);
    const int64_t      cuts[] = { 0, 1000, 2500, R };
    std::vector<float> state[2];
    std::vector<float> gathered[2];
    for (int way = 0; way < 2; way++) {
        DevBuf & qd = way ? qb : qa;
        for (int i = 0; i < 3; i++) {
            runs[(size_t) i]        = runs[(size_t) R];  // the empty run's fields, then its rows
            runs[(size_t) i].k_row0 = runs[(size_t) i].v_row0 = cuts[i];
            runs[(size_t) i].n_rows                           = cuts[i + 1] - cuts[i];
            runs[(size_t) i].q_dev                            = (const float *) qd.p;
            parts[(size_t) i]                                 = { &runs[(size_t) i], NULL };
        }
        p.n_parts = 3;
        p.q_src   = way ? src.p : NULL;
        memcpy(p.q_nb, nb, sizeof(nb));
        p.q_dst = way ? (float *) qb.p : NULL;
        st      = way ? KVG_OK : kvg_cuda_gather_q(g_ctx, src.p, nb, a.dk, a.n_head, a.n_tokens, 1, (float *) qa.p);
        st      = st ? st : kvg_cuda_attend_pass(g_attend_ctx, &p);
        st      = st ? st : kvg_cuda_sync(g_ctx);
        expect_status(way ? "pass gathering its queries" : "gather_q, then a pass", "kvg_cuda_attend_pass", KVG_OK, st);
        state[way].resize((size_t) (n_q * (a.dv + 2)));
        gathered[way].resize(q.size());
        dm.get(state[way].data(), (size_t) n_q * 4);
        dl.get(state[way].data() + n_q, (size_t) n_q * 4);
        dacc.get(state[way].data() + 2 * n_q, (size_t) (n_q * a.dv) * 4);
        qd.get(gathered[way].data(), q.size() * 4);
    }
    g_checks++;
    if (memcmp(state[0].data(), state[1].data(), state[0].size() * 4) != 0 ||
        memcmp(gathered[0].data(), gathered[1].data(), gathered[0].size() * 4) != 0) {
        mismatch("a pass gathering its queries differs from kvg_cuda_gather_q then a pass");
    }
    printf("attend_pass: 4 cases; 4,501 parts over 4,500 rows within %.3g of max|v| of float64 (bound 5e-5); gathering "
           "in the pass bit for bit\n",
           worst);
}

// ---- llama.cpp's cells, and the output (GPU) ----------------------------------------------

struct CellsCase {
    int     k_q8, v_q8, v_trans, mask_f16, use_mask, use_sinks, n_head_kv, n_head, n_tokens;
    int64_t dk, dv, n_cells, c0, c1;
    float   softcap;
};

// ggml's q8_0 of one head vector: per 32 values an f16 scale amax / 127 and the codes round(x / d).
static void q8_0_row(const float * x, int64_t d, uint8_t * out) {
    for (int64_t b = 0; b < d / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            amax = fabsf(x[b * 32 + i]) > amax ? fabsf(x[b * 32 + i]) : amax;
        }
        const float    dd = amax / 127.0f, id = dd ? 1.0f / dd : 0.0f;
        const uint16_t h = host_f16(dd);
        memcpy(out + b * 34, &h, 2);
        for (int i = 0; i < 32; i++) {
            out[b * 34 + 2 + i] = (uint8_t) (int8_t) lrintf(x[b * 32 + i] * id);
        }
    }
}

// Cells of n_cells x Hk heads x D as llama.cpp lays them out: f16 [cell][head][dim] (trans: V's
// [dim][head][cell]), or q8_0 [cell][head][blocks of 34 bytes]; nb: the byte strides of element,
// head, cell.
static std::vector<uint8_t> make_cells(Rng & rng, int q8, int trans, int64_t n, int64_t Hk, int64_t D, size_t nb[3]) {
    std::vector<float> x = kv_rows(rng, n, Hk * D, D);
    if (q8) {
        const size_t         row = (size_t) (D / 32 * 34);
        std::vector<uint8_t> out((size_t) (n * Hk) * row);
        for (int64_t c = 0; c < n; c++) {
            for (int64_t h = 0; h < Hk; h++) {
                q8_0_row(&x[(size_t) ((c * Hk + h) * D)], D, &out[(size_t) (c * Hk + h) * row]);
            }
        }
        nb[0] = 34;
        nb[1] = row;
        nb[2] = row * (size_t) Hk;
        return out;
    }
    std::vector<uint8_t> out((size_t) (n * Hk * D) * 2);
    if (trans) {
        nb[0] = (size_t) (Hk * n) * 2;
        nb[1] = (size_t) n * 2;
        nb[2] = 2;
    } else {
        nb[0] = 2;
        nb[1] = (size_t) D * 2;
        nb[2] = (size_t) (Hk * D) * 2;
    }
    for (int64_t c = 0; c < n; c++) {
        for (int64_t h = 0; h < Hk; h++) {
            for (int64_t i = 0; i < D; i++) {
                const uint16_t u = host_f16(x[(size_t) ((c * Hk + h) * D + i)]);
                memcpy(&out[(size_t) i * nb[0] + (size_t) h * nb[1] + (size_t) c * nb[2]], &u, 2);
            }
        }
    }
    return out;
}

// kvg_cuda_attend_cells against kvg_attend_f16 (the CPU's), from the same state, then
// kvg_cuda_attend_finish against the merge the patched llama.cpp computes (float64 here).
static void run_cells_case(const CellsCase & a, Rng & rng, double * worst, double * worst_finish) {
    char buf[320];
    snprintf(buf, sizeof(buf),
             "attend_cells K %s / V %s%s dk=%lld dv=%lld heads=%d/%d T=%d cells [%lld, %lld) of %lld mask %s "
             "softcap=%g sinks %d",
             a.k_q8 ? "q8_0" : "f16", a.v_q8 ? "q8_0" : "f16", a.v_trans ? " (transposed)" : "", (long long) a.dk,
             (long long) a.dv, a.n_head_kv, a.n_head, a.n_tokens, (long long) a.c0, (long long) a.c1,
             (long long) a.n_cells, a.use_mask ? (a.mask_f16 ? "f16" : "f32") : "none", (double) a.softcap,
             a.use_sinks);
    const std::string    where = buf;
    const int64_t        Hk = a.n_head_kv, n_q = (int64_t) a.n_tokens * a.n_head;
    size_t               k_nb[3], v_nb[3];
    std::vector<uint8_t> kc = make_cells(rng, a.k_q8, 0, a.n_cells, Hk, a.dk, k_nb);
    std::vector<uint8_t> vc = make_cells(rng, a.v_q8, a.v_trans, a.n_cells, Hk, a.dv, v_nb);
    // The mask: token t sees cells up to a causal limit, a few others hidden, small finite biases
    // on some; the last token sees no cell of [c0, c1) when there are several (its state must stay).
    std::vector<float> mask((size_t) (a.n_tokens * a.n_cells));
    for (int64_t t = 0; t < a.n_tokens; t++) {
        const int64_t limit = a.n_cells - (a.n_tokens - 1 - t) * 3;
        for (int64_t c = 0; c < a.n_cells; c++) {
            float x = c < limit ? 0.0f : -INFINITY;
            if (c % 7 == 3) {
                x = -INFINITY;
            } else if (c % 5 == 1 && x == 0.0f) {
                x = -0.5f * (float) rng.uniform();
            }
            if (a.n_tokens > 1 && t == a.n_tokens - 1 && c >= a.c0 && c < a.c1) {
                x = -INFINITY;
            }
            mask[(size_t) (t * a.n_cells + c)] = x;
        }
    }
    std::vector<uint8_t> mbytes;
    size_t               mask_nb1 = 0;
    if (a.mask_f16) {
        mbytes.resize(mask.size() * 2);
        for (size_t i = 0; i < mask.size(); i++) {
            const uint16_t u = host_f16(mask[i]);
            memcpy(&mbytes[i * 2], &u, 2);
        }
        mask_nb1 = (size_t) a.n_cells * 2;
    } else {
        mbytes.resize(mask.size() * 4);
        memcpy(mbytes.data(), mask.data(), mbytes.size());
        mask_nb1 = (size_t) a.n_cells * 4;
    }
    std::vector<float> q((size_t) (n_q * a.dk));
    for (auto & x : q) {
        x = 2.0f * rng.gauss();
    }
    // an incoming state, as after the coded rows: finite everywhere, so a query that sees no
    // cell is checked to keep it
    std::vector<float> m((size_t) n_q), l((size_t) n_q), acc((size_t) (n_q * a.dv));
    for (int64_t j = 0; j < n_q; j++) {
        m[(size_t) j] = 2.0f * rng.gauss();
        l[(size_t) j] = 1.0f + (float) rng.uniform() * 20.0f;
        for (int64_t i = 0; i < a.dv; i++) {
            acc[(size_t) (j * a.dv + i)] = l[(size_t) j] * rng.gauss();
        }
    }
    const float scale = 1.0f / sqrtf((float) a.dk);
    const int   kt = a.k_q8 ? KVG_CELLS_Q8_0 : KVG_CELLS_F16, vt = a.v_q8 ? KVG_CELLS_Q8_0 : KVG_CELLS_F16;

    std::vector<float> cm = m, cl = l, cacc = acc;
    if (kvg_attend_f16(q.data(), a.n_tokens, a.n_head, a.n_head_kv, a.dk, a.dv, kc.data(), kt, k_nb, vc.data(), vt,
                       v_nb, a.c0, a.c1, a.use_mask ? mbytes.data() : NULL, a.mask_f16, mask_nb1, scale, a.softcap,
                       cm.data(), cl.data(), cacc.data()) != KVG_OK) {
        die("kvg_attend_f16: %s", kvg_last_error());
    }

    DevBuf dkc(kc.size()), dvc(vc.size()), dmask(mbytes.size()), dq(q.size() * 4), dm(m.size() * 4), dl(l.size() * 4),
        dacc(acc.size() * 4);
    dkc.put(kc.data(), kc.size());
    dvc.put(vc.data(), vc.size());
    dmask.put(mbytes.data(), mbytes.size());
    dq.put(q.data(), q.size() * 4);
    dm.put(m.data(), m.size() * 4);
    dl.put(l.data(), l.size() * 4);
    dacc.put(acc.data(), acc.size() * 4);
    kvg_cuda_cells_args args;
    memset(&args, 0, sizeof(args));
    args.q_dev      = (const float *) dq.p;
    args.n_tokens   = a.n_tokens;
    args.n_head     = a.n_head;
    args.n_head_kv  = a.n_head_kv;
    args.head_dim_k = a.dk;
    args.head_dim_v = a.dv;
    args.k_dev      = dkc.p;
    args.k_type     = kt;
    memcpy(args.k_nb, k_nb, sizeof(k_nb));
    args.v_dev  = dvc.p;
    args.v_type = vt;
    memcpy(args.v_nb, v_nb, sizeof(v_nb));
    args.c0       = a.c0;
    args.c1       = a.c1;
    args.mask_dev = a.use_mask ? dmask.p : NULL;
    args.mask_f16 = a.mask_f16;
    args.mask_nb1 = mask_nb1;
    args.scale    = scale;
    args.softcap  = a.softcap;
    args.m_dev    = (float *) dm.p;
    args.l_dev    = (float *) dl.p;
    args.acc_dev  = (float *) dacc.p;
    int st        = kvg_cuda_attend_cells(g_attend_ctx, &args);
    if (st == KVG_OK) {
        st = kvg_cuda_sync(g_ctx);
    }
    expect_status(where, "kvg_cuda_attend_cells", KVG_OK, st);
    if (st != KVG_OK) {
        return;
    }
    std::vector<float> gm(m.size()), gl(l.size()), gacc(acc.size());
    dm.get(gm.data(), gm.size() * 4);
    dl.get(gl.data(), gl.size() * 4);
    dacc.get(gacc.data(), gacc.size() * 4);
    double vmax = 0.0;
    for (int64_t j = 0; j < n_q; j++) {
        for (int64_t i = 0; i < a.dv; i++) {
            const double o = fabs((double) cacc[(size_t) (j * a.dv + i)] / cl[(size_t) j]);
            vmax           = o > vmax ? o : vmax;
        }
    }
    // the CPU's state as the reference: m, l and the output acc / l in attn_compare's bounds
    std::vector<double> m_ref(cm.begin(), cm.end()), l_ref(cl.begin(), cl.end()), out_ref(cacc.size());
    for (int64_t j = 0; j < n_q; j++) {
        for (int64_t i = 0; i < a.dv; i++) {
            out_ref[(size_t) (j * a.dv + i)] = (double) cacc[(size_t) (j * a.dv + i)] / cl[(size_t) j];
        }
    }
    attn_compare("cuda vs cpu", where, gm, gl, gacc, m_ref, l_ref, out_ref, a.dv, vmax > 0 ? vmax : 1.0, worst);
    if (a.n_tokens > 1) {  // the last token saw no cell: its state, bit for bit
        g_checks++;
        const int64_t j0 = (int64_t) (a.n_tokens - 1) * a.n_head;
        for (int64_t j = j0; j < n_q; j++) {
            if (fbits(gm[(size_t) j]) != fbits(m[(size_t) j]) || fbits(gl[(size_t) j]) != fbits(l[(size_t) j]) ||
                fbits(gacc[(size_t) (j * a.dv)]) != fbits(acc[(size_t) (j * a.dv)])) {
                mismatch("%s: query %lld saw no cell and its state changed", where.c_str(), (long long) j);
                break;
            }
        }
    }

    // the output, with sinks or not, one query's state emptied (no row reached it: zeros)
    std::vector<float> fm = gm;
    fm[0]                 = -INFINITY;
    std::vector<float> sinks((size_t) a.n_head);
    for (auto & x : sinks) {
        x = 3.0f * rng.gauss();
    }
    DevBuf dsinks(sinks.size() * 4), dout(acc.size() * 4);
    dsinks.put(sinks.data(), sinks.size() * 4);
    dm.put(fm.data(), fm.size() * 4);
    dout.fill(0xff);
    kvg_cuda_finish_args fa;
    memset(&fa, 0, sizeof(fa));
    fa.m_dev      = (const float *) dm.p;
    fa.l_dev      = (const float *) dl.p;
    fa.acc_dev    = (const float *) dacc.p;
    fa.n_tokens   = a.n_tokens;
    fa.n_head     = a.n_head;
    fa.head_dim_v = a.dv;
    fa.sinks_dev  = a.use_sinks ? (const float *) dsinks.p : NULL;
    fa.out_dev    = (float *) dout.p;
    st            = kvg_cuda_attend_finish(g_ctx, &fa);
    if (st == KVG_OK) {
        st = kvg_cuda_sync(g_ctx);
    }
    expect_status(where, "kvg_cuda_attend_finish", KVG_OK, st);
    if (st != KVG_OK) {
        return;
    }
    std::vector<float> out(acc.size());
    dout.get(out.data(), out.size() * 4);
    g_checks++;
    double err = 0.0;
    for (int64_t j = 0; j < n_q; j++) {
        const double M  = fm[(size_t) j];
        const double S  = a.use_sinks ? sinks[(size_t) (j % a.n_head)] : -INFINITY;
        const double Mx = M > S ? M : S, c = exp(M - Mx), L = gl[(size_t) j] * c + (a.use_sinks ? exp(S - Mx) : 0.0);
        for (int64_t i = 0; i < a.dv; i++) {
            const double want = M == -INFINITY ? 0.0 : gacc[(size_t) (j * a.dv + i)] * c / L;
            const double e    = fabs(out[(size_t) (j * a.dv + i)] - want);
            err               = e > err || e != e ? e : err;
        }
    }
    *worst_finish = err / (vmax > 0 ? vmax : 1.0) > *worst_finish ? err / (vmax > 0 ? vmax : 1.0) : *worst_finish;
    if (!(err <= 1e-5 * (vmax > 0 ? vmax : 1.0))) {
        mismatch("%s: kvg_cuda_attend_finish output off by %.3g > 1e-5 * max|out| (%.3g)", where.c_str(), err, vmax);
    }
}

// kvg_cuda_gather_q from strides that are not [t][h][i] (ggml's permuted q), rounded or not, bit for
// bit against the host (cuda_fp16.h's round to nearest even).
// kvg_cuda_encode_batch: several codecs and shapes queued with one wait give kvg_cuda_encode's
// bytes, job by job; a job with a NaN among good ones fails with kvg_cuda_encode's status and
// message, and names itself.
static void run_encode_batch() {
    Rng           rng(0xba7c4);
    const int64_t Hk = 4, D = 64;
    const int     types[] = { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2, KVG_CODEC_KIVI2, KVG_CODEC_F16, KVG_CODEC_KIVI4 };
    const int64_t rows[]  = { 64, 33, 128, 7, 96 };
    const int     n       = 5;
    std::vector<DevBuf *>            src, dst, one;
    std::vector<kvg_cuda_encode_job> jobs((size_t) n);
    std::vector<std::vector<float>>  x((size_t) n);
    for (int i = 0; i < n; i++) {
        x[(size_t) i] = kv_rows(rng, rows[i], Hk * D, D);
        size_t sz     = 0;
        kvg_encoded_size(types[i], i % 2, rows[i], Hk, D, NULL, &sz);
        src.push_back(new DevBuf(x[(size_t) i].size() * 4));
        src.back()->put(x[(size_t) i].data(), x[(size_t) i].size() * 4);
        dst.push_back(new DevBuf(sz));
        one.push_back(new DevBuf(sz));
        kvg_cuda_encode_job & j = jobs[(size_t) i];
        memset(&j, 0, sizeof(j));
        j.type = types[i], j.kind = i % 2, j.src_dev = src.back()->p, j.src_type = KVG_CUDA_F32;
        j.src_row_stride = Hk * D, j.src_col_stride = 1, j.n_tokens = rows[i], j.n_heads = Hk, j.head_dim = D;
        kvg_codec_default_params(&j.params);
        j.dst_dev = dst.back()->p, j.dst_bytes = sz;
    }
    int64_t failed = 7;
    int     st     = kvg_cuda_encode_batch(g_ctx, jobs.data(), n, &failed);
    expect_status("encode_batch", "kvg_cuda_encode_batch", KVG_OK, st);
    g_checks++;
    if (failed != -1) {
        mismatch("encode_batch: *out_failed %lld after a success", (long long) failed);
    }
    for (int i = 0; i < n; i++) {
        const kvg_cuda_encode_job & j = jobs[(size_t) i];
        kvg_cuda_encode(g_ctx, j.type, j.kind, j.src_dev, j.src_type, j.src_row_stride, j.src_col_stride, j.n_tokens,
                        j.n_heads, j.head_dim, &j.params, one[(size_t) i]->p, j.dst_bytes, NULL);
        std::vector<uint8_t> a(j.dst_bytes), b(j.dst_bytes);
        dst[(size_t) i]->get(a.data(), a.size());
        one[(size_t) i]->get(b.data(), b.size());
        g_checks++;
        if (a != b) {
            mismatch("encode_batch job %d (%s): bytes differ from kvg_cuda_encode's", i, kvg_codec_name(j.type));
        }
    }
    // a NaN in job 3's rows: its status and message, its index, as kvg_cuda_encode gives them
    x[3][5] = NAN;
    src[3]->put(x[3].data(), x[3].size() * 4);
    const kvg_cuda_encode_job & j3 = jobs[3];
    const int                   want =
        kvg_cuda_encode(g_ctx, j3.type, j3.kind, j3.src_dev, j3.src_type, j3.src_row_stride, j3.src_col_stride,
                        j3.n_tokens, j3.n_heads, j3.head_dim, &j3.params, one[3]->p, j3.dst_bytes, NULL);
    const std::string want_msg = kvg_last_error();
    st                         = kvg_cuda_encode_batch(g_ctx, jobs.data(), n, &failed);
    expect_status("encode_batch with a NaN in job 3", "kvg_cuda_encode_batch", want, st);
    g_checks++;
    if (failed != 3 || want_msg != kvg_last_error()) {
        mismatch("encode_batch: a NaN in job 3 reported job %lld, \"%s\" (kvg_cuda_encode: \"%s\")", (long long) failed,
                 kvg_last_error(), want_msg.c_str());
    }
    for (int i = 0; i < n; i++) {
        delete src[(size_t) i];
        delete dst[(size_t) i];
        delete one[(size_t) i];
    }
    printf("encode_batch: %d jobs of 5 codecs byte-equal to kvg_cuda_encode's; a NaN job named with its message\n", n);
}

static void run_gather_q() {
    Rng           rng(0x9a7e);
    const int64_t D = 64, H = 6, T = 5;
    // the source laid out [h][t][i] with a gap after each head
    const size_t       nb[3] = { 4, (size_t) (T * D + 3) * 4, (size_t) D * 4 };
    std::vector<float> src((size_t) (H * (T * D + 3)));
    for (auto & x : src) {
        x = 3.0f * rng.gauss();
    }
    src[1] = 65519.0f;  // rounds to f16's largest finite value
    src[2] = 1e-7f;     // an f16 subnormal
    DevBuf dsrc(src.size() * 4), ddst((size_t) (T * H * D) * 4);
    dsrc.put(src.data(), src.size() * 4);
    for (int round = 0; round < 2; round++) {
        g_checks++;
        int st = kvg_cuda_gather_q(g_ctx, dsrc.p, nb, D, (int32_t) H, (int32_t) T, round, (float *) ddst.p);
        if (st == KVG_OK) {
            st = kvg_cuda_sync(g_ctx);
        }
        if (st != KVG_OK) {
            mismatch("kvg_cuda_gather_q (round %d): %s", round, kvg_last_error());
            continue;
        }
        std::vector<float> got((size_t) (T * H * D));
        ddst.get(got.data(), got.size() * 4);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) {
                for (int64_t i = 0; i < D; i++) {
                    const float x    = src[(i * nb[0] + h * nb[1] + t * nb[2]) / 4];
                    const float want = round ? host_f32(host_f16(x)) : x;
                    if (fbits(got[(size_t) ((t * H + h) * D + i)]) != fbits(want)) {
                        mismatch("kvg_cuda_gather_q (round %d): t %lld h %lld i %lld is %.9g, want %.9g", round,
                                 (long long) t, (long long) h, (long long) i,
                                 (double) got[(size_t) ((t * H + h) * D + i)], (double) want);
                        return;
                    }
                }
            }
        }
    }
    printf("gather_q: permuted f32 queries, as they are and rounded to f16, bit for bit\n");
}

static void run_cells(const char * which) {
    Rng rng(0xce115);
    // 96: a head dim the tensor cores take that is not a power of two (kivi's models)
    const int64_t dims[][2]  = { { 64, 64 }, { 128, 128 }, { 256, 256 }, { 96, 64 }, { 512, 512 }, { 96, 96 } };
    const int     heads[][2] = { { 1, 1 }, { 3, 9 }, { 8, 32 }, { 4, 4 } };
    const int64_t cells[]    = { 1, 33, 256, 608, 2300 };
    double        worst = 0.0, worst_finish = 0.0;
    int           n = 0;
    for (int di = 0; di < 6; di++) {
        for (int hi = 0; hi < 4; hi++) {
            for (int layout = 0; layout < 4; layout++) {  // f16, f16 with V transposed, q8_0 K, q8_0 both
                if (g_quick && (di + hi + layout) % 2) {
                    continue;
                }
                CellsCase a;
                memset(&a, 0, sizeof(a));
                a.k_q8      = layout >= 2;
                a.v_q8      = layout == 3;
                a.v_trans   = layout == 1;
                a.dk        = dims[di][0];
                a.dv        = dims[di][1];
                a.n_head_kv = heads[hi][0];
                a.n_head    = heads[hi][1];
                a.n_tokens  = (di + hi + layout) % 3 == 0 ? 1 : (di + layout) % 3 == 1 ? 4 : 33;
                a.n_cells   = cells[(di + hi + layout) % 5];
                a.c0        = a.n_cells > 40 ? a.n_cells / 9 : 0;
                a.c1        = a.n_cells > 40 ? a.n_cells - a.n_cells / 11 : a.n_cells;
                a.use_mask  = (di + hi) % 4 != 3 || a.n_tokens > 1;
                a.mask_f16  = (hi + layout) % 2;
                a.use_sinks = (di + layout) % 2;
                a.softcap   = (di + hi + layout) % 4 == 1 ? 30.0f : 0.0f;
                run_cells_case(a, rng, &worst, &worst_finish);
                n++;
            }
        }
    }
    printf("attend_cells (%s): %d cases; worst output error %.3g of max|out| against the CPU's kvg_attend_f16 (bound "
           "%.3g); attend_finish %.3g (bound 1e-5)\n",
           which, n, worst, g_tol.out, worst_finish);
}

// ---- the store's device copy and llama.cpp's hooks (kvg_cuda_store.c) ------------------------

// The CPU's fused path for one layer, as the patched llama.cpp computes it with the host store:
// q rounded to f16, the store's rows (kvg_store_hook_attend_capped), then the cells
// (kvg_attend_f16), from an empty state.
static void store_cpu_state(kvg_store * s, int32_t il, int64_t n_cold, const std::vector<float> & q, int T, int H,
                            int Hk, int64_t dk, int64_t dv, const std::vector<uint8_t> & kc, const size_t * k_nb,
                            const std::vector<uint8_t> & vc, const size_t * v_nb, int64_t n_kv,
                            const std::vector<float> & mask, float scale, float softcap, std::vector<float> & m,
                            std::vector<float> & l, std::vector<float> & acc) {
    const int64_t      n_q = (int64_t) T * H;
    std::vector<float> qr(q.size());
    for (size_t i = 0; i < q.size(); i++) {
        qr[i] = host_f32(host_f16(q[i]));
    }
    m.assign((size_t) n_q, -INFINITY);
    l.assign((size_t) n_q, 0.0f);
    acc.assign((size_t) (n_q * dv), 0.0f);
    if (n_cold > 0 && kvg_store_hook_attend_capped(s, il, 0, n_cold, qr.data(), T, H, scale, softcap, m.data(),
                                                   l.data(), acc.data()) != KVG_OK) {
        die("kvg_store_hook_attend_capped: %s", kvg_last_error());
    }
    if (kvg_attend_f16(qr.data(), T, H, Hk, dk, dv, kc.data(), KVG_CELLS_F16, k_nb, vc.data(), KVG_CELLS_F16, v_nb, 0,
                       n_kv, mask.data(), 0, (size_t) n_kv * 4, scale, softcap, m.data(), l.data(),
                       acc.data()) != KVG_OK) {
        die("kvg_attend_f16: %s", kvg_last_error());
    }
}

// What a run of the store's hooks holds: the head dims, the first blocks' codecs (f16 sinks, then
// runs), the evictions', the archive's, and kivi's group size.
struct HookFlavor {
    const char * name;
    int64_t      dk, dv;
    int          kc[4], vc[4];
    int          k_evict, v_evict, archive, group;
};

static int gpu_attends(int codec) {
    return codec == KVG_CODEC_F16 || (codec >= KVG_CODEC_KIVI2 && codec <= KVG_CODEC_KIVI8) ||
           (codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4);
}

static void run_store_hooks(const HookFlavor & fl) {
    Rng              rng(0x570e);
    const int        L = 3, Hk = 2, H = 6, T = 5, il = 1;
    const int64_t    dk = fl.dk, dv = fl.dv, n_kv = 70;
    const float      scale = 1.0f / sqrtf((float) dk), softcap = 20.0f;
    kvg_store_params p;
    kvg_store_default_params(&p);
    p.n_layer          = L;
    p.n_head_kv        = Hk;
    p.head_dim_k       = (int32_t) dk;
    p.head_dim_v       = (int32_t) dv;
    p.codec.group_size = fl.group;
    kvg_store * s      = NULL;
    if (kvg_store_init(&p, &s) != KVG_OK) {
        die("kvg_store_init: %s", kvg_last_error());
    }
    // f16 sinks, then K and V in blocks that do not line up (nor with kivi's groups), codecs mixed:
    // runs of every overlap
    const int64_t    kb[] = { 4, 100, 37, 200 }, vb[] = { 4, 50, 150, 137 };
    const int *const kc_ = fl.kc, *const vc_ = fl.vc;
    for (int layer = 0; layer < L; layer++) {
        for (int i = 0; i < 4; i++) {
            std::vector<float> xk = kv_rows(rng, kb[i], Hk * dk, dk), xv = kv_rows(rng, vb[i], Hk * dv, dv);
            if (kvg_store_append(s, layer, KVG_KIND_K, KVG_TIER_WARM, kc_[i], xk.data(), xk.size(), kb[i]) != KVG_OK ||
                kvg_store_append(s, layer, KVG_KIND_V, KVG_TIER_WARM, vc_[i], xv.data(), xv.size(), vb[i]) != KVG_OK) {
                die("kvg_store_append: %s", kvg_last_error());
            }
        }
    }
    size_t               k_nb[3], v_nb[3];
    std::vector<uint8_t> kc = make_cells(rng, 0, 0, n_kv, Hk, dk, k_nb);
    std::vector<uint8_t> vc =
        make_cells(rng, 0, 1, n_kv, Hk, dv, v_nb);  // V transposed, as llama.cpp keeps it without flash attention
    std::vector<float> mask((size_t) (T * n_kv));
    for (int t = 0; t < T; t++) {
        for (int64_t c = 0; c < n_kv; c++) {
            mask[(size_t) (t * n_kv + c)] = c < n_kv - (T - 1 - t) ? 0.0f : -INFINITY;
        }
    }
    // q as ggml hands it: [head_dim, n_head, n_tokens] with a gap after each token
    const size_t       q_nb[3] = { 4, (size_t) dk * 4, (size_t) (H * dk + 5) * 4 };
    std::vector<float> qsrc((size_t) (T * (H * dk + 5))), q((size_t) (T * H * dk));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            for (int64_t i = 0; i < dk; i++) {
                const float x                                  = 2.0f * rng.gauss();
                qsrc[(size_t) (t * (H * dk + 5) + h * dk + i)] = x;
                q[(size_t) ((t * H + h) * dk + i)]             = x;
            }
        }
    }

    kvg_cuda_ctx * ctx = NULL;
    if (kvg_cuda_ctx_init(0, NULL, &ctx) != KVG_OK) {
        die("kvg_cuda_ctx_init: %s", kvg_last_error());
    }
    kvg_cuda_store * d = NULL;
    if (kvg_cuda_store_init(ctx, s, &d) != KVG_OK) {
        die("kvg_cuda_store_init: %s", kvg_last_error());
    }
    DevBuf dq(qsrc.size() * 4), dkc(kc.size()), dvc(vc.size()), dmask(mask.size() * 4);
    dq.put(qsrc.data(), qsrc.size() * 4);
    dkc.put(kc.data(), kc.size());
    dvc.put(vc.data(), vc.size());
    dmask.put(mask.data(), mask.size() * 4);
    const int64_t n_q = (int64_t) T * H;
    DevBuf dm((size_t) n_q * 4), dl((size_t) n_q * 4), dacc((size_t) (n_q * dv) * 4), dout((size_t) (n_q * dv) * 4);

    // the bytes of the host's blocks that the device copy holds (those the GPU attends over) on the
    // layers it takes
    auto host_bytes = [&](int skip_layer) {
        uint64_t n = 0;
        for (int layer = 0; layer < L; layer++) {
            for (int kind = 0; kind < 2 && layer != skip_layer; kind++) {
                int64_t nb = 0;
                kvg_store_n_blocks(s, layer, kind, &nb);
                for (int64_t b = 0; b < nb; b++) {
                    kvg_block_info info;
                    kvg_store_block(s, layer, kind, b, &info, NULL, 0);
                    if (gpu_attends(info.codec)) {
                        n += info.n_bytes;
                    }
                }
            }
        }
        return n;
    };
    // one layer through the hooks against the CPU's path over its first ref_cold rows; want_status: the hook's
    int  n_cases = 0;
    auto check   = [&](const char * what, int64_t n_cold, int want_status, int64_t ref_cold) {
        char where[160];
        snprintf(where, sizeof(where), "store hooks (%s), %s (layer %d, %lld cold rows, %lld cells)", fl.name, what, il,
                 (long long) n_cold, (long long) n_kv);
        kvg_cuda_layer_args a;
        memset(&a, 0, sizeof(a));
        a.il     = il;
        a.n_cold = n_cold;
        a.q_dev  = dq.p;
        memcpy(a.q_nb, q_nb, sizeof(q_nb));
        a.n_tokens   = T;
        a.n_head     = H;
        a.n_head_kv  = Hk;
        a.head_dim_k = dk;
        a.head_dim_v = dv;
        a.k_dev      = dkc.p;
        a.k_type     = KVG_CELLS_F16;
        memcpy(a.k_nb, k_nb, sizeof(k_nb));
        a.v_dev  = dvc.p;
        a.v_type = KVG_CELLS_F16;
        memcpy(a.v_nb, v_nb, sizeof(v_nb));
        a.n_kv              = n_kv;
        a.mask_dev          = dmask.p;
        a.mask_nb1          = (size_t) n_kv * 4;
        a.scale             = scale;
        a.softcap           = softcap;
        a.m_dev             = (float *) dm.p;
        a.l_dev             = (float *) dl.p;
        a.acc_dev           = (float *) dacc.p;
        const int64_t fails = kvg_store_read_failures(s, KVG_READ_ATTEND);
        int           st    = kvg_cuda_store_hook_attend(d, &a, 0, g_stream);
        expect_status(where, "kvg_cuda_store_hook_attend", want_status, st);
        g_checks++;
        if (kvg_store_read_failures(s, KVG_READ_ATTEND) != fails + (want_status != KVG_OK)) {
            mismatch("%s: read failures %lld, %lld before", where,
                     (long long) kvg_store_read_failures(s, KVG_READ_ATTEND), (long long) fails);
        }
        kvg_cuda_finish_args f;
        memset(&f, 0, sizeof(f));
        f.m_dev      = (const float *) dm.p;
        f.l_dev      = (const float *) dl.p;
        f.acc_dev    = (const float *) dacc.p;
        f.n_tokens   = T;
        f.n_head     = H;
        f.head_dim_v = dv;
        f.out_dev    = (float *) dout.p;
        st           = kvg_cuda_store_hook_finish(d, &f, 0, g_stream);
        if (st == KVG_OK) {
            st = kvg_cuda_sync(g_ctx);
        }
        expect_status(where, "kvg_cuda_store_hook_finish", KVG_OK, st);
        std::vector<float> cm, cl, cacc;
        store_cpu_state(s, il, ref_cold, q, T, H, Hk, dk, dv, kc, k_nb, vc, v_nb, n_kv, mask, scale, softcap, cm, cl,
                        cacc);
        std::vector<float> gm((size_t) n_q), gl((size_t) n_q), gacc((size_t) (n_q * dv)), out((size_t) (n_q * dv));
        dm.get(gm.data(), gm.size() * 4);
        dl.get(gl.data(), gl.size() * 4);
        dacc.get(gacc.data(), gacc.size() * 4);
        dout.get(out.data(), out.size() * 4);
        std::vector<double> m_ref(cm.begin(), cm.end()), l_ref(cl.begin(), cl.end()), out_ref(cacc.size());
        double              vmax = 0.0;
        for (int64_t j = 0; j < n_q; j++) {
            for (int64_t i = 0; i < dv; i++) {
                out_ref[(size_t) (j * dv + i)] = (double) cacc[(size_t) (j * dv + i)] / cl[(size_t) j];
                vmax = fabs(out_ref[(size_t) (j * dv + i)]) > vmax ? fabs(out_ref[(size_t) (j * dv + i)]) : vmax;
            }
        }
        double worst = 0.0;
        attn_compare("cuda store vs cpu store", where, gm, gl, gacc, m_ref, l_ref, out_ref, dv, vmax > 0 ? vmax : 1.0,
                     &worst);
        g_checks++;
        double err = 0.0;
        for (size_t i = 0; i < out.size(); i++) {
            const double e = fabs(out[i] - out_ref[i]);
            err            = e > err || e != e ? e : err;
        }
        if (!(err <= 5e-5 * (vmax > 0 ? vmax : 1.0))) {
            mismatch("%s: finished output off by %.3g > 5e-5 * max|out| (%.3g)", where, err, vmax);
        }
        n_cases++;
    };
    // the segments hold every such byte, with room to grow: at most a quarter more, or 256 rows, a run
    auto expect_bytes = [&](const char * what, uint64_t want) {
        uint64_t got = 0;
        g_checks++;
        if (kvg_cuda_store_bytes(d, &got, NULL) != KVG_OK || got < want || got > 2 * want + ((uint64_t) 1 << 20)) {
            mismatch("store hooks, %s: the device copy holds %llu bytes of segments for %llu bytes of blocks", what,
                     (unsigned long long) got, (unsigned long long) want);
        }
    };
    if (kvg_cuda_store_sync(d) != KVG_OK) {
        die("kvg_cuda_store_sync: %s", kvg_last_error());
    }
    expect_bytes("first sync", host_bytes(-1));
    check("every row", 341, KVG_OK, 341);
    check("rows [0, 180)", 180, KVG_OK, 180);
    check("no cold row", 0, KVG_OK, 0);
    // re-encoded and cut: the copy follows the store after a sync
    if (kvg_store_retier_list(s, il, KVG_KIND_K, 4, 104, KVG_TIER_ARCHIVE, fl.archive) != KVG_OK ||
        kvg_store_truncate(s, 300) != KVG_OK || kvg_cuda_store_sync(d) != KVG_OK) {
        die("retier / truncate / sync: %s", kvg_last_error());
    }
    expect_bytes("after retier and truncate", host_bytes(-1));
    check("after retier and truncate", 300, KVG_OK, 300);
    // a codec the GPU does not attend: its rows left out and counted, the cells attended
    std::vector<float> xk = kv_rows(rng, 20, Hk * dk, dk), xv = kv_rows(rng, 20, Hk * dv, dv);
    for (int layer = 0; layer < L; layer++) {
        if (kvg_store_append(s, layer, KVG_KIND_K, KVG_TIER_WARM, KVG_CODEC_DELTA4, xk.data(), xk.size(), 20) !=
                KVG_OK ||
            kvg_store_append(s, layer, KVG_KIND_V, KVG_TIER_WARM, fl.v_evict, xv.data(), xv.size(), 20) != KVG_OK) {
            die("kvg_store_append: %s", kvg_last_error());
        }
    }
    if (kvg_cuda_store_sync(d) != KVG_OK) {
        die("kvg_cuda_store_sync: %s", kvg_last_error());
    }
    kvg_store_truncate(s, 300);
    // the copy still holds the kivi block (no sync since): the hook leaves that run out, counted,
    // and attends the rows before it and the cells
    check("a delta4 K block in the copy", 320, KVG_ERR_UNSUPPORTED, 300);
    // a layer turned off: freed at the next sync, refused by supports
    kvg_cuda_store_set_layer(d, 0, 0);
    kvg_cuda_store_sync(d);
    expect_bytes("layer 0 off", host_bytes(0));
    g_checks++;
    if (kvg_cuda_store_hook_supports(d, 0, 0) != 0 || kvg_cuda_store_hook_supports(d, il, 0) != 1 ||
        kvg_cuda_store_hook_supports(d, il, -1) != 1 || kvg_cuda_store_hook_supports(d, il, 1) != 0 ||
        kvg_cuda_store_hook_supports(d, L, 0) != 0) {
        mismatch("store hooks: kvg_cuda_store_hook_supports answers wrong");
    }
    check("after layer 0 went off", 300, KVG_OK, 300);
    // evictions and agings as a long context makes them: the warm run grows at its tail and loses
    // its oldest block to the archive run each step, so segments grow, carry dead rows at their
    // head and are compacted
    int64_t n_rows = 300;
    for (int step = 0; step < 24; step++) {
        std::vector<float> k64 = kv_rows(rng, 64, Hk * dk, dk), v64 = kv_rows(rng, 64, Hk * dv, dv);
        for (int layer = 0; layer < L; layer++) {
            if (kvg_store_append(s, layer, KVG_KIND_K, KVG_TIER_WARM, fl.k_evict, k64.data(), k64.size(), 64) !=
                    KVG_OK ||
                kvg_store_append(s, layer, KVG_KIND_V, KVG_TIER_WARM, fl.v_evict, v64.data(), v64.size(), 64) !=
                    KVG_OK) {
                die("kvg_store_append: %s", kvg_last_error());
            }
        }
        n_rows += 64;
        if (step >= 4) {
            const int64_t r0 = 300 + 64 * (step - 4);
            if (kvg_store_retier(s, r0, r0 + 64, KVG_TIER_ARCHIVE, fl.archive) != KVG_OK) {
                die("kvg_store_retier: %s", kvg_last_error());
            }
        }
        if (step % 3 == 2 || step == 23) {
            if (kvg_cuda_store_sync(d) != KVG_OK) {
                die("kvg_cuda_store_sync: %s", kvg_last_error());
            }
            char what[64];
            snprintf(what, sizeof(what), "after %d evictions and agings", step + 1);
            expect_bytes(what, host_bytes(0));
            check(what, n_rows, KVG_OK, n_rows);
        }
    }
    // an eviction coded on the GPU from f16 cells (K as rows, V transposed): the host store gets
    // the C encoder's bytes, and the next sync takes the block from the device
    {
        const int64_t         nr  = 64;
        std::vector<float>    k64 = kv_rows(rng, nr, Hk * dk, dk), v64 = kv_rows(rng, nr, Hk * dv, dv);
        std::vector<uint16_t> ck((size_t) (nr * Hk * dk)), cv((size_t) (nr * Hk * dv));
        for (int64_t t = 0; t < nr; t++) {
            for (int64_t e = 0; e < Hk * dk; e++) {
                ck[(size_t) (t * Hk * dk + e)]  = host_f16(k64[(size_t) (t * Hk * dk + e)]);
                k64[(size_t) (t * Hk * dk + e)] = host_f32(ck[(size_t) (t * Hk * dk + e)]);
            }
            for (int64_t e = 0; e < Hk * dv; e++) {
                cv[(size_t) (e * nr + t)]       = host_f16(v64[(size_t) (t * Hk * dv + e)]);
                v64[(size_t) (t * Hk * dv + e)] = host_f32(cv[(size_t) (e * nr + t)]);
            }
        }
        DevBuf dck(ck.size() * 2), dcv(cv.size() * 2);
        dck.put(ck.data(), ck.size() * 2);
        dcv.put(cv.data(), cv.size() * 2);
        for (int layer = 0; layer < L; layer++) {
            if (kvg_cuda_store_encode(d, layer, KVG_KIND_K, KVG_TIER_WARM, fl.k_evict, dck.p, KVG_CUDA_F16, Hk * dk, 1,
                                      nr) != KVG_OK ||
                kvg_cuda_store_encode(d, layer, KVG_KIND_V, KVG_TIER_WARM, fl.v_evict, dcv.p, KVG_CUDA_F16, 1, nr,
                                      nr) != KVG_OK) {
                die("kvg_cuda_store_encode: %s", kvg_last_error());
            }
        }
        const int                  kinds[2] = { KVG_KIND_K, KVG_KIND_V }, cods[2] = { fl.k_evict, fl.v_evict };
        const std::vector<float> * src[2] = { &k64, &v64 };
        for (int j = 0; j < 2; j++) {
            int64_t nb = 0;
            kvg_store_n_blocks(s, il, kinds[j], &nb);
            kvg_block_info info;
            kvg_store_block(s, il, kinds[j], nb - 1, &info, NULL, 0);
            std::vector<uint8_t> got(info.n_bytes), want(info.n_bytes);
            kvg_store_block(s, il, kinds[j], nb - 1, &info, got.data(), got.size());
            kvg_codec_params cp = p.codec;
            size_t           w  = 0;
            g_checks++;
            if (kvg_encode(cods[j], kinds[j], src[j]->data(), src[j]->size(), nr, Hk, j ? dv : dk, &cp, want.data(),
                           want.size(), &w) != KVG_OK ||
                w != got.size() || memcmp(got.data(), want.data(), w) != 0) {
                mismatch("store hooks: the %s block coded on the GPU is not the C encoder's", j ? "V" : "K");
            }
        }
        if (kvg_cuda_store_sync(d) != KVG_OK) {
            die("kvg_cuda_store_sync: %s", kvg_last_error());
        }
        n_rows += nr;
        expect_bytes("after an eviction coded on the GPU", host_bytes(0));
        check("after an eviction coded on the GPU", n_rows, KVG_OK, n_rows);
    }
    kvg_cuda_store_free(d);
    kvg_store_free(s);
    printf("store hooks (%s): %d cases through kvg_cuda_store_hook_attend / _finish against the CPU store's fused path "
           "(bound 5e-5 of max|out|); syncs after append, retier, truncate, a layer off, 24 evictions and agings, an "
           "eviction coded on the GPU\n",
           fl.name, n_cases);
}

// ---- timings (GPU) -------------------------------------------------------------------------

// The median of `reps` calls' times (CUDA events around each on g_stream), after `warm` untimed
// ones, in ms; reset() before each puts the state back. -1 where a call failed (reported as `what`).
template <class Reset, class Call>
static double median_call_ms(cudaEvent_t e0, cudaEvent_t e1, int warm, int reps, Reset reset, Call call,
                             const char * what) {
    std::vector<float> ms;
    for (int it = 0; it < warm + reps; it++) {
        reset();
        cudaEventRecord(e0, g_stream);
        const int st = call();  // queued: the events time the kernels
        cudaEventRecord(e1, g_stream);
        cudaEventSynchronize(e1);
        if (st != KVG_OK) {
            mismatch("%s: %s", what, kvg_last_error());
            return -1.0;
        }
        float t = 0.0f;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= warm) {
            ms.push_back(t);
        }
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// The median of `call(ctx)` on the default kernels (g_ctx) and on the scalar ones alone (rows_ctx),
// each call from an empty state of nq queries: m -inf, l and acc (nq x dv) 0. ms[which] in ms, -1
// where rows_ctx is missing; false (reported as `what`) if a call failed.
template <class Call>
static bool time_default_and_scalar(cudaEvent_t e0, cudaEvent_t e1, kvg_cuda_ctx * rows_ctx, DevBuf & m, DevBuf & l,
                                    DevBuf & acc, size_t nq, size_t dv, Call call, const char * what, double ms[2]) {
    const std::vector<float> mh(nq, -INFINITY), zero(nq * dv, 0.0f);
    for (int which = 0; which < 2; which++) {
        kvg_cuda_ctx * ctx = which ? rows_ctx : g_ctx;
        ms[which]          = -1.0;
        if (ctx == NULL) {
            continue;
        }
        ms[which] = median_call_ms(
            e0, e1, 2, 6,
            [&] {
                m.put(mh.data(), mh.size() * 4);
                l.put(zero.data(), nq * 4);
                acc.put(zero.data(), zero.size() * 4);
            },
            [&] { return call(ctx); }, what);
        if (ms[which] < 0) {
            return false;
        }
    }
    return true;
}

// One prefill ubatch of one layer of the 3B shape (256 tokens, 8/24 heads, d=128) over 8K and 32K
// coded rows: the default kernels (the tensor cores from compute capability 8.0) against the scalar
// row-parallel kernel (rows_ctx). Not asserted.
// A timing's blocks: K and V of R rows coded on the device from src (f32 [R][Hk * D]) with codecs
// kc and vc, and kvg_cuda_attend's arguments over all of them for T tokens of Hq query heads.
struct TimedPair {
    int     kc, vc;
    int64_t R;
    size_t  ks, vs;
    DevBuf  kb, vb;
    TimedPair(int k_codec, int v_codec, int64_t rows, int Hk, int64_t D)
        : kc(k_codec), vc(v_codec), R(rows), ks(coded_bytes(k_codec, KVG_KIND_K, rows, Hk, D)),
          vs(coded_bytes(v_codec, KVG_KIND_V, rows, Hk, D)), kb(ks), vb(vs) {}
    static size_t coded_bytes(int codec, int kind, int64_t rows, int Hk, int64_t D) {
        size_t n = 0;
        kvg_encoded_size(codec, kind, rows, Hk, D, NULL, &n);
        return n;
    }
    // false (a mismatch reported as `what`) when an encode failed
    bool encode(const DevBuf & src, int Hk, int64_t D, const char * what) {
        if (kvg_cuda_encode(g_ctx, kc, KVG_KIND_K, src.p, KVG_CUDA_F32, Hk * D, 1, R, Hk, D, NULL, kb.p, ks, NULL) ||
            kvg_cuda_encode(g_ctx, vc, KVG_KIND_V, src.p, KVG_CUDA_F32, Hk * D, 1, R, Hk, D, NULL, vb.p, vs, NULL)) {
            mismatch("%s: %s", what, kvg_last_error());
            return false;
        }
        return true;
    }
    kvg_cuda_attend_args args(int Hk, int64_t D, int T, int Hq, DevBuf & q, DevBuf & m, DevBuf & l,
                              DevBuf & acc) const {
        kvg_cuda_attend_args a;
        memset(&a, 0, sizeof(a));
        a.k          = { kc, kb.p, ks, R };
        a.v          = { vc, vb.p, vs, R };
        a.n_rows     = R;
        a.n_head_kv  = Hk;
        a.head_dim_k = D;
        a.head_dim_v = D;
        a.seed       = KVG_DEFAULT_SEED;
        a.q_dev      = (const float *) q.p;
        a.n_tokens   = T;
        a.n_head     = Hq;
        a.scale      = 0.088f;
        a.m_dev      = (float *) m.p;
        a.l_dev      = (float *) l.p;
        a.acc_dev    = (float *) acc.p;
        return a;
    }
};

// One decoded token's layer on the 3B shape (8 KV heads, 24 query heads, head dim 128) at 8K, as
// the store's hook has it: the sinks' 4 f16 rows, 5,888 rotq2 rows (the archive), 2,048 rotq4 rows
// (the warm ones), 256 f16 cells (llama.cpp's hot window). One pass gathering the queries (the
// hook's way) against the calls one after the other (gather, begin, attend per run, cells per
// part): its 6 kernels against 12.
// The pass's fused split kernel against one launch a part (a context made with
// KVGGUF_CUDA_ATTEND=parts): decoded tokens' layers as the store's hook passes them (the sinks'
// f16 rows read as cells, runs of rotq codes of other bits, llama.cpp's f16 cells under a mask),
// with and without soft-capping, gathering the queries from padded strides or not, 1 to 8
// queries a KV head, and more runs than one fused launch holds. The fused kernel runs the same
// bodies on the same queries, so the state and the gathered queries must be equal float for
// float; and the default context must have launched it.
// f16 rows [row][head][i] read as llama.cpp's cells (dense strides), unmasked, folding into the
// state (m, l, acc): the sinks and hot cells of the pass cases and the layer timing
static kvg_cuda_cells_args f16_rows_as_cells(const float * q_dev, int T, int Hq, int Hk, int64_t D, const void * k_dev,
                                             const void * v_dev, int64_t n_rows, float softcap, const DevBuf & m,
                                             const DevBuf & l, const DevBuf & acc) {
    kvg_cuda_cells_args c;
    memset(&c, 0, sizeof(c));
    c.q_dev      = q_dev;
    c.n_tokens   = T;
    c.n_head     = Hq;
    c.n_head_kv  = Hk;
    c.head_dim_k = D;
    c.head_dim_v = D;
    c.k_dev      = k_dev;
    c.v_dev      = v_dev;
    c.k_type = c.v_type = KVG_CELLS_F16;
    c.k_nb[0] = c.v_nb[0] = 2;
    c.k_nb[1] = c.v_nb[1] = (size_t) D * 2;
    c.k_nb[2] = c.v_nb[2] = (size_t) (Hk * D) * 2;
    c.c1                  = n_rows;
    c.scale               = 0.088f;
    c.softcap             = softcap;
    c.m_dev               = (float *) m.p;
    c.l_dev               = (float *) l.p;
    c.acc_dev             = (float *) acc.p;
    return c;
}

static void run_pass_fused(kvg_cuda_ctx * parts_ctx) {
    struct Shape {
        int     hk, h, t;
        int64_t d;
        float   softcap;
        int     gather, n_runs;
    };
    const Shape shapes[] = { { 2, 6, 1, 128, 0.0f, 1, 2 }, { 2, 4, 1, 64, 30.0f, 0, 2 }, { 1, 8, 1, 256, 0.0f, 1, 2 },
                             { 2, 2, 1, 128, 0.0f, 1, 9 }, { 2, 4, 3, 64, 0.0f, 1, 3 },  { 4, 4, 1, 128, 0.0f, 0, 1 } };
    const int   pairs[][2] = { { KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ3 },
                               { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ4 },
                               { KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ2 },
                               { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2 } };
    Rng         rng(0xf05e);
    int         n_cases = 0;
    for (const Shape & sh : shapes) {
        const int          Hk = sh.hk, Hq = sh.h, T = sh.t;
        const int64_t      D = sh.d, n_q = (int64_t) T * Hq, n_sinks = 4, n_cells = 200;
        const int64_t      R_max = 300 + 97 * sh.n_runs;
        std::vector<float> x((size_t) (R_max * Hk * D));
        for (auto & v : x) {
            v = rng.gauss();
        }
        DevBuf src(x.size() * 4);
        src.put(x.data(), x.size() * 4);
        std::vector<TimedPair *> runs;
        for (int i = 0; i < sh.n_runs; i++) {
            runs.push_back(new TimedPair(pairs[i % 4][0], pairs[i % 4][1], 300 + 97 * i, Hk, D));
            if (!runs.back()->encode(src, Hk, D, "fused pass encode")) {
                return;
            }
        }
        // f16 rows [row][head][i]: the sinks' (4 rows) and llama.cpp's hot cells (200)
        auto f16_rows = [&](int64_t n) {
            std::vector<uint16_t> h((size_t) (n * Hk * D));
            for (auto & v : h) {
                v = host_f16(rng.gauss());
            }
            return h;
        };
        const std::vector<uint16_t> sk = f16_rows(n_sinks), sv = f16_rows(n_sinks), ck = f16_rows(n_cells),
                                    cv = f16_rows(n_cells);
        DevBuf                      dsk(sk.size() * 2), dsv(sv.size() * 2), dck(ck.size() * 2), dcv(cv.size() * 2);
        dsk.put(sk.data(), sk.size() * 2);
        dsv.put(sv.data(), sv.size() * 2);
        dck.put(ck.data(), ck.size() * 2);
        dcv.put(cv.data(), cv.size() * 2);
        std::vector<float> mask((size_t) (T * n_cells));  // token t sees cells [0, 150 + 20 t)
        for (int t = 0; t < T; t++) {
            for (int64_t c = 0; c < n_cells; c++) {
                mask[(size_t) (t * n_cells + c)] = c < 150 + 20 * t ? 0.0f : -INFINITY;
            }
        }
        DevBuf dmask(mask.size() * 4);
        dmask.put(mask.data(), mask.size() * 4);
        // the queries: as llama.cpp holds them (padded heads and tokens) where the pass gathers
        const size_t       nb[3] = { 4, (size_t) (D + 3) * 4, (size_t) ((D + 3) * Hq + 5) * 4 };
        std::vector<float> qh(sh.gather ? nb[2] / 4 * (size_t) T : (size_t) (n_q * D));
        for (auto & v : qh) {
            v = 2.0f * rng.gauss();
        }
        DevBuf qsrc(qh.size() * 4);
        qsrc.put(qh.data(), qh.size() * 4);
        std::vector<float> state[2], gathered[2];
        for (int way = 0; way < 2; way++) {  // 0: the default context (fused), 1: one launch a part
            DevBuf m((size_t) n_q * 4), l((size_t) n_q * 4), acc((size_t) (n_q * D) * 4), qd((size_t) (n_q * D) * 4);
            qd.fill(0);
            const float *                     q_dev = (const float *) (sh.gather ? qd.p : qsrc.p);
            std::vector<kvg_cuda_attend_args> ra;
            for (TimedPair * tp : runs) {
                ra.push_back(tp->args(Hk, D, T, Hq, sh.gather ? qd : qsrc, m, l, acc));
                ra.back().softcap = sh.softcap;
            }
            kvg_cuda_cells_args cs =
                f16_rows_as_cells(q_dev, T, Hq, Hk, D, dsk.p, dsv.p, n_sinks, sh.softcap, m, l, acc);
            kvg_cuda_cells_args ch =
                f16_rows_as_cells(q_dev, T, Hq, Hk, D, dck.p, dcv.p, n_cells, sh.softcap, m, l, acc);
            ch.mask_dev = dmask.p;
            ch.mask_nb1 = (size_t) n_cells * 4;
            std::vector<kvg_cuda_part> parts;
            parts.push_back({ NULL, &cs });
            for (const auto & r : ra) {
                parts.push_back({ &r, NULL });
            }
            parts.push_back({ NULL, &ch });
            kvg_cuda_pass_args p;
            memset(&p, 0, sizeof(p));
            p.parts      = parts.data();
            p.n_parts    = (int32_t) parts.size();
            p.n_q        = n_q;
            p.head_dim_v = D;
            p.m_dev      = (float *) m.p;
            p.l_dev      = (float *) l.p;
            p.acc_dev    = (float *) acc.p;
            p.fresh      = 1;
            if (sh.gather) {
                p.q_src = qsrc.p;
                memcpy(p.q_nb, nb, sizeof(nb));
                p.q_dst = (float *) qd.p;
            }
            kvg_cuda_ctx * ctx      = way ? parts_ctx : g_ctx;
            const uint64_t launches = ctx->fused_launches;
            int            st       = kvg_cuda_attend_pass(ctx, &p);
            st                      = st ? st : kvg_cuda_sync(ctx);
            char where[160];
            snprintf(where, sizeof(where), "fused pass, %d KV heads, %d heads, %d tokens, head dim %lld, %d runs (%s)",
                     Hk, Hq, T, (long long) D, sh.n_runs, way ? "a launch a part" : "fused");
            expect_status(where, "kvg_cuda_attend_pass", KVG_OK, st);
            if (st != KVG_OK) {
                return;
            }
            const uint64_t want = way ? 0 : (uint64_t) (parts.size() + KA_FUSE_PARTS - 1) / KA_FUSE_PARTS;
            g_checks++;
            if (ctx->fused_launches - launches != want) {
                mismatch("%s: %llu fused launches, expected %llu", where,
                         (unsigned long long) (ctx->fused_launches - launches), (unsigned long long) want);
            }
            state[way].resize((size_t) (n_q * (D + 2)));
            m.get(state[way].data(), (size_t) n_q * 4);
            l.get(state[way].data() + n_q, (size_t) n_q * 4);
            acc.get(state[way].data() + 2 * n_q, (size_t) (n_q * D) * 4);
            gathered[way].resize((size_t) (n_q * D));
            qd.get(gathered[way].data(), gathered[way].size() * 4);
        }
        g_checks++;
        n_cases++;
        for (size_t i = 0; i < state[0].size(); i++) {
            if (!(state[0][i] == state[1][i])) {  // -0 and 0 alike: a tile's unused queries may add either
                mismatch(
                    "fused pass (%d KV heads, %d heads, head dim %lld, %d runs): state float %zu is %.9g fused, %.9g a "
                    "launch a part",
                    Hk, Hq, (long long) D, sh.n_runs, i, (double) state[0][i], (double) state[1][i]);
                break;
            }
        }
        g_checks++;
        if (memcmp(gathered[0].data(), gathered[1].data(), gathered[0].size() * 4) != 0) {
            mismatch("fused pass (%d KV heads, %d heads, head dim %lld): the gathered queries differ", Hk, Hq,
                     (long long) D);
        }
        for (TimedPair * tp : runs) {
            delete tp;
        }
    }
    printf("attend_pass fused: %d cases (sinks, 1-9 rotq runs, masked cells; 1-8 queries a KV head; head dims 64-256) "
           "equal "
           "to a launch a part, float for float\n",
           n_cases);
}

static void run_timing_layer(kvg_cuda_ctx * parts_ctx) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    Rng                rng(0x1a7e);
    const int          Hk = 8, Hq = 24;
    const int64_t      D = 128, R_max = 5888;
    std::vector<float> x((size_t) (R_max * Hk * D));
    for (auto & v : x) {
        v = rng.gauss();
    }
    DevBuf src(x.size() * 4);
    src.put(x.data(), x.size() * 4);
    TimedPair sinks(KVG_CODEC_F16, KVG_CODEC_F16, 4, Hk, D), archive(KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ2, 5888, Hk, D),
        warm(KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ4, 2048, Hk, D), hot(KVG_CODEC_F16, KVG_CODEC_F16, 256, Hk, D);
    if (!sinks.encode(src, Hk, D, "layer timing encode") || !archive.encode(src, Hk, D, "layer timing encode") ||
        !warm.encode(src, Hk, D, "layer timing encode") || !hot.encode(src, Hk, D, "layer timing encode")) {
        return;
    }
    DevBuf             q((size_t) Hq * D * 4), m((size_t) Hq * 4), l((size_t) Hq * 4), acc((size_t) Hq * D * 4);
    std::vector<float> qh((size_t) Hq * D);
    for (auto & v : qh) {
        v = rng.gauss();
    }
    DevBuf qsrc(qh.size() * 4);  // as llama.cpp holds them; both ways gather them into q
    qsrc.put(qh.data(), qh.size() * 4);
    const size_t               q_nb[3] = { 4, (size_t) D * 4, (size_t) (Hq * D) * 4 };
    const kvg_cuda_attend_args ra      = archive.args(Hk, D, 1, Hq, q, m, l, acc),
                               rw      = warm.args(Hk, D, 1, Hq, q, m, l, acc);
    const float * const        qd      = (const float *) q.p;
    const kvg_cuda_cells_args  cs =
                                   f16_rows_as_cells(qd, 1, Hq, Hk, D, sinks.kb.p, sinks.vb.p, sinks.R, 0.0f, m, l, acc),
                               ch = f16_rows_as_cells(qd, 1, Hq, Hk, D, hot.kb.p, hot.vb.p, hot.R, 0.0f, m, l, acc);
    const kvg_cuda_part        parts[] = { { NULL, &cs }, { &ra, NULL }, { &rw, NULL }, { NULL, &ch } };
    kvg_cuda_pass_args         p;
    memset(&p, 0, sizeof(p));
    p.parts      = parts;
    p.n_parts    = 4;
    p.n_q        = Hq;
    p.head_dim_v = D;
    p.m_dev      = (float *) m.p;
    p.l_dev      = (float *) l.p;
    p.acc_dev    = (float *) acc.p;
    p.fresh      = 1;
    p.q_src      = qsrc.p;
    memcpy(p.q_nb, q_nb, sizeof(q_nb));
    p.q_dst       = (float *) q.p;
    auto one_pass = [&] { return kvg_cuda_attend_pass(g_ctx, &p); };
    auto by_parts = [&] { return kvg_cuda_attend_pass(parts_ctx, &p); };
    auto calls    = [&] {
        int st = kvg_cuda_gather_q(g_ctx, qsrc.p, q_nb, D, Hq, 1, 1, (float *) q.p);
        st     = st ? st : kvg_cuda_attend_begin(g_ctx, Hq, D, (float *) m.p, (float *) l.p, (float *) acc.p);
        st     = st ? st : kvg_cuda_attend_cells(g_ctx, &cs);
        st     = st ? st : kvg_cuda_attend(g_ctx, &ra);
        st     = st ? st : kvg_cuda_attend(g_ctx, &rw);
        return st ? st : kvg_cuda_attend_cells(g_ctx, &ch);
    };
    // the pass fused (its split kernel, the combine), a launch a part (the queries, four splits,
    // the combine), and the calls one after another (the gather, the begin, a fused split and a
    // combine each)
    const char * names[] = { "one pass, fused (2 kernels)", "one pass, a launch a part (6 kernels)",
                             "calls one after another (10 kernels)" };
    for (int way = 0; way < 3; way++) {
        if (way == 1 && parts_ctx == NULL) {
            continue;
        }
        auto         run = [&] { return way == 0 ? one_pass() : way == 1 ? by_parts() : calls(); };
        const double med = median_call_ms(e0, e1, 3, 20, [] {}, run, "layer timing");
        if (med < 0) {
            return;
        }
        float b2b = 0.0f;  // 20 layers queued back to back: the device's time a layer
        cudaEventRecord(e0, g_stream);
        for (int it = 0; it < 20; it++) {
            run();
        }
        cudaEventRecord(e1, g_stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&b2b, e0, e1);
        printf("  one decoded layer, 3B shape, 4 sinks + 5888 rotq2 + 2048 rotq4 rows + 256 f16 cells, %s: %8.1f us a "
               "lone "
               "layer, %6.1f us a layer back to back\n",
               names[way], med * 1e3, b2b / 20 * 1e3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

static void run_timing_prefill(kvg_cuda_ctx * rows_ctx) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    Rng           rng(0x7172);
    const int     Hk = 8, Hq = 24, T = 256;
    const int64_t D = 128;
    // rotq (the preset's codecs on this shape), and kivi (its codecs where rotations cannot go)
    const int pairs[][2] = { { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2 }, { KVG_CODEC_KIVI4, KVG_CODEC_KIVI2 } };
    for (int64_t R : { (int64_t) 8192, (int64_t) 32768 }) {
        std::vector<float> x((size_t) (R * Hk * D));
        for (auto & v : x) {
            v = rng.gauss();
        }
        DevBuf src(x.size() * 4);
        src.put(x.data(), x.size() * 4);
        const size_t       nq = (size_t) T * Hq;
        std::vector<float> qh(nq * D);
        for (auto & v : qh) {
            v = rng.gauss();
        }
        for (const auto & pr : pairs) {
            TimedPair tp(pr[0], pr[1], R, Hk, D);
            DevBuf    q(nq * D * 4), m(nq * 4), l(nq * 4), acc(nq * D * 4);
            if (!tp.encode(src, Hk, D, "prefill timing encode")) {
                return;
            }
            q.put(qh.data(), qh.size() * 4);
            const kvg_cuda_attend_args a = tp.args(Hk, D, T, Hq, q, m, l, acc);
            double                     ms[2];
            if (!time_default_and_scalar(
                    e0, e1, rows_ctx, m, l, acc, nq, (size_t) D,
                    [&](kvg_cuda_ctx * ctx) { return kvg_cuda_attend(ctx, &a); }, "prefill timing attend", ms)) {
                return;
            }
            for (int which = 0; which < 2; which++) {
                if (ms[which] >= 0) {
                    printf("  attend %d tokens, 3B shape (%d/%d heads, d=%lld), %6lld rows, K %s / V %s, %-13s: %9.1f "
                           "us\n",
                           T, Hq, Hk, (long long) D, (long long) R, kvg_codec_name(pr[0]), kvg_codec_name(pr[1]),
                           which ? "scalar kernel" : "default", ms[which] * 1e3);
                }
            }
        }
    }
    // the same ubatch over llama.cpp's cells: 512 f16 cells (the 1-3B presets' hot window and
    // ubatch), K and V [cell][head][i], the causal mask of the ubatch's last 256 cells
    const int64_t        NC = 512;
    size_t               k_nb[3], v_nb[3];
    std::vector<uint8_t> kc = make_cells(rng, 0, 0, NC, Hk, D, k_nb), vc = make_cells(rng, 0, 0, NC, Hk, D, v_nb);
    std::vector<float>   mask((size_t) (T * NC));
    for (int t = 0; t < T; t++) {
        for (int64_t c = 0; c < NC; c++) {
            mask[(size_t) (t * NC + c)] = c <= NC - T + t ? 0.0f : -INFINITY;
        }
    }
    const size_t nq = (size_t) T * Hq;
    DevBuf dkc(kc.size()), dvc(vc.size()), dmask(mask.size() * 4), q(nq * D * 4), m(nq * 4), l(nq * 4), acc(nq * D * 4);
    dkc.put(kc.data(), kc.size());
    dvc.put(vc.data(), vc.size());
    dmask.put(mask.data(), mask.size() * 4);
    std::vector<float> qh(nq * D);
    for (auto & v : qh) {
        v = rng.gauss();
    }
    q.put(qh.data(), qh.size() * 4);
    kvg_cuda_cells_args c;
    memset(&c, 0, sizeof(c));
    c.q_dev      = (const float *) q.p;
    c.n_tokens   = T;
    c.n_head     = Hq;
    c.n_head_kv  = Hk;
    c.head_dim_k = D;
    c.head_dim_v = D;
    c.k_dev      = dkc.p;
    c.k_type     = KVG_CELLS_F16;
    memcpy(c.k_nb, k_nb, sizeof(k_nb));
    c.v_dev  = dvc.p;
    c.v_type = KVG_CELLS_F16;
    memcpy(c.v_nb, v_nb, sizeof(v_nb));
    c.c1       = NC;
    c.mask_dev = dmask.p;
    c.mask_nb1 = (size_t) NC * 4;
    c.scale    = 0.088f;
    c.m_dev    = (float *) m.p;
    c.l_dev    = (float *) l.p;
    c.acc_dev  = (float *) acc.p;
    double ms[2];
    if (!time_default_and_scalar(
            e0, e1, rows_ctx, m, l, acc, nq, (size_t) D,
            [&](kvg_cuda_ctx * ctx) { return kvg_cuda_attend_cells(ctx, &c); }, "prefill timing attend_cells", ms)) {
        return;
    }
    for (int which = 0; which < 2; which++) {
        if (ms[which] >= 0) {
            printf("  attend_cells %d tokens, 3B shape, %lld f16 cells, causal mask, %-13s: %9.1f us\n", T,
                   (long long) NC, which ? "scalar kernel" : "default", ms[which] * 1e3);
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

static void run_timing(kvg_cuda_ctx * generic) {
    printf("\ntimings (CUDA events on the context's stream; medians of 20 runs after 3 warm-ups; not asserted):\n");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    Rng rng(0x7171);
    // one layer of Llama-3.2-3B (8 KV heads, 24 query heads, head_dim 128), of Llama-3.2-1B
    // (8 KV heads, 32 query heads, head_dim 64) and of Phi-3-mini (32 and 32, head_dim 96: kivi's,
    // the "tiered" preset there); one decoded token
    struct Shape {
        const char * name;
        int          Hk, Hq;
        int64_t      D;
    };
    const Shape shapes[]   = { { "3B", 8, 24, 128 }, { "1B", 8, 32, 64 }, { "Phi-3", 32, 32, 96 } };
    const int   pairs[][2] = { { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2 },
                               { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ4 },
                               { KVG_CODEC_KIVI4, KVG_CODEC_KIVI2 } };
    for (const Shape & sh : shapes) {
        const int     Hk = sh.Hk, Hq = sh.Hq;
        const int64_t D = sh.D;
        for (int64_t R : { (int64_t) 8192, (int64_t) 32768 }) {
            std::vector<float> x((size_t) (R * Hk * D));
            for (auto & v : x) {
                v = rng.gauss();
            }
            DevBuf src(x.size() * 4);
            src.put(x.data(), x.size() * 4);
            for (const auto & pr : pairs) {
                if ((sh.D & (sh.D - 1)) != 0 && pr[0] >= KVG_CODEC_ROTQ1) {
                    continue;  // rotq takes head dims that are powers of two
                }
                TimedPair tp(pr[0], pr[1], R, Hk, D);
                DevBuf    q((size_t) Hq * D * 4), m((size_t) Hq * 4), l((size_t) Hq * 4), acc((size_t) Hq * D * 4);
                if (!tp.encode(src, Hk, D, "timing encode")) {
                    return;
                }
                std::vector<float> qh((size_t) Hq * D), mh((size_t) Hq, -INFINITY), zero((size_t) Hq * D, 0.0f);
                for (auto & v : qh) {
                    v = rng.gauss();
                }
                q.put(qh.data(), qh.size() * 4);
                const kvg_cuda_attend_args a = tp.args(Hk, D, 1, Hq, q, m, l, acc);
                for (int which = 0; which < 2; which++) {
                    kvg_cuda_ctx * ctx = which ? generic : g_ctx;
                    if (ctx == NULL) {
                        continue;
                    }
                    const double med = median_call_ms(
                        e0, e1, 3, 20,
                        [&] {
                            m.put(mh.data(), mh.size() * 4);
                            l.put(zero.data(), (size_t) Hq * 4);
                            acc.put(zero.data(), zero.size() * 4);
                        },
                        [&] { return kvg_cuda_attend(ctx, &a); }, "timing attend");
                    if (med < 0) {
                        return;
                    }
                    // 20 calls queued back to back (each folds into the same state): the device's time
                    // a call, without the host's launch time that a lone call waits for
                    float b2b = 0.0f;
                    cudaEventRecord(e0, g_stream);
                    for (int it = 0; it < 20; it++) {
                        kvg_cuda_attend(ctx, &a);
                    }
                    cudaEventRecord(e1, g_stream);
                    cudaEventSynchronize(e1);
                    cudaEventElapsedTime(&b2b, e0, e1);
                    const double f16b = (double) R * Hk * D * 2 * 2;
                    printf(
                        "  attend 1 token, %s shape (%d/%d heads, d=%lld), %6lld rows, K %s / V %s, %-7s kernel: %8.1f "
                        "us "
                        "a lone call, %6.1f us a call back to back (codes %.1f MiB: %.0f GB/s; an f16 cache's %.0f MiB "
                        "would need %.0f GB/s to match)\n",
                        sh.name, Hq, Hk, (long long) D, (long long) R, kvg_codec_name(pr[0]), kvg_codec_name(pr[1]),
                        which ? "generic" : "default", med * 1e3, b2b / 20 * 1e3, (tp.ks + tp.vs) / 1048576.0,
                        (tp.ks + tp.vs) / (b2b / 20 * 1e-3) / 1e9, f16b / 1048576.0, f16b / (b2b / 20 * 1e-3) / 1e9);
                }
            }
        }
    }
    // an eviction batch: 256 rows of 8 x 128, encoded and decoded (each call waits for its status)
    const int          Hk = 8;
    const int64_t      D = 128, R = 256;
    std::vector<float> x((size_t) (R * Hk * D));
    for (auto & v : x) {
        v = rng.gauss();
    }
    DevBuf src(x.size() * 4), out(x.size() * 4);
    src.put(x.data(), x.size() * 4);
    for (int codec : { KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ2, KVG_CODEC_KIVI4, KVG_CODEC_KIVI2 }) {
        size_t sz = 0;
        kvg_encoded_size(codec, KVG_KIND_K, R, Hk, D, NULL, &sz);
        DevBuf             blk(sz);
        std::vector<float> te, td;
        for (int it = 0; it < 23; it++) {
            cudaEventRecord(e0, g_stream);
            kvg_cuda_encode(g_ctx, codec, KVG_KIND_K, src.p, KVG_CUDA_F32, Hk * D, 1, R, Hk, D, NULL, blk.p, sz, NULL);
            cudaEventRecord(e1, g_stream);
            cudaEventSynchronize(e1);
            float t = 0.0f;
            cudaEventElapsedTime(&t, e0, e1);
            if (it >= 3) {
                te.push_back(t);
            }
            cudaEventRecord(e0, g_stream);
            kvg_cuda_decode(g_ctx, codec, KVG_KIND_K, blk.p, sz, R, Hk, D, NULL, out.p, KVG_CUDA_F16, Hk * D, 1);
            cudaEventRecord(e1, g_stream);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&t, e0, e1);
            if (it >= 3) {
                td.push_back(t);
            }
        }
        std::sort(te.begin(), te.end());
        std::sort(td.begin(), td.end());
        printf("  %-6s encode 256 rows x 8 x 128: %7.1f us, decode to f16: %7.1f us (each with its status read back)\n",
               kvg_codec_name(codec), te[te.size() / 2] * 1e3, td[td.size() / 2] * 1e3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// ---- main ----------------------------------------------------------------------------------

int main(int argc, char ** argv) {
    int timing = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--emulate")) {
            g_emulate = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            g_quick = 1;
        } else if (!strcmp(argv[i], "--no-timing")) {
            timing = 0;
        } else {
            fprintf(stderr, "usage: cuda_check [--emulate] [--quick] [--no-timing]\n");
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!g_emulate) {
        int n = 0;
        if (kvg_cuda_device_count(&n) != KVG_OK || n == 0) {
            printf("cuda_check: no CUDA device (%s)\n", kvg_last_error()[0] ? kvg_last_error() : "none found");
            return 77;
        }
        cudaDeviceProp prop;
        int            drv = 0, rt = 0;
        cudaGetDeviceProperties(&prop, 0);
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        printf("cuda_check: device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB; driver %d.%d, runtime %d.%d\n",
               prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
               drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
        if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
            printf("cuda_check: cannot create a stream\n");
            return 2;
        }
        if (kvg_cuda_ctx_init(0, g_stream, &g_ctx) != KVG_OK) {
            printf("cuda_check: kvg_cuda_ctx_init failed: %s\n", kvg_last_error());
            return 2;
        }
    } else {
        printf("cuda_check --emulate: the kernels' bodies on the host, against the scalar reference (no GPU)\n");
    }
    printf("C library SIMD level %d (max %d); reference: the scalar level\n", kvg_simd_level(), kvg_simd_max_level());

    run_api();
    const long api_bad = g_bad;

    // codec cases
    const int types[] = { KVG_CODEC_F16,   KVG_CODEC_KIVI2, KVG_CODEC_KIVI3, KVG_CODEC_KIVI4, KVG_CODEC_KIVI8,
                          KVG_CODEC_ROTQ1, KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ4 };
    struct Shape {
        int64_t T, H, D;
    };
    const Shape rotq_shapes[]  = { { 1, 1, 64 }, { 5, 3, 128 }, { 33, 8, 128 }, { 100, 2, 256 }, { 257, 1, 64 },
                                   { 7, 4, 8 },  { 3, 2, 16 },  { 31, 1, 512 }, { 2, 1, 4096 } };
    const Shape other_shapes[] = { { 1, 1, 64 },   { 5, 3, 128 }, { 33, 8, 128 }, { 100, 2, 256 },
                                   { 257, 1, 64 }, { 7, 3, 7 },   { 40, 5, 80 },  { 65, 1, 33 } };
    const int   groups[]       = { 32, 17, 64 };
    Rng         rng(0xc0dec);
    long        n_cases = 0;
    for (int type : types) {
        const int     rotq   = type >= KVG_CODEC_ROTQ1;
        const Shape * shapes = rotq ? rotq_shapes : other_shapes;
        const int     n_sh =
            rotq ? (int) (sizeof(rotq_shapes) / sizeof(Shape)) : (int) (sizeof(other_shapes) / sizeof(Shape));
        for (int si = 0; si < n_sh; si++) {
            if (g_quick && si % 2) {
                continue;
            }
            for (int kind = 0; kind < 2; kind++) {
                Case c;
                c.type = type;
                c.kind = kind;
                c.T    = shapes[si].T;
                c.H    = shapes[si].H;
                c.D    = shapes[si].D;
                kvg_codec_default_params(&c.p);
                c.p.group_size = groups[(si + kind) % 3];
                if (rotq && si % 3 == 2) {
                    c.p.seed = 0x1234567ULL + (uint64_t) si;  // another seed: other signs
                }
                run_case(c, rng);
                n_cases++;
            }
        }
    }
    printf("codecs: %ld cases (9 codecs x shapes x K/V; 4 input layouts, 4 output layouts, a corrupt block each)\n",
           n_cases);
    const long codec_bad = g_bad - api_bad;
    run_refusals(rng);
    const long refusal_bad = g_bad - api_bad - codec_bad;
    long       attend_bad  = 0;
    if (!g_emulate) {
        const long before = g_bad;
        g_attend_ctx      = g_ctx;
        run_attend("the row-parallel kernel where it covers the shape");
        // the same cases through the generic kernel alone
        kvg_cuda_ctx * generic = NULL;
        setenv("KVGGUF_CUDA_ATTEND", "generic", 1);
        if (kvg_cuda_ctx_init(0, g_stream, &generic) != KVG_OK) {
            mismatch("kvg_cuda_ctx_init (generic attention): %s", kvg_last_error());
        } else {
            g_attend_ctx = generic;
            run_attend("the generic kernel");
        }
        unsetenv("KVGGUF_CUDA_ATTEND");
        // many queries: the tensor-core kernel (where this GPU has one), then the scalar ones alone
        g_attend_ctx = g_ctx;
        run_attend_prefill("the default kernels: tensor cores from compute capability 8.0", k_tol_f16);
        kvg_cuda_ctx * rows_ctx = NULL;
        setenv("KVGGUF_CUDA_ATTEND", "rows", 1);
        if (kvg_cuda_ctx_init(0, g_stream, &rows_ctx) != KVG_OK) {
            mismatch("kvg_cuda_ctx_init (rows attention): %s", kvg_last_error());
        } else {
            g_attend_ctx = rows_ctx;
            run_attend_prefill("the scalar kernels alone", k_tol_exact);
        }
        unsetenv("KVGGUF_CUDA_ATTEND");
        g_attend_ctx = g_ctx;
        run_encode_batch();
        run_gather_q();
        run_pass();
        kvg_cuda_ctx * parts_ctx = NULL;  // a pass launching each part's kernel, as before the fused one
        setenv("KVGGUF_CUDA_ATTEND", "parts", 1);
        if (kvg_cuda_ctx_init(0, g_stream, &parts_ctx) != KVG_OK) {
            mismatch("kvg_cuda_ctx_init (a launch a part): %s", kvg_last_error());
        } else {
            run_pass_fused(parts_ctx);
        }
        unsetenv("KVGGUF_CUDA_ATTEND");
        // the cells: the scalar kernels alone at their bounds, then the default ones (the tensor
        // cores for many queries a KV head, from compute capability 8.0) at f16's
        g_attend_ctx = rows_ctx ? rows_ctx : g_ctx;
        run_cells("the scalar kernels alone");
        g_attend_ctx = g_ctx;
        g_tol        = k_tol_f16;
        run_cells("the default kernels: tensor cores for many queries");
        g_tol = k_tol_exact;
        // rotq; then kivi keys in groups of 64 tokens (head dim 96: kivi's) beside rotq and kivi values
        run_store_hooks({ "rotq",
                          128,
                          64,
                          { KVG_CODEC_F16, KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ4 },
                          { KVG_CODEC_F16, KVG_CODEC_ROTQ2, KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ3 },
                          KVG_CODEC_ROTQ4,
                          KVG_CODEC_ROTQ3,
                          KVG_CODEC_ROTQ2,
                          KVG_DEFAULT_GROUP_SIZE });
        run_store_hooks({ "kivi",
                          96,
                          64,
                          { KVG_CODEC_F16, KVG_CODEC_KIVI4, KVG_CODEC_KIVI4, KVG_CODEC_KIVI2 },
                          { KVG_CODEC_F16, KVG_CODEC_ROTQ2, KVG_CODEC_KIVI4, KVG_CODEC_KIVI2 },
                          KVG_CODEC_KIVI4,
                          KVG_CODEC_KIVI2,
                          KVG_CODEC_KIVI2,
                          64 });
        attend_bad = g_bad - before;
        if (timing) {
            run_timing(generic);
            run_timing_layer(parts_ctx);
            run_timing_prefill(rows_ctx);
        }
        if (parts_ctx) {
            kvg_cuda_ctx_free(parts_ctx);
        }
        if (rows_ctx) {
            kvg_cuda_ctx_free(rows_ctx);
        }
        if (generic) {
            kvg_cuda_ctx_free(generic);
        }
        kvg_cuda_ctx_free(g_ctx);
    } else {
        printf("attend: not emulated (warp shuffles); needs a GPU\n");
    }
    printf("\ncuda_check%s: %ld checks, %ld mismatches (api %ld, codecs %ld, refusals %ld, attend %ld)\n",
           g_emulate ? " --emulate" : "", g_checks, g_bad, api_bad, codec_bad, refusal_bad, attend_bad);
    if (g_bad > MAX_REPORTS) {
        printf("(only the first %d mismatches were printed)\n", MAX_REPORTS);
    }
    printf("%s\n", g_bad ? "FAIL" : "PASS");
    return g_bad ? 1 : 0;
}
