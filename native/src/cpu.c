// cpu.c: run-time choice of the SIMD kernels. The library is built for baseline x86-64 (or
// any other target); AVX2 kernels are used only when both the build and the CPU have them.
#include "kvg_internal.h"

#include <stdatomic.h>

int kvg_cpu_has_avx2_fma(void) {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    // libgcc/compiler-rt also check (via XGETBV) that the OS saves the YMM registers
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

// -1 until first use; then the level in force. Process-wide, changed only by tests/benchmarks.
static atomic_int g_simd_level = -1;

int kvg_simd_max_level(void) {
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
    if (level != KVG_SIMD_SCALAR && level != KVG_SIMD_AVX2) {
        return kvg_fail(KVG_ERR_INVALID_ARG, "SIMD level must be 0 (scalar) or 1 (avx2), got %d", level);
    }
    if (level > kvg_simd_max_level()) {
        return kvg_fail(KVG_ERR_UNSUPPORTED, "SIMD level %d (avx2) is not supported by this %s", level,
                        kvg_avx2_built() ? "CPU" : "build");
    }
    atomic_store_explicit(&g_simd_level, level, memory_order_relaxed);
    return KVG_OK;
}
