// f16.c: IEEE binary16 conversion (no F16C needed) and the f16 passthrough codec.
#include "kvg_internal.h"

uint16_t kvg_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000);
    const uint32_t ax   = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {  // Inf, NaN (keep NaN quiet and non-zero)
        return (uint16_t) (sign | 0x7c00 | (ax > 0x7f800000u ? 0x0200 : 0));
    }
    if (ax >= 0x477ff000u) {  // >= 65520 = halfway between 65504 and 2^16: rounds to Inf
        return (uint16_t) (sign | 0x7c00);
    }
    if (ax < 0x38800000u) {      // below 2^-14: f16 subnormal (units of 2^-24) or zero
        if (ax < 0x33000000u) {  // below 2^-25 (half the smallest subnormal): rounds to 0
            return sign;
        }
        const uint32_t e     = ax >> 23;                      // 102..112
        const uint32_t m     = (ax & 0x7fffffu) | 0x800000u;  // value = m * 2^(e-150)
        const uint32_t shift = 126 - e;                       // 14..24
        uint32_t       q     = m >> shift;
        const uint32_t rem   = m & ((1u << shift) - 1);
        const uint32_t half  = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;  // may carry into the smallest normal, which is the right encoding
        }
        return (uint16_t) (sign | q);
    }
    // normal: rebias the exponent (127 -> 15) and round 23 mantissa bits to 10
    const uint32_t r   = ax - ((uint32_t) (127 - 15) << 23);
    uint32_t       h   = r >> 13;
    const uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) {
        h++;
    }
    return (uint16_t) (sign | h);
}

float kvg_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    const uint32_t exp  = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    uint32_t       x;
    if (exp == 0) {
        // zero or subnormal: mant * 2^-24, exact in float
        const float v = (float) mant * 5.9604644775390625e-8f;
        memcpy(&x, &v, sizeof(x));
        x |= sign;
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t kvg_f16_next_up(uint16_t h) {
    if (h == 0x8000 || h == 0x0000) {
        return 0x0001;  // from either zero to the smallest positive subnormal
    }
    return (h & 0x8000) ? (uint16_t) (h - 1) : (uint16_t) (h + 1);
}

uint16_t kvg_f16_next_down(uint16_t h) {
    if (h == 0x8000 || h == 0x0000) {
        return 0x8001;
    }
    return (h & 0x8000) ? (uint16_t) (h + 1) : (uint16_t) (h - 1);
}

// ---- the f16 codec: 16 bits per value ------------------------------------------------------

int kvg_f16_size(const kvg_job * job, size_t * out_bytes) {
    *out_bytes = (size_t) job->n_values * 2;
    return KVG_OK;
}

int kvg_f16_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    const int64_t n = job->n_values;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = kvg_f32_to_f16(src[i]);
        if (!kvg_f16_is_finite(h)) {
            return kvg_fail(KVG_ERR_RANGE, "f16: value %g at index %lld does not fit in f16 (|x| <= 65504)",
                            (double) src[i], (long long) i);
        }
        kvg_put_u16(dst + 2 * i, h);
    }
    return KVG_OK;
}

int kvg_f16_check(const kvg_job * job, const uint8_t * src) {
    const int64_t n = job->n_values;
    for (int64_t i = 0; i < n; i++) {
        if (!kvg_f16_is_finite(kvg_get_u16(src + 2 * i))) {
            return kvg_fail(KVG_ERR_CORRUPT, "f16: Inf or NaN stored at index %lld", (long long) i);
        }
    }
    return KVG_OK;
}

int kvg_f16_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    const int64_t n = job->n_values;
    // validate first so that dst is untouched on failure
    const int st = kvg_f16_check(job, src);
    if (st != KVG_OK) {
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        dst[i] = kvg_f16_to_f32(kvg_get_u16(src + 2 * i));
    }
    return KVG_OK;
}

void kvg_f32_to_f16_row(const float * x, uint16_t * y, int64_t n) {
    if (kvg_simd_on()) {
        KVG_SIMD(kvg_f32_to_f16_row)(x, y, n);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        y[i] = kvg_f32_to_f16(x[i]);
    }
}

// ---- attention: plain dot products and f32 sums over the stored halves ---------------------

// One head of one row as f32.
static void f16_head(const uint8_t * src, int64_t t, int64_t hk, const kvg_job * job, float * out) {
    const uint8_t * p = src + 2 * (t * job->n_channels + hk * job->head_dim);
    for (int64_t i = 0; i < job->head_dim; i++) {
        out[i] = kvg_f16_to_f32(kvg_get_u16(p + 2 * i));
    }
}

int kvg_f16_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                      float * out) {
    const int64_t D   = job->head_dim;
    float *       row = a->tmp;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            f16_head(src, t0 + t, hk, job, row);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * q = a->q + j * D;
                float         s = 0.0f;
                for (int64_t i = 0; i < D; i++) {
                    s += q[i] * row[i];
                }
                out[j * n + t] = s;
            }
        }
    }
    return KVG_OK;
}

int kvg_f16_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                           const kvg_attn * a) {
    const int64_t D   = job->head_dim;
    float *       row = a->tmp;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            f16_head(src, t0 + t, hk, job, row);
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + t];
                float *     acc = a->acc + j * D;
                for (int64_t i = 0; i < D; i++) {
                    acc[i] += w * row[i];
                }
            }
        }
    }
    return KVG_OK;
}
