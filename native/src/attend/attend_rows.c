// attend_rows.c: attention over a codec that has no score/accumulate kernels of its own.
//
// The block is decoded with the codec's own decoder into per-thread scratch and the chunk's
// rows are then dotted in f32. The live cache's blocks are 64 rows and attend.c walks them in
// chunks of at most 64, so each block is decoded once per attend call: the same work as
// expanding it, without a round trip through llama.cpp's f16 buffer. A codec earns its own
// kernels (scoring the codes directly) when it is worth the speed.

#include "kvg_internal.h"

// Decoded rows of the job's block; NULL when the scratch cannot grow or decode fails (the
// block's bytes passed check when they were stored, so only memory can fail here).
static const float * decoded(const kvg_job * job, const uint8_t * src, int * st) {
    float * rows = kvg_thread_scratch(KVG_SCRATCH_ROWS, (size_t) job->n_values);
    if (rows == NULL) {
        *st = kvg_fail(KVG_ERR_NO_MEMORY, "attention: no scratch to decode a %s block", kvg_codec_name(job->type));
        return NULL;
    }
    *st = kvg_codec_traits_of(job->type)->decode_ref(job, src, rows);
    return *st == KVG_OK ? rows : NULL;
}

int kvg_rows_score_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const kvg_attn * a,
                       float * out) {
    int           st;
    const float * rows = decoded(job, src, &st);
    if (rows == NULL) {
        return st;
    }
    const int64_t D = job->head_dim;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const float * row = rows + (t0 + t) * job->n_channels + hk * D;
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float * q = a->q + j * D;
                float         s = 0.0f;
                for (int64_t i = 0; i < D; i++) {
                    s += q[i] * row[i];
                }
                out[j * n + t] = s;
            }
        }
    }
    return KVG_OK;
}

int kvg_rows_accumulate_ref(const kvg_job * job, const uint8_t * src, int64_t t0, int64_t n, const float * p,
                            const kvg_attn * a) {
    int           st;
    const float * rows = decoded(job, src, &st);
    if (rows == NULL) {
        return st;
    }
    const int64_t D = job->head_dim;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hk = 0; hk < job->n_heads; hk++) {
            const float * row = rows + (t0 + t) * job->n_channels + hk * D;
            for (int64_t j = hk * a->per_head; j < (hk + 1) * a->per_head; j++) {
                const float w   = p[j * n + t];
                float *     acc = a->acc + j * D;
                for (int64_t i = 0; i < D; i++) {
                    acc[i] += w * row[i];
                }
            }
        }
    }
    return KVG_OK;
}
