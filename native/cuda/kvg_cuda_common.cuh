// kvg_cuda_common.cuh: what the CUDA sources share: the context, status words, CUDA error mapping,
// and device twins of the scalar reference's helpers (f16 conversion, splitmix64 signs, bit
// streams, the Walsh-Hadamard butterflies).
//
// Bit-exactness with the C reference (compiled with -ffp-contract=off): every float operation
// whose result reaches the encoded bytes or the decoded values is written as an explicit
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn, __dsub_rn, ...), which
// nvcc never contracts into an FMA nor replaces by an approximation, whatever -fmad or -prec-div
// say. The build passes -fmad=false besides, and -ftz=false (the default; -use_fast_math would
// flush denormals, which the C reference keeps). The f16 conversions are the integer algorithms
// of f16.c, not the hardware's, so no rounding mode or NaN convention of the device enters.
#ifndef KVG_CUDA_COMMON_CUH
#define KVG_CUDA_COMMON_CUH

#include "kvg_cuda.h"
#include "kvg_cuda_internal.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

// A launch, kernel<<<grid, block, smem, stream>>>(args...), and a kernel's dynamic shared memory,
// extern __shared__ type name[], written so that the same sources also build for the CPU emulator
// (native/cuda/emulator: no GPU, no nvcc), which cannot take either syntax.
#ifdef KVG_CUDA_EMULATOR
#    define KVG_LAUNCH(grid, block, smem, stream, ...) KVG_EMU_LAUNCH(grid, block, smem, stream, __VA_ARGS__)
#    define KVG_DYNAMIC_SMEM(type, name)               KVG_EMU_DYNAMIC_SMEM(type, name)
#else
#    define KVG_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#    define KVG_DYNAMIC_SMEM(type, name)               extern __shared__ __align__(128) type name[]
#endif

// ---- the context ---------------------------------------------------------------------------

// What a kernel reports: flag bits, and per flag the lowest index (element, vector or group)
// where it was raised, so a message can name the place the CPU reference would name.
enum {
    KC_NONFINITE = 0,  // a NaN or Inf in the input (element index t * C + c)
    KC_RANGE     = 1,  // a norm, min or scale beyond f16 (vector or group index)
    KC_CORRUPT   = 2,  // a stored norm, min or scale no encoder writes (vector or group index)
    KC_N_FLAGS   = 3
};

struct kc_status {
    unsigned int       flags;  // bit (1 << KC_*)
    unsigned int       pad;
    unsigned long long first[KC_N_FLAGS];
};

struct kvg_cuda_ctx {
    int          device;
    cudaStream_t stream;
    int          own_stream;
    kc_status *  d_status;  // device
    kc_status *  h_status;  // pinned host copy
    void *       scratch;   // attention workspace (device), grown on demand
    size_t       scratch_bytes;
    uint64_t     scratch_grown;   // times it was reallocated (a CUDA graph's kernels hold its address)
    int          sm_count;        // multiprocessors: how many blocks keep the device busy
    int          attend_generic;  // KVGGUF_CUDA_ATTEND=generic: the generic split kernel only (comparisons)
    int          attend_no_tc;    // KVGGUF_CUDA_ATTEND=rows: no tensor-core kernel for many queries either
    int          attend_parts;    // KVGGUF_CUDA_ATTEND=parts (or generic): a pass launches each part's kernel
    uint64_t     fused_launches;  // the pass's fused split kernel's launches (cuda_check counts them)
    int          cc_major;        // compute capability: the tensor-core kernel needs 8.0 (bf16/f16 WMMA, big smem)
    int          smem_optin;      // bytes of shared memory a block may opt in to
};

// kvg_fail with the CUDA error mapped to a status (kvg_cuda.h), naming the call that failed.
int kc_cuda_fail(cudaError_t e, const char * what);

// Makes ctx->device current for the scope and puts the caller's device back afterwards.
struct kc_device_scope {
    int prev    = -1;
    int changed = 0;
    int status  = 0;
    explicit kc_device_scope(const kvg_cuda_ctx * ctx) {
        if (cudaGetDevice(&prev) != cudaSuccess) {
            prev = -1;
        }
        if (prev != ctx->device) {
            const cudaError_t e = cudaSetDevice(ctx->device);
            changed             = e == cudaSuccess;
            status              = e == cudaSuccess ? 0 : kc_cuda_fail(e, "cudaSetDevice");
        }
    }
    ~kc_device_scope() {
        if (changed && prev >= 0) {
            cudaSetDevice(prev);
        }
    }
    kc_device_scope(const kc_device_scope &)             = delete;
    kc_device_scope & operator=(const kc_device_scope &) = delete;
};

// Resets ctx->d_status on the stream (kc_status_reset_kernel).
int kc_status_reset(kvg_cuda_ctx * ctx);
// The last launch's error, if any (kernels queued without waiting).
int kc_launch_check(const char * what);

// ---- helpers: twins of the C reference ------------------------------------------------------
//
// __host__ __device__: the kernels' bodies (kvg_cuda_kernels.cuh) are built from them, and
// native/cuda/tests/cuda_check.cu runs those bodies on the host too (--emulate), so the logic of
// every codec kernel is checked against the C reference on machines without a GPU. On the host the
// float operations are plain C++ operators (the build passes -ffp-contract=off to the host
// compiler, as the C library's build does).

#define KC_HD static __host__ __device__ __forceinline__

#define KC_GOLDEN 0x9E3779B97F4A7C15ULL

KC_HD float kc_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
KC_HD float kc_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
KC_HD float kc_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
KC_HD float kc_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
KC_HD float kc_sqrt(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}
KC_HD double kc_dsub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
KC_HD double kc_ddiv(double a, double b) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}
KC_HD float kc_d2f(double a) {
#ifdef __CUDA_ARCH__
    return __double2float_rn(a);
#else
    return (float) a;
#endif
}
KC_HD uint32_t kc_bits_of(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}
KC_HD float kc_float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

KC_HD void kc_flag(kc_status * st, int flag, unsigned long long index) {
#ifdef __CUDA_ARCH__
    atomicOr(&st->flags, 1u << flag);
    atomicMin(&st->first[flag], index);
#else
    st->flags |= 1u << flag;
    st->first[flag] = index < st->first[flag] ? index : st->first[flag];
#endif
}

// kvg_mix64 (splitmix64's finalizer) and rotq's sign of coordinate i (kvg_rotq_signs).
KC_HD uint64_t kc_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

KC_HD float kc_sign(uint64_t seed, int64_t i) {
    return (kc_mix64(seed + (uint64_t) (i + 1) * KC_GOLDEN) >> 63) ? -1.0f : 1.0f;
}

// kvg_f32_to_f16: round to nearest even; overflow gives +-Inf, NaN stays a quiet NaN.
KC_HD uint16_t kc_f32_to_f16(float f) {
    const uint32_t x    = kc_bits_of(f);
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000);
    const uint32_t ax   = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return (uint16_t) (sign | 0x7c00 | (ax > 0x7f800000u ? 0x0200 : 0));
    }
    if (ax >= 0x477ff000u) {
        return (uint16_t) (sign | 0x7c00);
    }
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) {
            return sign;
        }
        const uint32_t e     = ax >> 23;
        const uint32_t m     = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;
        uint32_t       q     = m >> shift;
        const uint32_t rem   = m & ((1u << shift) - 1);
        const uint32_t half  = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;
        }
        return (uint16_t) (sign | q);
    }
    const uint32_t r   = ax - ((uint32_t) (127 - 15) << 23);
    uint32_t       h   = r >> 13;
    const uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) {
        h++;
    }
    return (uint16_t) (sign | h);
}

// kvg_f16_to_f32: exact.
KC_HD float kc_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    const uint32_t exp  = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    uint32_t       x;
    if (exp == 0) {
        x = kc_bits_of(kc_mul((float) mant, 5.9604644775390625e-8f)) | sign;
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112) << 23) | (mant << 13);
    }
    return kc_float_of(x);
}

KC_HD int kc_f16_is_finite(uint16_t h) {
    return (h & 0x7c00) != 0x7c00;
}

KC_HD int kc_is_finite(float x) {
    return (kc_bits_of(x) & 0x7f800000u) != 0x7f800000u;
}

KC_HD uint16_t kc_f16_next_up(uint16_t h) {
    if (h == 0x8000 || h == 0x0000) {
        return 0x0001;
    }
    return (h & 0x8000) ? (uint16_t) (h - 1) : (uint16_t) (h + 1);
}

KC_HD uint16_t kc_f16_next_down(uint16_t h) {
    if (h == 0x8000 || h == 0x0000) {
        return 0x8001;
    }
    return (h & 0x8000) ? (uint16_t) (h + 1) : (uint16_t) (h - 1);
}

// Little-endian u16 at any byte address (blocks may start anywhere).
KC_HD uint16_t kc_get_u16(const uint8_t * p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}
KC_HD void kc_put_u16(uint8_t * p, uint16_t v) {
    p[0] = (uint8_t) (v & 0xff);
    p[1] = (uint8_t) (v >> 8);
}

// The code at bit `pos` of a little-endian bitstream (kvg_unpack_bits): reads the next byte only
// when the code spans it.
KC_HD unsigned kc_get_code(const uint8_t * src, uint64_t pos, int bits) {
    const unsigned  shift = (unsigned) (pos & 7);
    const uint8_t * p     = src + (pos >> 3);
    unsigned        v     = (unsigned) p[0] >> shift;
    if (shift + (unsigned) bits > 8) {
        v |= (unsigned) p[1] << (8 - shift);
    }
    return v & ((1u << bits) - 1);
}

// Byte `b` of a bitstream of codes (kvg_pack_bits): the bits of every code that overlaps it,
// code(e) giving code e of the n_codes; bits past the last code are 0.
template <typename CodeFn>
static __host__ __device__ __forceinline__ uint8_t kc_pack_byte(uint64_t b, int bits, uint64_t n_codes, CodeFn code) {
    const uint64_t lo = 8 * b;
    uint64_t       e1 = (lo + 7) / (uint64_t) bits;
    if (e1 >= n_codes) {
        e1 = n_codes - 1;
    }
    unsigned out = 0;
    for (uint64_t e = lo / (uint64_t) bits; e <= e1; e++) {
        const int64_t  pos = (int64_t) (e * (uint64_t) bits) - (int64_t) lo;  // may be negative
        const unsigned c   = code(e);
        out |= pos >= 0 ? c << pos : c >> -pos;
    }
    return (uint8_t) (out & 0xff);
}

// One butterfly of kvg_fwht_ref's stage h: pair p is (j, j + h), j = (p / h) * 2h + p % h.
KC_HD void kc_fwht_pair(float * y, int p, int h) {
    const int   j = (p / h) * 2 * h + (p % h);
    const float a = y[j];
    const float b = y[j + h];
    y[j]          = kc_add(a, b);
    y[j + h]      = kc_sub(a, b);
}

// kvg_fwht_ref on n vectors of d floats each in shared memory (y [n][d]), by the block: the same
// stages (h = 1, 2, 4, ...) and the same pairs, each a + b and a - b of the previous stage, so the
// floats are the reference's whatever order the pairs of a stage are done in. Starts and ends with
// a barrier.
static __device__ __forceinline__ void kc_fwht_block_n(float * y, int d, int n) {
    __syncthreads();
    for (int h = 1; h < d; h <<= 1) {
        for (int p = threadIdx.x; p < n * (d / 2); p += blockDim.x) {
            kc_fwht_pair(y + (p / (d / 2)) * d, p % (d / 2), h);
        }
        __syncthreads();
    }
}

static __device__ __forceinline__ void kc_fwht_block(float * y, int d) {
    kc_fwht_block_n(y, d, 1);
}

// Element (t, c) of a row block of src_type: f32 as is, f16 widened exactly.
KC_HD float kc_load(const void * src, int f16, int64_t index) {
    return f16 ? kc_f16_to_f32(((const uint16_t *) src)[index]) : ((const float *) src)[index];
}

KC_HD void kc_store(void * dst, int f16, int64_t index, float v) {
    if (f16) {
        ((uint16_t *) dst)[index] = kc_f32_to_f16(v);
    } else {
        ((float *) dst)[index] = v;
    }
}

// rotq's tables for one (head_dim, bits), passed to kernels by value.
struct kc_rotq_tab {
    float centroid[16];
    float boundary[16];
};

// ---- launchers (kvg_cuda_codecs.cu, kvg_cuda_attend.cu) --------------------------------------

struct kc_shape {
    int      type, kind, bits;
    int64_t  n_tokens, n_heads, head_dim, n_channels, n_values;
    int32_t  group_size;
    uint64_t seed;
};

// kvg_cuda.cu: what kvg_encode / kvg_decode validate plus the GPU's own limits, into a shape; and
// a kernel's flags as the status (and message) the CPU reference gives (decode: 1 for a decode).
int kc_prepare(int type, int kind, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const kvg_codec_params * p,
               kc_shape * s, size_t * size);
int kc_flags_status(const kc_shape * s, const kc_status * st, int decode);

int kc_encode_launch(kvg_cuda_ctx * ctx, const kc_shape * s, const void * src, int src_f16, int64_t rs, int64_t cs,
                     uint8_t * dst);
// dst NULL: the check kernel alone (kvg_cuda_check).
int kc_decode_launch(kvg_cuda_ctx * ctx, const kc_shape * s, const uint8_t * src, void * dst, int dst_f16, int64_t rs,
                     int64_t cs);
int kc_get_rotq_tab(int bits, int64_t head_dim, kc_rotq_tab * tab);

#endif  // KVG_CUDA_COMMON_CUH
