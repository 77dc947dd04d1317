// The built-in codec loops, compiled once per instruction set: codec_base.cc and codec_avx2.cc include
// this file with PYCOLL_ISA_NS set to a namespace of their own. Each loop works block by block, so the
// block being quantized stays in L1 between its absmax pass and its quantize pass; the inner loops are
// branch-free over plain arrays so that the compiler vectorizes them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#if defined(__SSE2__) || defined(__F16C__)
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

// ---- int4 nibbles, 16 bytes at a time where SSE2 is there (every x86-64) -------------------------------------
// codes[2j] and codes[2j+1] <-> the low and high nibble of payload[j], for n codes (n even).
static inline void pack_int4_codes(const int8_t* codes, uint8_t* payload, size_t n) {
  size_t j = 0;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi16(0x000f), high = _mm_set1_epi16(0x00f0);
  for (; 2 * j + 32 <= n; j += 16) {  // 32 codes -> 16 bytes; a 16-bit lane holds one pair
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * j));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * j + 16));
    const __m128i pa = _mm_or_si128(_mm_and_si128(a, low), _mm_and_si128(_mm_srli_epi16(a, 4), high));
    const __m128i pb = _mm_or_si128(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(payload + j), _mm_packus_epi16(pa, pb));
  }
#endif
  for (; 2 * j < n; ++j) payload[j] = codec::pack_int4(codes[2 * j], codes[2 * j + 1]);
}

static inline void unpack_int4_codes(const uint8_t* payload, int8_t* codes, size_t n) {
  size_t j = 0;
#if defined(__SSE2__)
  const __m128i nibble = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  for (; 2 * j + 32 <= n; j += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload + j));
    const __m128i lo = _mm_and_si128(v, nibble);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), nibble);
    // interleave back into element order, then sign-extend the 4-bit values: (x ^ 8) - 8
    const __m128i a = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    const __m128i b = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * j), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * j + 16), b);
  }
#endif
  for (; 2 * j < n; ++j) {
    codes[2 * j] = static_cast<int8_t>(codec::int4_lo(payload[j]));
    codes[2 * j + 1] = static_cast<int8_t>(codec::int4_hi(payload[j]));
  }
}

// ---- int8 / int4 with a float32 absmax per block ------------------------------------------------------------
// kFixed > 0 compiles the loops for that block size (constant trip counts, no epilogues: small blocks
// would otherwise spend much of their time in loop overhead); 0 takes the block size at run time.
template <Kind K, Rounding R, uint32_t kFixed>
class BlockCodec final : public Codec {
  static constexpr int32_t kQmax = codec::qmax_of(K);
  using Fixed = std::integral_constant<size_t, kFixed>;

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
    uint8_t* out = a.out;
    uint8_t* out2 = a.out2;
    size_t at = 0;
    if constexpr (kFixed > 0) {
      for (; at + kFixed <= a.n; at += kFixed) encode_block(a, at, Fixed{}, out, out2);
    }
    for (; at < a.n; at += block_) encode_block(a, at, std::min<size_t>(block_, a.n - at), out, out2);
  }

  void decode(const DecodeArgs& a) const override {
    // Blocks are decoded into a piece of several blocks, then accumulated and stored in one pass.
    alignas(64) float ds[codec::kMaxBlock];
    const size_t piece = codec::kMaxBlock / block_ * block_;
    const uint8_t* in = a.in;
    for (size_t at = 0; at < a.n; at += piece) {
      const size_t m = std::min(piece, a.n - at);
      size_t i = 0;
      if constexpr (kFixed > 0) {
        for (; i + kFixed <= m; i += kFixed) in = decode_block(in, ds + i, Fixed{});
      }
      for (; i < m; i += block_) in = decode_block(in, ds + i, std::min<size_t>(block_, m - i));
      finish(a, at, ds, m);
    }
  }

 private:
  template <class M>
  void encode_block(const EncodeArgs& a, size_t at, M m, uint8_t*& out, uint8_t*& out2) const {
    alignas(64) float xs[codec::kMaxBlock];
    alignas(64) int8_t qs[codec::kMaxBlock + 32];
    alignas(64) float ds[codec::kMaxBlock];
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
      if (m & 1) qs[m] = 0;  // a block of odd length pads a zero nibble
      pack_int4_codes(qs, payload, m + (m & 1));
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

  // Decodes one block of m elements at `in` into d; returns where the next block starts.
  template <class M>
  static const uint8_t* decode_block(const uint8_t* in, float* d, M m) {
    alignas(64) int8_t qs[codec::kMaxBlock + 32];
    float absmax;
    std::memcpy(&absmax, in, codec::kScaleBytes);
    const uint8_t* payload = in + codec::kScaleBytes;
    const int8_t* q;
    if constexpr (K == Kind::kInt8) {
      q = reinterpret_cast<const int8_t*>(payload);
    } else {
      unpack_int4_codes(payload, qs, m + (m & 1));
      q = qs;
    }
    const float step = codec::quant_step(absmax, kQmax);
    size_t i = 0;
#if defined(__AVX2__)
    i = m / 8 * 8;
    dequantize_avx2(q, d, i, absmax, step);
#endif
    for (; i < m; ++i) d[i] = codec::dequantize(q[i], absmax, step, kQmax);
    return in + codec::kScaleBytes + codec::payload_bytes(K, m);
  }

#if defined(__AVX2__)
  // codec::dequantize eight codes at a time (the same operations, so the same bits); m is a multiple of 8.
  static void dequantize_avx2(const int8_t* q, float* d, size_t m, float absmax, float step) {
    const __m256 vstep = _mm256_set1_ps(step), vmax = _mm256_set1_ps(absmax), vmin = _mm256_set1_ps(-absmax);
    const __m256 lim = _mm256_set1_ps(static_cast<float>(kQmax)), nlim = _mm256_set1_ps(-static_cast<float>(kQmax));
    for (size_t i = 0; i < m; i += 8) {
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
      const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
      __m256 v = _mm256_mul_ps(qf, vstep);
      v = _mm256_blendv_ps(v, vmax, _mm256_cmp_ps(qf, lim, _CMP_EQ_OQ));
      v = _mm256_blendv_ps(v, vmin, _mm256_cmp_ps(qf, nlim, _CMP_EQ_OQ));
      _mm256_storeu_ps(d + i, v);
    }
  }
#endif

  uint32_t block_;
};

template <Kind K, Rounding R>
std::shared_ptr<Codec> make_block_codec(uint32_t block) {
  switch (block) {  // the sizes worth compiling loops for: the defaults and their neighbours
    case 16:
      return std::make_shared<BlockCodec<K, R, 16>>(block);
    case 32:
      return std::make_shared<BlockCodec<K, R, 32>>(block);
    case 64:
      return std::make_shared<BlockCodec<K, R, 64>>(block);
    case 128:
      return std::make_shared<BlockCodec<K, R, 128>>(block);
    case 256:
      return std::make_shared<BlockCodec<K, R, 256>>(block);
    default:
      return std::make_shared<BlockCodec<K, R, 0>>(block);
  }
}

std::shared_ptr<Codec> make_builtin(Kind kind, uint32_t block, Rounding rounding) {
  const bool sr = rounding == Rounding::kStochastic;
  switch (kind) {
    case Kind::kFp16:
      return std::make_shared<CastCodec<Kind::kFp16>>();
    case Kind::kBf16:
      return std::make_shared<CastCodec<Kind::kBf16>>();
    case Kind::kInt8:
      if (sr) return make_block_codec<Kind::kInt8, Rounding::kStochastic>(block);
      return make_block_codec<Kind::kInt8, Rounding::kNearest>(block);
    case Kind::kInt4:
      if (sr) return make_block_codec<Kind::kInt4, Rounding::kStochastic>(block);
      return make_block_codec<Kind::kInt4, Rounding::kNearest>(block);
    default:
      return nullptr;
  }
}

}  // namespace pycoll::cpu::PYCOLL_ISA_NS
