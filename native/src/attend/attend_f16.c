// attend_f16.c: attention over llama.cpp's f16 or q8_0 cells outside the store, under a mask (kvg_attend_f16).
//
// llama.cpp's fused path (native/llama/src/llama-kvgguf-graph.cpp) attends over the store's cold rows through
// kvg_store_hook_attend and over its own hot cells (the window of exact tokens, and the ubatch
// itself, causally masked) through this function, into the same online-softmax state. The patch
// is compiled without the CPU's vector extensions; here the cells take the same dense tiles as
// the store's rows (attend_simd.h): each chunk of 64 cells is converted to f32 once per KV head,
// scored against every query of that head as one small matrix product, masked, folded into the
// softmax and summed. Queries that see no cell of a chunk keep their state.

#include "kvg_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

// Whether cells are laid out as the f16 codec's rows: [cell][head][dim] halves, contiguous.
static int f16_rows(const size_t * nb, int64_t n_heads, int64_t D) {
    return nb[0] == 2 && nb[1] == (size_t) (2 * D) && nb[2] == (size_t) (2 * D * n_heads);
}

enum { Q8_0_BLOCK = 32, Q8_0_BYTES = 34 };  // ggml's block_q8_0: an f16 scale, 32 int8 codes

// The cells [c, c + n) of KV head hk as f32 rows out[t * D + i]: q8_0 cells block by block (scale
// times code, exact in f32; a loop the compiler vectorizes); f16 ones with one SIMD conversion per
// row where the rows are contiguous halves (llama.cpp's K, and V with flash attention), element by
// element for other strides (a transposed V).
static void cells_f32(int simd, int32_t type, const uint8_t * base, const size_t * nb, int64_t n_heads, int64_t D,
                      int64_t hk, int64_t c, int64_t n, float * out) {
    if (type == KVG_CELLS_Q8_0) {
        for (int64_t t = 0; t < n; t++) {
            const uint8_t * row = base + (size_t) hk * nb[1] + (size_t) (c + t) * nb[2];
            for (int64_t b = 0; b < D / Q8_0_BLOCK; b++) {
                const uint8_t * blk = row + (size_t) b * Q8_0_BYTES;
                const float     d   = kvg_f16_to_f32(kvg_get_u16(blk));
                const int8_t *  qs  = (const int8_t *) (blk + 2);
                float *         o   = out + t * D + b * Q8_0_BLOCK;
                for (int i = 0; i < Q8_0_BLOCK; i++) {
                    o[i] = d * (float) qs[i];
                }
            }
        }
        return;
    }
    if (simd && f16_rows(nb, n_heads, D)) {
        const kvg_job job = { .type       = KVG_CODEC_F16,
                              .bits       = 16,
                              .n_tokens   = c + n,
                              .n_heads    = n_heads,
                              .head_dim   = D,
                              .n_channels = n_heads * D };
        if (KVG_SIMD(kvg_dense_rows)(&job, base, c, n, hk, out) == KVG_OK) {
            return;
        }
    }
    for (int64_t t = 0; t < n; t++) {
        const uint8_t * row = base + (size_t) hk * nb[1] + (size_t) (c + t) * nb[2];
        for (int64_t i = 0; i < D; i++) {
            out[t * D + i] = kvg_f16_to_f32(kvg_get_u16(row + (size_t) i * nb[0]));
        }
    }
}

static float mask_at(const uint8_t * mask, int32_t mask_f16, size_t nb1, int64_t t, int64_t c) {
    const uint8_t * p = mask + (size_t) t * nb1 + (size_t) c * (mask_f16 ? 2 : 4);
    if (mask_f16) {
        return kvg_f16_to_f32(kvg_get_u16(p));
    }
    float x;
    memcpy(&x, p, sizeof(x));
    return x;
}

// Whether cells of this type and strides can be read: f16 at any strides; q8_0 as llama.cpp lays
// out a quantized cache (whole blocks per head, nb[0] the block's size).
static int cells_readable(int32_t type, const size_t * nb, int64_t D) {
    if (type == KVG_CELLS_F16) {
        return 1;
    }
    return type == KVG_CELLS_Q8_0 && D % Q8_0_BLOCK == 0 && nb[0] == Q8_0_BYTES &&
           nb[1] >= (size_t) (D / Q8_0_BLOCK * Q8_0_BYTES);
}

int32_t kvg_attend_f16(const float * q, int32_t n_tokens, int32_t n_head, int32_t n_head_kv, int64_t head_dim_k,
                       int64_t head_dim_v, const void * k, int32_t k_type, const size_t * k_nb, const void * v,
                       int32_t v_type, const size_t * v_nb, int64_t c0, int64_t c1, const void * mask, int32_t mask_f16,
                       size_t mask_nb1, float scale, float softcap, float * m, float * l, float * acc) {
    kvg_clear_error();
    if (!q || !k || !k_nb || !v || !v_nb || !m || !l || !acc) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend_f16: q, k, k_nb, v, v_nb, m, l and acc must not be NULL");
    }
    if (n_tokens <= 0 || n_head_kv <= 0 || n_head <= 0 || n_head % n_head_kv != 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "attend_f16: needs n_tokens > 0 and n_head a positive multiple of n_head_kv, got %d, %d, %d",
                        (int) n_tokens, (int) n_head, (int) n_head_kv);
    }
    if (head_dim_k <= 0 || head_dim_v <= 0 || head_dim_k > 4096 || head_dim_v > 4096 || c0 < 0 || c1 < c0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend_f16: head dims %lld, %lld or cells [%lld, %lld) out of range",
                        (long long) head_dim_k, (long long) head_dim_v, (long long) c0, (long long) c1);
    }
    if (!isfinite(scale) || !isfinite(softcap) || softcap < 0.0f) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "attend_f16: scale %g and softcap %g must be finite, softcap >= 0",
                        (double) scale, (double) softcap);
    }
    if (!cells_readable(k_type, k_nb, head_dim_k) || !cells_readable(v_type, v_nb, head_dim_v)) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "attend_f16: cells of ggml types %d (K) and %d (V) with these strides cannot be read: f16 (1) "
            "takes any strides, q8_0 (8) whole blocks of 34 bytes per head and head dims of multiples of 32",
            (int) k_type, (int) v_type);
    }
    if (c0 == c1) {
        return KVG_OK;
    }
    if (softcap > 0.0f) {
        scale /= softcap;
    }
    const int64_t Hkv = n_head_kv, dk = head_dim_k, dv = head_dim_v, dm = dk > dv ? dk : dv;
    const int64_t gqa = n_head / Hkv, P = (int64_t) n_tokens * gqa, n_q = (int64_t) n_tokens * n_head;
    if ((uint64_t) n_q * (uint64_t) (dm + 4 * KVG_ATTN_CHUNK) > ((uint64_t) 1 << 36)) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "attend_f16: %lld queries need too large a workspace", (long long) n_q);
    }
    const size_t n_ws =
        (size_t) (n_q * (dk + dv + 2 + KVG_ATTN_CHUNK) + n_tokens * KVG_ATTN_CHUNK + KVG_ATTN_TMP(n_q, dm));
    float * ws    = kvg_thread_scratch(KVG_SCRATCH_ATTEND, n_ws);
    float * cells = kvg_thread_scratch(KVG_SCRATCH_DENSE, (size_t) (2 * KVG_ATTN_CHUNK * dm));
    if (!ws || !cells) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "attend_f16: workspace of %zu floats", n_ws);
    }
    float * wq   = ws;                         // [n_q][dk]   scaled queries, by KV head
    float * wacc = wq + n_q * dk;              // [n_q][dv]
    float * wm   = wacc + n_q * dv;            // [n_q]
    float * wl   = wm + n_q;                   // [n_q]
    float * sc   = wl + n_q;                   // [n_q][CHUNK] scores, then weights
    float * mk   = sc + n_q * KVG_ATTN_CHUNK;  // [n_tokens][CHUNK] the chunk's mask, f32
    float * tmp  = mk + n_tokens * KVG_ATTN_CHUNK;

    kvg_attn_gather(q, m, l, acc, n_tokens, n_head, gqa, dk, dv, scale, wq, wm, wl, wacc);

    const int      simd = kvg_simd_on();
    const kvg_attn a    = { n_q, P, wq, wq, wacc, wacc, tmp };
    const uint8_t *kb = (const uint8_t *) k, *vb = (const uint8_t *) v, *mb = (const uint8_t *) mask;
    // A decode step's few queries per KV head: the f16 codec's per-row kernels, where the cells
    // are laid out as its rows are (llama.cpp's K, and V with flash attention on).
    const kvg_job jk = {
        .type = KVG_CODEC_F16, .bits = 16, .n_tokens = c1, .n_heads = Hkv, .head_dim = dk, .n_channels = Hkv * dk
    };
    const kvg_job jv = {
        .type = KVG_CODEC_F16, .bits = 16, .n_tokens = c1, .n_heads = Hkv, .head_dim = dv, .n_channels = Hkv * dv
    };
    const int rows_k = simd && P < KVG_DENSE_MIN_QUERIES && k_type == KVG_CELLS_F16 && f16_rows(k_nb, Hkv, dk);
    const int rows_v = simd && P < KVG_DENSE_MIN_QUERIES && v_type == KVG_CELLS_F16 && f16_rows(v_nb, Hkv, dv);
    for (int64_t c = c0; c < c1; c += KVG_ATTN_CHUNK) {
        const int64_t n  = c1 - c < KVG_ATTN_CHUNK ? c1 - c : KVG_ATTN_CHUNK;
        int           st = rows_k ? KVG_SIMD(kvg_f16_score)(&jk, kb, c, n, &a, sc) : KVG_NOT_HANDLED;
        for (int64_t hk = 0; hk < Hkv && st != KVG_OK; hk++) {
            cells_f32(simd, k_type, kb, k_nb, Hkv, dk, hk, c, n, cells);
            const float * qh = wq + hk * P * dk;
            float *       sh = sc + hk * P * n;
            if (simd) {
                KVG_SIMD(kvg_dense_score)(qh, P, cells, n, dk, cells + KVG_ATTN_CHUNK * dm, sh, n);
            } else {
                for (int64_t p = 0; p < P; p++) {
                    for (int64_t t = 0; t < n; t++) {
                        float s = 0.0f;
                        for (int64_t i = 0; i < dk; i++) {
                            s += qh[p * dk + i] * cells[t * dk + i];
                        }
                        sh[p * n + t] = s;
                    }
                }
            }
        }
        if (softcap > 0.0f) {
            kvg_attn_cap_scores(sc, n_q * n, softcap);
        }
        if (mb) {  // the mask depends on the token alone: converted once per chunk
            for (int64_t t = 0; t < n_tokens; t++) {
                for (int64_t i = 0; i < n; i++) {
                    mk[t * n + i] = mask_at(mb, mask_f16, mask_nb1, t, c + i);
                }
            }
            for (int64_t jj = 0; jj < n_q; jj++) {
                float *       sj = sc + jj * n;
                const float * mt = mk + ((jj % P) / gqa) * n;
                for (int64_t i = 0; i < n; i++) {
                    sj[i] += mt[i];
                }
            }
        }
        if (simd) {
            KVG_SIMD(kvg_attn_softmax)(&a, wm, wl, sc, n, dv, 0);
        } else {
            kvg_attn_softmax_ref(&a, wm, wl, sc, n, dv, 0);
        }
        st = rows_v ? KVG_SIMD(kvg_f16_accumulate)(&jv, vb, c, n, sc, &a) : KVG_NOT_HANDLED;
        for (int64_t hk = 0; hk < Hkv && st != KVG_OK; hk++) {
            cells_f32(simd, v_type, vb, v_nb, Hkv, dv, hk, c, n, cells);
            const float * wh = sc + hk * P * n;
            float *       ah = wacc + hk * P * dv;
            if (simd && dv % 8 == 0) {
                KVG_SIMD(kvg_dense_accumulate)(wh, n, P, cells, n, dv, ah);
            } else {
                for (int64_t p = 0; p < P; p++) {
                    for (int64_t t = 0; t < n; t++) {
                        const float w = wh[p * n + t];
                        for (int64_t i = 0; i < dv && w != 0.0f; i++) {
                            ah[p * dv + i] += w * cells[t * dv + i];
                        }
                    }
                }
            }
        }
    }

    kvg_attn_scatter(wm, wl, wacc, n_tokens, n_head, gqa, dv, m, l, acc);
    return KVG_OK;
}
