// [kvgguf] the llama_context members that kvgguf adds (declared in llama-context.h): the setters
// behind the C API of src/llama-kvgguf.cpp, and the per-layer attention-path record that
// graph_params() hands to every graph.

#include "llama-context.h"
#include "llama-kvgguf-graph.h"

//
// [kvgguf] cold K/V hooks
//

void llama_context::set_kv_cold_hooks(const llama_kvgguf_hooks * hooks) {
    synchronize();

    if (hooks && hooks->n_cold && hooks->decode) {
        kv_cold_hooks   = *hooks;
        kv_cold_enabled = true;
    } else {
        kv_cold_hooks   = {};
        kv_cold_enabled = false;
    }

    kv_cold_n_errors = 0;

    // never reuse a graph built with the previous hooks
    gf_res_prev_active = nullptr;
}

void llama_context::set_kv_cold_attend(llama_kvgguf_attend_fn attend, int32_t max_tokens) {
    synchronize();

    kv_cold_attend            = max_tokens > 0 ? attend : nullptr;
    kv_cold_attend_max_tokens = kv_cold_attend ? max_tokens : 0;

    // never reuse a graph built for the other path
    gf_res_prev_active = nullptr;
}

void llama_context::set_kv_cold_attend_f16(llama_kvgguf_attend_f16_fn attend_f16) {
    synchronize();

    kv_cold_attend_f16 = attend_f16;

    // a reusable graph would keep calling the previous function
    gf_res_prev_active = nullptr;
}

bool llama_context::set_kv_cold_cuda(const llama_kvgguf_cuda * cuda) {
    synchronize();

    // the ops' GPU implementations, registered once for the process with ggml-cuda
    if (cuda && !llm_kv_cold_register_cuda()) {
        return false;
    }
    kv_cold_cuda    = cuda ? *cuda : llama_kvgguf_cuda{};
    kv_cold_cuda_on = cuda != nullptr;

    // a graph built without them sized its ops for the CPU's threads
    gf_res_prev_active = nullptr;
    return true;
}

void llama_context::set_kv_cold_mass(llama_kvgguf_mass_fn mass) {
    synchronize();

    kv_cold_mass = mass;

    // a reusable graph would keep calling the previous function
    gf_res_prev_active = nullptr;
}

void llama_context::set_kv_cold_n_ctx(uint32_t n_ctx) {
    synchronize();

    cparams.n_ctx_seq_logical = n_ctx;

    // a reusable graph holds the rope factors chosen for the previous size
    gf_res_prev_active = nullptr;
}

uint8_t * llama_context::kv_cold_paths_for(uint32_t n_layer) const {
    if (kv_cold_paths.size() != n_layer) {
        kv_cold_paths.assign(n_layer, 0);
    }
    return kv_cold_paths.data();
}

int32_t llama_context::get_kv_cold_path(int32_t il) const {
    if (il < 0 || (size_t) il >= kv_cold_paths.size()) {
        return -1;
    }
    return kv_cold_paths[il];
}
