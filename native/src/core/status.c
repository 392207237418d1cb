// status.c: status codes' strings, the last error's detail (per thread) and the ABI version.
// Every other file calls kvg_fail; this one calls nothing of the library's, so no loop of calls
// runs through it.
#include "core/status.h"
#include "kvgguf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#if defined(_MSC_VER) && !defined(__clang__)
#    define KVG_TLS __declspec(thread)
#else
#    define KVG_TLS _Thread_local
#endif

static KVG_TLS char g_last_error[256];

void kvg_clear_error(void) {
    g_last_error[0] = '\0';
}

int kvg_fail(int status, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
    va_end(ap);
    return status;
}

const char * kvg_last_error(void) {
    return g_last_error;
}

int32_t kvg_abi_version(void) {
    return KVG_ABI_VERSION;
}

const char * kvg_strerror(int status) {
    switch (status) {
        case KVG_OK:                return "success";
        case KVG_ERR_INVALID_ARG:   return "invalid argument";
        case KVG_ERR_UNKNOWN_CODEC: return "unknown codec";
        case KVG_ERR_SHAPE:         return "shape not supported by the codec";
        case KVG_ERR_BUFFER_SIZE:   return "buffer size does not match the shape";
        case KVG_ERR_NONFINITE:     return "input contains NaN or Inf";
        case KVG_ERR_CORRUPT:       return "corrupt encoded data";
        case KVG_ERR_NO_MEMORY:     return "out of memory";
        case KVG_ERR_RANGE:         return "value out of f16 range";
        case KVG_ERR_UNSUPPORTED:   return "SIMD level not supported by this CPU or build";
        default:                    return "unknown status";
    }
}
