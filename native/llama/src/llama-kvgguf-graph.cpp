// [kvgguf] kvgguf's part of the compute graph: cold K/V rows that live outside llama.cpp's cells,
// in a store that kvgguf reaches through the hooks of include/llama-kvgguf.h. The two build_attn()
// of src/llama-graph.cpp that use a KV cache call kv_cold_record_path() and build_attn_kv_cold();
// everything those build is here: the expanding path (K, V and the mask become [cold rows decoded
// to f16 | hot cells] before build_attn_mha) and the fused attention (two custom ops over [cold
// rows as stored | hot cells]). The llm_graph_context members are declared in llama-graph.h.

#include "llama-kvgguf-graph.h"

#include "llama-cparams.h"
#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <mutex>

//
// [kvgguf] cold K/V rows
//

// [kvgguf 0020] layer il's shifted runs among its first n_cold cold rows, as the hooks report them
// (none without a shifts hook, or on an error: the rows are then scored as they are)
static std::vector<llm_kv_cold_run> llm_kv_cold_runs(const llama_kvgguf_hooks * hooks, int32_t il, int64_t n_cold) {
    std::vector<llm_kv_cold_run> runs;
    if (!hooks->shifts || n_cold == 0) {
        return runs;
    }
    int32_t n = hooks->shifts(hooks->user, il, 0, nullptr, nullptr, nullptr);
    if (n <= 0) {
        return runs;
    }
    std::vector<int64_t> r0(n), r1(n);
    std::vector<int32_t> sh(n);
    n = std::min(n, hooks->shifts(hooks->user, il, n, r0.data(), r1.data(), sh.data()));
    for (int32_t i = 0; i < n; ++i) {
        const int64_t a = std::max<int64_t>(0, r0[i]), b = std::min(r1[i], n_cold);
        if (a < b && sh[i] != 0) {
            runs.push_back({ a, b, sh[i] });
        }
    }
    return runs;
}

bool llm_graph_input_kv_cold::can_reuse(const llm_graph_params & params) {
    if (params.kv_cold != hooks || hooks == nullptr) {
        return false;
    }

    for (const auto & l : layers) {
        const int64_t n_cur = std::max<int32_t>(0, hooks->n_cold(hooks->user, l.il));
        if (n_cur != l.n_cold || (l.rope && llm_kv_cold_runs(hooks, l.il, n_cur) != l.runs)) {
            return false;
        }
    }

    return true;
}

void llm_graph_input_kv_cold::set_input(const llama_ubatch * ubatch) {
    GGML_UNUSED(ubatch);
    for (const auto & [t, pos] : shift_pos) {
        if (t->buffer) {
            ggml_backend_tensor_set(t, pos.data(), 0, pos.size() * sizeof(int32_t));
        }
    }
}

// [kvgguf 0020] x [D, H, n], its i-th column rotated by shifts[i] more positions with layer il's
// RoPE, the parameters llama_kv_cache::build_rope_shift gives llama.cpp's own shift of the cells:
// the same rotation moves a query forward as llama.cpp's seq_add moves a key back (RoPE scores
// depend on q's position minus k's)
static ggml_tensor * llm_kv_cold_rope(const llm_graph_context & g, llm_graph_input_kv_cold * inp, ggml_tensor * x,
                                      std::vector<int32_t> shifts, int il) {
    GGML_ASSERT((int64_t) shifts.size() == x->ne[2]);
    const auto & cparams   = g.cparams;
    const auto & hparams   = g.hparams;
    const auto & model     = *g.kv_cold_model;
    const auto   rope_type = hparams.rope_type == LLAMA_ROPE_TYPE_MROPE || hparams.rope_type == LLAMA_ROPE_TYPE_IMROPE
                                 ? LLAMA_ROPE_TYPE_NEOX
                                 : hparams.rope_type;

    ggml_tensor * pos = ggml_new_tensor_1d(g.ctx0, GGML_TYPE_I32, x->ne[2]);
    ggml_set_input(pos);
    inp->shift_pos.emplace_back(pos, std::move(shifts));

    return ggml_rope_ext(g.ctx0, x, pos, model.get_rope_factors(cparams, il), hparams.n_rot(il), rope_type,
                         cparams.n_ctx_orig_yarn, model.get_rope_freq_base(cparams, il),
                         model.get_rope_freq_scale(cparams, il), cparams.yarn_ext_factor, cparams.yarn_attn_factor,
                         cparams.yarn_beta_fast, cparams.yarn_beta_slow);
}

llm_kv_cold_op * llm_graph_input_kv_cold::add_op(int32_t il, int32_t kind, int64_t n_cold, bool v_trans) {
    ops.push_back(std::make_unique<llm_kv_cold_op>(llm_kv_cold_op{ hooks, il, kind, n_cold, v_trans, n_errors }));
    return ops.back().get();
}

static void llm_kv_cold_decode(const llm_kv_cold_op * op, int64_t r0, int64_t r1, uint16_t * dst, int64_t n_embd) {
    const auto * hooks = op->hooks;
    if (r1 <= r0) {
        return;
    }
    const int32_t rc = hooks->decode(hooks->user, op->il, op->kind, r0, r1, dst, n_embd);
    if (rc != 0) {
        memset(dst, 0, (size_t) (r1 - r0) * n_embd * sizeof(uint16_t));
        if (op->n_errors) {
            op->n_errors->fetch_add(1, std::memory_order_relaxed);
        }
    }
}

// note: in this ggml version the CPU backend calls a GGML_OP_CUSTOM node on EVERY thread of the
// threadpool with nth = n_threads (the n_tasks given to ggml_custom_4d only caps the number of threads
// of the whole graph plan, see ggml_graph_compute_thread / ggml_graph_plan in ggml-cpu.c), so the
// number of concurrent decode() calls is limited here, while the hot copy uses all threads
static void llm_kv_cold_thread_range(const llm_kv_cold_op * op, int64_t n, int ith, int nth, int64_t & r0,
                                     int64_t & r1) {
    const int nd = op->hooks->n_threads > 0 ? std::min(nth, (int) op->hooks->n_threads) : nth;
    if (ith >= nd) {
        r0 = r1 = 0;
        return;
    }
    r0 = (n * ith) / nd;
    r1 = (n * (ith + 1)) / nd;
}

// [kvgguf 0012] hot cells of a quantized cache (q8_0): n rows of n_embd values, head h of row r
// at src + r*nb2 + h*nb1 (each head's D values one run of the type's blocks), as f16 rows of
// n_embd values. ggml's own dequantization (exact in f32 for q8_0), then rounded to f16 as the
// f16 kernels read them.
static void llm_kv_cold_rows_to_f16(const ggml_tensor * t, const char * src, int64_t n, int64_t D, int64_t H,
                                    size_t nb1, size_t nb2, uint16_t * out) {
    const auto *                           traits = ggml_get_type_traits(t->type);
    static thread_local std::vector<float> row;
    row.resize(D);
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t h = 0; h < H; ++h) {
            traits->to_float(src + r * nb2 + h * nb1, row.data(), D);
            ggml_fp32_to_fp16_row(row.data(), (ggml_fp16_t *) out + (r * H + h) * D, D);
        }
    }
}

// dst = [cold rows | hot rows], src[0] = hot view of the KV cache (as returned by get_k/get_v)
//   K, V (!v_trans): dst [D, H, n_cold + n_kv, 1] f16 contiguous, hot [D, H, n_kv, 1]
//   V ( v_trans)   : dst [n_cold + n_kv, D, H, 1] f16 contiguous, hot [n_kv, H, D, 1] (strided)
static void llm_kv_cold_kv_fn(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto *        op  = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * hot = dst->src[0];

    const int64_t n_cold = op->n_cold;

    GGML_ASSERT(dst->type == GGML_TYPE_F16 && (hot->type == GGML_TYPE_F16 || !op->v_trans));

    if (!op->v_trans) {
        const int64_t D      = dst->ne[0];
        const int64_t H      = dst->ne[1];
        const int64_t n_embd = D * H;
        const int64_t n_kv   = hot->ne[2];

        uint16_t * out = (uint16_t *) dst->data;

        // cold rows: decoded straight into the output rows
        {
            int64_t r0, r1;
            llm_kv_cold_thread_range(op, n_cold, ith, nth, r0, r1);

            const int64_t step = op->hooks->max_rows_per_call > 0 ? op->hooks->max_rows_per_call : (r1 - r0);
            for (int64_t r = r0; r < r1; r += step) {
                const int64_t re = std::min(r + step, r1);
                llm_kv_cold_decode(op, r, re, out + r * n_embd, n_embd);
            }
        }

        // hot rows: copy from the cache view (rows of D contiguous elements)
        {
            const int64_t r0 = (n_kv * ith) / nth;
            const int64_t r1 = (n_kv * (ith + 1)) / nth;

            const bool rows_contig =
                hot->nb[1] == (size_t) D * sizeof(uint16_t) && hot->nb[2] == (size_t) n_embd * sizeof(uint16_t);
            if (hot->type != GGML_TYPE_F16) {
                llm_kv_cold_rows_to_f16(hot, (const char *) hot->data + r0 * hot->nb[2], r1 - r0, D, H, hot->nb[1],
                                        hot->nb[2], out + (n_cold + r0) * n_embd);
            } else if (rows_contig) {
                if (r1 > r0) {
                    memcpy(out + (n_cold + r0) * n_embd, (const char *) hot->data + r0 * hot->nb[2],
                           (size_t) (r1 - r0) * n_embd * sizeof(uint16_t));
                }
            } else {
                for (int64_t r = r0; r < r1; ++r) {
                    for (int64_t h = 0; h < H; ++h) {
                        memcpy(out + (n_cold + r) * n_embd + h * D,
                               (const char *) hot->data + r * hot->nb[2] + h * hot->nb[1], D * sizeof(uint16_t));
                    }
                }
            }
        }
        return;
    }

    // transposed V: element (cell c, dim d, head h) at out[(h*D + d)*N + c]
    const int64_t N      = dst->ne[0];
    const int64_t D      = dst->ne[1];
    const int64_t H      = dst->ne[2];
    const int64_t n_embd = D * H;
    const int64_t n_kv   = hot->ne[0];

    GGML_ASSERT(N == n_cold + n_kv);

    uint16_t * out = (uint16_t *) dst->data;

    // cold rows: decode blocks of rows into a scratch buffer, then scatter-transpose
    {
        int64_t r0, r1;
        llm_kv_cold_thread_range(op, n_cold, ith, nth, r0, r1);

        const int64_t step = op->hooks->max_rows_per_call > 0 ? op->hooks->max_rows_per_call : 256;

        static thread_local std::vector<uint16_t> scratch;
        scratch.resize((size_t) step * n_embd);

        for (int64_t r = r0; r < r1; r += step) {
            const int64_t re = std::min(r + step, r1);
            llm_kv_cold_decode(op, r, re, scratch.data(), n_embd);
            for (int64_t e = 0; e < n_embd; ++e) {
                uint16_t * o = out + e * N;
                for (int64_t i = r; i < re; ++i) {
                    o[i] = scratch[(i - r) * n_embd + e];
                }
            }
        }
    }

    // hot part: one contiguous run of n_kv elements per (head, dim)
    {
        const int64_t e0 = (n_embd * ith) / nth;
        const int64_t e1 = (n_embd * (ith + 1)) / nth;

        for (int64_t e = e0; e < e1; ++e) {
            const int64_t h = e / D;
            const int64_t d = e % D;
            memcpy(out + e * N + n_cold, (const char *) hot->data + h * hot->nb[1] + d * hot->nb[2],
                   n_kv * sizeof(uint16_t));
        }
    }
}

// dst = [0 ... 0 | hot mask row] for every row; src[0] = hot KQ mask (contiguous, F16 or F32)
static void llm_kv_cold_mask_fn(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto *        op  = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * hot = dst->src[0];

    GGML_ASSERT(dst->type == hot->type);
    GGML_ASSERT(ggml_is_contiguous(hot));

    const size_t  ts     = ggml_type_size(dst->type);
    const int64_t n_cold = op->n_cold;
    const int64_t n_kv   = hot->ne[0];
    const int64_t nrows  = ggml_nrows(dst);

    const int64_t i0 = (nrows * ith) / nth;
    const int64_t i1 = (nrows * (ith + 1)) / nth;

    for (int64_t i = i0; i < i1; ++i) {
        char * o = (char *) dst->data + i * dst->nb[1];  // rows are contiguous: nb[1]*ne[1] == nb[2], ...
        memset(o, 0, n_cold * ts);                       // 0 == visible, for both F16 and F32
        memcpy(o + n_cold * ts, (const char *) hot->data + i * hot->nb[1], n_kv * ts);
    }
}

// ---- [kvgguf] fused decode attention over [cold rows as stored | hot cells] ----
//
// Two custom ops. The first splits the n_cold cold rows into n_part/2 chunks and the n_kv hot cells
// into as many (thread ith takes chunks ith, ith + nth, ...; n_part is fixed when the graph is
// built, nth may differ at run time)
// and writes per chunk the online-softmax state of every (token, head): acc [T*H*Dv], m [T*H],
// l [T*H]. Cold rows go through the store's attend hook, which scores them from their codes; hot
// cells are f16 dot products under the ubatch's mask. The second op merges the chunks in
// log-sum-exp form into the attention output [Dv, H, T], the layout build_attn_mha returns.

enum { LLM_KV_COLD_MASK = 2, LLM_KV_COLD_ATTN = 3, LLM_KV_COLD_MERGE = 4 };

static float llm_kv_cold_mask_at(const ggml_tensor * mask, int64_t t, int64_t c, const void * data = nullptr) {
    const char * p = (const char *) (data ? data : mask->data) + t * mask->nb[1] + c * mask->nb[0];
    return mask->type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
}

static float llm_kv_cold_dot(const float * a, const float * b, int64_t n) {
    float   s[8] = { 0 };  // eight running sums so that the compiler may vectorize without -ffast-math
    int64_t i    = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) {
            s[j] += a[i + j] * b[i + j];
        }
    }
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; ++i) {
        r += a[i] * b[i];
    }
    return r;
}

// x rounded to the nearest f16 (ties to even; f16's subnormals, and infinity past 65504), as
// ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)) gives it but inline: those are calls into ggml-base
// for each value, and every query set of every layer and thread passes through here.
static inline float llm_kv_cold_round_f16(float x) {
    const float a = std::fabs(x);
    if (!(a < 65520.0f)) {  // rounds past f16's largest, or is inf or NaN already
        return std::isnan(x) ? x : std::copysign(INFINITY, x);
    }
    if (a < 6.103515625e-05f) {  // below 2^-14: f16's subnormals, multiples of 2^-24
        return std::nearbyint(x * 16777216.0f) * (1.0f / 16777216.0f);
    }
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    u += 0x0fffu + ((u >> 13) & 1u);  // 23 mantissa bits to 10, the carry into the exponent kept
    u &= ~0x1fffu;
    float r;
    std::memcpy(&r, &u, sizeof(r));
    return r;
}

// [kvgguf 0020] rows [a, b) of the cold rows into the chunk's state, each through the store's attend
// hook with its queries: qset(0) the ubatch's, qset(1 + op->q_src[i]) rotated for shifted run i
template <typename QSet>
static void llm_kv_cold_attend_rows(const llm_kv_cold_op * op, int64_t a, int64_t b, const QSet & qset, int64_t T,
                                    int64_t H, float * m, float * l, float * acc) {
    const auto call = [&](int64_t x, int64_t y, const float * qs) {
        if (y <= x) {
            return;
        }
        const int32_t rc =
            op->attend(op->hooks->user, op->il, x, y, qs, (int32_t) T, (int32_t) H, op->scale, op->softcap, m, l, acc);
        if (rc != 0 && op->n_errors) {
            op->n_errors->fetch_add(1, std::memory_order_relaxed);
        }
    };
    int64_t at = a;
    for (size_t i = 0; i < op->runs.size() && at < b; ++i) {
        const auto & run = op->runs[i];
        if (run.r1 <= at) {
            continue;
        }
        if (run.r0 >= b) {
            break;
        }
        const int64_t x = std::max(at, run.r0), y = std::min(b, run.r1);
        call(at, x, qset(0));
        call(x, y, qset(1 + op->q_src[i]));
        at = y;
    }
    call(at, b, qset(0));
}

static void llm_kv_cold_attn_fn(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto *        op   = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * q    = dst->src[0];  // [Dk, H, T] f32
    const ggml_tensor * k    = dst->src[1];  // hot [Dk, Hkv, n_kv] f16
    const ggml_tensor * v    = dst->src[2];  // hot [Dv, Hkv, n_kv] f16, or transposed [n_kv, Hkv, Dv]
    const ggml_tensor * mask = dst->src[3];  // [n_kv, >= T] f16 or f32

    const int64_t Dk = q->ne[0], H = q->ne[1], T = q->ne[2];
    const int64_t Hkv     = k->ne[1];
    const bool    v_trans = op->v_trans;
    const int64_t n_kv    = k->ne[2];
    const int64_t Dv      = v_trans ? v->ne[2] : v->ne[0];
    const int64_t gqa     = H / Hkv;
    const int64_t n_cold  = op->n_cold;
    const int64_t n_part  = dst->ne[1];
    const int64_t nq      = T * H;

    // the queries: set 0 the ubatch's, set 1 + s the ones rotated for shift s (source 4, T columns
    // each), copied by each thread when its rows first need the set
    static thread_local std::vector<std::vector<float>> qsets;
    static thread_local std::vector<char>               ready;
    static thread_local std::vector<float>              krow, vrow;
    const int64_t n_sets = 1 + (op->q_src.empty() ? 0 : *std::max_element(op->q_src.begin(), op->q_src.end()) + 1);
    if ((int64_t) qsets.size() < n_sets) {
        qsets.resize(n_sets);
    }
    ready.assign(n_sets, 0);
    krow.resize(Hkv * Dk);
    vrow.resize(Hkv * Dv);
    const auto qset = [&](int64_t k_set) -> const float * {
        std::vector<float> & out = qsets[k_set];
        if (!ready[k_set]) {
            ready[k_set]           = 1;
            const ggml_tensor * qt = k_set == 0 ? q : dst->src[4];
            const int64_t       t0 = k_set == 0 ? 0 : (k_set - 1) * T;
            out.resize(nq * Dk);
            for (int64_t t = 0; t < T; ++t) {
                for (int64_t h = 0; h < H; ++h) {
                    for (int64_t i = 0; i < Dk; ++i) {
                        // rounded to f16 as llama.cpp's attention does with an f16 cache (its K.Q dot
                        // products take f16 queries), so f16 cold rows give what the expanding path gives
                        const float x = *(const float *) ((const char *) qt->data + i * qt->nb[0] + h * qt->nb[1] +
                                                          (t0 + t) * qt->nb[2]);
                        out[(t * H + h) * Dk + i] = llm_kv_cold_round_f16(x);
                    }
                }
            }
        }
        return out.data();
    };
    const float * qbuf = qset(0);

    for (int64_t p = ith; p < n_part; p += nth) {
        float * acc = (float *) ((char *) dst->data + p * dst->nb[1]);
        float * m   = acc + nq * Dv;
        float * l   = m + nq;
        std::fill(acc, acc + nq * Dv, 0.0f);
        std::fill(m, m + nq, -INFINITY);
        std::fill(l, l + nq, 0.0f);

        // [kvgguf 0009] the first half of the chunks splits the cold rows, the second half the hot
        // cells, each evenly, so that every thread gets its share of both: a hot cell (scalar f16
        // dot products here) costs several cold rows (the store's SIMD kernels), and one even split
        // of [cold | hot] left the thread holding the hot cells working while the others waited.
        const int64_t n_half = n_part / 2;
        const int64_t r0     = p < n_half ? (n_cold * p) / n_half : n_cold + (n_kv * (p - n_half)) / (n_part - n_half);
        const int64_t r1 =
            p < n_half ? (n_cold * (p + 1)) / n_half : n_cold + (n_kv * (p + 1 - n_half)) / (n_part - n_half);

        if (r0 < n_cold) {
            llm_kv_cold_attend_rows(op, r0, std::min(r1, n_cold), qset, T, H, m, l, acc);
        }

        if (r1 <= n_cold) {
            continue;
        }

        // the chunk's hot cells [c0, c1): the cache's own rows (f16, or q8_0 that attend_f16 reads),
        // or, for the loop below on a quantized cache, this chunk's rows as f16 in a scratch buffer,
        // read from 0 with the mask shifted to match
        int64_t      c0 = std::max(r0, n_cold) - n_cold, c1 = r1 - n_cold;
        const char * kd      = (const char *) k->data;
        const char * vd      = (const char *) v->data;
        const void * md      = mask->data;
        size_t       k_nb[3] = { k->nb[0], k->nb[1], k->nb[2] };
        size_t       v_nb[3] = { v_trans ? v->nb[2] : v->nb[0], v->nb[1], v_trans ? v->nb[0] : v->nb[2] };
        // (kvgguf's kernels read q8_0 cells themselves: set 13)
        if ((k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16) && !op->attend_f16) {
            static thread_local std::vector<uint16_t> khot, vhot;
            khot.resize((size_t) (c1 - c0) * Hkv * Dk);
            vhot.resize((size_t) (c1 - c0) * Hkv * Dv);
            llm_kv_cold_rows_to_f16(k, kd + c0 * k->nb[2], c1 - c0, Dk, Hkv, k->nb[1], k->nb[2], khot.data());
            llm_kv_cold_rows_to_f16(v, vd + c0 * v->nb[2], c1 - c0, Dv, Hkv, v->nb[1], v->nb[2], vhot.data());
            kd      = (const char *) khot.data();
            vd      = (const char *) vhot.data();
            k_nb[0] = v_nb[0] = sizeof(uint16_t);
            k_nb[1]           = Dk * sizeof(uint16_t);
            k_nb[2]           = Hkv * Dk * sizeof(uint16_t);
            v_nb[1]           = Dv * sizeof(uint16_t);
            v_nb[2]           = Hkv * Dv * sizeof(uint16_t);
            md                = (const char *) mask->data + c0 * mask->nb[0];
            c1 -= c0;
            c0 = 0;
        }

        // [kvgguf 0010] the hot cells through kvgguf's SIMD kernels (this file is built without the
        // CPU's vector extensions): one call per chunk, masked as below
        if (op->attend_f16) {
            const int32_t rc =
                op->attend_f16(qbuf, (int32_t) T, (int32_t) H, (int32_t) Hkv, Dk, Dv, kd, (int32_t) k->type, k_nb, vd,
                               (int32_t) v->type, v_nb, c0, c1, md, mask->type == GGML_TYPE_F16, mask->nb[1], op->scale,
                               op->softcap, m, l, acc);
            if (rc != 0 && op->n_errors) {
                op->n_errors->fetch_add(1, std::memory_order_relaxed);
            }
            continue;
        }

        for (int64_t c = c0; c < c1; ++c) {
            bool seen = false;
            for (int64_t t = 0; t < T && !seen; ++t) {
                seen = llm_kv_cold_mask_at(mask, t, c, md) != -INFINITY;
            }
            if (!seen) {
                continue;
            }
            for (int64_t hk = 0; hk < Hkv; ++hk) {
                ggml_fp16_to_fp32_row((const ggml_fp16_t *) (kd + c * k_nb[2] + hk * k_nb[1]), krow.data() + hk * Dk,
                                      Dk);
                if (!v_trans) {
                    ggml_fp16_to_fp32_row((const ggml_fp16_t *) (vd + c * v_nb[2] + hk * v_nb[1]),
                                          vrow.data() + hk * Dv, Dv);
                } else {
                    for (int64_t d = 0; d < Dv; ++d) {
                        vrow[hk * Dv + d] =
                            ggml_fp16_to_fp32(*(const ggml_fp16_t *) (vd + c * v_nb[2] + hk * v_nb[1] + d * v_nb[0]));
                    }
                }
            }
            for (int64_t t = 0; t < T; ++t) {
                const float mv = llm_kv_cold_mask_at(mask, t, c, md);
                if (mv == -INFINITY) {
                    continue;
                }
                for (int64_t h = 0; h < H; ++h) {
                    const int64_t j  = t * H + h;
                    const float * kr = krow.data() + (h / gqa) * Dk;
                    const float * vr = vrow.data() + (h / gqa) * Dv;
                    float         s  = op->scale * llm_kv_cold_dot(qbuf + j * Dk, kr, Dk);
                    if (op->softcap > 0.0f) {
                        s = op->softcap * tanhf(s / op->softcap);  // as ggml's flash attention caps
                    }
                    s += mv;
                    float * a = acc + j * Dv;
                    if (s > m[j]) {
                        const float corr = expf(m[j] - s);  // 0 when m[j] is -inf
                        l[j]             = l[j] * corr + 1.0f;
                        for (int64_t d = 0; d < Dv; ++d) {
                            a[d] = a[d] * corr + vr[d];
                        }
                        m[j] = s;
                    } else {
                        const float w = expf(s - m[j]);
                        l[j] += w;
                        for (int64_t d = 0; d < Dv; ++d) {
                            a[d] += w * vr[d];
                        }
                    }
                }
            }
        }
    }
}

// An attention sink: a logit per head that takes part in the softmax's normalizer with no value
// (gpt-oss, granite-swa), as ggml_soft_max_add_sinks and ggml_flash_attn_ext_add_sinks give it.
static float llm_kv_cold_sink(const ggml_tensor * sinks, int64_t h) {
    return sinks ? *(const float *) ((const char *) sinks->data + h * sinks->nb[0]) : -INFINITY;
}

// dst [Dv, H, T] f32; src[0] = the partial states [T*H*(Dv + 2), n_part]; src[1] = sinks [H] f32 or none
static void llm_kv_cold_merge_fn(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto *        op     = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * parts  = dst->src[0];
    const ggml_tensor * sinks  = dst->src[1];
    const int64_t       Dv     = dst->ne[0];
    const int64_t       H      = dst->ne[1];
    const int64_t       nq     = dst->ne[1] * dst->ne[2];
    const int64_t       n_part = parts->ne[1];

    if (ith == 0 && op->mass) {
        // every query's final normalizers, for the store's attention mass (one thread: n_part reads per query)
        static thread_local std::vector<float> mx, sm;
        mx.assign(nq, -INFINITY);
        sm.assign(nq, 0.0f);
        for (int64_t j = 0; j < nq; ++j) {
            mx[j] = llm_kv_cold_sink(sinks, j % H);
            sm[j] = sinks ? 1.0f : 0.0f;  // exp(sink - max) with the sink as the first max
        }
        for (int64_t p = 0; p < n_part; ++p) {
            const float * mp = (const float *) ((const char *) parts->data + p * parts->nb[1]) + nq * Dv;
            for (int64_t j = 0; j < nq; ++j) {
                if (mp[j] > mx[j]) {
                    sm[j] *= expf(mx[j] - mp[j]);
                    mx[j] = mp[j];
                }
            }
        }
        for (int64_t p = 0; p < n_part; ++p) {
            const float * mp = (const float *) ((const char *) parts->data + p * parts->nb[1]) + nq * Dv;
            const float * lp = mp + nq;
            for (int64_t j = 0; j < nq; ++j) {
                if (mp[j] != -INFINITY) {
                    sm[j] += expf(mp[j] - mx[j]) * lp[j];
                }
            }
        }
        const int32_t rc =
            op->mass(op->hooks->user, op->il, (int32_t) dst->ne[2], (int32_t) dst->ne[1], mx.data(), sm.data());
        if (rc != 0 && op->n_errors) {
            op->n_errors->fetch_add(1, std::memory_order_relaxed);
        }
    }

    const int64_t j0 = (nq * ith) / nth;
    const int64_t j1 = (nq * (ith + 1)) / nth;
    for (int64_t j = j0; j < j1; ++j) {
        float * out = (float *) dst->data + j * Dv;
        float   M   = -INFINITY;
        for (int64_t p = 0; p < n_part; ++p) {
            const float * mp = (const float *) ((const char *) parts->data + p * parts->nb[1]) + nq * Dv;
            M                = std::max(M, mp[j]);
        }
        std::fill(out, out + Dv, 0.0f);
        if (M == -INFINITY) {
            continue;  // every row masked
        }
        const float S = llm_kv_cold_sink(sinks, j % H);
        M             = std::max(M, S);
        float L       = sinks ? expf(S - M) : 0.0f;
        for (int64_t p = 0; p < n_part; ++p) {
            const float * ap = (const float *) ((const char *) parts->data + p * parts->nb[1]);
            const float * mp = ap + nq * Dv;
            const float * lp = mp + nq;
            if (mp[j] == -INFINITY) {
                continue;
            }
            const float w = expf(mp[j] - M);
            L += w * lp[j];
            for (int64_t d = 0; d < Dv; ++d) {
                out[d] += w * ap[j * Dv + d];
            }
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int64_t d = 0; d < Dv; ++d) {
            out[d] *= inv;
        }
    }
}

// [kvgguf 0015] The fused path on a GPU: ggml-cuda runs the two ops above through these where the
// layer's cells live in its memory (patch 0006's dispatch, keyed by the CPU functions). Built with
// one part (build_attn_kv_cold_fused), the attention op's state is the whole layer's: the
// context's llama_kvgguf_cuda hooks queue it, then the output, on ggml-cuda's stream. The store's
// attention mass is not reported from a GPU layer.
static bool llm_kv_cold_cuda_layer(const llm_kv_cold_op * op, int device) {
    return op && op->cuda && op->cuda->supports(op->cuda->user, op->il, device) == 1;
}

static bool llm_kv_cold_attn_cuda_supports(const ggml_tensor * node, int device, void * userdata) {
    const auto *        op    = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * k     = node->src[1];
    const ggml_tensor * v     = node->src[2];
    const bool          cells = (k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_Q8_0) &&
                                (v->type == GGML_TYPE_F16 || v->type == GGML_TYPE_Q8_0);
    // (shifted runs: the GPU kernels take no rotated queries yet, so the CPU computes the node)
    return node->ne[1] == 1 && cells && node->src[0]->type == GGML_TYPE_F32 && op->runs.empty() &&
           llm_kv_cold_cuda_layer(op, device);
}

static bool llm_kv_cold_merge_cuda_supports(const ggml_tensor * node, int device, void * userdata) {
    const auto * op = (const llm_kv_cold_op *) userdata;
    return node->src[0]->ne[1] == 1 && op->runs.empty() && llm_kv_cold_cuda_layer(op, device);
}

static int llm_kv_cold_attn_cuda(ggml_tensor * dst, int device, void * stream, void * userdata) {
    const auto *        op      = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * q       = dst->src[0];
    const ggml_tensor * k       = dst->src[1];
    const ggml_tensor * v       = dst->src[2];
    const ggml_tensor * mask    = dst->src[3];
    const bool          v_trans = op->v_trans;

    llama_kvgguf_cuda_attn a = {};
    a.il                     = op->il;
    a.n_cold                 = op->n_cold;
    a.q                      = q->data;
    a.q_nb[0]                = q->nb[0];
    a.q_nb[1]                = q->nb[1];
    a.q_nb[2]                = q->nb[2];
    a.n_tokens               = (int32_t) q->ne[2];
    a.n_head                 = (int32_t) q->ne[1];
    a.n_head_kv              = (int32_t) k->ne[1];
    a.head_dim_k             = q->ne[0];
    a.head_dim_v             = v_trans ? v->ne[2] : v->ne[0];
    a.k                      = k->data;
    a.k_type                 = (int32_t) k->type;
    a.k_nb[0]                = k->nb[0];
    a.k_nb[1]                = k->nb[1];
    a.k_nb[2]                = k->nb[2];
    a.v                      = v->data;
    a.v_type                 = (int32_t) v->type;
    a.v_nb[0]                = v_trans ? v->nb[2] : v->nb[0];
    a.v_nb[1]                = v->nb[1];
    a.v_nb[2]                = v_trans ? v->nb[0] : v->nb[2];
    a.n_kv                   = k->ne[2];
    a.mask                   = mask->data;
    a.mask_f16               = mask->type == GGML_TYPE_F16;
    a.mask_nb1               = mask->nb[1];
    a.scale                  = op->scale;
    a.softcap                = op->softcap;
    const int64_t nq         = (int64_t) a.n_tokens * a.n_head;
    a.acc                    = (float *) dst->data;
    a.m                      = a.acc + nq * a.head_dim_v;
    a.l                      = a.m + nq;
    const int32_t rc         = op->cuda->attend(op->cuda->user, &a, (int32_t) device, stream);
    if (rc != 0 && op->n_errors) {
        op->n_errors->fetch_add(1, std::memory_order_relaxed);
    }
    return rc;
}

static int llm_kv_cold_merge_cuda(ggml_tensor * dst, int device, void * stream, void * userdata) {
    const auto *        op    = (const llm_kv_cold_op *) userdata;
    const ggml_tensor * parts = dst->src[0];
    const ggml_tensor * sinks = dst->src[1];
    const int64_t       Dv    = dst->ne[0];
    const int64_t       nq    = dst->ne[1] * dst->ne[2];

    llama_kvgguf_cuda_finish f = {};
    f.acc                      = (const float *) parts->data;
    f.m                        = f.acc + nq * Dv;
    f.l                        = f.m + nq;
    f.n_tokens                 = (int32_t) dst->ne[2];
    f.n_head                   = (int32_t) dst->ne[1];
    f.head_dim_v               = Dv;
    f.sinks                    = sinks ? (const float *) sinks->data : nullptr;
    f.out                      = (float *) dst->data;
    const int32_t rc           = op->cuda->finish(op->cuda->user, &f, (int32_t) device, stream);
    if (rc != 0 && op->n_errors) {
        op->n_errors->fetch_add(1, std::memory_order_relaxed);
    }
    return rc;
}

// [kvgguf 0017] Both ops may be captured in a CUDA graph while the hooks' generation stays: the
// attention op's work depends on the store's device copy, which its node does not show; the output
// op's on its node alone, but it follows the attention op's say, so one switch turns both off.
static uint64_t llm_kv_cold_cuda_generation(const ggml_tensor * node, void * userdata) {
    GGML_UNUSED(node);
    const auto * op = (const llm_kv_cold_op *) userdata;
    return op && op->cuda && op->cuda->generation ? op->cuda->generation(op->cuda->user) : 0;
}

bool llm_kv_cold_register_cuda() {
    static std::once_flag once;
    static bool           registered = false;
    std::call_once(once, [] {
        for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
            ggml_backend_reg_t reg = ggml_backend_reg_get(i);
            auto               set = (ggml_backend_set_custom_op_gpu_t) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_cuda_set_custom_op");
            auto set_gen = (ggml_backend_set_custom_op_generation_t) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_cuda_set_custom_op_generation");
            if (set) {
                // capturable only where the backend can tell a changed store (its generation)
                const uint32_t flags = set_gen ? GGML_BACKEND_CUSTOM_OP_CAPTURABLE : 0;
                registered = set(llm_kv_cold_attn_fn, llm_kv_cold_attn_cuda, llm_kv_cold_attn_cuda_supports, flags) &&
                             set(llm_kv_cold_merge_fn, llm_kv_cold_merge_cuda, llm_kv_cold_merge_cuda_supports, flags);
                if (registered && set_gen) {
                    set_gen(llm_kv_cold_attn_fn, llm_kv_cold_cuda_generation);
                    set_gen(llm_kv_cold_merge_fn, llm_kv_cold_cuda_generation);
                }
                break;
            }
        }
    });
    return registered;
}

ggml_tensor * llm_graph_context::build_attn_kv_cold_fused(ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                                          ggml_tensor * kq_mask, ggml_tensor * sinks, float kq_scale,
                                                          int il, int64_t n_cold) const {
    const bool    v_trans = v->nb[1] > v->nb[2];
    const int64_t Dv      = v_trans ? v->ne[2] : v->ne[0];
    const int64_t H       = q->ne[1];
    const int64_t T       = q->ne[2];
    // two chunks (one of cold rows, one of hot cells) per thread of the larger of the two thread
    // counts llama_decode may use; one where the cells are a GPU's and its hooks take the layer
    // (the GPU folds every row and cell into one state)
    const auto &        runs  = inp_kv_cold->layers.back().runs;
    const ggml_tensor * cells = k->view_src ? k->view_src : k;
    const bool on_gpu = kv_cold_cuda && cells->buffer && !ggml_backend_buffer_is_host(cells->buffer) && runs.empty() &&
                        kv_cold_cuda->supports(kv_cold_cuda->user, il, -1) == 1;
    const int64_t n_part = on_gpu ? 1 : 2 * std::max<int64_t>(1, std::max(cparams.n_threads, cparams.n_threads_batch));

    auto * op      = inp_kv_cold->add_op(il, LLM_KV_COLD_ATTN, n_cold, v_trans);
    op->attend     = kv_cold_attend;
    op->scale      = kq_scale;
    op->softcap    = hparams.attn_soft_cap ? hparams.f_attn_logit_softcapping : 0.0f;
    op->mass       = kv_cold_mass;
    op->attend_f16 = kv_cold_attend_f16;
    op->cuda       = kv_cold_cuda;

    // [kvgguf 0020] the queries once per distinct shift of the layer's shifted runs, each set rotated
    // by its shift, in one tensor [Dk, H, T * n_shifts] (source 4): one rope node however many
    ggml_tensor *        args[5] = { q, k, v, kq_mask, nullptr };
    int                  n_args  = 4;
    std::vector<int32_t> shifts;
    for (const auto & run : runs) {
        auto it = std::find(shifts.begin(), shifts.end(), run.shift);
        if (it == shifts.end()) {
            shifts.push_back(run.shift);
            it = shifts.end() - 1;
        }
        op->q_src.push_back((int32_t) (it - shifts.begin()));
    }
    if (!shifts.empty()) {
        const int64_t        S    = (int64_t) shifts.size();
        ggml_tensor *        sets = ggml_repeat_4d(ctx0, q, q->ne[0], H, T, S);
        std::vector<int32_t> pos((size_t) (T * S));
        for (int64_t s = 0; s < S; ++s) {
            std::fill(pos.begin() + s * T, pos.begin() + (s + 1) * T, shifts[s]);
        }
        args[n_args++] =
            llm_kv_cold_rope(*this, inp_kv_cold, ggml_reshape_3d(ctx0, sets, q->ne[0], H, T * S), std::move(pos), il);
    }
    op->runs = runs;

    ggml_tensor * parts = ggml_custom_4d(ctx0, GGML_TYPE_F32, T * H * (Dv + 2), n_part, 1, 1, args, n_args,
                                         llm_kv_cold_attn_fn, GGML_N_TASKS_MAX, op);
    cb(parts, "kqv_cold_parts", il);

    ggml_tensor * pargs[2] = { parts, sinks };
    ggml_tensor * cur = ggml_custom_4d(ctx0, GGML_TYPE_F32, Dv, H, T, 1, pargs, sinks ? 2 : 1, llm_kv_cold_merge_fn,
                                       GGML_N_TASKS_MAX, op);
    cur               = ggml_reshape_2d(ctx0, cur, Dv * H, T);
    ggml_build_forward_expand(gf, cur);
    return cur;
}

// [kvgguf 0020] the most query rows the fused path rotates for a layer's shifted runs (the ubatch's
// queries once per distinct shift, each thread reading the sets its rows use): beyond, it expands
static constexpr int64_t LLM_KV_COLD_MAX_ROTATED = 4096;

// [kvgguf 0020] distinct shifts among a layer's runs: the fused path takes one rotated query each
static size_t llm_kv_cold_n_shifts(const std::vector<llm_kv_cold_run> & runs) {
    std::vector<int32_t> shifts;
    for (const auto & run : runs) {
        if (std::find(shifts.begin(), shifts.end(), run.shift) == shifts.end()) {
            shifts.push_back(run.shift);
        }
    }
    return shifts.size();
}

bool llm_graph_context::kv_cold_fusable(ggml_tensor * kq_b, ggml_tensor * sinks, ggml_tensor * v_mla) const {
    // soft-capping and attention sinks (one f32 logit per head) are the fused path's own (patch 0008)
    return !kq_b && !v_mla && (!sinks || sinks->type == GGML_TYPE_F32) && hparams.f_max_alibi_bias == 0.0f &&
           arch != LLM_ARCH_GROK;
}

void llm_graph_context::kv_cold_record_path(int il, bool swa, bool shared, ggml_tensor * kq_b, ggml_tensor * sinks,
                                            ggml_tensor * v_mla) const {
    if (!kv_cold_paths || il < 0 || (uint32_t) il >= hparams.n_layer()) {
        return;
    }
    uint8_t path = LLAMA_KVGGUF_PATH_KV;
    path |= swa ? LLAMA_KVGGUF_PATH_SWA : 0;
    path |= kv_cold_fusable(kq_b, sinks, v_mla) ? 0 : LLAMA_KVGGUF_PATH_EXPAND;
    path |= shared ? LLAMA_KVGGUF_PATH_SHARED : 0;
    kv_cold_paths[il] |= path;
}

ggml_tensor * llm_graph_context::build_attn_kv_cold(ggml_tensor * q, ggml_tensor *& k, ggml_tensor *& v,
                                                    ggml_tensor *& kq_mask, ggml_tensor * kq_b, ggml_tensor * sinks,
                                                    ggml_tensor * v_mla, float kq_scale, int il) const {
    if (!kv_cold || !kv_cold->n_cold || !kv_cold->decode) {
        return nullptr;
    }

    if (!inp_kv_cold) {
        inp_kv_cold = (llm_graph_input_kv_cold *) res->add_input(
            std::make_unique<llm_graph_input_kv_cold>(kv_cold, kv_cold_n_errors));
    }

    const int64_t n_cold = std::max<int32_t>(0, kv_cold->n_cold(kv_cold->user, il));

    // record the layer even when n_cold == 0 so that the graph is rebuilt once cold rows appear
    const bool rope = hparams.has_rope(il);
    inp_kv_cold->layers.push_back(
        { il, n_cold, rope, rope ? llm_kv_cold_runs(kv_cold, il, n_cold) : std::vector<llm_kv_cold_run>() });
    const auto & runs = inp_kv_cold->layers.back().runs;

    if (n_cold == 0) {
        return nullptr;
    }

    GGML_ASSERT(k->ne[3] == 1 && v->ne[3] == 1 && "kvgguf: cold rows support a single KV stream only");
    // [kvgguf 0012] f16 cells, or q8_0 ones (read as f16 rows); quantized V never transposed (flash attention)
    const auto cell_type_ok = [](const ggml_tensor * t) {
        return t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0;
    };
    GGML_ASSERT(cell_type_ok(k) && cell_type_ok(v) && "kvgguf: cold rows require an F16 or Q8_0 KV cache");

    // the fused path computes plain softmax attention: anything else keeps the expanding path
    const bool fused = kv_cold_attend && q->ne[2] <= kv_cold_attend_max_tokens && q->type == GGML_TYPE_F32 &&
                       q->ne[3] == 1 && q->ne[1] % k->ne[1] == 0 && kv_cold_fusable(kq_b, sinks, v_mla) &&
                       (!sinks || ggml_nelements(sinks) == q->ne[1]) &&
                       (int64_t) llm_kv_cold_n_shifts(runs) * q->ne[2] <= LLM_KV_COLD_MAX_ROTATED;
    if (fused) {
        return build_attn_kv_cold_fused(q, k, v, kq_mask, sinks, kq_scale, il, n_cold);
    }

    const bool v_trans = v->nb[1] > v->nb[2];  // same test as build_attn_mha

    // all threads run the op (see llm_kv_cold_thread_range); decode() concurrency is limited inside
    const int n_tasks = GGML_N_TASKS_MAX;

    // K: [D, H, n_kv, 1] -> [D, H, n_cold + n_kv, 1]
    {
        ggml_tensor * args[1] = { k };
        auto *        op      = inp_kv_cold->add_op(il, LLAMA_KVGGUF_K, n_cold, false);
        k = ggml_custom_4d(ctx0, GGML_TYPE_F16, k->ne[0], k->ne[1], n_cold + k->ne[2], 1, args, 1, llm_kv_cold_kv_fn,
                           n_tasks, op);
        cb(k, "k_cold_ext", il);
        // [kvgguf 0020] the decoded keys of each shifted run rotated to their new positions, in place
        // (before attention reads them: the graph runs its nodes in the order they are expanded)
        for (const auto & run : runs) {
            ggml_tensor * rows =
                ggml_view_3d(ctx0, k, k->ne[0], k->ne[1], run.r1 - run.r0, k->nb[1], k->nb[2], run.r0 * k->nb[2]);
            ggml_tensor * rot =
                llm_kv_cold_rope(*this, inp_kv_cold, rows, std::vector<int32_t>(run.r1 - run.r0, -run.shift), il);
            ggml_build_forward_expand(gf, ggml_cpy(ctx0, rot, rows));
        }
    }

    // V
    {
        ggml_tensor * args[1] = { v };
        if (!v_trans) {
            // [D, H, n_kv, 1] -> [D, H, n_cold + n_kv, 1]
            auto * op = inp_kv_cold->add_op(il, LLAMA_KVGGUF_V, n_cold, false);
            v         = ggml_custom_4d(ctx0, GGML_TYPE_F16, v->ne[0], v->ne[1], n_cold + v->ne[2], 1, args, 1,
                                       llm_kv_cold_kv_fn, n_tasks, op);
            cb(v, "v_cold_ext", il);
        } else {
            // hot view [n_kv, H, D, 1] (nb[1] > nb[2]); build [N, D, H] contiguous and permute it to
            // [N, H, D] so that build_attn_mha still detects v_trans (nb[1] = N*D*2 > nb[2] = N*2)
            auto *        op = inp_kv_cold->add_op(il, LLAMA_KVGGUF_V, n_cold, true);
            ggml_tensor * vt = ggml_custom_4d(ctx0, GGML_TYPE_F16, n_cold + v->ne[0], v->ne[2], v->ne[1], 1, args, 1,
                                              llm_kv_cold_kv_fn, n_tasks, op);
            cb(vt, "v_cold_ext", il);
            v = ggml_permute(ctx0, vt, 0, 2, 1, 3);
        }
    }

    // mask: [n_kv, n_tokens, 1, 1] -> [n_cold + n_kv, n_tokens, 1, 1], shared by the layers with the same n_cold
    {
        const auto key = std::make_pair(kq_mask, n_cold);
        auto       it  = inp_kv_cold->masks.find(key);
        if (it == inp_kv_cold->masks.end()) {
            ggml_tensor * args[1] = { kq_mask };
            auto *        op      = inp_kv_cold->add_op(il, LLM_KV_COLD_MASK, n_cold, false);
            ggml_tensor * m =
                ggml_custom_4d(ctx0, kq_mask->type, n_cold + kq_mask->ne[0], kq_mask->ne[1], kq_mask->ne[2],
                               kq_mask->ne[3], args, 1, llm_kv_cold_mask_fn, GGML_N_TASKS_MAX, op);
            ggml_format_name(m, "kq_mask_cold_ext_%" PRId64, n_cold);
            it = inp_kv_cold->masks.emplace(key, m).first;
        }
        kq_mask = it->second;
    }
    return nullptr;
}
