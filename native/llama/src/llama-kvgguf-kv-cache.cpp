// [kvgguf] the llama_kv_cache members that kvgguf adds (declared in llama-kv-cache.h): the V
// storage that llama_kvgguf_read_rows copies rows from, llama_kvgguf_compact's reordering, the
// state of a range of positions (llama_kvgguf_state_range) and the full-attention cells'
// rotation; and the window cells' types and count of
// llama_kv_cache_iswa (declared in llama-kv-cache-iswa.h).

#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-impl.h"
#include "llama-io.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

ggml_tensor * llama_kv_cache::get_v_storage(int32_t il) const {
    const int32_t ikv = map_layer_ids.at(il);

    return layers[ikv].v;
}

bool llama_kv_cache::get_v_trans() const {
    return v_trans;
}

// Reorders the rows of a [n_embd, kv_size] (or transposed [kv_size, n_embd]) cache tensor so
// that cell idxs[j] moves to cell j.
static void kvgguf_gather_cells(ggml_tensor * t, const std::vector<uint32_t> & idxs, uint32_t kv_size, bool trans) {
    std::vector<uint8_t> src(ggml_nbytes(t));
    std::vector<uint8_t> dst(ggml_nbytes(t));
    ggml_backend_tensor_get(t, src.data(), 0, src.size());
    dst = src;
    if (!trans) {
        const size_t row = t->nb[1];
        for (size_t j = 0; j < idxs.size(); ++j) {
            memcpy(dst.data() + j * row, src.data() + (size_t) idxs[j] * row, row);
        }
    } else {
        const size_t  es     = ggml_type_size(t->type);
        const int64_t n_embd = (int64_t) (ggml_nbytes(t) / es / kv_size);
        for (int64_t e = 0; e < n_embd; ++e) {
            const size_t base = (size_t) e * kv_size * es;
            for (size_t j = 0; j < idxs.size(); ++j) {
                memcpy(dst.data() + base + j * es, src.data() + base + (size_t) idxs[j] * es, es);
            }
        }
    }
    ggml_backend_tensor_set(t, dst.data(), 0, dst.size());
}

// Moves cells [k, k + n) of a [n_embd, kv_size] cache tensor to [0, n) where its buffer lies
// (on a GPU: device to device), in chunks of at most k cells, which never overlap. An eviction's
// compaction is this shift: the cells were in position order from 0, and the oldest k left.
static void kvgguf_shift_cells(ggml_tensor * t, uint32_t k, uint32_t n) {
    ggml_init_params params = { 2 * ggml_tensor_overhead(), nullptr, true };
    for (uint32_t j0 = 0; j0 < n; j0 += k) {
        const uint32_t len = std::min(k, n - j0);
        ggml_context * ctx = ggml_init(params);
        ggml_tensor *  src = ggml_view_2d(ctx, t, t->ne[0], len, t->nb[1], (size_t) (k + j0) * t->nb[1]);
        ggml_tensor *  dst = ggml_view_2d(ctx, t, t->ne[0], len, t->nb[1], (size_t) j0 * t->nb[1]);
        src->data = dst->data = nullptr;  // view_init sets them, with the buffer
        ggml_backend_view_init(src);
        ggml_backend_view_init(dst);
        ggml_backend_tensor_copy(src, dst);
        ggml_free(ctx);
    }
}

bool llama_kv_cache::kvgguf_compact() {
    if (v_cells.size() != 1) {
        return false;
    }
    auto & cells = v_cells[0];

    std::vector<std::pair<llama_pos, uint32_t>> order;
    for (uint32_t i = 0; i < cells.size(); ++i) {
        if (!cells.is_empty(i)) {
            order.emplace_back(cells.pos_get(i), i);
        }
    }
    std::sort(order.begin(), order.end());

    std::vector<uint32_t> idxs(order.size());
    bool                  in_place = true;
    for (size_t j = 0; j < order.size(); ++j) {
        idxs[j]  = order[j].second;
        in_place = in_place && idxs[j] == j;
    }

    // the usual case, the oldest cells gone from a cache in order: a shift, where the cells lie
    const uint32_t k     = idxs.empty() ? 0 : idxs[0];
    bool           shift = k > 0;
    for (size_t j = 0; shift && j < idxs.size(); ++j) {
        shift = idxs[j] == k + j;
    }
    if (!in_place) {
        for (auto & layer : layers) {
            if (shift) {
                kvgguf_shift_cells(layer.k, k, (uint32_t) idxs.size());
            } else {
                kvgguf_gather_cells(layer.k, idxs, cells.size(), false);
            }
            if (layer.v && shift && !v_trans) {
                kvgguf_shift_cells(layer.v, k, (uint32_t) idxs.size());
            } else if (layer.v) {
                kvgguf_gather_cells(layer.v, idxs, cells.size(), v_trans);  // a transposed V: on the host
            }
        }
        const llama_kv_cells moved = cells.cp(idxs);
        for (uint32_t i = 0; i < cells.size(); ++i) {
            if (!cells.is_empty(i)) {
                cells.rm(i);
            }
        }
        cells.set(0, moved);
    }

    // new tokens go right after the last position, in order
    v_heads[0] = (uint32_t) idxs.size();

    return true;
}

// The cells a sequence state of seq_id would hold (not empty, of the sequence, not masked by a
// sliding window) whose positions lie in [p0, p1), written as state_write writes them all: what
// a prefix cut puts back needs these few rows, not the whole state (llama_kvgguf_state_range).
void llama_kv_cache::kvgguf_state_write_range(llama_io_write_i & io, llama_seq_id seq_id, llama_pos p0,
                                              llama_pos p1) const {
    if (other) {
        return;  // state_write writes nothing for a cache that shares another's cells
    }
    io.write(&n_stream, sizeof(n_stream));
    for (uint32_t s = 0; s < n_stream; ++s) {
        const auto &  cells   = v_cells[s];
        const auto    pos_max = cells.seq_pos_max(seq_id);  // -1: the sequence holds no cell
        const bool    has_seq = pos_max >= 0;
        cell_ranges_t cr{ s, {} };
        uint32_t      n_cells = 0;
        for (uint32_t i = 0; i < cells.size(); ++i) {
            const bool in = has_seq && !cells.is_empty(i) && cells.seq_has(i, seq_id) && cells.pos_get(i) >= p0 &&
                            cells.pos_get(i) < p1 &&
                            !llama_hparams::is_masked_swa(n_swa, swa_type, cells.pos_get(i), pos_max);
            if (!in) {
                continue;
            }
            if (!cr.data.empty() && cr.data.back().second == i) {
                cr.data.back().second = i + 1;
            } else {
                cr.data.emplace_back(i, i + 1);
            }
            ++n_cells;
        }
        io.write(&n_cells, sizeof(n_cells));
        if (n_cells > 0) {
            state_write_meta(io, cr, seq_id);
            state_write_data(io, cr);
        }
    }
}

// Whether full-attention caches may rotate (llama_kvgguf_set_full_rotation), per thread as below.
static thread_local bool kvgguf_next_rotate_full = true;

void llama_kv_cache::kvgguf_set_next_full_rotation(bool rotate) {
    kvgguf_next_rotate_full = rotate;
}

bool llama_kv_cache::kvgguf_next_full_rotation() {
    return kvgguf_next_rotate_full;
}

// The window types asked for by llama_kvgguf_set_window_types, per thread: a context is built on
// the thread that asks, and two threads building contexts must not see each other's choice.
static thread_local ggml_type kvgguf_next_window_type_k = GGML_TYPE_COUNT;
static thread_local ggml_type kvgguf_next_window_type_v = GGML_TYPE_COUNT;

void llama_kv_cache_iswa::kvgguf_set_next_window_types(ggml_type type_k, ggml_type type_v) {
    kvgguf_next_window_type_k = type_k;
    kvgguf_next_window_type_v = type_v;
}

// The window cache's cells asked for by llama_kvgguf_set_window_cells, per thread as the types
// are (0: llama.cpp's size).
static thread_local uint32_t kvgguf_next_window_cells = 0;

void llama_kv_cache_iswa::kvgguf_set_next_window_cells(uint32_t n_cells) {
    kvgguf_next_window_cells = n_cells;
}

uint32_t llama_kv_cache_iswa::kvgguf_window_cells(uint32_t size_swa, uint32_t need, uint32_t size_base) {
    if (kvgguf_next_window_cells == 0) {
        return size_swa;
    }
    return std::min(size_base, std::max(need, kvgguf_next_window_cells));
}

std::pair<ggml_type, ggml_type> llama_kv_cache_iswa::kvgguf_window_types(const llama_hparams & hparams,
                                                                         ggml_type type_k, ggml_type type_v,
                                                                         bool v_trans) {
    ggml_type k = kvgguf_next_window_type_k == GGML_TYPE_COUNT ? type_k : kvgguf_next_window_type_k;
    ggml_type v = kvgguf_next_window_type_v == GGML_TYPE_COUNT ? type_v : kvgguf_next_window_type_v;

    // the checks llama_init_from_model makes of type_k / type_v, for the window layers
    bool fits = !(v_trans && ggml_is_quantized(v));
    for (uint32_t il = 0; fits && il < hparams.n_layer(); ++il) {
        if (hparams.is_swa(il) && hparams.has_kv(il)) {
            fits = hparams.n_embd_head_k(il) % ggml_blck_size(k) == 0 &&
                   hparams.n_embd_head_v(il) % ggml_blck_size(v) == 0;
        }
    }
    if (!fits) {
        LLAMA_LOG_WARN("%s: the window cells cannot hold %s / %s here; they keep %s / %s\n", __func__,
                       ggml_type_name(k), ggml_type_name(v), ggml_type_name(type_k), ggml_type_name(type_v));
        return { type_k, type_v };
    }
    return { k, v };
}
