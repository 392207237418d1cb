// fuzz_input.h: the byte formats the libFuzzer targets read, shared with the corpus generator
// (fuzz_corpus.c) so that starting inputs made from real encoded blocks say exactly what a target parses.
//
// Every target reads its input front to back through fz_reader; a read past the end gives 0s,
// so any byte string is a valid input and the fuzzer never wastes runs on rejected framing.
#ifndef KVG_FUZZ_INPUT_H
#define KVG_FUZZ_INPUT_H

#include "kvgguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz_reader {
    const uint8_t * p;
    size_t          n;
    size_t          off;
} fz_reader;

static inline uint8_t fz_u8(fz_reader * r) {
    return r->off < r->n ? r->p[r->off++] : 0;
}

static inline uint64_t fz_u64(fz_reader * r) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t) fz_u8(r) << (8 * i);
    }
    return v;
}

static inline size_t fz_left(const fz_reader * r) {
    return r->off < r->n ? r->n - r->off : 0;
}

// head_dim by 4-bit index: rotq's powers of two first (the shapes real models have), then
// shapes rotq must refuse and kivi/f16 must take.
static const int64_t fz_head_dims[16] = { 2, 4, 8, 16, 32, 64, 128, 256, 1, 3, 5, 6, 7, 12, 48, 96 };

static inline int fz_head_dim_index(int64_t d) {
    for (int i = 0; i < 16; i++) {
        if (fz_head_dims[i] == d) {
            return i;
        }
    }
    return 0;
}

// Fills dst[0, n) with src repeated (zeros when src is empty): the fuzzer's bytes reach every
// position of a buffer of the exact encoded size, however short the input.
static inline void fz_fill(uint8_t * dst, size_t n, const uint8_t * src, size_t src_n) {
    if (src_n == 0) {
        memset(dst, 0, n);
        return;
    }
    for (size_t i = 0; i < n; i += src_n) {
        memcpy(dst + i, src, n - i < src_n ? n - i : src_n);
    }
}

// ---- fuzz_decode: one kvg_decode case ------------------------------------------------------
//
//   u8  type     (b % (count + 2)) - 1: every codec, and -1 / count, which must be refused
//   u8  flags    bit 0 kind V; bits 1-3 all set: kind 2 (refused); bit 4: dst one float short
//   u8  n_tokens 1 + b (crosses crotq's 128-token groups and kivi's token groups)
//   u8  dims     low 4 bits head_dim (fz_head_dims), bits 4-5 n_heads - 1
//   u8  group    kivi's G as int8 (0 and negative ones must be refused)
//   u64 seed     rotq's signs
//   ... the encoded bytes

enum { FZ_DECODE_HEADER = 13 };

typedef struct fz_decode_case {
    int              type;
    int              kind;
    int              short_dst;
    int64_t          n_tokens;
    int64_t          n_heads;
    int64_t          head_dim;
    kvg_codec_params p;
} fz_decode_case;

// A fixed codebook for the codecs that need one (pq2, vq8, vq8f: 256 centroids of 4 or head_dim
// floats), so their decoders are fuzzed past the codebook check; any finite values do. wfq gets a
// valid plan (identity order, unit scales, the code bits spread as evenly as they go) for the same
// reason.
static inline void fz_attach_book(int type, int64_t n_heads, int64_t head_dim, kvg_codec_params * p) {
    static float book[256 * 256];
    static float plan[4 * 3 * 256];
    if (book[1] == 0.0f) {
        for (size_t i = 0; i < sizeof(book) / sizeof(book[0]); i++) {
            book[i] = (float) ((int) (i * 2654435761u >> 24) - 128) / 64.0f;  // in [-2, 2)
        }
    }
    const int64_t S = type == KVG_CODEC_PQ2 ? 4 : head_dim;
    if (type >= KVG_CODEC_PQ2 && type <= KVG_CODEC_VQ8F && S <= 256) {
        p->book       = book;
        p->book_count = (size_t) (256 * S);
    }
    const int64_t bits = type - KVG_CODEC_WFQ2 + 2, total = bits * head_dim - 16;
    if (type >= KVG_CODEC_WFQ2 && type <= KVG_CODEC_WFQ4 && n_heads <= 4 && head_dim <= 256 && total >= head_dim) {
        for (int64_t h = 0; h < n_heads; h++) {
            float * q = plan + h * 3 * head_dim;
            for (int64_t i = 0; i < head_dim; i++) {
                q[i]                = (float) i;
                q[head_dim + i]     = 1.0f;
                q[2 * head_dim + i] = (float) (total / head_dim + (i < total % head_dim));
            }
        }
        p->book       = plan;
        p->book_count = (size_t) (n_heads * 3 * head_dim);
    }
}

static inline void fz_decode_parse(fz_reader * r, fz_decode_case * c) {
    const int count = kvg_codec_count();
    c->type         = (int) (fz_u8(r) % (uint8_t) (count + 2)) - 1;
    const uint8_t f = fz_u8(r);
    c->kind         = (f & 0x0e) == 0x0e ? 2 : (f & 1);
    c->short_dst    = (f >> 4) & 1;
    c->n_tokens     = 1 + (int64_t) fz_u8(r);
    const uint8_t d = fz_u8(r);
    c->head_dim     = fz_head_dims[d & 15];
    c->n_heads      = 1 + ((d >> 4) & 3);
    kvg_codec_default_params(&c->p);
    c->p.group_size = (int8_t) fz_u8(r);
    c->p.seed       = fz_u64(r);
    fz_attach_book(c->type, c->n_heads, c->head_dim, &c->p);
}

static inline size_t fz_decode_header(uint8_t * out, int type, int kind, int64_t n_tokens, int64_t n_heads,
                                      int64_t head_dim, int group_size, uint64_t seed) {
    out[0] = (uint8_t) (type + 1);
    out[1] = (uint8_t) kind;
    out[2] = (uint8_t) (n_tokens - 1);
    out[3] = (uint8_t) (fz_head_dim_index(head_dim) | ((n_heads - 1) << 4));
    out[4] = (uint8_t) (int8_t) group_size;
    for (int i = 0; i < 8; i++) {
        out[5 + i] = (uint8_t) (seed >> (8 * i));
    }
    return FZ_DECODE_HEADER;
}

// ---- fuzz_store: a store, then a program of operations on it ----------------------------
//
//   u8  dims     bits 0-1 n_head_kv - 1, bits 2-5 head_dim_k (fz_head_dims)
//   u8  dims_v   low 4 bits head_dim_v
//   u8  group    kivi's G as int8
//   u64 seed
//   then operations until the input ends, each an opcode byte (b % FZ_OP_COUNT) and its operands:
//     APPEND   u8 il|kind<<1|exact<<2, u8 tier (b % 4: 3 is refused), u8 codec (b % (count + 1)),
//              u8 n_rows (0 is refused), u16 n (bytes taken from the input: exactly the encoded
//              size, repeated to fill it, when `exact`; else n bytes as they are)
//     DECODE   u8 il|kind<<1|how<<2 (f32, f16, hook), u8 r0, u8 r1 (rows past the end are refused)
//     ATTEND   u8 il|gqa-1<<1|n_tokens-1<<2, u8 r0, u8 r1, u8 scale, then q as int8 / 16
//     TRUNCATE u8 n_rows
//     RETIER   u8 il (b % 3 - 1), u8 kind (b % 3 - 1), u8 r0, u8 r1, u8 tier, u8 codec
//     SIMD     u8 level (b % 3: NEON is refused on x86)

enum {
    FZ_STORE_HEADER = 11,
    FZ_N_LAYER      = 2,
};

enum { FZ_OP_APPEND = 0, FZ_OP_DECODE, FZ_OP_ATTEND, FZ_OP_TRUNCATE, FZ_OP_RETIER, FZ_OP_SIMD, FZ_OP_COUNT };

static inline size_t fz_store_header(uint8_t * out, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
                                     int group_size, uint64_t seed) {
    out[0] = (uint8_t) ((n_head_kv - 1) | (fz_head_dim_index(head_dim_k) << 2));
    out[1] = (uint8_t) fz_head_dim_index(head_dim_v);
    out[2] = (uint8_t) (int8_t) group_size;
    for (int i = 0; i < 8; i++) {
        out[3 + i] = (uint8_t) (seed >> (8 * i));
    }
    return FZ_STORE_HEADER;
}

#endif  // KVG_FUZZ_INPUT_H
