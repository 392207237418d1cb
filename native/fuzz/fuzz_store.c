// fuzz_store.c: libFuzzer target for the store's way in from a file, kvg_store_append_encoded,
// and everything that reads what it linked: kvg_store_decode, kvg_store_decode_f16,
// kvg_store_hook_decode and kvg_store_hook_attend, plus truncate and retier, which decode a
// linked block and encode it again.
//
// The input (fuzz_input.h) makes a two-layer store and runs a program of operations on it, so
// lists of several blocks of mixed codecs, K and V cut differently, and row ranges across
// block edges all occur. append_encoded checks a block once and the readers then trust it, so
// a block that passes the check but breaks a reader is exactly the bug this target looks for.
// Besides the sanitizers (and LeakSanitizer, per input), each run checks what kvgguf.h
// promises: statuses inside enum kvg_status, finite floats from a successful decode or
// attend, an attend state left unchanged when its arguments are refused, and mutations that
// are all or nothing: a failed append, truncate or retier leaves every block as it was.

#include "fuzz_input.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// Bounds that keep one run short: values per block, and rows per (layer, kind) list.
#define FZ_MAX_BLOCK_VALUES (1 << 15)
#define FZ_MAX_ROWS         2048

typedef struct fz_store {
    kvg_store *      s;
    int64_t          hkv;
    int64_t          dk;
    int64_t          dv;
    kvg_codec_params p;  // the store's: they decide a kivi block's size
} fz_store;

static void broken(const char * what, int op, int st) {
    fprintf(stderr, "fuzz_store: %s (operation %d): status %d (%s) %s\n", what, op, st, kvg_strerror(st),
            kvg_last_error());
    abort();
}

static void check_status(int st, int op) {
    if (st > KVG_OK || st < KVG_ERR_UNSUPPORTED) {
        broken("a status outside enum kvg_status", op, st);
    }
}

static int64_t width(const fz_store * f, int kind) {
    return f->hkv * (kind == KVG_KIND_K ? f->dk : f->dv);
}

static int64_t n_rows(const fz_store * f, int il, int kind) {
    int64_t n = 0;
    if (kvg_store_n_rows(f->s, il, kind, &n) != KVG_OK) {
        broken("kvg_store_n_rows refused a valid layer and kind", -1, -1);
    }
    return n;
}

// FNV-1a over every block of every list (its info and bytes): equal before and after a failed
// mutation, or the mutation was not all or nothing.
static uint64_t fnv(uint64_t h, const void * p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h = (h ^ ((const uint8_t *) p)[i]) * 0x100000001b3ULL;
    }
    return h;
}

static uint64_t snapshot(const fz_store * f) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int il = 0; il < FZ_N_LAYER; il++) {
        for (int kind = 0; kind < 2; kind++) {
            int64_t nb = 0;
            if (kvg_store_n_blocks(f->s, il, kind, &nb) != KVG_OK) {
                broken("kvg_store_n_blocks refused a valid layer and kind", -1, -1);
            }
            h = fnv(h, &nb, sizeof(nb));
            for (int64_t bi = 0; bi < nb; bi++) {
                kvg_block_info info;
                if (kvg_store_block(f->s, il, kind, bi, &info, NULL, 0) != KVG_OK) {
                    broken("kvg_store_block refused a block it counts", -1, -1);
                }
                uint8_t * data = (uint8_t *) malloc(info.n_bytes ? info.n_bytes : 1);
                if (!data || kvg_store_block(f->s, il, kind, bi, &info, data, info.n_bytes) != KVG_OK) {
                    broken("kvg_store_block did not copy a block out", -1, -1);
                }
                const int64_t fields[] = { info.row0, info.n_rows, info.codec, info.tier };
                h                      = fnv(fnv(h, fields, sizeof(fields)), data, info.n_bytes);
                free(data);
            }
        }
    }
    return h;
}

static void check_unchanged(const fz_store * f, uint64_t before, int st, int op) {
    if (st != KVG_OK && snapshot(f) != before) {
        broken("a failed mutation changed the store", op, st);
    }
}

static void op_append(fz_store * f, fz_reader * r) {
    const uint8_t a  = fz_u8(r);
    const int     il = a & 1, kind = (a >> 1) & 1, exact = (a >> 2) & 1;
    const int     tier  = fz_u8(r) % 4;
    const int     codec = fz_u8(r) % (kvg_codec_count() + 1);
    int64_t       rows  = fz_u8(r);
    const size_t  n     = (size_t) fz_u8(r) | (size_t) fz_u8(r) << 8;
    if (rows * width(f, kind) > FZ_MAX_BLOCK_VALUES) {
        rows = FZ_MAX_BLOCK_VALUES / width(f, kind);
    }
    const size_t    take = n < fz_left(r) ? n : fz_left(r);
    const uint8_t * src  = r->p + r->off;
    r->off += take;
    if (n_rows(f, il, kind) + rows > FZ_MAX_ROWS) {
        return;
    }
    // exact: the size the store will ask for (a shape it refuses keeps the bytes as given).
    size_t want = 0;
    size_t len  = take;
    if (exact &&
        kvg_encoded_size(codec, kind, rows > 0 ? rows : 1, f->hkv, kind ? f->dv : f->dk, &f->p, &want) == KVG_OK) {
        len = want;
    }
    uint8_t * buf = (uint8_t *) malloc(len ? len : 1);
    if (!buf) {
        abort();
    }
    fz_fill(buf, len, src, take);
    const int64_t  before = n_rows(f, il, kind);
    const uint64_t snap   = snapshot(f);
    const int      st     = kvg_store_append_encoded(f->s, il, kind, tier, codec, rows, buf, len);
    check_status(st, FZ_OP_APPEND);
    check_unchanged(f, snap, st, FZ_OP_APPEND);
    const int64_t after = n_rows(f, il, kind);
    if (after != before + (st == KVG_OK ? rows : 0)) {
        broken("append_encoded changed the rows other than by the block it accepted", FZ_OP_APPEND, st);
    }
    free(buf);
}

static void op_decode(fz_store * f, fz_reader * r) {
    const uint8_t a  = fz_u8(r);
    const int     il = a & 1, kind = (a >> 1) & 1, how = ((a >> 2) & 3) % 3;
    const int64_t n   = n_rows(f, il, kind);
    const int64_t r0  = fz_u8(r) % (n + 2);
    const int64_t r1  = r0 + fz_u8(r) % (n + 3 - (r0 < n + 1 ? r0 : n + 1));
    const int64_t w   = width(f, kind);
    const size_t  cnt = (size_t) (r1 - r0) * (size_t) w;
    void *        dst = malloc((cnt ? cnt : 1) * sizeof(float));
    if (!dst) {
        abort();
    }
    int st;
    if (how == 0) {
        st = kvg_store_decode(f->s, il, kind, r0, r1, (float *) dst, cnt);
    } else if (how == 1) {
        st = kvg_store_decode_f16(f->s, il, kind, r0, r1, (uint16_t *) dst, cnt);
    } else {
        st = kvg_store_hook_decode(f->s, il, kind, r0, r1, (uint16_t *) dst, w);
    }
    check_status(st, FZ_OP_DECODE);
    if (st == KVG_OK && r1 > n) {
        broken("a decode past the last row succeeded", FZ_OP_DECODE, st);
    }
    if (st == KVG_OK && how == 0) {
        for (size_t i = 0; i < cnt; i++) {
            if (!isfinite(((float *) dst)[i])) {
                broken("kvg_store_decode wrote a NaN or Inf", FZ_OP_DECODE, st);
            }
        }
    }
    free(dst);
}

static void op_attend(fz_store * f, fz_reader * r) {
    const uint8_t a        = fz_u8(r);
    const int     il       = a & 1;
    const int     gqa      = 1 + ((a >> 1) & 1);
    const int     n_tokens = 1 + ((a >> 2) & 3);
    const int     n_head   = (int) f->hkv * gqa;
    const int64_t n =
        n_rows(f, il, KVG_KIND_K) < n_rows(f, il, KVG_KIND_V) ? n_rows(f, il, KVG_KIND_K) : n_rows(f, il, KVG_KIND_V);
    const int64_t r0    = fz_u8(r) % (n + 2);
    const int64_t r1    = r0 + fz_u8(r) % (n + 3 - (r0 < n + 1 ? r0 : n + 1));
    const uint8_t sb    = fz_u8(r);
    const float   scale = sb == 255 ? INFINITY : (float) (sb + 1) / 64.0f;  // 255: must be refused
    const size_t  n_q   = (size_t) n_tokens * (size_t) n_head;
    float *       q     = (float *) malloc(n_q * (size_t) f->dk * sizeof(float));
    float *       m     = (float *) malloc(n_q * sizeof(float));
    float *       l     = (float *) malloc(n_q * sizeof(float));
    float *       acc   = (float *) malloc(n_q * (size_t) f->dv * sizeof(float));
    if (!q || !m || !l || !acc) {
        abort();
    }
    for (size_t i = 0; i < n_q * (size_t) f->dk; i++) {
        q[i] = (float) (int8_t) fz_u8(r) / 16.0f;
    }
    for (size_t j = 0; j < n_q; j++) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    memset(acc, 0, n_q * (size_t) f->dv * sizeof(float));
    const int st = kvg_store_hook_attend(f->s, il, r0, r1, q, n_tokens, n_head, scale, m, l, acc);
    check_status(st, FZ_OP_ATTEND);
    if (st == KVG_ERR_INVALID_ARG) {
        for (size_t j = 0; j < n_q; j++) {
            if (m[j] != -INFINITY || l[j] != 0.0f) {
                broken("a refused attend changed the state", FZ_OP_ATTEND, st);
            }
        }
    }
    if (st == KVG_OK && r1 > r0) {
        // The row with the largest score adds exp(0) = 1 to l; every score is finite since the
        // stored values, q and scale are.
        for (size_t j = 0; j < n_q; j++) {
            if (!isfinite(m[j]) || !isfinite(l[j]) || l[j] < 0.5f) {
                fprintf(stderr, "fuzz_store: query %zu: m %g, l %g\n", j, (double) m[j], (double) l[j]);
                broken("attend left a non-finite or empty softmax state", FZ_OP_ATTEND, st);
            }
        }
        for (size_t i = 0; i < n_q * (size_t) f->dv; i++) {
            if (!isfinite(acc[i])) {
                broken("attend wrote a NaN or Inf into acc", FZ_OP_ATTEND, st);
            }
        }
    }
    free(q);
    free(m);
    free(l);
    free(acc);
}

static int64_t max_rows(const fz_store * f) {
    int64_t n = 0;
    for (int il = 0; il < FZ_N_LAYER; il++) {
        for (int kind = 0; kind < 2; kind++) {
            n = n_rows(f, il, kind) > n ? n_rows(f, il, kind) : n;
        }
    }
    return n;
}

static void op_truncate(fz_store * f, fz_reader * r) {
    const int64_t  n    = fz_u8(r) % (max_rows(f) + 2);
    const uint64_t snap = snapshot(f);
    const int      st   = kvg_store_truncate(f->s, n);
    check_status(st, FZ_OP_TRUNCATE);
    check_unchanged(f, snap, st, FZ_OP_TRUNCATE);
    if (st == KVG_OK) {
        for (int il = 0; il < FZ_N_LAYER; il++) {
            for (int kind = 0; kind < 2; kind++) {
                if (n_rows(f, il, kind) > n) {
                    broken("a successful truncate left rows past the end", FZ_OP_TRUNCATE, st);
                }
            }
        }
    }
}

static void op_retier(fz_store * f, fz_reader * r) {
    const int      il    = fz_u8(r) % 3 - 1;
    const int      kind  = fz_u8(r) % 3 - 1;
    const int64_t  n     = max_rows(f);
    const int64_t  r0    = fz_u8(r) % (n + 2);
    const int64_t  r1    = r0 + fz_u8(r) % (n + 2);
    const int      tier  = fz_u8(r) % 4;
    const int      codec = fz_u8(r) % (kvg_codec_count() + 1);
    const uint64_t snap  = snapshot(f);
    const int      st    = kvg_store_retier_list(f->s, il, kind, r0, r1, tier, codec);
    check_status(st, FZ_OP_RETIER);
    check_unchanged(f, snap, st, FZ_OP_RETIER);
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    fz_reader r = { data, size, 0 };
    kvg_set_simd_level(kvg_simd_max_level());  // a previous input may have left another level
    const uint8_t a = fz_u8(&r);
    fz_store      f;
    f.hkv = 1 + (a & 3);
    f.dk  = fz_head_dims[(a >> 2) & 15];
    f.dv  = fz_head_dims[fz_u8(&r) & 15];
    kvg_store_params p;
    kvg_store_default_params(&p);
    p.n_layer          = FZ_N_LAYER;
    p.n_head_kv        = (int32_t) f.hkv;
    p.head_dim_k       = (int32_t) f.dk;
    p.head_dim_v       = (int32_t) f.dv;
    p.codec.group_size = (int8_t) fz_u8(&r);
    p.codec.seed       = fz_u64(&r);
    f.p                = p.codec;
    if (kvg_store_init(&p, &f.s) != KVG_OK) {
        abort();  // every shape above is a valid store
    }
    while (fz_left(&r) > 0) {
        switch (fz_u8(&r) % FZ_OP_COUNT) {
            case FZ_OP_APPEND:   op_append(&f, &r); break;
            case FZ_OP_DECODE:   op_decode(&f, &r); break;
            case FZ_OP_ATTEND:   op_attend(&f, &r); break;
            case FZ_OP_TRUNCATE: op_truncate(&f, &r); break;
            case FZ_OP_RETIER:   op_retier(&f, &r); break;
            case FZ_OP_SIMD:     check_status(kvg_set_simd_level(fz_u8(&r) % 3), FZ_OP_SIMD); break;
        }
    }
    kvg_store_free(f.s);
    return 0;
}
