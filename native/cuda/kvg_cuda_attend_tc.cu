// kvg_cuda_attend_tc.cu: kvg_cuda_attend's split kernel for many queries a KV head (prefill), on the
// tensor cores. The row-parallel kernel scores each row against a tile of at most 8 queries with
// scalar FMAs, so a 256-token ubatch (768 queries a KV head on the 3B shape) reads and unpacks
// every row's codes 96 times. Here a block takes 64 queries of one KV head and walks its split's
// rows 64 at a time:
//
// 1. the block's threads unpack the chunk's K and V codes into shared memory as f16 codebook values
//    (8 coordinates a thread and step: whole bytes of codes), and the rows' norms / head_dim;
// 2. each warp scores its 16 queries against the 64 rows with WMMA (f16 in, f32 out): the rotated
//    queries against the codebook values, then times the row's norm / head_dim and soft-capped;
// 3. online softmax per query (two lanes a query), the weights times the value rows' norms / head_dim
//    as f16, the warp's output rows rescaled in shared memory;
// 4. each warp adds weights x values (WMMA) into its output rows, which stay in shared memory.
//
// The split's (m, l, sum) per query go out as the other split kernels' do, and the shared combine
// kernel merges them (and turns the sum back from the rotated domain).
//
// Rows of other sources (kivi, f16, or rotq on one side only) load a coordinate a thread, as the
// generic kernel reads them (kvg_cuda_attend.cuh), into the same f16 rows; rotq's norms stay the
// rows' factors, 1 for the others.
//
// The same kernel takes llama.cpp's own cells for kvg_cuda_attend_cells (CELLS): each chunk's cells
// are read where they lie (f16 at any strides, q8_0 blocks) into the same shared rows, the queries
// are scaled instead of rotated, and the mask is added to the scores; a query that sees no cell of
// a chunk (masked) leaves its state as it was. Nothing else differs from
// kvg_cuda_attend_rows.cuh but the arithmetic: queries, codebook values and weights are rounded to
// f16 for the tensor cores (as llama.cpp's own CUDA flash attention rounds Q and its f16 cells), so
// its outputs agree with the CPU path to about 1e-3 of max |v| rather than 5e-5.
#include "kvg_cuda_attend.cuh"

#include <cuda_fp16.h>
#include <mma.h>
#include <string.h>

#define KT_Q       64  // queries a block: KT_WARPS warps of 16
#define KT_R       64  // rows a chunk
#define KT_WARPS   4
#define KT_THREADS (KT_WARPS * 32)

// Shared memory of the kernel for head dim D, in bytes from the start (every WMMA tile 32-byte
// aligned; leading dimensions padded against bank conflicts, as WMMA allows: halves a multiple of
// 8, floats of 4).
template <int D>
struct kt_layout {
    static constexpr int    LDQ   = D + 8;     // halves: queries [KT_Q][D], and K and V rows [KT_R][D]
    static constexpr int    LDS   = KT_R + 4;  // floats: scores [KT_Q][KT_R]
    static constexpr int    LDP   = KT_R + 8;  // halves: weights [KT_Q][KT_R]
    static constexpr int    LDO   = D + 4;     // floats: output sums [KT_Q][D]
    static constexpr size_t Q     = 0;
    static constexpr size_t K     = Q + 2 * KT_Q * LDQ;
    static constexpr size_t V     = K + 2 * KT_R * LDQ;
    static constexpr size_t S     = V + 2 * KT_R * LDQ;
    static constexpr size_t P     = S + 4 * KT_Q * LDS;
    static constexpr size_t O     = P + 2 * KT_Q * LDP;
    static constexpr size_t FK    = O + 4 * KT_Q * LDO;  // floats [KT_R]: K norm / head_dim
    static constexpr size_t FV    = FK + 4 * KT_R;       // floats [KT_R]: V norm / head_dim
    static constexpr size_t BYTES = FV + 4 * KT_R;
    static_assert(K % 32 == 0 && V % 32 == 0 && S % 32 == 0 && P % 32 == 0 && O % 32 == 0,
                  "WMMA tiles 32-byte aligned");
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// 8 codes of `bits` bits at p (whole bytes) as 8 f16 codebook values.
static __device__ __forceinline__ uint4 kt_decode8(const uint8_t * p, int bits, const float * tab) {
    uint32_t w = 0;
    for (int b = 0; b < bits; b++) {
        w |= (uint32_t) __ldg(p + b) << (8 * b);
    }
    const uint32_t mask = (1u << bits) - 1u;
    uint4          out;
    uint32_t *     o = &out.x;
#    pragma unroll
    for (int j = 0; j < 4; j++) {
        const __half2 h = __floats2half2_rn(tab[(w >> (2 * j * bits)) & mask], tab[(w >> ((2 * j + 1) * bits)) & mask]);
        o[j]            = *reinterpret_cast<const uint32_t *>(&h);
    }
    return out;
}
#endif

// A side's coordinate and row factor (kvg_cuda_attend.cuh) for a source known at run time: one
// kernel reads every mix (the sources only change how a chunk is loaded).
static __device__ __forceinline__ float kt_key(const ka_args & a, int64_t row, int hk, int i) {
    switch (a.k_src) {
        case KA_SRC_ROTQ: return ka_key_at<KA_SRC_ROTQ>(a, row, hk, i);
        case KA_SRC_KIVI: return ka_key_at<KA_SRC_KIVI>(a, row, hk, i);
        default:          return ka_key_at<KA_SRC_F16>(a, row, hk, i);
    }
}

static __device__ __forceinline__ float kt_value(const ka_args & a, int64_t row, int hk, int i) {
    switch (a.v_src) {
        case KA_SRC_ROTQ: return ka_value_at<KA_SRC_ROTQ>(a, row, hk, i);
        case KA_SRC_KIVI: return ka_value_at<KA_SRC_KIVI>(a, row, hk, i);
        default:          return ka_value_at<KA_SRC_F16>(a, row, hk, i);
    }
}

// src: the side's source; its norms and 1 / head_dim.
static __device__ __forceinline__ float kt_row_factor(int src, const uint8_t * norms, float inv_d, int64_t row,
                                                      int n_head_kv, int hk) {
    return src == KA_SRC_ROTQ ? ka_row_factor<KA_SRC_ROTQ>(norms, inv_d, row, n_head_kv, hk) : 1.0f;
}

// What the kernel reads for llama.cpp's cells (kvg_cuda_attend_cells): where they lie, the mask,
// the queries' scale (divided by the soft-cap where there is one).
struct kt_cells {
    const uint8_t * k;
    const uint8_t * v;
    size_t          k_nb0, k_nb1, k_nb2, v_nb0, v_nb1, v_nb2;
    int             k_q8, v_q8;
    int64_t         c0;
    const uint8_t * mask;  // NULL: none
    int             mask_f16;
    size_t          mask_nb1;
    float           scale;
};

template <int D, bool CELLS>
static __global__ void __launch_bounds__(KT_THREADS) kt_split_kernel(const ka_args a, const kt_cells cl) {
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(KVG_CUDA_EMULATOR)
    using namespace nvcuda;
    using L = kt_layout<D>;
    KVG_DYNAMIC_SMEM(unsigned char, kt_sh);
    __shared__ float ktab[16], vtab[16];
    half *           sQ = reinterpret_cast<half *>(kt_sh + L::Q);
    half *           sK = reinterpret_cast<half *>(kt_sh + L::K);
    half *           sV = reinterpret_cast<half *>(kt_sh + L::V);
    float *          sS = reinterpret_cast<float *>(kt_sh + L::S);
    half *           sP = reinterpret_cast<half *>(kt_sh + L::P);
    float *          sO = reinterpret_cast<float *>(kt_sh + L::O);
    float *          fk = reinterpret_cast<float *>(kt_sh + L::FK);
    float *          fv = reinterpret_cast<float *>(kt_sh + L::FV);

    const int split = blockIdx.x, hk = blockIdx.y, p0 = blockIdx.z * KT_Q;
    const int nq   = a.n_p - p0 < KT_Q ? a.n_p - p0 : KT_Q;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int H = a.n_head_kv;
    if (threadIdx.x < 16) {
        ktab[threadIdx.x] = a.ktab.centroid[threadIdx.x];
        vtab[threadIdx.x] = a.vtab.centroid[threadIdx.x];
    }
    const float qs = CELLS ? cl.scale : 1.0f;  // the coded rows' queries come scaled (and rotated for rotq keys)
    for (int x = threadIdx.x; x < KT_Q * D; x += KT_THREADS) {
        const int q = x / D, i = x % D;
        sQ[q * L::LDQ + i] = __float2half_rn(q < nq ? qs * a.qr[ka_query(p0 + q, hk, a.gqa, a.n_head) * D + i] : 0.0f);
    }
    for (int x = threadIdx.x; x < KT_Q * D; x += KT_THREADS) {
        sO[(x / D) * L::LDO + x % D] = 0.0f;
    }
    __syncthreads();

    // the warp's 16 queries, held for the whole split
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> qf[D / 16];
#    pragma unroll
    for (int k = 0; k < D / 16; k++) {
        wmma::load_matrix_sync(qf[k], sQ + warp * 16 * L::LDQ + k * 16, L::LDQ);
    }
    // this lane's query (row of the block's tile) and its half of each chunk's columns
    const int row = warp * 16 + lane / 2, side = lane % 2;
    float     m_run = -INFINITY, l_run = 0.0f;

    const int64_t r_begin = (int64_t) split * a.split_rows;
    const int64_t r_end   = r_begin + a.split_rows < a.n_rows ? r_begin + a.split_rows : a.n_rows;
    constexpr int G       = D / 8;  // groups of 8 coordinates a row
    const int64_t k_row_b = (int64_t) D * a.k_bits / 8, v_row_b = (int64_t) D * a.v_bits / 8;
    for (int64_t base = r_begin; base < r_end; base += KT_R) {
        const int nc = r_end - base < KT_R ? (int) (r_end - base) : KT_R;
        __syncthreads();        // every warp is done with the last chunk's rows
        if constexpr (CELLS) {  // the cells as they lie, rounded to f16 (they are f16, or q8_0)
            for (int x = threadIdx.x; x < KT_R * D; x += KT_THREADS) {
                const int     r = x / D, i = x % D;
                const int64_t c  = cl.c0 + base + r;
                float         kx = 0.0f, vx = 0.0f;
                if (r < nc) {
                    kx = ka_cell(cl.k, cl.k_q8, cl.k_nb0, cl.k_nb1, cl.k_nb2, hk, c, i);
                    vx = ka_cell(cl.v, cl.v_q8, cl.v_nb0, cl.v_nb1, cl.v_nb2, hk, c, i);
                }
                sK[r * L::LDQ + i] = __float2half_rn(kx);
                sV[r * L::LDQ + i] = __float2half_rn(vx);
            }
            for (int r = threadIdx.x; r < KT_R; r += KT_THREADS) {
                fk[r] = r < nc ? 1.0f : 0.0f;
                fv[r] = fk[r];
            }
        } else if (a.k_src == KA_SRC_ROTQ && a.v_src == KA_SRC_ROTQ) {  // 8 coordinates a thread: whole bytes
            for (int x = threadIdx.x; x < KT_R * G; x += KT_THREADS) {
                const int r = x / G, g = x % G;
                uint4     kk = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
                if (r < nc) {
                    const int64_t vk = (a.k_row0 + base + r) * H + hk, vx = (a.v_row0 + base + r) * H + hk;
                    kk = kt_decode8(a.k_codes + vk * k_row_b + g * a.k_bits, a.k_bits, ktab);
                    vv = kt_decode8(a.v_codes + vx * v_row_b + g * a.v_bits, a.v_bits, vtab);
                }
                *reinterpret_cast<uint4 *>(sK + r * L::LDQ + g * 8) = kk;
                *reinterpret_cast<uint4 *>(sV + r * L::LDQ + g * 8) = vv;
            }
            for (int r = threadIdx.x; r < KT_R; r += KT_THREADS) {
                float a_k = 0.0f, a_v = 0.0f;
                if (r < nc) {
                    const int64_t vk = (a.k_row0 + base + r) * H + hk, vx = (a.v_row0 + base + r) * H + hk;
                    a_k = kc_f16_to_f32(kc_get_u16(a.k_norms + 2 * vk)) * a.inv_dk;
                    a_v = kc_f16_to_f32(kc_get_u16(a.v_norms + 2 * vx)) * a.inv_dv;
                }
                fk[r] = a_k;
                fv[r] = a_v;
            }
        } else {  // kivi, f16, or rotq beside one of them: a coordinate a thread
            for (int x = threadIdx.x; x < KT_R * D; x += KT_THREADS) {
                const int r = x / D, i = x % D;
                float     kx = 0.0f, vx = 0.0f;
                if (r < nc) {
                    kx = kt_key(a, a.k_row0 + base + r, hk, i);
                    vx = kt_value(a, a.v_row0 + base + r, hk, i);
                }
                sK[r * L::LDQ + i] = __float2half_rn(kx);
                sV[r * L::LDQ + i] = __float2half_rn(vx);
            }
            for (int r = threadIdx.x; r < KT_R; r += KT_THREADS) {
                fk[r] =
                    r < nc ? kt_row_factor(a.k_src, a.k_norms, a.inv_dk, a.k_row0 + base + r, a.n_head_kv, hk) : 0.0f;
                fv[r] =
                    r < nc ? kt_row_factor(a.v_src, a.v_norms, a.inv_dv, a.v_row0 + base + r, a.n_head_kv, hk) : 0.0f;
            }
        }
        __syncthreads();

        // scores of the warp's 16 queries against the chunk's rows
#    pragma unroll
        for (int t = 0; t < KT_R / 16; t++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
            wmma::fill_fragment(sf, 0.0f);
#    pragma unroll
            for (int k = 0; k < D / 16; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> kf;  // K^T: (coordinate, row)
                wmma::load_matrix_sync(kf, sK + t * 16 * L::LDQ + k * 16, L::LDQ);
                wmma::mma_sync(sf, qf[k], kf, sf);
            }
            wmma::store_matrix_sync(sS + warp * 16 * L::LDS + t * 16, sf, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        // online softmax: the lane pair of each query splits the chunk's columns
        const float * srow = sS + row * L::LDS;
        half *        prow = sP + row * L::LDP;
        float         sc[KT_R / 2];
        float         mx  = -INFINITY;
        const int64_t tok = (p0 + (row < nq ? row : 0)) / a.gqa;  // the query's token: its row of the mask
#    pragma unroll
        for (int c = 0; c < KT_R / 2; c++) {
            const int r = side * (KT_R / 2) + c;
            float     s = -INFINITY;
            if (r < nc) {
                s = srow[r] * fk[r];
                s = a.softcap > 0.0f ? a.softcap * tanhf(s) : s;
                if constexpr (CELLS) {
                    s += ka_mask(cl.mask, cl.mask_f16, cl.mask_nb1, tok, cl.c0 + base + r);
                }
            }
            sc[c] = s;
            mx    = fmaxf(mx, s);
        }
        mx                = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m_run, mx);  // -inf only while every cell so far was masked
        const float corr  = m_new == -INFINITY ? 1.0f : expf(m_run - m_new);  // 0 while m_run is -inf
        float       sum   = 0.0f;
#    pragma unroll
        for (int c = 0; c < KT_R / 2; c++) {
            const int   r = side * (KT_R / 2) + c;
            const float p = r < nc && sc[c] != -INFINITY ? expf(sc[c] - m_new) : 0.0f;
            sum += p;
            prow[r] = __float2half_rn(p * fv[r]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run        = l_run * corr + sum;
        m_run        = m_new;
        float * orow = sO + row * L::LDO;
        for (int i = side * (D / 2); i < (side + 1) * (D / 2); i++) {
            orow[i] *= corr;
        }
        __syncwarp();

        // the warp's output rows += weights x values
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> pf[KT_R / 16];
#    pragma unroll
        for (int kk = 0; kk < KT_R / 16; kk++) {
            wmma::load_matrix_sync(pf[kk], sP + warp * 16 * L::LDP + kk * 16, L::LDP);
        }
#    pragma unroll
        for (int j = 0; j < D / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
            wmma::load_matrix_sync(of, sO + warp * 16 * L::LDO + j * 16, L::LDO, wmma::mem_row_major);
#    pragma unroll
            for (int kk = 0; kk < KT_R / 16; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> vf;
                wmma::load_matrix_sync(vf, sV + kk * 16 * L::LDQ + j * 16, L::LDQ);
                wmma::mma_sync(of, pf[kk], vf, of);
            }
            wmma::store_matrix_sync(sO + warp * 16 * L::LDO + j * 16, of, L::LDO, wmma::mem_row_major);
        }
        __syncwarp();
    }

    // the split's partial sums of this lane's query (in the rotated domain, as the other kernels')
    if (row < nq) {
        const int64_t j    = ka_query(p0 + row, hk, a.gqa, a.n_head);
        const float * orow = sO + row * L::LDO;
        if (side == 0) {
            a.pm[j * a.n_slots + a.slot0 + split] = m_run;
            a.pl[j * a.n_slots + a.slot0 + split] = l_run;
        }
        for (int i = side * (D / 2); i < (side + 1) * (D / 2); i++) {
            a.pacc[(j * a.n_slots + a.slot0 + split) * D + i] = orow[i];
        }
    }
#else
    (void) a;  // built for a GPU before compute capability 8.0: never launched (ka_tc_covers)
#endif
}

// Shared memory for head dim d; 0 for a head dim the kernel is not built for.
static size_t kt_smem(int d) {
    switch (d) {
        case 64:  return kt_layout<64>::BYTES;
        case 80:  return kt_layout<80>::BYTES;
        case 96:  return kt_layout<96>::BYTES;
        case 128: return kt_layout<128>::BYTES;
        case 256: return kt_layout<256>::BYTES;
        default:  return 0;
    }
}

int ka_tc_covers(const kvg_cuda_ctx * ctx, int dk, int dv, int64_t n_p) {
    return !ctx->attend_no_tc && ctx->cc_major >= 8 && n_p >= KA_TC_MIN_QUERIES && dk == dv && kt_smem(dk) > 0 &&
           kt_smem(dk) + 32 * sizeof(float) <= (size_t) ctx->smem_optin;
}

int64_t ka_tc_split_rows(int64_t n_rows, int64_t splits_wanted) {
    splits_wanted      = splits_wanted < 1 ? 1 : splits_wanted;
    const int64_t rows = (n_rows + splits_wanted - 1) / splits_wanted;
    return (rows + KT_R - 1) / KT_R * KT_R;  // whole chunks
}

template <int D, bool CELLS>
static int kt_launch_d(const ka_args & a, const kt_cells & cl, dim3 grid, cudaStream_t stream) {
    const size_t      smem = kt_layout<D>::BYTES;
    const cudaError_t e =
        cudaFuncSetAttribute(kt_split_kernel<D, CELLS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
    if (e != cudaSuccess) {
        return kc_cuda_fail(e, "cudaFuncSetAttribute (tensor-core attend: shared memory)");
    }
    KVG_LAUNCH(grid, KT_THREADS, smem, stream, kt_split_kernel<D, CELLS>)(a, cl);
    return kc_launch_check(CELLS ? "attend_cells split launch (tensor cores)" : "attend split launch (tensor cores)");
}

template <bool CELLS>
static int kt_launch(kvg_cuda_ctx * ctx, const ka_args & a, const kt_cells & cl, int64_t n_tiles) {
    const dim3 grid((unsigned) a.n_splits, (unsigned) a.n_head_kv, (unsigned) n_tiles);
    switch (a.dk) {
        case 64:  return kt_launch_d<64, CELLS>(a, cl, grid, ctx->stream);
        case 80:  return kt_launch_d<80, CELLS>(a, cl, grid, ctx->stream);
        case 96:  return kt_launch_d<96, CELLS>(a, cl, grid, ctx->stream);
        case 128: return kt_launch_d<128, CELLS>(a, cl, grid, ctx->stream);
        default:  return kt_launch_d<256, CELLS>(a, cl, grid, ctx->stream);
    }
}

int ka_tc_launch(kvg_cuda_ctx * ctx, const ka_args & a, int64_t n_tiles) {
    kt_cells none;
    memset(&none, 0, sizeof(none));
    return kt_launch<false>(ctx, a, none, n_tiles);
}

int ka_tc_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * c, int64_t n_splits, int64_t split_cells, float * pm,
                float * pl, float * pacc, int n_slots, int slot0) {
    const int64_t gqa = c->n_head / c->n_head_kv, n_p = (int64_t) c->n_tokens * gqa;
    ka_args       a;
    memset(&a, 0, sizeof(a));
    a.n_rows     = c->c1 - c->c0;
    a.n_head_kv  = c->n_head_kv;
    a.dk         = (int) c->head_dim_k;
    a.dv         = (int) c->head_dim_v;
    a.qr         = c->q_dev;  // as gathered: scaled in the kernel
    a.n_head     = c->n_head;
    a.gqa        = (int) gqa;
    a.n_p        = (int) n_p;
    a.softcap    = c->softcap;
    a.n_splits   = (int) n_splits;
    a.split_rows = split_cells;
    a.pm         = pm;
    a.pl         = pl;
    a.pacc       = pacc;
    a.n_slots    = n_slots;
    a.slot0      = slot0;
    kt_cells cl;
    memset(&cl, 0, sizeof(cl));
    cl.k        = (const uint8_t *) c->k_dev;
    cl.v        = (const uint8_t *) c->v_dev;
    cl.k_nb0    = c->k_nb[0];
    cl.k_nb1    = c->k_nb[1];
    cl.k_nb2    = c->k_nb[2];
    cl.v_nb0    = c->v_nb[0];
    cl.v_nb1    = c->v_nb[1];
    cl.v_nb2    = c->v_nb[2];
    cl.k_q8     = c->k_type == KVG_CELLS_Q8_0;
    cl.v_q8     = c->v_type == KVG_CELLS_Q8_0;
    cl.c0       = c->c0;
    cl.mask     = (const uint8_t *) c->mask_dev;
    cl.mask_f16 = c->mask_f16 != 0;
    cl.mask_nb1 = c->mask_nb1;
    cl.scale    = c->softcap > 0.0f ? c->scale / c->softcap : c->scale;  // as attend_f16.c caps
    return kt_launch<true>(ctx, a, cl, (n_p + KT_Q - 1) / KT_Q);
}
