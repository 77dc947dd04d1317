#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/codec.h"
#include "cpu/isa.h"
#include "pycoll/errors.h"

namespace pycoll::cpu {
namespace base {
std::shared_ptr<Codec> make_builtin(codec::Kind kind, uint32_t block, codec::Rounding rounding);
}
namespace avx2 {
std::shared_ptr<Codec> make_builtin(codec::Kind kind, uint32_t block, codec::Rounding rounding);
}

const char* codec_isa() {
  return have_avx2() ? "avx2" : "baseline";
}

Codec::Codec(uint32_t block_elems, uint32_t block_bytes, std::vector<uint32_t> tail_bytes)
    : block_elems_(block_elems), block_bytes_(block_bytes), tail_bytes_(std::move(tail_bytes)) {
  if (block_elems_ == 0 || block_bytes_ == 0 || tail_bytes_.size() != block_elems_ || tail_bytes_[0] != 0)
    throw Error(ErrorKind::kInvalidUsage,
                "codec layout is invalid: need block_elems >= 1, block_bytes >= 1 and one tail size per "
                "partial block length, starting with 0 for an empty tail");
  // Non-empty tails encode to at least one byte, so that elements_in() can tell a fragment of whole
  // blocks from the last piece of a message.
  for (uint32_t r = 1; r < block_elems_; ++r)
    if (tail_bytes_[r] == 0 || tail_bytes_[r] > block_bytes_)
      throw Error(ErrorKind::kInvalidUsage,
                  "codec layout is invalid: a partial block must encode into 1 to block_bytes bytes");
}

uint64_t Codec::elements_in(uint64_t bytes, uint64_t elem_start, uint64_t total) const {
  if (elem_start >= total) return 0;
  if (encoded_bytes(total - elem_start) == bytes) return total - elem_start;
  return (bytes / block_bytes_) * block_elems_;
}

std::shared_ptr<Codec> make_builtin_codec(codec::Kind kind, uint32_t block, codec::Rounding rounding) {
  if (kind == codec::Kind::kInt8 || kind == codec::Kind::kInt4) {
    if (block < codec::kMinBlock || block > codec::kMaxBlock || block % 8 != 0)
      throw Error(ErrorKind::kInvalidUsage, "codec block must be a multiple of 8 in [" +
                                                std::to_string(codec::kMinBlock) + ", " +
                                                std::to_string(codec::kMaxBlock) + "], got " + std::to_string(block));
  }
  if (rounding != codec::Rounding::kNearest && rounding != codec::Rounding::kStochastic)
    throw Error(ErrorKind::kInvalidUsage, "unknown rounding code " + std::to_string(int(rounding)));
  std::shared_ptr<Codec> c =
      have_avx2() ? avx2::make_builtin(kind, block, rounding) : base::make_builtin(kind, block, rounding);
  if (!c) throw Error(ErrorKind::kInvalidUsage, "unknown codec kind " + std::to_string(int(kind)));
  return c;
}

namespace {

// Residuals and decoded values need the decoded message, which a user codec only gives as a whole:
// encode, then decode the piece back into a scratch buffer.
class UserCodec final : public Codec {
 public:
  UserCodec(std::string name, uint32_t block_elems, uint32_t block_bytes, std::vector<uint32_t> tail_bytes,
            UserEncodeFn enc, UserDecodeFn dec)
      : Codec(block_elems, block_bytes, std::move(tail_bytes)), name_(std::move(name)), enc_(enc), dec_(dec) {
    if (!enc_ || !dec_) throw Error(ErrorKind::kInvalidUsage, "user codec needs an encode and a decode function");
  }
  std::string name() const override { return name_; }

  void encode(const EncodeArgs& a) const override {
    if (a.n == 0) return;
    const float* x = a.src;
    float* xs = nullptr;
    float* ds = nullptr;
    std::vector<float>& scratch = scratch_for_thread();
    const bool need_decoded = a.residual || a.decoded;
    scratch.resize((a.residual ? a.n : 0) + (need_decoded ? a.n : 0));
    if (a.residual) {
      xs = scratch.data();
      for (size_t i = 0; i < a.n; ++i) xs[i] = a.src[i] + a.residual[i];
      x = xs;
    }
    enc_(x, static_cast<int64_t>(a.n), a.out, static_cast<int64_t>(a.index), a.key);
    const uint64_t bytes = encoded_bytes(a.n);
    if (a.out2) std::memcpy(a.out2, a.out, bytes);
    if (!need_decoded) return;
    ds = scratch.data() + (a.residual ? a.n : 0);
    dec_(a.out, static_cast<int64_t>(a.n), ds, 0);  // not onto zeros: 0 + -0 would lose the sign
    if (a.residual)
      for (size_t i = 0; i < a.n; ++i) a.residual[i] = codec::residual_of(x[i], ds[i], a.residual_scale);
    if (a.decoded) std::memcpy(a.decoded, ds, a.n * sizeof(float));
  }

  void decode(const DecodeArgs& a) const override {
    if (a.n == 0) return;
    // dst = acc (+ residual), then dst += decoded, then / divisor
    if (a.acc) {
      for (size_t i = 0; i < a.n; ++i) a.dst[i] = a.residual ? a.acc[i] + a.residual[i] : a.acc[i];
      if (a.residual) std::memset(a.residual, 0, a.n * sizeof(float));
      dec_(a.in, static_cast<int64_t>(a.n), a.dst, 1);
    } else {
      dec_(a.in, static_cast<int64_t>(a.n), a.dst, 0);
    }
    if (a.divisor > 0) {
      const float div = static_cast<float>(a.divisor);
      for (size_t i = 0; i < a.n; ++i) a.dst[i] = a.dst[i] / div;
    }
  }

 private:
  static std::vector<float>& scratch_for_thread() {
    thread_local std::vector<float> scratch;
    return scratch;
  }
  std::string name_;
  UserEncodeFn enc_;
  UserDecodeFn dec_;
};

}  // namespace

std::shared_ptr<Codec> make_user_codec(std::string name, uint32_t block_elems, uint32_t block_bytes,
                                       std::vector<uint32_t> tail_bytes, UserEncodeFn encode, UserDecodeFn decode) {
  return std::make_shared<UserCodec>(std::move(name), block_elems, block_bytes, std::move(tail_bytes), encode, decode);
}

}  // namespace pycoll::cpu
