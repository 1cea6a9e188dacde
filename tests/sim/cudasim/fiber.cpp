// fiber.cpp: user-space context switch and pooled fiber stacks for the CUDA
// threads of the sim (see fiber.h). A switch saves rbx, rbp, r12-r15, MXCSR
// and the x87 control word on the old stack and restores them from the new
// one (System V AMD64 ABI: the callee-saved state), no system call.
#include "fiber.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "cudasim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#endif

#if !defined(__x86_64__)
#error "cudasim: the fiber context switch is written for x86-64"
#endif

extern "C" void cudasim_switch_stack(void **save_sp, void *new_sp);
extern "C" void cudasim_fiber_trampoline();

// cudasim_switch_stack(save_sp = rdi, new_sp = rsi); a new fiber's first
// switch "returns" into cudasim_fiber_trampoline with entry in r13, arg in r12.
asm(R"(
    .text
    .globl cudasim_switch_stack
    .type cudasim_switch_stack, @function
cudasim_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch_stack, .-cudasim_switch_stack

    .globl cudasim_fiber_trampoline
    .type cudasim_fiber_trampoline, @function
cudasim_fiber_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cudasim_fiber_trampoline, .-cudasim_fiber_trampoline
)");

namespace cudasim {

// Kernels keep a few KiB of registers-as-arrays; sanitizer builds need more.
#ifdef CUDASIM_ASAN
static const size_t STACK_BYTES = 512 * 1024;
#else
static const size_t STACK_BYTES = 128 * 1024;
#endif

static thread_local std::vector<char *> stack_pool;

static char *stack_take() {
    if (!stack_pool.empty()) {
        char *s = stack_pool.back();
        stack_pool.pop_back();
        return s;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *base = (char *)mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fail("out of memory for a fiber stack of %zu bytes", STACK_BYTES);
    if (mprotect(base, page, PROT_NONE) != 0) fail("mprotect of a fiber stack's guard page failed");
    return base + page;
}

void fiber_start(Fiber *f, void (*entry)(void *), void *arg) {
    f->stack = stack_take();
    f->stack_bytes = STACK_BYTES;
    f->asan_fake_stack = nullptr;
    uint64_t *top = (uint64_t *)(f->stack + STACK_BYTES);   // 16-byte aligned
    // Frame popped by cudasim_switch_stack: csr, r15, r14, r13, r12, rbx, rbp, return address;
    // after the ret rsp = top - 2 words (16-byte aligned, as a call site leaves it).
    uint64_t *sp = top - 10;
    uint32_t csr[2];
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
    sp[0] = (uint64_t)csr[0] | ((uint64_t)(csr[1] & 0xffff) << 32);
    sp[1] = 0;                         // r15
    sp[2] = 0;                         // r14
    sp[3] = (uint64_t)entry;           // r13
    sp[4] = (uint64_t)arg;             // r12
    sp[5] = 0;                         // rbx
    sp[6] = 0;                         // rbp
    sp[7] = (uint64_t)&cudasim_fiber_trampoline;
    f->sp = sp;
}

// Only AddressSanitizer needs the OS thread's stack bounds (read once per thread).
void fiber_init_thread(Fiber *self) {
    self->asan_fake_stack = nullptr;
#ifdef CUDASIM_ASAN
    static thread_local char *stack = nullptr;
    static thread_local size_t bytes = 0;
    if (!stack) {
        pthread_attr_t attr;
        void *addr;
        if (pthread_getattr_np(pthread_self(), &attr) != 0 || pthread_attr_getstack(&attr, &addr, &bytes) != 0)
            fail("cannot read the stack bounds of an OS thread");
        pthread_attr_destroy(&attr);
        stack = (char *)addr;
    }
    self->stack = stack;
    self->stack_bytes = bytes;
#endif
}

void fiber_entered() {
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

void fiber_release(Fiber *f) {
    if (f->stack) stack_pool.push_back(f->stack);
    f->stack = nullptr;
}

void fiber_switch(Fiber *from, Fiber *to, bool from_exits) {
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(from_exits ? nullptr : &from->asan_fake_stack, to->stack, to->stack_bytes);
#else
    (void)from_exits;
#endif
    cudasim_switch_stack(&from->sp, to->sp);
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake_stack, nullptr, nullptr);
#endif
}

}  // namespace cudasim
