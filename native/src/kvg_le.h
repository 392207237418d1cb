// kvg_le.h: little-endian loads and stores of 1-4 bytes, for the bit-packing helpers of the
// SIMD kernels (kvg_avx2.h, kvg_neon.h). Both targets are little-endian (the NEON guard checks).
#ifndef KVG_LE_H
#define KVG_LE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t load_le(const uint8_t * p, int n) {  // n = 1..4 bytes
    uint16_t h;
    uint32_t w;
    switch (n) {  // one load each once n is a constant (the attention kernels specialize on it)
        case 1:  return p[0];
        case 2:  memcpy(&h, p, 2); return h;
        case 3:  memcpy(&h, p, 2); return (uint32_t) h | ((uint32_t) p[2] << 16);
        default: memcpy(&w, p, 4); return w;
    }
}

static inline void store_le(uint8_t * p, uint32_t w, int n) {
    for (int k = 0; k < n; k++) {
        p[k] = (uint8_t) (w >> (8 * k));
    }
}

#endif  // KVG_LE_H
