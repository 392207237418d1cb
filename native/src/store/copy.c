// A range's blocks of every list as one buffer, and back: aging keeps a block's warm codes before
// it re-encodes them (a cut into the range can make it warm again), a cut puts them back, each in
// one call for all the lists instead of one per list.

#include <string.h>

#include "kvg_internal.h"

// kvgguf/policy/held.py predicts the bytes RecentRows keeps at BLOCK_RECORD_BYTES a record.
_Static_assert(sizeof(kvg_block_record) == 40, "change BLOCK_RECORD_BYTES in kvgguf/policy/held.py too");

// The first block of r that starts at row r0 or later (r->n_blocks: none).
static int64_t first_block_from(const kvg_rows * r, int64_t r0) {
    if (r0 >= r->n_rows) {
        return r->n_blocks;
    }
    int64_t bi = r0 <= 0 ? 0 : kvg_rows_find_block(r, r0);
    return bi + (r->blocks[bi].row0 < r0);
}

int kvg_store_copy_blocks(const kvg_store * s, int64_t r0, int64_t r1, void * dst, size_t dst_bytes,
                          size_t * out_bytes) {
    kvg_clear_error();
    if (!s || !out_bytes || r0 < 0 || r1 < r0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "copy blocks of rows [%lld, %lld): bad arguments", (long long) r0,
                        (long long) r1);
    }
    const int64_t n_lists = (int64_t) s->p.n_layer * 2;
    size_t        need    = 0;
    for (int64_t li = 0; li < n_lists; ++li) {
        const kvg_rows * r = &s->rows[li];
        for (int64_t bi = first_block_from(r, r0); bi < r->n_blocks && r->blocks[bi].row0 < r1; ++bi) {
            need += sizeof(kvg_block_record) + r->blocks[bi].n_bytes;
        }
    }
    *out_bytes = need;
    if (!dst) {
        return KVG_OK;
    }
    if (dst_bytes != need) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "the blocks of rows [%lld, %lld) take %zu bytes, %zu given",
                        (long long) r0, (long long) r1, need, dst_bytes);
    }
    uint8_t * out = (uint8_t *) dst;
    for (int64_t li = 0; li < n_lists; ++li) {
        const kvg_rows * r = &s->rows[li];
        for (int64_t bi = first_block_from(r, r0); bi < r->n_blocks && r->blocks[bi].row0 < r1; ++bi) {
            const kvg_block * b   = &r->blocks[bi];
            kvg_block_record  rec = { (int32_t) (li / 2),
                                      (int32_t) (li % 2),
                                      { b->row0, b->n_rows, b->codec, b->tier, b->n_bytes } };
            memcpy(out, &rec, sizeof rec);
            memcpy(out + sizeof rec, b->data, b->n_bytes);
            out += sizeof rec + b->n_bytes;
        }
    }
    return KVG_OK;
}

// Drops the blocks appended to each list after n_blocks[li] (the undo of a failed append_blocks).
static void drop_appended(kvg_store * s, const int64_t * n_blocks) {
    for (int64_t li = 0; li < (int64_t) s->p.n_layer * 2; ++li) {
        kvg_rows * r = &s->rows[li];
        if (r->n_blocks == n_blocks[li]) {
            continue;
        }
        r->n_rows = r->blocks[n_blocks[li]].row0;
        for (int64_t bi = n_blocks[li]; bi < r->n_blocks; ++bi) {
            free(r->blocks[bi].data);
        }
        r->n_blocks = n_blocks[li];
        r->version++;
    }
}

int kvg_store_append_blocks(kvg_store * s, const void * src, size_t n_bytes) {
    kvg_clear_error();
    if (!s || (!src && n_bytes)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "append blocks: the store or the buffer is NULL");
    }
    const int64_t n_lists = (int64_t) s->p.n_layer * 2;
    int           rc      = kvg_injected_failure("append blocks: staging");
    int64_t *     next    = rc == KVG_OK ? (int64_t *) malloc((size_t) n_lists * 2 * sizeof(int64_t)) : NULL;
    if (!next) {
        return rc != KVG_OK ? rc : kvg_fail(KVG_ERR_NO_MEMORY, "append blocks: staging");
    }
    int64_t * n_blocks = next + n_lists;  // each list's block count before: what a failure goes back to
    for (int64_t li = 0; li < n_lists; ++li) {
        next[li]     = s->rows[li].n_rows;
        n_blocks[li] = s->rows[li].n_blocks;
    }
    // First every record's place: each list's blocks must follow its last row, in order.
    const uint8_t * in = (const uint8_t *) src;
    for (size_t at = 0; at < n_bytes && rc == KVG_OK;) {
        kvg_block_record rec;
        if (n_bytes - at < sizeof rec) {
            rc = kvg_fail(KVG_ERR_BUFFER_SIZE, "append blocks: a record cut off at byte %zu", at);
            break;
        }
        memcpy(&rec, in + at, sizeof rec);
        if (rec.il < 0 || rec.il >= s->p.n_layer || (rec.kind != KVG_KIND_K && rec.kind != KVG_KIND_V) ||
            rec.info.n_bytes > n_bytes - at - sizeof rec) {
            rc = kvg_fail(KVG_ERR_INVALID_ARG, "append blocks: a record of list (%d, %d), %llu bytes, at byte %zu",
                          (int) rec.il, (int) rec.kind, (unsigned long long) rec.info.n_bytes, at);
            break;
        }
        const int64_t li = (int64_t) rec.il * 2 + rec.kind;
        if (rec.info.row0 != next[li] || rec.info.n_rows <= 0) {
            rc = kvg_fail(KVG_ERR_INVALID_ARG, "append blocks: rows [%lld, +%lld) of list (%d, %d), which ends at %lld",
                          (long long) rec.info.row0, (long long) rec.info.n_rows, (int) rec.il, (int) rec.kind,
                          (long long) next[li]);
            break;
        }
        next[li] += rec.info.n_rows;
        at += sizeof rec + rec.info.n_bytes;
    }
    // Then the appends, each checked to decode; a failure takes back the ones before it.
    for (size_t at = 0; at < n_bytes && rc == KVG_OK;) {
        kvg_block_record rec;
        memcpy(&rec, in + at, sizeof rec);
        rc = kvg_store_append_encoded(s, rec.il, rec.kind, rec.info.tier, rec.info.codec, rec.info.n_rows,
                                      in + at + sizeof rec, rec.info.n_bytes);
        at += sizeof rec + rec.info.n_bytes;
    }
    if (rc != KVG_OK) {
        drop_appended(s, n_blocks);  // frees only: the error stays the failing step's
    }
    free(next);
    return rc;
}
