// The built-in codec loops, compiled once per instruction set: codec_base.cc and codec_avx2.cc include
// this file with PYCOLL_ISA_NS set to a namespace of their own. Each loop works block by block, so the
// block being quantized stays in L1 between its absmax pass and its quantize pass; the inner loops are
// branch-free over plain arrays so that the compiler vectorizes them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cpu/codec.h"
#include "kernels/codec.h"
#include "pycoll/errors.h"

namespace pycoll::cpu::PYCOLL_ISA_NS {

using codec::Kind;
using codec::Rounding;

// dst[i] = [acc[i] (+ res[i]) +] d[i], then / divisor; res[i] = 0.
template <bool kAcc, bool kRes, bool kDiv>
static inline void finish_decode(float* dst, const float* acc, float* res, const float* d, size_t m, float divisor) {
  for (size_t i = 0; i < m; ++i) {
    float v = d[i];
    if constexpr (kAcc) {
      float a = acc[i];
      if constexpr (kRes) a = codec::add_rn(a, res[i]);
      v = codec::add_rn(a, v);
    }
    if constexpr (kDiv) v = codec::div_rn(v, divisor);
    dst[i] = v;
  }
  if constexpr (kRes) std::memset(res, 0, m * sizeof(float));
}

static void finish(const DecodeArgs& a, size_t at, const float* d, size_t m) {
  float* dst = a.dst + at;
  const float* acc = a.acc ? a.acc + at : nullptr;
  float* res = a.residual ? a.residual + at : nullptr;
  const float div = static_cast<float>(a.divisor);
  const bool has_div = a.divisor > 0;
  if (!acc) {
    has_div ? finish_decode<false, false, true>(dst, acc, res, d, m, div)
            : finish_decode<false, false, false>(dst, acc, res, d, m, div);
  } else if (!res) {
    has_div ? finish_decode<true, false, true>(dst, acc, res, d, m, div)
            : finish_decode<true, false, false>(dst, acc, res, d, m, div);
  } else {
    has_div ? finish_decode<true, true, true>(dst, acc, res, d, m, div)
            : finish_decode<true, true, false>(dst, acc, res, d, m, div);
  }
}

// After an encode: residual = scale * (x - decoded) and/or decoded values out.
static inline void finish_encode(const EncodeArgs& a, size_t at, const float* x, const float* d, size_t m) {
  if (a.residual) {
    float* res = a.residual + at;
    for (size_t i = 0; i < m; ++i) res[i] = codec::residual_of(x[i], d[i], a.residual_scale);
  }
  if (a.decoded) std::memcpy(a.decoded + at, d, m * sizeof(float));
}

// Work in pieces that fit L1 together with their temporaries.
constexpr size_t kPiece = 2048;

// ---- fp16 / bf16 casts ---------------------------------------------------------------------------------------
template <Kind K>
class CastCodec final : public Codec {
 public:
  CastCodec() : Codec(1, 2, {0}) {}
  std::string name() const override { return K == Kind::kFp16 ? "fp16" : "bf16"; }

  static uint16_t to_wire(float x) { return K == Kind::kFp16 ? float_to_half(x) : float_to_bf16(x); }
  static float from_wire(uint16_t h) { return K == Kind::kFp16 ? half_to_float(h) : bf16_to_float(h); }

  // The compiler does not vectorize the bit-exact fp16 conversions of half.h; F16C does the same rounding
  // (nearest even, NaN made quiet with its payload kept) eight at a time.
  static void to_wire_n(const float* x, uint16_t* h, size_t m) {
    size_t i = 0;
#if defined(__F16C__)
    if constexpr (K == Kind::kFp16) {
      for (; i + 8 <= m; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < m; ++i) h[i] = to_wire(x[i]);
  }
  static void from_wire_n(const uint16_t* h, float* x, size_t m) {
    size_t i = 0;
#if defined(__F16C__)
    if constexpr (K == Kind::kFp16) {
      for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
    }
#endif
    for (; i < m; ++i) x[i] = from_wire(h[i]);
  }

  void encode(const EncodeArgs& a) const override {
    alignas(64) float xs[kPiece];
    alignas(64) float ds[kPiece];
    alignas(64) uint16_t hs[kPiece];
    for (size_t at = 0; at < a.n; at += kPiece) {
      const size_t m = std::min(kPiece, a.n - at);
      const float* x = a.src + at;
      if (a.residual) {
        const float* r = a.residual + at;
        for (size_t i = 0; i < m; ++i) xs[i] = codec::add_rn(x[i], r[i]);
        x = xs;
      }
      to_wire_n(x, hs, m);
      std::memcpy(a.out + 2 * at, hs, 2 * m);
      if (a.out2) std::memcpy(a.out2 + 2 * at, hs, 2 * m);
      if (a.residual || a.decoded) {
        from_wire_n(hs, ds, m);
        finish_encode(a, at, x, ds, m);
      }
    }
  }

  void decode(const DecodeArgs& a) const override {
    alignas(64) uint16_t hs[kPiece];
    alignas(64) float ds[kPiece];
    for (size_t at = 0; at < a.n; at += kPiece) {
      const size_t m = std::min(kPiece, a.n - at);
      std::memcpy(hs, a.in + 2 * at, 2 * m);
      from_wire_n(hs, ds, m);
      finish(a, at, ds, m);
    }
  }
};

// ---- int8 / int4 with a float32 absmax per block ------------------------------------------------------------
template <Kind K, Rounding R>
class BlockCodec final : public Codec {
  static constexpr int32_t kQmax = codec::qmax_of(K);

 public:
  explicit BlockCodec(uint32_t block)
      : Codec(block, static_cast<uint32_t>(codec::encoded_bytes(K, block, block)), tails(block)), block_(block) {}

  static std::vector<uint32_t> tails(uint32_t block) {
    std::vector<uint32_t> t(block);
    for (uint32_t r = 0; r < block; ++r) t[r] = static_cast<uint32_t>(codec::encoded_bytes(K, block, r));
    return t;
  }

  std::string name() const override {
    return std::string(K == Kind::kInt8 ? "int8" : "int4") + "(block=" + std::to_string(block_) +
           (R == Rounding::kStochastic ? ", stochastic)" : ")");
  }

  void encode(const EncodeArgs& a) const override {
    alignas(64) float xs[codec::kMaxBlock];
    alignas(64) int8_t qs[codec::kMaxBlock];
    alignas(64) float ds[codec::kMaxBlock];
    uint8_t* out = a.out;
    uint8_t* out2 = a.out2;
    for (size_t at = 0; at < a.n; at += block_) {
      const size_t m = std::min<size_t>(block_, a.n - at);
      const float* x = a.src + at;
      if (a.residual) {
        const float* r = a.residual + at;
        for (size_t i = 0; i < m; ++i) xs[i] = codec::add_rn(x[i], r[i]);
        x = xs;
      }
      uint32_t amax = 0;
      for (size_t i = 0; i < m; ++i) amax = std::max(amax, codec::abs_bits(x[i]));
      const float absmax = bits_as_float(amax);
      if (!codec::finite_abs_bits(amax)) {
        std::memset(qs, 0, m);
      } else {
        const float inv = codec::quant_inv_step(absmax, kQmax);
        if constexpr (R == Rounding::kNearest) {
          for (size_t i = 0; i < m; ++i) qs[i] = static_cast<int8_t>(codec::quantize_nearest(x[i], inv, kQmax));
        } else {
          const uint64_t index = a.index + at;
          const uint32_t lo = static_cast<uint32_t>(index), hi = static_cast<uint32_t>(index >> 32);
          if (lo <= UINT32_MAX - m) {  // the common case, in 32-bit lanes: the block does not cross 2^32
            for (size_t i = 0; i < m; ++i) {
              const float u = codec::uniform01(codec::random_bits32(a.key, lo + static_cast<uint32_t>(i), hi));
              qs[i] = static_cast<int8_t>(codec::quantize_stochastic(x[i], inv, kQmax, u));
            }
          } else {
            for (size_t i = 0; i < m; ++i) {
              const float u = codec::uniform01(codec::random_bits(a.key, index + i));
              qs[i] = static_cast<int8_t>(codec::quantize_stochastic(x[i], inv, kQmax, u));
            }
          }
        }
      }
      std::memcpy(out, &absmax, codec::kScaleBytes);
      uint8_t* payload = out + codec::kScaleBytes;
      if constexpr (K == Kind::kInt8) {
        std::memcpy(payload, qs, m);
      } else {
        const size_t pairs = m / 2;
        for (size_t j = 0; j < pairs; ++j) payload[j] = codec::pack_int4(qs[2 * j], qs[2 * j + 1]);
        if (m & 1) payload[pairs] = codec::pack_int4(qs[m - 1], 0);
      }
      const size_t bytes = codec::kScaleBytes + codec::payload_bytes(K, m);
      if (out2) {
        std::memcpy(out2, out, bytes);
        out2 += bytes;
      }
      out += bytes;
      if (a.residual || a.decoded) {
        const float step = codec::quant_step(absmax, kQmax);
        for (size_t i = 0; i < m; ++i) ds[i] = codec::dequantize(qs[i], absmax, step, kQmax);
        finish_encode(a, at, x, ds, m);
      }
    }
  }

  void decode(const DecodeArgs& a) const override {
    alignas(64) int8_t qs[codec::kMaxBlock];
    alignas(64) float ds[codec::kMaxBlock];
    const uint8_t* in = a.in;
    for (size_t at = 0; at < a.n; at += block_) {
      const size_t m = std::min<size_t>(block_, a.n - at);
      float absmax;
      std::memcpy(&absmax, in, codec::kScaleBytes);
      const uint8_t* payload = in + codec::kScaleBytes;
      const int8_t* q;
      if constexpr (K == Kind::kInt8) {
        q = reinterpret_cast<const int8_t*>(payload);
      } else {
        const size_t bytes = (m + 1) / 2;
        for (size_t j = 0; j < bytes; ++j) {
          qs[2 * j] = static_cast<int8_t>(codec::int4_lo(payload[j]));
          qs[2 * j + 1] = static_cast<int8_t>(codec::int4_hi(payload[j]));
        }
        q = qs;
      }
      const float step = codec::quant_step(absmax, kQmax);
      for (size_t i = 0; i < m; ++i) ds[i] = codec::dequantize(q[i], absmax, step, kQmax);
      finish(a, at, ds, m);
      in += codec::kScaleBytes + codec::payload_bytes(K, m);
    }
  }

 private:
  uint32_t block_;
};

std::shared_ptr<Codec> make_builtin(Kind kind, uint32_t block, Rounding rounding) {
  const bool sr = rounding == Rounding::kStochastic;
  switch (kind) {
    case Kind::kFp16:
      return std::make_shared<CastCodec<Kind::kFp16>>();
    case Kind::kBf16:
      return std::make_shared<CastCodec<Kind::kBf16>>();
    case Kind::kInt8:
      if (sr) return std::make_shared<BlockCodec<Kind::kInt8, Rounding::kStochastic>>(block);
      return std::make_shared<BlockCodec<Kind::kInt8, Rounding::kNearest>>(block);
    case Kind::kInt4:
      if (sr) return std::make_shared<BlockCodec<Kind::kInt4, Rounding::kStochastic>>(block);
      return std::make_shared<BlockCodec<Kind::kInt4, Rounding::kNearest>>(block);
    default:
      return nullptr;
  }
}

}  // namespace pycoll::cpu::PYCOLL_ISA_NS
