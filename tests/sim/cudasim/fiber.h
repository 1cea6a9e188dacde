// fiber.h: the sim's user-space threads (fiber.cpp): a pooled stack with a
// guard page and a context switch of our own (x86-64: callee-saved registers,
// MXCSR and the x87 control word), with AddressSanitizer told about each switch.
#ifndef CUDASIM_FIBER_H
#define CUDASIM_FIBER_H

#include <stddef.h>

namespace cudasim {

struct Fiber {
    void *sp = nullptr;          // saved stack pointer while switched out
    char *stack = nullptr;       // usable stack [stack, stack + stack_bytes), guard page below
    size_t stack_bytes = 0;
    void *asan_fake_stack = nullptr;
};

// The OS thread's own context (the scheduler's), before the first switch.
void fiber_init_thread(Fiber *self);
// First call of every fiber entry function (AddressSanitizer's end of the switch into it).
void fiber_entered();
// Prepare `f` (taking a pooled stack) to run entry(arg) at its first switch_to.
void fiber_start(Fiber *f, void (*entry)(void *), void *arg);
// Give `f`'s stack back to this OS thread's pool (after its entry has ended).
void fiber_release(Fiber *f);
// Switch from `from` (the caller's context is saved there) to `to`. When
// `from_exits`, the caller never resumes (its AddressSanitizer fake stack is dropped).
void fiber_switch(Fiber *from, Fiber *to, bool from_exits);

}  // namespace cudasim

#endif
