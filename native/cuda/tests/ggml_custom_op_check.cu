// The patched ggml-cuda's custom-op dispatch (patches/0006-kvgguf-cuda-custom-op.patch), through
// ggml's public API only, as libllama would use it: a custom op whose CPU function has a GPU
// implementation registered stays on the GPU (one split, no copy to the host), computes there,
// and a failing implementation is counted, not an abort; without a registration the node goes
// back to the CPU and still computes; a capturable one is replayed in a CUDA graph while its
// generation stays. Built and run by scripts/cuda_check.sh --full against the
// package's CUDA build; exit 0 when every check passes, 77 without a CUDA device, 1 otherwise.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

static int failures = 0;

static void check(bool ok, const char * what) {
    std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
    failures += ok ? 0 : 1;
}

// dst = 2 * src[0], rows shared among the CPU's threads
static void twice_cpu(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const ggml_tensor * src = dst->src[0];
    const int64_t       n   = ggml_nelements(dst);
    const float *       x   = (const float *) src->data;
    float *             y   = (float *) dst->data;
    for (int64_t i = ith; i < n; i += nth) {
        y[i] = 2.0f * x[i];
    }
}

// the same key function shape, registered with a GPU side that always fails
static void failing_cpu(ggml_tensor * dst, int ith, int nth, void * userdata) {
    twice_cpu(dst, ith, nth, userdata);
}

__global__ void twice_kernel(const float * x, float * y, int64_t n) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = 2.0f * x[i];
    }
}

static int gpu_calls = 0;

static int twice_gpu(ggml_tensor * dst, int device, void * stream, void * userdata) {
    (void) device;
    (void) userdata;
    ++gpu_calls;
    const int64_t n = ggml_nelements(dst);
    twice_kernel<<<(unsigned) ((n + 255) / 256), 256, 0, (cudaStream_t) stream>>>((const float *) dst->src[0]->data,
                                                                                  (float *) dst->data, n);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : 1;
}

static int failing_gpu(ggml_tensor * dst, int device, void * stream, void * userdata) {
    (void) dst;
    (void) device;
    (void) stream;
    (void) userdata;
    ++gpu_calls;
    return 3;
}

struct run_result {
    bool               computed   = false;
    int                n_splits   = -1;
    bool               custom_gpu = false;
    std::vector<float> z;
};

// z = 0.5 * custom(2 * x): x's values come back where the custom op doubles; scheduled over the
// GPU and the CPU, the scale ops on the GPU as the model's weights would place them
struct test_graph {
    ggml_context *       ctx   = nullptr;
    ggml_tensor *        x     = nullptr;
    ggml_tensor *        y     = nullptr;
    ggml_tensor *        z     = nullptr;
    ggml_cgraph *        graph = nullptr;
    ggml_backend_sched_t sched = nullptr;

    test_graph(ggml_backend_t gpu, ggml_backend_t cpu, ggml_custom_op_t fun, int64_t n) {
        ggml_init_params params = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        ctx                     = ggml_init(params);
        x                       = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
        ggml_set_input(x);
        ggml_tensor * a       = ggml_scale(ctx, x, 2.0f);
        ggml_tensor * args[1] = { a };
        y                     = ggml_custom_4d(ctx, GGML_TYPE_F32, n, 1, 1, 1, args, 1, fun, GGML_N_TASKS_MAX, nullptr);
        z                     = ggml_scale(ctx, y, 0.5f);
        ggml_set_output(z);
        graph = ggml_new_graph(ctx);
        ggml_build_forward_expand(graph, z);
        ggml_backend_t backends[2] = { gpu, cpu };
        sched                      = ggml_backend_sched_new(backends, nullptr, 2, GGML_DEFAULT_GRAPH_SIZE, false, true);
        ggml_backend_sched_set_tensor_backend(sched, a, gpu);
        ggml_backend_sched_set_tensor_backend(sched, z, gpu);
    }
    ~test_graph() {
        ggml_backend_sched_free(sched);
        ggml_free(ctx);
    }
    // x set to xs, the graph computed: whether it completed; *right: whether z = 2 * xs exactly
    bool compute(const std::vector<float> & xs, bool * right) {
        const int64_t n = ggml_nelements(x);
        ggml_backend_tensor_set(x, xs.data(), 0, n * sizeof(float));
        *right = false;
        if (ggml_backend_sched_graph_compute(sched, graph) != GGML_STATUS_SUCCESS) {
            return false;
        }
        std::vector<float> zs(n);
        ggml_backend_tensor_get(z, zs.data(), 0, n * sizeof(float));
        *right = true;
        for (int64_t i = 0; i < n && *right; ++i) {
            *right = zs[i] == 2.0f * xs[i];
        }
        return true;
    }
};

static run_result run(ggml_backend_t gpu, ggml_backend_t cpu, ggml_custom_op_t fun, int64_t n) {
    run_result r;
    test_graph g(gpu, cpu, fun, n);
    if (ggml_backend_sched_alloc_graph(g.sched, g.graph)) {
        std::vector<float> xs(n);
        for (int64_t i = 0; i < n; ++i) {
            xs[i] = 0.25f * (float) (i % 977) - 7.0f;
        }
        bool right   = false;
        r.computed   = g.compute(xs, &right);
        r.n_splits   = ggml_backend_sched_get_n_splits(g.sched);
        r.custom_gpu = ggml_backend_sched_get_tensor_backend(g.sched, g.y) == gpu;
        if (r.computed && right) {
            r.z = xs;  // z came back right; empty marks a wrong result
        }
    }
    return r;
}

static uint64_t g_gen = 1;

static uint64_t twice_generation(const ggml_tensor * op, void * userdata) {
    (void) op;
    (void) userdata;
    return g_gen;
}

// One graph built once and computed `reps` times with new inputs (as llama.cpp reuses a decode
// graph), the GPU implementation's calls counted: replays of a captured CUDA graph do not call it.
// Returns the calls, or -1 where a result was wrong. gen_at: the rep from which g_gen is 2.
static int run_repeated(ggml_backend_t gpu, ggml_backend_t cpu, ggml_custom_op_t fun, int64_t n, int reps, int gen_at) {
    test_graph g(gpu, cpu, fun, n);
    const int  calls0 = gpu_calls;
    bool       right  = ggml_backend_sched_alloc_graph(g.sched, g.graph);
    for (int r = 0; r < reps && right; ++r) {
        g_gen = r >= gen_at ? 2 : 1;
        std::vector<float> xs(n);
        for (int64_t i = 0; i < n; ++i) {
            xs[i] = (float) ((i + 31 * r) % 977) - 400.0f;
        }
        right = g.compute(xs, &right) && right;
    }
    g_gen = 1;
    return right ? gpu_calls - calls0 : -1;
}

int main() {
    int n_cuda = 0;
    if (cudaGetDeviceCount(&n_cuda) != cudaSuccess || n_cuda == 0) {
        std::printf("ggml_custom_op_check: no CUDA device\n");
        return 77;
    }
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CUDA");
    ggml_backend_t     gpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_GPU, nullptr);
    ggml_backend_t     cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    check(reg && gpu && cpu, "the CUDA and CPU backends start");
    if (!reg || !gpu || !cpu) {
        return 1;
    }
    auto set_op =
        (ggml_backend_set_custom_op_gpu_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cuda_set_custom_op");
    auto errors =
        (ggml_backend_custom_op_errors_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cuda_custom_op_errors");
    check(set_op && errors, "ggml-cuda exports ggml_backend_cuda_set_custom_op and _custom_op_errors");
    if (!set_op || !errors) {
        return 1;
    }
    const int64_t n = 100003;  // not a multiple of the block

    check(set_op(twice_cpu, twice_gpu, nullptr, 0), "a GPU implementation registers");
    run_result on_gpu = run(gpu, cpu, twice_cpu, n);
    check(on_gpu.computed && !on_gpu.z.empty(), "registered: the graph computes z = x exactly");
    check(on_gpu.custom_gpu && on_gpu.n_splits == 1, "registered: the custom node runs on the GPU, one split");
    check(gpu_calls == 1, "registered: the GPU implementation ran once");
    std::printf("      splits %d, GPU calls %d\n", on_gpu.n_splits, gpu_calls);

    const int64_t before = errors();
    check(set_op(failing_cpu, failing_gpu, nullptr, 0), "a failing implementation registers");
    run_result failed = run(gpu, cpu, failing_cpu, n);
    check(failed.computed, "a failing implementation: the graph still completes (no abort)");
    check(errors() == before + 1, "a failing implementation: one failure counted");

    check(set_op(twice_cpu, nullptr, nullptr, 0), "the registration is removed");
    const int  calls  = gpu_calls;
    run_result on_cpu = run(gpu, cpu, twice_cpu, n);
    check(on_cpu.computed && !on_cpu.z.empty(), "unregistered: the graph computes z = x exactly on the CPU's node");
    check(!on_cpu.custom_gpu && on_cpu.n_splits > 1,
          "unregistered: the custom node runs on the CPU (the graph splits)");
    check(gpu_calls == calls, "unregistered: the GPU implementation is not called");
    std::printf("      splits %d\n", on_cpu.n_splits);

    // (patch set 17) CUDA graphs: a capturable op with a generation is captured and replayed
    // without being called while its generation stays, called again when it changes, and never
    // captured while its generation is 0
    auto set_gen = (ggml_backend_set_custom_op_generation_t) ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_cuda_set_custom_op_generation");
    check(set_gen != nullptr, "ggml-cuda exports ggml_backend_cuda_set_custom_op_generation");
    if (set_gen) {
        check(!set_gen(failing_cpu, twice_generation), "a generation for an op not registered is refused");
        check(set_op(twice_cpu, twice_gpu, nullptr, GGML_BACKEND_CUSTOM_OP_CAPTURABLE) &&
                  set_gen(twice_cpu, twice_generation),
              "a capturable op with a generation registers");
        const int steady = run_repeated(gpu, cpu, twice_cpu, n, 8, 1000);
        check(steady >= 1 && steady < 8,
              "capturable, generation steady: right results, fewer calls than computes (replays)");
        const int changed = run_repeated(gpu, cpu, twice_cpu, n, 8, 6);
        check(changed > steady, "the generation changed at the 7th compute: the op is called again");
        check(set_gen(twice_cpu, [](const ggml_tensor *, void *) -> uint64_t { return 0; }), "generation 0 registers");
        const int never = run_repeated(gpu, cpu, twice_cpu, n, 8, 1000);
        check(never == 8, "generation 0: the op is called at every compute (never captured)");
        std::printf("      calls in 8 computes: steady %d, changed at the 7th %d, generation 0 %d\n", steady, changed,
                    never);
        set_op(twice_cpu, nullptr, nullptr, 0);
    }

    ggml_backend_free(gpu);
    ggml_backend_free(cpu);
    std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
