// A context shift on the cold rows: rows [p0, p1) leave every list and the rows after them move
// back by p1 - p0, keeping their codes. RoPE is a rotation, so a key rotated at position p scores
// against a query rotated at t as one rotated at p - d scores against the query rotated at t + d:
// the attention rotates each query once per distinct shift (native/llama/src/llama-kvgguf-graph.cpp)
// instead of decoding, rotating and encoding every moved key again.

#include "kvg_internal.h"

// The block of r that starts at row p, -1 when none does (p == r->n_rows: r->n_blocks).
static int64_t block_at(const kvg_rows * r, int64_t p) {
    if (p >= r->n_rows) {
        return p == r->n_rows ? r->n_blocks : -1;
    }
    const int64_t bi = kvg_rows_find_block(r, p);
    return r->blocks[bi].row0 == p ? bi : -1;
}

int kvg_store_shift(kvg_store * s, int64_t p0, int64_t p1) {
    kvg_clear_error();
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    if (p0 < 0 || p1 < p0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "shift out rows [%lld, %lld)", (long long) p0, (long long) p1);
    }
    const int64_t n_lists = (int64_t) s->p.n_layer * 2;
    // Every list first: a range that cuts a block is refused before anything changes.
    for (int64_t li = 0; li < n_lists; ++li) {
        const kvg_rows * r = &s->rows[li];
        if (r->n_rows <= p0) {
            continue;
        }
        const int64_t q1 = p1 < r->n_rows ? p1 : r->n_rows;
        if (block_at(r, p0) < 0 || block_at(r, q1) < 0) {
            return kvg_fail(KVG_ERR_INVALID_ARG,
                            "rows [%lld, %lld) do not start and end on blocks of list (%d, %d): a shift keeps "
                            "every block it moves whole",
                            (long long) p0, (long long) p1, (int) (li / 2), (int) (li % 2));
        }
    }
    const int64_t d = p1 - p0;
    if (d == 0) {
        return KVG_OK;
    }
    for (int64_t li = 0; li < n_lists; ++li) {
        kvg_rows * r = &s->rows[li];
        if (r->n_rows <= p0) {
            continue;
        }
        const int64_t b0 = block_at(r, p0);
        const int64_t b1 = block_at(r, p1 < r->n_rows ? p1 : r->n_rows);
        for (int64_t bi = b0; bi < b1; ++bi) {
            free(r->blocks[bi].data);
        }
        for (int64_t bi = b1; bi < r->n_blocks; ++bi) {
            kvg_block b = r->blocks[bi];
            b.row0 -= d;
            b.shift += (int32_t) d;
            r->blocks[b0 + bi - b1] = b;
        }
        r->n_blocks -= b1 - b0;
        r->n_rows = r->n_blocks ? r->blocks[r->n_blocks - 1].row0 + r->blocks[r->n_blocks - 1].n_rows : 0;
        r->version++;
    }
    kvg_mass_shift(s, p0, p1);
    return KVG_OK;
}

int kvg_store_set_shift(kvg_store * s, int32_t il, int64_t r0, int64_t r1, int32_t shift) {
    kvg_clear_error();
    if (!s || il < 0 || il >= s->p.n_layer || r0 < 0 || r1 < r0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "set the shift of layer %d's rows [%lld, %lld)", (int) il, (long long) r0,
                        (long long) r1);
    }
    int64_t b0[2], b1[2];
    for (int kind = 0; kind < 2; ++kind) {  // both lists first: nothing changes on a refusal
        const kvg_rows * r = &s->rows[il * 2 + kind];
        b0[kind]           = block_at(r, r0);
        b1[kind]           = block_at(r, r1);
        if (r1 > r->n_rows || b0[kind] < 0 || b1[kind] < 0) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "rows [%lld, %lld) are not whole blocks of list (%d, %d)",
                            (long long) r0, (long long) r1, (int) il, kind);
        }
    }
    for (int kind = 0; kind < 2; ++kind) {
        kvg_rows * r = &s->rows[il * 2 + kind];
        for (int64_t bi = b0[kind]; bi < b1[kind]; ++bi) {
            r->blocks[bi].shift = shift;
        }
        r->version++;
    }
    return KVG_OK;
}

int32_t kvg_store_hook_shifts(void * user, int32_t il, int32_t cap, int64_t * row_begin, int64_t * row_end,
                              int32_t * shift) {
    const kvg_store * s = (const kvg_store *) user;
    if (!s || il < 0 || il >= s->p.n_layer || cap < 0 || (cap > 0 && (!row_begin || !row_end || !shift))) {
        return -1;
    }
    if (!s->enabled[il]) {
        return 0;
    }
    // K and V of a layer are shifted together; the K list's blocks, up to the rows both hold.
    const kvg_rows * r      = &s->rows[il * 2 + KVG_KIND_K];
    const int64_t    n_cold = kvg_store_hook_n_cold(user, il);
    int32_t          n      = 0;
    for (int64_t bi = 0; bi < r->n_blocks && r->blocks[bi].row0 < n_cold; ++bi) {
        const kvg_block * b = &r->blocks[bi];
        if (b->shift == 0) {
            continue;
        }
        // a list's blocks follow one another: a run goes on while the shift stays
        if (bi == 0 || r->blocks[bi - 1].shift != b->shift) {
            if (n < cap) {
                row_begin[n] = b->row0;
                shift[n]     = b->shift;
            }
            ++n;
        }
        if (n <= cap) {
            row_end[n - 1] = b->row0 + b->n_rows < n_cold ? b->row0 + b->n_rows : n_cold;
        }
    }
    return n;
}
