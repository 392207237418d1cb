// attend_neon.c: the 8-lane primitives of attend_simd.h's attention kernels on AArch64 NEON:
// 8 floats are a pair of 4-lane registers (kvg_neon.h's f32x8: lo lanes 0..3, hi 4..7). The
// kernels themselves are attend_simd.h's, the same as on AVX2.
#include "kvg_internal.h"

#define KVG_SIMD_NAME(name) name##_neon

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

#    include "kvg_neon.h"

#    if defined(__GNUC__)
#        define KVG_INLINE static inline __attribute__((always_inline))
#    else
#        define KVG_INLINE static inline
#    endif

#    define KVG_QB 4  // queries per register block: 4 x 4 accumulators of 32 registers

typedef f32x8 vf8;

KVG_INLINE vf8 vf8_pair(float32x4_t lo, float32x4_t hi) {
    vf8 v;
    v.lo = lo;
    v.hi = hi;
    return v;
}

KVG_INLINE vf8 vf8_set1(float f) {
    return vf8_pair(vdupq_n_f32(f), vdupq_n_f32(f));
}
KVG_INLINE vf8 vf8_zero(void) {
    return vf8_set1(0.0f);
}
KVG_INLINE vf8 vf8_load(const float * p) {
    return vf8_pair(vld1q_f32(p), vld1q_f32(p + 4));
}
KVG_INLINE void vf8_store(float * p, vf8 v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
}
KVG_INLINE vf8 vf8_add(vf8 a, vf8 b) {
    return vf8_pair(vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi));
}
KVG_INLINE vf8 vf8_sub(vf8 a, vf8 b) {
    return vf8_pair(vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi));
}
KVG_INLINE vf8 vf8_mul(vf8 a, vf8 b) {
    return vf8_pair(vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi));
}
KVG_INLINE vf8 vf8_max(vf8 a, vf8 b) {
    return vf8_pair(vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi));
}
KVG_INLINE vf8 vf8_fma(vf8 a, vf8 b, vf8 c) {
    return vf8_pair(vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi));
}
KVG_INLINE vf8 vf8_fma_s(vf8 c, vf8 v, float w) {
    return vf8_pair(vfmaq_n_f32(c.lo, v.lo, w), vfmaq_n_f32(c.hi, v.hi, w));
}
KVG_INLINE float vf8_hsum(vf8 v) {
    return vaddvq_f32(vaddq_f32(v.lo, v.hi));
}
KVG_INLINE float vf8_hmax(vf8 v) {
    return vmaxvq_f32(vmaxq_f32(v.lo, v.hi));
}
KVG_INLINE float half_to_float(uint16_t h) {
    return kvg_f16_to_f32(h);
}

// exp(x) for x <= 0, as attend_avx2.c computes it: x = k ln2 + r with |r| <= ln2 / 2, the
// Taylor series of exp(r) to r^7 times 2^k from the exponent bits; 0 below -87.
KVG_INLINE float32x4_t exp_nonpos4(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(-87.0f);
    const float32x4_t xc = vmaxq_f32(x, lo);
    const float32x4_t k  = vrndnq_f32(vmulq_n_f32(xc, 1.44269504088896341f));
    float32x4_t       r  = vfmsq_n_f32(xc, k, 0.693359375f);  // ln2 in two parts (Cody and Waite)
    r                    = vfmsq_n_f32(r, k, -2.12194440054690583e-4f);
    float32x4_t p        = vdupq_n_f32(1.0f / 5040.0f);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p                    = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t   e  = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    const float32x4_t y  = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), vcltq_f32(x, lo)));
}

KVG_INLINE vf8 vf8_exp_nonpos(vf8 x) {
    return vf8_pair(exp_nonpos4(x.lo), exp_nonpos4(x.hi));
}

typedef struct lanes {
    codes8       c;
    uint8x16x4_t cb;  // rotq centroids 0..15 as a byte table
} lanes;

static lanes make_lanes(int bits, const float * cb) {
    static const float zero[16] = { 0 };
    lanes              L;
    L.c  = make_codes8(bits);
    L.cb = load_book(cb ? cb : zero);
    return L;
}

// Lanes i..i+7 of the head that starts at `row` (bytes of halves, or of codes starting on a
// byte boundary; i is a multiple of 8, so 8 codes take exactly `bits` bytes).
KVG_INLINE vf8 load_lanes(int fam, int bits, const lanes * L, const uint8_t * row, int64_t i) {
    if (fam == KVG_LANES_F16) {
        const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(row + 2 * i));  // bytes: rows need no alignment
        return vf8_pair(vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h));
    }
    if (fam == KVG_LANES_F32) {
        const float * f = (const float *) (const void *) row + i;
        return vf8_pair(vld1q_f32(f), vld1q_f32(f + 4));
    }
    const u32x8 idx = unpack8(row + (i / 8) * bits, bits, &L->c);
    if (fam == KVG_LANES_INT) {
        return vf8_pair(vcvtq_f32_u32(idx.lo), vcvtq_f32_u32(idx.hi));
    }
    return vf8_pair(book_lookup(&L->cb, idx.lo), book_lookup(&L->cb, idx.hi));
}

// Codebook lanes of 8 codes of 1..4 bits already in a word (wfq reads them at any bit).
KVG_INLINE vf8 word_lanes(int bits, const lanes * L, uint32_t w) {
    (void) bits;
    const uint32x4_t v  = vdupq_n_u32(w);
    const uint32x4_t lo = vandq_u32(vshlq_u32(v, L->c.shr_lo), L->c.mask);
    const uint32x4_t hi = vandq_u32(vshlq_u32(v, L->c.shr_hi), L->c.mask);
    return vf8_pair(book_lookup(&L->cb, lo), book_lookup(&L->cb, hi));
}

// T[(w >> (bits * j)) & 255] for lanes j = 0..7 (tcq's windows): NEON has no gather, so eight
// loads.
KVG_INLINE vf8 window_lanes(int bits, const float * T, uint64_t w) {
    float f[8];
    for (int j = 0; j < 8; j++) {
        f[j] = T[(w >> (bits * j)) & 255];
    }
    return vf8_load(f);
}

#else  // not an AArch64 build: the dispatcher never selects these
#    define KVG_SIMD_STUBS
#endif

#include "attend/attend_simd.h"
