// kvg_cuda_attend.cu: fused attention over coded K and V blocks (kvg_cuda_attend), the GPU twin of
// attend.c's fused paths: what kvg_store_hook_attend_capped computes, in float32, in another order.
// Each side's block is rotq (read in the rotated domain), kivi or f16 (read as they are), in any mix.
//
// A run is planned here (ka_plan_run: the checks, the kernel, the splits) and queued by a pass
// (kvg_cuda_attend_pass.cu), which kvg_cuda_attend is with one part. Its kernels on the context's
// stream:
// 1. the pass's queries: qr_j = W(s * (scale * q_j)) per query where K is rotq, scale * q_j
//    otherwise, once per pass (shared-memory butterflies); the pass's fused kernel instead has
//    each block compute its tile's (kvg_cuda_attend_fused.cuh).
// 2. split: grid (row splits x KV heads x query tiles). Each warp walks its rows 32 at a time:
//    per row, the lanes unpack the key's codes (lane-strided coordinates), dot them with the
//    tile's queries (rotq: codebook values times qr, scaled by the stored norm / head_dim; kivi:
//    min + code * scale of the coordinate's group), reduced over the warp; the 32 scores of a chunk
//    fold into the warp's (m, l) once (online softmax, Milakov and Gimelshein 2018); the values,
//    weighted, are summed in shared memory (rotq's in the rotated domain). Warps then merge into
//    the split's (m, l, accr), written to the pass's slots. Nothing is expanded to global memory:
//    codes are read straight from the blocks.
//    This is the generic kernel; the shapes decoding meets most (K and V rotq2-4 at head dims both
//    64, 128 or 256) take the row-parallel one of kvg_cuda_attend_rows.cuh, 3-4x faster on an
//    H100, and many queries a KV head (prefill) the tensor cores' (kvg_cuda_attend_tc.cu).
// 3. the pass's combine: per query, every slot and the incoming state merge in log-sum-exp form,
//    and rotq's rotated sums go back through W and the signs once.
#include "kvg_cuda_attend.cuh"

#include <math.h>
#include <string.h>

#define KA_MAX_SPLITS 1024
#define KA_SPLIT_ROWS 256  // rows per split to aim for
#define KA_MAX_DIM    512

// Shared: sq [QT][dk], accr [KA_WARPS][QT][dv], wm and wl [KA_WARPS][QT]. KS, VS: the K and V
// sides' sources (KA_SRC_*).
template <int QT, int KS, int VS>
static __global__ void __launch_bounds__(KA_WARPS * 32) ka_split_kernel(const ka_args a) {
    KVG_DYNAMIC_SMEM(float, ka_sh);
    const int dk = a.dk, dv = a.dv;
    float *   sq   = ka_sh;
    float *   accr = sq + QT * dk;
    float *   wm   = accr + KA_WARPS * QT * dv;
    float *   wl   = wm + KA_WARPS * QT;

    const int split = blockIdx.x, hk = blockIdx.y, p0 = blockIdx.z * QT;
    const int nq   = a.n_p - p0 < QT ? a.n_p - p0 : QT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int x = threadIdx.x; x < QT * dk; x += blockDim.x) {
        const int qq = x / dk;
        sq[x]        = qq < nq ? a.qr[ka_query(p0 + qq, hk, a.gqa, a.n_head) * dk + x % dk] : 0.0f;
    }
    float * my_acc = accr + warp * QT * dv;
    for (int x = lane; x < QT * dv; x += 32) {
        my_acc[x] = 0.0f;
    }
    float m_run[QT], l_run[QT];
#pragma unroll
    for (int qq = 0; qq < QT; qq++) {
        m_run[qq] = -INFINITY;
        l_run[qq] = 0.0f;
    }
    __syncthreads();

    const int64_t r_begin = (int64_t) split * a.split_rows;
    const int64_t r_end   = r_begin + a.split_rows < a.n_rows ? r_begin + a.split_rows : a.n_rows;
    for (int64_t base = r_begin + warp * 32; base < r_end; base += KA_WARPS * 32) {
        const int nc = r_end - base < 32 ? (int) (r_end - base) : 32;
        float     s_mine[QT];  // lane r: the scores of row base + r
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            s_mine[qq] = -INFINITY;
        }
        for (int r = 0; r < nc; r++) {
            const int64_t row = a.k_row0 + base + r;
            const float   fk  = ka_row_factor<KS>(a.k_norms, a.inv_dk, row, a.n_head_kv, hk);
            float         part[QT];
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                part[qq] = 0.0f;
            }
            for (int i = lane; i < dk; i += 32) {
                const float c = ka_key_at<KS>(a, row, hk, i);
#pragma unroll
                for (int qq = 0; qq < QT; qq++) {
                    part[qq] += sq[qq * dk + i] * c;
                }
            }
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                const float sc = ka_warp_sum(part[qq]) * fk;
                if (lane == r) {
                    s_mine[qq] = a.softcap > 0.0f ? a.softcap * tanhf(sc) : sc;
                }
            }
        }
        float w_mine[QT];
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            const float cmax = ka_warp_max(s_mine[qq]);
            if (cmax > m_run[qq]) {                         // warp-uniform
                const float corr = expf(m_run[qq] - cmax);  // 0 while m is -inf
                l_run[qq] *= corr;
                for (int i = lane; i < dv; i += 32) {
                    my_acc[qq * dv + i] *= corr;
                }
                m_run[qq] = cmax;
            }
            w_mine[qq] = lane < nc ? expf(s_mine[qq] - m_run[qq]) : 0.0f;
            l_run[qq] += ka_warp_sum(w_mine[qq]);
        }
        for (int r = 0; r < nc; r++) {
            const int64_t row = a.v_row0 + base + r;
            const float   fv  = ka_row_factor<VS>(a.v_norms, a.inv_dv, row, a.n_head_kv, hk);
            float         wr[QT];
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                wr[qq] = __shfl_sync(0xffffffffu, w_mine[qq], r) * fv;
            }
            if (fv == 0.0f) {
                continue;  // a zero vector adds nothing (its weight is in l all the same)
            }
            for (int i = lane; i < dv; i += 32) {
                const float c = ka_value_at<VS>(a, row, hk, i);
#pragma unroll
                for (int qq = 0; qq < QT; qq++) {
                    my_acc[qq * dv + i] += wr[qq] * c;
                }
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            wm[warp * QT + qq] = m_run[qq];
            wl[warp * QT + qq] = l_run[qq];
        }
    }
    __syncthreads();

    // The block's warps merged: the split's (m, l, accr) per query.
    ka_merge_warps(wm, wl, accr, QT, nq, dv, p0, hk, a.gqa, a.n_head, a.n_slots, a.slot0 + split, a.pm, a.pl, a.pacc);
}

// ---- host ----------------------------------------------------------------------------------

// A block's source (KA_SRC_*) and bits per code; -1 for a codec the GPU does not read.
static int ka_source(int codec, int * bits) {
    if (codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4) {
        *bits = codec - KVG_CODEC_ROTQ1 + 1;
        return KA_SRC_ROTQ;
    }
    if (codec >= KVG_CODEC_KIVI2 && codec <= KVG_CODEC_KIVI8) {
        *bits = codec == KVG_CODEC_KIVI8 ? 8 : codec - KVG_CODEC_KIVI2 + 2;
        return KA_SRC_KIVI;
    }
    if (codec == KVG_CODEC_F16) {
        *bits = 16;
        return KA_SRC_F16;
    }
    return -1;
}

// The block's bytes hold its shape, and the rows asked for lie inside it.
static int ka_check_block(const kvg_cuda_block * b, int kind, int64_t row0, int64_t n_rows, int64_t n_head_kv,
                          int64_t d, uint64_t seed, int32_t group) {
    const char * side = kind == KVG_KIND_K ? "K" : "V";
    if (b->data_dev == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: NULL %s block", side);
    }
    int       bits = 0;
    const int src  = ka_source(b->codec, &bits);
    if (src < 0) {
        const char * n = kvg_codec_name(b->codec);
        return kvg_fail(
            KVG_ERR_UNSUPPORTED,
            "kvg_cuda_attend: the %s block is %s; the fused GPU attention reads f16, kivi2, kivi3, kivi4, kivi8, "
            "rotq1, rotq2, rotq3 and rotq4",
            side, n ? n : "an unknown codec");
    }
    if (src == KA_SRC_ROTQ && !(d >= 8 && d <= KA_MAX_DIM && (d & (d - 1)) == 0)) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda_attend: %s head_dim %lld is not a power of two in [8, %d] (rotq)",
                        side, (long long) d, KA_MAX_DIM);
    }
    if (d < 1 || d > KA_MAX_DIM) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda_attend: %s head_dim %lld is not in [1, %d]", side, (long long) d,
                        KA_MAX_DIM);
    }
    kvg_codec_params p;
    kvg_codec_default_params(&p);
    p.seed       = seed;
    p.group_size = group;
    size_t size  = 0;
    int    st    = kvg_encoded_size(b->codec, kind, b->n_rows, n_head_kv, d, &p, &size);
    if (st != KVG_OK) {
        return st;
    }
    if (size != b->n_bytes) {
        return kvg_fail(KVG_ERR_BUFFER_SIZE, "kvg_cuda_attend: the %s block holds %zu bytes, %lld rows encode to %zu",
                        side, b->n_bytes, (long long) b->n_rows, size);
    }
    if (row0 < 0 || n_rows < 0 || row0 > b->n_rows - n_rows) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: %s rows [%lld, %lld) are outside the block's %lld", side,
                        (long long) row0, (long long) (row0 + n_rows), (long long) b->n_rows);
    }
    return KVG_OK;
}

template <int QT, int KS>
static void ka_launch_split_v(const ka_args & a, dim3 grid, size_t smem, cudaStream_t stream) {
    switch (a.v_src) {
        case KA_SRC_ROTQ: KVG_LAUNCH(grid, KA_WARPS * 32, smem, stream, ka_split_kernel<QT, KS, KA_SRC_ROTQ>)(a); break;
        case KA_SRC_KIVI: KVG_LAUNCH(grid, KA_WARPS * 32, smem, stream, ka_split_kernel<QT, KS, KA_SRC_KIVI>)(a); break;
        default:          KVG_LAUNCH(grid, KA_WARPS * 32, smem, stream, ka_split_kernel<QT, KS, KA_SRC_F16>)(a); break;
    }
}

template <int QT>
static void ka_launch_split(const ka_args & a, dim3 grid, size_t smem, cudaStream_t stream) {
    switch (a.k_src) {
        case KA_SRC_ROTQ: ka_launch_split_v<QT, KA_SRC_ROTQ>(a, grid, smem, stream); break;
        case KA_SRC_KIVI: ka_launch_split_v<QT, KA_SRC_KIVI>(a, grid, smem, stream); break;
        default:          ka_launch_split_v<QT, KA_SRC_F16>(a, grid, smem, stream); break;
    }
}

// A side's pointers into its block of n_rows rows: rotq's norms, kivi's groups, then the codes.
static void ka_side_pointers(const kvg_cuda_block * b, int src, int kind, int64_t n_head_kv, int64_t d, int64_t group,
                             const uint8_t ** norms, const uint8_t ** groups, const uint8_t ** codes) {
    const uint8_t * p = (const uint8_t *) b->data_dev;
    *norms = *groups = NULL;
    *codes           = p;
    if (src == KA_SRC_ROTQ) {
        *norms = p;
        *codes = p + 2 * b->n_rows * n_head_kv;
    } else if (src == KA_SRC_KIVI) {
        const int64_t C = n_head_kv * d;
        const int64_t n_groups =
            kind == KVG_KIND_K ? (b->n_rows + group - 1) / group * C : b->n_rows * ((C + group - 1) / group);
        *groups = p;
        *codes  = p + 4 * n_groups;
    }
}

int ka_plan_run(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a, int64_t budget_floats, ka_plan * out) {
    memset(out, 0, sizeof(*out));
    if (a->q_dev == NULL || a->m_dev == NULL || a->l_dev == NULL || a->acc_dev == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: NULL q, m, l or acc");
    }
    if (a->n_head_kv <= 0 || a->n_tokens <= 0 || a->n_head <= 0 || a->n_head % a->n_head_kv != 0) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "kvg_cuda_attend: needs n_tokens > 0 and n_head a positive multiple of n_head_kv, got %d, %d, %d",
            (int) a->n_tokens, (int) a->n_head, (int) a->n_head_kv);
    }
    if (!isfinite(a->scale)) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: scale %g is not finite", (double) a->scale);
    }
    if (!isfinite(a->softcap) || a->softcap < 0.0f) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: softcap %g is not a finite value >= 0",
                        (double) a->softcap);
    }
    if (a->group_size < 0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: group_size %d is negative", (int) a->group_size);
    }
    const int32_t group = a->group_size > 0 ? a->group_size : KVG_DEFAULT_GROUP_SIZE;
    int st = ka_check_block(&a->k, KVG_KIND_K, a->k_row0, a->n_rows, a->n_head_kv, a->head_dim_k, a->seed, group);
    if (st == KVG_OK) {
        st = ka_check_block(&a->v, KVG_KIND_V, a->v_row0, a->n_rows, a->n_head_kv, a->head_dim_v, a->seed, group);
    }
    if (st != KVG_OK) {
        return st;
    }
    int       k_bits = 0, v_bits = 0;
    const int k_src = ka_source(a->k.codec, &k_bits), v_src = ka_source(a->v.codec, &v_bits);
    out->q_rotated = k_src == KA_SRC_ROTQ;
    out->v_rotated = v_src == KA_SRC_ROTQ;
    if (a->n_rows == 0) {
        return KVG_OK;  // n_splits 0: nothing to queue
    }
    const int64_t dk = a->head_dim_k, dv = a->head_dim_v;
    const int64_t gqa = a->n_head / a->n_head_kv, n_p = (int64_t) a->n_tokens * gqa;
    const int64_t n_q = (int64_t) a->n_tokens * a->n_head;

    // Query tiles: up to 8 queries of a KV head per block (4 past head_dim 256: shared memory), or
    // 64 on the tensor cores where many queries share a KV head (prefill).
    const int both_rotq = k_src == KA_SRC_ROTQ && v_src == KA_SRC_ROTQ;
    const int tc        = ka_tc_covers(ctx, (int) dk, (int) dv, n_p);
    const int max_qt    = (dk > 256 || dv > 256) ? 4 : 8;
    int       qt        = 1;
    while (qt < n_p && qt < max_qt) {
        qt *= 2;
    }
    const int rows_kernel =
        !tc && !ctx->attend_generic && both_rotq && ka_rows_covers((int) dk, (int) dv, k_bits, v_bits);
    qt                    = rows_kernel && qt == 2 ? 4 : qt;  // its tiles are 1, 4 or 8 queries
    qt                    = tc ? KA_TC_QUERIES : qt;
    const int64_t n_tiles = (n_p + qt - 1) / qt;
    if (n_tiles > 65535 || a->n_head_kv > 65535) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda_attend: %lld query tiles of %d exceed the grid", (long long) n_tiles,
                        qt);
    }
    // The row-parallel kernel where it covers the shape, with splits enough to fill the device;
    // else the generic one, with about KA_SPLIT_ROWS rows a split. Fewer
    // splits either way when the partial sums would outgrow the budget.
    int64_t n_splits = (a->n_rows + KA_SPLIT_ROWS - 1) / KA_SPLIT_ROWS;
    if (tc) {
        // about two blocks a multiprocessor (each holds over 100 KB of shared memory at head dim 128)
        const int64_t blocks = 2 * (int64_t) (ctx->sm_count > 0 ? ctx->sm_count : 1);
        const int64_t per    = (int64_t) a->n_head_kv * n_tiles;
        const int64_t rows   = ka_tc_split_rows(a->n_rows, (blocks + per - 1) / per);
        n_splits             = (a->n_rows + rows - 1) / rows;
    } else if (rows_kernel) {
        // About four blocks a multiprocessor. (Filling exactly the blocks the device holds at once,
        // from cudaOccupancyMaxActiveBlocksPerMultiprocessor, measured 1-10% slower on an H100.)
        out->kernel          = ka_rows_kernel((int) dk, k_bits, v_bits, qt);
        const int64_t blocks = 4 * (int64_t) (ctx->sm_count > 0 ? ctx->sm_count : 1);
        const int64_t per    = (int64_t) a->n_head_kv * n_tiles;
        const int64_t rows   = ka_rows_split_rows(a->n_rows, (blocks + per - 1) / per);
        n_splits             = (a->n_rows + rows - 1) / rows;
    }
    n_splits           = n_splits < KA_MAX_SPLITS ? n_splits : KA_MAX_SPLITS;
    const int64_t fit  = budget_floats / (n_q * (dv + 2));
    n_splits           = n_splits < fit ? n_splits : fit;
    n_splits           = n_splits < 1 ? 1 : n_splits;
    int64_t split_rows = (a->n_rows + n_splits - 1) / n_splits;
    split_rows         = tc ? ka_tc_split_rows(a->n_rows, n_splits) : split_rows;  // whole chunks of rows
    n_splits           = (a->n_rows + split_rows - 1) / split_rows;

    ka_args & args = out->args;
    args.k_src     = k_src;
    args.v_src     = v_src;
    args.k_bits    = k_bits;
    args.v_bits    = v_bits;
    args.group     = group;
    args.v_ncg     = (a->n_head_kv * dv + group - 1) / group;
    if (k_src == KA_SRC_ROTQ) {
        st = kc_get_rotq_tab(k_bits, dk, &args.ktab);
    }
    if (st == KVG_OK && v_src == KA_SRC_ROTQ) {
        st = kc_get_rotq_tab(v_bits, dv, &args.vtab);
    }
    if (st != KVG_OK) {
        return st;
    }
    ka_side_pointers(&a->k, k_src, KVG_KIND_K, a->n_head_kv, dk, group, &args.k_norms, &args.k_groups, &args.k_codes);
    ka_side_pointers(&a->v, v_src, KVG_KIND_V, a->n_head_kv, dv, group, &args.v_norms, &args.v_groups, &args.v_codes);
    args.k_row0     = a->k_row0;
    args.v_row0     = a->v_row0;
    args.n_rows     = a->n_rows;
    args.n_head_kv  = a->n_head_kv;
    args.dk         = (int) dk;
    args.dv         = (int) dv;
    args.inv_dk     = 1.0f / (float) dk;
    args.inv_dv     = 1.0f / (float) dv;
    args.n_head     = a->n_head;
    args.gqa        = (int) gqa;
    args.n_p        = (int) n_p;
    args.softcap    = a->softcap;
    args.n_splits   = (int) n_splits;
    args.split_rows = split_rows;
    out->tc         = tc;
    out->qt         = qt;
    out->n_tiles    = n_tiles;
    out->n_splits   = n_splits;
    return KVG_OK;
}

int ka_queue_run(kvg_cuda_ctx * ctx, ka_plan * p, const float * q, float * pm, float * pl, float * pacc, int n_slots,
                 int slot0) {
    ka_args & args = p->args;
    args.qr        = q;
    args.pm        = pm;
    args.pl        = pl;
    args.pacc      = pacc;
    args.n_slots   = n_slots;
    args.slot0     = slot0;
    if (p->tc) {
        return ka_tc_launch(ctx, args, p->n_tiles);
    }
    const int    qt = p->qt, dk = args.dk, dv = args.dv;
    const dim3   grid((unsigned) p->n_splits, (unsigned) args.n_head_kv, (unsigned) p->n_tiles);
    const size_t smem = sizeof(float) * (size_t) (qt * dk + KA_WARPS * qt * dv + 2 * KA_WARPS * qt);
    if (p->kernel) {
        KVG_LAUNCH(grid, KA_WARPS * 32, 0, ctx->stream, p->kernel)(args, ((uintptr_t) args.k_codes & 3) == 0,
                                                                   ((uintptr_t) args.v_codes & 3) == 0);
    } else {
        switch (qt) {
            case 1:  ka_launch_split<1>(args, grid, smem, ctx->stream); break;
            case 2:  ka_launch_split<2>(args, grid, smem, ctx->stream); break;
            case 4:  ka_launch_split<4>(args, grid, smem, ctx->stream); break;
            default: ka_launch_split<8>(args, grid, smem, ctx->stream); break;
        }
    }
    return kc_launch_check("attend split launch");
}

// One run: a pass of one part, folded into the state as it is.
extern "C" int kvg_cuda_attend(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a) {
    kvg_clear_error();
    if (ctx == NULL || a == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend: NULL ctx or args");
    }
    const kvg_cuda_part part = { a, NULL };
    return ka_pass_of_one(ctx, &part, (int64_t) a->n_tokens * a->n_head, a->head_dim_v, a->m_dev, a->l_dev, a->acc_dev);
}
