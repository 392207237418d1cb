// kvg_cuda_store.c: a store's coded blocks in device memory, and the hooks llama.cpp's CUDA op
// calls (kvg_cuda.h, "A store's coded blocks on the device").
//
// The host store stays the store (store.c): Python changes it between llama_decode calls, then
// syncs this copy. A block's id changes whenever its bytes do, so a sync copies in only what the
// copy lacks and frees what the store dropped. C on the host side only: the kernels are the
// kvg_cuda_* calls, queued on llama.cpp's stream during a hook.
#include "kvg_cuda.h"
#include "kvg_cuda_internal.h"
#include "kvg_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct dev_block {
    uint64_t id;  // the host block's (kvg_block.id) whose bytes these are
    int64_t  row0, n_rows;
    int32_t  codec;
    size_t   n_bytes;
    void *   data;  // device
    int      kept;  // sync: still in the store
} dev_block;

typedef struct dev_list {
    dev_block * b;
    int64_t     n;
} dev_list;

struct kvg_cuda_store {
    kvg_cuda_ctx *    ctx;
    const kvg_store * host;
    dev_list *        lists;  // n_layer * 2, as the host's rows
    int32_t *         on;     // per layer: attention on the GPU
    int               stale;  // the last sync failed: the copy is not the store
    uint64_t          bytes;  // device bytes of the blocks
    float *           q_dev;  // the queries, gathered (attend's scratch is the context's)
    size_t            q_floats;
    uint64_t          calls[2];  // hook_attend's and hook_finish's calls (proof the GPU took the ops)
};

static int64_t n_lists(const kvg_cuda_store * d) {
    return (int64_t) d->host->p.n_layer * 2;
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
    }
    if (!d || !d->lists || !d->on) {
        if (d) {
            free(d->lists);
            free(d->on);
        }
        free(d);
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_init: the index");
    }
    for (int64_t il = 0; il < nl; ++il) {
        d->on[il] = 1;
    }
    d->ctx  = ctx;
    d->host = host;
    *out    = d;
    return KVG_OK;
}

static void free_list(kvg_cuda_store * d, dev_list * l) {
    for (int64_t i = 0; i < l->n; ++i) {
        kvg_cuda_free(d->ctx, l->b[i].data);
        d->bytes -= l->b[i].n_bytes;
    }
    free(l->b);
    l->b = NULL;
    l->n = 0;
}

void kvg_cuda_store_free(kvg_cuda_store * d) {
    if (!d) {
        return;
    }
    for (int64_t li = 0; li < n_lists(d); ++li) {
        free_list(d, &d->lists[li]);
    }
    kvg_cuda_free(d->ctx, d->q_dev);
    kvg_cuda_ctx_free(d->ctx);
    free(d->lists);
    free(d->on);
    free(d);
}

int kvg_cuda_store_set_layer(kvg_cuda_store * d, int32_t il, int32_t on) {
    kvg_clear_error();
    if (!d || il < 0 || il >= d->host->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_set_layer: no copy, or layer %d outside [0, %d)", (int) il,
                        d ? (int) d->host->p.n_layer : 0);
    }
    d->on[il] = on != 0;
    return KVG_OK;
}

// The device block of host block hb in list l, searched from *hint (blocks keep their order).
static dev_block * find_block(dev_list * l, uint64_t id, int64_t * hint) {
    for (int64_t k = 0; k < l->n; ++k) {
        const int64_t i = (*hint + k) % l->n;
        if (l->b[i].id == id) {
            *hint = i + 1;
            return &l->b[i];
        }
    }
    return NULL;
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
    // Stage: every list as the store has it, reusing the blocks the copy holds and copying in
    // the others into fresh device memory nobody reads yet.
    int rc = KVG_OK;
    for (int64_t li = 0; li < nl && rc == KVG_OK; ++li) {
        const kvg_rows * r = &d->host->rows[li];
        dev_list *       l = &d->lists[li];
        for (int64_t i = 0; i < l->n; ++i) {
            l->b[i].kept = 0;
        }
        if (!d->on[li / 2] || !d->host->enabled[li / 2] || r->n_blocks == 0) {
            continue;
        }
        staged[li].b = (dev_block *) calloc((size_t) r->n_blocks, sizeof(dev_block));
        if (!staged[li].b) {
            rc = kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_store_sync: the index of list %lld", (long long) li);
            break;
        }
        int64_t hint = 0;
        for (int64_t i = 0; i < r->n_blocks && rc == KVG_OK; ++i) {
            const kvg_block * hb  = &r->blocks[i];
            dev_block *       old = find_block(l, hb->id, &hint);
            dev_block *       nb  = &staged[li].b[staged[li].n++];
            if (old) {
                *nb       = *old;
                nb->kept  = 0;  // 0 on the staged entry: sync frees only fresh memory on a failure
                old->kept = 1;
                continue;
            }
            *nb = (dev_block) { hb->id, hb->row0, hb->n_rows, hb->codec, hb->n_bytes, NULL, 1 };
            rc  = kvg_cuda_malloc(d->ctx, hb->n_bytes ? hb->n_bytes : 1, &nb->data);
            if (rc == KVG_OK) {
                rc = kvg_cuda_copy_in(d->ctx, nb->data, hb->data, hb->n_bytes);
            }
        }
    }
    if (rc != KVG_OK) {
        for (int64_t li = 0; li < nl; ++li) {
            for (int64_t i = 0; i < staged[li].n; ++i) {
                if (staged[li].b[i].kept) {
                    kvg_cuda_free(d->ctx, staged[li].b[i].data);
                }
            }
            free(staged[li].b);
        }
        free(staged);
        d->stale = 1;
        return rc;
    }
    // Commit: free what the store dropped, take the staged lists.
    for (int64_t li = 0; li < nl; ++li) {
        dev_list * l = &d->lists[li];
        for (int64_t i = 0; i < l->n; ++i) {
            if (!l->b[i].kept) {
                kvg_cuda_free(d->ctx, l->b[i].data);
                d->bytes -= l->b[i].n_bytes;
            }
        }
        free(l->b);
        for (int64_t i = 0; i < staged[li].n; ++i) {
            if (staged[li].b[i].kept) {
                d->bytes += staged[li].b[i].n_bytes;
            }
        }
        *l = staged[li];
    }
    free(staged);
    d->stale = 0;
    return KVG_OK;
}

int kvg_cuda_store_bytes(const kvg_cuda_store * d, uint64_t * out_blocks, uint64_t * out_scratch) {
    kvg_clear_error();
    if (!d) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_store_bytes: NULL copy");
    }
    if (out_blocks) {
        *out_blocks = d->bytes;
    }
    if (out_scratch) {
        *out_scratch = d->q_floats * sizeof(float) + kvg_cuda_ctx_scratch_bytes(d->ctx);
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

// Rows [r0, r1) of an f16 K block and an f16 V block (the codec's layout is the rows as they
// are: [token][head][i]) into the state, as llama.cpp's cells with no mask.
static int attend_f16_run(kvg_cuda_store * d, const kvg_cuda_layer_args * a, const dev_block * kb, const dev_block * vb,
                          int64_t r0, int64_t r1) {
    const int64_t       hk = a->n_head_kv;
    kvg_cuda_cells_args c;
    memset(&c, 0, sizeof(c));
    c.q_dev      = d->q_dev;
    c.n_tokens   = a->n_tokens;
    c.n_head     = a->n_head;
    c.n_head_kv  = a->n_head_kv;
    c.head_dim_k = a->head_dim_k;
    c.head_dim_v = a->head_dim_v;
    c.k_dev      = (const uint8_t *) kb->data + (size_t) ((r0 - kb->row0) * hk * a->head_dim_k) * 2;
    c.k_type     = KVG_CELLS_F16;
    c.k_nb[0]    = 2;
    c.k_nb[1]    = (size_t) a->head_dim_k * 2;
    c.k_nb[2]    = (size_t) (hk * a->head_dim_k) * 2;
    c.v_dev      = (const uint8_t *) vb->data + (size_t) ((r0 - vb->row0) * hk * a->head_dim_v) * 2;
    c.v_type     = KVG_CELLS_F16;
    c.v_nb[0]    = 2;
    c.v_nb[1]    = (size_t) a->head_dim_v * 2;
    c.v_nb[2]    = (size_t) (hk * a->head_dim_v) * 2;
    c.c0         = 0;
    c.c1         = r1 - r0;
    c.scale      = a->scale;
    c.softcap    = a->softcap;
    c.m_dev      = a->m_dev;
    c.l_dev      = a->l_dev;
    c.acc_dev    = a->acc_dev;
    return kvg_cuda_attend_cells(d->ctx, &c);
}

// Rows [r0, r1) of a coded K block and V block (kvg_cuda_attend: rotq) into the state.
static int attend_coded_run(kvg_cuda_store * d, const kvg_cuda_layer_args * a, const dev_block * kb, const dev_block * vb,
                            int64_t r0, int64_t r1) {
    kvg_cuda_attend_args x;
    memset(&x, 0, sizeof(x));
    x.k          = (kvg_cuda_block) { kb->codec, kb->data, kb->n_bytes, kb->n_rows };
    x.v          = (kvg_cuda_block) { vb->codec, vb->data, vb->n_bytes, vb->n_rows };
    x.k_row0     = r0 - kb->row0;
    x.v_row0     = r0 - vb->row0;
    x.n_rows     = r1 - r0;
    x.n_head_kv  = a->n_head_kv;
    x.head_dim_k = a->head_dim_k;
    x.head_dim_v = a->head_dim_v;
    x.seed       = d->host->p.codec.seed;
    x.q_dev      = d->q_dev;
    x.n_tokens   = a->n_tokens;
    x.n_head     = a->n_head;
    x.scale      = a->scale;
    x.softcap    = a->softcap;
    x.m_dev      = a->m_dev;
    x.l_dev      = a->l_dev;
    x.acc_dev    = a->acc_dev;
    return kvg_cuda_attend(d->ctx, &x);
}

// Layer il's rows [0, n_cold) into the state: one call per run where a K block and a V block
// overlap (kvg_cuda_attend for rotq, the cells' kernel for f16 on both). A run that cannot be read
// (another codec, K and V of different families) is left out; the first failure is returned.
static int attend_rows(kvg_cuda_store * d, const kvg_cuda_layer_args * a) {
    if (a->n_cold == 0) {
        return KVG_OK;
    }
    if (d->stale) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "the device copy is stale: its last sync failed");
    }
    const dev_list * kl = &d->lists[a->il * 2 + KVG_KIND_K];
    const dev_list * vl = &d->lists[a->il * 2 + KVG_KIND_V];
    const int64_t    nk = kl->n ? kl->b[kl->n - 1].row0 + kl->b[kl->n - 1].n_rows : 0;
    const int64_t    nv = vl->n ? vl->b[vl->n - 1].row0 + vl->b[vl->n - 1].n_rows : 0;
    if (a->n_cold > nk || a->n_cold > nv) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "layer %d: %lld cold rows asked for, the device copy holds %lld", (int) a->il,
                        (long long) a->n_cold, (long long) (nk < nv ? nk : nv));
    }
    int     first = KVG_OK;
    int64_t bk = 0, bv = 0;
    for (int64_t row = 0; row < a->n_cold;) {
        const dev_block * kb = &kl->b[bk];
        const dev_block * vb = &vl->b[bv];
        const int64_t     ke = kb->row0 + kb->n_rows, ve = vb->row0 + vb->n_rows;
        int64_t           e  = ke < ve ? ke : ve;
        e                    = e < a->n_cold ? e : a->n_cold;
        const int rc = kb->codec == KVG_CODEC_F16 && vb->codec == KVG_CODEC_F16 ? attend_f16_run(d, a, kb, vb, row, e)
                                                                              : attend_coded_run(d, a, kb, vb, row, e);
        if (rc != KVG_OK && first == KVG_OK) {
            first = rc;
        }
        row = e;
        bk += e == ke;
        bv += e == ve;
    }
    return first;
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
    const size_t nq = (size_t) a->n_tokens * (size_t) a->n_head * (size_t) a->head_dim_k;
    void * const prev = kvg_cuda_ctx_set_stream(d->ctx, stream);
    // the state empty first: whatever fails after, llama.cpp's merge reads a state
    int rc = kvg_cuda_attend_begin(d->ctx, (int64_t) a->n_tokens * a->n_head, a->head_dim_v, a->m_dev, a->l_dev, a->acc_dev);
    if (rc == KVG_OK && nq > d->q_floats) {
        void * q = NULL;
        rc       = kvg_cuda_malloc(d->ctx, nq * sizeof(float), &q);
        if (rc == KVG_OK) {
            kvg_cuda_free(d->ctx, d->q_dev);  // waits for the device: earlier ops may read it
            d->q_dev    = (float *) q;
            d->q_floats = nq;
        }
    }
    if (rc == KVG_OK) {
        // rounded to f16 as the CPU's fused path rounds them (llama.cpp's f16 attention takes f16 queries)
        rc = kvg_cuda_gather_q(d->ctx, a->q_dev, a->q_nb, a->head_dim_k, a->n_head, a->n_tokens, 1, d->q_dev);
    }
    if (rc != KVG_OK) {
        kvg_cuda_ctx_set_stream(d->ctx, prev);
        return rc;
    }
    const int cold = attend_rows(d, a);
    if (cold != KVG_OK) {
        atomic_fetch_add_explicit(&((kvg_store *) d->host)->read_failures[KVG_READ_ATTEND], 1, memory_order_relaxed);
    }
    if (a->n_kv > 0) {
        kvg_cuda_cells_args c;
        memset(&c, 0, sizeof(c));
        c.q_dev      = d->q_dev;
        c.n_tokens   = a->n_tokens;
        c.n_head     = a->n_head;
        c.n_head_kv  = a->n_head_kv;
        c.head_dim_k = a->head_dim_k;
        c.head_dim_v = a->head_dim_v;
        c.k_dev      = a->k_dev;
        c.k_type     = a->k_type;
        memcpy(c.k_nb, a->k_nb, sizeof(c.k_nb));
        c.v_dev  = a->v_dev;
        c.v_type = a->v_type;
        memcpy(c.v_nb, a->v_nb, sizeof(c.v_nb));
        c.c0       = 0;
        c.c1       = a->n_kv;
        c.mask_dev = a->mask_dev;
        c.mask_f16 = a->mask_f16;
        c.mask_nb1 = a->mask_nb1;
        c.scale    = a->scale;
        c.softcap  = a->softcap;
        c.m_dev    = a->m_dev;
        c.l_dev    = a->l_dev;
        c.acc_dev  = a->acc_dev;
        rc         = kvg_cuda_attend_cells(d->ctx, &c);
    }
    kvg_cuda_ctx_set_stream(d->ctx, prev);
    return rc != KVG_OK ? rc : cold;
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
