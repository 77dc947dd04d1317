// The rotation's CPU loops (kernels/rotation.h), compiled once per instruction set: rotation_base.cc and
// rotation_avx2.cc include this file with PYCOLL_ISA_NS set to a namespace of their own.
//
// A block of 8 to 256 elements whose length is a power of two (the codecs' usual 32 and 64) is one piece,
// held as vectors of 8 floats: the butterflies of strides 1, 2 and 4 pair lanes of one vector (two
// shuffles, a sign flip and an addition: a - b is a + (-b), the same rounding), those of strides 8 and up
// pair whole vectors. Every pair gets the same a + b and a - b, in the same stages, as
// codec::rotate_piece, so the same bits; other lengths take codec::rotate_block itself.
#include <cstdint>
#include <cstring>

#include "cpu/rotation.h"
#include "kernels/rotation.h"

// The 32-byte vectors below are passed between functions of this file only (inlined, internal linkage):
// the ABI note GCC gives for them without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace pycoll::cpu::PYCOLL_ISA_NS {

namespace {

typedef float F8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

constexpr uint32_t kSign = 0x80000000u;
constexpr uint32_t kLanes = 8;

inline F8 flip(F8 a, U8 mask) {
  return reinterpret_cast<F8>(reinterpret_cast<U8>(a) ^ mask);
}

// D's sign bits for positions 8i .. 8i + 7 of a piece (rotation_sign_masks: built in the base build, so no
// AVX2 instruction runs before the CPU is known to have it).
inline U8 signs(uint32_t i) {
  U8 mask;
  std::memcpy(&mask, rotation_sign_masks() + i * kLanes, sizeof mask);
  return mask;
}

// Lanes of `a` picked by indices (GCC's and clang's spellings of one shuffle).
template <int... kLane>
inline F8 pick(F8 a) {
#if defined(__clang__)
  return __builtin_shufflevector(a, a, kLane...);
#else
  return __builtin_shuffle(a, I8{kLane...});
#endif
}

// The butterflies of strides 1, 2 and 4 inside one vector.
inline F8 in_lanes(F8 a) {
  const U8 s1 = {0, kSign, 0, kSign, 0, kSign, 0, kSign}, s2 = {0, 0, kSign, kSign, 0, 0, kSign, kSign},
           s4 = {0, 0, 0, 0, kSign, kSign, kSign, kSign};
  a = pick<0, 0, 2, 2, 4, 4, 6, 6>(a) + flip(pick<1, 1, 3, 3, 5, 5, 7, 7>(a), s1);
  a = pick<0, 1, 0, 1, 4, 5, 4, 5>(a) + flip(pick<2, 3, 2, 3, 6, 7, 6, 7>(a), s2);
  return pick<0, 1, 2, 3, 0, 1, 2, 3>(a) + flip(pick<4, 5, 6, 7, 4, 5, 6, 7>(a), s4);
}

// One piece of kLen = 2^k elements (8 <= kLen <= kMaxRotationBlock), in place.
template <uint32_t kLen>
void rotate_vectors(float* x, bool inverse) {
  constexpr uint32_t kVectors = kLen / kLanes;
  constexpr uint32_t k = __builtin_ctz(kLen);
  F8 r[kVectors];
  std::memcpy(r, x, sizeof r);
  if (!inverse)
    for (uint32_t i = 0; i < kVectors; ++i) r[i] = flip(r[i], signs(i));
  for (uint32_t i = 0; i < kVectors; ++i) r[i] = in_lanes(r[i]);
  for (uint32_t h = 1; h < kVectors; h *= 2)
    for (uint32_t i = 0; i < kVectors; i += 2 * h)
      for (uint32_t j = i; j < i + h; ++j) {
        const F8 a = r[j], b = r[j + h];
        r[j] = a + b;
        r[j + h] = a - b;
      }
  const float scale = codec::pow2_neg(inverse ? k / 2 : (k + 1) / 2);
  for (uint32_t i = 0; i < kVectors; ++i) r[i] *= scale;
  if (inverse)
    for (uint32_t i = 0; i < kVectors; ++i) r[i] = flip(r[i], signs(i));
  std::memcpy(x, r, sizeof r);
}

template <uint32_t kLen>
void rotate_whole_blocks(float* x, uint64_t n, bool inverse) {
  for (uint64_t at = 0; at + kLen <= n; at += kLen) rotate_vectors<kLen>(x + at, inverse);
}

}  // namespace

void rotate_part(float* x, uint64_t n, uint32_t block, bool inverse) {
  const uint64_t whole = n / block * block;
  switch (block) {
    case 8:
      rotate_whole_blocks<8>(x, whole, inverse);
      break;
    case 16:
      rotate_whole_blocks<16>(x, whole, inverse);
      break;
    case 32:
      rotate_whole_blocks<32>(x, whole, inverse);
      break;
    case 64:
      rotate_whole_blocks<64>(x, whole, inverse);
      break;
    case 128:
      rotate_whole_blocks<128>(x, whole, inverse);
      break;
    case 256:
      rotate_whole_blocks<256>(x, whole, inverse);
      break;
    default:
      for (uint64_t at = 0; at < whole; at += block) codec::rotate_block(x + at, block, inverse);
  }
  if (whole < n) codec::rotate_block(x + whole, static_cast<uint32_t>(n - whole), inverse);
}

}  // namespace pycoll::cpu::PYCOLL_ISA_NS
