// Copies for data that will not be read again soon (the final values of a large collective): they use
// non-temporal stores, which skip the read-for-ownership of every destination line and keep the
// caller's output from evicting the transport's hot ring slots.
#pragma once

#include <cstddef>

namespace pycoll::cpu {

void stream_copy(void* dst, const void* src, size_t n);
// `src` into both `dst` and `also` in one pass (a received fragment kept and sent on): each source line
// is read once; `stream` writes `dst` with non-temporal stores (`also`, a transport slot, stays cached).
void copy_twice(void* dst, void* also, const void* src, size_t n, bool stream);
// Orders earlier non-temporal stores before later stores (call once before results are used).
void stream_fence();

}  // namespace pycoll::cpu
