// Element code of the built-in codecs (fp16, bf16, int8, int4), usable from host C++ and CUDA alike so
// that the CPU loops (csrc/cpu/codec_loops.h) and the GPU kernels produce the same bits. Every float
// operation is spelled out in the order it must happen; nothing may be fused (the host build uses
// -ffp-contract=off, device code must use the *_rn intrinsics below). pycoll/compression/reference.py
// is the same arithmetic in numpy and is the tests' oracle.
//
// Wire formats (n elements; a block is `block` elements, the last one may be shorter):
//   fp16, bf16   2 bytes per element, round-to-nearest-even casts (no blocks, no scales).
//   int8         per block: the block's absmax as float32 (4 bytes), then one int8 per element in
//                [-127, 127]. value = q * (absmax / 127), except q = +-127 decodes to exactly +-absmax.
//   int4         per block: absmax as float32, then two elements per byte (element 2i in the low nibble,
//                2i+1 in the high one), two's complement in [-7, 7]; a block of odd length pads a zero nibble.
// So wire bytes per element are 2 (fp16, bf16), 1 + 4/block (int8) and 0.5 + 4/block (int4).
//
// Special values: a block whose absmax is 0 encodes zeros and decodes to exactly 0. A block holding
// NaN or +-Inf stores that absmax (its bit pattern is the largest) with all codes 0, and every element
// of the block decodes to NaN: a poisoned block never turns into finite numbers. A block whose absmax is
// below ~3.7e-37 quantizes with a clamped reciprocal (absolute error below absmax, so still tiny).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/half.h"

namespace pycoll::codec {

// Codes shared with pycoll/compression (Codec.kind); append, never reorder.
enum class Kind : int32_t { kNone = 0, kFp16 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kUser = 15 };
enum class Rounding : int32_t { kNearest = 0, kStochastic = 1 };

constexpr uint32_t kScaleBytes = 4;
constexpr uint32_t kMinBlock = 8;
constexpr uint32_t kMaxBlock = 4096;

// Largest code magnitude of a block-quantized kind.
PYCOLL_HD constexpr int32_t qmax_of(Kind k) {
  return k == Kind::kInt8 ? 127 : 7;
}

// Payload bytes of n elements of a block (scales not included).
PYCOLL_HD uint64_t payload_bytes(Kind k, uint64_t n) {
  return k == Kind::kInt4 ? (n + 1) / 2 : k == Kind::kInt8 ? n : 2 * n;
}

// Encoded size of n elements (block is ignored by the casts).
PYCOLL_HD uint64_t encoded_bytes(Kind k, uint32_t block, uint64_t n) {
  if (k == Kind::kFp16 || k == Kind::kBf16) return 2 * n;
  uint64_t full = n / block, rest = n % block;
  return full * (kScaleBytes + payload_bytes(k, block)) + (rest ? kScaleBytes + payload_bytes(k, rest) : 0);
}

// ---- float arithmetic that must not be contracted into FMAs --------------------------------------------
PYCOLL_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PYCOLL_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PYCOLL_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
PYCOLL_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// ---- block scale -----------------------------------------------------------------------------------------
// |x| as bits: the largest of these over a block is its absmax (NaN > Inf > every finite value), which
// compilers vectorize as integer max where a float fmaxf/fabsf loop stays scalar.
PYCOLL_HD uint32_t abs_bits(float x) {
  return float_as_bits(x) & 0x7fffffffu;
}
PYCOLL_HD bool finite_abs_bits(uint32_t a) {
  return a < 0x7f800000u;
}

// What a code is multiplied by to decode it.
PYCOLL_HD float quant_step(float absmax, int32_t qmax) {
  return div_rn(absmax, static_cast<float>(qmax));
}
// What a value is multiplied by to encode it: qmax / absmax, 0 for an all-zero block, clamped to FLT_MAX
// where absmax is so small that the reciprocal overflows.
PYCOLL_HD float quant_inv_step(float absmax, int32_t qmax) {
  if (!(absmax > 0.0f)) return 0.0f;
  float inv = div_rn(static_cast<float>(qmax), absmax);
  return inv < FLT_MAX ? inv : FLT_MAX;
}

// ---- stochastic rounding: a counter-based hash of (key, element index), the same on CPU and GPU --------
PYCOLL_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
PYCOLL_HD uint32_t random_bits32(uint32_t key, uint32_t index_lo, uint32_t index_hi) {
  return mix32(mix32(index_lo ^ key) + index_hi);
}
PYCOLL_HD uint32_t random_bits(uint32_t key, uint64_t index) {
  return random_bits32(key, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32));
}
// Uniform in [0, 1) with 24 random bits.
PYCOLL_HD float uniform01(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 5.9604644775390625e-08f;  // 2^-24
}
// The key of one rank's encodes in one collective: different per seed, rank and collective number.
PYCOLL_HD uint32_t rounding_key(uint64_t seed, uint32_t rank, uint64_t seq) {
  uint32_t k = mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9u);
  k = mix32(k ^ static_cast<uint32_t>(seed >> 32));
  k = mix32(k + rank * 0x85ebca6bu);
  return mix32(k ^ static_cast<uint32_t>(seq) ^ (static_cast<uint32_t>(seq >> 32) * 0xc2b2ae35u));
}

// ---- codes -------------------------------------------------------------------------------------------------
PYCOLL_HD float clamp_code(float v, int32_t qmax) {
  const float q = static_cast<float>(qmax);
  return v > q ? q : (v < -q ? -q : v);
}
// Round-to-nearest-even of x * inv (a finite block).
PYCOLL_HD int32_t quantize_nearest(float x, float inv, int32_t qmax) {
  return static_cast<int32_t>(clamp_code(rintf(mul_rn(x, inv)), qmax));
}
// floor(x * inv + u), u uniform in [0, 1): unbiased, E[code] = x * inv.
PYCOLL_HD int32_t quantize_stochastic(float x, float inv, int32_t qmax, float u) {
  return static_cast<int32_t>(clamp_code(floorf(add_rn(mul_rn(x, inv), u)), qmax));
}
// The code's value; +-qmax decodes to exactly +-absmax, so a constant block round-trips exactly (unless
// its magnitude is below ~3.7e-37, where the clamped reciprocal takes over).
// (Written with float compares and both arms computed, which compilers turn into vector selects.)
PYCOLL_HD float dequantize(int32_t q, float absmax, float step, int32_t qmax) {
  const float qf = static_cast<float>(q);
  const float lim = static_cast<float>(qmax);
  const float v = mul_rn(qf, step);
  return qf == lim ? absmax : (qf == -lim ? -absmax : v);
}

// int4 nibbles
PYCOLL_HD uint8_t pack_int4(int32_t lo, int32_t hi) {
  return static_cast<uint8_t>((static_cast<uint32_t>(lo) & 0xfu) | ((static_cast<uint32_t>(hi) & 0xfu) << 4));
}
PYCOLL_HD int32_t int4_lo(uint8_t b) {
  return static_cast<int32_t>(static_cast<int8_t>(static_cast<uint8_t>(b << 4))) >> 4;
}
PYCOLL_HD int32_t int4_hi(uint8_t b) {
  return static_cast<int32_t>(static_cast<int8_t>(b)) >> 4;
}

// ---- error feedback ------------------------------------------------------------------------------------------
// What encoding lost, to be added back before the next encode; 0 where the decoded value is NaN or Inf,
// so that one poisoned step does not poison every later one.
PYCOLL_HD float residual_of(float x, float decoded, float scale) {
  const float r = mul_rn(sub_rn(x, decoded), scale);
  return fabsf(decoded) <= FLT_MAX ? r : 0.0f;  // false for NaN and +-Inf
}

}  // namespace pycoll::codec
