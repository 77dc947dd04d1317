// Fibers of the emulation (fiber.h), over one primitive: jump(from, to) saves where the running code stands
// into `from` and resumes `to`.
//   x86-64   a few instructions of our own (below): the callee-saved registers, the x87 control word and
//            MXCSR pushed on the stack being left, the stack pointer swapped, the same popped from the
//            other. No system call (glibc's swapcontext sets the signal mask every time: 325 ns a switch
//            here, against 60-85 ns for a switch with the scheduler's bookkeeping this way), and no libc
//            call that AddressSanitizer intercepts: _longjmp and swapcontext both make it unpoison the stack
//            left or entered, which would erase the redzones of every kernel frame alive across a warp
//            operation.
//   others   ucontext's swapcontext (slower; under AddressSanitizer, kernel frames that live across a switch
//            lose their redzones).
// A fresh fiber's stack is laid out so that the first jump into it "returns" into start(), which calls its
// entry.
//
// AddressSanitizer is told of every switch between stacks: __sanitizer_start_switch_fiber before it (with the
// bounds of the stack being entered, and where to keep the fake stack of the one being left; none for a
// fiber that finishes), __sanitizer_finish_switch_fiber after it, on the new stack (which also tells the
// bounds of the stack just left: that is how the fibers learn the scheduler's). Without it both are nothing.
#include "cuda/emulation/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

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

#if defined(__x86_64__)
// pycoll_emulation_jump(void** save_sp, void* sp): System V callee-saved registers, x87 control word and
// MXCSR pushed, the stack pointer saved into *save_sp and replaced by sp, the same popped. A fresh stack
// holds such a frame whose return address is pycoll_emulation_start, with the entry function in rbx.
// Local symbols: nothing outside this object can see or interpose them.
asm(R"(
  .text
  .p2align 4
  .type pycoll_emulation_jump, @function
pycoll_emulation_jump:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pycoll_emulation_jump, .-pycoll_emulation_jump

  .p2align 4
  .type pycoll_emulation_start, @function
pycoll_emulation_start:
  andq $-16, %rsp
  callq *%rbx
  ud2
  .size pycoll_emulation_start, .-pycoll_emulation_start
)");
extern "C" void pycoll_emulation_jump(void** save_sp, void* sp);
extern "C" void pycoll_emulation_start();
#endif

namespace pycoll::emulation::detail {

// Kernel frames are small; a sanitizer build's are larger, and pages are only committed when touched.
constexpr size_t kStackBytes = 512 * 1024;

namespace {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};

void prepare(Context& c, char* stack, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack + size)) & ~uintptr_t{15});
  uint16_t fcw;
  asm volatile("fnstcw %0" : "=m"(fcw));
  const uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint64_t* sp = top - 10;
  sp[0] = fcw;  // the 16 bytes fldcw / ldmxcsr read
  sp[1] = mxcsr;
  sp[2] = 0;                                                    // r15
  sp[3] = 0;                                                    // r14
  sp[4] = 0;                                                    // r13
  sp[5] = 0;                                                    // r12
  sp[6] = reinterpret_cast<uint64_t>(entry);                    // rbx
  sp[7] = 0;                                                    // rbp
  sp[8] = reinterpret_cast<uint64_t>(&pycoll_emulation_start);  // the return address
  sp[9] = 0;
  c.sp = sp;
}

void jump(Context& from, Context& to) {
  pycoll_emulation_jump(&from.sp, to.sp);
}
#else
struct Context {
  ucontext_t uc;
};

// getcontext would return twice only if this context were resumed as it is; it never is (makecontext
// replaces its start), but it gets a frame of its own with nothing live across it all the same.
[[gnu::noinline]] void prepare(Context& c, char* stack, size_t size, void (*entry)()) {
  if (getcontext(&c.uc) != 0) std::abort();  // fails only for a corrupted context
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}

void jump(Context& from, Context& to) {
  if (swapcontext(&from.uc, &to.uc) != 0) std::abort();  // fails only for a corrupted context
}
#endif

}  // namespace

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // lowest usable address; the guard page lies just below
  size_t size = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's fake stack while the fiber is switched out
  bool abandoned = false;      // given back in the middle of its entry
};

namespace {

struct Scheduler {
  Context ctx;
  const void* bottom = nullptr;  // its stack, as AddressSanitizer reported it
  size_t size = 0;
  void* fake_stack = nullptr;
};
Scheduler sched;
Context finished;  // where a fiber that finishes "saves" itself
// Never destroyed: the fibers stay reachable to the end (a leak checker runs after static destructors).
std::vector<Fiber*>& pool = *new std::vector<Fiber*>;
uint64_t switches = 0;

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
  prepare(f->ctx, f->stack, f->size, entry);
  f->fake_stack = nullptr;
  f->abandoned = false;
  return f;
}

// (An abandoned fiber's AddressSanitizer fake stack, used only with detect_stack_use_after_return=1, is
// not freed: that takes a switch back into it. Faults are test failures; the leak ends with the process.)
void give_back(Fiber* f, bool abandoned) {
  f->abandoned = abandoned;
  pool.push_back(f);
}

void enter(Fiber* f) {
  ++switches;
  start_switch(&sched.fake_stack, f->stack, f->size);
  jump(sched.ctx, f->ctx);
  finish_switch(sched.fake_stack, nullptr, nullptr);
}

void leave(Fiber* f) {
  ++switches;
  start_switch(&f->fake_stack, sched.bottom, sched.size);
  jump(f->ctx, sched.ctx);
  finish_switch(f->fake_stack, &sched.bottom, &sched.size);
}

void finish() {
  ++switches;
  start_switch(nullptr, sched.bottom, sched.size);
  jump(finished, sched.ctx);
  std::abort();  // never resumed
}

void started() {
  finish_switch(nullptr, &sched.bottom, &sched.size);
}

uint64_t switch_count() {
  return switches;
}

}  // namespace pycoll::emulation::detail
