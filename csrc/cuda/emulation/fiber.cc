// Fibers of the emulation (fiber.h). A fiber is started once with makecontext / setcontext (a switch to a
// fresh stack); after that every switch is _setjmp / _longjmp, which, unlike swapcontext, saves no signal
// mask and so makes no system call (60-85 ns a switch here with the scheduler's bookkeeping, where
// swapcontext alone took 325). _FORTIFY_SOURCE's __longjmp_chk refuses a jump to another stack, so it is
// off in this file.
//
// AddressSanitizer needs to be told of every switch between stacks:
// __sanitizer_start_switch_fiber before it (with the bounds of the stack being entered, and where to keep
// the fake stack of the one being left; none for a fiber that finishes), __sanitizer_finish_switch_fiber
// after it, on the new stack (which also tells the bounds of the stack just left: that is how the fibers
// learn the scheduler's). Without a sanitizer both are nothing.
#undef _FORTIFY_SOURCE
#include "cuda/emulation/fiber.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define PYCOLL_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PYCOLL_EMULATION_ASAN 1
#endif
#endif
#if PYCOLL_EMULATION_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace pycoll::emulation::detail {

// Kernel frames are small; a sanitizer build's are larger, and pages are only committed when touched.
constexpr size_t kStackBytes = 512 * 1024;

struct Fiber {
  ucontext_t start;  // where it begins (makecontext)
  jmp_buf where;     // where it stands when switched out
  bool fresh = true;
  char* stack = nullptr;  // lowest usable address; the guard page lies just below
  size_t size = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's fake stack while the fiber is switched out
  bool abandoned = false;      // given back in the middle of its entry
};

namespace {

struct Scheduler {
  jmp_buf where;
  const void* bottom = nullptr;  // its stack, as AddressSanitizer reported it
  size_t size = 0;
  void* fake_stack = nullptr;
};
Scheduler sched;
// Never destroyed: the fibers stay reachable to the end (a leak checker runs after static destructors).
std::vector<Fiber*>& pool = *new std::vector<Fiber*>;
uint64_t switches = 0;

// getcontext / setcontext fail only on a corrupted context: nothing to report it to (the failing switch
// is between stacks), so the process ends.
[[noreturn]] void corrupted() {
  std::abort();
}

void start_switch(void** fake_stack_save, const void* bottom, size_t size) {
#if PYCOLL_EMULATION_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_stack, const void** bottom_old, size_t* size_old) {
#if PYCOLL_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#else
  (void)fake_stack, (void)bottom_old, (void)size_old;
#endif
}

Fiber* new_fiber() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* base =
      mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  if (mprotect(base, page, PROT_NONE) != 0) {
    munmap(base, kStackBytes + page);
    throw std::bad_alloc();
  }
  Fiber* f = new Fiber;
  f->stack = static_cast<char*>(base) + page;
  f->size = kStackBytes;
  return f;
}

}  // namespace

namespace {

// getcontext returns twice in principle (not here: this context is only ever the start of makecontext),
// so it gets a frame of its own with nothing live across it.
void reset(Fiber* f, void (*entry)()) {
  if (getcontext(&f->start) != 0) corrupted();
  f->start.uc_stack.ss_sp = f->stack;
  f->start.uc_stack.ss_size = f->size;
  f->start.uc_link = nullptr;
  makecontext(&f->start, entry, 0);
}

Fiber* pooled() {
  if (pool.empty()) return new_fiber();
  Fiber* f = pool.back();
  pool.pop_back();
  return f;
}

}  // namespace

Fiber* take_fiber(void (*entry)()) {
  Fiber* f = pooled();
#if PYCOLL_EMULATION_ASAN
  // An abandoned fiber keeps the poisoned redzones of the frames it never left. (One that finished did
  // not: AddressSanitizer unpoisons the stack before the call of a noreturn function, finish().)
  if (f->abandoned) __asan_unpoison_memory_region(f->stack, f->size);
#endif
  reset(f, entry);
  f->fresh = true;
  f->fake_stack = nullptr;
  f->abandoned = false;
  return f;
}

void give_back(Fiber* f, bool abandoned) {
  f->abandoned = abandoned;
  pool.push_back(f);
}

void enter(Fiber* f) {
  ++switches;
  start_switch(&sched.fake_stack, f->stack, f->size);
  if (_setjmp(sched.where) == 0) {
    if (f->fresh) {
      f->fresh = false;
      setcontext(&f->start);
      corrupted();
    }
    _longjmp(f->where, 1);
  }
  finish_switch(sched.fake_stack, nullptr, nullptr);
}

void leave(Fiber* f) {
  ++switches;
  start_switch(&f->fake_stack, sched.bottom, sched.size);
  if (_setjmp(f->where) == 0) _longjmp(sched.where, 1);
  finish_switch(f->fake_stack, &sched.bottom, &sched.size);
}

void finish() {
  ++switches;
  start_switch(nullptr, sched.bottom, sched.size);
  _longjmp(sched.where, 1);
}

void started() {
  finish_switch(nullptr, &sched.bottom, &sched.size);
}

uint64_t switch_count() {
  return switches;
}

}  // namespace pycoll::emulation::detail
