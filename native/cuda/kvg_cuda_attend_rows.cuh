// kvg_cuda_attend_rows.cuh: kvg_cuda_attend's split kernel for the shapes decoding meets most (K and
// V head dims both 64, 128 or 256; rotq2, rotq3 or rotq4 codes), laid out for throughput:
//
// - keys: one lane per row. A warp loads 32 rows' codes at once and each lane dots its own row
//   with the tile's rotated queries (read from shared memory, the same address for every lane),
//   so no per-row reduction across lanes is needed;
// - the 32 scores fold into the warp's running max once per chunk (online softmax);
// - values: D / 8 lanes per row, 8 coordinates each, so each lane's codes are whole bytes; a
//   warp adds 32 / (D / 8) rows per step, each lane into 8 x QT accumulators in registers.
//   The value codes of the whole chunk are loaded before the keys are scored, so the chunk's
//   reads are in flight together.
//
// Each head dim's kernels are compiled in a file of their own (kvg_cuda_attend_rows_d*.cu), side
// by side: 27 of them a head dim, fully unrolled.
//
// The same sums as kvg_cuda_attend.cu's generic kernel (codebook value times rotated query,
// norm / head_dim, soft-capping, weights times codebook values in the rotated domain), added in
// another order; the block's warps then merge exactly as there, and the combine kernel is shared.
#ifndef KVG_CUDA_ATTEND_ROWS_CUH
#define KVG_CUDA_ATTEND_ROWS_CUH

#include "kvg_cuda_attend.cuh"

#include <stdint.h>

// Code i of a row whose bits (LSB first, as kvg_pack_bits writes them) the lane holds in w[].
template <int B, int N>
static __device__ __forceinline__ unsigned kr_code(const uint32_t (&w)[N], int i) {
    const int p = i * B, k = p >> 5, off = p & 31;
    if (off + B <= 32 || k + 1 >= N) {
        return (w[k] >> off) & ((1u << B) - 1u);
    }
    return __funnelshift_r(w[k], w[k + 1], (unsigned) off) & ((1u << B) - 1u);
}

// N words of a row's codes from p: 4-byte loads where the block's codes start 4-byte aligned
// (every row then does: its stride D * B / 8 is a multiple of 8), else 2-byte loads (always
// aligned: the norms before the codes take 2 bytes a vector).
template <int N>
static __device__ __forceinline__ void kr_load_row(uint32_t (&w)[N], const uint8_t * p, int aligned4) {
    if (aligned4) {
        const uint32_t * q = (const uint32_t *) p;
#pragma unroll
        for (int k = 0; k < N; k++) {
            w[k] = __ldg(q + k);
        }
    } else {
        const uint16_t * q = (const uint16_t *) p;
#pragma unroll
        for (int k = 0; k < N; k++) {
            w[k] = (uint32_t) __ldg(q + 2 * k) | ((uint32_t) __ldg(q + 2 * k + 1) << 16);
        }
    }
}

// The B bytes of 8 value codes at p (byte aligned: 8 codes of B bits).
template <int B>
static __device__ __forceinline__ uint32_t kr_load_8codes(const uint8_t * p, int aligned4) {
    if constexpr (B == 4) {
        if (aligned4) {
            return __ldg((const uint32_t *) p);
        }
        const uint16_t * q = (const uint16_t *) p;
        return (uint32_t) __ldg(q) | ((uint32_t) __ldg(q + 1) << 16);
    } else if constexpr (B == 2) {
        return __ldg((const uint16_t *) p);
    } else {
        return (uint32_t) __ldg(p) | ((uint32_t) __ldg(p + 1) << 8) | ((uint32_t) __ldg(p + 2) << 16);
    }
}

// The body's shared memory, in floats, carved from one array (16-byte aligned): sq [D][QT] (the
// tile's rotated queries, coordinate-major), wacc [KA_WARPS][QT][D], ktab and vtab [16], wm and wl
// [KA_WARPS][QT]. The pass's fused kernel (kvg_cuda_attend_fused.cuh) lends the same array to
// the cells' body.
template <int D, int QT>
struct kr_smem {
    static constexpr int SQ = 0, WACC = SQ + D * QT, KTAB = WACC + KA_WARPS * QT * D, VTAB = KTAB + 16, WM = VTAB + 16,
                         WL = WM + KA_WARPS * QT, FLOATS = WL + KA_WARPS * QT;
};

// Split `split` of KV head hk's query tile `tile`, with the block's shared array sh. sq_ready: the
// caller has written sq (the fused kernel computes the queries itself); else they are read from
// a.qr.
template <int D, int KB, int VB, int QT>
static __device__ __forceinline__ void kr_split_body(const ka_args & a, const int k_al4, const int v_al4,
                                                     const int split, const int hk, const int tile, float * sh,
                                                     const bool sq_ready) {
    constexpr int    G     = D / 8;                           // lanes per value row
    constexpr int    RPS   = 32 / G;                          // value rows a warp adds per step
    constexpr int    NK    = D * KB / 32;                     // 32-bit words of a key row's codes
    constexpr size_t K_ROW = D * KB / 8, V_ROW = D * VB / 8;  // bytes of one row's codes
    using L                    = kr_smem<D, QT>;
    float * const sq           = sh + L::SQ;  // [coordinate][query]
    float * const ktab         = sh + L::KTAB;
    float * const vtab         = sh + L::VTAB;
    float (*const wacc)[QT][D] = reinterpret_cast<float (*)[QT][D]>(sh + L::WACC);
    float (*const wm)[QT]      = reinterpret_cast<float (*)[QT]>(sh + L::WM);
    float (*const wl)[QT]      = reinterpret_cast<float (*)[QT]>(sh + L::WL);

    const int p0   = tile * QT;
    const int nq   = a.n_p - p0 < QT ? a.n_p - p0 : QT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int x = threadIdx.x; x < QT * D && !sq_ready; x += blockDim.x) {
        const int qq = x % QT, i = x / QT;
        sq[x] = qq < nq ? a.qr[ka_query(p0 + qq, hk, a.gqa, a.n_head) * D + i] : 0.0f;
    }
    if (threadIdx.x < 16) {
        ktab[threadIdx.x] = a.ktab.centroid[threadIdx.x];
        vtab[threadIdx.x] = a.vtab.centroid[threadIdx.x];
    }
    float m_run[QT], l_run[QT], acc[QT][8];
#pragma unroll
    for (int qq = 0; qq < QT; qq++) {
        m_run[qq] = -INFINITY;
        l_run[qq] = 0.0f;  // this lane's part
#pragma unroll
        for (int j = 0; j < 8; j++) {
            acc[qq][j] = 0.0f;
        }
    }
    __syncthreads();

    const int64_t r_begin = (int64_t) split * a.split_rows;
    const int64_t r_end   = r_begin + a.split_rows < a.n_rows ? r_begin + a.split_rows : a.n_rows;
    const int64_t H       = a.n_head_kv;
    const int     vl = lane % G, vr = lane / G;  // value coordinates [8 vl, 8 vl + 8) of row vr of a step
    for (int64_t base = r_begin + warp * 32; base < r_end; base += KA_WARPS * 32) {
        const int  nc    = r_end - base < 32 ? (int) (r_end - base) : 32;
        const bool valid = lane < nc;
        uint32_t   kw[NK];
        float      fk = 0.0f, fv = 0.0f;
        if (valid) {
            const int64_t vk = (a.k_row0 + base + lane) * H + hk;
            const int64_t vv = (a.v_row0 + base + lane) * H + hk;
            kr_load_row(kw, a.k_codes + vk * K_ROW, k_al4);
            fk = kc_f16_to_f32(kc_get_u16(a.k_norms + 2 * vk)) * a.inv_dk;
            fv = kc_f16_to_f32(kc_get_u16(a.v_norms + 2 * vv)) * a.inv_dv;
        } else {
#pragma unroll
            for (int k = 0; k < NK; k++) {
                kw[k] = 0;
            }
        }
        uint32_t vw[G];  // step t: row t * RPS + vr
#pragma unroll
        for (int t = 0; t < G; t++) {
            const int r = t * RPS + vr;
            vw[t] =
                r < nc ? kr_load_8codes<VB>(a.v_codes + ((a.v_row0 + base + r) * H + hk) * V_ROW + vl * VB, v_al4) : 0u;
        }

        float s[QT];
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            s[qq] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < D; i++) {
            const float c = ktab[kr_code<KB>(kw, i)];
            if constexpr (QT % 4 == 0) {
#pragma unroll
                for (int h = 0; h < QT / 4; h++) {
                    const float4 q4 = reinterpret_cast<const float4 *>(sq + i * QT)[h];
                    s[4 * h + 0]    = __fmaf_rn(c, q4.x, s[4 * h + 0]);
                    s[4 * h + 1]    = __fmaf_rn(c, q4.y, s[4 * h + 1]);
                    s[4 * h + 2]    = __fmaf_rn(c, q4.z, s[4 * h + 2]);
                    s[4 * h + 3]    = __fmaf_rn(c, q4.w, s[4 * h + 3]);
                }
            } else if constexpr (QT == 2) {
                const float2 q2 = reinterpret_cast<const float2 *>(sq)[i];
                s[0]            = __fmaf_rn(c, q2.x, s[0]);
                s[1]            = __fmaf_rn(c, q2.y, s[1]);
            } else {
                s[0] = __fmaf_rn(c, sq[i], s[0]);
            }
        }

        float w[QT];
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            float sc = -INFINITY;
            if (valid) {
                sc = s[qq] * fk;
                sc = a.softcap > 0.0f ? a.softcap * tanhf(sc) : sc;
            }
            const float cmax = ka_warp_max(sc);
            if (cmax > m_run[qq]) {                         // warp-uniform
                const float corr = expf(m_run[qq] - cmax);  // 0 while m is -inf
                l_run[qq] *= corr;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    acc[qq][j] *= corr;
                }
                m_run[qq] = cmax;
            }
            const float p = valid ? expf(sc - m_run[qq]) : 0.0f;
            l_run[qq] += p;
            w[qq] = p * fv;
        }

#pragma unroll
        for (int t = 0; t < G; t++) {
            if (t * RPS >= nc) {
                break;  // warp-uniform
            }
            float wr[QT];
#pragma unroll
            for (int qq = 0; qq < QT; qq++) {
                wr[qq] = __shfl_sync(0xffffffffu, w[qq], t * RPS + vr);
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float c = vtab[(vw[t] >> (j * VB)) & ((1u << VB) - 1u)];
#pragma unroll
                for (int qq = 0; qq < QT; qq++) {
                    acc[qq][j] = __fmaf_rn(wr[qq], c, acc[qq][j]);
                }
            }
        }
    }

    // The warp's lanes: value rows vr = 0 .. RPS-1 of the same coordinates summed, l summed.
#pragma unroll
    for (int qq = 0; qq < QT; qq++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int o = G; o < 32; o <<= 1) {
                acc[qq][j] += __shfl_xor_sync(0xffffffffu, acc[qq][j], o);
            }
        }
        l_run[qq] = ka_warp_sum(l_run[qq]);
    }
    if (lane < G) {
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                wacc[warp][qq][lane * 8 + j] = acc[qq][j];
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int qq = 0; qq < QT; qq++) {
            wm[warp][qq] = m_run[qq];
            wl[warp][qq] = l_run[qq];
        }
    }
    __syncthreads();

    // The block's warps merged: the split's (m, l, accr) per query, as the generic kernel does.
    ka_merge_warps(&wm[0][0], &wl[0][0], &wacc[0][0][0], QT, nq, D, p0, hk, a.gqa, a.n_head, a.n_slots, a.slot0 + split,
                   a.pm, a.pl, a.pacc);
}

// The body alone over grid (splits, KV heads, query tiles).
template <int D, int KB, int VB, int QT>
static __global__ void __launch_bounds__(KA_WARPS * 32)
    kr_split_kernel(const ka_args a, const int k_al4, const int v_al4) {
    __shared__ __align__(16) float sh[kr_smem<D, QT>::FLOATS];
    kr_split_body<D, KB, VB, QT>(a, k_al4, v_al4, blockIdx.x, blockIdx.y, blockIdx.z, sh, false);
}

template <int D, int KB, int VB>
static ka_rows_kernel_t kr_pick_qt(int qt) {
    switch (qt) {
        case 1:  return kr_split_kernel<D, KB, VB, 1>;
        case 8:  return kr_split_kernel<D, KB, VB, 8>;
        default: return kr_split_kernel<D, KB, VB, 4>;  // qt 2 or 4
    }
}

template <int D, int KB>
static ka_rows_kernel_t kr_pick_vb(int v_bits, int qt) {
    switch (v_bits) {
        case 2:  return kr_pick_qt<D, KB, 2>(qt);
        case 3:  return kr_pick_qt<D, KB, 3>(qt);
        default: return kr_pick_qt<D, KB, 4>(qt);
    }
}

template <int D>
static ka_rows_kernel_t kr_pick(int k_bits, int v_bits, int qt) {
    switch (k_bits) {
        case 2:  return kr_pick_vb<D, 2>(v_bits, qt);
        case 3:  return kr_pick_vb<D, 3>(v_bits, qt);
        default: return kr_pick_vb<D, 4>(v_bits, qt);
    }
}

#endif  // KVG_CUDA_ATTEND_ROWS_CUH
