// The built-in codecs on the GPU: the same element code (kernels/codec.h), the same order of float
// operations and the same wire formats as the CPU loops (csrc/cpu/codec_loops.h), so encodings, decoded
// values and residuals are the same bits.
//
// Work is cut into "quads", 4 consecutive elements: one 16-byte access of each float array when the
// pointers allow it, else 4 plain ones; a quad at the end of a range may hold fewer than 4 elements.
//
// fp16 / bf16: elementwise, grid-stride over quads after a scalar head that brings `src` (`dst` for
//   decode) to a 16-byte boundary; each thread has two quads in flight.
// int8 / int4: a group of G lanes of one warp per codec block (G a power of two, 1..32, chosen so that
//   each lane has up to kCache = 4 quads: a block of 512 or more takes a whole warp, a block of 64 takes
//   4 lanes and a warp does 8 blocks). Encode: each lane loads its quads (keeping the first kCache in
//   registers) and takes the max of their |x| bit patterns, the group combines these with shuffles, then
//   each lane quantizes its quads and writes their codes (a 32-bit word per int8 quad, 16 bits per int4
//   quad, where the encoding is 4-byte aligned). Blocks of more than G * kCache quads read the quads past
//   the cache a second time (from L1 / L2). Decode: each lane loads up to kCache quads of codes and of
//   acc (+ residual), then dequantizes, accumulates and stores them.
#include <cstring>
#include <initializer_list>
#include <string>

#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace pycoll::cuda {
namespace {

using codec::DecodeArgs;
using codec::EncodeArgs;
using codec::Kind;
using codec::Rounding;
using detail::kThreads;

// ---- quads of floats -----------------------------------------------------------------------------------------
// k (1..4) floats at p into v (0 past k): one 16-byte load when vec (p 16-byte aligned) and k == 4.
__device__ __forceinline__ void load4(const float* p, uint32_t k, bool vec, float (&v)[4]) {
  if (vec && k == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else {
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) v[j] = j < k ? p[j] : 0.0f;
  }
}
__device__ __forceinline__ void store4(float* p, uint32_t k, bool vec, const float (&v)[4]) {
  if (vec && k == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j)
      if (j < k) p[j] = v[j];
  }
}

// v = p[i..i+4) (+ residual[i..i+4)), the first addition of an encode (x = src + residual) and of a
// decode-accumulate (acc + residual).
__device__ __forceinline__ void load_plus_residual(const float* p, const float* residual, size_t i, uint32_t k,
                                                   bool vec, float (&v)[4]) {
  load4(p + i, k, vec, v);
  if (residual) {
    float r[4];
    load4(residual + i, k, vec, r);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = codec::add_rn(v[j], r[j]);
  }
}

// x = src (+ residual): what an encode quantizes.
__device__ __forceinline__ void load_x(const EncodeArgs& a, size_t i, uint32_t k, bool vec, float (&x)[4]) {
  load_plus_residual(a.src, a.residual, i, k, vec, x);
}

// After an encode: residual = scale * (x - decoded) and / or the decoded values (codec_loops.h finish_encode).
__device__ __forceinline__ void finish_encode(const EncodeArgs& a, size_t i, uint32_t k, bool vec, const float (&x)[4],
                                              const float (&d)[4]) {
  if (a.residual) {
    float r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = codec::residual_of(x[j], d[j], a.residual_scale);
    store4(a.residual + i, k, vec, r);
  }
  if (a.decoded) store4(a.decoded + i, k, vec, d);
}

// dst = [acc (+ residual) +] decoded, then / divisor; residual = 0 (codec_loops.h finish_decode). As on the
// CPU, a residual without acc is ignored. load_acc does the first addition, acc + residual, as it loads.
__device__ __forceinline__ void load_acc(const DecodeArgs& a, size_t i, uint32_t k, bool vec, float (&t)[4]) {
  if (a.acc) load_plus_residual(a.acc, a.residual, i, k, vec, t);
}
__device__ __forceinline__ void finish_decode(const DecodeArgs& a, size_t i, uint32_t k, bool vec, const float (&t)[4],
                                              const float (&d)[4]) {
  const float divisor = static_cast<float>(a.divisor);
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = a.acc ? codec::add_rn(t[j], d[j]) : d[j];
    if (a.divisor > 0) v[j] = codec::div_rn(v[j], divisor);
  }
  store4(a.dst + i, k, vec, v);
  if (a.acc && a.residual) {
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    store4(a.residual + i, k, vec, zero);
  }
}

// ---- bytes of the encoding at any alignment --------------------------------------------------------------
__device__ __forceinline__ void store_u16(uint8_t* p, uint16_t v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<uint16_t*>(p) = v;
  } else {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
  }
}
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
__device__ __forceinline__ void store_u32(uint8_t* p, uint32_t v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<uint32_t*>(p) = v;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = static_cast<uint8_t>(v >> (8 * j));
  }
}
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint32_t*>(p);
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// ---- fp16 / bf16 --------------------------------------------------------------------------------------------
template <Kind K>
__device__ __forceinline__ uint16_t to_wire(float x) {
  return K == Kind::kFp16 ? float_to_half(x) : float_to_bf16(x);
}
template <Kind K>
__device__ __forceinline__ float from_wire(uint16_t h) {
  return K == Kind::kFp16 ? half_to_float(h) : bf16_to_float(h);
}

struct CastParams {
  size_t head;    // scalar elements before the quads
  size_t nquads;  // quads after the head (the last may be partial)
  bool vec;       // the quads' float arrays are 16-byte aligned and their wire halves 8-byte aligned
  bool wire2;     // the wire pointers are 2-byte aligned (else byte accesses)
};

// Element range of work item t: one scalar of the head, or one quad.
__device__ __forceinline__ void cast_item(const CastParams& p, size_t n, size_t t, size_t& i, uint32_t& k) {
  if (t < p.head) {
    i = t;
    k = 1;
  } else {
    i = p.head + 4 * (t - p.head);
    k = n - i < 4 ? static_cast<uint32_t>(n - i) : 4u;
  }
}

template <Kind K>
__device__ __forceinline__ void cast_encode_item(const EncodeArgs& a, const CastParams& p, size_t i, uint32_t k,
                                                 bool vec, const float (&x)[4]) {
  uint16_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = to_wire<K>(x[j]);
  if (vec) {  // k == 4: 8 bytes at once
    const uint2 w = make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
    *reinterpret_cast<uint2*>(a.out + 2 * i) = w;
    if (a.out2) *reinterpret_cast<uint2*>(a.out2 + 2 * i) = w;
  } else {
    for (uint32_t j = 0; j < k; ++j) {
      store_u16(a.out + 2 * (i + j), h[j], p.wire2);
      if (a.out2) store_u16(a.out2 + 2 * (i + j), h[j], p.wire2);
    }
  }
  if (a.residual || a.decoded) {
    float d[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) d[j] = from_wire<K>(h[j]);
    finish_encode(a, i, k, vec, x, d);
  }
}

template <Kind K>
__global__ void __launch_bounds__(kThreads) cast_encode_kernel(const EncodeArgs a, const CastParams p) {
  const size_t items = p.head + p.nquads;
  const size_t threads = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t t0 = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; t0 < items; t0 += 2 * threads) {
    const size_t t1 = t0 + threads;
    size_t i0 = 0, i1 = 0;
    uint32_t k0 = 0, k1 = 0;
    cast_item(p, a.n, t0, i0, k0);
    const bool vec0 = p.vec && k0 == 4 && t0 >= p.head;
    float x0[4], x1[4];
    load_x(a, i0, k0, vec0, x0);
    bool vec1 = false;
    if (t1 < items) {  // the second quad's loads go out before the first one's stores
      cast_item(p, a.n, t1, i1, k1);
      vec1 = p.vec && k1 == 4 && t1 >= p.head;
      load_x(a, i1, k1, vec1, x1);
    }
    cast_encode_item<K>(a, p, i0, k0, vec0, x0);
    if (t1 < items) cast_encode_item<K>(a, p, i1, k1, vec1, x1);
  }
}

template <Kind K>
__device__ __forceinline__ void cast_load_wire(const DecodeArgs& a, const CastParams& p, size_t i, uint32_t k, bool vec,
                                               float (&d)[4]) {
  uint16_t h[4] = {0, 0, 0, 0};
  if (vec) {
    const uint2 w = *reinterpret_cast<const uint2*>(a.in + 2 * i);
    h[0] = static_cast<uint16_t>(w.x);
    h[1] = static_cast<uint16_t>(w.x >> 16);
    h[2] = static_cast<uint16_t>(w.y);
    h[3] = static_cast<uint16_t>(w.y >> 16);
  } else {
    for (uint32_t j = 0; j < k; ++j) h[j] = load_u16(a.in + 2 * (i + j), p.wire2);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) d[j] = from_wire<K>(h[j]);
}

template <Kind K>
__global__ void __launch_bounds__(kThreads) cast_decode_kernel(const DecodeArgs a, const CastParams p) {
  const size_t items = p.head + p.nquads;
  const size_t threads = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t t0 = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; t0 < items; t0 += 2 * threads) {
    const size_t t1 = t0 + threads;
    size_t i0 = 0, i1 = 0;
    uint32_t k0 = 0, k1 = 0;
    cast_item(p, a.n, t0, i0, k0);
    const bool vec0 = p.vec && k0 == 4 && t0 >= p.head;
    float d0[4], d1[4];
    float in0[4], in1[4];
    cast_load_wire<K>(a, p, i0, k0, vec0, d0);
    load_acc(a, i0, k0, vec0, in0);
    bool vec1 = false;
    if (t1 < items) {
      cast_item(p, a.n, t1, i1, k1);
      vec1 = p.vec && k1 == 4 && t1 >= p.head;
      cast_load_wire<K>(a, p, i1, k1, vec1, d1);
      load_acc(a, i1, k1, vec1, in1);
    }
    finish_decode(a, i0, k0, vec0, in0, d0);
    if (t1 < items) finish_decode(a, i1, k1, vec1, in1, d1);
  }
}

// The scalar head that brings `f` to a 16-byte boundary, and whether the other float arrays and the wire
// bytes are aligned for quads from there on.
CastParams cast_params(size_t n, const float* f, std::initializer_list<const void*> floats,
                       std::initializer_list<const uint8_t*> wire) {
  CastParams p{};
  p.wire2 = true;
  for (const uint8_t* w : wire) p.wire2 &= !w || detail::aligned(w, 2);
  const size_t head = ((16 - (reinterpret_cast<uintptr_t>(f) & 15)) & 15) / 4;
  bool vec = head < n;
  for (const void* q : floats) vec &= !q || detail::aligned(static_cast<const float*>(q) + head, 16);
  for (const uint8_t* w : wire) vec &= !w || detail::aligned(w + 2 * head, 8);
  p.head = vec ? head : 0;
  p.vec = vec;
  p.nquads = (n - p.head + 3) / 4;
  return p;
}

// Threads a cast kernel wants: one per two work items.
size_t cast_threads(const CastParams& p) {
  return (p.head + p.nquads + 1) / 2;
}

// ---- int8 / int4 --------------------------------------------------------------------------------------------
// Quads per lane kept in registers between the absmax and the quantize pass of an encode (and loaded
// together in a decode): 64 bytes of float32 in flight per lane.
constexpr int kCache = 4;

struct BlockParams {
  uint32_t block;        // elements per codec block
  uint32_t block_bytes;  // encoded bytes of a full block
  uint32_t group;        // lanes per codec block: a power of two, 1..32
  uint32_t group_shift;  // log2(group)
  size_t nblocks;        // codec blocks, the last one may be partial
  bool vec;              // the float arrays are 16-byte aligned (so is every block's first quad)
  bool wire4;            // the encoding is 4-byte aligned (so are its scales and every quad's codes)
};

// Codec block of this lane's group in a tile of 32 / group blocks per warp, and its elements.
struct Lane {
  uint32_t gl;   // lane within the group
  uint32_t gpw;  // groups per warp
  uint32_t gi;   // group within the warp
  size_t warp;   // this warp, over the grid
  size_t warps;  // warps in the grid
};
__device__ __forceinline__ Lane lane_of(const BlockParams& p) {
  const uint32_t lane = threadIdx.x & 31u;
  Lane l;
  l.gl = lane & (p.group - 1);
  l.gi = lane >> p.group_shift;
  l.gpw = 32u >> p.group_shift;
  l.warp = (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  l.warps = (static_cast<size_t>(gridDim.x) * kThreads) >> 5;
  return l;
}

template <Kind K, Rounding R>
__device__ __forceinline__ void encode_quad(const EncodeArgs& a, const BlockParams& p, uint8_t* payload,
                                            uint8_t* payload2, size_t at, uint32_t q, uint32_t k, bool finite,
                                            float absmax, float inv, float step, const float (&x)[4]) {
  constexpr int32_t kQmax = codec::qmax_of(K);
  int32_t c[4] = {0, 0, 0, 0};
  if (finite) {
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
      if (j < k) {
        if constexpr (R == Rounding::kNearest) {
          c[j] = codec::quantize_nearest(x[j], inv, kQmax);
        } else {
          const float u = codec::uniform01(codec::random_bits(a.key, a.index + at + 4 * q + j));
          c[j] = codec::quantize_stochastic(x[j], inv, kQmax, u);
        }
      }
    }
  }
  if constexpr (K == Kind::kInt8) {
    const uint32_t w = (static_cast<uint32_t>(c[0]) & 0xffu) | ((static_cast<uint32_t>(c[1]) & 0xffu) << 8) |
                       ((static_cast<uint32_t>(c[2]) & 0xffu) << 16) | ((static_cast<uint32_t>(c[3]) & 0xffu) << 24);
    if (k == 4) {
      store_u32(payload + 4 * q, w, p.wire4);
      if (payload2) store_u32(payload2 + 4 * q, w, p.wire4);
    } else {
      for (uint32_t j = 0; j < k; ++j) {
        payload[4 * q + j] = static_cast<uint8_t>(w >> (8 * j));
        if (payload2) payload2[4 * q + j] = static_cast<uint8_t>(w >> (8 * j));
      }
    }
  } else {
    // codes past k are 0: a block of odd length pads a zero nibble
    const uint16_t w = static_cast<uint16_t>(codec::pack_int4(c[0], c[1]) | (codec::pack_int4(c[2], c[3]) << 8));
    if (k == 4) {
      store_u16(payload + 2 * q, w, p.wire4);
      if (payload2) store_u16(payload2 + 2 * q, w, p.wire4);
    } else {
      for (uint32_t j = 0; 2 * j < k; ++j) {
        payload[2 * q + j] = static_cast<uint8_t>(w >> (8 * j));
        if (payload2) payload2[2 * q + j] = static_cast<uint8_t>(w >> (8 * j));
      }
    }
  }
  if (a.residual || a.decoded) {
    float d[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) d[j] = codec::dequantize(c[j], absmax, step, kQmax);
    finish_encode(a, at + 4 * q, k, p.vec, x, d);
  }
}

template <Kind K, Rounding R>
__global__ void __launch_bounds__(kThreads, 4) block_encode_kernel(const EncodeArgs a, const BlockParams p) {
  constexpr int32_t kQmax = codec::qmax_of(K);
  const Lane l = lane_of(p);
  // Warp-uniform loop: every lane reaches the shuffles, also those whose group has no block left.
  for (size_t tile = l.warp; tile * l.gpw < p.nblocks; tile += l.warps) {
    const size_t blk = tile * l.gpw + l.gi;
    const bool active = blk < p.nblocks;
    const size_t at = blk * p.block;
    const uint32_t m = active ? static_cast<uint32_t>(a.n - at < p.block ? a.n - at : p.block) : 0u;
    const uint32_t nq = (m + 3) / 4;
    auto count = [&](uint32_t q) { return m - 4 * q < 4 ? m - 4 * q : 4u; };

    // absmax: the integer max of the |x| bit patterns (NaN > Inf > every finite value), as on the CPU
    float xc[kCache][4];
    uint32_t amax = 0;
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const uint32_t q = l.gl + c * p.group;
      if (q < nq) {
        load_x(a, at + 4 * q, count(q), p.vec, xc[c]);
#pragma unroll
        for (int j = 0; j < 4; ++j) amax = max(amax, codec::abs_bits(xc[c][j]));
      }
    }
    for (uint32_t q = l.gl + kCache * p.group; q < nq; q += p.group) {
      float x[4];
      load_x(a, at + 4 * q, count(q), p.vec, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = max(amax, codec::abs_bits(x[j]));
    }
    for (uint32_t off = p.group >> 1; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (!active) continue;

    const float absmax = bits_as_float(amax);
    const bool finite = codec::finite_abs_bits(amax);
    const float inv = finite ? codec::quant_inv_step(absmax, kQmax) : 0.0f;
    const float step = codec::quant_step(absmax, kQmax);
    uint8_t* out = a.out + blk * p.block_bytes;
    uint8_t* out2 = a.out2 ? a.out2 + blk * p.block_bytes : nullptr;
    if (l.gl == 0) {
      store_u32(out, amax, p.wire4);
      if (out2) store_u32(out2, amax, p.wire4);
    }
    uint8_t* payload = out + codec::kScaleBytes;
    uint8_t* payload2 = out2 ? out2 + codec::kScaleBytes : nullptr;
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const uint32_t q = l.gl + c * p.group;
      if (q < nq) encode_quad<K, R>(a, p, payload, payload2, at, q, count(q), finite, absmax, inv, step, xc[c]);
    }
    for (uint32_t q = l.gl + kCache * p.group; q < nq; q += p.group) {
      float x[4];
      load_x(a, at + 4 * q, count(q), p.vec, x);
      encode_quad<K, R>(a, p, payload, payload2, at, q, count(q), finite, absmax, inv, step, x);
    }
  }
}

// The k codes of quad q of a block's payload, as one word: 4 bytes (int8) or 2 (int4), little-endian.
template <Kind K>
__device__ __forceinline__ uint32_t load_codes(const uint8_t* payload, uint32_t q, uint32_t k, bool wire4) {
  uint32_t w = 0;
  if constexpr (K == Kind::kInt8) {
    if (k == 4) return load_u32(payload + 4 * q, wire4);
    for (uint32_t j = 0; j < k; ++j) w |= static_cast<uint32_t>(payload[4 * q + j]) << (8 * j);
  } else {
    if (k == 4) return load_u16(payload + 2 * q, wire4);
    for (uint32_t j = 0; 2 * j < k; ++j) w |= static_cast<uint32_t>(payload[2 * q + j]) << (8 * j);
  }
  return w;
}

template <Kind K>
__device__ __forceinline__ void dequantize_quad(uint32_t w, float absmax, float step, float (&d)[4]) {
  constexpr int32_t kQmax = codec::qmax_of(K);
  int32_t c[4];
  if constexpr (K == Kind::kInt8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = static_cast<int8_t>(static_cast<uint8_t>(w >> (8 * j)));
  } else {
    c[0] = codec::int4_lo(static_cast<uint8_t>(w));
    c[1] = codec::int4_hi(static_cast<uint8_t>(w));
    c[2] = codec::int4_lo(static_cast<uint8_t>(w >> 8));
    c[3] = codec::int4_hi(static_cast<uint8_t>(w >> 8));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) d[j] = codec::dequantize(c[j], absmax, step, kQmax);
}

template <Kind K>
__global__ void __launch_bounds__(kThreads, 3) block_decode_kernel(const DecodeArgs a, const BlockParams p) {
  constexpr int32_t kQmax = codec::qmax_of(K);
  const Lane l = lane_of(p);
  for (size_t tile = l.warp; tile * l.gpw < p.nblocks; tile += l.warps) {
    const size_t blk = tile * l.gpw + l.gi;
    if (blk >= p.nblocks) continue;
    const size_t at = blk * p.block;
    const uint32_t m = static_cast<uint32_t>(a.n - at < p.block ? a.n - at : p.block);
    const uint32_t nq = (m + 3) / 4;
    auto count = [&](uint32_t q) { return m - 4 * q < 4 ? m - 4 * q : 4u; };
    const uint8_t* in = a.in + blk * p.block_bytes;
    const float absmax = bits_as_float(load_u32(in, p.wire4));
    const float step = codec::quant_step(absmax, kQmax);
    const uint8_t* payload = in + codec::kScaleBytes;
    // up to kCache quads per step, all loaded before any is stored
    for (uint32_t q0 = l.gl; q0 < nq; q0 += kCache * p.group) {
      uint32_t w[kCache];
      float t[kCache][4];
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const uint32_t q = q0 + c * p.group;
        if (q < nq) {
          w[c] = load_codes<K>(payload, q, count(q), p.wire4);
          load_acc(a, at + 4 * q, count(q), p.vec, t[c]);
        }
      }
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const uint32_t q = q0 + c * p.group;
        if (q < nq) {
          float d[4];
          dequantize_quad<K>(w[c], absmax, step, d);
          finish_decode(a, at + 4 * q, count(q), p.vec, t[c], d);
        }
      }
    }
  }
}

BlockParams block_params(Kind kind, uint32_t block, size_t n, std::initializer_list<const void*> floats,
                         std::initializer_list<const uint8_t*> wire) {
  BlockParams p{};
  p.block = block;
  p.block_bytes = static_cast<uint32_t>(codec::encoded_bytes(kind, block, block));
  p.nblocks = (n + block - 1) / block;
  // lanes per block: up to kCache quads each (64 bytes of float32 in flight per lane), but no more lanes
  // than the block has quads
  const uint32_t quads = block / 4;
  uint32_t g = 1, shift = 0;
  while (g < 32 && kCache * g < quads) {
    g *= 2;
    ++shift;
  }
  p.group = g;
  p.group_shift = shift;
  p.vec = true;
  for (const void* f : floats) p.vec &= !f || detail::aligned(f, 16);
  p.wire4 = true;
  for (const uint8_t* w : wire) p.wire4 &= !w || detail::aligned(w, 4);
  return p;
}

// Threads a block-codec kernel wants: a warp per 32 / group codec blocks.
size_t block_threads(const BlockParams& p) {
  const size_t gpw = 32u >> p.group_shift;
  return (p.nblocks + gpw - 1) / gpw * 32;
}

}  // namespace

void check_codec(const CodecSpec& s) {
  switch (s.kind) {
    case Kind::kFp16:
    case Kind::kBf16:
      break;
    case Kind::kInt8:
    case Kind::kInt4:
      if (s.block < codec::kMinBlock || s.block > codec::kMaxBlock || s.block % 8 != 0)
        throw Error(ErrorKind::kInvalidUsage,
                    "codec block must be a multiple of 8 in [" + std::to_string(codec::kMinBlock) + ", " +
                        std::to_string(codec::kMaxBlock) + "], got " + std::to_string(s.block));
      break;
    default:
      throw Error(ErrorKind::kInvalidUsage,
                  "the GPU codecs are fp16, bf16, int8 and int4; got kind code " + std::to_string(int(s.kind)));
  }
  if (s.rounding != Rounding::kNearest && s.rounding != Rounding::kStochastic)
    throw Error(ErrorKind::kInvalidUsage, "unknown rounding code " + std::to_string(int(s.rounding)));
}

namespace {

// "int8(block=64, stochastic)": the codec a launch ran, for its error.
std::string codec_name(const CodecSpec& s) {
  switch (s.kind) {
    case Kind::kFp16:
      return "fp16";
    case Kind::kBf16:
      return "bf16";
    default:
      return std::string(s.kind == Kind::kInt8 ? "int8" : "int4") + "(block=" + std::to_string(s.block) +
             (s.rounding == Rounding::kStochastic ? ", stochastic)" : ")");
  }
}

}  // namespace

void encode(const CodecSpec& spec, const EncodeArgs& a, cudaStream_t stream) {
  check_codec(spec);
  if (a.n == 0) return;
  detail::check_pointer(a.src, "src", 4, true);
  detail::check_pointer(a.residual, "residual", 4, false);
  detail::check_pointer(a.decoded, "decoded", 4, false);
  detail::check_pointer(a.out, "out", 1, true);
  detail::check_pointer(a.out2, "out2", 1, false);
  const bool sr = spec.rounding == Rounding::kStochastic;
  const auto name = [&] { return "encode(" + codec_name(spec) + ")"; };
  switch (spec.kind) {
    case Kind::kFp16:
    case Kind::kBf16: {
      const CastParams p = cast_params(a.n, a.src, {a.residual, a.decoded}, {a.out, a.out2});
      if (spec.kind == Kind::kFp16) {
        detail::launch(name, cast_encode_kernel<Kind::kFp16>, cast_threads(p), stream, a, p);
      } else {
        detail::launch(name, cast_encode_kernel<Kind::kBf16>, cast_threads(p), stream, a, p);
      }
      break;
    }
    case Kind::kInt8:
    case Kind::kInt4: {
      const BlockParams p = block_params(spec.kind, spec.block, a.n, {a.src, a.residual, a.decoded}, {a.out, a.out2});
      if (spec.kind == Kind::kInt8) {
        if (sr) {
          detail::launch(name, block_encode_kernel<Kind::kInt8, Rounding::kStochastic>, block_threads(p), stream, a, p);
        } else {
          detail::launch(name, block_encode_kernel<Kind::kInt8, Rounding::kNearest>, block_threads(p), stream, a, p);
        }
      } else if (sr) {
        detail::launch(name, block_encode_kernel<Kind::kInt4, Rounding::kStochastic>, block_threads(p), stream, a, p);
      } else {
        detail::launch(name, block_encode_kernel<Kind::kInt4, Rounding::kNearest>, block_threads(p), stream, a, p);
      }
      break;
    }
    default:
      break;
  }
}

void decode(const CodecSpec& spec, const DecodeArgs& a, cudaStream_t stream) {
  check_codec(spec);
  if (a.n == 0) return;
  detail::check_pointer(a.dst, "dst", 4, true);
  detail::check_pointer(a.acc, "acc", 4, false);
  detail::check_pointer(a.residual, "residual", 4, false);
  detail::check_pointer(a.in, "in", 1, true);
  const auto name = [&] { return "decode(" + codec_name(spec) + ")"; };
  switch (spec.kind) {
    case Kind::kFp16:
    case Kind::kBf16: {
      const CastParams p = cast_params(a.n, a.dst, {a.acc, a.residual}, {a.in});
      if (spec.kind == Kind::kFp16) {
        detail::launch(name, cast_decode_kernel<Kind::kFp16>, cast_threads(p), stream, a, p);
      } else {
        detail::launch(name, cast_decode_kernel<Kind::kBf16>, cast_threads(p), stream, a, p);
      }
      break;
    }
    case Kind::kInt8:
    case Kind::kInt4: {
      const BlockParams p = block_params(spec.kind, spec.block, a.n, {a.dst, a.acc, a.residual}, {a.in});
      if (spec.kind == Kind::kInt8) {
        detail::launch(name, block_decode_kernel<Kind::kInt8>, block_threads(p), stream, a, p);
      } else {
        detail::launch(name, block_decode_kernel<Kind::kInt4>, block_threads(p), stream, a, p);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace pycoll::cuda
