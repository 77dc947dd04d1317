// Codecs as the executor calls them: encode n float32 values into a message (adding and updating an
// error-feedback residual on the way), and decode a message (optionally accumulating it onto other
// values, the fused decode-and-accumulate of a receive-reduce step). Built-in codecs run the loops of
// codec_loops.h around the element code of kernels/codec.h; user codecs (pycoll/compression/user.py)
// are two C function pointers, e.g. numba cfuncs, called without the GIL.
//
// Every range handed to a codec starts on a block boundary of the collective's buffer, so a message can
// be cut into fragments of whole blocks and each fragment encoded or decoded on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/codec_args.h"

namespace pycoll::cpu {

using codec::DecodeArgs;
using codec::EncodeArgs;

class Codec {
 public:
  // tail_bytes[r] is the encoded size of a last, partial block of r elements (r < block_elems).
  Codec(uint32_t block_elems, uint32_t block_bytes, std::vector<uint32_t> tail_bytes);
  virtual ~Codec() = default;

  uint32_t block_elems() const { return block_elems_; }
  uint32_t block_bytes() const { return block_bytes_; }
  uint64_t encoded_bytes(uint64_t n) const { return (n / block_elems_) * block_bytes_ + tail_bytes_[n % block_elems_]; }
  // Elements in `bytes` encoded bytes starting on a block boundary: whole blocks, or the rest of a
  // message of `total` elements whose encoding ends there.
  uint64_t elements_in(uint64_t bytes, uint64_t elem_start, uint64_t total) const;

  virtual void encode(const EncodeArgs& a) const = 0;
  virtual void decode(const DecodeArgs& a) const = 0;
  virtual std::string name() const = 0;

 private:
  uint32_t block_elems_;
  uint32_t block_bytes_;
  std::vector<uint32_t> tail_bytes_;
};

// fp16 / bf16 / int8 / int4; block is ignored by the casts. Throws InvalidUsage for a bad block.
std::shared_ptr<Codec> make_builtin_codec(codec::Kind kind, uint32_t block, codec::Rounding rounding);

// A codec from two C functions:
//   encode(const float* src, int64 n, uint8* out, int64 index, uint32 key)
//   decode(const uint8* in, int64 n, float* out, int32 accumulate)   (accumulate: out += decoded)
// with the wire layout given by block_elems, block_bytes and tail_bytes.
using UserEncodeFn = void (*)(const float*, int64_t, uint8_t*, int64_t, uint32_t);
using UserDecodeFn = void (*)(const uint8_t*, int64_t, float*, int32_t);
std::shared_ptr<Codec> make_user_codec(std::string name, uint32_t block_elems, uint32_t block_bytes,
                                       std::vector<uint32_t> tail_bytes, UserEncodeFn encode, UserDecodeFn decode);

// Name of the instruction set the built-in codec loops use ("avx2" or "baseline").
const char* codec_isa();

}  // namespace pycoll::cpu
