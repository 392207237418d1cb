// attend.c: attention over the store's encoded rows without expanding them (kvg_store_hook_attend).
//
// Rows are walked in runs that lie in one K block and one V block (the two lists may be cut
// differently and hold different codecs), in chunks of at most KVG_ATTN_CHUNK rows. Per chunk
// the K codec's kernel scores every row against every query, the online softmax (Milakov and
// Gimelshein 2018, arXiv:1805.02867) folds the chunk's maximum into (m, l, acc) once, and the
// V codec's kernel adds the weighted rows. Rotated (rotq) rows are scored against queries
// rotated once per call and summed in the rotated domain; one inverse transform per query at
// the end brings that sum back. wfq rows work the same way in the domain of their plan.
//
// With many queries per KV head (a prefill's ubatch, KVG_DENSE_MIN_QUERIES) the chunk's f16,
// rotq and tcq rows are instead decoded once per KV head into f32 and scored and summed as small
// matrix products (attend_simd.h's dense tiles): the kernels would dequantize each row once per
// few queries. At 64 tokens of SmolLM2's shape that is 1.6x (f16) to 3x (tcq3) faster.
//
// Queries are regrouped by KV head inside the call, so each kernel sees the queries of one KV
// head as one contiguous run; the caller's state is copied in, updated and copied back, which
// also leaves it untouched when the arguments are refused.

#include "kvg_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

// Per-thread workspace (scratch.c): llama.cpp calls the hook on its long-lived worker threads,
// so after the first call of a shape nothing is allocated.
static float * workspace(size_t n_floats) {
    return kvg_thread_scratch(KVG_SCRATCH_ATTEND, n_floats);
}

static int run_score(const kvg_codec_traits * tr, int simd, const kvg_job * job, const uint8_t * src, int64_t t0,
                     int64_t n, const kvg_attn * a, float * out) {
    if (simd && tr->score_simd) {
        const int st = tr->score_simd(job, src, t0, n, a, out);
        if (st != KVG_NOT_HANDLED) {
            return st;
        }
    }
    return tr->score_ref(job, src, t0, n, a, out);
}

// A chunk as dense tiles: keys scored into s (KVG_KIND_K), or values summed with the weights in s
// (KVG_KIND_V). KVG_NOT_HANDLED (nothing written) for a codec or shape the tiles do not take, or
// when the scratch cannot grow (the kernels then run, needing none).
static int dense_chunk(int kind, const kvg_codec_traits * tr, const kvg_job * job, const uint8_t * src, int64_t t0,
                       int64_t n, const kvg_attn * a, float * s) {
    const int64_t D = job->head_dim, P = a->per_head;
    float *       rows = kvg_thread_scratch(KVG_SCRATCH_DENSE, (size_t) (2 * KVG_ATTN_CHUNK * D));
    if (!rows) {
        return KVG_NOT_HANDLED;
    }
    for (int64_t hk = 0; hk < job->n_heads; hk++) {
        const int st = KVG_SIMD(kvg_dense_rows)(job, src, t0, n, hk, rows);
        if (st != KVG_OK) {
            return st;  // at hk = 0: it depends on the codec and the shape only
        }
        if (kind == KVG_KIND_K) {
            KVG_SIMD(kvg_dense_score)((tr->rotated ? a->qr : a->q) + hk * P * D, P, rows, n, D,
                                      rows + KVG_ATTN_CHUNK * D, s + hk * P * n, n);
        } else {
            KVG_SIMD(kvg_dense_accumulate)(s + hk * P * n, n, P, rows, n, D,
                                           (tr->rotated ? a->accr : a->acc) + hk * P * D);
        }
    }
    return KVG_OK;
}

static int run_accumulate(const kvg_codec_traits * tr, int simd, const kvg_job * job, const uint8_t * src, int64_t t0,
                          int64_t n, const float * p, const kvg_attn * a) {
    if (simd && tr->accumulate_simd) {
        const int st = tr->accumulate_simd(job, src, t0, n, p, a);
        if (st != KVG_NOT_HANDLED) {
            return st;
        }
    }
    return tr->accumulate_ref(job, src, t0, n, p, a);
}

void kvg_attn_softmax_ref(const kvg_attn * a, float * m, float * l, float * s, int64_t n, int64_t dv, int rotated) {
    for (int64_t j = 0; j < a->n_q; j++) {
        float * sj = s + j * n;
        float   mx = sj[0];
        for (int64_t t = 1; t < n; t++) {
            mx = sj[t] > mx ? sj[t] : mx;
        }
        if (mx == -INFINITY) {  // every score masked (kvg_attend_f16): nothing to fold in
            memset(sj, 0, (size_t) n * sizeof(float));
            continue;
        }
        if (mx > m[j]) {
            const float corr = expf(m[j] - mx);  // 0 while m is -inf
            l[j] *= corr;
            float * acc  = a->acc + j * dv;
            float * accr = a->accr + j * dv;
            for (int64_t d = 0; d < dv; d++) {
                acc[d] *= corr;
            }
            if (rotated) {
                for (int64_t d = 0; d < dv; d++) {
                    accr[d] *= corr;
                }
            }
            m[j] = mx;
        }
        const float mj  = m[j];
        float       sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            sj[t] = expf(sj[t] - mj);
            sum += sj[t];
        }
        l[j] += sum;
    }
}

static int32_t attend(kvg_store * s, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                      int32_t n_head, float scale, float softcap, float * m, float * l, float * acc);

// Internal query jj = (hk * n_tokens + t) * gqa + g is the caller's j = t * n_head + hk * gqa + g:
// the queries of one KV head lie together, each kernel sees them as one run.
void kvg_attn_gather(const float * q, const float * m, const float * l, const float * acc, int64_t n_tokens,
                     int64_t n_head, int64_t gqa, int64_t dk, int64_t dv, float scale, float * wq, float * wm,
                     float * wl, float * wacc) {
    const int64_t P = n_tokens * gqa;
    for (int64_t jj = 0; jj < n_tokens * n_head; jj++) {
        const int64_t j = ((jj % P) / gqa) * n_head + (jj / P) * gqa + jj % gqa;
        for (int64_t i = 0; i < dk; i++) {
            wq[jj * dk + i] = scale * q[j * dk + i];
        }
        memcpy(wacc + jj * dv, acc + j * dv, (size_t) dv * sizeof(float));
        wm[jj] = m[j];
        wl[jj] = l[j];
    }
}

void kvg_attn_scatter(const float * wm, const float * wl, const float * wacc, int64_t n_tokens, int64_t n_head,
                      int64_t gqa, int64_t dv, float * m, float * l, float * acc) {
    const int64_t P = n_tokens * gqa;
    for (int64_t jj = 0; jj < n_tokens * n_head; jj++) {
        const int64_t j = ((jj % P) / gqa) * n_head + (jj / P) * gqa + jj % gqa;
        memcpy(acc + j * dv, wacc + jj * dv, (size_t) dv * sizeof(float));
        m[j] = wm[jj];
        l[j] = wl[jj];
    }
}

int32_t kvg_store_hook_attend_capped(void * user, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                                     int32_t n_head, float scale, float softcap, float * m, float * l, float * acc) {
    kvg_clear_error();
    kvg_store * s  = (kvg_store *) user;  // read only, but for the mass notes of this call's own slot
    int32_t     rc = s ? kvg_store_read_begin(s) : KVG_OK;
    if (rc == KVG_OK) {
        rc = attend(s, il, r0, r1, q, n_tokens, n_head, scale, softcap, m, l, acc);
        if (s) {
            kvg_store_read_end(s);
        }
    }
    if (rc != KVG_OK && s) {  // some rows (or all) were left out: Python reads the count after decode
        atomic_fetch_add_explicit(&s->read_failures[KVG_READ_ATTEND], 1, memory_order_relaxed);
    }
    return rc;
}

int32_t kvg_store_hook_attend(void * user, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                              int32_t n_head, float scale, float * m, float * l, float * acc) {
    return kvg_store_hook_attend_capped(user, il, r0, r1, q, n_tokens, n_head, scale, 0.0f, m, l, acc);
}

// Soft-capping as llama.cpp's flash attention does it: the kernels score with scale / softcap,
// then each score becomes softcap * tanh(score).
void kvg_attn_cap_scores(float * sc, int64_t n, float softcap) {
    for (int64_t i = 0; i < n; i++) {
        sc[i] = softcap * tanhf(sc[i]);
    }
}

// A domain is where queries are scored and values summed: the caller's coordinates (none),
// rotq's rotation (shared by every rotated codec of the store) or a codec's own per (layer,
// kind), e.g. wfq's plan, named by its codec type.
enum { DOM_NONE = -1, DOM_ROT = KVG_CODEC_COUNT_ };

static int domain_of(const kvg_codec_traits * tr, int codec) {
    return tr->rotated ? DOM_ROT : tr->prepare_q ? codec : DOM_NONE;
}

typedef struct acc_domain {
    int                      dom;
    const kvg_codec_traits * tr;  // the codec of an own domain, and a job of its plan
    kvg_job                  job;
} acc_domain;

// acc += the values summed in accr's domain (rotq: s * W(accr), one transform per query).
static int finish_acc(const kvg_store * s, const acc_domain * d, const kvg_attn * a, int64_t dv) {
    if (d->dom == DOM_ROT) {
        float * y = a->tmp;
        for (int64_t jj = 0; jj < a->n_q; jj++) {
            memcpy(y, a->accr + jj * dv, (size_t) dv * sizeof(float));
            kvg_fwht(y, dv);
            float * out = a->acc + jj * dv;
            for (int64_t i = 0; i < dv; i++) {
                out[i] += s->sgn[i] * y[i];
            }
        }
        return KVG_OK;
    }
    return d->dom == DOM_NONE ? KVG_OK : d->tr->finish_acc(&d->job, a);
}

static int32_t attend(kvg_store * s, int32_t il, int64_t r0, int64_t r1, const float * q, int32_t n_tokens,
                      int32_t n_head, float scale, float softcap, float * m, float * l, float * acc) {
    if (!s || !q || !m || !l || !acc) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend: store, q, m, l and acc must not be NULL");
    }
    if (il < 0 || il >= s->p.n_layer) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend: layer %d is outside [0, %d)", (int) il, (int) s->p.n_layer);
    }
    const int64_t Hkv = s->p.n_head_kv;
    if (n_tokens <= 0 || n_head <= 0 || n_head % Hkv != 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "attend: needs n_tokens > 0 and n_head a positive multiple of n_head_kv = %lld, got %d, %d",
                        (long long) Hkv, (int) n_tokens, (int) n_head);
    }
    if (!isfinite(scale)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend: scale %g is not finite", (double) scale);
    }
    if (!isfinite(softcap) || softcap < 0.0f) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend: softcap %g is not a finite value >= 0", (double) softcap);
    }
    if (softcap > 0.0f) {
        scale /= softcap;
    }
    const kvg_rows * kr = &s->rows[il * 2 + KVG_KIND_K];
    const kvg_rows * vr = &s->rows[il * 2 + KVG_KIND_V];
    const int64_t    nr = kr->n_rows < vr->n_rows ? kr->n_rows : vr->n_rows;
    if (r0 < 0 || r1 < r0 || r1 > nr) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend: rows [%lld, %lld) are outside [0, %lld) of layer %d",
                        (long long) r0, (long long) r1, (long long) nr, (int) il);
    }
    if (r0 == r1) {
        return KVG_OK;
    }

    const int64_t dk = s->p.head_dim_k, dv = s->p.head_dim_v, dm = dk > dv ? dk : dv;
    const int64_t gqa = n_head / Hkv, P = (int64_t) n_tokens * gqa, n_q = (int64_t) n_tokens * n_head;
    // At most 2^36 floats of workspace: no size below can overflow, and a larger request is not a
    // decode step anyway.
    if ((uint64_t) n_q * (uint64_t) (dm + 4 * KVG_ATTN_CHUNK) > ((uint64_t) 1 << 36)) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "attend: %lld queries of %lld values need too large a workspace",
                        (long long) n_q, (long long) dm);
    }
    const size_t n_ws = (size_t) (n_q * (2 * dk + 2 * dv + 2 + KVG_ATTN_CHUNK) + KVG_ATTN_TMP(n_q, dm));
    float *      ws   = workspace(n_ws);
    if (!ws) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "attend: workspace of %zu floats", n_ws);
    }
    float * wq    = ws;                // [n_q][dk]   scaled queries, by KV head
    float * wqr   = wq + n_q * dk;     // [n_q][dk]   rotated
    float * wacc  = wqr + n_q * dk;    // [n_q][dv]
    float * waccr = wacc + n_q * dv;   // [n_q][dv]
    float * wm    = waccr + n_q * dv;  // [n_q]
    float * wl    = wm + n_q;          // [n_q]
    float * sc    = wl + n_q;          // [n_q][CHUNK] scores, then weights
    float * tmp   = sc + n_q * KVG_ATTN_CHUNK;

    kvg_attn_gather(q, m, l, acc, n_tokens, n_head, gqa, dk, dv, scale, wq, wm, wl, wacc);

    kvg_attn         a      = { n_q, P, wq, wqr, wacc, waccr, tmp };
    kvg_mass_notes * notes  = kvg_mass_begin(s, il, n_tokens, n_head, n_q, r0, r1);
    const int        simd   = kvg_simd_on();  // once per call: the level cannot change under a chunk
    const int        dense  = simd && P >= KVG_DENSE_MIN_QUERIES;
    int              q_dom  = DOM_NONE;                   // the domain wqr holds the queries in
    acc_domain       vdom   = { DOM_NONE, NULL, { 0 } };  // the domain waccr sums values in (zeroed at its start)
    int              status = KVG_OK;

    int64_t bk = kvg_rows_find_block(kr, r0);
    int64_t bv = kvg_rows_find_block(vr, r0);
    for (int64_t row = r0; row < r1;) {
        const kvg_block * kb = &kr->blocks[bk];
        const kvg_block * vb = &vr->blocks[bv];
        const int64_t     ke = kb->row0 + kb->n_rows, ve = vb->row0 + vb->n_rows;
        const int64_t     e = ke < ve ? (ke < r1 ? ke : r1) : (ve < r1 ? ve : r1);

        // Everything that can fail is settled before the run touches the state.
        const kvg_codec_traits * tk = kvg_codec_traits_of(kb->codec);
        const kvg_codec_traits * tv = kvg_codec_traits_of(vb->codec);
        kvg_job                  jk, jv;
        size_t                   unused;
        int st = tk && tv ? KVG_OK
                          : kvg_fail(KVG_ERR_UNKNOWN_CODEC, "attend: block of codec %d or %d", kb->codec, vb->codec);
        if (st == KVG_OK) {
            const kvg_codec_params pk = kvg_store_list_params(s, (int64_t) il * 2, kb->codec, NULL);
            st                        = kvg_make_job(kb->codec, KVG_KIND_K, kb->n_rows, Hkv, dk, &pk, &jk, &unused);
        }
        if (st == KVG_OK) {
            const kvg_codec_params pv = kvg_store_list_params(s, (int64_t) il * 2 + 1, vb->codec, NULL);
            st                        = kvg_make_job(vb->codec, KVG_KIND_V, vb->n_rows, Hkv, dv, &pv, &jv, &unused);
        }
        if (st == KVG_OK && (kb->fail_reads || vb->fail_reads)) {
            st = kvg_fail(KVG_ERR_NO_MEMORY, "attend: injected read failure (kvg_store_debug_fail_reads)");
        }
        if (st == KVG_OK && ((tk->rotated && !kvg_rotq_get_book(dk)) || (tv->rotated && !kvg_rotq_get_book(dv)))) {
            st = kvg_fail(KVG_ERR_NO_MEMORY, "attend: rotq codebook missing");  // checked blocks have it built
        }
        const int kd = st == KVG_OK ? domain_of(tk, kb->codec) : DOM_NONE;
        const int vd = st == KVG_OK ? domain_of(tv, vb->codec) : DOM_NONE;
        if (kd == DOM_ROT && q_dom != DOM_ROT) {
            for (int64_t jj = 0; jj < n_q; jj++) {
                float * y = wqr + jj * dk;
                for (int64_t i = 0; i < dk; i++) {
                    y[i] = s->sgn[i] * wq[jj * dk + i];
                }
                kvg_fwht(y, dk);
            }
            q_dom = DOM_ROT;
        } else if (kd != DOM_NONE && kd != q_dom) {
            q_dom = DOM_NONE;  // wqr is being overwritten
            st    = tk->prepare_q(&jk, &a, wqr);
            q_dom = st == KVG_OK ? kd : DOM_NONE;
        }
        if (st == KVG_OK && vd != DOM_NONE && vd != vdom.dom) {
            st = finish_acc(s, &vdom, &a, dv);  // the sum so far goes to wacc before waccr changes domain
            memset(waccr, 0, (size_t) (n_q * dv) * sizeof(float));
            vdom.dom = vd;
            vdom.tr  = tv;
            vdom.job = jv;
        }

        // Chunks follow the K block's rows (its first chunk starts at its first row): a block
        // moved by a context shift of other than a multiple of KVG_MASS_ROWS keeps whole chunks
        // rather than each split in two at the granules. A chunk then spans two granules of the
        // mass at most, noted apart.
        _Static_assert(KVG_ATTN_CHUNK == KVG_MASS_ROWS, "a chunk spans two mass granules at most");
        for (int64_t c0 = row, n; st == KVG_OK && c0 < e; c0 += n) {
            n  = KVG_ATTN_CHUNK - (c0 - kb->row0) % KVG_ATTN_CHUNK;
            n  = e - c0 < n ? e - c0 : n;
            st = dense ? dense_chunk(KVG_KIND_K, tk, &jk, kb->data, c0 - kb->row0, n, &a, sc) : KVG_NOT_HANDLED;
            if (st == KVG_NOT_HANDLED) {
                st = run_score(tk, simd, &jk, kb->data, c0 - kb->row0, n, &a, sc);
            }
            if (st != KVG_OK) {
                break;  // these rows are left out; the state has not seen them
            }
            if (softcap > 0.0f) {
                kvg_attn_cap_scores(sc, n_q * n, softcap);
            }
            if (simd) {
                KVG_SIMD(kvg_attn_softmax)(&a, wm, wl, sc, n, dv, vdom.dom != DOM_NONE);
            } else {
                kvg_attn_softmax_ref(&a, wm, wl, sc, n, dv, vdom.dom != DOM_NONE);
            }
            if (notes) {
                const int64_t g = c0 / KVG_MASS_ROWS, in_g = (g + 1) * KVG_MASS_ROWS - c0;
                kvg_mass_note(notes, g, wm, sc, n, 0, in_g < n ? in_g : n);
                if (in_g < n) {
                    kvg_mass_note(notes, g + 1, wm, sc, n, in_g, n);
                }
            }
            // Kernels fail only on shapes that append refused; a failure here would leave the
            // chunk's weights in l without its values, so it is reported all the same.
            st = dense ? dense_chunk(KVG_KIND_V, tv, &jv, vb->data, c0 - vb->row0, n, &a, sc) : KVG_NOT_HANDLED;
            if (st == KVG_NOT_HANDLED) {
                st = run_accumulate(tv, simd, &jv, vb->data, c0 - vb->row0, n, sc, &a);
            }
        }
        if (st != KVG_OK && status == KVG_OK) {  // kvg_last_error() tells the first failure
            char why[160];
            snprintf(why, sizeof(why), "%s", kvg_last_error());
            status = kvg_fail(st, "attend: rows [%lld, %lld) of layer %d left out: %s", (long long) row, (long long) e,
                              (int) il, why);
        }
        row = e;
        bk += row == ke;
        bv += row == ve;
    }

    const int fst = finish_acc(s, &vdom, &a, dv);
    if (fst != KVG_OK && status == KVG_OK) {
        status = fst;
    }
    kvg_attn_scatter(wm, wl, wacc, n_tokens, n_head, gqa, dv, m, l, acc);
    return status;
}
