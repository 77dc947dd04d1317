// The shadow map (shadow.h) and the instrumentation hooks that feed it. Built with PYCOLL_SHADOW=1 into
// the shadow sweep only; without it the functions of shadow.h do nothing.
#include "shadow.h"

#include <algorithm>

namespace pycoll::kernel_tests::shadow {
namespace {

struct Buffer {
  uintptr_t lo, hi;
  Use use;
  const char* name;
  std::vector<uint8_t> writes;  // per byte
};

std::vector<std::pair<uintptr_t, uintptr_t>> arena;
std::vector<Buffer> buffers;
std::vector<std::string> problems;
constexpr size_t kMaxProblems = 4;

void problem(std::string what) {
  if (problems.size() < kMaxProblems) problems.push_back(std::move(what));
}

[[maybe_unused]] void access(const void* p, size_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool in_arena = false;
  for (const auto& [lo, hi] : arena) in_arena |= a < hi && a + n > lo;
  if (!in_arena) return;
  for (Buffer& b : buffers) {
    if (a + n <= b.lo || a >= b.hi) continue;
    if (a < b.lo || a + n > b.hi) {
      problem(std::string(write ? "a write" : "a read") + " of " + std::to_string(n) + " bytes straddles an end of " +
              b.name + " (at byte " + std::to_string(static_cast<long>(a - b.lo)) + " of " +
              std::to_string(b.hi - b.lo) + ")");
      return;
    }
    if (write && b.use == Use::kIn) {
      problem(std::string("a write into the input ") + b.name + " at byte " + std::to_string(a - b.lo));
      return;
    }
    if (!write && b.use == Use::kOut) {
      problem(std::string("a read of the output ") + b.name + " at byte " + std::to_string(a - b.lo));
      return;
    }
    if (write)
      for (size_t i = 0; i < n; ++i) {
        uint8_t& c = b.writes[a - b.lo + i];
        if (c < 255) ++c;
      }
    return;
  }
  // In the arena, outside every buffer: say how far from the nearest one.
  std::string nearest = "no buffer";
  uintptr_t best = UINTPTR_MAX;
  for (const Buffer& b : buffers) {
    const uintptr_t d = a < b.lo ? b.lo - a : a - b.hi + 1;
    if (d < best) {
      best = d;
      nearest = std::to_string(d) + (a < b.lo ? " bytes before " : " bytes after the end of ") + b.name;
    }
  }
  problem(std::string(write ? "a write" : "a read") + " of " + std::to_string(n) +
          " bytes outside every buffer: " + nearest);
}

}  // namespace

#if PYCOLL_SHADOW
bool enabled() {
  return true;
}
#else
bool enabled() {
  return false;
}
#endif

void set_arena(const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  arena = ranges;
}

void reset() {
  buffers.clear();
  problems.clear();
}

void track(const void* p, size_t n, Use use, const char* name) {
  if (!enabled() || n == 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  buffers.push_back(Buffer{lo, lo + n, use, name, std::vector<uint8_t>(use == Use::kIn ? 0 : n, 0)});
}

std::string verdict() {
  std::string out;
  for (const std::string& p : problems) out += p + "; ";
  for (const Buffer& b : buffers) {
    if (b.use == Use::kIn) continue;
    const auto never = std::find(b.writes.begin(), b.writes.end(), 0);
    const auto twice = std::find_if(b.writes.begin(), b.writes.end(), [](uint8_t c) { return c > 1; });
    if (never != b.writes.end())
      out += std::string("byte ") + std::to_string(never - b.writes.begin()) + " of " + b.name + " (of " +
             std::to_string(b.writes.size()) + ") was never written; ";
    if (twice != b.writes.end())
      out += std::string("byte ") + std::to_string(twice - b.writes.begin()) + " of " + b.name + " was written " +
             std::to_string(*twice) + " times; ";
  }
  return out;
}

}  // namespace pycoll::kernel_tests::shadow

#if PYCOLL_SHADOW
// ThreadSanitizer's instrumentation interface, with the signatures GCC declares for it.
namespace shadow_hooks = pycoll::kernel_tests::shadow;
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit(void*) {}
// The instrumented code's atomics (static-initialisation guards, launch.cuh's caches): done as asked.
unsigned char __tsan_atomic8_load(const volatile void* a, int) {
  return __atomic_load_n(static_cast<const volatile unsigned char*>(a), __ATOMIC_SEQ_CST);
}
unsigned int __tsan_atomic32_load(const volatile void* a, int) {
  return __atomic_load_n(static_cast<const volatile unsigned int*>(a), __ATOMIC_SEQ_CST);
}
void __tsan_atomic32_store(volatile void* a, unsigned int v, int) {
  __atomic_store_n(static_cast<volatile unsigned int*>(a), v, __ATOMIC_SEQ_CST);
}
void __tsan_vptr_update(void* p, void* v) {
  *static_cast<void**>(p) = v;
}
#define PYCOLL_SHADOW_HOOKS(N)                   \
  void __tsan_read##N(void* p) {                 \
    shadow_hooks::access(p, N, false);           \
  }                                              \
  void __tsan_write##N(void* p) {                \
    shadow_hooks::access(p, N, true);            \
  }                                              \
  void __tsan_unaligned_read##N(const void* p) { \
    shadow_hooks::access(p, N, false);           \
  }                                              \
  void __tsan_unaligned_write##N(void* p) {      \
    shadow_hooks::access(p, N, true);            \
  }                                              \
  void __tsan_volatile_read##N(void* p) {        \
    shadow_hooks::access(p, N, false);           \
  }                                              \
  void __tsan_volatile_write##N(void* p) {       \
    shadow_hooks::access(p, N, true);            \
  }
PYCOLL_SHADOW_HOOKS(1)
PYCOLL_SHADOW_HOOKS(2)
PYCOLL_SHADOW_HOOKS(4)
PYCOLL_SHADOW_HOOKS(8)
PYCOLL_SHADOW_HOOKS(16)
#undef PYCOLL_SHADOW_HOOKS
void __tsan_read_range(void* p, long n) {
  shadow_hooks::access(p, static_cast<size_t>(n), false);
}
void __tsan_write_range(void* p, long n) {
  shadow_hooks::access(p, static_cast<size_t>(n), true);
}
}
#endif
