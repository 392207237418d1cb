// store.c: compressed K/V rows of one sequence, per layer and kind, in tiers.
//
// Rows live in blocks (one per eviction, usually): each block is one kvg_encode call, so a
// block is the unit of re-encoding. Python mutates the store only between llama_decode calls,
// and llama.cpp's worker threads only read it; the one exception, aging on a thread of its own
// beside a GPU's batch, swaps blocks under swap_lock, which the hooks that read blocks hold for
// reading.
//
// Every mutation is all or nothing: whatever can fail (allocations, encodes) runs first into
// blocks nobody sees yet, and the store changes only in a commit step that cannot fail.

#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L
#    undef _POSIX_C_SOURCE
#    define _POSIX_C_SOURCE 200809L  // pthread_rwlock_t, which a strict C11 build hides
#endif

#include "kvg_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVG_STORE_MAX_THREADS 64

// Per-thread scratch for decoding a block as float32 (scratch.c): the hook decodes on
// llama.cpp's long-lived worker threads, so it is kept between calls.
static float * scratch_floats(size_t n) {
    return kvg_thread_scratch(KVG_SCRATCH_STORE, n);
}

// ---- failure injection (tests): the countdown kvg_debug_fail_after sets ---------------------

static _Atomic int64_t g_fail_countdown = -1;

int64_t kvg_debug_fail_after(int64_t n_steps) {
    return atomic_exchange(&g_fail_countdown, n_steps < 0 ? -1 : n_steps);
}

int kvg_injected_failure(const char * where) {
    int64_t c = atomic_load(&g_fail_countdown);
    while (c >= 0) {
        if (atomic_compare_exchange_weak(&g_fail_countdown, &c, c - 1)) {
            return c == 0 ? kvg_fail(KVG_ERR_NO_MEMORY, "injected failure: %s (kvg_debug_fail_after)", where) : KVG_OK;
        }
    }
    return KVG_OK;
}

static int64_t head_dim_of(const kvg_store * s, int32_t kind) {
    return kind == KVG_KIND_K ? s->p.head_dim_k : s->p.head_dim_v;
}

static int64_t row_width(const kvg_store * s, int32_t kind) {
    return (int64_t) s->p.n_head_kv * head_dim_of(s, kind);
}

static int check_layer_kind(const kvg_store * s, int32_t il, int32_t kind) {
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    if (il < 0 || il >= s->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d is outside [0, %d)", (int) il, (int) s->p.n_layer);
    }
    if (kind != KVG_KIND_K && kind != KVG_KIND_V) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kind %d is neither K (0) nor V (1)", (int) kind);
    }
    return KVG_OK;
}

void kvg_store_default_params(kvg_store_params * out) {
    if (!out) {
        return;
    }
    memset(out, 0, sizeof(*out));
    kvg_codec_default_params(&out->codec);
}

int kvg_store_init(const kvg_store_params * p, kvg_store ** out) {
    kvg_clear_error();
    if (!p || !out) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "params and out must not be NULL");
    }
    *out = NULL;
    if (p->n_layer <= 0 || p->n_head_kv <= 0 || p->head_dim_k <= 0 || p->head_dim_v <= 0) {
        return kvg_fail(KVG_ERR_SHAPE, "store needs positive n_layer, n_head_kv and head dims");
    }
    kvg_store * s = (kvg_store *) calloc(1, sizeof(kvg_store));
    if (!s) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "store");
    }
    pthread_rwlock_t * lock = (pthread_rwlock_t *) malloc(sizeof(pthread_rwlock_t));
    if (!lock || pthread_rwlock_init(lock, NULL) != 0) {
        free(lock);
        free(s);
        return kvg_fail(KVG_ERR_NO_MEMORY, "store: its lock");
    }
    s->swap_lock        = lock;
    const int32_t d_max = p->head_dim_k > p->head_dim_v ? p->head_dim_k : p->head_dim_v;
    s->p                = *p;
    s->n_threads        = 1;
    s->enabled          = (int32_t *) malloc((size_t) p->n_layer * sizeof(int32_t));
    s->rows             = (kvg_rows *) calloc((size_t) p->n_layer * 2, sizeof(kvg_rows));
    s->sgn              = (float *) malloc((size_t) d_max * sizeof(float));
    s->mass             = (double **) calloc((size_t) p->n_layer, sizeof(double *));
    s->mass_cap         = (int64_t *) calloc((size_t) p->n_layer, sizeof(int64_t));
    s->notes            = (kvg_mass_notes *) calloc(KVG_MASS_SLOTS, sizeof(kvg_mass_notes));
    if (!s->enabled || !s->rows || !s->sgn || !s->mass || !s->mass_cap || !s->notes) {
        kvg_store_free(s);
        return kvg_fail(KVG_ERR_NO_MEMORY, "store index");
    }
    // Sign i depends on (seed, i) only, so one list serves K and V; computed once here so the
    // attend hook never regenerates it.
    kvg_rotq_signs(p->codec.seed, d_max, s->sgn);
    for (int32_t il = 0; il < p->n_layer; ++il) {
        s->enabled[il] = 1;
    }
    *out = s;
    return KVG_OK;
}

static void rows_drop_from(kvg_rows * r, int64_t first_block) {
    for (int64_t b = first_block; b < r->n_blocks; ++b) {
        free(r->blocks[b].data);
    }
    if (first_block < r->n_blocks) {
        r->version++;
        r->n_blocks = first_block;
        r->n_rows   = first_block > 0 ? r->blocks[first_block - 1].row0 + r->blocks[first_block - 1].n_rows : 0;
    }
}

void kvg_store_clear(kvg_store * s) {
    if (!s || !s->rows) {
        return;
    }
    for (int64_t i = 0; i < (int64_t) s->p.n_layer * 2; ++i) {
        rows_drop_from(&s->rows[i], 0);
        for (int slot = 0; slot < KVG_BOOK_SLOTS; ++slot) {  // a new sequence trains its own
            free(s->rows[i].book[slot]);
            s->rows[i].book[slot] = NULL;
        }
    }
    kvg_store_mass_clear(s);
}

void kvg_store_free(kvg_store * s) {
    if (!s) {
        return;
    }
    if (s->rows) {
        kvg_store_clear(s);
        for (int64_t i = 0; i < (int64_t) s->p.n_layer * 2; ++i) {
            free(s->rows[i].blocks);
        }
    }
    free(s->rows);
    free(s->enabled);
    free(s->sgn);
    kvg_mass_free(s);
    if (s->swap_lock) {
        pthread_rwlock_destroy((pthread_rwlock_t *) s->swap_lock);
        free(s->swap_lock);
    }
    free(s);
}

int kvg_store_read_begin(const kvg_store * s) {
    return pthread_rwlock_rdlock((pthread_rwlock_t *) s->swap_lock) == 0
               ? KVG_OK
               : kvg_fail(KVG_ERR_NO_MEMORY, "the store's lock could not be taken for reading");
}

void kvg_store_read_end(const kvg_store * s) {
    pthread_rwlock_unlock((pthread_rwlock_t *) s->swap_lock);
}

int kvg_store_set_layer_enabled(kvg_store * s, int32_t il, int32_t enabled) {
    kvg_clear_error();
    int rc = check_layer_kind(s, il, KVG_KIND_K);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!enabled && (s->rows[il * 2].n_rows > 0 || s->rows[il * 2 + 1].n_rows > 0)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d holds rows; clear the store before disabling it", (int) il);
    }
    s->enabled[il] = enabled ? 1 : 0;
    return KVG_OK;
}

int kvg_store_set_threads(kvg_store * s, int32_t n_threads) {
    kvg_clear_error();
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    if (n_threads < 1 || n_threads > KVG_STORE_MAX_THREADS) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "%d threads: a store takes 1 to %d", (int) n_threads,
                        KVG_STORE_MAX_THREADS);
    }
    s->n_threads = n_threads;
    return KVG_OK;
}

static int book_slot(int32_t codec) {  // index into kvg_rows.book, -1: the codec has none
    return codec >= KVG_CODEC_PQ2 && codec < KVG_CODEC_PQ2 + KVG_BOOK_SLOTS ? codec - KVG_CODEC_PQ2 : -1;
}

static size_t book_floats(const kvg_store * s, int32_t kind, int32_t codec) {
    if (codec >= KVG_CODEC_WFQ2) {
        return kvg_wfq_book_floats(s->p.n_head_kv, head_dim_of(s, kind));
    }
    return (size_t) KVG_PQ_CENTROIDS * (size_t) kvg_pq_sub_len(codec, head_dim_of(s, kind));
}

kvg_codec_params kvg_store_list_params(const kvg_store * s, int64_t li, int32_t codec, const float * fresh) {
    kvg_codec_params p    = s->p.codec;
    const int        slot = book_slot(codec);
    if (slot >= 0) {
        p.book       = s->rows[li].book[slot] ? s->rows[li].book[slot] : fresh;
        p.book_count = p.book ? book_floats(s, (int32_t) (li % 2), codec) : 0;
    }
    return p;
}

// The bytes of a new block of n_rows rows of codec (its size from cp).
static int new_block_bytes(const kvg_store * s, int32_t kind, int32_t codec, int64_t n_rows,
                           const kvg_codec_params * cp, uint8_t ** data, size_t * n_bytes) {
    int rc = kvg_encoded_size(codec, kind, n_rows, s->p.n_head_kv, head_dim_of(s, kind), cp, n_bytes);
    if (rc != KVG_OK) {
        return rc;
    }
    *data = (uint8_t *) malloc(*n_bytes ? *n_bytes : 1);
    return *data ? KVG_OK : kvg_fail(KVG_ERR_NO_MEMORY, "block of %zu bytes", *n_bytes);
}

// A new block's bytes, once written (rc: how that went), checked and described in *out; freed on
// any failure. Every linked block passes its codec's check once, here or in append_encoded, so the
// readers (decode, attend) can trust the bytes without checking them again.
static int finish_block(const kvg_store * s, int32_t kind, int32_t tier, int32_t codec, const kvg_codec_params * cp,
                        int64_t n_rows, uint8_t * data, size_t n_bytes, int rc, kvg_block * out) {
    if (rc == KVG_OK) {
        rc = kvg_check_encoded(codec, kind, data, n_bytes, n_rows, s->p.n_head_kv, head_dim_of(s, kind), cp);
    }
    if (rc != KVG_OK) {
        free(data);
        return rc;
    }
    out->n_rows     = n_rows;
    out->codec      = codec;
    out->tier       = tier;
    out->n_bytes    = n_bytes;
    out->data       = data;
    out->fail_reads = 0;
    out->shift      = 0;
    return KVG_OK;
}

// Encodes rows of list li into a new block (not yet linked anywhere). A codec with a codebook
// uses the list's; when the list has none yet, *fresh (trained here on these rows if NULL) is
// used, and the caller keeps it once its mutation commits (or frees it).
static int encode_block(const kvg_store * s, int64_t li, int32_t tier, int32_t codec, const float * rows,
                        int64_t n_rows, float ** fresh, kvg_block * out) {
    const int32_t kind    = (int32_t) (li % 2);
    size_t        n_bytes = 0;
    int           rc      = kvg_injected_failure("encode a block");
    if (rc != KVG_OK) {
        return rc;
    }
    const size_t count = (size_t) n_rows * (size_t) row_width(s, kind);
    const int    slot  = book_slot(codec);
    if (slot >= 0 && !s->rows[li].book[slot] && fresh && !*fresh) {
        rc = kvg_injected_failure("train a codebook");
        if (rc != KVG_OK) {
            return rc;
        }
        const size_t nb = book_floats(s, kind, codec);
        float *      bk = (float *) malloc(nb * sizeof(float));
        if (!bk) {
            return kvg_fail(KVG_ERR_NO_MEMORY, "codebook of %zu floats", nb);
        }
        rc = (codec >= KVG_CODEC_WFQ2 ? kvg_wfq_train : kvg_pq_train)(codec, kind, rows, count, n_rows, s->p.n_head_kv,
                                                                      head_dim_of(s, kind), &s->p.codec, bk, nb);
        if (rc != KVG_OK) {
            free(bk);
            return rc;
        }
        *fresh = bk;
    }
    const kvg_codec_params cp   = kvg_store_list_params(s, li, codec, fresh ? *fresh : NULL);
    uint8_t *              data = NULL;
    rc                          = new_block_bytes(s, kind, codec, n_rows, &cp, &data, &n_bytes);
    if (rc == KVG_OK) {
        rc = kvg_encode(codec, kind, rows, count, n_rows, s->p.n_head_kv, head_dim_of(s, kind), &cp, data, n_bytes,
                        NULL);
    }
    return finish_block(s, kind, tier, codec, &cp, n_rows, data, n_bytes, rc, out);
}

static int decode_block(const kvg_store * s, int64_t li, const kvg_block * b, float * dst) {
    if (b->fail_reads) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "injected read failure (kvg_store_debug_fail_reads)");
    }
    const int32_t          kind  = (int32_t) (li % 2);
    const size_t           count = (size_t) b->n_rows * (size_t) row_width(s, kind);
    const kvg_codec_params cp    = kvg_store_list_params(s, li, b->codec, NULL);
    return kvg_decode(b->codec, kind, b->data, b->n_bytes, b->n_rows, s->p.n_head_kv, head_dim_of(s, kind), &cp, dst,
                      count);
}

// Room in the index for one more block.
static int reserve_block(kvg_rows * r) {
    if (r->n_blocks < r->cap) {
        return KVG_OK;
    }
    const int rc = kvg_injected_failure("grow the block index");
    if (rc != KVG_OK) {
        return rc;
    }
    const int64_t cap = r->cap ? r->cap * 2 : 16;
    kvg_block *   nb  = (kvg_block *) realloc(r->blocks, (size_t) cap * sizeof(kvg_block));
    if (!nb) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "block index");
    }
    r->blocks = nb;
    r->cap    = cap;
    return KVG_OK;
}

static _Atomic uint64_t g_block_ids = 0;

uint64_t kvg_block_new_id(void) {
    return atomic_fetch_add_explicit(&g_block_ids, 1, memory_order_relaxed) + 1;
}

// Puts block b after the last row (reserve_block must have succeeded).
static void link_block(kvg_rows * r, kvg_block * b) {
    b->row0                  = r->n_rows;
    b->id                    = kvg_block_new_id();
    r->blocks[r->n_blocks++] = *b;
    r->version++;
    r->n_rows += b->n_rows;
}

static int check_append(const kvg_store * s, int32_t il, int32_t kind, int32_t tier, int64_t n_rows) {
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!s->enabled[il]) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d is disabled (it keeps llama.cpp's own window)", (int) il);
    }
    if (tier < 0 || tier >= KVG_TIER_COUNT) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "tier %d is unknown", (int) tier);
    }
    if (n_rows <= 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "append needs n_rows > 0");
    }
    return KVG_OK;
}

int kvg_store_append(kvg_store * s, int32_t il, int32_t kind, int32_t tier, int32_t codec, const float * rows,
                     size_t count, int64_t n_rows) {
    kvg_clear_error();
    int rc = check_append(s, il, kind, tier, n_rows);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "rows is NULL");
    }
    if (count != (size_t) n_rows * (size_t) row_width(s, kind)) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%zu floats given for %lld rows of %lld", count, (long long) n_rows,
                        (long long) row_width(s, kind));
    }
    kvg_rows * r = &s->rows[il * 2 + kind];
    rc           = reserve_block(r);
    if (rc != KVG_OK) {
        return rc;
    }
    kvg_block b;
    float *   fresh = NULL;
    rc              = encode_block(s, il * 2 + kind, tier, codec, rows, n_rows, &fresh, &b);
    if (rc != KVG_OK) {
        free(fresh);
        return rc;
    }
    link_block(r, &b);
    if (fresh) {
        r->book[book_slot(codec)] = fresh;
    }
    return KVG_OK;
}

int kvg_store_append_encoded(kvg_store * s, int32_t il, int32_t kind, int32_t tier, int32_t codec, int64_t n_rows,
                             const void * data, size_t n_bytes) {
    kvg_clear_error();
    int rc = check_append(s, il, kind, tier, n_rows);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!data) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "data is NULL");
    }
    size_t want = 0;
    rc          = kvg_encoded_size(codec, kind, n_rows, s->p.n_head_kv, head_dim_of(s, kind), &s->p.codec, &want);
    if (rc != KVG_OK) {
        return rc;
    }
    if (n_bytes != want) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%zu bytes given for %lld rows of %s, which take %zu", n_bytes,
                        (long long) n_rows, kvg_codec_name(codec), want);
    }
    kvg_rows * r = &s->rows[il * 2 + kind];
    rc           = reserve_block(r);
    if (rc != KVG_OK) {
        return rc;
    }
    rc = kvg_injected_failure("copy an encoded block");
    if (rc != KVG_OK) {
        return rc;
    }
    kvg_block b = { 0, n_rows, codec, tier, n_bytes, (uint8_t *) malloc(n_bytes ? n_bytes : 1), 0, 0, 0 };
    if (!b.data) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "block of %zu bytes", n_bytes);
    }
    memcpy(b.data, data, n_bytes);
    // Bytes from a file: refuse what no encoder writes before the block is visible to readers
    // (a pq2 or vq8 block before its list's codebook: kvg_store_set_book comes first).
    const kvg_codec_params cp = kvg_store_list_params(s, il * 2 + kind, codec, NULL);
    rc = kvg_check_encoded(codec, kind, b.data, n_bytes, n_rows, s->p.n_head_kv, head_dim_of(s, kind), &cp);
    if (rc != KVG_OK) {
        free(b.data);
        return rc;
    }
    link_block(r, &b);
    return KVG_OK;
}

int kvg_store_n_blocks(const kvg_store * s, int32_t il, int32_t kind, int64_t * out_blocks) {
    kvg_clear_error();
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!out_blocks) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "out_blocks is NULL");
    }
    *out_blocks = s->rows[il * 2 + kind].n_blocks;
    return KVG_OK;
}

int kvg_store_block(const kvg_store * s, int32_t il, int32_t kind, int64_t bi, kvg_block_info * out, void * dst,
                    size_t dst_bytes) {
    kvg_clear_error();
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    const kvg_rows * r = &s->rows[il * 2 + kind];
    if (!out || bi < 0 || bi >= r->n_blocks) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "block %lld is outside [0, %lld) or out is NULL", (long long) bi,
                        (long long) r->n_blocks);
    }
    const kvg_block * b = &r->blocks[bi];
    out->row0           = b->row0;
    out->n_rows         = b->n_rows;
    out->codec          = b->codec;
    out->tier           = b->tier;
    out->n_bytes        = b->n_bytes;
    if (dst) {
        if (dst_bytes != b->n_bytes) {
            return kvg_fail(KVG_ERR_BUFFER_SIZE, "block holds %zu bytes, %zu given", b->n_bytes, dst_bytes);
        }
        memcpy(dst, b->data, b->n_bytes);
    }
    return KVG_OK;
}

int kvg_store_n_rows(const kvg_store * s, int32_t il, int32_t kind, int64_t * out_rows) {
    kvg_clear_error();
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!out_rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "out_rows is NULL");
    }
    *out_rows = s->rows[il * 2 + kind].n_rows;
    return KVG_OK;
}

int64_t kvg_rows_find_block(const kvg_rows * r, int64_t row) {
    int64_t lo = 0, hi = r->n_blocks - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (r->blocks[mid].row0 <= row) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// Writes rows [r0, r1) as f32 (dst32) or f16 (dst16), one of them non-NULL.
static int decode_range(const kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, float * dst32,
                        uint16_t * dst16, size_t count) {
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    const kvg_rows * r = &s->rows[il * 2 + kind];
    if (r0 < 0 || r1 < r0 || r1 > r->n_rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "rows [%lld, %lld) are outside [0, %lld)", (long long) r0, (long long) r1,
                        (long long) r->n_rows);
    }
    const int64_t w = row_width(s, kind);
    if (count != (size_t) (r1 - r0) * (size_t) w) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%zu values given for %lld rows of %lld", count, (long long) (r1 - r0),
                        (long long) w);
    }
    if (r1 == r0) {
        return KVG_OK;
    }
    for (int64_t bi = kvg_rows_find_block(r, r0); bi < r->n_blocks && r->blocks[bi].row0 < r1; ++bi) {
        const kvg_block * b     = &r->blocks[bi];
        const int64_t     a     = r0 > b->row0 ? r0 : b->row0;
        const int64_t     e     = r1 < b->row0 + b->n_rows ? r1 : b->row0 + b->n_rows;
        const size_t      first = (size_t) (a - b->row0) * (size_t) w;  // in the block
        const size_t      n     = (size_t) (e - a) * (size_t) w;
        const size_t      out   = (size_t) (a - r0) * (size_t) w;  // in dst
        if (b->fail_reads) {
            return kvg_fail(KVG_ERR_NO_MEMORY, "injected read failure (kvg_store_debug_fail_reads)");
        }
        if (b->codec == KVG_CODEC_F16 && dst16) {
            // Exact rows go back bit for bit: no round trip through f32.
            for (size_t i = 0; i < n; ++i) {
                dst16[out + i] = kvg_get_u16(b->data + 2 * (first + i));
            }
            continue;
        }
        float * tmp = scratch_floats((size_t) b->n_rows * (size_t) w);
        if (!tmp) {
            return kvg_fail(KVG_ERR_NO_MEMORY, "decode scratch");
        }
        rc = decode_block(s, il * 2 + kind, b, tmp);
        if (rc != KVG_OK) {
            return rc;
        }
        if (dst32) {
            memcpy(dst32 + out, tmp + first, n * sizeof(float));
        } else {
            // Saturate: a kivi group spanning nearly all of f16's range can decode a hair past
            // 65504 (its scale rounds up), and llama.cpp must never see an Inf key or value.
            float * v = tmp + first;
            for (size_t i = 0; i < n; ++i) {
                v[i] = v[i] > KVG_F16_MAX ? KVG_F16_MAX : (v[i] < -KVG_F16_MAX ? -KVG_F16_MAX : v[i]);
            }
            kvg_f32_to_f16_row(v, dst16 + out, (int64_t) n);
        }
    }
    return KVG_OK;
}

int kvg_store_decode(const kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, float * dst, size_t count) {
    kvg_clear_error();
    if (!dst) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "dst is NULL");
    }
    return decode_range(s, il, kind, r0, r1, dst, NULL, count);
}

int kvg_store_decode_f16(const kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, uint16_t * dst,
                         size_t count) {
    kvg_clear_error();
    if (!dst) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "dst is NULL");
    }
    return decode_range(s, il, kind, r0, r1, NULL, dst, count);
}

static int is_rotq(int32_t codec) {
    return codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4;
}

// rotq into rotq: the first n_rows of b coded again from their codes (kvg_rotq_transcode), what
// decoding and encoding them gives without the two rotations (aging's warm -> archive step).
static int transcode_block(const kvg_store * s, int64_t li, const kvg_block * b, int64_t n_rows, int32_t tier,
                           int32_t codec, kvg_block * out) {
    if (b->fail_reads) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "injected read failure (kvg_store_debug_fail_reads)");
    }
    int rc = kvg_injected_failure("encode a block");
    if (rc != KVG_OK) {
        return rc;
    }
    const int32_t          kind    = (int32_t) (li % 2);
    const int64_t          H       = s->p.n_head_kv;
    const kvg_codec_params cp      = kvg_store_list_params(s, li, codec, NULL);
    uint8_t *              data    = NULL;
    size_t                 n_bytes = 0;
    rc                             = new_block_bytes(s, kind, codec, n_rows, &cp, &data, &n_bytes);
    if (rc == KVG_OK) {
        rc = kvg_rotq_transcode(b->n_rows * H, n_rows * H, head_dim_of(s, kind), b->codec - KVG_CODEC_ROTQ1 + 1,
                                b->data, codec - KVG_CODEC_ROTQ1 + 1, data);
    }
    rc         = finish_block(s, kind, tier, codec, &cp, n_rows, data, n_bytes, rc, out);
    out->row0  = b->row0;
    out->shift = b->shift;
    return rc;
}

// Decodes block b of list li and encodes its first n_rows rows with (tier, codec) into *out
// (fresh: as in encode_block); rotq into rotq from the codes.
static int reencode_block(const kvg_store * s, int64_t li, const kvg_block * b, int64_t n_rows, int32_t tier,
                          int32_t codec, float ** fresh, kvg_block * out) {
    if (is_rotq(b->codec) && is_rotq(codec)) {
        return transcode_block(s, li, b, n_rows, tier, codec, out);
    }
    const size_t w   = (size_t) row_width(s, (int32_t) (li % 2));
    float *      tmp = (float *) malloc((size_t) b->n_rows * w * sizeof(float));
    if (!tmp) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "re-encode buffer");
    }
    int rc = decode_block(s, li, b, tmp);
    if (rc == KVG_OK) {
        rc = encode_block(s, li, tier, codec, tmp, n_rows, fresh, out);
    }
    free(tmp);
    out->row0  = b->row0;
    out->shift = b->shift;  // the decoded keys are the ones rotated where the block's were
    return rc;
}

int kvg_store_retier(kvg_store * s, int64_t r0, int64_t r1, int32_t tier, int32_t codec) {
    return kvg_store_retier_list(s, -1, -1, r0, r1, tier, codec);
}

int kvg_store_retier_list(kvg_store * s, int32_t il, int32_t kind, int64_t r0, int64_t r1, int32_t tier,
                          int32_t codec) {
    kvg_clear_error();
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    if (il < -1 || il >= s->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d is out of range (the store has %d; -1: all)", (int) il,
                        (int) s->p.n_layer);
    }
    if (kind < -1 || kind > KVG_KIND_V) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kind %d is unknown (0: K, 1: V, -1: both)", (int) kind);
    }
    if (!kvg_codec_name(codec)) {
        return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec type %d is unknown", (int) codec);
    }
    const size_t n_lists = (size_t) s->p.n_layer * 2;
    int32_t *    codecs  = (int32_t *) malloc(n_lists * sizeof(int32_t));
    if (!codecs) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "retier: list of %zu codecs", n_lists);
    }
    for (size_t li = 0; li < n_lists; ++li) {  // list li holds layer li / 2, kind li % 2
        const int selected = (il < 0 || (int32_t) (li / 2) == il) && (kind < 0 || (int32_t) (li % 2) == kind);
        codecs[li]         = selected ? codec : -1;
    }
    const int rc = kvg_store_retier_lists(s, r0, r1, tier, codecs, n_lists);
    free(codecs);
    return rc;
}

// A block re-encoded but not yet swapped in: list li, block bi (nb.data NULL: its tier alone
// changes, its codec and bytes stay).
typedef struct kvg_staged {
    int64_t   li;
    int64_t   bi;
    kvg_block nb;
} kvg_staged;

static void staged_free(kvg_staged * st, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
        free(st[k].nb.data);
    }
    free(st);
}

// Retier's staging, shared by its threads: job j is one list's blocks st[starts[j], starts[j + 1]),
// re-encoded in order by one thread (a codebook trained for a list is trained once, as one thread
// would). The first failure stops the others; its status and message are kept for the caller.
typedef struct retier_stage {
    const kvg_store * s;
    kvg_staged *      st;
    const int64_t *   starts;
    int64_t           n_jobs;
    int32_t           tier;
    const int32_t *   codecs;
    float **          fresh;
    _Atomic int64_t   next;  // the next job to take
    _Atomic int       rc;    // KVG_OK, or the first failure's status
    pthread_mutex_t   lock;  // for the first failure's message
    char              msg[512];
} retier_stage;

static void * stage_worker(void * arg) {
    retier_stage * w = (retier_stage *) arg;
    for (int64_t j; (j = atomic_fetch_add(&w->next, 1)) < w->n_jobs && atomic_load(&w->rc) == KVG_OK;) {
        for (int64_t k = w->starts[j]; k < w->starts[j + 1]; ++k) {
            const int64_t     li = w->st[k].li;
            const kvg_block * b  = &w->s->rows[li].blocks[w->st[k].bi];
            if (b->codec == w->codecs[li]) {
                continue;  // the tier alone changes: the bytes stay (and so does the id)
            }
            const int rc = reencode_block(w->s, li, b, b->n_rows, w->tier, w->codecs[li], &w->fresh[li], &w->st[k].nb);
            if (rc != KVG_OK) {
                pthread_mutex_lock(&w->lock);
                if (atomic_load(&w->rc) == KVG_OK) {
                    snprintf(w->msg, sizeof(w->msg), "%s", kvg_last_error());
                    atomic_store(&w->rc, rc);
                }
                pthread_mutex_unlock(&w->lock);
                break;
            }
        }
    }
    return NULL;
}

// Re-encodes the staged blocks on up to s->n_threads threads (this one among them; fewer where a
// thread cannot be started). Each list's result is the same bytes as on one thread.
static int stage_lists(const kvg_store * s, kvg_staged * st, const int64_t * starts, int64_t n_jobs, int32_t tier,
                       const int32_t * codecs, float ** fresh) {
    retier_stage w;
    memset(&w, 0, sizeof(w));
    w.s      = s;
    w.st     = st;
    w.starts = starts;
    w.n_jobs = n_jobs;
    w.tier   = tier;
    w.codecs = codecs;
    w.fresh  = fresh;
    atomic_init(&w.next, 0);
    atomic_init(&w.rc, KVG_OK);
    if (pthread_mutex_init(&w.lock, NULL) != 0) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "retier: a lock for its threads");
    }
    pthread_t     th[KVG_STORE_MAX_THREADS];
    const int64_t want    = s->n_threads < n_jobs ? s->n_threads : n_jobs;
    int64_t       started = 0;
    while (started + 1 < want && pthread_create(&th[started], NULL, stage_worker, &w) == 0) {
        started++;
    }
    stage_worker(&w);
    for (int64_t t = 0; t < started; ++t) {
        pthread_join(th[t], NULL);
    }
    pthread_mutex_destroy(&w.lock);
    const int rc = atomic_load(&w.rc);
    return rc == KVG_OK ? KVG_OK : kvg_fail(rc, "%s", w.msg);
}

int kvg_store_retier_lists(kvg_store * s, int64_t r0, int64_t r1, int32_t tier, const int32_t * codecs,
                           size_t n_codecs) {
    kvg_clear_error();
    if (!s || !codecs) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store and codecs must not be NULL");
    }
    if (tier < 0 || tier >= KVG_TIER_COUNT) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "tier %d is unknown", (int) tier);
    }
    const int64_t n_lists = (int64_t) s->p.n_layer * 2;
    if (n_codecs != (size_t) n_lists) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "%zu codecs given for %lld lists (2 per layer)", n_codecs,
                        (long long) n_lists);
    }
    // Check every list first so a straddled boundary or an unknown codec changes nothing.
    int64_t n_todo = 0;
    for (int64_t li = 0; li < n_lists; ++li) {
        if (codecs[li] == -1) {
            continue;
        }
        if (!kvg_codec_name(codecs[li])) {
            return kvg_fail(KVG_ERR_UNKNOWN_CODEC, "codec type %d (list %lld) is unknown", (int) codecs[li],
                            (long long) li);
        }
        const kvg_rows * r = &s->rows[li];
        for (int64_t bi = 0; bi < r->n_blocks; ++bi) {
            const kvg_block * b = &r->blocks[bi];
            const int64_t     e = b->row0 + b->n_rows;
            if ((b->row0 < r0 && e > r0) || (b->row0 < r1 && e > r1)) {
                return kvg_fail(KVG_ERR_INVALID_ARG, "rows [%lld, %lld) cut block [%lld, %lld)", (long long) r0,
                                (long long) r1, (long long) b->row0, (long long) e);
            }
            n_todo += b->row0 >= r0 && e <= r1 && !(b->tier == tier && b->codec == codecs[li]);
        }
    }
    if (n_todo == 0) {
        return KVG_OK;
    }
    // Stage: every new block is encoded before any old one is touched.
    int          rc = kvg_injected_failure("retier: staging list");
    kvg_staged * st = rc == KVG_OK ? (kvg_staged *) calloc((size_t) n_todo, sizeof(kvg_staged)) : NULL;
    float ** fresh  = st ? (float **) calloc((size_t) n_lists, sizeof(float *)) : NULL;  // books trained here, per list
    if (!fresh) {
        free(st);
        return rc != KVG_OK ? rc
                            : kvg_fail(KVG_ERR_NO_MEMORY, "retier: staging list of %lld blocks", (long long) n_todo);
    }
    // The blocks staged list by list (the lists' starts in `starts`), then coded on the threads.
    int64_t * starts = (int64_t *) malloc(((size_t) n_lists + 1) * sizeof(int64_t));
    if (!starts) {
        free(st);
        free(fresh);
        return kvg_fail(KVG_ERR_NO_MEMORY, "retier: staging list of %lld lists", (long long) n_lists);
    }
    int64_t k = 0, n_jobs = 0;
    for (int64_t li = 0; li < n_lists; ++li) {
        const kvg_rows * r  = &s->rows[li];
        const int64_t    k0 = k;
        for (int64_t bi = 0; codecs[li] != -1 && bi < r->n_blocks; ++bi) {
            const kvg_block * b = &r->blocks[bi];
            if (b->row0 < r0 || b->row0 + b->n_rows > r1 || (b->tier == tier && b->codec == codecs[li])) {
                continue;
            }
            st[k].li = li;
            st[k].bi = bi;
            k++;
        }
        if (k > k0) {
            starts[n_jobs++] = k0;
        }
    }
    starts[n_jobs] = k;
    rc             = stage_lists(s, st, starts, n_jobs, tier, codecs, fresh);
    free(starts);
    if (rc != KVG_OK) {
        staged_free(st, n_todo);
        for (int64_t li = 0; li < n_lists; ++li) {
            free(fresh[li]);
        }
        free(fresh);
        return rc;
    }
    // Commit: pointer swaps only, while no hook reads the blocks.
    pthread_rwlock_wrlock((pthread_rwlock_t *) s->swap_lock);
    for (k = 0; k < n_todo; ++k) {
        kvg_block * b = &s->rows[st[k].li].blocks[st[k].bi];
        s->rows[st[k].li].version++;
        if (!st[k].nb.data) {
            b->tier = tier;
            continue;
        }
        free(b->data);
        *b            = st[k].nb;
        b->id         = kvg_block_new_id();
        st[k].nb.data = NULL;
    }
    for (int64_t li = 0; li < n_lists; ++li) {
        if (fresh[li]) {
            s->rows[li].book[book_slot(codecs[li])] = fresh[li];
        }
    }
    pthread_rwlock_unlock((pthread_rwlock_t *) s->swap_lock);
    free(fresh);
    staged_free(st, n_todo);
    return KVG_OK;
}

int kvg_store_truncate(kvg_store * s, int64_t n_rows) {
    kvg_clear_error();
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    if (n_rows < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "n_rows %lld is negative", (long long) n_rows);
    }
    const int64_t n_lists = (int64_t) s->p.n_layer * 2;
    // Lists whose last kept block is cut in two need it re-encoded; a cut on a block boundary
    // (the rollback of an append) allocates nothing and cannot fail.
    int64_t n_cut = 0;
    for (int64_t li = 0; li < n_lists; ++li) {
        const kvg_rows * r = &s->rows[li];
        n_cut += r->n_rows > n_rows && n_rows > 0 && r->blocks[kvg_rows_find_block(r, n_rows)].row0 != n_rows;
    }
    kvg_block * cut = NULL;  // [n_lists]: the re-encoded head of each cut block (data NULL: none)
    if (n_cut) {
        int rc = kvg_injected_failure("truncate: staging list");
        cut    = rc == KVG_OK ? (kvg_block *) calloc((size_t) n_lists, sizeof(kvg_block)) : NULL;
        if (!cut) {
            return rc != KVG_OK ? rc : kvg_fail(KVG_ERR_NO_MEMORY, "truncate: staging list");
        }
        for (int64_t li = 0; li < n_lists && rc == KVG_OK; ++li) {
            const kvg_rows * r = &s->rows[li];
            if (r->n_rows <= n_rows) {
                continue;
            }
            const kvg_block * b = &r->blocks[kvg_rows_find_block(r, n_rows)];
            if (b->row0 != n_rows) {
                rc = reencode_block(s, li, b, n_rows - b->row0, b->tier, b->codec, NULL, &cut[li]);
            }
        }
        if (rc != KVG_OK) {
            for (int64_t li = 0; li < n_lists; ++li) {
                free(cut[li].data);
            }
            free(cut);
            return rc;
        }
    }
    for (int64_t li = 0; li < n_lists; ++li) {
        kvg_rows * r = &s->rows[li];
        if (r->n_rows <= n_rows) {
            continue;
        }
        if (n_rows == 0) {
            rows_drop_from(r, 0);
            continue;
        }
        const int64_t bi = kvg_rows_find_block(r, n_rows);
        if (!cut || !cut[li].data) {
            rows_drop_from(r, bi);
            continue;
        }
        rows_drop_from(r, bi + 1);
        free(r->blocks[bi].data);
        r->blocks[bi]    = cut[li];
        r->blocks[bi].id = kvg_block_new_id();
        r->n_rows        = n_rows;
        r->version++;
    }
    free(cut);
    kvg_mass_forget_from(s, n_rows);
    return KVG_OK;
}

int kvg_store_debug_fail_reads(kvg_store * s, int32_t il, int32_t kind, int64_t row, int32_t on) {
    kvg_clear_error();
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    kvg_rows * r = &s->rows[il * 2 + kind];
    if (row < 0 || row >= r->n_rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "row %lld is outside [0, %lld)", (long long) row, (long long) r->n_rows);
    }
    r->blocks[kvg_rows_find_block(r, row)].fail_reads = on ? 1 : 0;
    return KVG_OK;
}

int kvg_store_bytes(const kvg_store * s, int32_t tier, uint64_t * out_bytes, uint64_t * out_values,
                    uint64_t * out_index_bytes) {
    kvg_clear_error();
    if (!s || !out_bytes || !out_values) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store and outputs must not be NULL");
    }
    if (tier < 0 || tier > KVG_TIER_COUNT) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "tier %d is unknown", (int) tier);
    }
    uint64_t      bytes = 0, values = 0;
    const int32_t d_max = s->p.head_dim_k > s->p.head_dim_v ? s->p.head_dim_k : s->p.head_dim_v;
    uint64_t      index = sizeof(kvg_store) + (uint64_t) s->p.n_layer * (sizeof(int32_t) + 2 * sizeof(kvg_rows)) +
                          (uint64_t) d_max * sizeof(float);
    for (int64_t li = 0; li < (int64_t) s->p.n_layer * 2; ++li) {
        const kvg_rows * r = &s->rows[li];
        index += (uint64_t) r->cap * sizeof(kvg_block);
        for (int64_t bi = 0; bi < r->n_blocks; ++bi) {
            const kvg_block * b = &r->blocks[bi];
            if (tier == KVG_TIER_COUNT || b->tier == tier) {
                bytes += b->n_bytes;
                values += (uint64_t) b->n_rows * (uint64_t) row_width(s, (int32_t) (li % 2));
            }
        }
    }
    *out_bytes  = bytes;
    *out_values = values;
    if (out_index_bytes) {
        *out_index_bytes = index;
    }
    return KVG_OK;
}

int32_t kvg_store_hook_n_cold(void * user, int32_t il) {
    const kvg_store * s = (const kvg_store *) user;
    if (!s || il < 0 || il >= s->p.n_layer || !s->enabled[il]) {
        return 0;
    }
    // Rows held by both K and V: the two are appended one after the other.
    const int64_t nk = s->rows[il * 2].n_rows, nv = s->rows[il * 2 + 1].n_rows;
    return (int32_t) (nk < nv ? nk : nv);
}

int32_t kvg_store_hook_decode(void * user, int32_t il, int32_t kind, int64_t r0, int64_t r1, uint16_t * dst,
                              int64_t n_embd) {
    const kvg_store * s = (const kvg_store *) user;
    if (!s || !dst || check_layer_kind(s, il, kind) != KVG_OK || n_embd != row_width(s, kind) || r1 < r0) {
        return KVG_ERR_INVALID_ARG;
    }
    int rc = kvg_store_read_begin(s);
    if (rc == KVG_OK) {
        rc = decode_range(s, il, kind, r0, r1, NULL, dst, (size_t) (r1 - r0) * (size_t) n_embd);
        kvg_store_read_end(s);
    }
    if (rc != KVG_OK) {
        atomic_fetch_add_explicit(&((kvg_store *) user)->read_failures[KVG_READ_DECODE], 1, memory_order_relaxed);
    }
    return rc;
}

int64_t kvg_store_read_failures(const kvg_store * s, int32_t path) {
    if (!s || path < 0 || path > KVG_READ_ATTEND) {
        return -1;
    }
    return atomic_load_explicit(&((kvg_store *) s)->read_failures[path], memory_order_relaxed);
}

// ---- codebooks -----------------------------------------------------------------------------

static int check_book_args(const kvg_store * s, int32_t il, int32_t kind, int32_t codec) {
    int rc = check_layer_kind(s, il, kind);
    if (rc != KVG_OK) {
        return rc;
    }
    if (book_slot(codec) < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "codec %d (%s) keeps no codebook (pq2, vq8, vq8f and wfq do)", (int) codec,
                        kvg_codec_name(codec) ? kvg_codec_name(codec) : "unknown");
    }
    size_t unused;
    return kvg_encoded_size(codec, kind, 1, s->p.n_head_kv, head_dim_of(s, kind), &s->p.codec, &unused);
}

int kvg_store_book(const kvg_store * s, int32_t il, int32_t kind, int32_t codec, float * dst, size_t count,
                   size_t * out_count) {
    kvg_clear_error();
    int rc = check_book_args(s, il, kind, codec);
    if (rc != KVG_OK) {
        return rc;
    }
    if (!out_count) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "out_count is NULL");
    }
    const float * bk = s->rows[il * 2 + kind].book[book_slot(codec)];
    const size_t  n  = bk ? book_floats(s, kind, codec) : 0;
    *out_count       = n;
    if (dst && n) {
        if (count != n) {
            return kvg_fail(KVG_ERR_BUFFER_SIZE, "the codebook holds %zu floats, %zu given", n, count);
        }
        memcpy(dst, bk, n * sizeof(float));
    }
    return KVG_OK;
}

int kvg_store_set_book(kvg_store * s, int32_t il, int32_t kind, int32_t codec, const float * book, size_t count) {
    kvg_clear_error();
    int rc = check_book_args(s, il, kind, codec);
    if (rc != KVG_OK) {
        return rc;
    }
    const size_t n = book_floats(s, kind, codec);
    if (!book || count != n) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "a %s codebook of this store holds %zu floats, %zu given",
                        kvg_codec_name(codec), n, book ? count : (size_t) 0);
    }
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(book[i])) {
            return kvg_fail(KVG_ERR_NONFINITE, "codebook value %zu is not finite", i);
        }
    }
    if (codec >= KVG_CODEC_WFQ2) {  // a plan must be one the codec can follow
        kvg_codec_params p = s->p.codec;
        p.book             = book;
        p.book_count       = n;
        kvg_job job;
        size_t  unused;
        rc = kvg_make_job(codec, kind, 1, s->p.n_head_kv, head_dim_of(s, kind), &p, &job, &unused);
        rc = rc == KVG_OK ? kvg_wfq_check_book(&job) : rc;
        if (rc != KVG_OK) {
            return rc;
        }
    }
    kvg_rows * r    = &s->rows[il * 2 + kind];
    const int  slot = book_slot(codec);  // check_book_args: a codec with a codebook
    for (int64_t bi = 0; bi < r->n_blocks; ++bi) {
        if (r->blocks[bi].codec == codec) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d %c holds %s blocks coded with its codebook; clear it first",
                            (int) il, kind == KVG_KIND_K ? 'K' : 'V', kvg_codec_name(codec));
        }
    }
    rc = kvg_injected_failure("copy a codebook");
    if (rc != KVG_OK) {
        return rc;
    }
    float * bk = (float *) malloc(n * sizeof(float));
    if (!bk) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "codebook of %zu floats", n);
    }
    memcpy(bk, book, n * sizeof(float));
    free(r->book[slot]);
    r->book[slot] = bk;
    return KVG_OK;
}

int kvg_store_book_bytes(const kvg_store * s, uint64_t * out_bytes) {
    kvg_clear_error();
    if (!s || !out_bytes) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store and out_bytes must not be NULL");
    }
    uint64_t bytes = 0;
    for (int64_t li = 0; li < (int64_t) s->p.n_layer * 2; ++li) {
        for (int slot = 0; slot < KVG_BOOK_SLOTS; ++slot) {
            const int32_t codec = KVG_CODEC_PQ2 + slot;
            bytes += s->rows[li].book[slot] ? book_floats(s, (int32_t) (li % 2), codec) * sizeof(float) : 0;
        }
    }
    *out_bytes = bytes;
    return KVG_OK;
}
