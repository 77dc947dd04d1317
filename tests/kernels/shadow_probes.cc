// The shadow map's own test (shadow build only): deliberately wrong loops, instrumented as the kernels are
// (tests/kernels/CMakeLists.txt), each of which the shadow map must report; and the arena's canaries,
// which a write outside a buffer must damage.
#include <cstdint>
#include <cstring>
#include <string>

#include "check.h"
#include "guarded.h"
#include "shadow.h"

namespace pycoll::kernel_tests {
namespace {

// Volatile, so that the compiler keeps every access as written.
__attribute__((noinline)) void writes_twice(volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = 1;
  out[n / 2] = 2;
}
__attribute__((noinline)) void skips_a_byte(volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (i != 3) out[i] = 1;
}
__attribute__((noinline)) void reads_before_its_input(const volatile uint8_t* in, volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = in[static_cast<long>(i) - 1];
}
__attribute__((noinline)) void reads_its_output(volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(out[i] + 1);
}
__attribute__((noinline)) void writes_its_input(volatile uint8_t* in, volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = in[i];
  in[0] = 0;
}
__attribute__((noinline)) void copies(const volatile uint8_t* in, volatile uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = in[i];
}

struct Probe {
  const char* name;
  const char* verdict;  // what the shadow map must say ("" for the correct loop)
  void (*run)(uint8_t* in, uint8_t* out, size_t n);
};

}  // namespace

int run_shadow_selftests() {
  const Probe probes[] = {
      {"a correct copy", "", [](uint8_t* in, uint8_t* out, size_t n) { copies(in, out, n); }},
      {"a byte written twice", "byte 18 of out was written 2 times",
       [](uint8_t*, uint8_t* out, size_t n) { writes_twice(out, n); }},
      {"a byte never written", "byte 3 of out (of 37) was never written",
       [](uint8_t*, uint8_t* out, size_t n) { skips_a_byte(out, n); }},
      {"a read one byte before the input", "a read of 1 bytes outside every buffer: 1 bytes before in",
       [](uint8_t* in, uint8_t* out, size_t n) { reads_before_its_input(in, out, n); }},
      {"a read of an output", "a read of the output out at byte 0",
       [](uint8_t*, uint8_t* out, size_t n) { reads_its_output(out, n); }},
      {"a write into an input", "a write into the input in at byte 0",
       [](uint8_t* in, uint8_t* out, size_t n) { writes_its_input(in, out, n); }},
  };
  Arena arena;
  const size_t n = 37;
  for (const Probe& p : probes) {
    shadow::reset();
    uint8_t* in = arena.place(0, n, 2, false, 7);
    uint8_t* out = arena.place(1, n, 0, true, 0);
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    arena.ranges(ranges);
    shadow::set_arena(ranges);
    shadow::track(in, n, shadow::Use::kIn, "in");
    shadow::track(out, n, shadow::Use::kOut, "out");
    p.run(in, out, n);
    const std::string v = shadow::verdict();
    CHECK(*p.verdict ? v.find(p.verdict) != std::string::npos : v.empty(),
          std::string("shadow map, ") + p.name + ": it says '" + v + "'");
  }
  // The canaries: a write just outside a buffer, either side, is seen.
  uint8_t* b = arena.place(2, 40, 4, false, 0);
  CHECK(arena.damaged().empty(), "fresh canaries");
  b[-1] = 0;
  CHECK(arena.damaged().find("slot 2: the byte 1 before its start was written") != std::string::npos, "canary");
  b = arena.place(2, 40, 12, true, 0);
  b[40] = 0;
  CHECK(arena.damaged().find("slot 2: the byte 1 after its end was written") != std::string::npos, "canary");
  shadow::reset();
  return static_cast<int>(sizeof probes / sizeof probes[0]) + 1;
}

}  // namespace pycoll::kernel_tests
