// Buffers of exactly the size a kernel call is given, against guard pages: each slot of the arena is a
// mapping [PROT_NONE page][data pages][PROT_NONE page], and a buffer is placed in it at a chosen distance
// from a 16-byte boundary, either right after the leading guard page or as close to the trailing one as
// that alignment allows. The bytes of the data pages outside the buffer hold a canary that must survive
// the call (within kWindow bytes of it: farther ones are the sanitizers' to see). In an AddressSanitizer
// build all of them are poisoned (precisely after the buffer's end, by whole 8-byte granules before its
// start), and in the shadow-map build (shadow.h) every access to them is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pycoll::kernel_tests {

class Arena {
 public:
  static constexpr int kSlots = 8;
  static constexpr uint8_t kCanary = 0xA5;
  static constexpr size_t kWindow = 256;

  Arena();
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `n` bytes in slot `slot`, starting `offset` bytes past a 16-byte boundary (offset < 16), next to the
  // leading guard page (at_tail false) or ending within 15 bytes of the trailing one; the bytes are
  // filled with `fill`. The slot's earlier buffer is gone.
  uint8_t* place(int slot, size_t n, size_t offset, bool at_tail, uint8_t fill);

  // Every slot in use whose bytes outside its buffer lost their canary, described (empty if none).
  std::string damaged() const;

  // The slots' data pages, for the shadow map: [begin, end) of each mapping.
  void ranges(std::vector<std::pair<uintptr_t, uintptr_t>>& out) const;

 private:
  struct Slot {
    uint8_t* map = nullptr;  // the whole mapping (leading guard page first)
    size_t data = 0;         // bytes of data pages
    uint8_t* begin = nullptr;
    size_t n = 0;
    uint8_t* lo = nullptr;  // the canary window around it
    uint8_t* hi = nullptr;
    bool used = false;
  };
  Slot slots_[kSlots];
  size_t page_;
};

}  // namespace pycoll::kernel_tests
