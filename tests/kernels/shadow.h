// The shadow map of the sweep's shadow build: the kernels' translation units are compiled with
// -fsanitize=thread for its instrumentation only (every load and store calls a __tsan_* hook, as the Linux
// kernel's KCSAN uses it) and linked with shadow.cc's hooks instead of ThreadSanitizer's runtime. Each hook
// looks the address up among the buffers of the call under test:
//   - a byte of an output buffer written twice, or never written, is an error;
//   - a read of a buffer that is only an output, a write to one that is only an input, is an error;
//   - any access to the arena's data pages (guarded.h) outside every buffer is an error, exact to the byte
//     on both sides (where guard pages and AddressSanitizer see whole pages and granules).
// Accesses elsewhere (stacks, the emulation's own state) are not the kernels' data and are ignored. Not seen:
// memcpy / memset calls the compiler leaves as calls (the instrumentation covers loads and stores; the
// kernels' memcpy are between locals).
// In the AddressSanitizer build there are no hooks: enabled() is false and the rest does nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pycoll::kernel_tests::shadow {

enum class Use { kIn, kOut, kInOut };

bool enabled();
// The arena's mappings: accesses inside them are the kernels' data.
void set_arena(const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges);
// Forget the buffers of the last call; track these for the next.
void reset();
void track(const void* p, size_t n, Use use, const char* name);
// After the call: what went wrong (empty when nothing did).
std::string verdict();

}  // namespace pycoll::kernel_tests::shadow
