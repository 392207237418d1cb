// kvg_cuda_emulator.h: enough of CUDA, on the CPU, to run libkvgguf's CUDA sources unchanged
// where there is no GPU, so that the kernels' logic (and not only their syntax) is checked on
// every CI run. Built with the host's C++ compiler in place of nvcc: this folder stands in for
// cuda_runtime.h, cuda_fp16.h and mma.h (scripts/cuda_emulate_check.sh).
//
// - A launch runs its blocks one after another; a block's threads are fibers on one OS thread,
//   switched only at __syncthreads, __syncwarp, a shuffle or a WMMA call, so a run is
//   deterministic. A barrier that part of a block or warp never reaches, or a warp operation
//   after some of its lanes have returned, is reported as an error (the GPU's behaviour there is
//   undefined), and the lanes of a warp can be run in reverse order (KVG_EMU_ORDER=reverse) to
//   show reads of another lane's writes that no barrier orders.
// - __shared__ arrays are statics of their kernel (one block runs at a time); dynamic shared
//   memory is allocated per launch at exactly the size asked for, filled with 0xff bytes (NaN as
//   floats), so that under AddressSanitizer a read past it or before any write shows.
// - Device memory is host memory from malloc, tracked: a copy whose kind does not match its
//   pointers, or a free of what cudaMalloc did not return, fails as CUDA would fail it. A launch
//   is checked as the GPU checks it (block size, grid, shared memory against
//   cudaFuncSetAttribute's opt-in), and its error is sticky for cudaGetLastError.
// - WMMA fragments hold the whole 16x16 tile in every lane (the layout of a fragment's elements is
//   not used by the sources); mma_sync sums in f32.
// - Float arithmetic is the host's: results agree with a GPU's to the kernels' stated bounds, not
//   bit for bit where the device would differ (expf, fused multiply-adds), and nothing about
//   speed carries over.
#ifndef KVG_CUDA_EMULATOR_H
#define KVG_CUDA_EMULATOR_H

#ifndef __cplusplus
#    error "kvg_cuda_emulator.h is C++: compile the .cu sources with -x c++"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define KVG_CUDA_EMULATOR 1

// ---- keywords ------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __shared__      static
#define __constant__    static
#define __forceinline__ __attribute__((unused))
#define __noinline__    __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n)   __attribute__((aligned(n)))
#define __restrict__   __restrict
#define CUDART_VERSION 13000

// ---- vector types and the built-in variables ------------------------------------------------

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{ x, y, z, w };
}
static inline float2 make_float2(float x, float y) {
    return float2{ x, y };
}
static inline float4 make_float4(float x, float y, float z, float w) {
    return float4{ x, y, z, w };
}

namespace kvg_emu {
struct thread_state;
extern thread_state * g_current;  // the fiber running
extern uint3          g_block_idx;
extern dim3           g_block_dim, g_grid_dim;
uint3                 thread_idx();
void *                dynamic_smem();
}  // namespace kvg_emu

#define threadIdx (::kvg_emu::thread_idx())
#define blockIdx  (::kvg_emu::g_block_idx)
#define blockDim  (::kvg_emu::g_block_dim)
#define gridDim   (::kvg_emu::g_grid_dim)

// extern __shared__ T name[] of the sources (KVG_DYNAMIC_SMEM in kvg_cuda_common.cuh)
#define KVG_EMU_DYNAMIC_SMEM(type, name) type * name = (type *) ::kvg_emu::dynamic_smem()

// ---- barriers, warp operations, atomics, intrinsics ----------------------------------------

namespace kvg_emu {
void     sync_block();
void     sync_warp(unsigned mask);
uint64_t shuffle(unsigned mask, uint64_t v, int src_lane, int width, int kind);  // kind: 0 index, 1 xor
}  // namespace kvg_emu

static inline void __syncthreads() {
    ::kvg_emu::sync_block();
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ::kvg_emu::sync_warp(mask);
}

template <class T>
static inline T kvg_emu_shuffle(unsigned mask, T v, int lane, int width, int kind) {
    static_assert(sizeof(T) <= 8, "shuffles of at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    u = ::kvg_emu::shuffle(mask, u, lane, width, kind);
    T r;
    memcpy(&r, &u, sizeof(T));
    return r;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return kvg_emu_shuffle(mask, v, src, width, 0);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return kvg_emu_shuffle(mask, v, lane_mask, width, 1);
}

// One block runs at a time, on one OS thread: a plain read-modify-write is atomic.
template <class T>
static inline T atomicOr(T * p, T v) {
    const T old = *p;
    *p          = old | v;
    return old;
}
template <class T>
static inline T atomicMin(T * p, T v) {
    const T old = *p;
    *p          = v < old ? v : old;
    return old;
}
template <class T>
static inline T atomicMax(T * p, T v) {
    const T old = *p;
    *p          = v > old ? v : old;
    return old;
}
template <class T>
static inline T atomicAdd(T * p, T v) {
    const T old = *p;
    *p          = old + v;
    return old;
}

template <class T>
static inline T __ldg(const T * p) {
    return *p;
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned) ((((uint64_t) hi << 32) | lo) >> (shift & 31u));
}
// The host's IEEE operations, round to nearest (the build keeps them from contracting).
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fsub_rn(float a, float b) {
    return a - b;
}
static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __fdiv_rn(float a, float b) {
    return a / b;
}
static inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline double __dsub_rn(double a, double b) {
    return a - b;
}
static inline double __ddiv_rn(double a, double b) {
    return a / b;
}
static inline float __double2float_rn(double a) {
    return (float) a;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof(u));
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
static inline float __fdividef(float a, float b) {
    return a / b;
}

// ---- f16 (cuda_fp16.h) ----------------------------------------------------------------------

struct __half {
    uint16_t x;
};
struct alignas(4) __half2 {
    __half x, y;
};
typedef __half  __half_raw;  // the raw bits, as cuda_fp16.h's
typedef __half  half;
typedef __half2 half2;

namespace kvg_emu {
uint16_t f32_to_f16(float f);  // round to nearest even, as the hardware's __float2half_rn
float    f16_to_f32(uint16_t h);
}  // namespace kvg_emu

static inline __half __float2half_rn(float f) {
    return __half{ ::kvg_emu::f32_to_f16(f) };
}
static inline __half __float2half(float f) {
    return __float2half_rn(f);
}
static inline float __half2float(__half h) {
    return ::kvg_emu::f16_to_f32(h.x);
}
static inline __half2 __floats2half2_rn(float a, float b) {
    return __half2{ __float2half_rn(a), __float2half_rn(b) };
}

// ---- WMMA (mma.h): the 16x16x16 shapes, f16 in, f32 accumulated ------------------------------

namespace kvg_emu {
void wmma_enter();  // a WMMA call is warp-synchronous: every lane of the warp arrives first
// After every lane of the warp arrived, the warp's first lane computes the tile and the others take
// it (their arguments are the same): d = c + a b (16x16 each, row-major floats), or the 16x16 tile
// at p (f16 or f32, rows or columns ldm apart) as floats.
void wmma_mma(float * d, const float * a, const float * b, const float * c);
void wmma_load(float * dst, const void * p, unsigned ldm, bool is_half, bool col);
}  // namespace kvg_emu

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// Use: matrix_a (M x K), matrix_b (K x N) or accumulator (M x N), held whole in every lane as floats
// (f16 values are exact in them).
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has WMMA's 16x16x16 shapes only");
    float v[16][16];
};

template <class Use, class T, class Layout, class P>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> & f, const P * p, unsigned ldm) {
    static_assert(std::is_same<P, __half>::value || std::is_same<P, float>::value, "f16 or f32 tiles");
    ::kvg_emu::wmma_load(&f.v[0][0], p, ldm, std::is_same<P, __half>::value, std::is_same<Layout, col_major>::value);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> & f, const float * p, unsigned ldm,
                                    layout_t l) {
    ::kvg_emu::wmma_load(&f.v[0][0], p, ldm, false, l == mem_col_major);
}
template <class T>
static inline void store_matrix_sync(T * p, const fragment<accumulator, 16, 16, 16, T> & f, unsigned ldm, layout_t l) {
    ::kvg_emu::wmma_enter();
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) {
            (l == mem_col_major ? p[(size_t) c * ldm + r] : p[(size_t) r * ldm + c]) = (T) f.v[r][c];
        }
    }
}
template <class Use, class T, class Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> & f, T x) {
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) {
            f.v[r][c] = (float) x;
        }
    }
}
template <class TA, class LA, class TB, class LB, class TC>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, TC> & d, const fragment<matrix_a, 16, 16, 16, TA, LA> & a,
                            const fragment<matrix_b, 16, 16, 16, TB, LB> & b,
                            const fragment<accumulator, 16, 16, 16, TC> &  c) {
    ::kvg_emu::wmma_mma(&d.v[0][0], &a.v[0][0], &b.v[0][0], &c.v[0][0]);
}
}  // namespace wmma
}  // namespace nvcuda

// ---- the runtime API -------------------------------------------------------------------------

enum cudaError_t {
    cudaSuccess                     = 0,
    cudaErrorInvalidValue           = 1,
    cudaErrorMemoryAllocation       = 2,
    cudaErrorInvalidConfiguration   = 9,
    cudaErrorInvalidDevicePointer   = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver     = 35,
    cudaErrorNoDevice               = 100,
    cudaErrorInvalidDevice          = 101,
    cudaErrorInvalidResourceHandle  = 400,
    cudaErrorLaunchFailure          = 719,
    cudaErrorNotSupported           = 801,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost     = 0,
    cudaMemcpyHostToDevice   = 1,
    cudaMemcpyDeviceToHost   = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault        = 4,
};
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount          = 16,
    cudaDevAttrComputeCapabilityMajor       = 75,
    cudaDevAttrComputeCapabilityMinor       = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone        = 0,
    cudaStreamCaptureStatusActive      = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
#define cudaStreamDefault     0x00
#define cudaStreamNonBlocking 0x01

struct kvg_emu_stream;
struct kvg_emu_event;
typedef kvg_emu_stream * cudaStream_t;
typedef kvg_emu_event *  cudaEvent_t;

struct cudaDeviceProp {
    char   name[256];
    int    major, minor;
    int    multiProcessorCount;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
    int    warpSize, maxThreadsPerBlock;
};

cudaError_t  cudaGetDeviceCount(int * n);
cudaError_t  cudaGetDevice(int * d);
cudaError_t  cudaSetDevice(int d);
cudaError_t  cudaGetDeviceProperties(cudaDeviceProp * p, int d);
cudaError_t  cudaDeviceGetAttribute(int * v, cudaDeviceAttr a, int d);
cudaError_t  cudaDriverGetVersion(int * v);
cudaError_t  cudaRuntimeGetVersion(int * v);
cudaError_t  cudaDeviceSynchronize(void);
cudaError_t  cudaGetLastError(void);
cudaError_t  cudaPeekAtLastError(void);
const char * cudaGetErrorString(cudaError_t e);
const char * cudaGetErrorName(cudaError_t e);

cudaError_t cudaMalloc(void ** p, size_t n);
cudaError_t cudaFree(void * p);
cudaError_t cudaMallocHost(void ** p, size_t n);
cudaError_t cudaFreeHost(void * p);
cudaError_t cudaMemGetInfo(size_t * free_bytes, size_t * total_bytes);
cudaError_t cudaMemcpy(void * dst, const void * src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void * dst, int value, size_t n, cudaStream_t s = 0);
template <class T>
static inline cudaError_t cudaMalloc(T ** p, size_t n) {
    return cudaMalloc((void **) p, n);
}
template <class T>
static inline cudaError_t cudaMallocHost(T ** p, size_t n) {
    return cudaMallocHost((void **) p, n);
}

cudaError_t cudaStreamCreate(cudaStream_t * s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t * s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus * status);

cudaError_t cudaEventCreate(cudaEvent_t * e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float * ms, cudaEvent_t a, cudaEvent_t b);

namespace kvg_emu {
cudaError_t func_set_attribute(const void * fn, cudaFuncAttribute a, int value);
}
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F * fn, cudaFuncAttribute a, int value) {
    return ::kvg_emu::func_set_attribute((const void *) fn, a, value);
}

// ---- launches --------------------------------------------------------------------------------
//
// KVG_LAUNCH(grid, block, smem, stream, kernel)(args...) in the sources (kvg_cuda_common.cuh).

namespace kvg_emu {
struct launch_config {
    dim3         grid, block;
    size_t       smem;
    cudaStream_t stream;
    const char * name;
};
typedef void (*block_body)(void * closure);
// Checks the launch as the GPU would (a failure is sticky for cudaGetLastError) and runs body
// for every thread of every block.
void launch(const launch_config & c, const void * fn, block_body body, void * closure);

template <class... P>
struct bound_kernel {
    launch_config c;
    void (*fn)(P...);
    template <class... A>
    void operator()(A &&... args) const {
        std::tuple<typename std::decay<P>::type...> values(std::forward<A>(args)...);
        struct closure {
            void (*fn)(P...);
            std::tuple<typename std::decay<P>::type...> * values;
        } cl{ fn, &values };
        launch(
            c, (const void *) fn,
            [](void * p) {
                closure * k = (closure *) p;
                std::apply(k->fn, *k->values);  // each thread gets its own copies of the parameters
            },
            &cl);
    }
};
struct launcher {
    launch_config c;
    template <class... P>
    bound_kernel<P...> bind(void (*fn)(P...)) const {
        return bound_kernel<P...>{ c, fn };
    }
};
}  // namespace kvg_emu

#define KVG_EMU_LAUNCH(grid, block, smem, stream, ...)                                                                 \
    (::kvg_emu::launcher{ { dim3(grid), dim3(block), (size_t) (smem), (stream), #__VA_ARGS__ } }.bind(__VA_ARGS__))

#endif  // KVG_CUDA_EMULATOR_H
