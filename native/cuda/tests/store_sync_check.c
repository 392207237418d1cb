// store_sync_check.c: kvg_cuda_store.c's bookkeeping on the host, no GPU needed.
//
// The device calls are replaced by host stand-ins (malloc for device memory, memcpy for copies;
// the attention calls read the rows they are handed and compare them, value for value, with the
// host store's kvg_store_decode of the same rows). A long run of appends, agings, cuts and
// clears, synced as Python syncs, must leave the copy's segments holding exactly the store's
// rows; an allocation that fails mid-sync must leave the copy as it was (stale) and leak nothing.
// Every other eviction is coded "on the device" (kvg_cuda_store_encode, the C encoder standing in
// for the GPU's byte-equal one): the host store must get the C encoder's bytes, and the sync must
// take the block from the device.
// scripts/cuda_compile_check.sh builds and runs it; cuda_check.cu checks the same on a GPU.
#include "kvg_cuda.h"
#include "kvg_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- stand-ins for the device ----------------------------------------------------------------

static long   g_live_allocs, g_fail_at = -1, g_allocs, g_copies;
static size_t g_live_bytes;

typedef struct {
    size_t n;
} hdr;

int kvg_cuda_malloc(kvg_cuda_ctx * ctx, size_t bytes, void ** out) {
    (void) ctx;
    if (g_allocs++ == g_fail_at) {
        return KVG_ERR_NO_MEMORY;
    }
    hdr * h = (hdr *) malloc(sizeof(hdr) + bytes);
    if (!h) {
        return KVG_ERR_NO_MEMORY;
    }
    h->n = bytes;
    memset(h + 1, 0xab, bytes);  // rows never written read as garbage
    g_live_allocs++;
    g_live_bytes += bytes;
    *out = h + 1;
    return KVG_OK;
}

static long         g_batches;            // kvg_cuda_encode_batch calls
static const void * g_coded[4096];        // the blocks the device's encoder wrote, until freed
static const void * g_coded_arena[4096];  // the arena each lies in (a batch's first block starts it)
static const void * g_batch_arena;
static int          g_n_coded;
static long         g_from_device;  // the copies a sync took from them

int kvg_cuda_free(kvg_cuda_ctx * ctx, void * p) {
    (void) ctx;
    for (int i = 0; i < g_n_coded && p; i++) {  // every block coded inside the buffer goes with it
        const uint8_t * c = (const uint8_t *) g_coded[i];
        g_coded[i] = c >= (const uint8_t *) p && c < (const uint8_t *) p + ((hdr *) p - 1)->n ? NULL : g_coded[i];
    }
    if (p) {
        hdr * h = (hdr *) p - 1;
        g_live_allocs--;
        g_live_bytes -= h->n;
        free(h);
    }
    return KVG_OK;
}

int kvg_cuda_copy_in(kvg_cuda_ctx * ctx, void * dst, const void * src, size_t n) {
    (void) ctx;
    g_copies++;
    memcpy(dst, src, n);
    return KVG_OK;
}

int kvg_cuda_copy_dev(kvg_cuda_ctx * ctx, void * dst, const void * src, size_t n) {
    (void) ctx;
    g_copies++;
    for (int i = 0; i < g_n_coded && n > 0; i++) {
        g_from_device += g_coded[i] == src;  // a block's first part: once per block
    }
    memmove(dst, src, n);
    return KVG_OK;
}

int kvg_cuda_copy_queue(kvg_cuda_ctx * ctx, void * dst, const void * src, size_t n, int from_host) {
    return from_host ? kvg_cuda_copy_in(ctx, dst, src, n) : kvg_cuda_copy_dev(ctx, dst, src, n);
}

static long g_waits;  // kvg_cuda_sync calls

int kvg_cuda_sync(kvg_cuda_ctx * ctx) {
    (void) ctx;
    g_waits++;
    return KVG_OK;
}

// page-locked host memory: counted, so that a check can see the stage reused
static long g_host_allocs, g_host_live;

int kvg_cuda_host_alloc(kvg_cuda_ctx * ctx, size_t n, void ** out) {
    (void) ctx;
    *out = malloc(n);
    g_host_allocs += *out != NULL;
    g_host_live += *out != NULL;
    return *out ? KVG_OK : KVG_ERR_NO_MEMORY;
}

void kvg_cuda_host_free(kvg_cuda_ctx * ctx, void * p) {
    (void) ctx;
    g_host_live -= p != NULL;
    free(p);
}

int kvg_cuda_copy_out(kvg_cuda_ctx * ctx, void * dst, const void * src, size_t n) {
    (void) ctx;
    memcpy(dst, src, n);
    return KVG_OK;
}

// The device's encoder: the rows read as the kernel reads them, then the C encoder (the GPU's are
// byte-equal to it: cuda_check).
int kvg_cuda_encode(kvg_cuda_ctx * ctx, int type, int kind, const void * src, int src_type, int64_t rs, int64_t cs,
                    int64_t T, int64_t Hh, int64_t D, const kvg_codec_params * p, void * dst, size_t dst_bytes,
                    size_t * out_written) {
    (void) ctx;
    if (g_n_coded < 4096) {
        g_coded_arena[g_n_coded] = g_batch_arena;
        g_coded[g_n_coded++]     = dst;
    }
    float * x = (float *) malloc((size_t) (T * Hh * D) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < Hh * D; e++) {
            const int64_t at = t * rs + e * cs;
            if (src_type == KVG_CUDA_F16) {
                uint16_t u;
                memcpy(&u, (const uint8_t *) src + at * 2, 2);
                x[t * Hh * D + e] = kvg_f16_to_f32(u);
            } else {
                x[t * Hh * D + e] = ((const float *) src)[at];
            }
        }
    }
    const int rc = kvg_encode(type, kind, x, (size_t) (T * Hh * D), T, Hh, D, p, dst, dst_bytes, out_written);
    free(x);
    return rc;
}

int kvg_cuda_encode_batch(kvg_cuda_ctx * ctx, const kvg_cuda_encode_job * jobs, int64_t n, int64_t * out_failed) {
    g_batches++;
    g_batch_arena = n > 0 ? jobs[0].dst_dev : NULL;
    for (int64_t i = 0; i < n; i++) {
        const kvg_cuda_encode_job * j = &jobs[i];
        const int                   rc =
            kvg_cuda_encode(ctx, j->type, j->kind, j->src_dev, j->src_type, j->src_row_stride, j->src_col_stride,
                            j->n_tokens, j->n_heads, j->head_dim, &j->params, j->dst_dev, j->dst_bytes, NULL);
        if (rc != KVG_OK) {
            if (out_failed) {
                *out_failed = i;
            }
            return rc;
        }
    }
    return KVG_OK;
}

void kvg_cuda_ctx_free(kvg_cuda_ctx * ctx) {
    (void) ctx;
}
int kvg_cuda_ctx_device(const kvg_cuda_ctx * ctx) {
    (void) ctx;
    return 0;
}
void * kvg_cuda_ctx_set_stream(kvg_cuda_ctx * ctx, void * s) {
    (void) ctx;
    (void) s;
    return NULL;
}
size_t kvg_cuda_ctx_scratch_bytes(const struct kvg_cuda_ctx * ctx) {
    (void) ctx;
    return 0;
}
uint64_t kvg_cuda_ctx_scratch_grown(const struct kvg_cuda_ctx * ctx) {
    (void) ctx;
    return 0;
}
int kvg_cuda_ctx_capturing(const struct kvg_cuda_ctx * ctx) {
    (void) ctx;
    return 0;
}

int kvg_cuda_attend_finish(kvg_cuda_ctx * ctx, const kvg_cuda_finish_args * a) {
    (void) ctx, (void) a;
    return KVG_OK;
}

// ---- the attention stand-ins: compare the rows handed over with the store's ------------------

static const kvg_store * g_store;
static kvg_codec_params  g_params;  // the store's
static int32_t           g_il;
static int64_t           g_row;  // the store row the next call starts at
static long              g_checks, g_bad;
static int               H, DK, DV;

static void bad(const char * what) {
    if (g_bad++ < 20) {
        printf("MISMATCH: %s (layer %d, row %lld)\n", what, (int) g_il, (long long) g_row);
    }
}

// Host store rows [g_row, g_row + n) of `kind` as floats.
static float * store_rows(int kind, int64_t n) {
    const int64_t d   = kind == KVG_KIND_K ? DK : DV;
    float *       out = (float *) malloc((size_t) (n * H * d) * sizeof(float));
    if (!out || kvg_store_decode(g_store, g_il, kind, g_row, g_row + n, out, (size_t) (n * H * d)) != KVG_OK) {
        bad("kvg_store_decode");
    }
    return out;
}

// Bits a code of codec takes (f16: 16).
static int code_bits(int codec) {
    if (codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4) {
        return codec - KVG_CODEC_ROTQ1 + 1;
    }
    return codec == KVG_CODEC_F16 ? 16 : codec == KVG_CODEC_KIVI8 ? 8 : codec - KVG_CODEC_KIVI2 + 2;
}

// Rows [row0, row0 + n) of a block of b->n_rows rows laid out [per-row part][codes] (the part per
// unit of rows: a kivi K group's G, else 1), cut out as one block of whole units and decoded.
static void check_coded(int kind, const kvg_cuda_block * b, int64_t row0, int64_t n) {
    const int64_t    d      = kind == KVG_KIND_K ? DK : DV;
    const int        kivi   = b->codec >= KVG_CODEC_KIVI2 && b->codec <= KVG_CODEC_KIVI8;
    const int64_t    unit   = kivi && kind == KVG_KIND_K ? g_params.group_size : 1;
    const size_t     code_b = (size_t) (H * d * code_bits(b->codec) / 8);
    size_t           full = 0, one = 0, two = 0;
    kvg_codec_params p = g_params;
    if (kvg_encoded_size(b->codec, kind, b->n_rows, H, d, &p, &full) != KVG_OK || full != b->n_bytes ||
        kvg_encoded_size(b->codec, kind, unit, H, d, &p, &one) != KVG_OK ||
        kvg_encoded_size(b->codec, kind, 2 * unit, H, d, &p, &two) != KVG_OK || b->n_rows % unit != 0) {
        bad("a block's size");
        return;
    }
    const size_t  head_b = two - one - (size_t) unit * code_b;  // the per-row part of a unit
    const int64_t u0 = row0 / unit * unit, u1 = (row0 + n + unit - 1) / unit * unit, nu = u1 - u0;
    const size_t  head = (size_t) (nu / unit) * head_b, codes = (size_t) nu * code_b;
    uint8_t *     blk = (uint8_t *) malloc(head + codes);
    memcpy(blk, (const uint8_t *) b->data_dev + (size_t) (u0 / unit) * head_b, head);
    memcpy(blk + head, (const uint8_t *) b->data_dev + (size_t) (b->n_rows / unit) * head_b + (size_t) u0 * code_b,
           codes);
    float * got  = (float *) malloc((size_t) (nu * H * d) * sizeof(float));
    float * want = store_rows(kind, n);
    g_checks++;
    if (kvg_decode(b->codec, kind, blk, head + codes, nu, H, d, &p, got, (size_t) (nu * H * d)) != KVG_OK ||
        memcmp(got + (row0 - u0) * H * d, want, (size_t) (n * H * d) * sizeof(float)) != 0) {
        bad(kind == KVG_KIND_K ? "coded K rows" : "coded V rows");
    }
    free(blk);
    free(got);
    free(want);
}

static int gpu_attends(int codec) {
    return codec == KVG_CODEC_F16 || (codec >= KVG_CODEC_KIVI2 && codec <= KVG_CODEC_KIVI8) ||
           (codec >= KVG_CODEC_ROTQ1 && codec <= KVG_CODEC_ROTQ4);
}

int kvg_cuda_attend(kvg_cuda_ctx * ctx, const kvg_cuda_attend_args * a) {
    (void) ctx;
    if (!gpu_attends(a->k.codec) || !gpu_attends(a->v.codec)) {
        return KVG_ERR_UNSUPPORTED;  // as the kernel refuses them
    }
    g_checks++;
    if (a->group_size != g_params.group_size) {
        bad("the attend call's group size is not the store's");
    }
    check_coded(KVG_KIND_K, &a->k, a->k_row0, a->n_rows);
    check_coded(KVG_KIND_V, &a->v, a->v_row0, a->n_rows);
    g_row += a->n_rows;
    return KVG_OK;
}

static void check_f16(int kind, const void * base, const size_t * nb, int64_t n) {
    const int64_t d    = kind == KVG_KIND_K ? DK : DV;
    float *       want = store_rows(kind, n);
    g_checks++;
    for (int64_t c = 0; c < n; c++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < d; i++) {
                uint16_t u;
                memcpy(&u, (const uint8_t *) base + c * nb[2] + h * nb[1] + i * nb[0], 2);
                const float f = kvg_f16_to_f32(u);
                if (memcmp(&f, &want[(c * H + h) * d + i], sizeof(float)) != 0) {
                    bad(kind == KVG_KIND_K ? "f16 K rows" : "f16 V rows");
                    free(want);
                    return;
                }
            }
        }
    }
    free(want);
}

int kvg_cuda_attend_cells(kvg_cuda_ctx * ctx, const kvg_cuda_cells_args * a) {
    (void) ctx;
    if (a->mask_dev) {
        return KVG_OK;  // llama.cpp's own cells: not the store's
    }
    check_f16(KVG_KIND_K, a->k_dev, a->k_nb, a->c1 - a->c0);
    check_f16(KVG_KIND_V, a->v_dev, a->v_nb, a->c1 - a->c0);
    g_row += a->c1 - a->c0;
    return KVG_OK;
}

// The pass: its parts in order, each as the calls above take it, after all of them were checked
// (the pass refuses a part before it queues anything). Each part's state must be the pass's.
int kvg_cuda_attend_pass(kvg_cuda_ctx * ctx, const kvg_cuda_pass_args * p) {
    for (int32_t i = 0; i < p->n_parts; i++) {
        const kvg_cuda_attend_args * r = p->parts[i].run;
        const kvg_cuda_cells_args *  c = p->parts[i].cells;
        if ((r != NULL) == (c != NULL)) {
            return KVG_ERR_INVALID_ARG;
        }
        if (r && (!gpu_attends(r->k.codec) || !gpu_attends(r->v.codec))) {
            return KVG_ERR_UNSUPPORTED;  // as the kernel refuses them
        }
        if ((r ? r->m_dev : c->m_dev) != p->m_dev || (r ? r->acc_dev : c->acc_dev) != p->acc_dev) {
            bad("a part's state is not the pass's");
        }
        if (!p->q_src || (r ? r->q_dev : c->q_dev) != p->q_dst) {
            bad("the hook's pass does not gather the queries into every part's");
        }
    }
    if (!p->fresh) {
        bad("the hook's pass does not start its state fresh");
    }
    for (int32_t i = 0; i < p->n_parts; i++) {
        const int st =
            p->parts[i].run ? kvg_cuda_attend(ctx, p->parts[i].run) : kvg_cuda_attend_cells(ctx, p->parts[i].cells);
        if (st != KVG_OK) {
            return st;
        }
    }
    return KVG_OK;
}

// ---- the check -------------------------------------------------------------------------------

// Every layer's rows through the attend hook: each must arrive once, in order, as the store has it.
static void check_all(kvg_cuda_store * d, int n_layer, const char * when) {
    for (int il = 0; il < n_layer; il++) {
        int64_t nk = 0;
        kvg_store_n_rows(g_store, il, KVG_KIND_K, &nk);
        kvg_cuda_layer_args a;
        memset(&a, 0, sizeof(a));
        a.il              = il;
        a.n_cold          = nk;
        a.n_tokens        = 1;
        a.n_head          = H;
        a.n_head_kv       = H;
        a.head_dim_k      = DK;
        a.head_dim_v      = DV;
        a.n_kv            = 1;
        a.mask_dev        = &a;  // marks llama.cpp's cells
        a.q_dev           = &a;  // never read here: the pass gathers it on the device
        g_il              = il;
        g_row             = 0;
        const long before = g_bad;
        const int  st     = kvg_cuda_store_hook_attend(d, &a, 0, NULL);
        g_checks++;
        if (st != KVG_OK || g_row != nk) {
            printf("MISMATCH: %s: layer %d, status %d, %lld of %lld rows attended (%s)\n", when, il, st,
                   (long long) g_row, (long long) nk, kvg_last_error());
            g_bad++;
        } else if (g_bad != before) {
            printf("  (%s)\n", when);
        }
    }
}

static void rows(uint64_t * seed, float * x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i]  = (float) ((int64_t) (*seed >> 33) % 2001 - 1000) / 250.0f;
    }
}

// A run's codecs: the evictions' K and V, the archive's, and kivi's group size.
typedef struct flavor {
    const char * name;
    int          k, v, archive, group;
} flavor;

// One long run (below) with fl's codecs; 1 on a failure that ends it (a mismatch only counts).
static int run(const flavor * fl) {
    H = 2, DK = 64, DV = 32;
    const int        L = 2;
    kvg_store_params p;
    kvg_store_default_params(&p);
    p.n_layer               = L;
    p.n_head_kv             = H;
    p.head_dim_k            = DK;
    p.head_dim_v            = DV;
    p.codec.group_size      = fl->group;
    g_params                = p.codec;
    g_from_device           = 0;
    const long  host_allocs = g_host_allocs;
    kvg_store * s           = NULL;
    if (kvg_store_init(&p, &s) != KVG_OK) {
        printf("kvg_store_init: %s\n", kvg_last_error());
        return 1;
    }
    g_store            = s;
    kvg_cuda_store * d = NULL;
    if (kvg_cuda_store_init((kvg_cuda_ctx *) &p, s, &d) != KVG_OK) {  // the context is never read here
        printf("kvg_cuda_store_init: %s\n", kvg_last_error());
        return 1;
    }
    uint64_t seed  = 1;
    float *  xk    = (float *) malloc(sizeof(float) * 64 * H * DK);
    float *  xv    = (float *) malloc(sizeof(float) * 64 * H * DV);
    int      syncs = 0, fails = 0, aged = 0;
    long     from_device = 0;  // device-coded blocks a sync must take from the device
    // sinks (f16), then 60 evictions of 64 rows (K fl->k, V fl->v); from the 5th on, the oldest
    // warm block but the newest four ages to fl->archive, every 7th to fl->k (for K, the same codec:
    // its tier alone changes); every 13th step cuts inside the newest block (kivi: in a group);
    // twice the store is cleared
    for (int step = 0; step < 61; step++) {
        const uint64_t gen_before = kvg_cuda_store_hook_generation(d);
        const int      sinks      = step == 0 || step == 31 || step == 51;
        const int64_t  nr         = sinks ? 4 : 64;
        if (step == 31 || step == 51) {
            kvg_store_clear(s);
        }
        rows(&seed, xk, nr * H * DK);
        rows(&seed, xv, nr * H * DV);
        const int kc = sinks ? KVG_CODEC_F16 : fl->k, vc = sinks ? KVG_CODEC_F16 : fl->v;
        const int tier = sinks ? KVG_TIER_SINK : KVG_TIER_WARM;
        if (step % 2) {
            // coded on the "device" from f16 cells, K as rows and V transposed (llama.cpp without
            // flash attention), as an eviction on a GPU codes them: the host store must get the
            // bytes the C encoder gives the same values
            uint16_t * ck = (uint16_t *) malloc(sizeof(uint16_t) * (size_t) (nr * H * DK));
            uint16_t * cv = (uint16_t *) malloc(sizeof(uint16_t) * (size_t) (nr * H * DV));
            for (int64_t t = 0; t < nr; t++) {
                for (int64_t e = 0; e < H * DK; e++) {
                    ck[t * H * DK + e] = kvg_f32_to_f16(xk[t * H * DK + e]);
                    xk[t * H * DK + e] = kvg_f16_to_f32(ck[t * H * DK + e]);
                }
                for (int64_t e = 0; e < H * DV; e++) {
                    cv[e * nr + t]     = kvg_f32_to_f16(xv[t * H * DV + e]);
                    xv[t * H * DV + e] = kvg_f16_to_f32(cv[e * nr + t]);
                }
            }
            // every other time all lists in one call, as an eviction codes them (one wait, one arena)
            const int           many = step % 4 == 1;
            const long          b0 = g_batches, a0 = g_allocs;
            kvg_cuda_store_item items[2 * 16];
            for (int il = 0; many && il < L; il++) {
                items[2 * il]     = (kvg_cuda_store_item) { il, KVG_KIND_K, tier, kc, ck, KVG_CUDA_F16, H * DK, 1, nr };
                items[2 * il + 1] = (kvg_cuda_store_item) { il, KVG_KIND_V, tier, vc, cv, KVG_CUDA_F16, 1, nr, nr };
            }
            if (many && (kvg_cuda_store_encode_many(d, items, 2 * L) != KVG_OK || g_batches != b0 + 1)) {
                printf("kvg_cuda_store_encode_many: %s (%ld batches)\n", kvg_last_error(), g_batches - b0);
                return 1;
            }
            // an eviction as large as one before it (since synced) codes into the arena that one
            // left: no cudaMalloc, and no cudaFree at the next sync, each of which waits on the device
            g_checks += many && step > 1;
            if (many && step > 1 && g_allocs != a0) {
                printf("MISMATCH: step %d: an eviction the size of the last allocated %ld arenas\n", step,
                       g_allocs - a0);
                g_bad++;
            }
            for (int il = 0; il < L; il++) {
                if (!many &&
                    (kvg_cuda_store_encode(d, il, KVG_KIND_K, tier, kc, ck, KVG_CUDA_F16, H * DK, 1, nr) != KVG_OK ||
                     kvg_cuda_store_encode(d, il, KVG_KIND_V, tier, vc, cv, KVG_CUDA_F16, 1, nr, nr) != KVG_OK)) {
                    printf("kvg_cuda_store_encode: %s\n", kvg_last_error());
                    return 1;
                }
                int64_t nb = 0;
                kvg_store_n_blocks(s, il, KVG_KIND_V, &nb);
                kvg_block_info info;
                kvg_store_block(s, il, KVG_KIND_V, nb - 1, &info, NULL, 0);
                uint8_t *        got  = (uint8_t *) malloc(info.n_bytes);
                uint8_t *        want = (uint8_t *) malloc(info.n_bytes);
                size_t           w    = 0;
                kvg_codec_params cp   = p.codec;
                kvg_store_block(s, il, KVG_KIND_V, nb - 1, &info, got, info.n_bytes);
                g_checks++;
                if (kvg_encode(vc, KVG_KIND_V, xv, (size_t) (nr * H * DV), nr, H, DV, &cp, want, info.n_bytes, &w) !=
                        KVG_OK ||
                    w != info.n_bytes || memcmp(got, want, w) != 0) {
                    printf("MISMATCH: step %d: the block coded on the device is not the C encoder's\n", step);
                    g_bad++;
                }
                free(got);
                free(want);
            }
            free(ck);
            free(cv);
        } else {
            for (int il = 0; il < L; il++) {
                if (kvg_store_append(s, il, KVG_KIND_K, tier, kc, xk, (size_t) (nr * H * DK), nr) != KVG_OK ||
                    kvg_store_append(s, il, KVG_KIND_V, tier, vc, xv, (size_t) (nr * H * DV), nr) != KVG_OK) {
                    printf("kvg_store_append: %s\n", kvg_last_error());
                    return 1;
                }
            }
        }
        int64_t nb = 0;
        kvg_store_n_blocks(s, 0, KVG_KIND_K, &nb);
        for (int64_t b = 0; b + 4 < nb; b++) {
            kvg_block_info info;
            kvg_store_block(s, 0, KVG_KIND_K, b, &info, NULL, 0);
            if (info.tier == KVG_TIER_WARM) {
                const int codec = aged++ % 7 == 3 ? fl->k : fl->archive;
                if (kvg_store_retier(s, info.row0, info.row0 + info.n_rows, KVG_TIER_ARCHIVE, codec) != KVG_OK) {
                    printf("kvg_store_retier: %s\n", kvg_last_error());
                    return 1;
                }
                break;
            }
        }
        int64_t n = 0;
        kvg_store_n_rows(s, 0, KVG_KIND_K, &n);
        from_device += step % 2 ? 2 * L : 0;
        if (step % 13 == 12 && n > 100) {
            from_device -= step % 2 ? 2 * L : 0;  // the newest blocks, cut and coded again on the host
            if (kvg_store_truncate(s, n - 40) != KVG_OK) {
                printf("kvg_store_truncate: %s\n", kvg_last_error());
                return 1;
            }
        }
        // a failed allocation in every fifth sync: the copy must stay as it was, stale, and leak nothing
        int current = 0;  // that sync needed no second allocation and brought the copy up to date
        if (step % 5 == 3) {
            const long   live  = g_live_allocs;
            const size_t held  = g_live_bytes;
            const long   taken = g_from_device;
            g_fail_at          = g_allocs + 1;
            const int st       = kvg_cuda_store_sync(d);
            g_fail_at          = -1;
            if (st != KVG_OK) {
                g_from_device = taken;  // what a failed sync copied, the next one copies again
            }
            g_checks++;
            if (st == KVG_OK) {
                // nothing to allocate past the first: fine, but then it must be current
                current = 1;
                check_all(d, L, "a sync that needed at most one allocation");
            } else {
                fails++;
                if (g_live_allocs != live || g_live_bytes != held) {
                    printf("MISMATCH: a failed sync leaked (%ld allocations, %zu bytes; before %ld, %zu)\n",
                           g_live_allocs, g_live_bytes, live, held);
                    g_bad++;
                }
                kvg_cuda_layer_args a;
                memset(&a, 0, sizeof(a));
                a.il = 0, a.n_cold = 1, a.n_tokens = 1, a.n_head = H, a.n_head_kv = H, a.head_dim_k = DK,
                a.head_dim_v = DV;
                g_checks++;
                if (kvg_cuda_store_hook_attend(d, &a, 0, NULL) == KVG_OK) {
                    printf("MISMATCH: a stale copy attended\n");
                    g_bad++;
                }
            }
        }
        const long w0 = g_waits;
        if (kvg_cuda_store_sync(d) != KVG_OK) {
            printf("kvg_cuda_store_sync: %s\n", kvg_last_error());
            return 1;
        }
        syncs++;
        g_checks++;
        if (g_waits - w0 != !current) {  // every step appends: copies, queued, and one wait for them all
            printf("MISMATCH: step %d: the sync waited %ld times (the copy was %s)\n", step, g_waits - w0,
                   current ? "current" : "behind");
            g_bad++;
        }
        // every step appends: llama.cpp's CUDA graphs must see the copy change (hook_generation)
        g_checks++;
        if (kvg_cuda_store_hook_generation(d) == gen_before) {
            printf("MISMATCH: step %d: the store changed and the copy's generation did not\n", step);
            g_bad++;
        }
        // every arena the sync emptied is freed, but for one kept for the next eviction
        g_checks++;
        const void * kept = NULL;
        for (int i = 0; i < g_n_coded; i++) {
            if (g_coded[i] && kept && g_coded_arena[i] != kept) {
                printf("MISMATCH: step %d: two arenas of blocks coded on the device outlived the sync that took them\n",
                       step);
                g_bad++;
                break;
            }
            kept = g_coded[i] ? g_coded_arena[i] : kept;
        }
        g_n_coded    = 0;
        uint64_t dev = 0, scratch = 0;
        kvg_cuda_store_bytes(d, &dev, &scratch);
        g_checks++;
        if (dev + scratch != g_live_bytes) {
            printf("MISMATCH: the copy says it holds %llu + %llu bytes, %zu are allocated\n", (unsigned long long) dev,
                   (unsigned long long) scratch, g_live_bytes);
            g_bad++;
        }
        char when[64];
        snprintf(when, sizeof(when), "after step %d", step);
        check_all(d, L, when);
        // decode syncs before every token, mostly with nothing changed: such a sync must copy and
        // allocate nothing, and leave the copy as current as it was
        const long     allocs = g_allocs, copies = g_copies, waits = g_waits;
        const uint64_t gen = kvg_cuda_store_hook_generation(d);
        g_checks++;
        if (kvg_cuda_store_hook_generation(d) == 0 || kvg_cuda_store_sync(d) != KVG_OK ||
            kvg_cuda_store_hook_generation(d) != gen) {
            printf("MISMATCH: step %d: a sync with nothing changed changed the generation (%llu, was %llu)\n", step,
                   (unsigned long long) kvg_cuda_store_hook_generation(d), (unsigned long long) gen);
            g_bad++;
        }
        g_checks++;
        if (g_allocs != allocs || g_copies != copies || g_waits != waits) {
            printf("MISMATCH: step %d: a sync with nothing changed made %ld allocations, %ld copies, %ld waits\n", step,
                   g_allocs - allocs, g_copies - copies, g_waits - waits);
            g_bad++;
        }
        snprintf(when, sizeof(when), "after step %d and a sync with nothing changed", step);
        check_all(d, L, when);
        if (step == 40) {  // a layer turned off and on: its lists go and come back at the next syncs
            const size_t   before = g_live_bytes;
            const uint64_t gen_on = kvg_cuda_store_hook_generation(d);
            kvg_cuda_store_set_layer(d, 1, 0);
            g_checks++;
            if (kvg_cuda_store_hook_generation(d) == gen_on) {
                printf("MISMATCH: turning layer 1 off left the generation as it was\n");
                g_bad++;
            }
            g_checks++;
            if (kvg_cuda_store_sync(d) != KVG_OK || g_live_bytes >= before) {
                printf("MISMATCH: turning layer 1 off freed none of its segments\n");
                g_bad++;
            }
            kvg_cuda_store_set_layer(d, 1, 1);
            if (kvg_cuda_store_sync(d) != KVG_OK) {
                printf("kvg_cuda_store_sync: %s\n", kvg_last_error());
                return 1;
            }
            check_all(d, L, "after layer 1 went off and on");
        }
    }
    kvg_cuda_store_free(d);
    kvg_store_free(s);
    free(xk);
    free(xv);
    // every block coded on the device and still in the store at the next sync came from the device
    g_checks++;
    if (g_from_device != from_device) {
        printf("MISMATCH: %ld blocks taken from the device's encoder, %ld expected\n", g_from_device, from_device);
        g_bad++;
    }
    g_checks++;
    if (g_live_allocs != 0 || g_host_live != 0) {
        printf("MISMATCH: %ld device and %ld host allocations left after kvg_cuda_store_free\n", g_live_allocs,
               g_host_live);
        g_bad++;
    }
    // the codes come out through one page-locked stage, sized by the first (and largest) eviction
    g_checks++;
    if (g_host_allocs - host_allocs != 1) {
        printf("MISMATCH: %ld page-locked stages allocated, expected 1\n", g_host_allocs - host_allocs);
        g_bad++;
    }
    printf(
        "store_sync_check (%s): %d syncs (%d failed on purpose), %ld blocks coded on the device and taken from there\n",
        fl->name, syncs, fails, g_from_device);
    return 0;
}

int main(void) {
    // rotq; kivi (K's groups of 32 tokens: the copy's runs break after a block that is not whole
    // groups); kivi8 in groups of 64 (the near-exact preset's) with rotq values
    const flavor flavors[] = {
        { "K rotq4, V rotq3, archive rotq2", KVG_CODEC_ROTQ4, KVG_CODEC_ROTQ3, KVG_CODEC_ROTQ2,
          KVG_DEFAULT_GROUP_SIZE },
        { "K kivi4, V kivi2, archive kivi2", KVG_CODEC_KIVI4, KVG_CODEC_KIVI2, KVG_CODEC_KIVI2,
          KVG_DEFAULT_GROUP_SIZE },
        { "K kivi8, V rotq3, archive kivi4, groups of 64", KVG_CODEC_KIVI8, KVG_CODEC_ROTQ3, KVG_CODEC_KIVI4, 64 },
    };
    for (size_t i = 0; i < sizeof(flavors) / sizeof(flavors[0]); i++) {
        if (run(&flavors[i]) != 0) {
            return 1;
        }
    }
    printf("store_sync_check: %ld checks, %ld mismatches\n%s\n", g_checks, g_bad, g_bad ? "FAIL" : "PASS");
    return g_bad ? 1 : 0;
}
