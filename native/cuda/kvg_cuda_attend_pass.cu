// kvg_cuda_attend_pass.cu: a layer's attention over several parts in one pass (kvg_cuda_attend_pass):
// runs of coded rows (kvg_cuda_attend.cu's split kernels) and cells (kvg_cuda_attend_cells.cu's),
// each part's splits writing their partial sums into slots of one scratch, then one combine kernel
// per query that merges every slot (and the incoming state, unless the pass starts it fresh).
//
// A decoded token's layer over three runs of blocks (the sinks' f16 rows, the archive, the warm
// rows) and the hot cells was the queries' gather, a begin, then a split and a combine per part
// and a rotation per coded run: 12 kernels. As one pass it is one kernel for the queries (gathered
// from llama.cpp's strides, scaled, rotated), a split a part and one combine: 6. The parts the
// row-parallel kernel and the scalar cells kernel take (every part of such a layer at head dims
// 64, 128 and 256) then go in one launch of the fused kernel (kvg_cuda_attend_fused.cuh), whose
// blocks compute their own queries: 2 kernels, the fused split and the combine.
// KVGGUF_CUDA_ATTEND=parts (read when a context is made) keeps a launch a part, for comparisons.
//
// Why one combine gives the same state: the parts' partial sums are (m, l, acc) triples over
// disjoint rows, whose log-sum-exp merge does not depend on the grouping; rotq's value sums are in
// the rotated domain of the store's seed, and turning them back (the Walsh-Hadamard transform and
// the signs) is linear, so the rotated slots (placed first) are summed, turned back once, and the
// other slots added. Only the order of float sums differs from one call a part.
#include "kvg_cuda_attend.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KP_STACK_PARTS    8
#define KP_MAX_SLOTS      4096                 // slots one combine merges (its shared memory)
#define KP_SCRATCH_FLOATS ((int64_t) 1 << 25)  // 128 MiB of partial sums: fewer splits for very many queries
#define KP_MAX_DIM        512

// One block per query j: shared yr, yp [dv] (the rotated and the plain sums), c [n_slots], red
// [blockDim]. Slots [0, n_rot) hold rotq's rotated value sums, [n_rot, n_slots) the others.
static __global__ void kp_combine_kernel(const float * pm, const float * pl, const float * pacc, int n_slots, int n_rot,
                                         int dv, uint64_t seed, int fresh, float * m, float * l, float * acc) {
    KVG_DYNAMIC_SMEM(float, kp_sh);
    float *       yr   = kp_sh;
    float *       yp   = yr + dv;
    float *       c    = yp + dv;
    float *       red  = c + n_slots;
    const int64_t j    = blockIdx.x;
    const float   m_in = fresh ? -INFINITY : m[j];

    float mx = m_in;
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        mx = fmaxf(mx, pm[j * n_slots + s]);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
        }
        __syncthreads();
    }
    const float M = red[0];
    __syncthreads();
    if (M == -INFINITY) {  // no row reached the query: a fresh state is emptied, another stays
        if (fresh) {
            for (int i = threadIdx.x; i < dv; i += blockDim.x) {
                acc[j * dv + i] = 0.0f;
            }
            if (threadIdx.x == 0) {
                m[j] = -INFINITY;
                l[j] = 0.0f;
            }
        }
        return;
    }
    float part = 0.0f;
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const float ms = pm[j * n_slots + s];
        c[s]           = ms == -INFINITY ? 0.0f : expf(ms - M);
        part += c[s] * pl[j * n_slots + s];
    }
    red[threadIdx.x] = part;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            red[threadIdx.x] += red[threadIdx.x + o];
        }
        __syncthreads();
    }
    const float c_in = m_in == -INFINITY ? 0.0f : expf(m_in - M);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float r = 0.0f, u = 0.0f;
        for (int s = 0; s < n_rot; s++) {
            r += c[s] * pacc[(j * n_slots + s) * dv + i];
        }
        for (int s = n_rot; s < n_slots; s++) {
            u += c[s] * pacc[(j * n_slots + s) * dv + i];
        }
        yr[i] = r;
        yp[i] = u;
    }
    if (n_rot > 0) {            // uniform over the block, so kc_fwht_block's barriers are safe; else each
        kc_fwht_block(yr, dv);  // thread reads back only the yr[i] and yp[i] it wrote
    }
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        const float kept = fresh ? 0.0f : acc[j * dv + i] * c_in;
        acc[j * dv + i]  = kept + (n_rot > 0 ? kc_sign(seed, i) * yr[i] : 0.0f) + yp[i];
    }
    if (threadIdx.x == 0) {
        l[j] = (fresh ? 0.0f : l[j] * c_in) + red[0];
        m[j] = M;
    }
}

// The pass's queries, a block per query j (token j / n_head, head j % n_head): its d floats read
// at src + i * nb0 + h * nb1 + t * nb2, rounded to f16 where round_f16 (kvg_cuda_gather_q's job),
// and written to `gathered`; scale * q to `plain`; the signs of `seed`, then W, of scale * q to
// `rot` (rotq keys). Each output may be NULL. Shared: y [d].
static __global__ void kp_queries_kernel(const uint8_t * src, size_t nb0, size_t nb1, size_t nb2, int n_head,
                                         int64_t n_q, int d, int round_f16, float scale, uint64_t seed,
                                         float * gathered, float * plain, float * rot) {
    KVG_DYNAMIC_SMEM(float, kp_sh);
    float * y = kp_sh;
    for (int64_t j = blockIdx.x; j < n_q; j += gridDim.x) {
        const int64_t t = j / n_head, h = j % n_head;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float v;
            memcpy(&v, src + (size_t) i * nb0 + (size_t) h * nb1 + (size_t) t * nb2, sizeof(v));
            v = round_f16 ? kc_f16_to_f32(kc_f32_to_f16(v)) : v;
            if (gathered) {
                gathered[j * d + i] = v;
            }
            if (plain) {
                plain[j * d + i] = scale * v;
            }
            y[i] = kc_sign(seed, i) * (scale * v);
        }
        if (rot) {  // uniform over the block: kc_fwht_block's barriers are safe
            kc_fwht_block(y, d);
            for (int i = threadIdx.x; i < d; i += blockDim.x) {
                rot[j * d + i] = y[i];
            }
        }
        __syncthreads();
    }
}

int ka_scratch(kvg_cuda_ctx * ctx, size_t bytes) {
    if (bytes <= ctx->scratch_bytes) {
        return KVG_OK;
    }
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
        // a wait or a free would end llama.cpp's capture (and abort it); the same graph ran
        // uncaptured first, so this should not happen
        return kvg_fail(KVG_ERR_NO_MEMORY,
                        "kvg_cuda: the attention scratch would have to grow inside a CUDA graph capture");
    }
    cudaError_t e = cudaStreamSynchronize(ctx->stream);  // earlier calls may still read the old one
    if (e != cudaSuccess) {
        return kc_cuda_fail(e, "cudaStreamSynchronize (attend scratch)");
    }
    cudaFree(ctx->scratch);
    ctx->scratch       = NULL;
    ctx->scratch_bytes = 0;
    e                  = cudaMalloc(&ctx->scratch, bytes);
    if (e != cudaSuccess) {
        ctx->scratch = NULL;
        return kc_cuda_fail(e, "cudaMalloc (attend scratch)");
    }
    ctx->scratch_bytes = bytes;
    ctx->scratch_grown++;
    return KVG_OK;
}

// ---- host ----------------------------------------------------------------------------------

// Whether a part's shape and state are the pass's, and a run's queries the first run's (the pass
// scales and rotates them once for all runs).
static int kp_agrees(const kvg_cuda_pass_args * p, const kvg_cuda_part * part, const kvg_cuda_attend_args * first,
                     int64_t i) {
    const kvg_cuda_attend_args * r   = part->run;
    const kvg_cuda_cells_args *  c   = part->cells;
    const int64_t                n_q = r ? (int64_t) r->n_tokens * r->n_head : (int64_t) c->n_tokens * c->n_head;
    const int64_t                dv  = r ? r->head_dim_v : c->head_dim_v;
    const int             same_state = r ? (r->m_dev == p->m_dev && r->l_dev == p->l_dev && r->acc_dev == p->acc_dev)
                                         : (c->m_dev == p->m_dev && c->l_dev == p->l_dev && c->acc_dev == p->acc_dev);
    const kvg_cuda_part * p0         = &p->parts[0];  // where the pass gathers, the queries' shape
    const int32_t         n_head = r ? r->n_head : c->n_head, n_head0 = p0->run ? p0->run->n_head : p0->cells->n_head;
    const int64_t dk = r ? r->head_dim_k : c->head_dim_k, dk0 = p0->run ? p0->run->head_dim_k : p0->cells->head_dim_k;
    if (p->q_src && ((r ? r->q_dev : c->q_dev) != p->q_dst || n_head != n_head0 || dk != dk0)) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_pass: part %lld's q_dev is not q_dst, or its heads or head dim are not the "
                        "first part's, where the pass gathers the queries",
                        (long long) i);
    }
    if (n_q != p->n_q || dv != p->head_dim_v || !same_state) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "kvg_cuda_attend_pass: part %lld has %lld queries of %lld values or another state; the pass has "
            "%lld of %lld",
            (long long) i, (long long) n_q, (long long) dv, (long long) p->n_q, (long long) p->head_dim_v);
    }
    if (r && first &&
        (r->q_dev != first->q_dev || r->n_head != first->n_head || r->n_head_kv != first->n_head_kv ||
         r->head_dim_k != first->head_dim_k || r->scale != first->scale || r->softcap != first->softcap ||
         r->seed != first->seed)) {
        return kvg_fail(
            KVG_ERR_INVALID_ARG,
            "kvg_cuda_attend_pass: run %lld's queries, heads, scale, softcap or seed are not the first run's",
            (long long) i);
    }
    return KVG_OK;
}

// The end of the chunk of parts that starts at i0 (i0 < n_parts): i0 and the parts after it while
// their slots, *slots in all, fit in one combine's KP_MAX_SLOTS (a part has at most 1,024).
static int32_t kp_chunk_end(const ka_plan * plans, int32_t i0, int32_t n_parts, int64_t * slots) {
    int32_t i = i0 + 1;
    *slots    = plans[i0].n_splits;
    while (i < n_parts && *slots + plans[i].n_splits <= KP_MAX_SLOTS) {
        *slots += plans[i++].n_splits;
    }
    return i;
}

// What the fused kernel needs of a pass: its head dim and query tile, where each kind of part reads
// its queries, how they are scaled and rotated, and where (once) the gathered queries go.
struct kp_fusion {
    int      n;  // parts it takes (plan->fused)
    int      d, qt, n_head_kv, gqa, n_p, n_head;
    ka_qsrc  q_runs;  // the runs' queries (the cells' are their own q_dev unless the pass gathers)
    int      gather;  // the pass gathers: every part reads q_src
    ka_qsrc  q_src;
    float    rot_scale;
    uint64_t seed;
    float *  q_dst;  // the gathered queries' home, written by the first fused launch; else NULL
};

// Marks the planned parts the fused kernel takes: runs of the row-parallel kernel and cells of the
// scalar cells kernel (not the tensor cores'), at K and V head dims both 64, 128 or 256, sharing
// the first such part's head dim, KV heads and queries a KV head. None where the context holds to
// one launch a part (KVGGUF_CUDA_ATTEND=parts or generic).
static void kp_plan_fusion(const kvg_cuda_ctx * ctx, ka_plan * plans, int32_t n_parts, kp_fusion * fu) {
    memset(fu, 0, sizeof(*fu));
    for (int32_t i = 0; i < n_parts; i++) {
        ka_plan * pl = &plans[i];
        pl->fused    = 0;
        if (ctx->attend_parts || pl->n_splits == 0 || pl->tc || (!pl->cells && pl->kernel == NULL)) {
            continue;
        }
        const int     dk = pl->cells ? pl->cargs.dk : pl->args.dk, dv = pl->cells ? pl->cargs.dv : pl->args.dv;
        const int     hkv    = pl->cells ? (int) pl->cell->n_head_kv : pl->args.n_head_kv;
        const int     gqa    = pl->cells ? pl->cargs.gqa : pl->args.gqa;
        const int     n_p    = pl->cells ? pl->cargs.n_p : pl->args.n_p;
        const int64_t blocks = pl->n_splits * hkv * pl->n_tiles;
        if (dk != dv || (dk != 64 && dk != 128 && dk != 256) || blocks > ((int64_t) 1 << 28) ||
            (fu->n > 0 && (dk != fu->d || hkv != fu->n_head_kv || gqa != fu->gqa))) {
            continue;
        }
        fu->d         = dk;
        fu->n_head_kv = hkv;
        fu->gqa       = gqa;
        fu->n_p       = n_p;
        fu->n_head    = pl->cells ? pl->cargs.n_head : pl->args.n_head;
        fu->qt        = pl->qt > fu->qt ? pl->qt : fu->qt;
        pl->fused     = 1;
        fu->n++;
    }
    fu->qt = fu->qt == 2 ? 4 : fu->qt;  // the row-parallel body's tiles are 1, 4 or 8 queries
}

// Queues the parts gathered in f (their blocks counted in n_blocks) as one launch, and empties f.
static int kp_launch_fused(kvg_cuda_ctx * ctx, kp_fusion * fu, ka_fused_args * f, int64_t * n_blocks) {
    if (f->n_parts == 0) {
        return KVG_OK;
    }
    KVG_LAUNCH((unsigned) *n_blocks, KA_WARPS * 32, 0, ctx->stream, ka_fused_kernel(fu->d, fu->qt))(*f);
    ctx->fused_launches++;
    fu->q_dst  = NULL;  // written once
    f->q_dst   = NULL;
    f->n_parts = 0;
    *n_blocks  = 0;
    return kc_launch_check("attend_pass fused split launch");
}

// Adds planned part pl, its slots set, to the fused launch f (queued first when full).
static int kp_add_fused(kvg_cuda_ctx * ctx, kp_fusion * fu, ka_fused_args * f, int64_t * n_blocks, ka_plan * pl,
                        float * pm, float * pl_, float * pacc, int n_slots) {
    const int64_t n_tiles = (fu->n_p + fu->qt - 1) / fu->qt;
    const int64_t blocks  = pl->n_splits * fu->n_head_kv * n_tiles;
    if (f->n_parts == KA_FUSE_PARTS || *n_blocks + blocks > INT32_MAX) {
        const int st = kp_launch_fused(ctx, fu, f, n_blocks);
        if (st != KVG_OK) {
            return st;
        }
    }
    if (f->n_parts == 0) {
        f->n_head    = fu->n_head;
        f->n_head_kv = fu->n_head_kv;
        f->gqa       = fu->gqa;
        f->n_p       = fu->n_p;
        f->rot_scale = fu->rot_scale;
        f->seed      = fu->seed;
        f->q_dst     = fu->q_dst;
    }
    ka_fused_part & fp = f->part[f->n_parts++];
    memset(&fp, 0, sizeof(fp));
    fp.n_splits = (int) pl->n_splits;
    fp.n_tiles  = (int) n_tiles;
    fp.block0   = *n_blocks;
    if (pl->cells) {
        fp.kind          = KA_FUSED_CELLS;
        fp.cells         = pl->cargs;
        fp.cells.pm      = pm;
        fp.cells.pl      = pl_;
        fp.cells.pacc    = pacc;
        fp.cells.n_slots = n_slots;
        fp.cells.slot0   = pl->slot0;
        const size_t f4  = sizeof(float);
        fp.q             = fu->gather ? fu->q_src
                                      : ka_qsrc{ (const uint8_t *) pl->cargs.q, f4, f4 * (size_t) fu->d,
                                                 f4 * (size_t) fu->d * (size_t) fu->n_head, 0 };
    } else {
        fp.kind        = KA_FUSED_ROWS;
        fp.run         = pl->args;
        fp.run.qr      = NULL;  // the block rotates its own
        fp.run.pm      = pm;
        fp.run.pl      = pl_;
        fp.run.pacc    = pacc;
        fp.run.n_slots = n_slots;
        fp.run.slot0   = pl->slot0;
        fp.k_bits      = pl->args.k_bits;
        fp.v_bits      = pl->args.v_bits;
        fp.k_al4       = ((uintptr_t) pl->args.k_codes & 3) == 0;
        fp.v_al4       = ((uintptr_t) pl->args.v_codes & 3) == 0;
        fp.q           = fu->gather ? fu->q_src : fu->q_runs;
    }
    *n_blocks += blocks;
    return KVG_OK;
}

// Queues parts [i0, i1) (their slots assigned, rotated values first; the fused ones in as few
// launches as they fit) and the combine of their n_slots slots into the state. fresh: the state
// is written, not read.
static int kp_queue_chunk(kvg_cuda_ctx * ctx, const kvg_cuda_pass_args * p, ka_plan * plans, int64_t i0, int64_t i1,
                          const float * q_rot, const float * q_plain, float * partials, uint64_t seed, int fresh,
                          kp_fusion * fu) {
    int n_slots = 0, n_rot = 0;
    for (int rotated = 1; rotated >= 0; rotated--) {  // the rotated value sums first
        for (int64_t i = i0; i < i1; i++) {
            ka_plan * plan = &plans[i];
            if (plan->n_splits > 0 && (plan->v_rotated && !plan->cells) == rotated) {
                plan->slot0 = n_slots;
                n_slots += (int) plan->n_splits;
            }
        }
        n_rot = rotated ? n_slots : n_rot;
    }
    if (n_slots == 0 && !fresh) {
        return KVG_OK;
    }
    float *       pm   = partials;
    float *       pl   = pm + p->n_q * n_slots;
    float *       pacc = pl + p->n_q * n_slots;
    ka_fused_args fused;
    int64_t       n_blocks = 0;
    fused.n_parts          = 0;
    for (int64_t i = i0; i < i1; i++) {
        ka_plan * plan = &plans[i];
        if (plan->n_splits == 0) {
            continue;
        }
        const int st = plan->fused   ? kp_add_fused(ctx, fu, &fused, &n_blocks, plan, pm, pl, pacc, n_slots)
                       : plan->cells ? ka_queue_cells(ctx, plan, pm, pl, pacc, n_slots, plan->slot0)
                                     : ka_queue_run(ctx, plan, plan->q_rotated ? q_rot : q_plain, pm, pl, pacc, n_slots,
                                                    plan->slot0);
        if (st != KVG_OK) {
            return st;
        }
    }
    const int st = kp_launch_fused(ctx, fu, &fused, &n_blocks);
    if (st != KVG_OK) {
        return st;
    }
    const int    dv      = (int) p->head_dim_v;
    const int    threads = 128;
    const size_t smem    = sizeof(float) * (size_t) (2 * dv + n_slots + threads);
    KVG_LAUNCH((unsigned) p->n_q, threads, smem, ctx->stream, kp_combine_kernel)(pm, pl, pacc, n_slots, n_rot, dv, seed,
                                                                                 fresh, p->m_dev, p->l_dev, p->acc_dev);
    return kc_launch_check("attend_pass combine launch");
}

// The parts planned: queued in chunks of at most KP_MAX_SLOTS slots, each merged by one combine.
static int kp_queue(kvg_cuda_ctx * ctx, const kvg_cuda_pass_args * p, ka_plan * plans,
                    const kvg_cuda_attend_args * first) {
    kp_fusion fu;
    kp_plan_fusion(ctx, plans, p->n_parts, &fu);
    int need_rot = 0, need_plain = 0, need_gathered = 0;  // what the parts outside the fused kernel read
    for (int32_t i = 0; i < p->n_parts; i++) {
        if (plans[i].n_splits > 0 && !plans[i].fused) {
            need_rot |= !plans[i].cells && plans[i].q_rotated;
            need_plain |= !plans[i].cells && !plans[i].q_rotated;
            need_gathered |= plans[i].cells;
        }
    }
    int64_t widest = 0, slots = 0;  // the scratch holds the widest chunk's partial sums
    for (int32_t i0 = 0; i0 < p->n_parts;) {
        i0     = kp_chunk_end(plans, i0, p->n_parts, &slots);
        widest = slots > widest ? slots : widest;
    }
    // The queries' shape from the first part (the pass checked that the runs agree; cells take the
    // same gathered queries in the hook).
    const kvg_cuda_part * p0      = p->n_parts > 0 ? &p->parts[0] : NULL;
    const int64_t         dk      = first ? first->head_dim_k : p0 ? p0->cells->head_dim_k : 0;
    const int32_t         n_head  = first ? first->n_head : p0 ? p0->cells->n_head : 1;
    const int64_t         q_float = p->n_q * dk;
    const size_t          floats = (size_t) ((need_rot + need_plain) * q_float + p->n_q * widest * (p->head_dim_v + 2));
    kc_device_scope       scope(ctx);
    if (scope.status != KVG_OK) {
        return scope.status;
    }
    int st = ka_scratch(ctx, floats * sizeof(float));
    if (st != KVG_OK) {
        return st;
    }
    float *   q_rot    = (float *) ctx->scratch;
    float *   q_plain  = q_rot + (need_rot ? q_float : 0);
    float *   partials = q_plain + (need_plain ? q_float : 0);
    const int gather   = p->q_src != NULL && p0 != NULL;
    // soft-capping as attend.c does it: scores taken with scale / softcap, then softcap * tanh
    const float scale = first ? (first->softcap > 0.0f ? first->scale / first->softcap : first->scale) : 1.0f;
    {
        const size_t f = sizeof(float);
        fu.gather      = gather;
        fu.q_src       = ka_qsrc{ (const uint8_t *) p->q_src, p->q_nb[0], p->q_nb[1], p->q_nb[2], 1 };
        fu.q_runs      = ka_qsrc{ (const uint8_t *) (first ? first->q_dev : NULL), f, f * (size_t) dk,
                                  f * (size_t) (dk * n_head), 0 };
        fu.rot_scale   = scale;
        fu.seed        = first ? first->seed : 0;
    }
    // The queries' kernel where a part outside the fused kernel reads its output, or where the
    // pass gathers and no fused launch writes the gathered queries.
    const int fused_gathers = gather && fu.n > 0 && !need_rot && !need_plain && !need_gathered;
    fu.q_dst                = fused_gathers ? p->q_dst : NULL;
    if (need_rot || need_plain || (gather && !fused_gathers)) {
        // one kernel: gathered (where the pass gathers), scaled, rotated; read where the fused
        // kernel would read the runs' queries
        const ka_qsrc & qs      = gather ? fu.q_src : fu.q_runs;
        const int       threads = dk >= 256 ? 128 : (int) (dk / 2 < 32 ? 32 : dk / 2);
        KVG_LAUNCH((unsigned) (p->n_q < 65536 ? p->n_q : 65536), threads, (size_t) dk * sizeof(float), ctx->stream,
                   kp_queries_kernel)(qs.src, qs.nb0, qs.nb1, qs.nb2, n_head, p->n_q, (int) dk, gather, scale, fu.seed,
                                      gather ? p->q_dst : NULL, need_plain ? q_plain : NULL, need_rot ? q_rot : NULL);
        st = kc_launch_check("attend_pass queries launch");
        if (st != KVG_OK) {
            return st;
        }
    }
    const uint64_t seed  = fu.seed;
    int32_t        i0    = 0;
    int            fresh = p->fresh != 0;
    do {  // at least one chunk: a fresh pass of no part still empties the state
        const int32_t end = i0 < p->n_parts ? kp_chunk_end(plans, i0, p->n_parts, &slots) : i0;
        st                = kp_queue_chunk(ctx, p, plans, i0, end, q_rot, q_plain, partials, seed, fresh, &fu);
        fresh             = 0;  // the state holds the chunks before
        i0                = end;
    } while (st == KVG_OK && i0 < p->n_parts);
    return st;
}

int ka_pass_of_one(kvg_cuda_ctx * ctx, const kvg_cuda_part * part, int64_t n_q, int64_t dv, float * m, float * l,
                   float * acc) {
    kvg_cuda_pass_args p;
    memset(&p, 0, sizeof(p));
    p.parts      = part;
    p.n_parts    = 1;
    p.n_q        = n_q;
    p.head_dim_v = dv;
    p.m_dev      = m;
    p.l_dev      = l;
    p.acc_dev    = acc;
    return kvg_cuda_attend_pass(ctx, &p);
}

extern "C" int kvg_cuda_attend_pass(kvg_cuda_ctx * ctx, const kvg_cuda_pass_args * p) {
    kvg_clear_error();
    if (ctx == NULL || p == NULL || p->n_parts < 0 || (p->n_parts > 0 && p->parts == NULL)) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_pass: NULL ctx or args, or a negative or NULL list of parts");
    }
    if (p->q_src &&
        (p->q_dst == NULL || p->q_nb[0] % sizeof(float) || p->q_nb[1] % sizeof(float) || p->q_nb[2] % sizeof(float))) {
        return kvg_fail(KVG_ERR_INVALID_ARG,
                        "kvg_cuda_attend_pass: q_src without q_dst, or strides that are not whole floats");
    }
    const kvg_cuda_attend_args * first = NULL;
    for (int32_t i = 0; i < p->n_parts; i++) {
        const kvg_cuda_part * part = &p->parts[i];
        if ((part->run == NULL) == (part->cells == NULL)) {
            return kvg_fail(KVG_ERR_INVALID_ARG, "kvg_cuda_attend_pass: part %d is neither a run nor cells, or both",
                            (int) i);
        }
        first = first ? first : part->run;
    }
    ka_plan   stack[KP_STACK_PARTS];
    ka_plan * plans = p->n_parts <= KP_STACK_PARTS ? stack : (ka_plan *) malloc(sizeof(ka_plan) * (size_t) p->n_parts);
    if (plans == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "kvg_cuda_attend_pass: no memory to plan %d parts", (int) p->n_parts);
    }
    // Each part's splits within its share of the partial sums' budget (after the queries' copies).
    const int64_t dk     = first ? first->head_dim_k : 0;
    int64_t       budget = (KP_SCRATCH_FLOATS - 2 * p->n_q * (dk > 0 ? dk : 0)) / (p->n_parts > 0 ? p->n_parts : 1);
    budget               = budget > 0 ? budget : 0;
    int st               = KVG_OK;
    for (int32_t i = 0; i < p->n_parts && st == KVG_OK; i++) {
        const kvg_cuda_part * part = &p->parts[i];
        st                         = part->run ? ka_plan_run(ctx, part->run, budget, &plans[i])
                                               : ka_plan_cells(ctx, part->cells, budget, &plans[i]);
        if (st == KVG_OK) {
            st = kp_agrees(p, part, first, i);
        }
    }
    if (st == KVG_OK && (p->m_dev == NULL || p->l_dev == NULL || p->acc_dev == NULL || p->n_q <= 0 ||
                         p->head_dim_v < 1 || p->head_dim_v > KP_MAX_DIM)) {
        // (after the parts, whose own checks say more about their arguments)
        st = kvg_fail(KVG_ERR_INVALID_ARG,
                      "kvg_cuda_attend_pass: NULL state, or n_q %lld / head_dim_v %lld out of range",
                      (long long) p->n_q, (long long) p->head_dim_v);
    }
    if (st == KVG_OK) {
        st = kp_queue(ctx, p, plans, first);
    }
    if (plans != stack) {
        free(plans);
    }
    return st;
}
