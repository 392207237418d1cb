// status.h: the error detail every file of the library records (core/status.c).
#pragma once

// Records a detail message for kvg_last_error() and returns status.
int kvg_fail(int status, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void kvg_clear_error(void);  // every public entry point starts with this
