// pack.c: little-endian bitstreams of 1..8-bit codes, ceil(n*bits/8) bytes, no padding
// between codes. Eight codes of b bits always fill exactly b bytes, which the fast paths use.
#include "kvg_internal.h"

static void pack_slow(uint8_t * dst, uint64_t bit_off, const uint8_t * codes, size_t n, int bits) {
    for (size_t i = 0; i < n; i++) {
        const uint64_t pos   = bit_off + (uint64_t) i * (uint64_t) bits;
        const unsigned shift = (unsigned) (pos & 7);
        const unsigned v     = (unsigned) codes[i] << shift;  // at most 15 bits
        uint8_t *      p     = dst + (pos >> 3);
        p[0] |= (uint8_t) (v & 0xff);
        if (shift + (unsigned) bits > 8) {
            p[1] |= (uint8_t) (v >> 8);
        }
    }
}

static void unpack_slow(const uint8_t * src, uint64_t bit_off, uint8_t * codes, size_t n, int bits) {
    const unsigned mask = (1u << bits) - 1;
    for (size_t i = 0; i < n; i++) {
        const uint64_t  pos   = bit_off + (uint64_t) i * (uint64_t) bits;
        const unsigned  shift = (unsigned) (pos & 7);
        const uint8_t * p     = src + (pos >> 3);
        unsigned        v     = (unsigned) p[0] >> shift;
        if (shift + (unsigned) bits > 8) {  // only touch the next byte when the code spans it
            v |= (unsigned) p[1] << (8 - shift);
        }
        codes[i] = (uint8_t) (v & mask);
    }
}

void kvg_pack_bits(uint8_t * dst, uint64_t bit_off, const uint8_t * codes, size_t n, int bits) {
    size_t i = 0;
    if ((bit_off & 7) == 0) {
        uint8_t * p = dst + (bit_off >> 3);
        if (bits == 8) {
            memcpy(p, codes, n);
            return;
        }
        for (; i + 8 <= n; i += 8) {
            uint64_t acc = 0;
            for (int k = 0; k < 8; k++) {
                acc |= (uint64_t) codes[i + k] << (k * bits);
            }
            for (int k = 0; k < bits; k++) {
                p[k] |= (uint8_t) (acc >> (8 * k));
            }
            p += bits;
        }
    }
    pack_slow(dst, bit_off + (uint64_t) i * (uint64_t) bits, codes + i, n - i, bits);
}

void kvg_unpack_bits(const uint8_t * src, uint64_t bit_off, uint8_t * codes, size_t n, int bits) {
    size_t i = 0;
    if ((bit_off & 7) == 0) {
        const uint8_t * p = src + (bit_off >> 3);
        if (bits == 8) {
            memcpy(codes, p, n);
            return;
        }
        const uint64_t mask = (1u << bits) - 1;
        for (; i + 8 <= n; i += 8) {
            uint64_t acc = 0;
            for (int k = 0; k < bits; k++) {
                acc |= (uint64_t) p[k] << (8 * k);
            }
            for (int k = 0; k < 8; k++) {
                codes[i + k] = (uint8_t) ((acc >> (k * bits)) & mask);
            }
            p += bits;
        }
    }
    unpack_slow(src, bit_off + (uint64_t) i * (uint64_t) bits, codes + i, n - i, bits);
}
