// kvg_avx2.h: inline AVX2 helpers shared by the *_avx2.c files (compiled with -mavx2 -mfma
// -mf16c); include only inside their AVX2 build guard.
#ifndef KVG_AVX2_H
#define KVG_AVX2_H

#include "kvg_internal.h"
#include "kvg_le.h"

#include <immintrin.h>

// ---- bit packing, 8 codes (exactly `bits` bytes) at a time ---------------------------------

static inline __m256i lane_shifts(int bits) {
    return _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
}

// 8 codes from the `bits` bytes at p, as 32-bit lanes.
static inline __m256i unpack8(const uint8_t * p, int bits, __m256i sh, __m256i mask) {
    if (bits == 8) {
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) p));
    }
    const __m256i w = _mm256_set1_epi32((int) load_le(p, bits));
    return _mm256_and_si256(_mm256_srlv_epi32(w, sh), mask);
}

#endif  // KVG_AVX2_H
