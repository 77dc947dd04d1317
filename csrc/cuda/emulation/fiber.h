// Fibers for the emulated threads that wait in a warp operation or a barrier: mmap'ed stacks with a guard
// page below each, switched only between the scheduler (the launching thread's own stack) and one fiber at
// a time (fiber.cc says how). Switches are annotated for AddressSanitizer, so that a sanitizer build follows
// the stacks. Not thread-safe: the scheduler holds the process-wide launch lock.
#pragma once

#include <cstdint>

namespace pycoll::emulation::detail {

struct Fiber;

// A fiber that will run `entry` from its start when entered (from a pool; entry must never return:
// it ends with finish()).
Fiber* take_fiber(void (*entry)());
// Back to the pool; `abandoned`: it stopped in the middle of its entry (a fault elsewhere), and its stack
// is cleaned when it is next taken.
void give_back(Fiber* f, bool abandoned);

// From the scheduler: runs `f` until it leaves or finishes.
void enter(Fiber* f);
// From fiber `f`: back to the scheduler; returns when the scheduler enters `f` again.
void leave(Fiber* f);
// From a fiber, for good: back to the scheduler, never to return.
[[noreturn]] void finish();
// The first call of every entry function (it completes the switch that started the fiber).
void started();

// Switches made since the process started (both directions).
uint64_t switch_count();

}  // namespace pycoll::emulation::detail
