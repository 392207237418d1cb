// delta.c: temporal keyframe + 4-bit residual codecs (issue 13; the seed's TSC part I).
//
// Rows t of a block with t % KVG_DELTA_KEYFRAME == 0 are keyframes, kept in f16 (the seed
// kept them in f32). Every other row stores a residual r_t = x_t - ref_t, quantized at 4 bits
// with an asymmetric f16 min and scale per group of DELTA_GROUP channels of one head, as kivi
// quantizes a value row:
//   delta4:  ref_t is the decoded keyframe of the row's 64-row segment;
//   pdelta4: ref_t is the decoded row t - 1 (closed-loop DPCM, the seed's "sequential KV
//            compression"): the encoder predicts from what the decoder will have, so the
//            quantization errors do not accumulate along the segment; decode is sequential.
// Every row decodes within half a stored step of its input: |x - x'| <= scale / 2 (plus f32
// rounding of the sums).
//
// Layout of a block of T rows, H heads of D channels (C = H * D), n_key = ceil(T / 64)
// keyframes, n_res = T - n_key residual rows, n_g = ceil(D / 64) groups per head:
//   keyframes [n_key][C] f16
//   groups    [n_res][H][n_g] { f16 min, f16 scale }   (kvg_kivi_group)
//   codes     [n_res][C] 4 bits, kivi's little-endian bitstream
// Bits per value at the live cache's block (64, H, D):
//   (16 D + 63 (4 D + 32 ceil(D / 64))) / (64 D) = 4.6797 for D = 64, 128, 256.
//
// DELTA_GROUP = 64 was measured on SmolLM2 and Gemma-3 keys and values (issue 13): on
// D = 256 heads, one min/scale per head (4.31 bits) has 2.1-2.5x the relative MSE of
// 64-channel groups (4.68 bits), more than the 0.37 bits are worth at 6 dB a bit (1.7x);
// 32-channel groups (5.17 bits) gain only 1.35-1.65x for another 0.49 bits (worth 2x).
// For D <= 64 a group is the whole head.
//
// What prediction buys on those rows (post-RoPE, as llama.cpp caches them): consecutive keys
// differ by about a third of their energy (the slow RoPE pairs, which hold most of it, barely
// turn), so pdelta4 halves delta4's key MSE; values are nearly independent from row to row,
// their residual has 1.3-1.7x the row's energy, and both codecs do worse on V than the same
// bytes spent on the rows themselves.
//
// A residual may leave f16's range although both rows are inside it (x_t = 6e4 after a
// keyframe of -6e4): such a group is refused with KVG_ERR_RANGE, never clamped.
#include "kvg_internal.h"

#include <stdlib.h>

#define DELTA_GROUP 64  // channels per min/scale, within one head (measured, see above)
#define DELTA_BITS  4
#define DELTA_TOP   15  // 2^DELTA_BITS - 1

typedef struct delta_layout {
    int64_t n_key;    // keyframe rows
    int64_t n_res;    // residual rows
    int64_t n_g;      // groups per head
    size_t  key_off;  // byte offsets of the three sections
    size_t  grp_off;
    size_t  code_off;
    size_t  total;
} delta_layout;

static void layout_of(const kvg_job * job, delta_layout * l) {
    const int64_t C = job->n_channels;
    l->n_key        = (job->n_tokens + KVG_DELTA_KEYFRAME - 1) / KVG_DELTA_KEYFRAME;
    l->n_res        = job->n_tokens - l->n_key;
    l->n_g          = (job->head_dim + DELTA_GROUP - 1) / DELTA_GROUP;
    l->key_off      = 0;
    l->grp_off      = (size_t) l->n_key * (size_t) C * 2;
    l->code_off     = l->grp_off + (size_t) l->n_res * (size_t) job->n_heads * (size_t) l->n_g * sizeof(kvg_kivi_group);
    l->total        = l->code_off + (size_t) kvg_code_bytes(l->n_res * C, DELTA_BITS);
}

// Index of non-keyframe row t among the residual rows: rows 0..t hold t / 64 + 1 keyframes.
static int64_t res_index(int64_t t) {
    return t - (t / KVG_DELTA_KEYFRAME + 1);
}

// The decoded value; encoder and decoder both use it, so pdelta's prediction is exact.
static inline float recon(float ref, float mf, float sf, uint8_t q) {
    return ref + (mf + (float) q * sf);
}

static int size_of(const kvg_job * job, size_t * out_bytes) {
    // Bytes are at most 2 (keyframe) + 4 (a group of one channel) + 1/2 (code) per value, and
    // codecs.c caps values at SIZE_MAX / 8: nothing below overflows.
    const uint64_t n_key = (uint64_t) ((job->n_tokens + KVG_DELTA_KEYFRAME - 1) / KVG_DELTA_KEYFRAME);
    const uint64_t n_res = (uint64_t) job->n_tokens - n_key;
    const uint64_t n_g   = (uint64_t) ((job->head_dim + DELTA_GROUP - 1) / DELTA_GROUP);
    const uint64_t bytes = n_key * (uint64_t) job->n_channels * 2 +
                           n_res * (uint64_t) job->n_heads * n_g * sizeof(kvg_kivi_group) +
                           kvg_code_bytes((int64_t) n_res * job->n_channels, DELTA_BITS);
    if (bytes > (uint64_t) SIZE_MAX) {
        return kvg_fail(KVG_ERR_SHAPE, "%s: encoded size %llu does not fit in size_t", kvg_codec_name(job->type),
                        (unsigned long long) bytes);
    }
    *out_bytes = (size_t) bytes;
    return KVG_OK;
}

int kvg_delta_size(const kvg_job * job, size_t * out_bytes) {
    return size_of(job, out_bytes);
}

int kvg_pdelta_size(const kvg_job * job, size_t * out_bytes) {
    return size_of(job, out_bytes);
}

// ---- encode --------------------------------------------------------------------------------

// The f16 min (rounded down) and scale (rounded up) of a residual group spanning [mn, mx], so
// that [min, min + 15 * scale] covers it; a constant group gets the nearest f16 and scale 0.
static int group_params(const kvg_job * job, int64_t t, int64_t c0, int64_t c1, float mn, float mx, kvg_kivi_group * g,
                        float * mf, float * sf, float * inv) {
    mn           = mn + 0.0f;  // -0 -> +0
    uint16_t m16 = 0;
    uint16_t s16 = 0;
    if (mn >= -KVG_F16_MAX && mn <= KVG_F16_MAX) {
        m16 = kvg_f32_to_f16(mn);
        if (mn != mx) {
            if (kvg_f16_to_f32(m16) > mn) {
                m16 = kvg_f16_next_down(m16);  // stays finite: mn >= -65504, the lowest f16
            }
            const double s = ((double) mx - (double) kvg_f16_to_f32(m16)) / DELTA_TOP;
            s16            = kvg_f32_to_f16((float) s);
            if ((double) kvg_f16_to_f32(s16) < s) {
                s16 = kvg_f16_next_up(s16);
            }
        }
    }
    if (!(mn >= -KVG_F16_MAX && mn <= KVG_F16_MAX) || !kvg_f16_is_finite(s16)) {
        return kvg_fail(KVG_ERR_RANGE,
                        "%s: the residual of row %lld, channels %lld..%lld spans [%g, %g], beyond f16 (|r| <= 65504): "
                        "the row differs from its reference by more than f16 holds",
                        kvg_codec_name(job->type), (long long) t, (long long) c0, (long long) c1 - 1, (double) mn,
                        (double) mx);
    }
    kvg_put_u16(g->min_f16, m16);
    kvg_put_u16(g->scale_f16, s16);
    *mf  = kvg_f16_to_f32(m16);
    *sf  = kvg_f16_to_f32(s16);
    *inv = s16 != 0 ? 1.0f / *sf : 0.0f;
    return KVG_OK;
}

// Quantizes row t (x) against ref: writes its groups and codes and its decoded values to y.
static int encode_row(const kvg_job * job, const delta_layout * l, int64_t t, const float * x, const float * ref,
                      uint8_t * dst, float * y, uint8_t * q) {
    const int64_t    D = job->head_dim;
    const int64_t    i = res_index(t);
    kvg_kivi_group * g = (kvg_kivi_group *) (dst + l->grp_off) + i * job->n_heads * l->n_g;
    for (int64_t h = 0; h < job->n_heads; h++) {
        for (int64_t k = 0; k < l->n_g; k++) {
            const int64_t c0 = h * D + k * DELTA_GROUP;
            const int64_t c1 = c0 + DELTA_GROUP < (h + 1) * D ? c0 + DELTA_GROUP : (h + 1) * D;
            float         mn = x[c0] - ref[c0];
            float         mx = mn;
            for (int64_t c = c0 + 1; c < c1; c++) {
                const float r = x[c] - ref[c];
                mn            = r < mn ? r : mn;
                mx            = r > mx ? r : mx;
            }
            float     mf = 0.0f, sf = 0.0f, inv = 0.0f;
            const int st = group_params(job, t, c0, c1, mn, mx, &g[h * l->n_g + k], &mf, &sf, &inv);
            if (st != KVG_OK) {
                return st;
            }
            for (int64_t c = c0; c < c1; c++) {
                q[c] = kvg_kivi_code(x[c] - ref[c], mf, inv, (float) DELTA_TOP);
                y[c] = recon(ref[c], mf, sf, q[c]);
            }
        }
    }
    kvg_pack_bits(dst + l->code_off, (uint64_t) (i * job->n_channels) * DELTA_BITS, q, (size_t) job->n_channels,
                  DELTA_BITS);
    return KVG_OK;
}

static int encode(const kvg_job * job, const float * src, uint8_t * dst, int predictive) {
    const int64_t C = job->n_channels;
    delta_layout  l;
    layout_of(job, &l);

    // Rows beyond f16 are refused up front: a residual row would otherwise carry them.
    for (int64_t e = 0; e < job->n_values; e++) {
        if (!(src[e] >= -KVG_F16_MAX && src[e] <= KVG_F16_MAX)) {
            return kvg_fail(KVG_ERR_RANGE, "%s: value %g at row %lld, channel %lld does not fit in f16 (|x| <= 65504)",
                            kvg_codec_name(job->type), (double) src[e], (long long) (e / C), (long long) (e % C));
        }
    }
    memset(dst + l.code_off, 0, l.total - l.code_off);

    // ref: the keyframe (delta) or the previous row (pdelta) as decoded; y: the row just coded
    float * buf = (uint64_t) C <= SIZE_MAX / (2 * sizeof(float) + 1)
                      ? (float *) malloc((size_t) C * (2 * sizeof(float) + 1))
                      : NULL;
    if (buf == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate scratch for %lld channels", kvg_codec_name(job->type),
                        (long long) C);
    }
    float *   ref = buf;
    float *   y   = buf + C;
    uint8_t * q   = (uint8_t *) (buf + 2 * C);
    int       st  = KVG_OK;
    for (int64_t t = 0; t < job->n_tokens && st == KVG_OK; t++) {
        const float * x = src + t * C;
        if (t % KVG_DELTA_KEYFRAME == 0) {
            uint8_t * key = dst + l.key_off + (size_t) (t / KVG_DELTA_KEYFRAME) * (size_t) C * 2;
            for (int64_t c = 0; c < C; c++) {
                const uint16_t h = kvg_f32_to_f16(x[c]);
                kvg_put_u16(key + 2 * c, h);
                ref[c] = kvg_f16_to_f32(h);
            }
            continue;
        }
        st = encode_row(job, &l, t, x, ref, dst, y, q);
        if (predictive) {
            memcpy(ref, y, (size_t) C * sizeof(float));
        }
    }
    free(buf);
    return st;
}

int kvg_delta_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    return encode(job, src, dst, 0);
}

int kvg_pdelta_encode_ref(const kvg_job * job, const float * src, uint8_t * dst) {
    return encode(job, src, dst, 1);
}

// ---- check and decode ----------------------------------------------------------------------

// The encoder stores finite keyframes, finite mins and finite scales that are +0 or positive.
static int check(const kvg_job * job, const uint8_t * src) {
    delta_layout l;
    layout_of(job, &l);
    const char *   name  = kvg_codec_name(job->type);
    const uint64_t n_key = (uint64_t) l.n_key * (uint64_t) job->n_channels;
    for (uint64_t e = 0; e < n_key; e++) {
        const uint16_t h = kvg_get_u16(src + l.key_off + 2 * e);
        if (!kvg_f16_is_finite(h)) {
            return kvg_fail(KVG_ERR_CORRUPT, "%s: keyframe %llu, channel %llu is 0x%04x (not finite)", name,
                            (unsigned long long) (e / (uint64_t) job->n_channels),
                            (unsigned long long) (e % (uint64_t) job->n_channels), h);
        }
    }
    const kvg_kivi_group * g   = (const kvg_kivi_group *) (src + l.grp_off);
    const uint64_t         n_g = (uint64_t) l.n_res * (uint64_t) job->n_heads * (uint64_t) l.n_g;
    for (uint64_t e = 0; e < n_g; e++) {
        const uint16_t m16 = kvg_get_u16(g[e].min_f16);
        const uint16_t s16 = kvg_get_u16(g[e].scale_f16);
        if (!kvg_f16_is_finite(m16) || !kvg_f16_is_finite(s16) || (s16 & 0x8000)) {
            return kvg_fail(KVG_ERR_CORRUPT,
                            "%s: residual group %llu has min 0x%04x, scale 0x%04x (not finite or negative scale)", name,
                            (unsigned long long) e, m16, s16);
        }
    }
    return KVG_OK;
}

int kvg_delta_check(const kvg_job * job, const uint8_t * src) {
    return check(job, src);
}

int kvg_pdelta_check(const kvg_job * job, const uint8_t * src) {
    return check(job, src);
}

// Decodes into dst after the whole block passed check. References are rows of dst itself: the
// segment's keyframe (delta) or the row before (pdelta). A corrupt but finite block decodes to
// finite values: |x'| <= 65504 * (1 + 63 * 16) < 2^31 even for pdelta's longest chain.
static int decode(const kvg_job * job, const uint8_t * src, float * dst, int predictive) {
    const int64_t C  = job->n_channels;
    const int64_t D  = job->head_dim;
    int           st = check(job, src);
    if (st != KVG_OK) {
        return st;
    }
    delta_layout l;
    layout_of(job, &l);
    uint8_t * q = (uint8_t *) malloc((size_t) C);
    if (q == NULL) {
        return kvg_fail(KVG_ERR_NO_MEMORY, "%s: cannot allocate scratch for %lld channels", kvg_codec_name(job->type),
                        (long long) C);
    }
    const kvg_kivi_group * groups = (const kvg_kivi_group *) (src + l.grp_off);
    for (int64_t t = 0; t < job->n_tokens; t++) {
        float * y = dst + t * C;
        if (t % KVG_DELTA_KEYFRAME == 0) {
            const uint8_t * key = src + l.key_off + (size_t) (t / KVG_DELTA_KEYFRAME) * (size_t) C * 2;
            for (int64_t c = 0; c < C; c++) {
                y[c] = kvg_f16_to_f32(kvg_get_u16(key + 2 * c));
            }
            continue;
        }
        const float *          ref = predictive ? y - C : dst + (t - t % KVG_DELTA_KEYFRAME) * C;
        const int64_t          i   = res_index(t);
        const kvg_kivi_group * g   = groups + i * job->n_heads * l.n_g;
        kvg_unpack_bits(src + l.code_off, (uint64_t) (i * C) * DELTA_BITS, q, (size_t) C, DELTA_BITS);
        for (int64_t h = 0; h < job->n_heads; h++) {
            for (int64_t k = 0; k < l.n_g; k++) {
                const int64_t c0 = h * D + k * DELTA_GROUP;
                const int64_t c1 = c0 + DELTA_GROUP < (h + 1) * D ? c0 + DELTA_GROUP : (h + 1) * D;
                const float   mf = kvg_f16_to_f32(kvg_get_u16(g[h * l.n_g + k].min_f16));
                const float   sf = kvg_f16_to_f32(kvg_get_u16(g[h * l.n_g + k].scale_f16));
                for (int64_t c = c0; c < c1; c++) {
                    y[c] = recon(ref[c], mf, sf, q[c]);
                }
            }
        }
    }
    free(q);
    return KVG_OK;
}

int kvg_delta_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    return decode(job, src, dst, 0);
}

int kvg_pdelta_decode_ref(const kvg_job * job, const uint8_t * src, float * dst) {
    return decode(job, src, dst, 1);
}
