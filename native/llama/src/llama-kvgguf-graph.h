#pragma once

// [kvgguf] the graph side of the cold K/V rows: the types of src/llama-kvgguf-graph.cpp, which
// defines build_attn_kv_cold() and the other llm_graph_context members declared in llama-graph.h

#include "llama-graph.h"
#include "llama-kvgguf.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

// [kvgguf] cold K/V rows provided by external hooks
// holds the userdata of the custom ops of one graph and forces a rebuild when
// the number of cold rows of any layer changes
struct llm_kv_cold_op {
    const llama_kvgguf_hooks * hooks;
    int32_t                    il;
    int32_t                    kind;  // LLAMA_KVGGUF_K, LLAMA_KVGGUF_V, or 2 = mask
    int64_t                    n_cold;
    bool                       v_trans;  // output is the transposed V layout [n_cold + n_kv, head_dim, n_head_kv]
    std::atomic<int64_t> *     n_errors;
    // fused attention (kind LLM_KV_COLD_ATTN)
    llama_kvgguf_attend_fn attend = nullptr;
    float                  scale  = 1.0f;
    float                softcap  = 0.0f;  // logit soft-capping (patch 0008), as llama.cpp's flash attention applies it
    llama_kvgguf_mass_fn mass     = nullptr;          // called by the merge op with the final normalizers
    llama_kvgguf_attend_f16_fn attend_f16 = nullptr;  // hot cells through kvgguf's kernels (patch 0010)
    const llama_kvgguf_cuda *  cuda       = nullptr;  // the context's GPU hooks (patch 0015), or none
};

// [kvgguf 0015] registers the fused path's GPU implementations with ggml-cuda's custom-op dispatch
// (patch 0006), once for the process; false where no backend exports it (a build without CUDA)
bool llm_kv_cold_register_cuda();

class llm_graph_input_kv_cold : public llm_graph_input_i {
  public:
    llm_graph_input_kv_cold(const llama_kvgguf_hooks * hooks, std::atomic<int64_t> * n_errors)
        : hooks(hooks), n_errors(n_errors) {}
    ~llm_graph_input_kv_cold() = default;

    void set_input(const llama_ubatch * ubatch) override { GGML_UNUSED(ubatch); }

    bool can_reuse(const llm_graph_params & params) override;

    llm_kv_cold_op * add_op(int32_t il, int32_t kind, int64_t n_cold, bool v_trans);

    const llama_kvgguf_hooks * hooks;
    std::atomic<int64_t> *     n_errors;

    // (il, n_cold) for every layer that queried the hooks while building the graph
    std::vector<std::pair<int32_t, int64_t>> layers;

    std::vector<std::unique_ptr<llm_kv_cold_op>> ops;

    // (hot mask, n_cold) -> extended mask
    std::map<std::pair<ggml_tensor *, int64_t>, ggml_tensor *> masks;
};
