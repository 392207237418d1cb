// kvg_cuda_kernels.cuh: the bodies of the encode and decode kernels, one call per thread's item
// (a value, a group, a byte of codes, or one phase of a rotq head vector), __host__ __device__.
//
// kvg_cuda_codecs.cu wraps them in kernels (grid-stride loops, barriers between a head vector's
// phases); native/cuda/tests/cuda_check.cu --emulate calls them in plain loops on the host, in the
// kernels' order, and compares the bytes with the C reference's: the logic of each kernel (indices,
// packing, roundings) is then checked without a GPU, and only the launch, the barriers and the
// device's arithmetic are left to a GPU run.
//
// Each body follows the scalar reference: f16.c (kvg_f16_encode_ref), kivi.c (kivi_group_params,
// minmax_*_ref, kvg_kivi_code, dequant_row_ref), rotq.c (kvg_rotq_sumsq_ref, kvg_rotq_rotate,
// encode_vec_ref, decode_vec_ref).
#ifndef KVG_CUDA_KERNELS_CUH
#define KVG_CUDA_KERNELS_CUH

#include "kvg_cuda_common.cuh"

// ---- f16 -----------------------------------------------------------------------------------

KC_HD void kc_f16_encode_at(int64_t e, const void * src, int f16, int64_t rs, int64_t cs, int64_t C, uint8_t * dst,
                            kc_status * st) {
    const int64_t  t = e / C, c = e % C;
    const float    x = kc_load(src, f16, t * rs + c * cs);
    const uint16_t h = kc_f32_to_f16(x);
    if (!kc_is_finite(x)) {
        kc_flag(st, KC_NONFINITE, (unsigned long long) e);
    } else if (!kc_f16_is_finite(h)) {
        kc_flag(st, KC_RANGE, (unsigned long long) e);
    }
    kc_put_u16(dst + 2 * e, h);
}

KC_HD void kc_f16_check_at(int64_t e, const uint8_t * src, kc_status * st) {
    if (!kc_f16_is_finite(kc_get_u16(src + 2 * e))) {
        kc_flag(st, KC_CORRUPT, (unsigned long long) e);
    }
}

KC_HD void kc_f16_decode_at(int64_t e, const uint8_t * src, int64_t C, void * dst, int f16, int64_t rs, int64_t cs) {
    const int64_t t = e / C, c = e % C;
    kc_store(dst, f16, t * rs + c * cs, kc_f16_to_f32(kc_get_u16(src + 2 * e)));
}

// ---- kivi ----------------------------------------------------------------------------------

struct kc_kivi {
    int     kind_k;  // 1: groups per channel over G tokens; 0: per token over G channels
    int     bits;
    int64_t T, C, G, n_cg;  // n_cg = ceil(C / G)
    int64_t n_groups, n_values, code_bytes;
};

// kivi.c's kivi_group_params: the f16 min (rounded down) and scale (rounded up) of a group whose
// float min and max are mn and mx; 0 when they do not fit in f16.
KC_HD int kc_kivi_params(float mn, float mx, int bits, uint16_t * m16_out, uint16_t * s16_out) {
    const double top = (double) ((1 << bits) - 1);
    mn               = kc_add(mn, 0.0f);  // -0 -> +0
    if (!(mn >= -65504.0f && mx <= 65504.0f)) {
        return 0;
    }
    uint16_t m16 = kc_f32_to_f16(mn);
    uint16_t s16 = 0;
    if (mn != mx) {
        if (kc_f16_to_f32(m16) > mn) {
            m16 = kc_f16_next_down(m16);
        }
        const double s = kc_ddiv(kc_dsub((double) mx, (double) kc_f16_to_f32(m16)), top);
        s16            = kc_f32_to_f16(kc_d2f(s));
        if ((double) kc_f16_to_f32(s16) < s) {
            s16 = kc_f16_next_up(s16);
        }
        if (!kc_f16_is_finite(s16)) {
            return 0;
        }
    }
    *m16_out = m16;
    *s16_out = s16;
    return 1;
}

// Group g: min and max in the reference's order (K: down the group's tokens from its first, as
// minmax_update_ref; V: along its channels from its first, as minmax_span_ref), its f16 min and
// scale into headers[4g..4g+4).
KC_HD void kc_kivi_group_at(int64_t g, const kc_kivi & k, const void * src, int f16, int64_t rs, int64_t cs,
                            uint8_t * headers, kc_status * st) {
    float   mn = 0.0f, mx = 0.0f;
    int64_t t0, t1, c0, c1;
    if (k.kind_k) {
        t0 = (g / k.C) * k.G;
        t1 = t0 + k.G < k.T ? t0 + k.G : k.T;
        c0 = g % k.C;
        c1 = c0 + 1;
    } else {
        t0 = g / k.n_cg;
        t1 = t0 + 1;
        c0 = (g % k.n_cg) * k.G;
        c1 = c0 + k.G < k.C ? c0 + k.G : k.C;
    }
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t c = c0; c < c1; c++) {
            const float x = kc_load(src, f16, t * rs + c * cs);
            if (!kc_is_finite(x)) {
                kc_flag(st, KC_NONFINITE, (unsigned long long) (t * k.C + c));
            }
            if (t == t0 && c == c0) {
                mn = x;
                mx = x;
            } else {
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
        }
    }
    uint16_t m16 = 0, s16 = 0;
    if (!kc_kivi_params(mn, mx, k.bits, &m16, &s16)) {
        kc_flag(st, KC_RANGE, (unsigned long long) g);
    }
    kc_put_u16(headers + 4 * g, m16);
    kc_put_u16(headers + 4 * g + 2, s16);
}

KC_HD int64_t kc_kivi_group_of(const kc_kivi & k, int64_t e) {
    const int64_t t = e / k.C, c = e % k.C;
    return k.kind_k ? (t / k.G) * k.C + c : t * k.n_cg + c / k.G;
}

// Byte b of the code stream: each code as kvg_kivi_code computes it, against the group's stored
// (f16) min and 1 / scale, as the reference quantizes.
KC_HD uint8_t kc_kivi_code_byte_at(int64_t b, const kc_kivi & k, const void * src, int f16, int64_t rs, int64_t cs,
                                   const uint8_t * headers) {
    const float top = (float) ((1 << k.bits) - 1);
    return kc_pack_byte((uint64_t) b, k.bits, (uint64_t) k.n_values, [&](uint64_t e) -> unsigned {
        const int64_t  g   = kc_kivi_group_of(k, (int64_t) e);
        const uint16_t s16 = kc_get_u16(headers + 4 * g + 2);
        const float    mf  = kc_f16_to_f32(kc_get_u16(headers + 4 * g));
        const float    inv = s16 != 0 ? kc_div(1.0f, kc_f16_to_f32(s16)) : 0.0f;
        const int64_t  t = (int64_t) e / k.C, c = (int64_t) e % k.C;
        float          v = kc_mul(kc_sub(kc_load(src, f16, t * rs + c * cs), mf), inv);
        v                = v > 0.0f ? v : 0.0f;
        v                = v < top ? v : top;
        return (unsigned) (int) kc_add(v, 0.5f);
    });
}

KC_HD void kc_kivi_check_at(int64_t g, const uint8_t * headers, kc_status * st) {
    const uint16_t m16 = kc_get_u16(headers + 4 * g);
    const uint16_t s16 = kc_get_u16(headers + 4 * g + 2);
    if (!kc_f16_is_finite(m16) || !kc_f16_is_finite(s16) || (s16 & 0x8000)) {
        kc_flag(st, KC_CORRUPT, (unsigned long long) g);
    }
}

KC_HD void kc_kivi_decode_at(int64_t e, const kc_kivi & k, const uint8_t * headers, const uint8_t * codes, void * dst,
                             int f16, int64_t rs, int64_t cs) {
    const int64_t  g    = kc_kivi_group_of(k, e);
    const float    mf   = kc_f16_to_f32(kc_get_u16(headers + 4 * g));
    const float    sf   = kc_f16_to_f32(kc_get_u16(headers + 4 * g + 2));
    const unsigned code = kc_get_code(codes, (uint64_t) e * (uint64_t) k.bits, k.bits);
    const int64_t  t = e / k.C, c = e % k.C;
    kc_store(dst, f16, t * rs + c * cs, kc_add(mf, kc_mul((float) code, sf)));
}

// ---- rotq: one head vector v = t * H + h in phases ------------------------------------------

struct kc_rotq {
    int64_t     H, D;  // heads, head_dim (a power of two >= 8)
    int         bits;
    uint64_t    seed;
    int64_t     n_vec;   // n_tokens * H
    int64_t     vbytes;  // D * bits / 8: a vector's code bytes (whole from D = 8 on)
    kc_rotq_tab tab;
};

// Phase 1, coordinate i: y[i] = x[i], flagging a NaN or Inf.
KC_HD void kc_rotq_load_at(int i, int64_t v, const kc_rotq & r, const void * src, int f16, int64_t rs, int64_t cs,
                           float * y, kc_status * st) {
    const int64_t t = v / r.H, h = v % r.H;
    const float   x = kc_load(src, f16, t * rs + (h * r.D + i) * cs);
    if (!kc_is_finite(x)) {
        kc_flag(st, KC_NONFINITE, (unsigned long long) (t * r.H * r.D + h * r.D + i));
    }
    y[i] = x;
}

// Phase 2, lane k < 8 of kvg_rotq_sumsq_ref: the squares of coordinates k, k + 8, ... in order.
KC_HD float kc_rotq_lane_at(int k, const kc_rotq & r, const float * y) {
    float acc = 0.0f;
    for (int64_t i = k; i < r.D; i += 8) {
        acc = kc_add(acc, kc_mul(y[i], y[i]));
    }
    return acc;
}

// Phase 3 (one thread): the lanes reduced as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), the f16 norm
// stored; *skip when the vector stores no codes (norm 0, or out of range: flagged), *inv = 1 / norm.
KC_HD void kc_rotq_norm(int64_t v, const float * lanes, uint8_t * norms, kc_status * st, int * skip, float * inv) {
    const float    ss  = kc_add(kc_add(kc_add(lanes[0], lanes[4]), kc_add(lanes[2], lanes[6])),
                                kc_add(kc_add(lanes[1], lanes[5]), kc_add(lanes[3], lanes[7])));
    const uint16_t n16 = kc_f32_to_f16(kc_sqrt(ss));
    kc_put_u16(norms + 2 * v, n16);
    const int bad = !kc_f16_is_finite(n16);
    if (bad) {
        kc_flag(st, KC_RANGE, (unsigned long long) v);
    }
    *skip = bad || n16 == 0;
    *inv  = kc_div(1.0f, kc_f16_to_f32(n16));
}

// Phase 4, coordinate i: the random sign.
KC_HD void kc_rotq_sign_at(int i, const kc_rotq & r, float * y) {
    y[i] = kc_mul(y[i], kc_sign(r.seed, i));
}

// Phase 5: kc_fwht_pair for every stage. Phase 6, coordinate i: y / n against the boundaries.
KC_HD void kc_rotq_quant_at(int i, const kc_rotq & r, const float * y, float inv, uint8_t * q) {
    const float yi = kc_mul(y[i], inv);
    int         c  = 0;
    for (int k = 0; k < (1 << r.bits) - 1; k++) {
        c += yi > r.tab.boundary[k];  // the number of boundaries below y, as encode_vec_ref counts
    }
    q[i] = (uint8_t) c;
}

// Phase 7, byte b of the vector's codes (0 when the vector stores none).
KC_HD uint8_t kc_rotq_pack_at(int64_t b, const kc_rotq & r, const uint8_t * q, int skip) {
    if (skip) {
        return 0;
    }
    return kc_pack_byte((uint64_t) b, r.bits, (uint64_t) r.D, [&](uint64_t e) -> unsigned { return q[e]; });
}

KC_HD void kc_rotq_check_at(int64_t v, const uint8_t * norms, kc_status * st) {
    const uint16_t n16 = kc_get_u16(norms + 2 * v);
    if (!kc_f16_is_finite(n16) || (n16 & 0x8000)) {
        kc_flag(st, KC_CORRUPT, (unsigned long long) v);
    }
}

// Decode phase 1, coordinate i: the centroid of its code.
KC_HD void kc_rotq_centroid_at(int i, int64_t v, const kc_rotq & r, const uint8_t * codes, float * y) {
    y[i] =
        r.tab.centroid[kc_get_code(codes, ((uint64_t) v * (uint64_t) r.D + (uint64_t) i) * (uint64_t) r.bits, r.bits)];
}

// Decode phase 3 (after the butterflies), coordinate i: (y * (n / d)) * s, or 0 for a zero norm.
KC_HD void kc_rotq_out_at(int i, int64_t v, const kc_rotq & r, const float * y, uint16_t n16, float inv_d, void * dst,
                          int f16, int64_t rs, int64_t cs) {
    const int64_t t = v / r.H, h = v % r.H;
    const float   o = n16 == 0 ? 0.0f : kc_mul(kc_mul(y[i], kc_mul(kc_f16_to_f32(n16), inv_d)), kc_sign(r.seed, i));
    kc_store(dst, f16, t * rs + (h * r.D + i) * cs, o);
}

// ---- the parameters of a launch, from the validated shape (host) -----------------------------

static inline kc_kivi kc_kivi_of(const kc_shape * s) {
    kc_kivi k;
    k.kind_k     = s->kind == KVG_KIND_K;
    k.bits       = s->bits;
    k.T          = s->n_tokens;
    k.C          = s->n_channels;
    k.G          = s->group_size;
    k.n_cg       = (k.C + k.G - 1) / k.G;
    k.n_groups   = k.kind_k ? ((k.T + k.G - 1) / k.G) * k.C : k.T * k.n_cg;
    k.n_values   = s->n_values;
    k.code_bytes = (s->n_values * s->bits + 7) / 8;
    return k;
}

static inline int kc_rotq_of(const kc_shape * s, kc_rotq * r) {
    r->H      = s->n_heads;
    r->D      = s->head_dim;
    r->bits   = s->bits;
    r->seed   = s->seed;
    r->n_vec  = s->n_tokens * s->n_heads;
    r->vbytes = s->head_dim * s->bits / 8;
    return kc_get_rotq_tab(s->bits, s->head_dim, &r->tab);
}

#endif  // KVG_CUDA_KERNELS_CUH
