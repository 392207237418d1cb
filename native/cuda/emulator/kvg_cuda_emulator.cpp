// kvg_cuda_emulator.cpp: the CUDA emulator's runtime (kvg_cuda_emulator.h says what it is for).
//
// A block's threads are fibers (a hand-written stack switch on x86-64, which AddressSanitizer's
// swapcontext interceptor would slow a hundredfold; ucontext elsewhere). The scheduler runs every runnable fiber until its next
// barrier, then releases a warp whose live lanes all wait at a warp barrier, and the block when all
// its live threads wait at __syncthreads. Nothing left runnable and nothing released is a deadlock:
// the launch fails (cudaErrorLaunchFailure, sticky, a message on stderr) instead of hanging.
#include "kvg_cuda_emulator.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#include <map>
#include <mutex>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#    define KVG_EMU_ASAN 1
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define KVG_EMU_ASAN 1
#    endif
#endif
#ifdef KVG_EMU_ASAN
#    include <sanitizer/asan_interface.h>
#    include <sanitizer/common_interface_defs.h>
#endif

// ---- fibers ----------------------------------------------------------------------------------

#if defined(__x86_64__) && defined(__linux__)
// kvg_emu_switch(&save_sp, next_sp): the callee-saved registers onto this stack, its pointer into
// save_sp, then the same popped from next_sp's stack. (MXCSR and the x87 control word are the
// same for every fiber: nothing in a kernel changes them.)
extern "C" void kvg_emu_switch(void ** save_sp, void * next_sp);
__asm__(".text\n"
        ".globl kvg_emu_switch\n"
        ".type kvg_emu_switch,@function\n"
        "kvg_emu_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size kvg_emu_switch, .-kvg_emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");

struct fiber_ctx {
    void * sp;
};
static void fiber_switch(fiber_ctx * from, fiber_ctx * to) {
    kvg_emu_switch(&from->sp, to->sp);
}
// A new fiber's stack as kvg_emu_switch leaves one: six registers, then the return address
// (entry), entered with the stack aligned as after a call.
static void fiber_make(fiber_ctx * c, void * stack, size_t bytes, void (*entry)()) {
    uintptr_t  top = ((uintptr_t) stack + bytes) & ~(uintptr_t) 15;
    uint64_t * sp  = (uint64_t *) top;
    *--sp          = 0;                 // padding: entry sees rsp = 8 (mod 16)
    *--sp          = (uint64_t) entry;  // where ret goes
    for (int i = 0; i < 6; i++) {
        *--sp = 0;  // rbp, rbx, r12-r15
    }
    c->sp = sp;
}
#else
struct fiber_ctx {
    ucontext_t uc;
};
static void fiber_switch(fiber_ctx * from, fiber_ctx * to) {
    swapcontext(&from->uc, &to->uc);
}
static void fiber_make(fiber_ctx * c, void * stack, size_t bytes, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp   = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link          = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

namespace kvg_emu {

enum fiber_state { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };

struct thread_state {
    fiber_ctx   ctx;
    void *      stack;
    uint3       tid;
    int         lane, warp;
    fiber_state state;
    void *      fake_stack;  // AddressSanitizer's, across a switch
    unsigned    wmma_calls;  // this lane's WMMA loads and products so far
};

thread_state * g_current;
uint3          g_block_idx;
dim3           g_block_dim, g_grid_dim;

namespace {

const size_t k_stack_bytes = (size_t) 1 << 19;  // AddressSanitizer's frames are large

struct warp_slots {
    uint64_t v[2][32];  // a shuffle's values, by the parity of the warp's shuffles
    unsigned parity[32];
    unsigned mma_done;  // WMMA calls whose result is in tile (1 + the call's index)
    float    tile[16][16];
};

struct emulator {
    // the block being run
    std::vector<thread_state> threads;
    std::vector<warp_slots>   warps;
    fiber_ctx                 sched;
    std::vector<unsigned>     order;     // the threads in the order a pass runs them
    size_t                    pass_pos;  // the pass's position in order
    const void *              sched_stack_bottom = nullptr;
    size_t                    sched_stack_size   = 0;
    pthread_t                 sched_thread{};  // whose stack that is: the thread launching
    block_body                body    = nullptr;
    void *                    closure = nullptr;
    unsigned char *           smem    = nullptr;
    const char *              failure = nullptr;  // set by a thread: the block is abandoned
    std::vector<void *>       stacks;             // reused across blocks
    bool                      reverse = false;

    // the device
    std::mutex                  mu;
    std::map<uintptr_t, size_t> allocations;  // device memory: base -> bytes
    std::set<uintptr_t>         pinned;
    std::set<const void *>      streams;
    std::map<const void *, int> smem_optin;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
    size_t                      used     = 0;
    cudaError_t                 sticky   = cudaSuccess;
    int                         device   = 0;
    int                         sms      = 4;
    int                         cc_major = 9;
};

// KVG_EMU_ORDER=reverse, KVG_EMU_SMS (multiprocessors), KVG_EMU_CC (compute capability, e.g. 75).
emulator * make_emulator() {
    emulator *   x = new emulator;
    const char * r = getenv("KVG_EMU_ORDER");
    x->reverse     = r && !strcmp(r, "reverse");
    const char * s = getenv("KVG_EMU_SMS");
    if (s && atoi(s) > 0) {
        x->sms = atoi(s);
    }
    const char * c = getenv("KVG_EMU_CC");
    if (c && atoi(c) > 0) {
        x->cc_major = atoi(c) / 10;
    }
    return x;
}
emulator * const  g_emu = make_emulator();
inline emulator & emu() {
    return *g_emu;
}

const size_t k_device_bytes = (size_t) 16 << 30;  // what the emulated device says it has
const size_t k_smem_default = 48 << 10, k_smem_optin = 227 << 10;

void fail_block(const char * why) {
    emulator & e = emu();
    if (!e.failure) {
        e.failure = why;
    }
}

// AddressSanitizer is told of every switch: which stack comes next, and (with fake_save null) that a
// finished fiber's frames are gone.
void switch_to(fiber_ctx * from, void ** fake_save, fiber_ctx * to, const void * to_stack, size_t to_bytes) {
#ifdef KVG_EMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, to_stack, to_bytes);
#else
    (void) fake_save;
    (void) to_stack;
    (void) to_bytes;
#endif
    fiber_switch(from, to);
}
void switched_in(void * fake) {
#ifdef KVG_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void) fake;
#endif
}

// From the running fiber to the next runnable one of this pass, or back to the scheduler when the
// pass is over (or the block failed): one switch per barrier a thread meets.
void yield_to_scheduler() {
    emulator &     e    = emu();
    thread_state * t    = g_current;
    void **        save = t->state == DONE ? nullptr : &t->fake_stack;
    for (size_t k = e.pass_pos + 1; k < e.order.size() && !e.failure; k++) {
        thread_state & next = e.threads[e.order[k]];
        if (next.state == RUNNABLE) {
            e.pass_pos = k;
            g_current  = &next;
            switch_to(&t->ctx, save, &next.ctx, next.stack, k_stack_bytes);
            switched_in(t->fake_stack);
            return;
        }
    }
    e.pass_pos = e.order.size();
    switch_to(&t->ctx, save, &e.sched, e.sched_stack_bottom, e.sched_stack_size);
    switched_in(t->fake_stack);
}

void fiber_entry() {
    emulator & e = emu();
    switched_in(nullptr);
    e.body(e.closure);
    g_current->state = DONE;
    yield_to_scheduler();  // never resumed
    abort();
}

// One pass: every runnable thread, in order, until its next barrier. False if none was runnable.
bool run_pass() {
    emulator & e = emu();
    for (size_t k = 0; k < e.order.size(); k++) {
        thread_state & t = e.threads[e.order[k]];
        if (t.state == RUNNABLE) {
            e.pass_pos  = k;
            g_current   = &t;
            void * fake = nullptr;
            switch_to(&e.sched, &fake, &t.ctx, t.stack, k_stack_bytes);
            switched_in(fake);
            g_current = nullptr;
            return true;
        }
    }
    return false;
}

void * stack_at(size_t i) {
    emulator & e = emu();
    while (e.stacks.size() <= i) {
        void * p = mmap(nullptr, k_stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return nullptr;
        }
        e.stacks.push_back(p);
    }
    return e.stacks[i];
}

// Runs one block; returns null or why it failed.
const char * run_block(size_t smem) {
    emulator &     e = emu();
    const unsigned n = g_block_dim.x * g_block_dim.y * g_block_dim.z;
    e.failure        = nullptr;
    e.threads.assign(n, thread_state{});
    e.warps.assign((n + 31) / 32, warp_slots{});
    void * sm = nullptr;
    if (posix_memalign(&sm, 128, smem ? smem : 1) != 0) {
        return "out of host memory for the block's shared memory";
    }
    e.smem = (unsigned char *) sm;
    memset(e.smem, 0xff, smem ? smem : 1);
    for (unsigned i = 0; i < n; i++) {
        thread_state & t = e.threads[i];
        t.tid   = uint3{ i % g_block_dim.x, (i / g_block_dim.x) % g_block_dim.y, i / (g_block_dim.x * g_block_dim.y) };
        t.lane  = (int) (i % 32);
        t.warp  = (int) (i / 32);
        t.state = RUNNABLE;
        t.stack = stack_at(i);
        if (!t.stack) {
            free(e.smem);
            return "out of host memory for the threads' stacks";
        }
        fiber_make(&t.ctx, t.stack, k_stack_bytes, fiber_entry);
    }
    e.order.resize(n);  // reverse: the lanes of each warp last to first, the warps in order
    for (unsigned i = 0; i < n; i++) {
        const unsigned w0 = i / 32 * 32, w1 = w0 + 32 < n ? w0 + 32 : n;
        e.order[i] = e.reverse ? w0 + (w1 - 1 - i) : i;
    }
    const char * why = nullptr;
    for (;;) {
        const bool ran = run_pass();
        if (e.failure) {
            why = e.failure;
            break;
        }
        bool released = false, all_done = true, all_at_block = true;
        for (size_t w = 0; w < e.warps.size(); w++) {
            int live = 0, at_warp = 0, done = 0;
            for (unsigned i = (unsigned) w * 32; i < n && i < (unsigned) w * 32 + 32; i++) {
                const fiber_state s = e.threads[i].state;
                live += s != DONE;
                done += s == DONE;
                at_warp += s == WAIT_WARP;
            }
            if (at_warp > 0 && done > 0) {
                why = "a warp operation (__syncwarp, a shuffle, WMMA) after some of the warp's lanes returned";
                break;
            }
            if (live > 0 && at_warp == live) {
                for (unsigned i = (unsigned) w * 32; i < n && i < (unsigned) w * 32 + 32; i++) {
                    e.threads[i].state = RUNNABLE;
                }
                released = true;
            }
        }
        if (why) {
            break;
        }
        int live = 0;
        for (unsigned i = 0; i < n; i++) {
            const fiber_state s = e.threads[i].state;
            all_done            = all_done && s == DONE;
            all_at_block        = all_at_block && (s == DONE || s == WAIT_BLOCK);
            live += s != DONE;
        }
        if (all_done) {
            break;
        }
        if (!released && live > 0 && all_at_block) {
            for (unsigned i = 0; i < n; i++) {
                if (e.threads[i].state == WAIT_BLOCK) {
                    e.threads[i].state = RUNNABLE;
                }
            }
            released = true;
        }
        if (!ran && !released) {
            why = "a deadlock: threads wait at barriers that the rest of the block or warp never reaches";
            break;
        }
    }
    free(e.smem);
    e.smem = nullptr;
#ifdef KVG_EMU_ASAN
    if (why) {  // an abandoned block's frames stay poisoned (a finished fiber's are cleaned up)
        for (void * st : e.stacks) {
            __asan_unpoison_memory_region(st, k_stack_bytes);
        }
    }
#endif
    return why;  // an abandoned block's fibers are dropped with their stacks reused
}

bool is_device(const void * p, size_t n, bool * inside) {
    emulator &      e  = emu();
    const uintptr_t a  = (uintptr_t) p;
    auto            it = e.allocations.upper_bound(a);
    if (it == e.allocations.begin()) {
        *inside = false;
        return false;
    }
    --it;
    if (a >= it->first + it->second + (it->second == 0)) {
        *inside = false;
        return false;
    }
    *inside = a + n <= it->first + it->second;
    return true;
}

}  // namespace

uint3 thread_idx() {
    return g_current->tid;
}

void * dynamic_smem() {
    return emu().smem;
}

void sync_block() {
    g_current->state = WAIT_BLOCK;
    yield_to_scheduler();
}

void sync_warp(unsigned mask) {
    if (mask != 0xffffffffu) {
        fail_block("a warp operation on part of a warp (the emulator takes full masks only)");
    }
    g_current->state = WAIT_WARP;
    yield_to_scheduler();
}

uint64_t shuffle(unsigned mask, uint64_t v, int src, int width, int kind) {
    emulator &     e = emu();
    thread_state * t = g_current;
    if (width <= 0 || width > 32 || (width & (width - 1))) {
        fail_block("a shuffle's width must be a power of two up to 32");
    }
    // Two sets of slots, alternating: a lane can write the next shuffle's value only after every lane
    // has reached it, so after every lane has read this one's.
    warp_slots &   w   = e.warps[t->warp];
    const unsigned par = w.parity[t->lane]++ & 1u;
    w.v[par][t->lane]  = v;
    sync_warp(mask);
    const int base = t->lane & ~(width - 1);
    int       from = kind == 1 ? t->lane ^ src : base + (src & (width - 1));
    if (kind == 1 && (from & ~(width - 1)) != base) {
        from = t->lane;  // outside the lane's segment: its own value
    }
    return w.v[par][from];
}

void wmma_enter() {
    sync_warp(0xffffffffu);
}

// The warp's first lane at a WMMA load or product computes the tile; the others copy it.
static bool wmma_first(float ** tile) {
    sync_warp(0xffffffffu);
    thread_state * t    = g_current;
    warp_slots &   w    = emu().warps[t->warp];
    const unsigned call = ++t->wmma_calls;
    *tile               = &w.tile[0][0];
    if (w.mma_done == call) {
        return false;
    }
    w.mma_done = call;  // every lane is past its previous call: the tile is free
    return true;
}

void wmma_load(float * dst, const void * p, unsigned ldm, bool is_half, bool col) {
    float * tile;
    if (wmma_first(&tile)) {
        for (int r = 0; r < 16; r++) {
            for (int c = 0; c < 16; c++) {
                const size_t i   = col ? (size_t) c * ldm + r : (size_t) r * ldm + c;
                tile[r * 16 + c] = is_half ? f16_to_f32(((const uint16_t *) p)[i]) : ((const float *) p)[i];
            }
        }
    }
    memcpy(dst, tile, 256 * sizeof(float));
}

void wmma_mma(float * d, const float * a, const float * b, const float * c) {
    float * tile;
    if (wmma_first(&tile)) {
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 16; j++) {
                float s = c[i * 16 + j];
                for (int k = 0; k < 16; k++) {
                    s += a[i * 16 + k] * b[k * 16 + j];
                }
                tile[i * 16 + j] = s;
            }
        }
    }
    memcpy(d, tile, 256 * sizeof(float));
}

uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t ax   = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint16_t) (sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) {  // rounds to beyond 65504
        return (uint16_t) (sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {  // below the smallest normal f16: a subnormal or zero
        if (ax < 0x33000000u) {
            return sign;
        }
        const uint32_t m     = (ax & 0x7fffffu) | 0x800000u;
        const int      shift = 126 - (int) (ax >> 23);  // 14 .. 24
        const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        return (uint16_t) (sign | (q + (rem > half || (rem == half && (q & 1u)))));
    }
    const uint32_t q = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    return (uint16_t) (sign | (q + (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))));
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t       x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else {
        float f = (float) m * (1.0f / 16777216.0f);  // m * 2^-24, exact
        memcpy(&x, &f, 4);
        x |= sign;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

cudaError_t func_set_attribute(const void * fn, cudaFuncAttribute a, int value) {
    emulator &                  e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t) value > k_smem_optin) {
        return cudaErrorInvalidValue;
    }
    e.smem_optin[fn] = value;
    return cudaSuccess;
}

void launch(const launch_config & c, const void * fn, block_body body, void * closure) {
    emulator &                  e = emu();
    std::lock_guard<std::mutex> g(e.mu);  // one launch at a time, whichever thread queues it
    const unsigned long long    threads = (unsigned long long) c.block.x * c.block.y * c.block.z;
    cudaError_t                 err     = cudaSuccess;
    if (threads == 0 || threads > 1024 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64 || c.grid.x == 0 ||
        c.grid.y == 0 || c.grid.z == 0 || c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535) {
        err = cudaErrorInvalidConfiguration;
    } else if (c.stream && !e.streams.count(c.stream)) {
        err = cudaErrorInvalidResourceHandle;
    } else {
        auto         it = e.smem_optin.find(fn);
        const size_t limit =
            it != e.smem_optin.end() && (size_t) it->second > k_smem_default ? (size_t) it->second : k_smem_default;
        if (c.smem > limit) {
            err = cudaErrorInvalidValue;
        }
    }
    if (err != cudaSuccess) {
        if (e.sticky == cudaSuccess) {
            e.sticky = err;
        }
        return;
    }
    if (!e.sched_stack_bottom || !pthread_equal(e.sched_thread, pthread_self())) {  // for AddressSanitizer
        e.sched_thread = pthread_self();
        pthread_attr_t a;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            void * lo = nullptr;
            size_t sz = 0;
            pthread_attr_getstack(&a, &lo, &sz);
            e.sched_stack_bottom = lo;
            e.sched_stack_size   = sz;
            pthread_attr_destroy(&a);
        }
    }
    g_grid_dim  = c.grid;
    g_block_dim = c.block;
    e.body      = body;
    e.closure   = closure;
    for (unsigned z = 0; z < c.grid.z; z++) {
        for (unsigned y = 0; y < c.grid.y; y++) {
            for (unsigned x = 0; x < c.grid.x; x++) {
                g_block_idx      = uint3{ x, y, z };
                const char * why = run_block(c.smem);
                if (why) {
                    fprintf(stderr, "kvg_cuda_emulator: %s failed in block (%u, %u, %u): %s\n", c.name, x, y, z, why);
                    if (e.sticky == cudaSuccess) {
                        e.sticky = cudaErrorLaunchFailure;
                    }
                    return;
                }
            }
        }
    }
}

}  // namespace kvg_emu

using kvg_emu::emu;

// ---- the runtime API -------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int * n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int * d) {
    *d = emu().device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d != 0) {
        return cudaErrorInvalidDevice;
    }
    emu().device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp * p, int d) {
    if (d != 0) {
        return cudaErrorInvalidDevice;
    }
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "kvgguf's CUDA emulator (the CPU, no GPU)");
    p->major                  = emu().cc_major;
    p->multiProcessorCount    = emu().sms;
    p->totalGlobalMem         = kvg_emu::k_device_bytes;
    p->sharedMemPerBlock      = kvg_emu::k_smem_default;
    p->sharedMemPerBlockOptin = kvg_emu::k_smem_optin;
    p->warpSize               = 32;
    p->maxThreadsPerBlock     = 1024;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int * v, cudaDeviceAttr a, int d) {
    if (d != 0) {
        return cudaErrorInvalidDevice;
    }
    switch (a) {
        case cudaDevAttrMultiProcessorCount:          *v = emu().sms; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor:       *v = emu().cc_major; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor:       *v = 0; return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int) kvg_emu::k_smem_optin; return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}
cudaError_t cudaDriverGetVersion(int * v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int * v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    return emu().sticky;
}
cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::mutex> g(emu().mu);
    const cudaError_t           e = emu().sticky;
    emu().sticky                  = cudaSuccess;  // a failed kernel too: the checks after it still run
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    return emu().sticky;
}
const char * cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess:                     return "cudaSuccess";
        case cudaErrorInvalidValue:           return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation:       return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration:   return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevicePointer:   return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorInsufficientDriver:     return "cudaErrorInsufficientDriver";
        case cudaErrorNoDevice:               return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice:          return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle:  return "cudaErrorInvalidResourceHandle";
        case cudaErrorLaunchFailure:          return "cudaErrorLaunchFailure";
        case cudaErrorNotSupported:           return "cudaErrorNotSupported";
    }
    return "cudaErrorUnknown";
}
const char * cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:               return "no error";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorLaunchFailure:    return "unspecified launch failure (the emulator printed why)";
        default:                        return cudaGetErrorName(e);
    }
}

cudaError_t cudaMalloc(void ** p, size_t n) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    *p = nullptr;
    if (n == 0) {
        return cudaSuccess;
    }
    if (n > kvg_emu::k_device_bytes - e.used) {
        return cudaErrorMemoryAllocation;
    }
    void * q = nullptr;
    if (posix_memalign(&q, 256, n) != 0) {
        return cudaErrorMemoryAllocation;
    }
    memset(q, 0xa5, n);  // device memory starts as garbage, not zeros
    e.allocations[(uintptr_t) q] = n;
    e.used += n;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void * p) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (!p) {
        return cudaSuccess;
    }
    auto it = e.allocations.find((uintptr_t) p);
    if (it == e.allocations.end()) {
        return cudaErrorInvalidDevicePointer;
    }
    e.used -= it->second;
    e.allocations.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void ** p, size_t n) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    *p = malloc(n ? n : 1);
    if (!*p) {
        return cudaErrorMemoryAllocation;
    }
    e.pinned.insert((uintptr_t) *p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void * p) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (!p) {
        return cudaSuccess;
    }
    if (!e.pinned.erase((uintptr_t) p)) {
        return cudaErrorInvalidValue;
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t * free_bytes, size_t * total_bytes) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    *free_bytes  = kvg_emu::k_device_bytes - e.used;
    *total_bytes = kvg_emu::k_device_bytes;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (s && !e.streams.count(s)) {
        return cudaErrorInvalidResourceHandle;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    bool       dst_in = false, src_in = false;
    const bool dst_dev = kvg_emu::is_device(dst, n, &dst_in), src_dev = kvg_emu::is_device(src, n, &src_in);
    if ((dst_dev && !dst_in) || (src_dev && !src_in)) {
        return cudaErrorInvalidValue;  // runs past the end of a device allocation
    }
    const bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dst_dev != want_dst || src_dev != want_src)) {
        return cudaErrorInvalidValue;  // the pointers do not match the direction asked for
    }
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void * dst, const void * src, size_t n, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void * dst, int value, size_t n, cudaStream_t s) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    bool                        in = false;
    if ((s && !e.streams.count(s)) || (n && (!kvg_emu::is_device(dst, n, &in) || !in))) {
        return cudaErrorInvalidValue;
    }
    memset(dst, value, n);
    return cudaSuccess;
}

struct kvg_emu_stream {
    unsigned flags;
};
struct kvg_emu_event {
    double ms;
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t * s, unsigned flags) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    *s = new kvg_emu_stream{ flags };
    e.streams.insert(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t * s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (!e.streams.erase(s)) {
        return cudaErrorInvalidResourceHandle;
    }
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    kvg_emu::emulator &         e = emu();
    std::lock_guard<std::mutex> g(e.mu);
    if (s && !e.streams.count(s)) {
        return cudaErrorInvalidResourceHandle;
    }
    return e.sticky;  // the work ran when it was queued
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus * status) {
    (void) s;
    *status = cudaStreamCaptureStatusNone;  // no graphs in the emulator
    return cudaSuccess;
}

static double kvg_emu_now_ms() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
cudaError_t cudaEventCreate(cudaEvent_t * ev) {
    *ev = new kvg_emu_event{ 0.0 };
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    delete ev;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
    (void) s;
    ev->ms = kvg_emu_now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    (void) ev;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float * ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float) (b->ms - a->ms);
    return cudaSuccess;
}
