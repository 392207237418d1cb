#include "llama-kvgguf.h"

#include "llama-context.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-model.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>
#include <vector>

int32_t llama_kvgguf_patch_version(void) {
    return LLAMA_KVGGUF_PATCH_VERSION;
}

int32_t llama_kvgguf_set_hooks(llama_context * ctx, const llama_kvgguf_hooks * hooks) {
    if (!ctx) {
        return -1;
    }
    if (hooks && (!hooks->n_cold || !hooks->decode)) {
        return -1;
    }
    llama_memory_t mem = ctx->get_memory();
    if (hooks && !dynamic_cast<llama_kv_cache *>(mem) && !dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        LLAMA_LOG_ERROR("%s: cold rows need a llama_kv_cache or llama_kv_cache_iswa memory\n", __func__);
        return -1;
    }
    ctx->set_kv_cold_hooks(hooks);
    return 0;
}

// The llama_kv_cache that holds layer il's own cells (the window cache of an iSWA memory for a
// sliding layer), or nullptr: a bad context or layer, another memory, or KV sharing (the layer
// reads another layer's cells).
static const llama_kv_cache * kvgguf_cache_of(const llama_context * ctx, int32_t il) {
    if (!ctx) {
        return nullptr;
    }
    const auto & hparams = ctx->get_model().hparams;
    if (il < 0 || (uint32_t) il >= hparams.n_layer() || !hparams.has_kv(il)) {
        return nullptr;
    }
    llama_memory_t         mem = ctx->get_memory();
    const llama_kv_cache * kv  = nullptr;
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        kv = hparams.is_swa(il) ? iswa->get_swa() : iswa->get_base();
    } else {
        kv = dynamic_cast<llama_kv_cache *>(mem);
    }
    if (!kv) {
        return nullptr;
    }
    const auto ids = kv->get_layer_ids();
    return std::find(ids.begin(), ids.end(), (uint32_t) il) == ids.end() ? nullptr : kv;
}

int32_t llama_kvgguf_layer_info(const llama_context * ctx, int32_t il, int32_t * n_embd_k, int32_t * n_embd_v) {
    if (!ctx) {
        return -1;
    }
    const auto & hparams = ctx->get_model().hparams;
    if (il < 0 || (uint32_t) il >= hparams.n_layer() || !hparams.has_kv(il)) {
        return -1;
    }
    if (n_embd_k) {
        *n_embd_k = (int32_t) hparams.n_embd_k_gqa(il);
    }
    if (n_embd_v) {
        *n_embd_v = (int32_t) hparams.n_embd_v_gqa(il);
    }
    return hparams.is_swa(il) ? 0 : 1;
}

int32_t llama_kvgguf_set_attend(llama_context * ctx, llama_kvgguf_attend_fn attend, int32_t max_tokens) {
    if (!ctx) {
        return -1;
    }
    ctx->set_kv_cold_attend(attend, max_tokens);
    return 0;
}

int32_t llama_kvgguf_set_attend_f16(llama_context * ctx, llama_kvgguf_attend_f16_fn attend_f16) {
    if (!ctx) {
        return -1;
    }
    ctx->set_kv_cold_attend_f16(attend_f16);
    return 0;
}

int32_t llama_kvgguf_set_cuda(llama_context * ctx, const llama_kvgguf_cuda * cuda) {
    if (!ctx || (cuda && (!cuda->attend || !cuda->finish || !cuda->supports))) {
        return -1;
    }
    return ctx->set_kv_cold_cuda(cuda) ? 0 : -2;
}

int32_t llama_kvgguf_set_mass(llama_context * ctx, llama_kvgguf_mass_fn mass) {
    if (!ctx) {
        return -1;
    }
    ctx->set_kv_cold_mass(mass);
    return 0;
}

int32_t llama_kvgguf_set_n_ctx(llama_context * ctx, uint32_t n_ctx) {
    if (!ctx) {
        return -1;
    }
    ctx->set_kv_cold_n_ctx(n_ctx);
    return 0;
}

int32_t llama_kvgguf_attention_path(const llama_context * ctx, int32_t il) {
    if (!ctx) {
        return -1;
    }
    const int32_t path = ctx->get_kv_cold_path(il);
    // a hybrid memory's attention layers go through the same build_attn, but its cache is not one
    // kvgguf can read rows from or compact (set_hooks refuses it too)
    llama_memory_t mem = ctx->get_memory();
    if (path > 0 && !dynamic_cast<llama_kv_cache *>(mem) && !dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return 0;
    }
    return path;
}

int32_t llama_kvgguf_set_window_types(ggml_type type_k, ggml_type type_v) {
    const auto known = [](ggml_type t) { return (int) t >= 0 && t <= GGML_TYPE_COUNT; };
    if (!known(type_k) || !known(type_v)) {
        return -1;
    }
    llama_kv_cache_iswa::kvgguf_set_next_window_types(type_k, type_v);
    return 0;
}

void llama_kvgguf_set_window_cells(uint32_t n_cells) {
    llama_kv_cache_iswa::kvgguf_set_next_window_cells(n_cells);
}

void llama_kvgguf_set_full_rotation(bool rotate) {
    llama_kv_cache::kvgguf_set_next_full_rotation(rotate);
}

int32_t llama_kvgguf_layer_cells(const llama_context * ctx, int32_t il, int32_t * type_k, int32_t * type_v,
                                 int64_t * n_bytes) {
    const llama_kv_cache * kv = kvgguf_cache_of(ctx, il);
    if (!kv) {
        return -1;
    }
    const ggml_tensor * k = kv->get_k_storage(il);
    const ggml_tensor * v = kv->get_v_storage(il);
    if (type_k) {
        *type_k = k ? (int32_t) k->type : -1;
    }
    if (type_v) {
        *type_v = v ? (int32_t) v->type : -1;
    }
    if (n_bytes) {
        *n_bytes = (int64_t) ((k ? ggml_nbytes(k) : 0) + (v ? ggml_nbytes(v) : 0));
    }
    return 0;
}

int32_t llama_kvgguf_layer_buffer(const llama_context * ctx, int32_t il, char * name, size_t size) {
    const llama_kv_cache * kv = kvgguf_cache_of(ctx, il);
    const ggml_tensor *    k  = kv ? kv->get_k_storage(il) : nullptr;
    if (!k || !k->buffer) {
        return -1;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(k->buffer);
    if (name && size > 0) {
        snprintf(name, size, "%s", ggml_backend_buft_name(buft));
    }
    return ggml_backend_buft_is_host(buft) ? 1 : 0;
}

int64_t llama_kvgguf_n_errors(const llama_context * ctx) {
    return ctx ? ctx->get_kv_cold_n_errors() : 0;
}

int64_t llama_kvgguf_read_rows(llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind, llama_pos p0,
                               llama_pos p1, void * dst, size_t dst_size, llama_pos * pos_out) {
    if (!ctx || seq_id < 0 || (kind != LLAMA_KVGGUF_K && kind != LLAMA_KVGGUF_V)) {
        return -1;
    }

    const llama_kv_cache * kv = kvgguf_cache_of(ctx, il);
    if (!kv) {
        return -1;
    }
    const auto & hparams = ctx->get_model().hparams;

    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }

    ctx->synchronize();

    const auto &   cells   = kv->get_cells(seq_id);
    const uint32_t strm    = kv->get_stream(seq_id);
    const uint64_t kv_size = kv->get_size();

    ggml_tensor * t = kind == LLAMA_KVGGUF_K ? kv->get_k_storage(il) : kv->get_v_storage(il);
    if (!t) {
        return -1;
    }

    const bool    trans  = kind == LLAMA_KVGGUF_V && kv->get_v_trans();
    const int64_t n_embd = kind == LLAMA_KVGGUF_K ? hparams.n_embd_k_gqa(il) : hparams.n_embd_v_gqa(il);

    if (trans && ggml_is_quantized(t->type)) {
        return -3;
    }

    const size_t row_size = ggml_row_size(t->type, n_embd);
    const size_t el_size  = ggml_type_size(t->type);
    const size_t strm_off = (size_t) strm * t->nb[2];

    const bool host = t->buffer && ggml_backend_buffer_is_host(t->buffer);

    // the cells of [p0, p1) in position order, then copied a run of consecutive cells at a time:
    // after llama_kvgguf_compact they are one run, and on a GPU each copy is a transfer (patch 15;
    // a row, or for a transposed V an element, at a time made an eviction thousands of them)
    std::vector<std::pair<llama_pos, uint32_t>> sel;
    for (const auto & [pos, cell] : cells.seq_pos_get(seq_id)) {
        if (pos >= p0 && pos < p1) {
            sel.emplace_back(pos, cell);
        }
    }
    const int64_t n = (int64_t) sel.size();
    if (dst && (size_t) n * row_size > dst_size) {
        return -2;
    }
    std::vector<uint8_t> col;  // a transposed V run: element e of its cells, contiguous in the tensor
    for (int64_t i0 = 0, i1; dst && i0 < n; i0 = i1) {
        for (i1 = i0 + 1; i1 < n && sel[i1].second == sel[i1 - 1].second + 1; ++i1) {
        }
        const uint32_t c0  = sel[i0].second;
        const int64_t  nr  = i1 - i0;
        uint8_t *      out = (uint8_t *) dst + (size_t) i0 * row_size;
        if (!trans) {
            const size_t off = strm_off + (size_t) c0 * t->nb[1];
            if (host) {
                memcpy(out, (const uint8_t *) t->data + off, (size_t) nr * row_size);
            } else {
                ggml_backend_tensor_get(t, out, off, (size_t) nr * row_size);
            }
            continue;
        }
        // element e of cell c lives at (e*kv_size + c)*el_size
        col.resize((size_t) nr * el_size);
        for (int64_t e = 0; e < n_embd; ++e) {
            const size_t    off = strm_off + ((size_t) e * kv_size + c0) * el_size;
            const uint8_t * src = (const uint8_t *) t->data + off;
            if (!host) {
                ggml_backend_tensor_get(t, col.data(), off, (size_t) nr * el_size);
                src = col.data();
            }
            for (int64_t r = 0; r < nr; ++r) {
                memcpy(out + (size_t) r * row_size + e * el_size, src + (size_t) r * el_size, el_size);
            }
        }
    }
    if (pos_out && dst) {
        for (int64_t i = 0; i < n; ++i) {
            pos_out[i] = sel[i].first;
        }
    }

    return n;
}

int64_t llama_kvgguf_view_cells(llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind, llama_pos p0,
                                llama_pos p1, struct llama_kvgguf_cells_view * view) {
    if (!ctx || !view || seq_id < 0 || (kind != LLAMA_KVGGUF_K && kind != LLAMA_KVGGUF_V)) {
        return -1;
    }
    const llama_kv_cache * kv = kvgguf_cache_of(ctx, il);
    ggml_tensor *          t  = !kv ? nullptr : kind == LLAMA_KVGGUF_K ? kv->get_k_storage(il) : kv->get_v_storage(il);
    if (!t || !t->buffer || !t->data) {
        return -1;
    }
    if (ggml_is_quantized(t->type)) {
        return -3;
    }
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }
    ctx->synchronize();  // the cells as the last llama_decode left them

    // the cells of [p0, p1) must follow one another (seq_pos_get is in position order)
    int64_t  n  = 0;
    uint32_t c0 = 0;
    for (const auto & [pos, cell] : kv->get_cells(seq_id).seq_pos_get(seq_id)) {
        if (pos < p0 || pos >= p1) {
            continue;
        }
        if (n == 0) {
            c0 = cell;
        } else if (cell != c0 + (uint32_t) n) {
            return -4;
        }
        ++n;
    }
    const bool    trans   = kind == LLAMA_KVGGUF_V && kv->get_v_trans();
    const size_t  el      = ggml_type_size(t->type);
    const int64_t kv_size = (int64_t) kv->get_size();
    const size_t off = (size_t) kv->get_stream(seq_id) * t->nb[2] + (trans ? (size_t) c0 * el : (size_t) c0 * t->nb[1]);
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(t->buffer);

    view->data       = (const char *) t->data + off;
    view->type       = (int32_t) t->type;
    view->row_stride = trans ? 1 : (int64_t) (t->nb[1] / el);
    view->col_stride = trans ? kv_size : 1;
    view->n_rows     = n;
    view->is_host    = ggml_backend_buft_is_host(buft) ? 1 : 0;
    snprintf(view->device, sizeof(view->device), "%s", ggml_backend_buft_name(buft));
    return n;
}

int64_t llama_kvgguf_kv_bytes(const llama_context * ctx) {
    if (!ctx) {
        return -1;
    }
    const llama_memory_t mem = ctx->get_memory();
    if (!mem) {
        return 0;
    }
    size_t total = 0;
    for (const auto & [buft, size] : mem->memory_breakdown()) {
        total += size;
    }
    return (int64_t) total;
}

int64_t llama_kvgguf_compute_bytes(const llama_context * ctx) {
    if (!ctx) {
        return -1;
    }
    size_t total = 0;
    for (const auto & [buft, data] : ctx->memory_breakdown()) {
        total += data.compute;
    }
    return (int64_t) total;
}

int32_t llama_kvgguf_compact(llama_context * ctx) {
    if (!ctx) {
        return -1;
    }
    llama_memory_t mem = ctx->get_memory();
    ctx->synchronize();
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        // both caches: the sliding-window one lost the evicted positions too
        return iswa->get_base()->kvgguf_compact() && iswa->get_swa()->kvgguf_compact() ? 0 : -1;
    }
    auto * kv = dynamic_cast<llama_kv_cache *>(mem);
    return kv && kv->kvgguf_compact() ? 0 : -1;
}

bool llama_kvgguf_can_shift(const llama_context * ctx) {
    llama_memory_t mem = ctx ? ctx->get_memory() : nullptr;
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return iswa->get_base()->get_can_shift() && iswa->get_swa()->get_can_shift();
    }
    auto * kv = dynamic_cast<llama_kv_cache *>(mem);
    return kv && kv->get_can_shift();
}

int32_t llama_kvgguf_shift(llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
    if (!ctx || seq_id < 0 || p0 < 0 || p1 < p0) {
        return -1;
    }
    llama_memory_t mem = ctx->get_memory();
    if (!llama_kvgguf_can_shift(ctx)) {
        return -1;
    }
    if (p1 == p0) {
        return 0;
    }
    try {
        if (!mem->seq_rm(seq_id, p0, p1)) {
            return -2;
        }
        // compacted before the move: a cell's pending shift does not survive a copy of the cells
        if (llama_kvgguf_compact(ctx) != 0) {
            return -2;
        }
        mem->seq_add(seq_id, p1, -1, -(p1 - p0));
        ctx->memory_update(false);
    } catch (const std::exception & e) {
        LLAMA_LOG_ERROR("%s: %s\n", __func__, e.what());
        return -2;
    }
    return 0;
}

// One list's rows of [p0, p1) as f32; raw is scratch for the rows in the cells' type.
static int64_t kvgguf_read_f32(llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind, llama_pos p0,
                               llama_pos p1, float * dst, size_t dst_count, std::vector<uint8_t> & raw) {
    if (!ctx || seq_id < 0 || p0 < 0 || p1 <= p0 || !dst || (kind != LLAMA_KVGGUF_K && kind != LLAMA_KVGGUF_V)) {
        return -1;
    }
    const llama_kv_cache * kv = kvgguf_cache_of(ctx, il);
    if (!kv) {
        return -1;
    }
    const ggml_tensor * t = kind == LLAMA_KVGGUF_K ? kv->get_k_storage(il) : kv->get_v_storage(il);
    if (!t) {
        return -1;
    }
    const auto &  hparams = ctx->get_model().hparams;
    const int64_t n       = (int64_t) p1 - p0;
    const int64_t n_embd  = kind == LLAMA_KVGGUF_K ? hparams.n_embd_k_gqa(il) : hparams.n_embd_v_gqa(il);
    const auto *  traits  = ggml_get_type_traits(t->type);
    if (t->type != GGML_TYPE_F32 && !traits->to_float) {
        return -3;
    }
    if (dst_count < (size_t) (n * n_embd)) {
        return -4;
    }
    std::vector<llama_pos> pos((size_t) n);
    raw.resize((size_t) n * ggml_row_size(t->type, n_embd));
    const int64_t got = llama_kvgguf_read_rows(ctx, seq_id, il, kind, p0, p1, raw.data(), raw.size(), pos.data());
    if (got == -3) {
        return -3;
    }
    if (got != n) {
        return got < 0 ? -1 : -2;
    }
    for (int64_t r = 0; r < n; ++r) {
        if (pos[(size_t) r] != p0 + (llama_pos) r) {
            return -2;
        }
    }
    if (t->type == GGML_TYPE_F32) {
        memcpy(dst, raw.data(), (size_t) (n * n_embd) * sizeof(float));
    } else {
        traits->to_float(raw.data(), dst, n * n_embd);  // rows are whole blocks
    }
    return n;
}

int64_t llama_kvgguf_read_rows_f32(llama_context * ctx, llama_seq_id seq_id, int32_t il, int32_t kind, llama_pos p0,
                                   llama_pos p1, float * dst, size_t dst_count) {
    std::vector<uint8_t> raw;
    return kvgguf_read_f32(ctx, seq_id, il, kind, p0, p1, dst, dst_count, raw);
}

int32_t llama_kvgguf_evict(llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1, const int32_t * layers,
                           int32_t n_layers, llama_kvgguf_append_fn append, void * user) {
    if (!ctx || seq_id < 0 || p0 < 0 || p1 <= p0 || n_layers < 0 || (n_layers > 0 && (!layers || !append))) {
        return -1;
    }
    const auto &         hparams = ctx->get_model().hparams;
    const int64_t        n       = (int64_t) p1 - p0;
    std::vector<uint8_t> raw;  // one list's rows in the cells' type
    std::vector<float>   rows;
    for (int32_t i = 0; i < n_layers; ++i) {
        const int32_t il = layers[i];  // checked by the read
        for (int32_t kind : { LLAMA_KVGGUF_K, LLAMA_KVGGUF_V }) {
            const int64_t n_embd = kind == LLAMA_KVGGUF_K ? hparams.n_embd_k_gqa(il) : hparams.n_embd_v_gqa(il);
            rows.resize((size_t) (n * n_embd));
            const int64_t got = kvgguf_read_f32(ctx, seq_id, il, kind, p0, p1, rows.data(), rows.size(), raw);
            if (got < 0) {
                return got == -4 ? -1 : (int32_t) got;
            }
            if (append(user, il, kind, rows.data(), n, n_embd) != 0) {
                return -4;
            }
        }
    }
    if (!llama_memory_seq_rm(ctx->get_memory(), seq_id, p0, p1)) {
        return -5;
    }
    return llama_kvgguf_compact(ctx) == 0 ? 0 : -6;
}

// Writes what a cache's state_write hands it into a caller's buffer while it fits, and counts
// every byte: one pass fills a buffer large enough, or tells the size a caller must provide.
namespace {
class kvgguf_state_writer : public llama_io_write_i {
  public:
    kvgguf_state_writer(uint8_t * dst, size_t size) : dst(dst), size(size) {}

    void write(const void * src, size_t n) override {
        if (dst && n_written + n <= size) {
            memcpy(dst + n_written, src, n);
        }
        n_written += n;
    }

    void write_tensor(ggml_tensor * tensor, size_t offset, size_t n) override {
        if (dst && n_written + n <= size) {
            ggml_backend_tensor_get(tensor, dst + n_written, offset, n);
        }
        n_written += n;
    }

    size_t n_bytes() override { return n_written; }

  private:
    uint8_t * dst;
    size_t    size;
    size_t    n_written = 0;
};

constexpr uint32_t kvgguf_state_magic = 0xaf143cd8;  // llama-context.cpp's io_magic

// false: a memory that is not a KV cache (nothing is written)
bool kvgguf_write_state_range(llama_context * ctx, llama_io_write_i & io, llama_seq_id seq_id, llama_pos p0,
                              llama_pos p1) {
    llama_memory_t mem  = ctx->get_memory();
    auto *         iswa = dynamic_cast<llama_kv_cache_iswa *>(mem);
    auto *         kv   = dynamic_cast<llama_kv_cache *>(mem);
    if (!iswa && !kv) {
        return false;
    }
    io.write(&kvgguf_state_magic, sizeof(kvgguf_state_magic));
    io.write(&seq_id, sizeof(seq_id));
    if (iswa) {
        // llama_kv_cache_iswa::state_write's order: the full-attention cache, then the window one
        iswa->get_base()->kvgguf_state_write_range(io, seq_id, p0, p1);
        iswa->get_swa()->kvgguf_state_write_range(io, seq_id, p0, p1);
    } else {
        kv->kvgguf_state_write_range(io, seq_id, p0, p1);
    }
    return true;
}
}  // namespace

int64_t llama_kvgguf_state_range(llama_context * ctx, llama_seq_id seq_id, llama_pos p0, llama_pos p1, uint8_t * dst,
                                 size_t size) {
    if (!ctx || seq_id < 0 || seq_id >= LLAMA_MAX_SEQ || p0 < 0 || p1 < p0) {
        return -1;
    }
    try {  // no exception may cross the C boundary
        ctx->synchronize();
        kvgguf_state_writer out(dst, size);
        return kvgguf_write_state_range(ctx, out, seq_id, p0, p1) ? (int64_t) out.n_bytes() : -1;
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: %s\n", __func__, err.what());
        return -1;
    }
}
