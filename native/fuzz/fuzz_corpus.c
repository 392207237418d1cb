// fuzz_corpus.c: writes the starting corpora of fuzz_decode and fuzz_store from real encoded blocks.
//
//   fuzz_corpus DECODE_DIR STORE_DIR
//
// They are made at build time (scripts/fuzz.sh) rather than committed: they follow the codecs
// as they change. Each is a valid input that reaches the decoder proper (exact sizes, blocks
// that pass the check), so the fuzzer starts from the deep paths and mutates outwards. The
// rows are K/V-like: Gaussian values with a few large outlier channels, as keys have.

#include "fuzz_input.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

static double uniform(void) {  // splitmix64 (Steele et al. 2014), 53 bits
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (double) ((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static float gaussian(void) {
    const double u = uniform() + 1e-300, v = uniform();
    return (float) (sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

// n_rows rows of `width` channels; every 16th channel carries a large offset, as keys do.
static float * kv_rows(int64_t n_rows, int64_t width) {
    float * x = (float *) malloc((size_t) (n_rows * width) * sizeof(float));
    if (!x) {
        abort();
    }
    for (int64_t t = 0; t < n_rows; t++) {
        for (int64_t c = 0; c < width; c++) {
            x[t * width + c] = gaussian() + (c % 16 == 3 ? 12.0f : 0.0f);
        }
    }
    return x;
}

// The encoded block, or NULL where the codec refuses the shape (rotq: head_dim).
static uint8_t * encode(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                        const kvg_codec_params * p, size_t * size) {
    if (kvg_encoded_size(type, kind, n_tokens, n_heads, head_dim, p, size) != KVG_OK) {
        return NULL;
    }
    float *   x   = kv_rows(n_tokens, n_heads * head_dim);
    uint8_t * out = (uint8_t *) malloc(*size);
    if (!out) {
        abort();
    }
    const int st = kvg_encode(type, kind, x, (size_t) (n_tokens * n_heads * head_dim), n_tokens, n_heads, head_dim, p,
                              out, *size, NULL);
    free(x);
    if (st != KVG_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static void write_file(const char * dir, const char * name, const uint8_t * a, size_t an, const uint8_t * b,
                       size_t bn) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(a, 1, an, f) != an || (bn && fwrite(b, 1, bn, f) != bn) || fclose(f) != 0) {
        fprintf(stderr, "fuzz_corpus: cannot write %s\n", path);
        exit(1);
    }
}

// ---- fuzz_decode: one block per codec, kind and shape ------------------------------------

static int decode_corpus(const char * dir) {
    // (n_tokens, n_heads, head_dim, G): a small real shape, one across crotq's 128-token groups
    // and kivi's last short group, and shapes rotq refuses.
    static const int64_t shapes[][4] = {
        { 17, 2, 64, 32 }, { 130, 1, 16, 32 }, { 40, 1, 128, 7 }, { 9, 3, 5, 4 }, { 5, 4, 2, 1 }
    };
    int n = 0;
    for (int type = 0; type < kvg_codec_count(); type++) {
        for (int kind = 0; kind < 2; kind++) {
            for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
                kvg_codec_params p;
                kvg_codec_default_params(&p);
                p.group_size = (int32_t) shapes[s][3];
                fz_attach_book(type, shapes[s][1], shapes[s][2], &p);  // as fz_decode_parse attaches it
                size_t    size = 0;
                uint8_t * enc  = encode(type, kind, shapes[s][0], shapes[s][1], shapes[s][2], &p, &size);
                if (!enc) {
                    continue;
                }
                uint8_t head[FZ_DECODE_HEADER];
                fz_decode_header(head, type, kind, shapes[s][0], shapes[s][1], shapes[s][2], p.group_size, p.seed);
                char name[96];
                snprintf(name, sizeof(name), "%s-%c-%lldx%lldx%lld", kvg_codec_name(type), "kv"[kind],
                         (long long) shapes[s][0], (long long) shapes[s][1], (long long) shapes[s][2]);
                write_file(dir, name, head, sizeof(head), enc, size);
                free(enc);
                n++;
            }
        }
    }
    return n;
}

// ---- fuzz_store: programs of real blocks and the reads over them -------------------------

typedef struct bytes {
    uint8_t * p;
    size_t    n;
    size_t    cap;
} bytes;

static void put(bytes * b, const void * src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p   = (uint8_t *) realloc(b->p, b->cap);
        if (!b->p) {
            abort();
        }
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(bytes * b, int v) {
    const uint8_t u = (uint8_t) v;
    put(b, &u, 1);
}

// APPEND of a real block; returns 0 where the codec refuses the shape.
static int append(bytes * b, int il, int kind, int tier, int codec, int64_t rows, int64_t hkv, int64_t d,
                  const kvg_codec_params * p) {
    size_t    size = 0;
    uint8_t * enc  = encode(codec, kind, rows, hkv, d, p, &size);
    if (!enc || size > 0xffff) {
        free(enc);
        return 0;
    }
    const uint8_t op[] = { FZ_OP_APPEND,         (uint8_t) (il | kind << 1 | 1 << 2),
                           (uint8_t) tier,       (uint8_t) codec,
                           (uint8_t) rows,       (uint8_t) (size & 0xff),
                           (uint8_t) (size >> 8) };
    put(b, op, sizeof(op));
    put(b, enc, size);
    free(enc);
    return 1;
}

static int store_corpus(const char * dir) {
    // (n_head_kv, head_dim_k, head_dim_v, G)
    static const int64_t configs[][4] = { { 2, 64, 64, 32 }, { 1, 128, 64, 16 }, { 3, 16, 5, 8 } };
    // (sink, warm, archive) codecs of K and of V, by name
    static const char * plans[][6] = {
        { "f16", "rotq4", "rotq2", "f16", "rotq3", "rotq2" },
        { "f16", "kivi4", "kivi2", "f16", "kivi4", "kivi2" },
        { "f16", "crotq3", "crotq2", "f16", "kivi8", "rotq1" },
        { "kivi3", "crotq4", "rotq1", "f16", "kivi3", "f16" },
    };
    int n = 0;
    for (size_t ci = 0; ci < sizeof(configs) / sizeof(configs[0]); ci++) {
        const int64_t hkv = configs[ci][0], dk = configs[ci][1], dv = configs[ci][2];
        for (size_t pi = 0; pi < sizeof(plans) / sizeof(plans[0]); pi++) {
            kvg_codec_params p;
            kvg_codec_default_params(&p);
            p.group_size = (int32_t) configs[ci][3];
            bytes   b    = { 0 };
            uint8_t head[FZ_STORE_HEADER];
            put(&b, head, fz_store_header(head, hkv, dk, dv, p.group_size, p.seed));
            // K and V of both layers, cut differently: K in 4 + 20 + 12 rows, V in 4 + 12 + 20.
            static const int64_t cuts[2][3] = { { 4, 20, 12 }, { 4, 12, 20 } };
            int                  ok         = 1;
            for (int il = 0; il < FZ_N_LAYER; il++) {
                for (int kind = 0; kind < 2; kind++) {
                    for (int tier = 0; tier < 3; tier++) {
                        int codec = 0;
                        kvg_codec_from_name(plans[pi][kind * 3 + tier], &codec);
                        ok &= append(&b, il, kind, tier, codec, cuts[kind][tier], hkv, kind ? dv : dk, &p);
                    }
                }
            }
            if (!ok) {
                free(b.p);
                continue;
            }
            // Reads across block edges, f32, f16 and the hook; attention over all rows and a
            // slice; then truncate inside a block and retier, and read again.
            // clang-format off: one op a line
            const uint8_t reads[] = {
                FZ_OP_DECODE, 0 | 0 << 1 | 0 << 2, 0, 36,
                FZ_OP_DECODE, 1 | 1 << 1 | 1 << 2, 2, 30,
                FZ_OP_DECODE, 0 | 1 << 1 | 2 << 2, 3, 10,
                FZ_OP_ATTEND, 0 | 1 << 1 | 1 << 2, 0, 36, 8,
            };
            // clang-format on
            put(&b, reads, sizeof(reads));
            const size_t n_q = 2 * (size_t) hkv * 2 * (size_t) dk;  // 2 tokens, gqa 2
            for (size_t i = 0; i < n_q; i++) {
                put_u8(&b, (int) (gaussian() * 16.0f));
            }
            const uint8_t more[] = {
                FZ_OP_ATTEND, 1, 5, 30, 63,  // one token, gqa 1: q from the bytes that follow
            };
            put(&b, more, sizeof(more));
            for (size_t i = 0; i < (size_t) hkv * (size_t) dk; i++) {
                put_u8(&b, (int) (gaussian() * 16.0f));
            }
            // clang-format off: one op a line
            const uint8_t tail[] = {
                FZ_OP_TRUNCATE, 30,
                FZ_OP_RETIER, 1, 2, 4, 12, 2, 6,  // layer 0 V, rows [4, 16): one block, to rotq2
                FZ_OP_SIMD, 0,
                FZ_OP_DECODE, 0 | 0 << 1 | 0 << 2, 0, 30,
                FZ_OP_DECODE, 1 | 1 << 1 | 1 << 2, 0, 30,
            };
            // clang-format on
            put(&b, tail, sizeof(tail));
            char name[96];
            snprintf(name, sizeof(name), "store-%zu-%zu", ci, pi);
            write_file(dir, name, b.p, b.n, NULL, 0);
            free(b.p);
            n++;
        }
    }
    return n;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fuzz_corpus DECODE_DIR STORE_DIR\n");
        return 2;
    }
    const int nd = decode_corpus(argv[1]);
    const int ns = store_corpus(argv[2]);
    printf("fuzz_corpus: %d decode inputs, %d store inputs\n", nd, ns);
    return nd > 0 && ns > 0 ? 0 : 1;
}
