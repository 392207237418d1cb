// kvg_cuda_attend_cells.cuh: the cells' split kernel's body (kvg_cuda_attend_cells.cu's kernel, and
// the pass's fused kernel, kvg_cuda_attend_fused.cuh). Each warp walks its cells 32 at a time: per
// cell the lanes read the key's elements where llama.cpp keeps them (strides in bytes, so a
// transposed V is only other strides; q8_0 blocks read as scale times code, exactly as the CPU
// does), dot them with the tile's scaled queries and reduce over the warp; the mask is added, the
// 32 scores fold into the warp's (m, l) once, and the weighted values are summed in shared memory.
// Warps then merge into the split's (m, l, acc). Masked cells (-inf) weigh nothing, and a query
// that sees no cell of a split leaves that split at m = -inf.
#ifndef KVG_CUDA_ATTEND_CELLS_CUH
#define KVG_CUDA_ATTEND_CELLS_CUH

#include "kvg_cuda_attend.cuh"

#include <math.h>

// Split `split` of KV head hk's query tile `tile` of the cells, with the block's shared array sh:
// sq [QT][dk] (the tile's scaled queries), accs [KA_WARPS][QT][dv], wm and wl [KA_WARPS][QT].
// sq_ready: the caller has written sq (the pass's fused kernel); else it is read from a.q.
template <int QT>
static __device__ __forceinline__ void kcl_split_body(const kcl_args & a, const int split, const int hk, const int tile,
                                                      float * sh, const bool sq_ready) {
    const int dk = a.dk, dv = a.dv;
    float *   sq   = sh;
    float *   accs = sq + QT * dk;
    float *   wm   = accs + KA_WARPS * QT * dv;
    float *   wl   = wm + KA_WARPS * QT;

    const int p0   = tile * QT;
    const int nq   = a.n_p - p0 < QT ? a.n_p - p0 : QT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int x = threadIdx.x; x < QT * dk && !sq_ready; x += blockDim.x) {
        const int qq = x / dk;
        sq[x]        = qq < nq ? a.scale * a.q[ka_query(p0 + qq, hk, a.gqa, a.n_head) * dk + x % dk] : 0.0f;
    }
    float * my_acc = accs + warp * QT * dv;
    for (int x = lane; x < QT * dv; x += 32) {
        my_acc[x] = 0.0f;
    }
    float   m_run[QT], l_run[QT];
    int64_t tok[QT];  // each query's token: its row of the mask
#pragma unroll
    for (int qq = 0; qq < QT; qq++) {
        m_run[qq] = -INFINITY;
        l_run[qq] = 0.0f;
        tok[qq]   = (p0 + qq < a.n_p ? p0 + qq : p0) / a.gqa;
    }
    __syncthreads();

    const int64_t r_begin = (int64_t) split * a.split_cells;
    const int64_t r_end   = r_begin + a.split_cells < a.n_cells ? r_begin + a.split_cells : a.n_cells;
    for (int64_t base = r_begin + warp * 32; base < r_end; base += KA_WARPS * 32) {
        const int nc = r_end - base < 32 ? (int) (r_end - base) : 32;
        float     s_mine[QT];  // lane r: the scores of cell base + r
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            s_mine[qq] = -INFINITY;
        }
        for (int r = 0; r < nc; r++) {
            const int64_t c = a.c0 + base + r;
            float         part[QT];
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                part[qq] = 0.0f;
            }
            for (int i = lane; i < dk; i += 32) {
                const float kx = ka_cell(a.k, a.k_q8, a.k_nb0, a.k_nb1, a.k_nb2, hk, c, i);
#pragma unroll
                for (int qq = 0; qq < QT; qq++) {
                    part[qq] += sq[qq * dk + i] * kx;
                }
            }
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                float sc = ka_warp_sum(part[qq]);
                if (lane == r) {
                    sc         = a.softcap > 0.0f ? a.softcap * tanhf(sc) : sc;
                    s_mine[qq] = qq < nq ? sc + ka_mask(a.mask, a.mask_f16, a.mask_nb1, tok[qq], c) : -INFINITY;
                }
            }
        }
        float w_mine[QT];
        int   any = 0;
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            const float cmax = ka_warp_max(s_mine[qq]);
            if (cmax > m_run[qq]) {                         // warp-uniform; never while every score is -inf
                const float corr = expf(m_run[qq] - cmax);  // 0 while m is -inf
                l_run[qq] *= corr;
                for (int i = lane; i < dv; i += 32) {
                    my_acc[qq * dv + i] *= corr;
                }
                m_run[qq] = cmax;
            }
            w_mine[qq] = s_mine[qq] == -INFINITY ? 0.0f : expf(s_mine[qq] - m_run[qq]);
            l_run[qq] += ka_warp_sum(w_mine[qq]);
            any |= cmax != -INFINITY;
        }
        if (!any) {
            continue;  // every cell of the chunk masked for the tile
        }
        for (int r = 0; r < nc; r++) {
            const int64_t c = a.c0 + base + r;
            float         wr[QT];
            int           seen = 0;
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                wr[qq] = __shfl_sync(0xffffffffu, w_mine[qq], r);
                seen |= wr[qq] != 0.0f;
            }
            if (!seen) {
                continue;  // warp-uniform: the shuffled weights are the same in every lane
            }
            for (int i = lane; i < dv; i += 32) {
                const float vx = ka_cell(a.v, a.v_q8, a.v_nb0, a.v_nb1, a.v_nb2, hk, c, i);
#pragma unroll
                for (int qq = 0; qq < QT; qq++) {
                    my_acc[qq * dv + i] += wr[qq] * vx;
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

    // The block's warps merged: the split's (m, l, acc) per query.
    ka_merge_warps(wm, wl, accs, QT, nq, dv, p0, hk, a.gqa, a.n_head, a.n_slots, a.slot0 + split, a.pm, a.pl, a.pacc);
}

// The body alone over grid (splits, KV heads, query tiles), its shared memory dynamic.
template <int QT>
static __global__ void __launch_bounds__(KA_WARPS * 32) kcl_split_kernel(const kcl_args a) {
    KVG_DYNAMIC_SMEM(float, kcl_sh);
    kcl_split_body<QT>(a, blockIdx.x, blockIdx.y, blockIdx.z, kcl_sh, false);
}

#endif  // KVG_CUDA_ATTEND_CELLS_CUH
