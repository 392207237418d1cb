// mass.c: attention mass per granule of cold rows, a by-product of the fused attention.
//
// An attend call sees only its slice of the rows, and its weights exp(score - m) are relative
// to its own running max m; the softmax share of a row needs the final max and sum over every
// row the query attended to (other threads' slices, the hot cells), which only the merge knows.
// So each call leaves notes in a slot of its own (per granule and query: its reference max and
// the sum of its weights), and kvg_store_hook_mass, called once the layer's states are merged,
// turns them into shares with the final normalizers: exp(m_note - max) * S_note / sum.
// Costs one add per row and query in the attend call; no locks (a slot per call, taken with one
// atomic add), no allocation once a slot has grown to the shape.

#include "kvg_internal.h"

#include <math.h>
#include <stdlib.h>

int kvg_store_set_mass(kvg_store * s, int32_t on) {
    kvg_clear_error();
    if (!s) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "store is NULL");
    }
    s->mass_on = on ? 1 : 0;
    s->n_notes = 0;
    return KVG_OK;
}

int kvg_store_mass(const kvg_store * s, int32_t il, double * out, int64_t n) {
    kvg_clear_error();
    if (!s || (!out && n > 0) || n < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "mass: store and out must not be NULL, n >= 0");
    }
    if (il < 0 || il >= s->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "mass: layer %d is outside [0, %d)", (int) il, (int) s->p.n_layer);
    }
    const int64_t have = s->mass_cap[il] < n ? s->mass_cap[il] : n;
    if (have > 0) {
        memcpy(out, s->mass[il], (size_t) have * sizeof(double));
    }
    for (int64_t g = have; g < n; g++) {
        out[g] = 0.0;
    }
    return KVG_OK;
}

void kvg_store_mass_clear(kvg_store * s) {
    if (!s || !s->mass_cap) {
        return;
    }
    for (int32_t il = 0; il < s->p.n_layer; il++) {
        if (s->mass_cap[il] > 0) {
            memset(s->mass[il], 0, (size_t) s->mass_cap[il] * sizeof(double));
        }
    }
}

int64_t kvg_store_mass_dropped(const kvg_store * s) {
    return s ? s->mass_dropped : 0;
}

void kvg_mass_forget_from(kvg_store * s, int64_t n_rows) {
    const int64_t g0 = (n_rows + KVG_MASS_ROWS - 1) / KVG_MASS_ROWS;
    for (int32_t il = 0; il < s->p.n_layer; il++) {
        for (int64_t g = g0; g < s->mass_cap[il]; g++) {
            s->mass[il][g] = 0.0;
        }
    }
}

void kvg_mass_shift(kvg_store * s, int64_t p0, int64_t p1) {
    // Each granule from the first one wholly at or after p0 takes the counters of the granule
    // that held its first row before the shift: exact where p0 and p1 - p0 are whole granules,
    // else a granule's share drifts by less than one granule. Read ahead of the writes, in place.
    const int64_t d  = p1 - p0;
    const int64_t g0 = (p0 + KVG_MASS_ROWS - 1) / KVG_MASS_ROWS;
    for (int32_t il = 0; il < s->p.n_layer; il++) {
        for (int64_t g = g0; g < s->mass_cap[il]; g++) {
            const int64_t src = (g * KVG_MASS_ROWS + d) / KVG_MASS_ROWS;
            s->mass[il][g]    = src < s->mass_cap[il] ? s->mass[il][src] : 0.0;
        }
    }
}

void kvg_mass_free(kvg_store * s) {
    if (s->mass) {
        for (int32_t il = 0; il < s->p.n_layer; il++) {
            free(s->mass[il]);
        }
    }
    if (s->notes) {
        for (int k = 0; k < KVG_MASS_SLOTS; k++) {
            free(s->notes[k].gran);
            free(s->notes[k].ms);
        }
    }
    free(s->mass);
    free(s->mass_cap);
    free(s->notes);
}

kvg_mass_notes * kvg_mass_begin(kvg_store * s, int32_t il, int32_t n_tokens, int32_t n_head, int64_t n_q, int64_t r0,
                                int64_t r1) {
    if (!s->mass_on) {
        return NULL;
    }
    const int32_t k = s->n_notes++;  // atomic: concurrent calls get distinct slots
    if (k >= KVG_MASS_SLOTS) {
        s->mass_dropped++;
        return NULL;
    }
    kvg_mass_notes * nt = &s->notes[k];
    const size_t     nr = (size_t) ((r1 - 1) / KVG_MASS_ROWS - r0 / KVG_MASS_ROWS + 1);
    nt->il              = il;
    nt->n_tokens        = n_tokens;
    nt->n_head          = n_head;
    nt->n_q             = n_q;
    nt->n_rec           = 0;
    if (nr > nt->cap_rec || (size_t) n_q > nt->cap_q) {
        const size_t cr = nr > nt->cap_rec ? nr : nt->cap_rec;
        const size_t cq = (size_t) n_q > nt->cap_q ? (size_t) n_q : nt->cap_q;
        int64_t *    g  = (int64_t *) realloc(nt->gran, cr * sizeof(int64_t));
        if (g) {
            nt->gran = g;
        }
        float * ms = g ? (float *) realloc(nt->ms, cr * 2 * cq * sizeof(float)) : NULL;
        if (!ms) {
            nt->n_rec = -1;  // brought in as lost
            return NULL;
        }
        nt->ms      = ms;
        nt->cap_rec = cr;
        nt->cap_q   = cq;
    }
    return nt;
}

void kvg_mass_note(kvg_mass_notes * nt, int64_t granule, const float * m, const float * w, int64_t n, int64_t t0,
                   int64_t t1) {
    const int64_t n_q = nt->n_q;
    float *       ms;
    if (nt->n_rec > 0 && nt->gran[nt->n_rec - 1] == granule) {
        ms = nt->ms + (size_t) (nt->n_rec - 1) * 2 * (size_t) n_q;
        for (int64_t j = 0; j < n_q; j++) {
            if (m[j] > ms[j]) {  // the running max grew since: rescale the granule's sum to it
                ms[n_q + j] *= expf(ms[j] - m[j]);
                ms[j] = m[j];
            }
        }
    } else {
        ms                    = nt->ms + (size_t) nt->n_rec * 2 * (size_t) n_q;
        nt->gran[nt->n_rec++] = granule;
        for (int64_t j = 0; j < n_q; j++) {
            ms[j]       = m[j];
            ms[n_q + j] = 0.0f;
        }
    }
    for (int64_t j = 0; j < n_q; j++) {
        const float * wj  = w + j * n;
        float         sum = 0.0f;
        for (int64_t t = t0; t < t1; t++) {
            sum += wj[t];
        }
        ms[n_q + j] += sum;
    }
}

// Room for granules [0, n) of layer il (zeroed).
static int reserve_mass(kvg_store * s, int32_t il, int64_t n) {
    if (n <= s->mass_cap[il]) {
        return KVG_OK;
    }
    int64_t cap = s->mass_cap[il] ? s->mass_cap[il] : 64;
    while (cap < n) {
        cap *= 2;
    }
    double * p = (double *) realloc(s->mass[il], (size_t) cap * sizeof(double));
    if (!p) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "mass counters of layer %d", (int) il);
    }
    memset(p + s->mass_cap[il], 0, (size_t) (cap - s->mass_cap[il]) * sizeof(double));
    s->mass[il]     = p;
    s->mass_cap[il] = cap;
    return KVG_OK;
}

int32_t kvg_store_hook_mass(void * user, int32_t il, int32_t n_tokens, int32_t n_head, const float * max,
                            const float * sum) {
    kvg_clear_error();
    kvg_store * s = (kvg_store *) user;
    if (!s || !max || !sum) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "mass: store, max and sum must not be NULL");
    }
    const int32_t taken = s->n_notes;
    const int32_t n     = taken < KVG_MASS_SLOTS ? taken : KVG_MASS_SLOTS;
    s->n_notes          = 0;
    if (il < 0 || il >= s->p.n_layer || n_tokens <= 0 || n_head <= 0 || n_head % s->p.n_head_kv != 0) {
        s->mass_dropped += n;
        return kvg_fail(KVG_ERR_INVALID_ARG, "mass: layer %d, %d tokens of %d heads do not fit the store", (int) il,
                        (int) n_tokens, (int) n_head);
    }
    const int64_t gqa = n_head / s->p.n_head_kv, P = (int64_t) n_tokens * gqa;
    int           status = KVG_OK;
    for (int32_t k = 0; k < n; k++) {
        const kvg_mass_notes * nt = &s->notes[k];
        if (nt->il != il || nt->n_tokens != n_tokens || nt->n_head != n_head || nt->n_rec < 0) {
            s->mass_dropped++;
            continue;
        }
        if (nt->n_rec == 0) {
            continue;
        }
        if (status == KVG_OK) {
            status = reserve_mass(s, il, nt->gran[nt->n_rec - 1] + 1);
        }
        if (status != KVG_OK) {
            s->mass_dropped++;
            continue;
        }
        const int64_t n_q = nt->n_q;
        for (int64_t r = 0; r < nt->n_rec; r++) {
            const float * ms    = nt->ms + (size_t) r * 2 * (size_t) n_q;
            double        share = 0.0;
            for (int64_t jj = 0; jj < n_q; jj++) {
                // internal query jj = (hk * n_tokens + t) * gqa + g is the caller's t * n_head + hk * gqa + g
                const int64_t hk = jj / P, t = (jj % P) / gqa, g = jj % gqa;
                const int64_t j = t * n_head + hk * gqa + g;
                if (sum[j] > 0.0f && ms[n_q + jj] > 0.0f) {
                    share += (double) ms[n_q + jj] * exp((double) ms[jj] - (double) max[j]) / (double) sum[j];
                }
            }
            s->mass[il][nt->gran[r]] += share;
        }
    }
    return status;
}
