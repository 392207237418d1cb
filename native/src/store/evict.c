// One eviction's appends, called by llama.cpp (llama_kvgguf_evict) once per list with that list's
// rows as f32: the plan, made once by the caller, says which rows go to which tier and codec. A
// list whose arguments are wrong is left as it was; one whose append fails midway (out of memory)
// keeps its first parts, and the caller cuts every list back to the eviction's first row.

#include "kvg_internal.h"

static int append_parts(const kvg_evict_plan * p, int32_t il, int32_t kind, const float * rows, int64_t n_rows,
                        int64_t n_embd) {
    if (!p->store || !p->codecs || !rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "the eviction plan's store or codecs, or the rows, is NULL");
    }
    if (p->n_parts < 1 || p->n_parts > KVG_TIER_COUNT) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "an eviction plan of %d parts", (int) p->n_parts);
    }
    const kvg_store * s = p->store;
    if (il < 0 || il >= s->p.n_layer || (kind != KVG_KIND_K && kind != KVG_KIND_V)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "list (%d, %d) is not the store's", (int) il, (int) kind);
    }
    const int64_t width = (int64_t) s->p.n_head_kv * (kind == KVG_KIND_K ? s->p.head_dim_k : s->p.head_dim_v);
    if (n_embd != width) {
        return kvg_fail(KVG_ERR_SHAPE, "rows of %lld values for a list of rows of %lld", (long long) n_embd,
                        (long long) width);
    }
    for (int32_t i = 0; i < p->n_parts; ++i) {  // every part checked before the first append
        const int64_t a = p->row0[i], b = p->row1[i];
        if (a < 0 || b <= a || b > n_rows) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "part [%lld, %lld) of %lld rows", (long long) a, (long long) b,
                            (long long) n_rows);
        }
    }
    for (int32_t i = 0; i < p->n_parts; ++i) {
        const int64_t a = p->row0[i], b = p->row1[i];
        const int32_t codec = p->codecs[(int64_t) i * 2 * s->p.n_layer + il * 2 + kind];
        if (codec < 0) {
            continue;
        }
        const int rc = kvg_store_append(p->store, il, kind, p->tier[i], codec, rows + a * width,
                                        (size_t) ((b - a) * width), b - a);
        if (rc != KVG_OK) {
            return rc;
        }
    }
    return KVG_OK;
}

int32_t kvg_store_hook_append(void * plan, int32_t il, int32_t kind, const float * rows, int64_t n_rows,
                              int64_t n_embd) {
    kvg_clear_error();
    kvg_evict_plan * p = (kvg_evict_plan *) plan;
    if (!p) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "the eviction plan is NULL");
    }
    p->status = append_parts(p, il, kind, rows, n_rows, n_embd);
    return p->status;
}
