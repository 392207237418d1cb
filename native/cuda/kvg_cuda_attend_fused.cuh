// kvg_cuda_attend_fused.cuh: the pass's fused split kernel (kvg_cuda_attend.cuh, ka_fused_args).
//
// A decoded token's layer is a few parts (the sinks' f16 rows, the archive's and the warm rows'
// runs, the hot cells), each too small to fill the device alone, and each its own launch plus the
// queries' kernel before them. Here they are one launch: a 1-D grid whose blocks find their part,
// compute their tile's queries from where llama.cpp holds them, and run that part's body
// (kvg_cuda_attend_rows.cuh's for a run of rotq codes, kvg_cuda_attend_cells.cuh's for cells).
// The queries are the queries kernel's floats (the same rounding, scale, signs and butterflies),
// so a fused pass gives the per-part kernels' floats. Compiled once per head dim, beside the
// row-parallel kernels (kvg_cuda_attend_rows_d*.cu).
#ifndef KVG_CUDA_ATTEND_FUSED_CUH
#define KVG_CUDA_ATTEND_FUSED_CUH

#include "kvg_cuda_attend_cells.cuh"
#include "kvg_cuda_attend_rows.cuh"

#include <string.h>

template <int D, int QT, int KB>
static __device__ __forceinline__ void kf_rows_vb(const ka_fused_part & P, int split, int hk, int tile, float * sh) {
    switch (P.v_bits) {
        case 2:  kr_split_body<D, KB, 2, QT>(P.run, P.k_al4, P.v_al4, split, hk, tile, sh, true); break;
        case 3:  kr_split_body<D, KB, 3, QT>(P.run, P.k_al4, P.v_al4, split, hk, tile, sh, true); break;
        default: kr_split_body<D, KB, 4, QT>(P.run, P.k_al4, P.v_al4, split, hk, tile, sh, true); break;
    }
}

template <int D, int QT>
static __global__ void __launch_bounds__(KA_WARPS * 32) kf_split_kernel(const ka_fused_args f) {
    using L = kr_smem<D, QT>;
    __shared__ __align__(16) float sh[L::FLOATS];
    int                            pi = 0;  // the block's part, then its split, KV head and query tile
    const int64_t                  b  = blockIdx.x;
    while (pi + 1 < f.n_parts && b >= f.part[pi + 1].block0) {
        pi++;
    }
    const ka_fused_part & P     = f.part[pi];
    const int64_t         local = b - P.block0;
    const int             split = (int) (local % P.n_splits);
    const int             hk    = (int) (local / P.n_splits % f.n_head_kv);
    const int             tile  = (int) (local / P.n_splits / f.n_head_kv);
    const int             p0    = tile * QT;
    const int             nq    = f.n_p - p0 < QT ? f.n_p - p0 : QT;
    const bool            rows  = P.kind == KA_FUSED_ROWS;  // block-uniform

    // The tile's queries, [QT][D]: a run's signed and scaled in wacc's room (rotated below), the
    // cells' scaled in their sq. As the queries kernel and the cells kernel compute them.
    float * const y       = rows ? sh + L::WACC : sh;
    const bool    write_q = f.q_dst != NULL && pi == 0 && split == 0;
    for (int x = threadIdx.x; x < QT * D; x += blockDim.x) {
        const int qq = x / D, i = x % D;
        float     v = 0.0f;
        if (qq < nq) {
            const int64_t j = ka_query(p0 + qq, hk, f.gqa, f.n_head);
            const int64_t t = j / f.n_head, h = j % f.n_head;
            memcpy(&v, P.q.src + (size_t) i * P.q.nb0 + (size_t) h * P.q.nb1 + (size_t) t * P.q.nb2, sizeof(v));
            v = P.q.round_f16 ? kc_f16_to_f32(kc_f32_to_f16(v)) : v;
            if (write_q) {
                f.q_dst[j * D + i] = v;
            }
        }
        y[x] = rows ? kc_sign(f.seed, i) * (f.rot_scale * v) : (qq < nq ? P.cells.scale * v : 0.0f);
    }
    if (!rows) {
        kcl_split_body<QT>(P.cells, split, hk, tile, sh, true);  // its first barrier orders sq
        return;
    }
    kc_fwht_block_n(y, D, QT);
    float * const sq = sh + L::SQ;  // [coordinate][query], as the body reads it
    for (int x = threadIdx.x; x < QT * D; x += blockDim.x) {
        const int qq = x % QT, i = x / QT;
        sq[x] = qq < nq ? y[qq * D + i] : 0.0f;
    }
    // (the body's barrier after its tables orders sq, and the reads of y before its wacc writes)
    switch (P.k_bits) {
        case 2:  kf_rows_vb<D, QT, 2>(P, split, hk, tile, sh); break;
        case 3:  kf_rows_vb<D, QT, 3>(P, split, hk, tile, sh); break;
        default: kf_rows_vb<D, QT, 4>(P, split, hk, tile, sh); break;
    }
}

template <int D>
static ka_fused_kernel_t kf_pick(int qt) {
    switch (qt) {
        case 1:  return kf_split_kernel<D, 1>;
        case 8:  return kf_split_kernel<D, 8>;
        default: return kf_split_kernel<D, 4>;
    }
}

#endif  // KVG_CUDA_ATTEND_FUSED_CUH
