// tcq_avx2.c: the tcq encoder's Viterbi search in 8-lane vectors, AVX2 (compiled with -mavx2): the same
// float operations per lane as the plain loops of tcq.c, so the same codes.
#include "kvg_internal.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#    define TCQ_VECTOR_EXT 1
#    define TCQ_VITERBI    tcq_viterbi_avx2
#    include "codecs/tcq_viterbi.h"

int kvg_tcq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    return kvg_tcq_encode_with(job, src, dst, tcq_viterbi_avx2);
}

#else  // not an AVX2 build (or not x86-64): the dispatcher never selects this

int kvg_tcq_encode_avx2(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

#endif
