// simd_avx2.c: AVX2 codec kernels for kivi and rotq (the *avx2* files alone are compiled with
// -mavx2 -mfma -mf16c; cpu.c decides at run time whether they run). The attention kernels are in
// attend_simd.h (its AVX2 primitives in attend_avx2.c).
//
// Each kernel performs the same float operations, on the same operands and in the same order,
// as the scalar oracle it replaces (kivi.c, rotq.c); with -ffp-contract=off (no fused
// multiply-add) the encoded bytes are therefore bit-identical to the reference. Shapes
// outside a kernel's fast path (rows not a multiple of 8 channels, rotq head_dim < 8) return
// KVG_NOT_HANDLED and run on the reference instead.
#include "kvg_internal.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#    include "kvg_avx2.h"

#    include <math.h>

int kvg_avx2_built(void) {
    return 1;
}

// Writes 8 codes (32-bit lanes, each < 2^bits) as `bits` bytes at p.
static inline void pack8(__m256i q, int bits, __m256i sh, uint8_t * p) {
    if (bits == 8) {
        const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *) p, _mm_packus_epi16(w16, w16));
        return;
    }
    const __m256i s = _mm256_sllv_epi32(q, sh);  // 8 * bits <= 32: disjoint bit fields
    __m128i       x = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x               = _mm_or_si128(x, _mm_shuffle_epi32(x, 0x4E));
    x               = _mm_or_si128(x, _mm_shuffle_epi32(x, 0xB1));
    store_le(p, (uint32_t) _mm_cvtsi128_si32(x), bits);
}

// ---- kivi row kernels ----------------------------------------------------------------------

static void kivi_minmax_update(const float * x, float * mn, float * mx, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        // minps(a, b) = a < b ? a : b, as the oracle's x < mn ? x : mn
        _mm256_storeu_ps(mn + i, _mm256_min_ps(v, _mm256_loadu_ps(mn + i)));
        _mm256_storeu_ps(mx + i, _mm256_max_ps(v, _mm256_loadu_ps(mx + i)));
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
    if (n >= 8) {
        __m256 vlo = _mm256_loadu_ps(x);
        __m256 vhi = vlo;
        for (i = 8; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            vlo            = _mm256_min_ps(v, vlo);
            vhi            = _mm256_max_ps(v, vhi);
        }
        __m128 l = _mm_min_ps(_mm256_castps256_ps128(vlo), _mm256_extractf128_ps(vlo, 1));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(vhi), _mm256_extractf128_ps(vhi, 1));
        l        = _mm_min_ps(l, _mm_movehl_ps(l, l));
        h        = _mm_max_ps(h, _mm_movehl_ps(h, h));
        l        = _mm_min_ss(l, _mm_shuffle_ps(l, l, 0x55));
        h        = _mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55));
        lo       = _mm_cvtss_f32(l);
        hi       = _mm_cvtss_f32(h);
    }
    for (; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
}

// n % 8 == 0 and bit_off % 8 == 0 (the caller checked C % 8 == 0).
static void kivi_quant_row(const float * x, const float * mf, const float * inv, int64_t n, int bits, uint8_t * codes,
                           uint64_t bit_off, uint8_t * scratch) {
    (void) scratch;
    const __m256  top  = _mm256_set1_ps((float) ((1 << bits) - 1));
    const __m256  zero = _mm256_setzero_ps();
    const __m256  half = _mm256_set1_ps(0.5f);
    const __m256i sh   = lane_shifts(bits);
    uint8_t *     p    = codes + (bit_off >> 3);
    for (int64_t i = 0; i < n; i += 8) {
        // same steps as kvg_kivi_code: (x - min) * inv, clamp to [0, top], + 0.5, truncate
        __m256 v =
            _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(mf + i)), _mm256_loadu_ps(inv + i));
        v = _mm256_max_ps(v, zero);
        v = _mm256_min_ps(v, top);
        pack8(_mm256_cvttps_epi32(_mm256_add_ps(v, half)), bits, sh, p);
        p += bits;
    }
}

static void kivi_dequant_row(const uint8_t * codes, uint64_t bit_off, const float * mf, const float * sf, int64_t n,
                             int bits, float * out, uint8_t * scratch) {
    (void) scratch;
    const __m256i   sh   = lane_shifts(bits);
    const __m256i   mask = _mm256_set1_epi32((1 << bits) - 1);
    const uint8_t * p    = codes + (bit_off >> 3);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 q = _mm256_cvtepi32_ps(unpack8(p, bits, sh, mask));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(mf + i), _mm256_mul_ps(q, _mm256_loadu_ps(sf + i))));
        p += bits;
    }
}

static const kvg_kivi_ops k_kivi_ops_avx2 = {
    kivi_minmax_update,
    kivi_minmax_span,
    kivi_quant_row,
    kivi_dequant_row,
};

int kvg_kivi_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    if (job->n_channels % 8 != 0) {
        return KVG_NOT_HANDLED;  // rows would not start on byte boundaries
    }
    return kvg_kivi_encode_with(job, src, dst, &k_kivi_ops_avx2);
}

int kvg_kivi_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst) {
    if (job->n_channels % 8 != 0) {
        return KVG_NOT_HANDLED;
    }
    return kvg_kivi_decode_with(job, src, dst, &k_kivi_ops_avx2);
}

// ---- rotq ----------------------------------------------------------------------------------

// The oracle's butterflies (x[j], x[j+h]) -> (a + b, a - b), stage by stage; d >= 8.
void kvg_fwht_avx2(float * x, int64_t d) {
    for (int64_t i = 0; i < d; i += 8) {  // h = 1, 2, 4 inside one register
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 p = _mm256_permute_ps(v, 0xB1);  // swap neighbours
        v        = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xAA);
        p        = _mm256_permute_ps(v, 0x4E);  // swap pairs
        v        = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xCC);
        p        = _mm256_permute2f128_ps(v, v, 0x01);  // swap halves
        v        = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xF0);
        _mm256_storeu_ps(x + i, v);
    }
    int64_t h = 8;
    for (; 2 * h < d; h *= 4) {  // two stages per pass (h, 2h): same operations, half the memory traffic
        for (int64_t i = 0; i < d; i += 4 * h) {
            for (int64_t j = i; j < i + h; j += 8) {
                const __m256 a  = _mm256_loadu_ps(x + j);
                const __m256 b  = _mm256_loadu_ps(x + j + h);
                const __m256 c  = _mm256_loadu_ps(x + j + 2 * h);
                const __m256 e  = _mm256_loadu_ps(x + j + 3 * h);
                const __m256 s0 = _mm256_add_ps(a, b);
                const __m256 s1 = _mm256_sub_ps(a, b);
                const __m256 s2 = _mm256_add_ps(c, e);
                const __m256 s3 = _mm256_sub_ps(c, e);
                _mm256_storeu_ps(x + j, _mm256_add_ps(s0, s2));
                _mm256_storeu_ps(x + j + h, _mm256_add_ps(s1, s3));
                _mm256_storeu_ps(x + j + 2 * h, _mm256_sub_ps(s0, s2));
                _mm256_storeu_ps(x + j + 3 * h, _mm256_sub_ps(s1, s3));
            }
        }
    }
    for (; h < d; h *= 2) {  // a last single stage when log2(d) - 3 is odd
        for (int64_t i = 0; i < d; i += 2 * h) {
            for (int64_t j = i; j < i + h; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j);
                const __m256 b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
        }
    }
}

static int rotq_encode_vec(const float * x, int64_t d, const float * sgn, const kvg_rotq_book * book, int bits,
                           float * tmp, uint8_t * q, uint8_t * codes, uint64_t bit_off, uint16_t * norm16) {
    (void) q;
    // sum of squares in 8 lanes (lane i % 8), reduced as kvg_rotq_sumsq_ref does
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc            = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
        _mm256_storeu_ps(tmp + i, _mm256_mul_ps(v, _mm256_loadu_ps(sgn + i)));
    }
    __m128 s            = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // l0+l4, l1+l5, ...
    s                   = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (l0+l4)+(l2+l6), ...
    s                   = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    const float    norm = sqrtf(_mm_cvtss_f32(s));
    const uint16_t n16  = kvg_f32_to_f16(norm);
    if (!kvg_f16_is_finite(n16)) {
        return kvg_fail(KVG_ERR_RANGE, "rotq: vector norm %g does not fit in f16 (<= 65504)", (double) norm);
    }
    *norm16 = n16;
    if (n16 == 0) {
        return KVG_OK;
    }
    const __m256 inv = _mm256_set1_ps(1.0f / kvg_f16_to_f32(n16));
    kvg_fwht_avx2(tmp, d);

    const int nb = (1 << bits) - 1;
    __m256    bnd[15];
    for (int k = 0; k < nb; k++) {
        bnd[k] = _mm256_set1_ps(book->boundary[bits][k]);
    }
    const __m256i sh = lane_shifts(bits);
    uint8_t *     p  = codes + (bit_off >> 3);  // d * bits is a multiple of 8: aligned
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 y   = _mm256_mul_ps(_mm256_loadu_ps(tmp + i), inv);
        __m256i      cnt = _mm256_setzero_si256();
        for (int k = 0; k < nb; k++) {  // code = number of boundaries below y
            cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(y, bnd[k], _CMP_GT_OQ)));
        }
        pack8(cnt, bits, sh, p);
        p += bits;
    }
    return KVG_OK;
}

static void rotq_decode_vec(const uint8_t * codes, uint64_t bit_off, int64_t d, int bits, const kvg_rotq_book * book,
                            const float * sgn, float nf, float * out, uint8_t * q) {
    (void) q;
    const __m256    cb_lo = _mm256_loadu_ps(book->centroid[bits]);
    const __m256    cb_hi = _mm256_loadu_ps(book->centroid[bits] + 8);
    const __m256i   sh    = lane_shifts(bits);
    const __m256i   mask  = _mm256_set1_epi32((1 << bits) - 1);
    const uint8_t * p     = codes + (bit_off >> 3);
    for (int64_t i = 0; i < d; i += 8) {
        const __m256i idx = unpack8(p, bits, sh, mask);
        __m256        v   = _mm256_permutevar8x32_ps(cb_lo, idx);  // uses the low 3 bits
        if (bits == 4) {
            const __m256 hi = _mm256_permutevar8x32_ps(cb_hi, idx);
            v = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> sign
        }
        _mm256_storeu_ps(out + i, v);
        p += bits;
    }
    kvg_fwht_avx2(out, d);
    const __m256 f = _mm256_set1_ps(nf * (1.0f / (float) d));
    for (int64_t i = 0; i < d; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(out + i), f), _mm256_loadu_ps(sgn + i)));
    }
}

static const kvg_rotq_ops k_rotq_ops_avx2 = { rotq_encode_vec, rotq_decode_vec };

int kvg_rotq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    return kvg_rotq_encode_with(job, src, dst, &k_rotq_ops_avx2);
}

int kvg_rotq_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst) {
    if (job->head_dim < 8) {
        return KVG_NOT_HANDLED;
    }
    return kvg_rotq_decode_with(job, src, dst, &k_rotq_ops_avx2);
}

// F16C rounds to nearest even like kvg_f32_to_f16, so the bits are the same; the store's
// read path (cold rows back to llama.cpp as f16) spends most of its time here otherwise.
// NaN is where they part (F16C keeps the top of the payload, the oracle writes one quiet NaN
// per sign): eight values with a NaN among them go to the oracle.
void kvg_f32_to_f16_row_avx2(const float * x, uint16_t * y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
            for (int k = 0; k < 8; k++) {
                y[i + k] = kvg_f32_to_f16(x[i + k]);
            }
            continue;
        }
        const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *) (y + i), h);
    }
    for (; i < n; ++i) {
        y[i] = kvg_f32_to_f16(x[i]);
    }
}

#else  // not an AVX2 build (or not x86-64): the dispatcher never selects these

void kvg_fwht_avx2(float * x, int64_t d) {
    kvg_fwht_ref(x, d);
}

void kvg_f32_to_f16_row_avx2(const float * x, uint16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = kvg_f32_to_f16(x[i]);
    }
}

int kvg_avx2_built(void) {
    return 0;
}

int kvg_kivi_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_kivi_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

int kvg_rotq_decode_avx2(const kvg_job * job, const uint8_t * src, float * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

#endif
