// kvg_cuda_attend.cuh: what kvg_cuda_attend's split kernels share (kvg_cuda_attend.cu, the generic
// one; kvg_cuda_attend_rows*.cu, the row-parallel one for rotq's common shapes;
// kvg_cuda_attend_tc.cu, the tensor cores' for many queries), and the cells' kernels.
#ifndef KVG_CUDA_ATTEND_CUH
#define KVG_CUDA_ATTEND_CUH

#include "kvg_cuda_common.cuh"

#include <string.h>

#define KA_WARPS 4

// Where a side's rows come from: the codec family of its block (ka_args.k_src, v_src).
enum { KA_SRC_ROTQ = 0, KA_SRC_KIVI = 1, KA_SRC_F16 = 2 };

struct ka_args {
    const uint8_t * k_norms;   // rotq: an f16 norm per head vector
    const uint8_t * k_groups;  // kivi: an f16 min and scale per group (kivi.c's layout)
    const uint8_t * k_codes;   // the codes, kvg_pack_bits order (f16: the values)
    const uint8_t * v_norms;
    const uint8_t * v_groups;
    const uint8_t * v_codes;
    int             k_src, v_src;    // KA_SRC_*
    kc_rotq_tab     ktab, vtab;      // centroids used
    int             k_bits, v_bits;  // rotq 1-4, kivi 2-8, f16 16
    int             group;           // kivi: G, tokens (K) or channels (V) a group
    int64_t         v_ncg;           // kivi V: groups a row, ceil(n_head_kv * dv / G)
    int64_t         k_row0, v_row0, n_rows;
    int             n_head_kv, dk, dv;
    float           inv_dk, inv_dv;
    const float *   qr;                // [n_q][dk], caller order: scaled, and rotated where K is rotq
    int             n_head, gqa, n_p;  // n_p = n_tokens * gqa queries per KV head
    float           softcap;
    int             n_splits;
    int64_t         split_rows;
    int             n_slots, slot0;  // split s of query j writes slot j * n_slots + slot0 + s
    float *         pm;              // [n_q][n_slots]
    float *         pl;              // [n_q][n_slots]
    float *         pacc;            // [n_q][n_slots][dv]
};

// The row-parallel kernel's type (kvg_cuda_attend_rows.cuh).
typedef void (*ka_rows_kernel_t)(const ka_args, int, int);

// The cells' split kernel's arguments (kvg_cuda_attend_cells.cu).
struct kcl_args {
    const uint8_t * k;
    const uint8_t * v;
    size_t          k_nb0, k_nb1, k_nb2, v_nb0, v_nb1, v_nb2;
    int             k_q8, v_q8;
    int64_t         c0, n_cells;
    const uint8_t * mask;  // NULL: none
    int             mask_f16;
    size_t          mask_nb1;
    int             dk, dv, n_head, gqa, n_p;
    float           scale;    // scale / softcap where capped
    float           softcap;  // 0: none
    const float *   q;        // [n_q][dk], caller order
    int             n_splits;
    int64_t         split_cells;
    int             n_slots, slot0;  // as ka_args'
    float *         pm;              // [n_q][n_slots]
    float *         pl;              // [n_q][n_slots]
    float *         pacc;            // [n_q][n_slots][dv]
};

// The pass's fused split kernel (kvg_cuda_attend_fused.cuh): one launch for up to KA_FUSE_PARTS
// parts of a pass, each a run the row-parallel kernel takes or cells the scalar cells kernel
// takes, at one head dim D (64, 128 or 256, K's and V's) and one query tile; the blocks of part i
// are [block0, block0 + n_splits * n_head_kv * n_tiles) of a 1-D grid. Each block reads its tile's
// queries from their source itself (scaled, and for a run signed and rotated), so a pass whose
// parts all fuse queues no queries kernel either. The same bodies as the per-part kernels, so the
// same floats.
#define KA_FUSE_PARTS 6

enum { KA_FUSED_ROWS = 0, KA_FUSED_CELLS = 1 };

// Where a part's queries are read: element i of head h of token t at src + i * nb0 + h * nb1 +
// t * nb2 (f32), rounded to f16 where round_f16 (a pass that gathers them).
struct ka_qsrc {
    const uint8_t * src;
    size_t          nb0, nb1, nb2;
    int             round_f16;
};

struct ka_fused_part {
    int     kind;            // KA_FUSED_*
    int     k_bits, v_bits;  // a run's: rotq 2-4
    int     k_al4, v_al4;    // a run's codes 4-byte aligned
    int     n_splits, n_tiles;
    int64_t block0;
    ka_qsrc q;
    union {
        ka_args  run;    // its slots set (n_slots, slot0, pm, pl, pacc)
        kcl_args cells;  // the same
    };
};

struct ka_fused_args {
    int           n_parts;
    int           n_head, n_head_kv, gqa, n_p;
    float         rot_scale;  // runs: scale (over softcap where capped), then the signs of seed and W
    uint64_t      seed;
    float *       q_dst;  // not NULL: part 0's first splits write the gathered queries there ([n_q][D])
    ka_fused_part part[KA_FUSE_PARTS];
};
// By value within the 4 KB of kernel parameters every CUDA version takes.
static_assert(sizeof(ka_fused_args) <= 4000, "ka_fused_args outgrows a kernel's parameters");

typedef void (*ka_fused_kernel_t)(const ka_fused_args);
// The fused kernel of head dim d (64, 128, 256) and query tile qt (1, 4, 8), a 1-D grid of
// KA_WARPS warps a block (kvg_cuda_attend_rows_d*.cu).
ka_fused_kernel_t ka_fused_kernel(int d, int qt);
ka_fused_kernel_t ka_fused_kernel_d64(int qt);
ka_fused_kernel_t ka_fused_kernel_d128(int qt);
ka_fused_kernel_t ka_fused_kernel_d256(int qt);

// One part of a pass (kvg_cuda_attend_pass.cu) once planned: its arguments checked, its kernel
// and its splits chosen. A run of coded rows is planned and queued in kvg_cuda_attend.cu, cells in
// kvg_cuda_attend_cells.cu; the pass then gives each its queries and its slots of partial sums.
struct ka_plan {
    int                         cells;      // 0: a run of coded rows (args), 1: cells (cargs / cell)
    int                         q_rotated;  // a run: its queries are rotated (rotq keys), else scaled
    int                         v_rotated;  // its value sums are in rotq's rotated domain
    int64_t                     n_splits;   // 0: no rows, nothing to queue
    int                         slot0;      // the pass's: its first slot of partial sums
    int                         tc, qt;     // the tensor-core kernel; else query tiles of qt
    int64_t                     n_tiles;
    ka_rows_kernel_t            kernel;  // a run: the row-parallel kernel; NULL: the generic one
    int                         fused;   // queued in the pass's fused kernel
    ka_args                     args;    // a run's
    kcl_args                    cargs;   // cells' (the scalar kernel)
    const kvg_cuda_cells_args * cell;    // cells' (the tensor-core kernel)
};
// A pass of one part folded into the state (m, l, acc) of n_q queries of dv values as it is: what
// kvg_cuda_attend and kvg_cuda_attend_cells are (kvg_cuda_attend_pass.cu).
int ka_pass_of_one(kvg_cuda_ctx * ctx, const kvg_cuda_part * part, int64_t n_q, int64_t dv, float * m, float * l,
                   float * acc);
// Plans a run (kvg_cuda_attend's checks) with at most about budget_floats of partial sums.
int ka_plan_run(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a, int64_t budget_floats, ka_plan * out);
// Plans cells (kvg_cuda_attend_cells' checks) the same way.
int ka_plan_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * a, int64_t budget_floats, ka_plan * out);
// Queues a planned part: q its queries ([n_q][dk]: a run's scaled, and rotated where q_rotated; the
// cells' as gathered), its splits' partial sums at slots [slot0, slot0 + n_splits) of pm, pl, pacc.
int ka_queue_run(kvg_cuda_ctx * ctx, ka_plan * p, const float * q, float * pm, float * pl, float * pacc, int n_slots,
                 int slot0);
int ka_queue_cells(kvg_cuda_ctx * ctx, ka_plan * p, float * pm, float * pl, float * pacc, int n_slots, int slot0);

// kivi.c's dequantization of a code against its group's stored f16 min and scale at g.
static __device__ __forceinline__ float ka_kivi_value(const uint8_t * g, unsigned code) {
    return kc_add(kc_f16_to_f32(kc_get_u16(g)), kc_mul((float) code, kc_f16_to_f32(kc_get_u16(g + 2))));
}

// Coordinate i of KV head hk of buffer row `row` of the K side, before the row's factor
// (ka_row_factor): rotq's codebook value, kivi's min + code * scale, f16's value.
template <int SRC>
static __device__ __forceinline__ float ka_key_at(const ka_args & a, int64_t row, int hk, int i) {
    const int64_t e = (row * a.n_head_kv + hk) * a.dk + i;  // the value's index in the block
    if constexpr (SRC == KA_SRC_F16) {
        return kc_f16_to_f32(kc_get_u16(a.k_codes + 2 * e));
    } else if constexpr (SRC == KA_SRC_KIVI) {  // groups per channel over G tokens
        const int64_t g = (row / a.group) * a.n_head_kv * a.dk + (int64_t) hk * a.dk + i;
        return ka_kivi_value(a.k_groups + 4 * g, kc_get_code(a.k_codes, (uint64_t) e * a.k_bits, a.k_bits));
    } else {
        return a.ktab.centroid[kc_get_code(a.k_codes, (uint64_t) e * a.k_bits, a.k_bits)];
    }
}

template <int SRC>
static __device__ __forceinline__ float ka_value_at(const ka_args & a, int64_t row, int hk, int i) {
    const int64_t e = (row * a.n_head_kv + hk) * a.dv + i;
    if constexpr (SRC == KA_SRC_F16) {
        return kc_f16_to_f32(kc_get_u16(a.v_codes + 2 * e));
    } else if constexpr (SRC == KA_SRC_KIVI) {  // groups per token over G channels
        const int64_t g = row * a.v_ncg + ((int64_t) hk * a.dv + i) / a.group;
        return ka_kivi_value(a.v_groups + 4 * g, kc_get_code(a.v_codes, (uint64_t) e * a.v_bits, a.v_bits));
    } else {
        return a.vtab.centroid[kc_get_code(a.v_codes, (uint64_t) e * a.v_bits, a.v_bits)];
    }
}

// The factor a row's coordinates take on a side whose per-row norms (rotq's) and 1 / head_dim are
// given: rotq's norm / head_dim, 1 for the other sources.
template <int SRC>
static __device__ __forceinline__ float ka_row_factor(const uint8_t * norms, float inv_d, int64_t row, int n_head_kv,
                                                      int hk) {
    if constexpr (SRC == KA_SRC_ROTQ) {
        return kc_f16_to_f32(kc_get_u16(norms + 2 * (row * n_head_kv + hk))) * inv_d;
    } else {
        return 1.0f;
    }
}

static __device__ __forceinline__ float ka_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

static __device__ __forceinline__ float ka_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

#define KA_Q8_0_BLOCK 32  // ggml's block_q8_0: an f16 scale, then 32 int8 codes
#define KA_Q8_0_BYTES 34

// llama.cpp's cells as kvg_cuda_attend_cells reads them, in both its split kernels: element i of KV
// head hk of cell c, f16 at its byte strides or a q8_0 block's scale times code.
static __device__ __forceinline__ float ka_cell(const uint8_t * base, int q8, size_t nb0, size_t nb1, size_t nb2,
                                                int hk, int64_t c, int i) {
    const uint8_t * row = base + (size_t) hk * nb1 + (size_t) c * nb2;
    if (q8) {
        const uint8_t * blk = row + (size_t) (i / KA_Q8_0_BLOCK) * KA_Q8_0_BYTES;
        return kc_f16_to_f32(kc_get_u16(blk)) * (float) (int8_t) blk[2 + i % KA_Q8_0_BLOCK];
    }
    return kc_f16_to_f32(kc_get_u16(row + (size_t) i * nb0));
}

// The mask's value for query token t and cell c (f32 or f16 rows of mask_nb1 bytes); 0 without one.
static __device__ __forceinline__ float ka_mask(const uint8_t * mask, int mask_f16, size_t mask_nb1, int64_t t,
                                                int64_t c) {
    if (mask == NULL) {
        return 0.0f;
    }
    const uint8_t * p = mask + (size_t) t * mask_nb1 + (size_t) c * (mask_f16 ? 2 : 4);
    if (mask_f16) {
        return kc_f16_to_f32(kc_get_u16(p));
    }
    float x;
    memcpy(&x, p, sizeof(x));
    return x;
}

// Caller's index j = t * n_head + hk * gqa + g of query p = t * gqa + g of KV head hk.
static __device__ __forceinline__ int64_t ka_query(int p, int hk, int gqa, int n_head) {
    return (int64_t) (p / gqa) * n_head + (int64_t) hk * gqa + p % gqa;
}

// The split's partial sums from its block's KA_WARPS warps: per query qq < nq of the tile starting
// at query p0 of KV head hk, M = max over the warps' wm, L = sum exp(wm - M) * wl, and each value
// coordinate i < dv the same weights over wacc, written at slot `slot` of pm / pl [j][n_slots] and
// pacc [j][n_slots][dv] (j the caller's index). wm, wl: [KA_WARPS][qt], wacc: [KA_WARPS][qt][dv].
// Called by every thread of the block after the warps have written theirs (__syncthreads).
static __device__ __forceinline__ void ka_merge_warps(const float * wm, const float * wl, const float * wacc, int qt,
                                                      int nq, int dv, int p0, int hk, int gqa, int n_head, int n_slots,
                                                      int slot, float * pm, float * pl, float * pacc) {
    for (int x = threadIdx.x; x < nq * dv; x += blockDim.x) {
        const int qq = x / dv, i = x % dv;
        float     M = -INFINITY;
        for (int w = 0; w < KA_WARPS; w++) {
            M = fmaxf(M, wm[w * qt + qq]);
        }
        float sum = 0.0f;
        for (int w = 0; w < KA_WARPS; w++) {
            const float mw = wm[w * qt + qq];
            if (mw != -INFINITY) {
                sum += expf(mw - M) * wacc[(w * qt + qq) * dv + i];
            }
        }
        pacc[(ka_query(p0 + qq, hk, gqa, n_head) * n_slots + slot) * dv + i] = sum;
    }
    for (int qq = threadIdx.x; qq < nq; qq += blockDim.x) {
        float M = -INFINITY, L = 0.0f;
        for (int w = 0; w < KA_WARPS; w++) {
            M = fmaxf(M, wm[w * qt + qq]);
        }
        for (int w = 0; w < KA_WARPS; w++) {
            const float mw = wm[w * qt + qq];
            if (mw != -INFINITY) {
                L += expf(mw - M) * wl[w * qt + qq];
            }
        }
        const int64_t j        = ka_query(p0 + qq, hk, gqa, n_head);
        pm[j * n_slots + slot] = M;
        pl[j * n_slots + slot] = L;
    }
}

// The row-parallel kernel (kvg_cuda_attend_rows.cu): head dims 64, 128 or 256 alike for K and V,
// rotq2..rotq4 codes.
int ka_rows_covers(int dk, int dv, int k_bits, int v_bits);
// Its kernel for a shape: (args, k codes 4-byte aligned, v codes 4-byte aligned), over grid
// (splits, KV heads, query tiles of qt: 1, 4 or 8 queries; 2 runs as 4), KA_WARPS warps a block.
ka_rows_kernel_t ka_rows_kernel(int d, int k_bits, int v_bits, int qt);
ka_rows_kernel_t ka_rows_kernel_d64(int k_bits, int v_bits, int qt);  // kvg_cuda_attend_rows_d*.cu
ka_rows_kernel_t ka_rows_kernel_d128(int k_bits, int v_bits, int qt);
ka_rows_kernel_t ka_rows_kernel_d256(int k_bits, int v_bits, int qt);
// The tensor-core kernel (kvg_cuda_attend_tc.cu) for many queries a KV head (prefill): tiles of
// KA_TC_QUERIES queries over chunks of 64 rows decoded into shared memory, from KA_TC_MIN_QUERIES
// queries a KV head on, on GPUs of compute capability 8.0 and up (KVGGUF_CUDA_ATTEND=rows: never),
// head dims 64, 80, 96, 128 or 256 alike for K and V, rows of any source.
#define KA_TC_QUERIES     64
#define KA_TC_MIN_QUERIES 64
int ka_tc_covers(const kvg_cuda_ctx * ctx, int dk, int dv, int64_t n_p);
// Rows a split takes (whole chunks of 64) so that about `splits_wanted` splits cover n_rows.
int64_t ka_tc_split_rows(int64_t n_rows, int64_t splits_wanted);
// Queues the kernel over grid (args.n_splits, KV heads, n_tiles query tiles).
int ka_tc_launch(kvg_cuda_ctx * ctx, const ka_args & args, int64_t n_tiles);
// The same kernel over llama.cpp's cells [c0, c1) of kvg_cuda_attend_cells (the gathered queries,
// scaled in the kernel; the mask added), n_splits of split_cells cells (whole chunks of 64), the
// partial sums into slots [slot0, slot0 + n_splits) of pm, pl, pacc as the cells' split kernel
// writes them.
int ka_tc_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * c, int64_t n_splits, int64_t split_cells, float * pm,
                float * pl, float * pacc, int n_slots, int slot0);
// Grows the context's attention scratch to at least `bytes` (waiting first for the work that may
// still read it): a pass's queries and partial sums.
int ka_scratch(kvg_cuda_ctx * ctx, size_t bytes);
// Rows a split takes so that about `splits_wanted` splits cover n_rows (whole block steps).
int64_t ka_rows_split_rows(int64_t n_rows, int64_t splits_wanted);

#endif  // KVG_CUDA_ATTEND_CUH
