// attend_avx2.c: the 8-lane primitives of attend_simd.h's attention kernels on AVX2 (with FMA
// and F16C): one __m256 holds 8 floats. The kernels themselves are attend_simd.h's.
#include "kvg_internal.h"

#define KVG_SIMD_NAME(name) name##_avx2

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#    include "kvg_avx2.h"

#    if defined(__GNUC__)
#        define KVG_INLINE static inline __attribute__((always_inline))
#    else
#        define KVG_INLINE static inline
#    endif

#    define KVG_QB 4  // queries per register block

typedef __m256 vf8;

KVG_INLINE vf8 vf8_zero(void) {
    return _mm256_setzero_ps();
}
KVG_INLINE vf8 vf8_set1(float f) {
    return _mm256_set1_ps(f);
}
KVG_INLINE vf8 vf8_load(const float * p) {
    return _mm256_loadu_ps(p);
}
KVG_INLINE void vf8_store(float * p, vf8 v) {
    _mm256_storeu_ps(p, v);
}
KVG_INLINE vf8 vf8_add(vf8 a, vf8 b) {
    return _mm256_add_ps(a, b);
}
KVG_INLINE vf8 vf8_sub(vf8 a, vf8 b) {
    return _mm256_sub_ps(a, b);
}
KVG_INLINE vf8 vf8_mul(vf8 a, vf8 b) {
    return _mm256_mul_ps(a, b);
}
KVG_INLINE vf8 vf8_max(vf8 a, vf8 b) {
    return _mm256_max_ps(a, b);
}
KVG_INLINE vf8 vf8_fma(vf8 a, vf8 b, vf8 c) {
    return _mm256_fmadd_ps(a, b, c);
}
KVG_INLINE vf8 vf8_fma_s(vf8 c, vf8 v, float w) {
    return _mm256_fmadd_ps(_mm256_set1_ps(w), v, c);
}
KVG_INLINE float half_to_float(uint16_t h) {
    return _cvtsh_ss(h);
}

KVG_INLINE float vf8_hsum(vf8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KVG_INLINE float vf8_hmax(vf8 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h        = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h        = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// exp(x) for x <= 0 (a score minus the running maximum): x = k ln2 + r with |r| <= ln2 / 2, the
// Taylor series of exp(r) to r^7 (remainder < 0.347^8 / 8! < 6e-9, relative) times 2^k from the
// exponent bits. Below -87 (exp < 2^-125, nothing next to the maximum's weight of 1) gives 0.
KVG_INLINE vf8 vf8_exp_nonpos(vf8 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 xc = _mm256_max_ps(x, lo);
    const __m256 k  = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256       r  = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);  // ln2 in two parts (Cody and Waite)
    r               = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440054690583e-4f), r);
    __m256 p        = _mm256_set1_ps(1.0f / 5040.0f);
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p               = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256  y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
}

typedef struct lanes {
    __m256i sh;
    __m256i mask;
    __m256  cb_lo;  // rotq centroids 0..7 and 8..15
    __m256  cb_hi;
} lanes;

static lanes make_lanes(int bits, const float * cb) {
    lanes L;
    L.sh    = lane_shifts(bits);
    L.mask  = _mm256_set1_epi32((1 << bits) - 1);
    L.cb_lo = cb ? _mm256_loadu_ps(cb) : _mm256_setzero_ps();
    L.cb_hi = cb ? _mm256_loadu_ps(cb + 8) : _mm256_setzero_ps();
    return L;
}

// Lanes i..i+7 of the head that starts at `row` (bytes of halves, or of codes starting on a
// byte boundary; i is a multiple of 8, so 8 codes take exactly `bits` bytes).
KVG_INLINE vf8 load_lanes(int fam, int bits, const lanes * L, const uint8_t * row, int64_t i) {
    if (fam == KVG_LANES_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (row + 2 * i)));
    }
    if (fam == KVG_LANES_F32) {
        return _mm256_loadu_ps((const float *) (const void *) row + i);
    }
    const __m256i idx = unpack8(row + (i / 8) * bits, bits, L->sh, L->mask);
    if (fam == KVG_LANES_INT) {
        return _mm256_cvtepi32_ps(idx);
    }
    __m256 v = _mm256_permutevar8x32_ps(L->cb_lo, idx);  // uses the low 3 bits of each index
    if (bits == 4) {
        const __m256 hi = _mm256_permutevar8x32_ps(L->cb_hi, idx);
        v               = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> sign
    }
    return v;
}

// Codebook lanes of 8 codes of 1..4 bits already in a word (wfq reads them at any bit).
KVG_INLINE vf8 word_lanes(int bits, const lanes * L, uint32_t w) {
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int) w), L->sh), L->mask);
    __m256        v   = _mm256_permutevar8x32_ps(L->cb_lo, idx);
    if (bits == 4) {
        const __m256 hi = _mm256_permutevar8x32_ps(L->cb_hi, idx);
        v               = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    }
    return v;
}

// T[(w >> (bits * j)) & 255] for lanes j = 0..7 (tcq's windows): eight loads, which measured
// faster than one AVX2 gather on Zen 3 (tcq3 attention over 8,192 rows: 1.9 against 2.6 ms,
// benchmarks/attend_kernels.py).
KVG_INLINE vf8 window_lanes(int bits, const float * T, uint64_t w) {
    const unsigned b = (unsigned) bits;
    return _mm256_setr_ps(T[w & 255], T[(w >> b) & 255], T[(w >> 2 * b) & 255], T[(w >> 3 * b) & 255],
                          T[(w >> 4 * b) & 255], T[(w >> 5 * b) & 255], T[(w >> 6 * b) & 255], T[(w >> 7 * b) & 255]);
}

#else  // not an AVX2 build (or not x86-64): the dispatcher never selects these
#    define KVG_SIMD_STUBS
#endif

#include "attend/attend_simd.h"
