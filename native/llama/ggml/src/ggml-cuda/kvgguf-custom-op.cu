// [kvgguf] The registry of GPU implementations of custom ops (see kvgguf-custom-op.cuh).

#include "kvgguf-custom-op.cuh"

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

struct custom_op_entry {
    ggml_custom_op_t                      cpu_fun    = nullptr;
    ggml_backend_custom_op_gpu_t          gpu_fun    = nullptr;
    ggml_backend_custom_op_gpu_supports_t supports   = nullptr;
    uint32_t                              flags      = 0;
    ggml_backend_custom_op_generation_t   generation = nullptr;
};

std::mutex                   g_mutex;
std::vector<custom_op_entry> g_entries;
std::atomic<int64_t>         g_errors{ 0 };

// The entry of a custom node's CPU function (op_params holds ggml_custom_op_params by value).
bool custom_op_lookup(const ggml_tensor * op, custom_op_entry & entry, void ** userdata) {
    if (op->op != GGML_OP_CUSTOM) {
        return false;
    }
    ggml_custom_op_params params;
    memcpy(&params, op->op_params, sizeof(params));
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const custom_op_entry & e : g_entries) {
        if (e.cpu_fun == params.fun) {
            entry     = e;
            *userdata = params.userdata;
            return true;
        }
    }
    return false;
}

}  // namespace

bool ggml_cuda_set_custom_op(ggml_custom_op_t cpu_fun, ggml_backend_custom_op_gpu_t gpu_fun,
                             ggml_backend_custom_op_gpu_supports_t supports, uint32_t flags) {
    if (!cpu_fun) {
        return false;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    for (size_t i = 0; i < g_entries.size(); ++i) {
        if (g_entries[i].cpu_fun == cpu_fun) {
            if (gpu_fun) {
                g_entries[i] = { cpu_fun, gpu_fun, supports, flags, nullptr };
            } else {
                g_entries.erase(g_entries.begin() + i);
            }
            return true;
        }
    }
    if (gpu_fun) {
        g_entries.push_back({ cpu_fun, gpu_fun, supports, flags, nullptr });
    }
    return true;
}

bool ggml_cuda_set_custom_op_generation(ggml_custom_op_t cpu_fun, ggml_backend_custom_op_generation_t generation) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (custom_op_entry & e : g_entries) {
        if (e.cpu_fun == cpu_fun) {
            e.generation = generation;
            return true;
        }
    }
    return false;  // register the op first
}

uint64_t ggml_cuda_custom_op_generation(const ggml_tensor * node) {
    custom_op_entry entry;
    void *          userdata = nullptr;
    return custom_op_lookup(node, entry, &userdata) && entry.generation ? entry.generation(node, userdata) : 0;
}

bool ggml_cuda_custom_op_supported(int device, const ggml_tensor * op) {
    custom_op_entry entry;
    void *          userdata = nullptr;
    if (!custom_op_lookup(op, entry, &userdata)) {
        return false;
    }
    return !entry.supports || entry.supports(op, device, userdata);
}

bool ggml_cuda_custom_op_capturable(const ggml_tensor * node) {
    custom_op_entry entry;
    void *          userdata = nullptr;
    if (!custom_op_lookup(node, entry, &userdata) || !(entry.flags & GGML_BACKEND_CUSTOM_OP_CAPTURABLE)) {
        return false;
    }
    return !entry.generation || entry.generation(node, userdata) != 0;  // 0: not now
}

void ggml_cuda_custom_op(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    custom_op_entry entry;
    void *          userdata = nullptr;
    const bool      found    = custom_op_lookup(dst, entry, &userdata);
    const int       status   = found ? entry.gpu_fun(dst, ctx.device, (void *) ctx.stream(), userdata) : -1;

    ggml_cuda_set_device(ctx.device);            // the implementation may have made another device current
    const cudaError_t err = cudaGetLastError();  // clears a launch error, so the next op does not abort on it
    if (status == 0 && err == cudaSuccess) {
        return;
    }
    if (!found) {  // removed since the scheduler placed the node: nothing computed it
        cudaMemsetAsync(dst->data, 0, ggml_nbytes(dst), ctx.stream());
        cudaGetLastError();
    }
    const int64_t n = ++g_errors;
    if (n <= 8 || (n & (n - 1)) == 0) {  // the first few, then at powers of two
        GGML_LOG_ERROR("%s: custom op %s failed (%s, status %d, %s); %lld failures so far\n", __func__, dst->name,
                       found ? "its implementation" : "no implementation registered", status, cudaGetErrorString(err),
                       (long long) n);
    }
}

int64_t ggml_cuda_custom_op_errors(void) {
    return g_errors.load();
}
