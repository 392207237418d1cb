// scratch.c: per-thread float scratch that is freed when its thread ends.
//
// The store's readers run on llama.cpp's worker threads; a context's threadpool ends with the
// context, so scratch held in plain _Thread_local pointers would leak once per context made
// (a long-running server makes many). A pthread key's destructor frees it instead.

#include "kvg_internal.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct kvg_scratch {
    float * p;
    size_t  cap;
} kvg_scratch;

static pthread_key_t  g_keys[KVG_SCRATCH_SLOTS];
static pthread_once_t g_once   = PTHREAD_ONCE_INIT;
static int            g_key_ok = 0;

static void scratch_free(void * v) {
    kvg_scratch * s = (kvg_scratch *) v;
    free(s->p);
    free(s);
}

static void make_keys(void) {
    for (int i = 0; i < KVG_SCRATCH_SLOTS; ++i) {
        if (pthread_key_create(&g_keys[i], scratch_free) != 0) {
            return;  // g_key_ok stays 0: every request fails as out of memory
        }
    }
    g_key_ok = 1;
}

float * kvg_thread_scratch(int slot, size_t n_floats) {
    pthread_once(&g_once, make_keys);
    if (!g_key_ok || slot < 0 || slot >= KVG_SCRATCH_SLOTS || n_floats > SIZE_MAX / sizeof(float)) {
        return NULL;
    }
    kvg_scratch * s = (kvg_scratch *) pthread_getspecific(g_keys[slot]);
    if (!s) {
        s = (kvg_scratch *) calloc(1, sizeof(kvg_scratch));
        if (!s || pthread_setspecific(g_keys[slot], s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n_floats > s->cap) {
        float * p = (float *) realloc(s->p, n_floats * sizeof(float));
        if (!p) {
            return NULL;
        }
        s->p   = p;
        s->cap = n_floats;
    }
    return s->p;
}
