// Element code of the randomized Hadamard rotation (a codec's rotation="hadamard"), usable from host C++
// and CUDA alike so that the CPU loop (csrc/cpu/rotation.cc) and the GPU kernel (csrc/cuda/rotate.cu) give
// the same bits; pycoll/compression/reference.py repeats it in numpy (the tests' oracle).
//
// A compressed collective with rotation runs on rotated copies of its buffers and rotates its output back
// (engine/communicator.cc): quantizing H D x instead of x spreads a block's outliers over the whole block,
// so its absmax, and with it every element's quantization step, shrinks (SDP4Bit, QuaRot). The rotation is
// linear, so sums of rotated shares are rotated sums and every plan runs unchanged.
//
// The parts, named once:
//
//   part     a run of elements whose codec blocks start at its first element: an all-reduce's buffer, a
//            reduce-scatter's or all-gather's chunk, an all-to-all's part (the caller lists them).
//   block    `block` elements of a part from its start (the codec's block; the last may be shorter).
//   piece    a block is rotated in pieces of power-of-two lengths, the binary digits of its length from the
//            largest (a block of 64: one piece; a last block of 40: 32 then 8).
//   signs    D: position j of every piece is negated where mix32(j ^ kRotationKey) is odd; fixed, so every
//            rank and every call rotate alike and error feedback's residuals keep their meaning.
//   scales   H is the unnormalized Walsh-Hadamard matrix of a piece of 2^k elements (H H = 2^k I). Forward:
//            y = 2^-ceil(k/2) H D x; back: x = D 2^-floor(k/2) H y. Both scales are powers of two (exact),
//            their product 2^-k, so back(forward(x)) = x up to the rounding of the butterflies' additions.
//
// Butterflies run stage by stage (stride 1, 2, 4, ...), each pair (a, b) -> (a + b, a - b), in this order
// on every device: additions are not reassociated, so the bits agree.
#pragma once

#include <cstdint>

#include "kernels/codec.h"

namespace pycoll::codec {

// Codes shared with pycoll/compression (Codec.rotation); append, never reorder.
enum class Rotation : int32_t { kNone = 0, kHadamard = 1 };

constexpr uint32_t kRotationKey = 0x2545f491u;
// The largest codec block a rotation takes (a GPU thread holds one block in its own memory).
constexpr uint32_t kMaxRotationBlock = 256;

// Whether position j of a piece is negated (D).
PYCOLL_HD bool rotation_flips(uint32_t j) {
  return (mix32(j ^ kRotationKey) & 1u) != 0;
}

// The largest power of two <= n (n >= 1).
PYCOLL_HD uint32_t floor_pow2(uint32_t n) {
  uint32_t p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// 2^-e as a float, 0 <= e <= 126.
PYCOLL_HD float pow2_neg(uint32_t e) {
  return bits_as_float((127u - e) << 23);
}

// One piece of `len` = 2^k elements, in place: forward (inverse = false) or back.
PYCOLL_HD void rotate_piece(float* x, uint32_t len, bool inverse) {
  uint32_t k = 0;
  while ((1u << k) < len) ++k;
  if (!inverse) {
    for (uint32_t j = 0; j < len; ++j)
      if (rotation_flips(j)) x[j] = -x[j];
  }
  for (uint32_t h = 1; h < len; h *= 2) {
    for (uint32_t i = 0; i < len; i += 2 * h) {
      for (uint32_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = add_rn(a, b);
        x[j + h] = sub_rn(a, b);
      }
    }
  }
  const float scale = pow2_neg(inverse ? k / 2 : (k + 1) / 2);
  for (uint32_t j = 0; j < len; ++j) {
    const float v = mul_rn(x[j], scale);
    x[j] = inverse && rotation_flips(j) ? -v : v;
  }
}

// One block of m elements, in place: its pieces from the largest.
PYCOLL_HD void rotate_block(float* x, uint32_t m, bool inverse) {
  for (uint32_t at = 0; at < m;) {
    const uint32_t len = floor_pow2(m - at);
    rotate_piece(x + at, len, inverse);
    at += len;
  }
}

}  // namespace pycoll::codec
