#include "cpu/rotation.h"

#include <array>

#include "cpu/isa.h"
#include "kernels/rotation.h"

namespace pycoll::cpu {
namespace base {
void rotate_part(float* x, uint64_t n, uint32_t block, bool inverse);
}
namespace avx2 {
void rotate_part(float* x, uint64_t n, uint32_t block, bool inverse);
}

const uint32_t* rotation_sign_masks() {
  static const auto masks = [] {
    std::array<uint32_t, codec::kMaxRotationBlock> m{};
    for (uint32_t j = 0; j < codec::kMaxRotationBlock; ++j) m[j] = codec::rotation_flips(j) ? 0x80000000u : 0u;
    return m;
  }();
  return masks.data();
}

void rotate(float* x, const uint64_t* parts, size_t n_parts, uint32_t block, bool inverse) {
  const auto part = have_avx2() ? avx2::rotate_part : base::rotate_part;
  for (size_t p = 0; p < n_parts; ++p) {
    part(x, parts[p], block, inverse);
    x += parts[p];
  }
}

}  // namespace pycoll::cpu
