// simd_neon.c: NEON codec kernels for kivi and rotq, the AArch64 counterparts of simd_avx2.c
// (Advanced SIMD is part of the base ISA there, so no flags and no CPU check). The attention
// kernels are in attend_simd.h (its NEON primitives in attend_neon.c).
//
// As in simd_avx2.c, each kernel performs the same float operations, on the same operands and
// in the same order, as the scalar oracle (kivi.c, rotq.c): separate multiplies and adds, never
// vfmaq, so the encoded bytes are bit-identical to the reference. Shapes outside a kernel's
// fast path (rows not a multiple of 8 channels, rotq head_dim < 8) return KVG_NOT_HANDLED.
#include "kvg_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

#    include "kvg_neon.h"

#    include <math.h>

int kvg_neon_built(void) {
    return 1;
}

// Writes 8 codes (32-bit lanes, each < 2^bits) as `bits` bytes at p.
static inline void pack8(u32x8 q, int bits, const codes8 * c, uint8_t * p) {
    if (bits == 8) {
        vst1_u8(p, vmovn_u16(vcombine_u16(vmovn_u32(q.lo), vmovn_u32(q.hi))));
        return;
    }
    // 8 * bits <= 32: the shifted codes are disjoint bit fields, so their sum is their OR
    const uint32x4_t s = vaddq_u32(vshlq_u32(q.lo, c->shl_lo), vshlq_u32(q.hi, c->shl_hi));
    store_le(p, vaddvq_u32(s), bits);
}

// ---- kivi row kernels ----------------------------------------------------------------------

// vminq/vmaxq would order -0 below +0, which the oracle's comparisons do not: select instead.
static inline float32x4_t min_sel(float32x4_t x, float32x4_t m) {
    return vbslq_f32(vcltq_f32(x, m), x, m);  // x < m ? x : m
}

static inline float32x4_t max_sel(float32x4_t x, float32x4_t m) {
    return vbslq_f32(vcgtq_f32(x, m), x, m);  // x > m ? x : m
}

static void kivi_minmax_update(const float * x, float * mn, float * mx, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        vst1q_f32(mn + i, min_sel(v, vld1q_f32(mn + i)));
        vst1q_f32(mx + i, max_sel(v, vld1q_f32(mx + i)));
    }
    for (; i < n; i++) {
        mn[i] = x[i] < mn[i] ? x[i] : mn[i];
        mx[i] = x[i] > mx[i] ? x[i] : mx[i];
    }
}

// Order-independent: min/max of a set are unique up to the sign of zero, and the group
// parameters canonicalize -0 (kivi.c), so a tree reduction gives the oracle's bytes.
static void kivi_minmax_span(const float * x, int64_t n, float * mn, float * mx) {
    int64_t i  = 0;
    float   lo = x[0];
    float   hi = x[0];
    if (n >= 4) {
        float32x4_t vlo = vld1q_f32(x);
        float32x4_t vhi = vlo;
        for (i = 4; i + 4 <= n; i += 4) {
            const float32x4_t v = vld1q_f32(x + i);
            vlo                 = min_sel(v, vlo);
            vhi                 = max_sel(v, vhi);
        }
        float l[4], h[4];
        vst1q_f32(l, vlo);
        vst1q_f32(h, vhi);
        lo = l[0];
        hi = h[0];
        for (int k = 1; k < 4; k++) {
            lo = l[k] < lo ? l[k] : lo;
            hi = h[k] > hi ? h[k] : hi;
        }
    }
    for (; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

// kvg_kivi_code on 4 lanes: (x - min) * inv, clamp to [0, top], + 0.5, truncate. No NaN gets
// here and the only tie vmaxq/vminq could break otherwise, -0 against 0, gives +0 either way.
static inline uint32x4_t kivi_code4(const float * x, const float * mf, const float * inv, float32x4_t top) {
    float32x4_t v = vmulq_f32(vsubq_f32(vld1q_f32(x), vld1q_f32(mf)), vld1q_f32(inv));
    v             = vminq_f32(vmaxq_f32(v, vdupq_n_f32(0.0f)), top);
    return vcvtq_u32_f32(vaddq_f32(v, vdupq_n_f32(0.5f)));
}

// n % 8 == 0 and bit_off % 8 == 0 (the caller checked C % 8 == 0).
static void kivi_quant_row(const float * x, const float * mf, const float * inv, int64_t n, int bits, uint8_t * codes,
                           uint64_t bit_off, uint8_t * scratch) {
    (void) scratch;
    const float32x4_t top = vdupq_n_f32((float) ((1 << bits) - 1));
    const codes8      c   = make_codes8(bits);
    uint8_t *         p   = codes + (bit_off >> 3);
    for (int64_t i = 0; i < n; i += 8) {
        const u32x8 q = { kivi_code4(x + i, mf + i, inv + i, top),
                          kivi_code4(x + i + 4, mf + i + 4, inv + i + 4, top) };
        pack8(q, bits, &c, p);
        p += bits;
    }
}

static void kivi_dequant_row(const uint8_t * codes, uint64_t bit_off, const float * mf, const float * sf, int64_t n,
                             int bits, float * out, uint8_t * scratch) {
    (void) scratch;
    const codes8    c = make_codes8(bits);
    const uint8_t * p = codes + (bit_off >> 3);
    for (int64_t i = 0; i < n; i += 8) {
        const u32x8 q = unpack8(p, bits, &c);
        // mf + code * sf, as the oracle: a multiply, then an add
        vst1q_f32(out + i, vaddq_f32(vld1q_f32(mf + i), vmulq_f32(vcvtq_f32_u32(q.lo), vld1q_f32(sf + i))));
        vst1q_f32(out + i + 4, vaddq_f32(vld1q_f32(mf + i + 4), vmulq_f32(vcvtq_f32_u32(q.hi), vld1q_f32(sf + i + 4))));
        p += bits;
    }
}

static const kvg_kivi_ops k_kivi_ops_neon = {
    kivi_minmax_update,
    kivi_minmax_span,
    kivi_quant_row,
    kivi_dequant_row,
};

int kvg_kivi_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    if (job->n_channels % 8 != 0) {
        return KVG_NOT_HANDLED;  // rows would not start on byte boundaries
    }
    return kvg_kivi_encode_with(job, src, dst, &k_kivi_ops_neon);
}

int kvg_kivi_decode_neon(const kvg_job * job, const uint8_t * src, float * dst) {
    if (job->n_channels % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    return kvg_kivi_decode_with(job, src, dst, &k_kivi_ops_neon);
}

// ---- rotq ----------------------------------------------------------------------------------

// One butterfly stage inside a register: lanes whose partner is above them (mask 0) get a + b,
// the others (mask ~0) b' - a' = a - b, with p the register with partners swapped.
static inline float32x4_t butterfly_in(float32x4_t v, float32x4_t p, uint32x4_t upper) {
    return vbslq_f32(upper, vsubq_f32(p, v), vaddq_f32(v, p));
}

// The oracle's butterflies (x[j], x[j+h]) -> (a + b, a - b), stage by stage; d >= 8.
void kvg_fwht_neon(float * x, int64_t d) {
    const uint32x4_t odd  = { 0, ~0u, 0, ~0u };
    const uint32x4_t high = { 0, 0, ~0u, ~0u };
    for (int64_t i = 0; i < d; i += 8) {  // h = 1, 2 inside each register, h = 4 between the two
        float32x4_t a = vld1q_f32(x + i);
        float32x4_t b = vld1q_f32(x + i + 4);
        a             = butterfly_in(a, vrev64q_f32(a), odd);  // swap neighbours
        b             = butterfly_in(b, vrev64q_f32(b), odd);
        a             = butterfly_in(a, vextq_f32(a, a, 2), high);  // swap pairs
        b             = butterfly_in(b, vextq_f32(b, b, 2), high);
        vst1q_f32(x + i, vaddq_f32(a, b));
        vst1q_f32(x + i + 4, vsubq_f32(a, b));
    }
    int64_t h = 8;
    for (; 2 * h < d; h *= 4) {  // two stages per pass (h, 2h): same operations, half the memory traffic
        for (int64_t i = 0; i < d; i += 4 * h) {
            for (int64_t j = i; j < i + h; j += 4) {
                const float32x4_t a  = vld1q_f32(x + j);
                const float32x4_t b  = vld1q_f32(x + j + h);
                const float32x4_t c  = vld1q_f32(x + j + 2 * h);
                const float32x4_t e  = vld1q_f32(x + j + 3 * h);
                const float32x4_t s0 = vaddq_f32(a, b);
                const float32x4_t s1 = vsubq_f32(a, b);
                const float32x4_t s2 = vaddq_f32(c, e);
                const float32x4_t s3 = vsubq_f32(c, e);
                vst1q_f32(x + j, vaddq_f32(s0, s2));
                vst1q_f32(x + j + h, vaddq_f32(s1, s3));
                vst1q_f32(x + j + 2 * h, vsubq_f32(s0, s2));
                vst1q_f32(x + j + 3 * h, vsubq_f32(s1, s3));
            }
        }
    }
    for (; h < d; h *= 2) {  // a last single stage when log2(d) - 3 is odd
        for (int64_t i = 0; i < d; i += 2 * h) {
            for (int64_t j = i; j < i + h; j += 4) {
                const float32x4_t a = vld1q_f32(x + j);
                const float32x4_t b = vld1q_f32(x + j + h);
                vst1q_f32(x + j, vaddq_f32(a, b));
                vst1q_f32(x + j + h, vsubq_f32(a, b));
            }
        }
    }
}

static int rotq_encode_vec(const float * x, int64_t d, const float * sgn, const kvg_rotq_book * book, int bits,
                           float * tmp, uint8_t * q, uint8_t * codes, uint64_t bit_off, uint16_t * norm16) {
    (void) q;
    // sum of squares in 8 lanes (lane i % 8: lo 0..3, hi 4..7), reduced as kvg_rotq_sumsq_ref does
    float32x4_t lo = vdupq_n_f32(0.0f);
    float32x4_t hi = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < d; i += 8) {
        const float32x4_t a = vld1q_f32(x + i);
        const float32x4_t b = vld1q_f32(x + i + 4);
        lo                  = vaddq_f32(lo, vmulq_f32(a, a));
        hi                  = vaddq_f32(hi, vmulq_f32(b, b));
        vst1q_f32(tmp + i, vmulq_f32(a, vld1q_f32(sgn + i)));
        vst1q_f32(tmp + i + 4, vmulq_f32(b, vld1q_f32(sgn + i + 4)));
    }
    const float32x4_t s    = vaddq_f32(lo, hi);                            // l0+l4, l1+l5, l2+l6, l3+l7
    const float32x2_t t    = vadd_f32(vget_low_f32(s), vget_high_f32(s));  // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
    const float       norm = sqrtf(vget_lane_f32(t, 0) + vget_lane_f32(t, 1));
    const uint16_t    n16  = kvg_f32_to_f16(norm);
    if (!kvg_f16_is_finite(n16)) {
        return kvg_fail(KVG_ERR_RANGE, "rotq: vector norm %g does not fit in f16 (<= 65504)", (double) norm);
    }
    *norm16 = n16;
    if (n16 == 0) {
        return KVG_OK;
    }
    const float32x4_t inv = vdupq_n_f32(1.0f / kvg_f16_to_f32(n16));
    kvg_fwht_neon(tmp, d);

    const int     nb  = (1 << bits) - 1;
    const float * bnd = book->boundary[bits];
    const codes8  c   = make_codes8(bits);
    uint8_t *     p   = codes + (bit_off >> 3);  // d * bits is a multiple of 8: aligned
    for (int64_t i = 0; i < d; i += 8) {
        const float32x4_t ylo = vmulq_f32(vld1q_f32(tmp + i), inv);
        const float32x4_t yhi = vmulq_f32(vld1q_f32(tmp + i + 4), inv);
        u32x8             cnt = { vdupq_n_u32(0), vdupq_n_u32(0) };
        for (int k = 0; k < nb; k++) {  // code = number of boundaries below y; a true compare is ~0 = -1
            const float32x4_t b = vdupq_n_f32(bnd[k]);
            cnt.lo              = vsubq_u32(cnt.lo, vcgtq_f32(ylo, b));
            cnt.hi              = vsubq_u32(cnt.hi, vcgtq_f32(yhi, b));
        }
        pack8(cnt, bits, &c, p);
        p += bits;
    }
    return KVG_OK;
}

static void rotq_decode_vec(const uint8_t * codes, uint64_t bit_off, int64_t d, int bits, const kvg_rotq_book * book,
                            const float * sgn, float nf, float * out, uint8_t * q) {
    (void) q;
    const uint8x16x4_t cb = load_book(book->centroid[bits]);
    const codes8       c  = make_codes8(bits);
    const uint8_t *    p  = codes + (bit_off >> 3);
    for (int64_t i = 0; i < d; i += 8) {
        const u32x8 idx = unpack8(p, bits, &c);
        vst1q_f32(out + i, book_lookup(&cb, idx.lo));
        vst1q_f32(out + i + 4, book_lookup(&cb, idx.hi));
        p += bits;
    }
    kvg_fwht_neon(out, d);
    const float32x4_t f = vdupq_n_f32(nf * (1.0f / (float) d));
    for (int64_t i = 0; i < d; i += 4) {
        vst1q_f32(out + i, vmulq_f32(vmulq_f32(vld1q_f32(out + i), f), vld1q_f32(sgn + i)));
    }
}

static const kvg_rotq_ops k_rotq_ops_neon = { rotq_encode_vec, rotq_decode_vec };

int kvg_rotq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    return kvg_rotq_encode_with(job, src, dst, &k_rotq_ops_neon);
}

int kvg_rotq_decode_neon(const kvg_job * job, const uint8_t * src, float * dst) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    return kvg_rotq_decode_with(job, src, dst, &k_rotq_ops_neon);
}

// FCVTN rounds to nearest even under the default FPCR, as kvg_f32_to_f16 does, and overflow,
// Inf and subnormals come out the same. NaN is where they part: the hardware keeps the top of
// the payload, the oracle writes one quiet NaN (sign | 0x7e00), so NaN lanes are replaced.
void kvg_f32_to_f16_row_neon(const float * x, uint16_t * y, int64_t n) {
    const uint16x4_t qnan = vdup_n_u16(0x7e00);
    const uint16x4_t sign = vdup_n_u16(0x8000);
    int64_t          i    = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v   = vld1q_f32(x + i);
        const uint16x4_t  h   = vreinterpret_u16_f16(vcvt_f16_f32(v));
        const uint16x4_t  nan = vmovn_u32(vmvnq_u32(vceqq_f32(v, v)));                      // x != x
        const uint16x4_t  s   = vand_u16(vshrn_n_u32(vreinterpretq_u32_f32(v), 16), sign);  // FPCR.DN may drop it
        vst1_u16(y + i, vbsl_u16(nan, vorr_u16(s, qnan), h));
    }
    for (; i < n; ++i) {
        y[i] = kvg_f32_to_f16(x[i]);
    }
}

#else  // not an AArch64 build: the dispatcher never selects these

void kvg_fwht_neon(float * x, int64_t d) {
    kvg_fwht_ref(x, d);
}

void kvg_f32_to_f16_row_neon(const float * x, uint16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = kvg_f32_to_f16(x[i]);
    }
}

int kvg_neon_built(void) {
    return 0;
}

int kvg_kivi_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_decode_neon(const kvg_job * job, const uint8_t * src, float * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_decode_neon(const kvg_job * job, const uint8_t * src, float * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

#endif
