// kvg_cuda_attend_cells.cu: the rest of a layer's attention on the fused path, on the GPU: llama.cpp's
// own cells (the hot window and the ubatch, f16 or q8_0, under the mask) folded into the same
// online-softmax state as kvg_cuda_attend's coded rows (kvg_cuda_attend_cells, the GPU twin of
// attend_f16.c's kvg_attend_f16), the state set up (kvg_cuda_attend_begin), and the state turned into
// the layer's output with the attention sinks (kvg_cuda_attend_finish, what the patched llama.cpp's
// merge computes on the CPU).
//
// kvg_cuda_attend_cells is a pass of one part (kvg_cuda_attend_pass.cu): the split kernel here
// (its body in kvg_cuda_attend_cells.cuh: grid cell splits x KV heads x query tiles), or the
// tensor cores' for many queries, or the pass's fused kernel; then the pass's combine, where the
// splits and the incoming state merge in log-sum-exp form and a query that saw no cell keeps its
// state.
// No cell is converted to f16 or f32 in global memory.
#include "kvg_cuda_attend_cells.cuh"

#include <math.h>
#include <string.h>

#define KCL_MAX_DIM    512
#define KCL_MAX_SPLITS 1024
#define KCL_STEP_CELLS (KA_WARPS * 32)  // cells a block's warps take in one step

static __global__ void kcl_begin_kernel(int64_t n_q, int dv, float * m, float * l, float * acc) {
    for (int64_t x = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; x < n_q * dv;
         x += (int64_t) gridDim.x * blockDim.x) {
        acc[x] = 0.0f;
        if (x < n_q) {
            m[x] = -INFINITY;
            l[x] = 0.0f;
        }
    }
}

// Query j (caller order, head h = j % n_head): out = acc / L with L = l + exp(sink_h - m) (the sink
// a logit with no value), all taken against max(m, sink_h); zeros where no row reached the query.
static __global__ void kcl_finish_kernel(const float * m, const float * l, const float * acc, const float * sinks,
                                         int n_head, int64_t n_q, int dv, float * out) {
    for (int64_t x = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; x < n_q * dv;
         x += (int64_t) gridDim.x * blockDim.x) {
        const int64_t j = x / dv;
        const float   M = m[j];
        if (M == -INFINITY) {
            out[x] = 0.0f;
            continue;
        }
        const float S  = sinks ? sinks[j % n_head] : -INFINITY;
        const float Mx = fmaxf(M, S);
        const float c  = expf(M - Mx);
        const float L  = l[j] * c + (sinks ? expf(S - Mx) : 0.0f);
        out[x]         = acc[x] * c / L;
    }
}

static __global__ void kcl_gather_q_kernel(const uint8_t * src, size_t nb0, size_t nb1, size_t nb2, int dk, int n_head,
                                           int64_t n, int round_f16, float * dst) {
    for (int64_t x = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (int64_t) gridDim.x * blockDim.x) {
        const int64_t i = x % dk, h = x / dk % n_head, t = x / dk / n_head;
        float         v;
        memcpy(&v, src + (size_t) i * nb0 + (size_t) h * nb1 + (size_t) t * nb2, sizeof(v));
        dst[x] = round_f16 ? kc_f16_to_f32(kc_f32_to_f16(v)) : v;
    }
}

// ---- host ----------------------------------------------------------------------------------

// Whether cells of this ggml type at these strides can be read (attend_f16.c's cells_readable):
// f16 at any strides, q8_0 in whole blocks per head.
static int kcl_readable(int32_t type, const size_t * nb, int64_t d) {
    if (type == KVG_CELLS_F16) {
        return 1;
    }
    return type == KVG_CELLS_Q8_0 && d % KA_Q8_0_BLOCK == 0 && nb[0] == KA_Q8_0_BYTES &&
           nb[1] >= (size_t) (d / KA_Q8_0_BLOCK * KA_Q8_0_BYTES);
}

template <int QT>
static void kcl_launch_split(const kcl_args & a, dim3 grid, size_t smem, cudaStream_t stream) {
    KVG_LAUNCH(grid, KA_WARPS * 32, smem, stream, kcl_split_kernel<QT>)(a);
}

int ka_plan_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * a, int64_t budget_floats, ka_plan * out) {
    memset(out, 0, sizeof(*out));
    out->cells = 1;
    if (a->q_dev == NULL || a->k_dev == NULL || a->v_dev == NULL || a->m_dev == NULL || a->l_dev == NULL ||
        a->acc_dev == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend_cells: NULL q, k, v, m, l or acc");
    }
    if (a->n_head_kv <= 0 || a->n_tokens <= 0 || a->n_head <= 0 || a->n_head % a->n_head_kv != 0) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "kvg_cuda_attend_cells: needs n_tokens > 0 and n_head a positive multiple of n_head_kv, got %d, %d, %d",
            (int) a->n_tokens, (int) a->n_head, (int) a->n_head_kv);
    }
    if (a->head_dim_k <= 0 || a->head_dim_v <= 0 || a->head_dim_k > KCL_MAX_DIM || a->head_dim_v > KCL_MAX_DIM) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda_attend_cells: head dims %lld and %lld; the GPU takes 1 to %d",
                        (long long) a->head_dim_k, (long long) a->head_dim_v, KCL_MAX_DIM);
    }
    if (a->c0 < 0 || a->c1 < a->c0) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend_cells: cells [%lld, %lld)", (long long) a->c0,
                        (long long) a->c1);
    }
    if (!isfinite(a->scale) || !isfinite(a->softcap) || a->softcap < 0.0f) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_cells: scale %g and softcap %g must be finite, softcap >= 0",
                        (double) a->scale, (double) a->softcap);
    }
    if (!kcl_readable(a->k_type, a->k_nb, a->head_dim_k) || !kcl_readable(a->v_type, a->v_nb, a->head_dim_v)) {
        return kvg_fail(
            KVG_ERR_UNSUPPORTED,
            "kvg_cuda_attend_cells: cells of ggml types %d (K) and %d (V) with these strides cannot be read: "
            "f16 (1) at any strides, q8_0 (8) in whole blocks of 34 bytes per head, head dims multiples of 32",
            (int) a->k_type, (int) a->v_type);
    }
    const int64_t n_cells = a->c1 - a->c0;
    if (n_cells == 0) {
        return KVG_OK;  // n_splits 0: nothing to queue
    }
    const int64_t dk = a->head_dim_k, dv = a->head_dim_v;
    const int64_t gqa = a->n_head / a->n_head_kv, n_p = (int64_t) a->n_tokens * gqa;
    const int64_t n_q = (int64_t) a->n_tokens * a->n_head;

    // many queries a KV head (prefill): 64 a block on the tensor cores (kvg_cuda_attend_tc.cu)
    const int tc     = ka_tc_covers(ctx, (int) dk, (int) dv, n_p);
    const int max_qt = (dk > 256 || dv > 256) ? 4 : 8;  // shared memory
    int       qt     = 1;
    while (qt < n_p && qt < max_qt) {
        qt *= 2;
    }
    qt                    = tc ? KA_TC_QUERIES : qt;
    const int64_t n_tiles = (n_p + qt - 1) / qt;
    if (n_tiles > 65535 || a->n_head_kv > 65535) {
        return kvg_fail(KVG_ERR_SHAPE, "kvg_cuda_attend_cells: %lld query tiles of %d exceed the grid",
                        (long long) n_tiles, qt);
    }
    // Splits of whole block steps, enough for about four blocks a multiprocessor (a decode step's
    // few queries over a few hundred cells would otherwise keep most of the device idle), fewer
    // when the partial sums would outgrow the budget.
    const int64_t blocks      = (tc ? 2 : 4) * (int64_t) (ctx->sm_count > 0 ? ctx->sm_count : 1);
    const int64_t per         = (int64_t) a->n_head_kv * n_tiles;
    int64_t       n_split     = (blocks + per - 1) / per;
    const int64_t step        = tc ? 64 : KCL_STEP_CELLS;  // the tensor-core kernel's chunk: 64 cells
    const int64_t steps       = (n_cells + step - 1) / step;
    n_split                   = n_split < steps ? n_split : steps;
    n_split                   = n_split < KCL_MAX_SPLITS ? n_split : KCL_MAX_SPLITS;
    const int64_t fit         = budget_floats / (n_q * (dv + 2));
    n_split                   = n_split < fit ? n_split : fit;
    n_split                   = n_split < 1 ? 1 : n_split;
    const int64_t split_cells = (steps + n_split - 1) / n_split * step;
    n_split                   = (n_cells + split_cells - 1) / split_cells;

    kcl_args & args  = out->cargs;
    args.k           = (const uint8_t *) a->k_dev;
    args.v           = (const uint8_t *) a->v_dev;
    args.k_nb0       = a->k_nb[0];
    args.k_nb1       = a->k_nb[1];
    args.k_nb2       = a->k_nb[2];
    args.v_nb0       = a->v_nb[0];
    args.v_nb1       = a->v_nb[1];
    args.v_nb2       = a->v_nb[2];
    args.k_q8        = a->k_type == KVG_CELLS_Q8_0;
    args.v_q8        = a->v_type == KVG_CELLS_Q8_0;
    args.c0          = a->c0;
    args.n_cells     = n_cells;
    args.mask        = (const uint8_t *) a->mask_dev;
    args.mask_f16    = a->mask_f16 != 0;
    args.mask_nb1    = a->mask_nb1;
    args.dk          = (int) dk;
    args.dv          = (int) dv;
    args.n_head      = a->n_head;
    args.gqa         = (int) gqa;
    args.n_p         = (int) n_p;
    args.scale       = a->softcap > 0.0f ? a->scale / a->softcap : a->scale;  // as attend_f16.c caps
    args.softcap     = a->softcap;
    args.q           = a->q_dev;
    args.n_splits    = (int) n_split;
    args.split_cells = split_cells;
    out->cell        = a;
    out->tc          = tc;
    out->qt          = qt;
    out->n_tiles     = n_tiles;
    out->n_splits    = n_split;
    return KVG_OK;
}

int ka_queue_cells(kvg_cuda_ctx * ctx, ka_plan * p, float * pm, float * pl, float * pacc, int n_slots, int slot0) {
    if (p->tc) {
        return ka_tc_cells(ctx, p->cell, p->n_splits, p->cargs.split_cells, pm, pl, pacc, n_slots, slot0);
    }
    kcl_args & args = p->cargs;
    args.pm         = pm;
    args.pl         = pl;
    args.pacc       = pacc;
    args.n_slots    = n_slots;
    args.slot0      = slot0;
    const int    qt = p->qt;
    const dim3   grid((unsigned) p->n_splits, (unsigned) p->cell->n_head_kv, (unsigned) p->n_tiles);
    const size_t smem = sizeof(float) * (size_t) (qt * args.dk + KA_WARPS * qt * args.dv + 2 * KA_WARPS * qt);
    switch (qt) {
        case 1:  kcl_launch_split<1>(args, grid, smem, ctx->stream); break;
        case 2:  kcl_launch_split<2>(args, grid, smem, ctx->stream); break;
        case 4:  kcl_launch_split<4>(args, grid, smem, ctx->stream); break;
        default: kcl_launch_split<8>(args, grid, smem, ctx->stream); break;
    }
    return kc_launch_check("attend_cells split launch");
}

// Cells alone: a pass of one part, folded into the state as it is.
extern "C" int kvg_cuda_attend_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * a) {
    kvg_clear_error();
    if (ctx == NULL || a == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend_cells: NULL ctx or args");
    }
    const kvg_cuda_part part = { NULL, a };
    return ka_pass_of_one(ctx, &part, (int64_t) a->n_tokens * a->n_head, a->head_dim_v, a->m_dev, a->l_dev, a->acc_dev);
}

static unsigned kcl_grid(int64_t n) {
    const int64_t g = (n + 255) / 256;
    return (unsigned) (g < 65535 ? (g > 0 ? g : 1) : 65535);
}

extern "C" int kvg_cuda_attend_begin(kvg_cuda_ctx * ctx, int64_t n_q, int64_t head_dim_v, float * m_dev, float * l_dev,
                                     float * acc_dev) {
    kvg_clear_error();
    if (ctx == NULL || m_dev == NULL || l_dev == NULL || acc_dev == NULL || n_q <= 0 || head_dim_v <= 0 ||
        head_dim_v > KCL_MAX_DIM) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_begin: NULL ctx or state, or n_q %lld / head_dim_v %lld out of range",
                        (long long) n_q, (long long) head_dim_v);
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    KVG_LAUNCH(kcl_grid(n_q * head_dim_v), 256, 0, ctx->stream, kcl_begin_kernel)(n_q, (int) head_dim_v, m_dev, l_dev,
                                                                                  acc_dev);
    return kc_launch_check("attend_begin launch");
}

extern "C" int kvg_cuda_gather_q(kvg_cuda_ctx * ctx, const void * src_dev, const size_t * nb, int64_t head_dim,
                                 int32_t n_head, int32_t n_tokens, int32_t round_f16, float * dst_dev) {
    kvg_clear_error();
    if (ctx == NULL || src_dev == NULL || nb == NULL || dst_dev == NULL || head_dim <= 0 || n_head <= 0 ||
        n_tokens <= 0 || nb[0] % sizeof(float) || nb[1] % sizeof(float) || nb[2] % sizeof(float)) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "kvg_cuda_gather_q: NULL pointers, a shape of %lld x %d x %d, or strides that are not whole floats",
            (long long) head_dim, (int) n_head, (int) n_tokens);
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const int64_t n = head_dim * n_head * n_tokens;
    KVG_LAUNCH(kcl_grid(n), 256, 0, ctx->stream, kcl_gather_q_kernel)(
        (const uint8_t *) src_dev, nb[0], nb[1], nb[2], (int) head_dim, n_head, n, round_f16 != 0, dst_dev);
    return kc_launch_check("gather_q launch");
}

extern "C" int kvg_cuda_attend_finish(kvg_cuda_ctx * ctx, const kvg_cuda_finish_args * a) {
    kvg_clear_error();
    if (ctx == NULL || a == NULL || a->m_dev == NULL || a->l_dev == NULL || a->acc_dev == NULL || a->out_dev == NULL) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend_finish: NULL ctx, args, m, l, acc or out");
    }
    if (a->n_tokens <= 0 || a->n_head <= 0 || a->head_dim_v <= 0 || a->head_dim_v > KCL_MAX_DIM) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_finish: n_tokens %d, n_head %d, head_dim_v %lld out of range",
                        (int) a->n_tokens, (int) a->n_head, (long long) a->head_dim_v);
    }
    kc_device_scope scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    const int64_t n_q = (int64_t) a->n_tokens * a->n_head;
    KVG_LAUNCH(kcl_grid(n_q * a->head_dim_v), 256, 0, ctx->stream, kcl_finish_kernel)(
        a->m_dev, a->l_dev, a->acc_dev, a->sinks_dev, a->n_head, n_q, (int) a->head_dim_v, a->out_dev);
    return kc_launch_check("attend_finish launch");
}
