#include "cpu/rotation.h"

#include "kernels/rotation.h"

namespace pycoll::cpu {

namespace {

// A whole block of a power-of-two size known at compile time: the loops unroll and vectorize, with the
// same additions in the same stages as codec::rotate_piece, so the same bits.
template <uint32_t kLen>
void rotate_fixed(float* x, bool inverse) {
  codec::rotate_piece(x, kLen, inverse);
}

}  // namespace

void rotate(float* x, const uint64_t* parts, size_t n_parts, uint32_t block, bool inverse) {
  for (size_t p = 0; p < n_parts; ++p) {
    const uint64_t n = parts[p];
    uint64_t at = 0;
    if (block == 32) {
      for (; at + 32 <= n; at += 32) rotate_fixed<32>(x + at, inverse);
    } else if (block == 64) {
      for (; at + 64 <= n; at += 64) rotate_fixed<64>(x + at, inverse);
    }
    for (; at < n; at += block)
      codec::rotate_block(x + at, static_cast<uint32_t>(n - at < block ? n - at : block), inverse);
    x += n;
  }
}

}  // namespace pycoll::cpu
