// cpu.c: run-time choice of the SIMD kernels. The library is built for baseline x86-64 (or
// any other target); AVX2 kernels are used only when both the build and the CPU have them.
// On AArch64 the NEON kernels need no check: Advanced SIMD is part of the base ISA.
#include "kvg_internal.h"

#include <stdatomic.h>
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#    include <cpuid.h>
#endif

int kvg_cpu_has_avx2_fma(void) {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    // F16C from CPUID itself: older clang (14) does not know __builtin_cpu_supports("f16c").
    unsigned  a, b, c, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    // libgcc/compiler-rt also check (via XGETBV) that the OS saves the YMM registers
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return 0;
#endif
}

// -1 until first use; then the level in force. Process-wide, changed only by tests/benchmarks.
static atomic_int g_simd_level = -1;

int kvg_simd_max_level(void) {
    if (kvg_neon_built()) {
        return KVG_SIMD_NEON;
    }
    return (kvg_avx2_built() && kvg_cpu_has_avx2_fma()) ? KVG_SIMD_AVX2 : KVG_SIMD_SCALAR;
}

int kvg_simd_level(void) {
    int level = atomic_load_explicit(&g_simd_level, memory_order_relaxed);
    if (level < 0) {
        int expected = -1;
        level        = kvg_simd_max_level();
        if (!atomic_compare_exchange_strong(&g_simd_level, &expected, level)) {
            level = expected;  // another thread (or kvg_set_simd_level) got there first
        }
    }
    return level;
}

int kvg_set_simd_level(int level) {
    kvg_clear_error();
    if (level != KVG_SIMD_SCALAR && level != KVG_SIMD_AVX2 && level != KVG_SIMD_NEON) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "SIMD level must be 0 (scalar), 1 (avx2) or 2 (neon), got %d", level);
    }
    // The levels are not ordered: a build has one set of kernels (KVG_SIMD), usable or not.
    const int best = kvg_simd_max_level();
    if (level != KVG_SIMD_SCALAR && level != best) {
        const char * name = level == KVG_SIMD_AVX2 ? "avx2" : "neon";
        const char * why  = level == KVG_SIMD_AVX2 && kvg_avx2_built() ? "this CPU lacks AVX2, FMA or F16C"
                            : level == KVG_SIMD_AVX2 ? "this build has no AVX2 kernels (x86-64 only)"
                                                     : "this build has no NEON kernels (AArch64 only)";
        return kvg_fail(KVG_ERR_UNSUPPORTED, "SIMD level %d (%s) is not supported: %s; this machine's best is %d",
                        level, name, why, best);
    }
    atomic_store_explicit(&g_simd_level, level, memory_order_relaxed);
    return KVG_OK;
}
