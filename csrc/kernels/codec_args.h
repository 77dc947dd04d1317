// What a codec's encode and decode are handed: plain pointers and counts, the same structs for the CPU
// loops (csrc/cpu/codec.h) and the CUDA kernels (csrc/cuda/kernels.h), which read host or device memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycoll::codec {

struct EncodeArgs {
  const float* src = nullptr;   // n values
  float* residual = nullptr;    // optional: x = src + residual is encoded; then residual = scale * (x - decoded)
  float residual_scale = 1.0f;  // (0 where the decoded value is not finite)
  uint8_t* out = nullptr;       // encoded_bytes(n)
  uint8_t* out2 = nullptr;      // optional second copy of the encoded bytes
  float* decoded = nullptr;     // optional: the decoded values (may alias src)
  size_t n = 0;
  uint64_t index = 0;  // element index of src[0] in the collective's buffer (for stochastic rounding)
  uint32_t key = 0;    // codec::rounding_key of this rank and collective
};

struct DecodeArgs {
  float* dst = nullptr;         // n values: dst = [acc (+ residual) +] decoded, then / divisor
  const float* acc = nullptr;   // optional (may alias dst)
  float* residual = nullptr;    // optional, with acc: added to acc, then set to 0 (the value was consumed)
  const uint8_t* in = nullptr;  // encoded_bytes(n)
  size_t n = 0;
  int divisor = 0;  // > 0: the finalize step of an average
};

}  // namespace pycoll::codec
