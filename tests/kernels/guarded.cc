#include "guarded.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define GUARDED_POISON(p, n) __asan_poison_memory_region(p, n)
#define GUARDED_UNPOISON(p, n) __asan_unpoison_memory_region(p, n)
#else
#define GUARDED_POISON(p, n) ((void)(p), (void)(n))
#define GUARDED_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace pycoll::kernel_tests {

Arena::Arena() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}

Arena::~Arena() {
  for (Slot& s : slots_) {
    if (!s.map) continue;
    GUARDED_UNPOISON(s.map + page_, s.data);
    munmap(s.map, s.data + 2 * page_);
  }
}

uint8_t* Arena::place(int slot, size_t n, size_t offset, bool at_tail, uint8_t fill) {
  if (slot < 0 || slot >= kSlots || offset >= 16) throw std::invalid_argument("Arena::place: bad slot or offset");
  Slot& s = slots_[slot];
  const size_t need = (n + 16 + page_ - 1) / page_ * page_;
  if (s.data < need) {
    if (s.map) {
      GUARDED_UNPOISON(s.map + page_, s.data);
      munmap(s.map, s.data + 2 * page_);
    }
    void* m = mmap(nullptr, need + 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    s.map = static_cast<uint8_t*>(m);
    s.data = need;
    if (mprotect(s.map, page_, PROT_NONE) != 0 || mprotect(s.map + page_ + need, page_, PROT_NONE) != 0)
      throw std::runtime_error("mprotect of a guard page failed");
  }
  uint8_t* data = s.map + page_;
  GUARDED_UNPOISON(data, s.data);
  uint8_t* begin = data + offset;
  if (at_tail) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(data + s.data);
    uintptr_t b = end - n;
    b -= (b - offset) & 15;  // back to offset past a 16-byte boundary (data is page-aligned)
    begin = reinterpret_cast<uint8_t*>(b);
  }
  s.lo = std::max(data, begin - kWindow);
  s.hi = std::min(data + s.data, begin + n + kWindow);
  std::memset(s.lo, kCanary, static_cast<size_t>(s.hi - s.lo));
  std::memset(begin, fill, n);
  GUARDED_POISON(data, s.data);
  GUARDED_UNPOISON(begin, n);
  s.begin = begin;
  s.n = n;
  s.used = true;
  return begin;
}

std::string Arena::damaged() const {
  std::string out;
  for (int i = 0; i < kSlots; ++i) {
    const Slot& s = slots_[i];
    if (!s.used) continue;
    GUARDED_UNPOISON(s.lo, static_cast<size_t>(s.hi - s.lo));
    const uint8_t* end = s.begin + s.n;
    for (const uint8_t* p = s.begin; p-- > s.lo;)  // nearest first
      if (*p != kCanary) {
        out += "slot " + std::to_string(i) + ": the byte " + std::to_string(s.begin - p) +
               " before its start was written; ";
        break;
      }
    for (const uint8_t* p = end; p < s.hi; ++p)
      if (*p != kCanary) {
        out +=
            "slot " + std::to_string(i) + ": the byte " + std::to_string(p - end + 1) + " after its end was written; ";
        break;
      }
    GUARDED_POISON(s.lo, static_cast<size_t>(s.hi - s.lo));
    GUARDED_UNPOISON(s.begin, s.n);
  }
  return out;
}

void Arena::ranges(std::vector<std::pair<uintptr_t, uintptr_t>>& out) const {
  out.clear();
  for (const Slot& s : slots_)
    if (s.map)
      out.emplace_back(reinterpret_cast<uintptr_t>(s.map + page_), reinterpret_cast<uintptr_t>(s.map + page_ + s.data));
}

}  // namespace pycoll::kernel_tests
