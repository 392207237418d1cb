// kvg_cuda_codecs.cu: encode and decode kernels for f16, kivi and rotq, byte-identical to the
// scalar reference (f16.c, kivi.c, rotq.c): the same comparisons, roundings and order of float
// operations, written as round-to-nearest intrinsics (kvg_cuda_common.cuh says why). The bodies
// are in kvg_cuda_kernels.cuh, shared with the check program's host emulation.
//
// - f16: one thread per value.
// - kivi: one thread per group finds its min and max in the reference's order and writes the f16
//   min and scale; then one thread per byte of the code stream computes the codes that touch its
//   byte from the stored min and scale (as the reference does: it quantizes against the f16 values).
// - rotq: one block per head vector: the 8-lane sum of squares, the f16 norm, the signs, the
//   Walsh-Hadamard butterflies in shared memory, the Lloyd-Max boundaries, and the vector's bytes
//   (whole bytes from head_dim 8 on).
// Decoding checks every stored norm, min or scale first (one kernel) and decodes only if none is
// corrupt (the next), so dst is unchanged when the status is KVG_ERR_CORRUPT, as on the CPU.
#include "kvg_cuda_kernels.cuh"

static unsigned kc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    b         = b < 1 ? 1 : b;
    return (unsigned) (b < ((int64_t) 1 << 20) ? b : ((int64_t) 1 << 20));  // grid-stride loops do the rest
}

#define KC_THREADS 256
#define KC_FOR(i, n)                                                                                                   \
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < (n); i += (int64_t) gridDim.x * blockDim.x)

// ---- f16 -----------------------------------------------------------------------------------

static __global__ void kc_f16_encode_kernel(const void * src, int f16, int64_t rs, int64_t cs, int64_t C, int64_t n,
                                            uint8_t * dst, kc_status * st) {
    KC_FOR(e, n) {
        kc_f16_encode_at(e, src, f16, rs, cs, C, dst, st);
    }
}

static __global__ void kc_f16_check_kernel(const uint8_t * src, int64_t n, kc_status * st) {
    KC_FOR(e, n) {
        kc_f16_check_at(e, src, st);
    }
}

static __global__ void kc_f16_decode_kernel(const uint8_t * src, int64_t C, int64_t n, void * dst, int f16, int64_t rs,
                                            int64_t cs, const kc_status * st) {
    if (st->flags != 0) {
        return;
    }
    KC_FOR(e, n) {
        kc_f16_decode_at(e, src, C, dst, f16, rs, cs);
    }
}

// ---- kivi ----------------------------------------------------------------------------------

static __global__ void kc_kivi_groups_kernel(const kc_kivi k, const void * src, int f16, int64_t rs, int64_t cs,
                                             uint8_t * headers, kc_status * st) {
    KC_FOR(g, k.n_groups) {
        kc_kivi_group_at(g, k, src, f16, rs, cs, headers, st);
    }
}

static __global__ void kc_kivi_codes_kernel(const kc_kivi k, const void * src, int f16, int64_t rs, int64_t cs,
                                            const uint8_t * headers, uint8_t * codes) {
    KC_FOR(b, k.code_bytes) {
        codes[b] = kc_kivi_code_byte_at(b, k, src, f16, rs, cs, headers);
    }
}

static __global__ void kc_kivi_check_kernel(const kc_kivi k, const uint8_t * headers, kc_status * st) {
    KC_FOR(g, k.n_groups) {
        kc_kivi_check_at(g, headers, st);
    }
}

static __global__ void kc_kivi_decode_kernel(const kc_kivi k, const uint8_t * headers, const uint8_t * codes,
                                             void * dst, int f16, int64_t rs, int64_t cs, const kc_status * st) {
    if (st->flags != 0) {
        return;
    }
    KC_FOR(e, k.n_values) {
        kc_kivi_decode_at(e, k, headers, codes, dst, f16, rs, cs);
    }
}

// ---- rotq ----------------------------------------------------------------------------------

static int kc_rotq_threads(int64_t d) {
    return d >= 256 ? 128 : d / 2 < 32 ? 32 : (int) (d / 2);
}

// One block per head vector (grid-stride over vectors). Shared: y (D floats), then the codes (D bytes).
static __global__ void kc_rotq_encode_kernel(const kc_rotq r, const void * src, int f16, int64_t rs, int64_t cs,
                                             uint8_t * norms, uint8_t * codes, kc_status * st) {
    KVG_DYNAMIC_SMEM(float, kc_sh);
    float *          y = kc_sh;
    uint8_t *        q = (uint8_t *) (kc_sh + r.D);
    __shared__ float lanes[8];
    __shared__ float s_inv;
    __shared__ int   s_skip;
    const int        D = (int) r.D;
    for (int64_t v = blockIdx.x; v < r.n_vec; v += gridDim.x) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            kc_rotq_load_at(i, v, r, src, f16, rs, cs, y, st);
        }
        __syncthreads();
        if (threadIdx.x < 8) {
            lanes[threadIdx.x] = kc_rotq_lane_at(threadIdx.x, r, y);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int   skip = 0;
            float inv  = 0.0f;
            kc_rotq_norm(v, lanes, norms, st, &skip, &inv);
            s_skip = skip;
            s_inv  = inv;
        }
        __syncthreads();
        const int skip = s_skip;
        if (!skip) {
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                kc_rotq_sign_at(i, r, y);
            }
            kc_fwht_block(y, D);
            const float inv = s_inv;
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                kc_rotq_quant_at(i, r, y, inv, q);
            }
            __syncthreads();
        }
        uint8_t * out = codes + v * r.vbytes;
        for (int64_t b = threadIdx.x; b < r.vbytes; b += blockDim.x) {
            out[b] = kc_rotq_pack_at(b, r, q, skip);
        }
        __syncthreads();
    }
}

static __global__ void kc_rotq_check_kernel(const kc_rotq r, const uint8_t * norms, kc_status * st) {
    KC_FOR(v, r.n_vec) {
        kc_rotq_check_at(v, norms, st);
    }
}

static __global__ void kc_rotq_decode_kernel(const kc_rotq r, const uint8_t * norms, const uint8_t * codes, float inv_d,
                                             void * dst, int f16, int64_t rs, int64_t cs, const kc_status * st) {
    if (st->flags != 0) {
        return;
    }
    KVG_DYNAMIC_SMEM(float, kc_sh);
    float *   y = kc_sh;
    const int D = (int) r.D;
    for (int64_t v = blockIdx.x; v < r.n_vec; v += gridDim.x) {
        const uint16_t n16 = kc_get_u16(norms + 2 * v);
        if (n16 != 0) {
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                kc_rotq_centroid_at(i, v, r, codes, y);
            }
            kc_fwht_block(y, D);
        }
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            kc_rotq_out_at(i, v, r, y, n16, inv_d, dst, f16, rs, cs);
        }
        __syncthreads();
    }
}

// ---- launchers -----------------------------------------------------------------------------

int kc_encode_launch(kvg_cuda_ctx * ctx, const kc_shape * s, const void * src, int src_f16, int64_t rs, int64_t cs,
                     uint8_t * dst) {
    cudaStream_t stream = ctx->stream;
    if (s->type == KVG_CODEC_F16) {
        KVG_LAUNCH(kc_blocks(s->n_values, KC_THREADS), KC_THREADS, 0, stream,
                   kc_f16_encode_kernel)(src, src_f16, rs, cs, s->n_channels, s->n_values, dst, ctx->d_status);
        return kc_launch_check("f16 encode launch");
    }
    if (s->type >= KVG_CODEC_KIVI2 && s->type <= KVG_CODEC_KIVI8) {
        const kc_kivi k = kc_kivi_of(s);
        KVG_LAUNCH(kc_blocks(k.n_groups, KC_THREADS), KC_THREADS, 0, stream,
                   kc_kivi_groups_kernel)(k, src, src_f16, rs, cs, dst, ctx->d_status);
        const int st = kc_launch_check("kivi groups launch");
        if (st != KVG_OK) {
            return st;
        }
        KVG_LAUNCH(kc_blocks(k.code_bytes, KC_THREADS), KC_THREADS, 0, stream,
                   kc_kivi_codes_kernel)(k, src, src_f16, rs, cs, dst, dst + 4 * k.n_groups);
        return kc_launch_check("kivi codes launch");
    }
    kc_rotq   r;
    const int st = kc_rotq_of(s, &r);
    if (st != KVG_OK) {
        return st;
    }
    const size_t smem = (size_t) r.D * (sizeof(float) + 1);
    KVG_LAUNCH(kc_blocks(r.n_vec, 1), kc_rotq_threads(r.D), smem, stream,
               kc_rotq_encode_kernel)(r, src, src_f16, rs, cs, dst, dst + 2 * r.n_vec, ctx->d_status);
    return kc_launch_check("rotq encode launch");
}

int kc_decode_launch(kvg_cuda_ctx * ctx, const kc_shape * s, const uint8_t * src, void * dst, int dst_f16, int64_t rs,
                     int64_t cs) {
    cudaStream_t stream = ctx->stream;
    if (s->type == KVG_CODEC_F16) {
        KVG_LAUNCH(kc_blocks(s->n_values, KC_THREADS), KC_THREADS, 0, stream, kc_f16_check_kernel)(src, s->n_values,
                                                                                                   ctx->d_status);
        const int st = kc_launch_check("f16 check launch");
        if (st != KVG_OK || dst == NULL) {
            return st;  // dst NULL: kvg_cuda_check
        }
        KVG_LAUNCH(kc_blocks(s->n_values, KC_THREADS), KC_THREADS, 0, stream,
                   kc_f16_decode_kernel)(src, s->n_channels, s->n_values, dst, dst_f16, rs, cs, ctx->d_status);
        return kc_launch_check("f16 decode launch");
    }
    if (s->type >= KVG_CODEC_KIVI2 && s->type <= KVG_CODEC_KIVI8) {
        const kc_kivi k = kc_kivi_of(s);
        KVG_LAUNCH(kc_blocks(k.n_groups, KC_THREADS), KC_THREADS, 0, stream, kc_kivi_check_kernel)(k, src,
                                                                                                   ctx->d_status);
        const int st = kc_launch_check("kivi check launch");
        if (st != KVG_OK || dst == NULL) {
            return st;
        }
        KVG_LAUNCH(kc_blocks(k.n_values, KC_THREADS), KC_THREADS, 0, stream,
                   kc_kivi_decode_kernel)(k, src, src + 4 * k.n_groups, dst, dst_f16, rs, cs, ctx->d_status);
        return kc_launch_check("kivi decode launch");
    }
    kc_rotq r;
    int     st = kc_rotq_of(s, &r);
    if (st != KVG_OK) {
        return st;
    }
    KVG_LAUNCH(kc_blocks(r.n_vec, KC_THREADS), KC_THREADS, 0, stream, kc_rotq_check_kernel)(r, src, ctx->d_status);
    st = kc_launch_check("rotq check launch");
    if (st != KVG_OK || dst == NULL) {
        return st;
    }
    const float inv_d = 1.0f / (float) r.D;  // exact: a power of two, as rotq.c's 1.0f / (float) d
    KVG_LAUNCH(kc_blocks(r.n_vec, 1), kc_rotq_threads(r.D), (size_t) r.D * sizeof(float), stream,
               kc_rotq_decode_kernel)(r, src, src + 2 * r.n_vec, inv_d, dst, dst_f16, rs, cs, ctx->d_status);
    return kc_launch_check("rotq decode launch");
}
