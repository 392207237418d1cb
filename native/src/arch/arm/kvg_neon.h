// kvg_neon.h: inline NEON helpers shared by the *_neon.c files; include only inside their
// AArch64 build guard. Eight lanes (8 codes fill exactly `bits` bytes, as in kvg_avx2.h) are a
// pair of 4-lane registers: lo holds lanes 0..3, hi lanes 4..7.
#ifndef KVG_NEON_H
#define KVG_NEON_H

#include "kvg_internal.h"
#include "kvg_le.h"

#include <arm_neon.h>

typedef struct u32x8 {
    uint32x4_t lo;
    uint32x4_t hi;
} u32x8;

typedef struct f32x8 {
    float32x4_t lo;
    float32x4_t hi;
} f32x8;

// Code i of 8 sits at bit i * bits of a little-endian word; vshlq by a negative count shifts
// right, so shr is shl negated.
typedef struct codes8 {
    int32x4_t  shl_lo;
    int32x4_t  shl_hi;
    int32x4_t  shr_lo;
    int32x4_t  shr_hi;
    uint32x4_t mask;
} codes8;

static inline codes8 make_codes8(int bits) {
    const int32x4_t i = { 0, 1, 2, 3 };
    codes8          c;
    c.shl_lo = vmulq_n_s32(i, bits);
    c.shl_hi = vmulq_n_s32(vaddq_s32(i, vdupq_n_s32(4)), bits);
    c.shr_lo = vnegq_s32(c.shl_lo);
    c.shr_hi = vnegq_s32(c.shl_hi);
    c.mask   = vdupq_n_u32((1u << bits) - 1);
    return c;
}

// 8 codes from the `bits` bytes at p, as 32-bit lanes.
static inline u32x8 unpack8(const uint8_t * p, int bits, const codes8 * c) {
    u32x8 r;
    if (bits == 8) {
        const uint16x8_t w = vmovl_u8(vld1_u8(p));
        r.lo               = vmovl_u16(vget_low_u16(w));
        r.hi               = vmovl_high_u16(w);
        return r;
    }
    const uint32x4_t w = vdupq_n_u32(load_le(p, bits));
    r.lo               = vandq_u32(vshlq_u32(w, c->shr_lo), c->mask);
    r.hi               = vandq_u32(vshlq_u32(w, c->shr_hi), c->mask);
    return r;
}

// The 16 floats at cb (a rotq codebook row) as one 64-byte table for vqtbl4q_u8.
static inline uint8x16x4_t load_book(const float * cb) {
    uint8x16x4_t t;
    t.val[0] = vreinterpretq_u8_f32(vld1q_f32(cb));
    t.val[1] = vreinterpretq_u8_f32(vld1q_f32(cb + 4));
    t.val[2] = vreinterpretq_u8_f32(vld1q_f32(cb + 8));
    t.val[3] = vreinterpretq_u8_f32(vld1q_f32(cb + 12));
    return t;
}

// cb[idx] for 4 indices < 16: a byte table lookup of bytes 4 idx .. 4 idx + 3, so the floats
// come out as they are stored.
static inline float32x4_t book_lookup(const uint8x16x4_t * cb, uint32x4_t idx) {
    const uint32x4_t b = vmlaq_n_u32(vdupq_n_u32(0x03020100u), idx, 0x04040404u);
    return vreinterpretq_f32_u8(vqtbl4q_u8(*cb, vreinterpretq_u8_u32(b)));
}

#endif  // KVG_NEON_H
