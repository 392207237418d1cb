// tcq_neon.c: the tcq encoder's Viterbi search in 8-lane vectors, NEON (AArch64's base ISA): the same
// float operations per lane as the plain loops of tcq.c, so the same codes.
#include "kvg_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

#    define TCQ_VECTOR_EXT 1
#    define TCQ_VITERBI    tcq_viterbi_neon
#    include "codecs/tcq_viterbi.h"

int kvg_tcq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    return kvg_tcq_encode_with(job, src, dst, tcq_viterbi_neon);
}

#else  // not an AArch64 build: the dispatcher never selects this

int kvg_tcq_encode_neon(const kvg_job * job, const float * src, uint8_t * dst) {
    (void) job;
    (void) src;
    (void) dst;
    return KVG_NOT_HANDLED;
}

#endif
