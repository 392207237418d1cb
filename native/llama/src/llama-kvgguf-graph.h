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

// [kvgguf 0020] a run of cold rows whose keys a context shift moved without rotating them again:
// rows [r0, r1) hold keys rotated at row + shift
struct llm_kv_cold_run {
    int64_t r0;
    int64_t r1;
    int32_t shift;

    bool operator==(const llm_kv_cold_run & o) const { return r0 == o.r0 && r1 == o.r1 && shift == o.shift; }
};

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
    // (patch 0020) the shifted runs of the cold rows: runs[i] is scored with the queries rotated by
    // its shift, set q_src[i] of source 4 (the ubatch's T queries once per distinct shift)
    std::vector<llm_kv_cold_run> runs;
    std::vector<int32_t>         q_src;
};

// [kvgguf 0015] registers the fused path's GPU implementations with ggml-cuda's custom-op dispatch
// (patch 0006), once for the process; false where no backend exports it (a build without CUDA)
bool llm_kv_cold_register_cuda();

class llm_graph_input_kv_cold : public llm_graph_input_i {
  public:
    llm_graph_input_kv_cold(const llama_kvgguf_hooks * hooks, std::atomic<int64_t> * n_errors)
        : hooks(hooks), n_errors(n_errors) {}
    ~llm_graph_input_kv_cold() = default;

    // fills the positions of the shifted runs' rotations (patch 0020)
    void set_input(const llama_ubatch * ubatch) override;

    bool can_reuse(const llm_graph_params & params) override;

    llm_kv_cold_op * add_op(int32_t il, int32_t kind, int64_t n_cold, bool v_trans);

    const llama_kvgguf_hooks * hooks;
    std::atomic<int64_t> *     n_errors;

    struct layer {
        int32_t                      il;
        int64_t                      n_cold;
        bool                         rope;  // a layer without RoPE scores moved keys as they are
        std::vector<llm_kv_cold_run> runs;
    };

    // every layer that queried the hooks while building the graph: its cold rows and shifted runs
    std::vector<layer> layers;

    // the positions each rotation for the shifted runs takes: I32 tensors and their values
    std::vector<std::pair<ggml_tensor *, std::vector<int32_t>>> shift_pos;

    std::vector<std::unique_ptr<llm_kv_cold_op>> ops;

    // (hot mask, n_cold) -> extended mask
    std::map<std::pair<ggml_tensor *, int64_t>, ggml_tensor *> masks;
};
