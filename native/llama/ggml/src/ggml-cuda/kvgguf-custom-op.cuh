#pragma once

// [kvgguf] Custom ops (GGML_OP_CUSTOM) that another library runs on the GPU. The library registers
// a GPU implementation for the custom ops whose CPU function is cpu_fun (through the backend
// registry's proc address "ggml_backend_cuda_set_custom_op", typedefs in ggml-backend.h); the
// scheduler then keeps such a node on the GPU instead of splitting the graph to the CPU around it.
// A failed call is logged and counted, never an abort.

#include "common.cuh"

// Registers (gpu_fun != NULL) or removes (NULL) the GPU implementation of cpu_fun's custom ops.
bool ggml_cuda_set_custom_op(ggml_custom_op_t cpu_fun, ggml_backend_custom_op_gpu_t gpu_fun,
                             ggml_backend_custom_op_gpu_supports_t supports, uint32_t flags);

// Whether op (a GGML_OP_CUSTOM node) has a GPU implementation that takes it on device.
bool ggml_cuda_custom_op_supported(int device, const ggml_tensor * op);

// Sets the generation function of cpu_fun's registered op (false: none registered).
bool ggml_cuda_set_custom_op_generation(ggml_custom_op_t cpu_fun, ggml_backend_custom_op_generation_t generation);

// Whether a CUDA graph may capture node and replay it without calling its implementation again:
// registered CAPTURABLE, and its generation (where it has one) is not 0.
bool ggml_cuda_custom_op_capturable(const ggml_tensor * node);

// The node's generation (0: none): compared with the capture's before a CUDA graph is replayed.
uint64_t ggml_cuda_custom_op_generation(const ggml_tensor * node);

// Runs dst's GPU implementation on ctx's stream.
void ggml_cuda_custom_op(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Failed calls so far, in this process.
int64_t ggml_cuda_custom_op_errors(void);
