// fuzz_decode.c: libFuzzer target for kvg_decode, every codec type (pq2/vq8/vq8f with a fixed codebook).
//
// The input's header (fuzz_input.h) picks codec, kind, shape and params; the rest is the
// encoded bytes, decoded twice: as they are (a wrong length must be refused), then repeated to
// exactly kvg_encoded_size in a buffer of that size, so ASan catches any read past the block.
// Besides the sanitizers, each run checks what kvgguf.h promises a caller:
//   - a failure leaves dst untouched and says why in kvg_last_error(),
//   - a success writes finite floats only (every field the check accepts is a finite f16),
//   - the SIMD decoder (AVX2 or NEON, where the machine has it) agrees with the scalar oracle:
//     the same status, and values within 1e-6 of the block's largest, the bound
//     tests/unit/test_codecs.py holds it to.
// A broken promise aborts, which libFuzzer reports as a crash with the input that broke it.

#include "fuzz_input.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// Keeps one run well under a millisecond: 64K values is 256 tokens of a 4 x 64 row.
#define FZ_MAX_VALUES (1 << 16)

static const uint32_t k_sentinel = 0x7fc0dead;  // a quiet NaN no decoder writes

static void broken(const char * what, const fz_decode_case * c, int st) {
    fprintf(stderr, "fuzz_decode: %s: codec %d kind %d shape (%lld, %lld, %lld) G %d: status %d (%s) %s\n", what,
            c->type, c->kind, (long long) c->n_tokens, (long long) c->n_heads, (long long) c->head_dim,
            (int) c->p.group_size, st, kvg_strerror(st), kvg_last_error());
    abort();
}

static void fill_sentinel(float * x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        memcpy(&x[i], &k_sentinel, sizeof(float));
    }
}

static int untouched(const float * x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof(u));
        if (u != k_sentinel) {
            return 0;
        }
    }
    return 1;
}

// Decodes at one SIMD level and checks the promises that hold at every level.
static int decode_at(int level, const fz_decode_case * c, const uint8_t * src, size_t src_n, float * dst,
                     size_t dst_n) {
    if (kvg_set_simd_level(level) != KVG_OK) {
        broken("kvg_set_simd_level refused a level kvg_simd_max_level offers", c, -1);
    }
    fill_sentinel(dst, dst_n);
    const int st = kvg_decode(c->type, c->kind, src, src_n, c->n_tokens, c->n_heads, c->head_dim, &c->p, dst, dst_n);
    if (st > KVG_OK || st < KVG_ERR_UNSUPPORTED) {
        broken("a status outside enum kvg_status", c, st);
    }
    if (st != KVG_OK) {
        if (!untouched(dst, dst_n)) {
            broken("a failed decode wrote to dst", c, st);
        }
        if (kvg_last_error()[0] == '\0') {
            broken("a failed decode left kvg_last_error() empty", c, st);
        }
        return st;
    }
    for (size_t i = 0; i < dst_n; i++) {
        if (!isfinite(dst[i])) {
            broken("a successful decode wrote a NaN or Inf", c, st);
        }
    }
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    fz_reader      r = { data, size, 0 };
    fz_decode_case c;
    fz_decode_parse(&r, &c);
    if (c.n_tokens * c.n_heads * c.head_dim > FZ_MAX_VALUES) {
        c.n_tokens = FZ_MAX_VALUES / (c.n_heads * c.head_dim);
    }
    const uint8_t * enc   = data + r.off;
    const size_t    enc_n = fz_left(&r);
    const size_t    n_val = (size_t) (c.n_tokens * c.n_heads * c.head_dim);
    const size_t    n_dst = n_val - (size_t) c.short_dst;
    const int       max   = kvg_simd_max_level();

    size_t    want    = 0;
    const int st_size = kvg_encoded_size(c.type, c.kind, c.n_tokens, c.n_heads, c.head_dim, &c.p, &want);
    float *   y0      = (float *) malloc(n_val * sizeof(float));
    float *   y1      = (float *) malloc(n_val * sizeof(float));
    if (!y0 || !y1) {
        abort();
    }

    // 1. The bytes as they are: accepted only at exactly the encoded size.
    const int st = decode_at(max, &c, enc, enc_n, y0, n_dst);
    if (st_size != KVG_OK && st != st_size) {
        broken("kvg_decode and kvg_encoded_size disagree about the arguments", &c, st);
    }
    if (st == KVG_OK && (enc_n != want || c.short_dst)) {
        broken("kvg_decode accepted a buffer of the wrong size", &c, st);
    }

    // 2. Exactly the encoded size, in a buffer of that size: the decoders proper.
    if (st_size == KVG_OK) {
        uint8_t * buf = (uint8_t *) malloc(want);
        if (!buf) {
            abort();
        }
        fz_fill(buf, want, enc, enc_n);
        const int s0 = decode_at(KVG_SIMD_SCALAR, &c, buf, want, y0, n_dst);
        if (max != KVG_SIMD_SCALAR) {
            const int s1 = decode_at(max, &c, buf, want, y1, n_dst);
            if (s0 != s1) {
                broken("the SIMD decoder and the scalar oracle return different statuses", &c, s1);
            }
            if (s0 == KVG_OK) {
                float big = 1.0f;
                for (size_t i = 0; i < n_dst; i++) {
                    big = fabsf(y0[i]) > big ? fabsf(y0[i]) : big;
                }
                for (size_t i = 0; i < n_dst; i++) {
                    if (fabsf(y0[i] - y1[i]) > 1e-6f * big) {
                        fprintf(stderr, "fuzz_decode: value %zu: scalar %.9g, SIMD %.9g\n", i, (double) y0[i],
                                (double) y1[i]);
                        broken("the SIMD decoder differs from the scalar oracle", &c, s1);
                    }
                }
            }
        }
        free(buf);
    }
    free(y0);
    free(y1);
    return 0;
}
