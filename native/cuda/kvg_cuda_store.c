// kvg_cuda_store.c: a store's coded blocks in device memory, and the hooks llama.cpp's CUDA op
// calls (kvg_cuda.h, "A store's coded blocks on the device").
//
// The host store stays the store (store.c): Python changes it between llama_decode calls, then
// syncs this copy. C on the host side only: the kernels are the kvg_cuda_* calls, queued on
// llama.cpp's stream during a hook.
//
// Layout: a store keeps one block per eviction (64 rows by default), and one kvg_cuda_attend per
// block would be hundreds of launches per layer at 32K. So the copy keeps each run of blocks of
// one codec as one segment: a buffer of `cap` rows laid out as a block of cap rows is
// ([per-row part] for cap rows, then [codes] for cap rows), which kvg_cuda_attend reads as one
// block, rows [skip, skip + n_rows) live. The per-row part is rotq's norms, or kivi's groups: a
// kivi V row's own, a kivi K group's per `unit` of G rows (the run then breaks after a block
// whose rows are not whole groups, and rows stay whole groups from the buffer's start). Rows come
// in at the tail (evictions, a block aged into the run before) and leave at the head (the oldest
// block aging out), so a sync copies in only blocks the copy lacks (a block's id changes with its
// bytes), and a segment is rebuilt from the host's bytes only when its run changed otherwise (a
// cut, a block re-encoded in the middle). Codecs whose rows cannot be concatenated so (the other
// codecs, kivi whose rows are not whole bytes of codes) are kept as segments without data: attend
// leaves their rows out and says so.
#include "kvg_cuda.h"
#include "kvg_cuda_internal.h"
#include "kvg_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct seg_block {
    uint64_t id;  // the host block's (kvg_block.id)
    int64_t  n_rows;
} seg_block;

typedef struct segment {
    int32_t     codec;
    int64_t     unit;            // rows a piece of the per-row part covers (kivi K: G; else 1)
    size_t      head_b, code_b;  // bytes of the per-row part a unit, of the codes a row (0, 0: no data)
    void *      data;            // device: [head_b * cap / unit][code_b * cap]
    int64_t     cap;             // rows the buffer holds
    int64_t     skip;            // rows at the buffer's start that left the run
    int64_t     row0;            // the store's row of the first live row
    int64_t     n_rows;          // live rows
    seg_block * blocks;          // the live blocks, in order
    int64_t     n_blocks;
    int         claimed;   // sync: taken over by a run of the new list
    int         fresh;     // sync: data allocated by this sync (freed if it fails)
    void *      old_data;  // sync: the buffer a grown segment leaves (freed if it succeeds)
} segment;

typedef struct dev_list {
    segment * s;
    int64_t   n;
    int       kept;  // sync: the host's list has not changed since the copy was made (nothing staged)
} dev_list;

// A block kvg_cuda_store_encode coded on the device: the next sync takes its bytes from here
// (device to device) instead of from the host, and frees it.
typedef struct pending {
    uint64_t id;
    void *   data;  // inside one of the store's arenas
    size_t   n_bytes;
} pending;

typedef struct arena {
    void * data;
    size_t n_bytes;
} arena;

struct kvg_cuda_store {
    kvg_cuda_ctx *    ctx;
    const kvg_store * host;
    dev_list *        lists;  // n_layer * 2, as the host's rows
    int32_t *         on;     // per layer: attention on the GPU
    uint64_t *        seen;   // per list: 1 + the host list's version the copy holds (0: look again)
    int               stale;  // the last sync failed: the copy is not the store
    uint64_t          bytes;  // device bytes of the segments
    float *           q_dev;  // the queries, gathered (attend's scratch is the context's)
    size_t            q_floats;
    uint64_t          calls[2];  // hook_attend's and hook_finish's calls (proof the GPU took the ops)
    pending *         pend;      // blocks coded here since the last sync
    int64_t           n_pend, cap_pend;
    arena *           arenas;  // the device buffers they lie in (one per kvg_cuda_store_encode_many)
    int64_t           n_arenas, cap_arenas;
    // An eviction a batch (prefill) would otherwise cudaMalloc an arena and cudaFree it at the
    // next sync, and cudaFree waits on the whole device: the largest arena a sync emptied is kept
    // for the next encode (counted as scratch).
    arena spare;
    // The codes come out to the host store through page-locked memory (grown, never shrunk;
    // pageable where the driver gives none): a prefill's eviction copies out megabytes each batch.
    void *   stage;
    size_t   stage_bytes;
    int      stage_pinned;
    int64_t  queued;      // sync: copies queued and not waited for yet
    uint64_t generation;  // bumped by every change hook_attend's work depends on (hook_generation)
    int      graphs_off;  // KVGGUF_CUDA_GRAPHS=0: hook_generation says 0
    // hook_attend's pass: its parts, and the runs' and the cells' arguments they point at
    kvg_cuda_part *        parts;
    kvg_cuda_attend_args * runs;
    kvg_cuda_cells_args *  cells;
    int64_t                cap_parts;
};

static int64_t n_lists(const kvg_cuda_store * d) {
    return (int64_t) d->host->p.n_layer * 2;
}

// Rows a piece of a block's per-row part covers: a kivi K group's G; 1 for the others.
static int64_t row_unit(const kvg_store * s, int32_t kind, int32_t codec) {
    const int kivi = codec >= KVG_CODEC_KIVI2 && codec <= KVG_CODEC_KIVI8;
    return kivi && kind == KVG_KIND_K && s->p.codec.group_size > 0 ? s->p.codec.group_size : 1;
}

// Bytes of a block's per-row part per unit of rows (row_unit) and of its codes per row, for
// codecs whose blocks are those two parts, each unit after unit (f16: no per-row part; rotq: the
// f16 norms; kivi: the f16 mins and scales of the groups). 0 for the others.
static int row_layout(const kvg_store * s, int32_t kind, int32_t codec, size_t * head_b, size_t * code_b) {
    const int64_t H = s->p.n_head_kv, D = kind == KVG_KIND_K ? s->p.head_dim_k : s->p.head_dim_v, C = H * D;
    const int64_t G = s->p.codec.group_size, unit = row_unit(s, kind, codec);
    const int     kivi_bits = codec == KVG_CODEC_KIVI8 ? 8 : codec - KVG_CODEC_KIVI2 + 2;
    *head_b = *code_b = 0;
    if (codec == KVG_CODEC_F16) {
        *code_b = (size_t) (2 * C);
    } else if (codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4 && (D * (codec - KVG_CODEC_ROTQ1 + 1)) % 8 == 0) {
        *head_b = (size_t) (2 * H);
        *code_b = (size_t) (C * (codec - KVG_CODEC_ROTQ1 + 1) / 8);
    } else if (codec >= KVG_CODEC_KIVI2 && codec <= KVG_CODEC_KIVI8 && G > 0 && (C * kivi_bits) % 8 == 0) {
        *head_b = (size_t) (kind == KVG_KIND_K ? 4 * C : 4 * ((C + G - 1) / G));  // a group of G rows; a row's groups
        *code_b = (size_t) (C * kivi_bits / 8);
    } else {
        return 0;
    }
    // the layout this assumes, as the library sizes it (a block of 2 units is 2 units' parts)
    size_t                 two = 0;
    const kvg_codec_params p   = kvg_store_list_params(s, 0, codec, NULL);
    if (kvg_encoded_size(codec, kind, 2 * unit, H, D, &p, &two) != KVG_OK ||
        two != 2 * (*head_b + (size_t) unit * *code_b)) {
        *head_b = *code_b = 0;
        return 0;
    }
    return 1;
}

// Bytes of the per-row part of n rows from a unit's start (a last part-filled unit whole).
static size_t head_bytes(const segment * g, int64_t n) {
    return (size_t) ((n + g->unit - 1) / g->unit) * g->head_b;
}

// Where the codes start in g's buffer.
static size_t codes_at(const segment * g) {
    return head_bytes(g, g->cap);
}

static size_t seg_bytes(const segment * g) {
    return codes_at(g) + (size_t) g->cap * g->code_b;
}

int kvg_cuda_store_init(kvg_cuda_ctx * ctx, const kvg_store * host, kvg_cuda_store ** out) {
    kvg_clear_error();
    if (!ctx || !host || !out) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_init: ctx, host and out must not be NULL");
    }
    *out                = NULL;
    kvg_cuda_store * d  = (kvg_cuda_store *) calloc(1, sizeof(kvg_cuda_store));
    const int64_t    nl = (int64_t) host->p.n_layer;
    if (d) {
        d->lists = (dev_list *) calloc((size_t) nl * 2, sizeof(dev_list));
        d->on    = (int32_t *) malloc((size_t) nl * sizeof(int32_t));
        d->seen  = (uint64_t *) calloc((size_t) nl * 2, sizeof(uint64_t));
    }
    if (!d || !d->lists || !d->on || !d->seen) {
        if (d) {
            free(d->lists);
            free(d->on);
            free(d->seen);
        }
        free(d);
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_init: the index");
    }
    for (int64_t il = 0; il < nl; ++il) {
        d->on[il] = 1;
    }
    d->ctx              = ctx;
    d->host             = host;
    d->generation       = 1;
    const char * graphs = getenv("KVGGUF_CUDA_GRAPHS");
    d->graphs_off       = graphs != NULL && strcmp(graphs, "0") == 0;
    *out                = d;
    return KVG_OK;
}

static void free_list(kvg_cuda_store * d, dev_list * l) {
    for (int64_t i = 0; i < l->n; ++i) {
        kvg_cuda_free(d->ctx, l->s[i].data);
        free(l->s[i].blocks);
    }
    free(l->s);
    l->s = NULL;
    l->n = 0;
}

// The stage's memory, page-locked or (where the driver gave none) pageable, freed as it was taken.
static void free_stage(kvg_cuda_store * d) {
    if (d->stage_pinned) {
        kvg_cuda_host_free(d->ctx, d->stage);
    } else {
        free(d->stage);
    }
    d->stage       = NULL;
    d->stage_bytes = 0;
}

// Called once the blocks in the arenas are taken (or gone): the largest arena becomes the spare.
static void free_pending(kvg_cuda_store * d) {
    for (int64_t i = 0; i < d->n_arenas; ++i) {
        arena a = d->arenas[i];
        if (a.n_bytes > d->spare.n_bytes) {
            const arena t = d->spare;
            d->spare      = a;
            a             = t;
        }
        kvg_cuda_free(d->ctx, a.data);
    }
    d->n_arenas = 0;
    d->n_pend   = 0;
}

void kvg_cuda_store_free(kvg_cuda_store * d) {
    if (!d) {
        return;
    }
    for (int64_t li = 0; li < n_lists(d); ++li) {
        free_list(d, &d->lists[li]);
    }
    free_pending(d);
    kvg_cuda_free(d->ctx, d->spare.data);
    free_stage(d);
    free(d->pend);
    free(d->arenas);
    free(d->parts);
    free(d->runs);
    free(d->cells);
    kvg_cuda_free(d->ctx, d->q_dev);
    kvg_cuda_ctx_free(d->ctx);
    free(d->lists);
    free(d->on);
    free(d->seen);
    free(d);
}

int kvg_cuda_store_set_layer(kvg_cuda_store * d, int32_t il, int32_t on) {
    kvg_clear_error();
    if (!d || il < 0 || il >= d->host->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_set_layer: no copy, or layer %d outside [0, %d)", (int) il,
                        d ? (int) d->host->p.n_layer : 0);
    }
    if (d->on[il] != (on != 0)) {
        d->seen[il * 2] = d->seen[il * 2 + 1] = 0;  // the next sync adds or frees this layer's lists
        d->generation++;
    }
    d->on[il] = on != 0;
    return KVG_OK;
}

// ---- sync ----------------------------------------------------------------------------------

// The unclaimed segment of l holding block `id`, and the block's index in it.
static segment * find_segment(dev_list * l, uint64_t id, int64_t * at) {
    for (int64_t i = 0; i < l->n; ++i) {
        segment * g = &l->s[i];
        for (int64_t b = 0; !g->claimed && b < g->n_blocks; ++b) {
            if (g->blocks[b].id == id) {
                *at = b;
                return g;
            }
        }
    }
    return NULL;
}

// Queues the copy of host block hb into g's buffer at buffer row `at` (a unit's start): from the
// device where kvg_cuda_store_encode coded it, else from the host.
static int put_block(kvg_cuda_store * d, segment * g, const kvg_block * hb, int64_t at) {
    const size_t    head = head_bytes(g, hb->n_rows), codes = (size_t) hb->n_rows * g->code_b;
    uint8_t * const dst     = (uint8_t *) g->data;
    uint8_t *const dst_head = dst + head_bytes(g, at), *const dst_codes = dst + codes_at(g) + (size_t) at * g->code_b;
    d->queued += 2;
    for (int64_t i = 0; i < d->n_pend; ++i) {
        if (d->pend[i].id == hb->id && d->pend[i].n_bytes == head + codes) {
            const uint8_t * src = (const uint8_t *) d->pend[i].data;
            int             rc  = kvg_cuda_copy_queue(d->ctx, dst_head, src, head, 0);
            return rc == KVG_OK ? kvg_cuda_copy_queue(d->ctx, dst_codes, src + head, codes, 0) : rc;
        }
    }
    int rc = kvg_cuda_copy_queue(d->ctx, dst_head, hb->data, head, 1);
    return rc == KVG_OK ? kvg_cuda_copy_queue(d->ctx, dst_codes, hb->data + head, codes, 1) : rc;
}

// Rows for a run of n: a quarter more, at least 256, whole units, even (rotq's codes then start
// 4-byte aligned).
static int64_t grown(int64_t n, int64_t unit) {
    const int64_t c = n + (n / 4 > 256 ? n / 4 : 256), step = 2 * unit;
    return (c + step - 1) / step * step;
}

// Whether block i of r continues the run of block i - 1: the same codec, and the rows before it
// whole units (a kivi K group's part starts at a group's row).
static int continues_run(const kvg_store * s, int32_t kind, const kvg_rows * r, int64_t i) {
    const kvg_block * prev = &r->blocks[i - 1];
    return r->blocks[i].codec == prev->codec && prev->n_rows % row_unit(s, kind, prev->codec) == 0;
}

// The segment of host blocks [i0, i1) of r (one codec) into *g: the old segment that holds the
// run's first block taken over where the run only dropped blocks at its head and added blocks at
// its tail, else a new buffer with every block copied in. Only fresh memory and rows past the old
// segment's live ones are written, so a failure leaves the old list readable.
static int stage_run(kvg_cuda_store * d, int32_t kind, const kvg_rows * r, int64_t i0, int64_t i1, dev_list * old,
                     segment * g) {
    const kvg_block * hb = &r->blocks[i0];
    memset(g, 0, sizeof(*g));
    g->codec    = hb->codec;
    g->row0     = hb->row0;
    g->n_blocks = i1 - i0;
    g->blocks   = (seg_block *) malloc((size_t) g->n_blocks * sizeof(seg_block));
    if (!g->blocks) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_sync: a segment's index");
    }
    for (int64_t i = i0; i < i1; ++i) {
        g->blocks[i - i0] = (seg_block) { r->blocks[i].id, r->blocks[i].n_rows };
        g->n_rows += r->blocks[i].n_rows;
    }
    g->unit = row_unit(d->host, kind, g->codec);
    if (!row_layout(d->host, kind, g->codec, &g->head_b, &g->code_b)) {
        return KVG_OK;  // kept without data: attend leaves these rows out
    }
    // an old segment this run continues: its blocks from `at` on are the run's first ones
    int64_t   at = 0, kept = 0, kept_rows = 0, dropped_rows = 0;
    segment * o = find_segment(old, hb->id, &at);
    if (o && o->codec == g->codec && o->data) {
        kept = o->n_blocks - at;
        for (int64_t b = 0; o && b < o->n_blocks; ++b) {
            if (b < at) {
                dropped_rows += o->blocks[b].n_rows;
            } else if (b - at >= g->n_blocks || o->blocks[b].id != g->blocks[b - at].id) {
                o = NULL;  // a block in the middle or at the end changed: rebuild
            } else {
                kept_rows += o->blocks[b].n_rows;
            }
        }
    } else {
        o = NULL;
    }
    if (!o) {
        kept = kept_rows = 0;
    }
    int     rc    = KVG_OK;
    int64_t first = 0;  // the run's first block not in the buffer yet
    if (o) {
        o->claimed = 1;
        g->data    = o->data;
        g->cap     = o->cap;
        g->skip    = o->skip + dropped_rows;
        first      = kept;
        // grown or compacted into a new buffer when the rows do not fit, or when most of it
        // is rows that left the head
        if (g->skip + g->n_rows > g->cap || g->skip > g->n_rows + 256) {
            segment n  = *g;  // the new buffer's layout
            n.cap      = grown(g->n_rows, g->unit);
            void * buf = NULL;
            rc         = kvg_cuda_malloc(d->ctx, seg_bytes(&n), &buf);
            if (rc == KVG_OK) {
                rc = kvg_cuda_copy_queue(d->ctx, buf, (const uint8_t *) o->data + head_bytes(g, g->skip),
                                         head_bytes(g, kept_rows), 0);
            }
            d->queued += 2;
            if (rc == KVG_OK) {
                rc = kvg_cuda_copy_queue(d->ctx, (uint8_t *) buf + codes_at(&n),
                                         (const uint8_t *) o->data + codes_at(o) + (size_t) g->skip * g->code_b,
                                         (size_t) kept_rows * g->code_b, 0);
            }
            if (rc != KVG_OK) {
                kvg_cuda_free(d->ctx, buf);
                return rc;
            }
            g->old_data = o->data;
            g->data     = buf;
            g->cap      = n.cap;
            g->skip     = 0;
            g->fresh    = 1;
        }
    } else {
        g->cap = grown(g->n_rows, g->unit);
        rc     = kvg_cuda_malloc(d->ctx, seg_bytes(g), &g->data);
        if (rc != KVG_OK) {
            g->data = NULL;
            return rc;
        }
        g->fresh = 1;
    }
    int64_t row = g->skip + kept_rows;
    for (int64_t i = i0 + first; i < i1 && rc == KVG_OK; ++i) {
        rc = put_block(d, g, &r->blocks[i], row);
        row += r->blocks[i].n_rows;
    }
    return rc;
}

static void unstage(kvg_cuda_store * d, dev_list * l) {
    for (int64_t i = 0; i < l->n; ++i) {
        if (l->s[i].fresh) {
            kvg_cuda_free(d->ctx, l->s[i].data);
        }
        free(l->s[i].blocks);
    }
    free(l->s);
}

int kvg_cuda_store_sync(kvg_cuda_store * d) {
    kvg_clear_error();
    if (!d) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_sync: NULL copy");
    }
    const int64_t nl     = n_lists(d);
    dev_list *    staged = (dev_list *) calloc((size_t) nl, sizeof(dev_list));
    if (!staged) {
        d->stale = 1;
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_sync: the index");
    }
    for (int64_t li = 0; li < nl; ++li) {
        for (int64_t i = 0; i < d->lists[li].n; ++i) {
            d->lists[li].s[i].claimed = 0;
        }
    }
    int rc = KVG_OK;
    for (int64_t li = 0; li < nl && rc == KVG_OK; ++li) {
        const kvg_rows * r = &d->host->rows[li];
        if (!d->stale && d->seen[li] == r->version + 1) {
            staged[li].kept = 1;  // held as the host has it: decode syncs before every token
            continue;
        }
        if (!d->on[li / 2] || !d->host->enabled[li / 2] || r->n_blocks == 0) {
            continue;
        }
        const int32_t kind   = (int32_t) (li % 2);
        int64_t       n_runs = 0;
        for (int64_t i = 0; i < r->n_blocks; ++i) {
            n_runs += i == 0 || !continues_run(d->host, kind, r, i);
        }
        staged[li].s = (segment *) calloc((size_t) n_runs, sizeof(segment));
        if (!staged[li].s) {
            rc = kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_sync: the index of list %lld", (long long) li);
            break;
        }
        for (int64_t i0 = 0, i1; i0 < r->n_blocks && rc == KVG_OK; i0 = i1) {
            for (i1 = i0 + 1; i1 < r->n_blocks && continues_run(d->host, kind, r, i1); ++i1) {
            }
            rc = stage_run(d, kind, r, i0, i1, &d->lists[li], &staged[li].s[staged[li].n++]);
        }
    }
    if (rc == KVG_OK && d->queued) {
        rc = kvg_cuda_sync(d->ctx);  // the copies queued above, all at once
    }
    d->queued = 0;
    if (rc != KVG_OK) {
        for (int64_t li = 0; li < nl; ++li) {
            unstage(d, &staged[li]);
        }
        free(staged);
        d->stale = 1;
        d->generation++;  // attend now leaves the store's rows out
        return rc;
    }
    // Commit: free the buffers no segment took over and those grown segments left.
    d->bytes = 0;
    for (int64_t li = 0; li < nl; ++li) {
        dev_list * l = &d->lists[li];
        d->seen[li]  = d->host->rows[li].version + 1;
        d->generation += !staged[li].kept;  // looked at again: its segments may have moved
        if (staged[li].kept) {
            for (int64_t i = 0; i < l->n; ++i) {
                d->bytes += seg_bytes(&l->s[i]);
            }
            continue;
        }
        for (int64_t i = 0; i < l->n; ++i) {
            if (!l->s[i].claimed) {
                kvg_cuda_free(d->ctx, l->s[i].data);
            }
            free(l->s[i].blocks);
        }
        free(l->s);
        for (int64_t i = 0; i < staged[li].n; ++i) {
            segment * g = &staged[li].s[i];
            kvg_cuda_free(d->ctx, g->old_data);
            g->old_data = NULL;
            g->fresh    = 0;
            d->bytes += seg_bytes(g);
        }
        *l = staged[li];
    }
    free(staged);
    free_pending(d);  // taken by the segments above, or their blocks are gone
    d->stale = 0;
    return KVG_OK;
}

// Room for `more` pending blocks and one more arena.
static int reserve_pending(kvg_cuda_store * d, int64_t more) {
    if (d->n_pend + more > d->cap_pend) {
        int64_t cap  = d->cap_pend ? 2 * d->cap_pend : 64;
        cap          = cap < d->n_pend + more ? d->n_pend + more : cap;
        pending * np = (pending *) realloc(d->pend, (size_t) cap * sizeof(pending));
        if (!np) {
            return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_encode: the pending list");
        }
        d->pend     = np;
        d->cap_pend = cap;
    }
    if (d->n_arenas == d->cap_arenas) {
        const int64_t cap = d->cap_arenas ? 2 * d->cap_arenas : 8;
        arena *       na  = (arena *) realloc(d->arenas, (size_t) cap * sizeof(arena));
        if (!na) {
            return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_encode: the arena list");
        }
        d->arenas     = na;
        d->cap_arenas = cap;
    }
    return KVG_OK;
}

// A device arena of at least `need` bytes: the spare where it is large enough, else a new one
// with a quarter to spare (the spare, too small, freed first).
static int take_arena(kvg_cuda_store * d, size_t need, arena * out) {
    if (d->spare.data && d->spare.n_bytes >= need) {
        *out     = d->spare;
        d->spare = (arena) { NULL, 0 };
        return KVG_OK;
    }
    kvg_cuda_free(d->ctx, d->spare.data);
    d->spare     = (arena) { NULL, 0 };
    out->n_bytes = need + need / 4;
    const int rc = kvg_cuda_malloc(d->ctx, out->n_bytes, &out->data);
    if (rc != KVG_OK) {
        out->n_bytes = 0;
    }
    return rc;
}

// Host room for `need` bytes of codes: the stage, grown by a quarter more when too small.
static int stage_room(kvg_cuda_store * d, size_t need) {
    if (d->stage && d->stage_bytes >= need) {
        return KVG_OK;
    }
    free_stage(d);
    d->stage_bytes  = need + need / 4;
    d->stage_pinned = kvg_cuda_host_alloc(d->ctx, d->stage_bytes, &d->stage) == KVG_OK;
    if (!d->stage_pinned) {
        kvg_clear_error();
        d->stage = malloc(d->stage_bytes);
    }
    if (!d->stage) {
        d->stage_bytes = 0;
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_encode_many: %zu bytes on the host", need);
    }
    return KVG_OK;
}

int kvg_cuda_store_encode_many(kvg_cuda_store * d, const kvg_cuda_store_item * items, int64_t n) {
    kvg_clear_error();
    if (!d || n < 0 || (n > 0 && !items)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_encode_many: no copy or items, or n < 0");
    }
    if (n == 0) {
        return KVG_OK;
    }
    kvg_store * const     host = (kvg_store *) d->host;  // the copy reads it; this call appends to it
    const int64_t         H    = host->p.n_head_kv;
    kvg_cuda_encode_job * jobs = (kvg_cuda_encode_job *) calloc((size_t) n, sizeof(kvg_cuda_encode_job));
    size_t *              off  = (size_t *) malloc((size_t) (n + 1) * sizeof(size_t));
    int rc = jobs && off ? reserve_pending(d, n)
                         : kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_encode_many: %lld jobs", (long long) n);
    if (off) {
        off[0] = 0;
    }
    // each item's block at a 256-byte boundary of one arena
    for (int64_t i = 0; i < n && rc == KVG_OK; ++i) {
        const kvg_cuda_store_item * it = &items[i];
        if (it->il < 0 || it->il >= host->p.n_layer || (it->kind != KVG_KIND_K && it->kind != KVG_KIND_V) ||
            it->n_rows <= 0) {
            rc = kvg_fail(KVG_ERR_INVALID_ARG,
                          "kvg_cuda_store_encode: no copy, or layer %d / kind %d / %lld rows out of range",
                          (int) it->il, (int) it->kind, (long long) it->n_rows);
            break;
        }
        const int64_t         D = it->kind == KVG_KIND_K ? host->p.head_dim_k : host->p.head_dim_v;
        kvg_cuda_encode_job * j = &jobs[i];
        j->type                 = it->codec;
        j->kind                 = it->kind;
        j->src_dev              = it->src_dev;
        j->src_type             = it->src_type;
        j->src_row_stride       = it->row_stride;
        j->src_col_stride       = it->col_stride;
        j->n_tokens             = it->n_rows;
        j->n_heads              = H;
        j->head_dim             = D;
        j->params               = kvg_store_list_params(host, (int64_t) it->il * 2 + it->kind, it->codec, NULL);
        rc                      = kvg_encoded_size(it->codec, it->kind, it->n_rows, H, D, &j->params, &j->dst_bytes);
        off[i + 1]              = off[i] + ((j->dst_bytes + 255) / 256) * 256;
    }
    arena     ar    = { NULL, 0 };
    uint8_t * bytes = NULL;
    if (rc == KVG_OK) {
        const size_t need = off[n] ? off[n] : 1;
        rc                = stage_room(d, need);
        rc                = rc == KVG_OK ? take_arena(d, need, &ar) : rc;
        bytes             = (uint8_t *) d->stage;
    }
    void * const buf    = ar.data;
    int64_t      failed = -1;
    if (rc == KVG_OK) {
        for (int64_t i = 0; i < n; ++i) {
            jobs[i].dst_dev = (uint8_t *) buf + off[i];
        }
        rc = kvg_cuda_encode_batch(d->ctx, jobs, n, &failed);
    }
    if (rc == KVG_OK) {
        rc = kvg_cuda_copy_out(d->ctx, bytes, buf, off[n]);  // the host store keeps the codes, not the rows
    }
    int64_t appended = 0;  // items whose blocks the host store took
    while (rc == KVG_OK && appended < n) {
        const kvg_cuda_store_item * it = &items[appended];
        rc = kvg_store_append_encoded(host, it->il, it->kind, it->tier, it->codec, it->n_rows, bytes + off[appended],
                                      jobs[appended].dst_bytes);
        if (rc == KVG_OK) {
            const kvg_rows * r = &host->rows[(int64_t) it->il * 2 + it->kind];
            d->pend[d->n_pend++] =
                (pending) { r->blocks[r->n_blocks - 1].id, (uint8_t *) buf + off[appended], jobs[appended].dst_bytes };
            appended++;
        }
    }
    if (appended > 0) {
        d->arenas[d->n_arenas++] = ar;  // the next sync takes the blocks from it
    } else if (ar.data) {
        d->spare = ar;  // take_arena left no spare
    }
    free(jobs);
    free(off);
    return rc;
}

int kvg_cuda_store_encode(kvg_cuda_store * d, int32_t il, int32_t kind, int32_t tier, int32_t codec,
                          const void * src_dev, int src_type, int64_t row_stride, int64_t col_stride, int64_t n_rows) {
    const kvg_cuda_store_item it = { il, kind, tier, codec, src_dev, src_type, row_stride, col_stride, n_rows };
    return kvg_cuda_store_encode_many(d, &it, 1);
}

int kvg_cuda_store_bytes(const kvg_cuda_store * d, uint64_t * out_blocks, uint64_t * out_scratch) {
    kvg_clear_error();
    if (!d) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_bytes: NULL copy");
    }
    if (out_blocks) {
        *out_blocks = d->bytes;
        for (int64_t i = 0; i < d->n_arenas; ++i) {
            *out_blocks += d->arenas[i].n_bytes;
        }
    }
    if (out_scratch) {
        *out_scratch = d->q_floats * sizeof(float) + d->spare.n_bytes + kvg_cuda_ctx_scratch_bytes(d->ctx);
    }
    return KVG_OK;
}

int kvg_cuda_store_calls(const kvg_cuda_store * d, uint64_t * out_attend, uint64_t * out_finish) {
    kvg_clear_error();
    if (!d) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_calls: NULL copy");
    }
    if (out_attend) {
        *out_attend = d->calls[0];
    }
    if (out_finish) {
        *out_finish = d->calls[1];
    }
    return KVG_OK;
}

int32_t kvg_cuda_store_hook_supports(void * user, int32_t il, int32_t device) {
    const kvg_cuda_store * d = (const kvg_cuda_store *) user;
    if (!d || il < 0 || il >= d->host->p.n_layer || !d->on[il] || !d->host->enabled[il]) {
        return 0;
    }
    return device < 0 || device == kvg_cuda_ctx_device(d->ctx);
}

// ---- attention -----------------------------------------------------------------------------

// The buffer row of the store's row `row` in segment g.
static int64_t buf_row(const segment * g, int64_t row) {
    return g->skip + (row - g->row0);
}

// The arguments of the cells kernel that every part of a hook's pass shares: the gathered
// queries, the shape, the scores' scale and cap, the state.
static kvg_cuda_cells_args cells_args(const kvg_cuda_store * d, const kvg_cuda_layer_args * a) {
    kvg_cuda_cells_args c;
    memset(&c, 0, sizeof(c));
    c.q_dev      = d->q_dev;
    c.n_tokens   = a->n_tokens;
    c.n_head     = a->n_head;
    c.n_head_kv  = a->n_head_kv;
    c.head_dim_k = a->head_dim_k;
    c.head_dim_v = a->head_dim_v;
    c.scale      = a->scale;
    c.softcap    = a->softcap;
    c.m_dev      = a->m_dev;
    c.l_dev      = a->l_dev;
    c.acc_dev    = a->acc_dev;
    return c;
}

// Part i of the pass: rows [r0, r1) of an f16 K segment and an f16 V segment (the codec's rows as
// they are: [token][head][i]), read as llama.cpp's cells with no mask.
static void f16_run_part(kvg_cuda_store * d, const kvg_cuda_layer_args * a, const segment * kg, const segment * vg,
                         int64_t r0, int64_t r1, int64_t i) {
    const int64_t         hk = a->n_head_kv;
    kvg_cuda_cells_args * c  = &d->cells[i];
    *c                       = cells_args(d, a);
    c->k_dev                 = (const uint8_t *) kg->data + (size_t) buf_row(kg, r0) * kg->code_b;
    c->k_type                = KVG_CELLS_F16;
    c->k_nb[0]               = 2;
    c->k_nb[1]               = (size_t) a->head_dim_k * 2;
    c->k_nb[2]               = (size_t) (hk * a->head_dim_k) * 2;
    c->v_dev                 = (const uint8_t *) vg->data + (size_t) buf_row(vg, r0) * vg->code_b;
    c->v_type                = KVG_CELLS_F16;
    c->v_nb[0]               = 2;
    c->v_nb[1]               = (size_t) a->head_dim_v * 2;
    c->v_nb[2]               = (size_t) (hk * a->head_dim_v) * 2;
    c->c1                    = r1 - r0;
    d->parts[i]              = (kvg_cuda_part) { NULL, c };
}

// Part i of the pass: rows [r0, r1) of a coded K segment and V segment, each buffer read as one
// block of cap rows.
static void coded_run_part(kvg_cuda_store * d, const kvg_cuda_layer_args * a, const segment * kg, const segment * vg,
                           int64_t r0, int64_t r1, int64_t i) {
    kvg_cuda_attend_args * x = &d->runs[i];
    memset(x, 0, sizeof(*x));
    x->k          = (kvg_cuda_block) { kg->codec, kg->data, seg_bytes(kg), kg->cap };
    x->v          = (kvg_cuda_block) { vg->codec, vg->data, seg_bytes(vg), vg->cap };
    x->k_row0     = buf_row(kg, r0);
    x->v_row0     = buf_row(vg, r0);
    x->n_rows     = r1 - r0;
    x->n_head_kv  = a->n_head_kv;
    x->head_dim_k = a->head_dim_k;
    x->head_dim_v = a->head_dim_v;
    x->seed       = d->host->p.codec.seed;
    x->group_size = d->host->p.codec.group_size;
    x->q_dev      = d->q_dev;
    x->n_tokens   = a->n_tokens;
    x->n_head     = a->n_head;
    x->scale      = a->scale;
    x->softcap    = a->softcap;
    x->m_dev      = a->m_dev;
    x->l_dev      = a->l_dev;
    x->acc_dev    = a->acc_dev;
    d->parts[i]   = (kvg_cuda_part) { x, NULL };
}

// Room for n parts (each with its run's and its cells' arguments).
static int reserve_parts(kvg_cuda_store * d, int64_t n) {
    if (n <= d->cap_parts) {
        return KVG_OK;
    }
    kvg_cuda_part * parts       = (kvg_cuda_part *) realloc(d->parts, sizeof(*parts) * (size_t) n);
    d->parts                    = parts ? parts : d->parts;
    kvg_cuda_attend_args * runs = parts ? (kvg_cuda_attend_args *) realloc(d->runs, sizeof(*runs) * (size_t) n) : NULL;
    d->runs                     = runs ? runs : d->runs;
    kvg_cuda_cells_args * cells = runs ? (kvg_cuda_cells_args *) realloc(d->cells, sizeof(*cells) * (size_t) n) : NULL;
    d->cells                    = cells ? cells : d->cells;
    if (!cells) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_hook_attend: no memory for %lld parts", (long long) n);
    }
    d->cap_parts = n;
    return KVG_OK;
}

// Layer il's rows [0, n_cold) as parts [0, *n_parts) of the pass: one per run where a K segment
// and a V segment overlap (cells for f16 on both, the sinks kept exact; a coded run for any other
// mix). A run that cannot be read (a codec without data here) is left out, and *cold says why.
// Room is made for one part more (llama.cpp's cells).
static int store_parts(kvg_cuda_store * d, const kvg_cuda_layer_args * a, int64_t * n_parts, int * cold) {
    *n_parts = 0;
    *cold    = KVG_OK;
    if (a->n_cold == 0) {
        return reserve_parts(d, 1);
    }
    if (d->stale) {
        *cold = kvg_fail(KVG_ERR_INVALID_ARG, "the device copy is stale: its last sync failed");
        return reserve_parts(d, 1);
    }
    const dev_list * kl = &d->lists[a->il * 2 + KVG_KIND_K];
    const dev_list * vl = &d->lists[a->il * 2 + KVG_KIND_V];
    const int64_t    nk = kl->n ? kl->s[kl->n - 1].row0 + kl->s[kl->n - 1].n_rows : 0;
    const int64_t    nv = vl->n ? vl->s[vl->n - 1].row0 + vl->s[vl->n - 1].n_rows : 0;
    if (a->n_cold > nk || a->n_cold > nv) {
        *cold = kvg_fail(KVG_ERR_INVALID_ARG, "layer %d: %lld cold rows asked for, the device copy holds %lld",
                         (int) a->il, (long long) a->n_cold, (long long) (nk < nv ? nk : nv));
        return reserve_parts(d, 1);
    }
    const int rc = reserve_parts(d, kl->n + vl->n + 1);  // runs end where either list's segment ends
    if (rc != KVG_OK) {
        return rc;
    }
    int64_t sk = 0, sv = 0;
    for (int64_t row = 0; row < a->n_cold;) {
        const segment * kg = &kl->s[sk];
        const segment * vg = &vl->s[sv];
        const int64_t   ke = kg->row0 + kg->n_rows, ve = vg->row0 + vg->n_rows;
        int64_t         e = ke < ve ? ke : ve;
        e                 = e < a->n_cold ? e : a->n_cold;
        if (!kg->data || !vg->data) {
            if (*cold == KVG_OK) {
                *cold = kvg_fail(
                    KVG_ERR_UNSUPPORTED,
                    "layer %d: rows of %s K / %s V, which the GPU does not attend over (f16, kivi2-8, rotq1-4)",
                    (int) a->il, kvg_codec_name(kg->codec), kvg_codec_name(vg->codec));
            }
        } else if (kg->codec == KVG_CODEC_F16 && vg->codec == KVG_CODEC_F16) {
            f16_run_part(d, a, kg, vg, row, e, (*n_parts)++);
        } else {
            coded_run_part(d, a, kg, vg, row, e, (*n_parts)++);
        }
        row = e;
        sk += e == ke;
        sv += e == ve;
    }
    return KVG_OK;
}

// One pass over parts [0, n) of d's into the fresh state of a's queries, which it gathers into
// d->q_dev (rounded to f16 as the CPU's fused path rounds them: llama.cpp's f16 attention takes
// f16 queries).
static int pass(kvg_cuda_store * d, const kvg_cuda_layer_args * a, const kvg_cuda_part * parts, int64_t n) {
    kvg_cuda_pass_args p;
    memset(&p, 0, sizeof(p));
    if (n > 0) {
        p.q_src = a->q_dev;
        memcpy(p.q_nb, a->q_nb, sizeof(p.q_nb));
        p.q_dst = d->q_dev;
    }
    p.parts      = parts;
    p.n_parts    = (int32_t) n;
    p.n_q        = (int64_t) a->n_tokens * a->n_head;
    p.head_dim_v = a->head_dim_v;
    p.m_dev      = a->m_dev;
    p.l_dev      = a->l_dev;
    p.acc_dev    = a->acc_dev;
    p.fresh      = 1;
    return kvg_cuda_attend_pass(d->ctx, &p);
}

int32_t kvg_cuda_store_hook_attend(void * user, const kvg_cuda_layer_args * a, int32_t device, void * stream) {
    kvg_clear_error();
    kvg_cuda_store * d = (kvg_cuda_store *) user;
    if (!d || !a || a->il < 0 || a->il >= d->host->p.n_layer || a->n_tokens <= 0 || a->n_head <= 0 ||
        a->n_head_kv != d->host->p.n_head_kv || a->head_dim_k != d->host->p.head_dim_k ||
        a->head_dim_v != d->host->p.head_dim_v || a->n_cold < 0 || a->n_kv < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_hook_attend: arguments that do not fit the store");
    }
    if (device != kvg_cuda_ctx_device(d->ctx)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_hook_attend: device %d, the copy is on %d", (int) device,
                        kvg_cuda_ctx_device(d->ctx));
    }
    d->calls[0]++;
    const size_t nq   = (size_t) a->n_tokens * (size_t) a->n_head * (size_t) a->head_dim_k;
    void * const prev = kvg_cuda_ctx_set_stream(d->ctx, stream);
    int          rc   = KVG_OK;
    if (nq > d->q_floats && kvg_cuda_ctx_capturing(d->ctx)) {
        // a free waits, which would end llama.cpp's capture; the same graph ran uncaptured first
        rc = kvg_fail(KVG_ERR_NO_MEMORY, "the queries' scratch would have to grow inside a CUDA graph capture");
    } else if (nq > d->q_floats) {
        void * q = NULL;
        rc       = kvg_cuda_malloc(d->ctx, nq * sizeof(float), &q);
        if (rc == KVG_OK) {
            kvg_cuda_free(d->ctx, d->q_dev);  // waits for the device: earlier ops may read it
            d->q_dev    = (float *) q;
            d->q_floats = nq;
            d->generation++;  // a captured graph holds the old address
        }
    }
    int64_t n    = 0;
    int     cold = KVG_OK;
    if (rc == KVG_OK) {
        rc = store_parts(d, a, &n, &cold);
    }
    if (rc == KVG_OK && a->n_kv > 0) {  // llama.cpp's own cells, under its mask
        kvg_cuda_cells_args * c = &d->cells[n];
        *c                      = cells_args(d, a);
        c->k_dev                = a->k_dev;
        c->k_type               = a->k_type;
        memcpy(c->k_nb, a->k_nb, sizeof(c->k_nb));
        c->v_dev  = a->v_dev;
        c->v_type = a->v_type;
        memcpy(c->v_nb, a->v_nb, sizeof(c->v_nb));
        c->c1       = a->n_kv;
        c->mask_dev = a->mask_dev;
        c->mask_f16 = a->mask_f16;
        c->mask_nb1 = a->mask_nb1;
        d->parts[n] = (kvg_cuda_part) { NULL, c };
    }
    const int64_t n_store = n, n_all = n + (a->n_kv > 0);
    if (rc == KVG_OK) {
        rc = pass(d, a, d->parts, n_all);
        if (rc != KVG_OK && n_store > 0) {  // the store's rows left out, the cells attended all the same
            cold = cold == KVG_OK ? rc : cold;
            rc   = pass(d, a, d->parts + n_store, n_all - n_store);
        }
    }
    if (rc != KVG_OK) {
        pass(d, a, NULL, 0);  // the state empty: whatever failed, llama.cpp's merge reads a state
    }
    if (cold != KVG_OK) {
        atomic_fetch_add_explicit(&((kvg_store *) d->host)->read_failures[KVG_READ_ATTEND], 1, memory_order_relaxed);
    }
    kvg_cuda_ctx_set_stream(d->ctx, prev);
    return rc != KVG_OK ? rc : cold;
}

uint64_t kvg_cuda_store_hook_generation(void * user) {
    const kvg_cuda_store * d = (const kvg_cuda_store *) user;
    return !d || d->graphs_off ? 0 : d->generation + kvg_cuda_ctx_scratch_grown(d->ctx);
}

int32_t kvg_cuda_store_hook_finish(void * user, const kvg_cuda_finish_args * a, int32_t device, void * stream) {
    kvg_clear_error();
    kvg_cuda_store * d = (kvg_cuda_store *) user;
    if (!d || device != kvg_cuda_ctx_device(d->ctx)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_hook_finish: no copy, or device %d is not the copy's",
                        (int) device);
    }
    d->calls[1]++;
    void * const prev = kvg_cuda_ctx_set_stream(d->ctx, stream);
    const int    rc   = kvg_cuda_attend_finish(d->ctx, a);
    kvg_cuda_ctx_set_stream(d->ctx, prev);
    return rc;
}
