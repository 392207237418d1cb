// tcq_viterbi.h: the Viterbi search of the tcq encoder, included by tcq.c (plain loops, the
// oracle) and by tcq_avx2.c / tcq_neon.c (vector extensions). The includer defines
// TCQ_VECTOR_EXT (0 or 1) and TCQ_VITERBI (the function's name); kvg_internal.h and
// tcq_tables.h come first.
#include <string.h>

#define TCQ_L      KVG_TCQ_WINDOW
#define TCQ_STATES (1 << TCQ_L)
#define TCQ_FAR    1e30f  // a window the trellis cannot be in
#define TCQ_LANES  KVG_TCQ_LANES

// The Viterbi search runs TCQ_LANES head vectors at once, one per lane of an 8-float vector
// (GCC and Clang vector extensions: AVX2 or SSE, NEON, whatever the target has; elsewhere
// plain loops). Each lane takes exactly the scalar steps (no contraction: -ffp-contract=off),
// so the codes are the same on every target.
//
// A path's cost is a sum of squares, so >= 0, and non-negative floats order as their bits do
// as unsigned integers. The low B bits of each window's cost are replaced by the window's own
// low B bits (h below): one integer min over a window's predecessors then gives the cheapest
// and which it was, at a relative cost of 2^-19 in the sums compared.
#if TCQ_VECTOR_EXT
typedef float        tcq_vf __attribute__((vector_size(32)));
typedef int32_t      tcq_vu __attribute__((vector_size(32)));  // bits of non-negative floats: < 2^31
static inline tcq_vf tcq_splat(float x) {
    return (tcq_vf) { x, x, x, x, x, x, x, x };
}
static inline tcq_vf tcq_sq_add(tcq_vf m, tcq_vf y, float t) {
    return m + (y - t) * (y - t);
}
static inline tcq_vu tcq_bits(tcq_vf x) {
    return (tcq_vu) x;
}
static inline tcq_vf tcq_float(tcq_vu x) {
    return (tcq_vf) x;
}
static inline tcq_vu tcq_and(tcq_vu a, int32_t b) {
    return a & b;
}
static inline tcq_vu tcq_or(tcq_vu a, int32_t b) {
    return a | b;
}
static inline tcq_vu tcq_min(tcq_vu a, tcq_vu b) {
    tcq_vu k = a < b;
    return (k & a) | (~k & b);
}
#else
typedef struct {
    float v[TCQ_LANES];
} tcq_vf;
typedef struct {
    int32_t v[TCQ_LANES];
} tcq_vu;
#    define TCQ_MAP(T, expr)                                                                                           \
        T r;                                                                                                           \
        for (int l = 0; l < TCQ_LANES; l++) {                                                                          \
            r.v[l] = (expr);                                                                                           \
        }                                                                                                              \
        return r
static inline tcq_vf tcq_splat(float x) {
    TCQ_MAP(tcq_vf, x);
}
static inline tcq_vf tcq_sq_add(tcq_vf m, tcq_vf y, float t) {
    TCQ_MAP(tcq_vf, m.v[l] + (y.v[l] - t) * (y.v[l] - t));
}
static inline tcq_vu tcq_bits(tcq_vf x) {
    tcq_vu r;
    memcpy(&r, &x, sizeof(r));
    return r;
}
static inline tcq_vf tcq_float(tcq_vu x) {
    tcq_vf r;
    memcpy(&r, &x, sizeof(r));
    return r;
}
static inline tcq_vu tcq_and(tcq_vu a, int32_t b) {
    TCQ_MAP(tcq_vu, a.v[l] & b);
}
static inline tcq_vu tcq_or(tcq_vu a, int32_t b) {
    TCQ_MAP(tcq_vu, a.v[l] | b);
}
static inline tcq_vu tcq_min(tcq_vu a, tcq_vu b) {
    TCQ_MAP(tcq_vu, a.v[l] < b.v[l] ? a.v[l] : b.v[l]);
}
#endif

// Codes q[i * TCQ_LANES + l] of the cheapest path through the trellis for the values
// y[i * TCQ_LANES + l] of lane l's vector. A window s' = (c << (L - B)) | (s >> B) follows
// window s, so its predecessors are the 2^B windows g * 2^B + h that share its low L - B bits
// g: m[g] is the cheapest of them, back[i][g] which h it was.
static void TCQ_VITERBI(const float * y, int64_t d, int bits, const float * T, uint32_t * back, uint8_t * q) {
    const int     G   = 1 << (TCQ_L - bits);
    const int     K   = 1 << bits;
    const int32_t low = K - 1;
    tcq_vu        cost[TCQ_STATES];
    tcq_vf        m[TCQ_STATES >> 2];  // G <= 64
    for (int g = 0; g < G; g++) {
        m[g] = tcq_splat(g == 0 ? 0.0f : TCQ_FAR);  // before the first value the window is all zeros
    }
    for (int64_t i = 0; i < d; i++) {
        if (i > 0) {
            uint32_t * bk = back + (size_t) (i * G) * TCQ_LANES;
            for (int g = 0; g < G; g++) {
                tcq_vu best = cost[g * K];
                for (int h = 1; h < K; h++) {
                    best = tcq_min(best, cost[g * K + h]);
                }
                m[g]           = tcq_float(best);
                const tcq_vu h = tcq_and(best, low);
                memcpy(bk + (size_t) g * TCQ_LANES, &h, sizeof(h));
            }
        }
        tcq_vf yi;
        memcpy(&yi, y + i * TCQ_LANES, sizeof(yi));
        for (int c = 0; c < K; c++) {
            for (int g = 0; g < G; g++) {
                const int s = c * G + g;
                cost[s]     = tcq_or(tcq_and(tcq_bits(tcq_sq_add(m[g], yi, T[s])), ~low), s & low);
            }
        }
    }
    int32_t last[TCQ_STATES][TCQ_LANES];
    memcpy(last, cost, sizeof(last));
    for (int l = 0; l < TCQ_LANES; l++) {
        int s = 0;
        for (int x = 1; x < TCQ_STATES; x++) {
            if (last[x][l] < last[s][l]) {
                s = x;
            }
        }
        for (int64_t i = d - 1; i >= 0; i--) {
            q[i * TCQ_LANES + l] = (uint8_t) (s >> (TCQ_L - bits));
            if (i > 0) {
                const int g = s & (G - 1);
                s           = g * K + (int) back[((size_t) (i * G) + (size_t) g) * TCQ_LANES + l];
            }
        }
    }
}
