// The kernel sweep: the real CUDA kernels (csrc/cuda, through the CPU emulation) against the CPU loops
// (csrc/cpu, the oracle), bit for bit, over every dtype, op and codec, sizes from 0 to several multiples of
// what one block covers per grid-stride step, byte offsets 0, 2, 4, 8 and 12 (and the odd ones where
// bytes may start anywhere), every variant of the optional outputs, on three emulated devices and
// schedules, with every buffer exactly sized against guard pages (guarded.h). Built twice by
// tests/kernels/CMakeLists.txt: with AddressSanitizer and UBSan (alignment and float-cast checks on), and
// as the shadow-map build (shadow.h), which also flags an output byte written twice or never.
//
//   kernel_sweep [--quick]     self-tests of the emulation, then the sweep; a table of what ran.
//
// Names used below:
//   case     one kernel call's inputs and arguments, checked on every device
//   device   an emulated device and schedule (kDevices): one block looping over everything, a few blocks
//            in reversed order, a wide device with one work item per thread in a seeded random order
//   oracle   the CPU loop's result for the case, computed once
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "cpu/codec.h"
#include "cpu/reduce.h"
#include "cpu/rotation.h"
#include "cuda/emulation/emulation.h"
#include "cuda/kernels.h"
#include "guarded.h"
#include "pycoll/errors.h"
#include "shadow.h"

namespace pycoll::kernel_tests {
namespace {

using codec::Kind;
using codec::Rounding;
using emulation::DeviceShape;
using emulation::Order;
using emulation::Schedule;

struct Device {
  const char* name;
  DeviceShape shape;
  Order order;
  uint8_t poison;  // what outputs hold before the call
};
const Device kDevices[] = {
    {"1 SM x 1 block, in order", {1, 1, 1024}, Order::kInOrder, 0xFF},
    {"2 SMs x 3 blocks, reversed", {2, 3, 1024}, Order::kReversed, 0x00},
    {"4096 SMs x 8 blocks, random", {4096, 8, 1024}, Order::kRandom, 0x5A},
};

// ---- data ----------------------------------------------------------------------------------------------------
struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  uint64_t bits() { return g(); }
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(g); }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(g); }
  uint64_t below(uint64_t n) { return n ? g() % n : 0; }
};

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Per codec block: gaussian at scales from 1e-38 to 1e38 (some overflowing to Inf), zeros (some -0), exact
// ties of the int8 / int4 grids, float32 subnormals, fp16 / bf16 rounding ties, or a block poisoned with
// NaN / +-Inf; an unusual NaN payload somewhere.
std::vector<float> codec_data(size_t n, uint32_t block, Rng& r) {
  std::vector<float> x(n);
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t b1 = std::min(n, b0 + block);
    const uint64_t kind = r.below(9);
    const double scale = std::pow(10.0, -38.0 + 76.6 * r.uniform());
    const int qmax = r.below(2) ? 127 : 7;
    for (size_t i = b0; i < b1; ++i) {
      switch (kind) {
        case 1:
          x[i] = r.below(5) ? 0.0f : -0.0f;
          break;
        case 2:
          x[i] = i == b0 ? static_cast<float>(qmax)
                         : static_cast<float>(
                               std::clamp<double>((static_cast<double>(r.below(509)) - 254) / 2.0, -qmax, qmax));
          break;
        case 3:
          x[i] = bits_float(static_cast<uint32_t>(1 + r.below((1u << 23) - 1)) | (r.below(2) ? 0x80000000u : 0u));
          break;
        case 4:
          x[i] = bits_float((static_cast<uint32_t>(0x38800000u + r.below(0x47000000u - 0x38800000u)) & ~0xFFFFu) |
                            (r.below(2) ? 0x1000u : 0x8000u));
          break;
        default:
          x[i] = static_cast<float>(r.normal() * scale);
      }
    }
    if (kind == 5) {
      const float specials[] = {NAN, INFINITY, -INFINITY};
      x[b0 + r.below(b1 - b0)] = specials[r.below(3)];
    }
  }
  if (n > 10) x[r.below(n)] = bits_float(0xFFA00001u);
  return x;
}

// Bytes of n elements of a dtype: ordinary numbers and, mixed in, raw bit patterns (NaN, Inf, subnormals,
// -0, integer extremes that wrap).
std::vector<uint8_t> reduce_data(DType dt, size_t n, Rng& r) {
  const size_t es = dtype_size(dt);
  std::vector<uint8_t> v(n * es);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = v.data() + i * es;
    if (r.below(10) < 3) {
      const uint64_t raw = r.bits();
      std::memcpy(p, &raw, es);
      continue;
    }
    const double g = r.normal() * std::pow(10.0, static_cast<double>(r.below(7)) - 3.0);
    const int64_t k = static_cast<int64_t>(r.below(40)) - 20;
    switch (dt) {
      case DType::kFloat32: {
        const float f = static_cast<float>(g);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kFloat64:
        std::memcpy(p, &g, 8);
        break;
      case DType::kFloat16: {
        const uint16_t h = float_to_half(static_cast<float>(g * 100));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = float_to_bf16(static_cast<float>(g));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kUInt8:
        *p = static_cast<uint8_t>(k + 20);
        break;
      default:
        std::memcpy(p, &k, es);  // little-endian: the low bytes of k
    }
  }
  return v;
}

// ---- comparisons ------------------------------------------------------------------------------------------
enum class Fmt { kBytes, kF16, kBF16, kF32, kF64, kInt };

Fmt fmt_of(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return Fmt::kF32;
    case DType::kFloat64:
      return Fmt::kF64;
    case DType::kFloat16:
      return Fmt::kF16;
    case DType::kBFloat16:
      return Fmt::kBF16;
    default:
      return Fmt::kInt;
  }
}

bool is_nan(Fmt f, uint64_t bits) {
  switch (f) {
    case Fmt::kF16:
      return (bits & 0x7FFF) > 0x7C00;
    case Fmt::kBF16:
      return (bits & 0x7FFF) > 0x7F80;
    case Fmt::kF32:
      return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    case Fmt::kF64:
      return (bits & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    default:
      return false;
  }
}

// Same bits, but that a NaN matches any NaN (tests/kernel_checks.py says why).
std::string differs(const void* got, const void* want, size_t n, size_t es, Fmt f, const char* what) {
  const uint8_t* g = static_cast<const uint8_t*>(got);
  const uint8_t* w = static_cast<const uint8_t*>(want);
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, g + i * es, es);
    std::memcpy(&b, w + i * es, es);
    if (a == b || (is_nan(f, a) && is_nan(f, b))) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: element %zu of %zu is 0x%llx, the CPU's 0x%llx", what, i, n,
                  static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
    return buf;
  }
  return std::string();
}

// An encoding: its float32 scales with the NaN rule, every other byte exactly.
std::string encoding_differs(Kind kind, uint32_t block, size_t n, const uint8_t* got, const uint8_t* want) {
  const size_t bytes = codec::encoded_bytes(kind, block, n);
  if (kind == Kind::kFp16 || kind == Kind::kBf16)
    return differs(got, want, n, 2, kind == Kind::kFp16 ? Fmt::kF16 : Fmt::kBF16, "the encoding");
  const size_t bb = codec::encoded_bytes(kind, block, block);
  for (size_t at = 0; at < bytes; at += bb) {
    std::string d = differs(got + at, want + at, 1, 4, Fmt::kF32, "a block's scale");
    if (!d.empty()) return d + " (block " + std::to_string(at / bb) + ")";
    const size_t end = std::min(bytes, at + bb);
    d = differs(got + at + 4, want + at + 4, end - at - 4, 1, Fmt::kBytes, "a block's codes");
    if (!d.empty()) return d + " (block " + std::to_string(at / bb) + ")";
  }
  return std::string();
}

// ---- the sweep --------------------------------------------------------------------------------------------
struct Tally {
  uint64_t cases = 0, launches = 0;
  double seconds = 0;
};

struct Spec {
  Kind kind;
  uint32_t block;
  Rounding rounding;
  std::string name() const {
    if (kind == Kind::kFp16) return "fp16";
    if (kind == Kind::kBf16) return "bf16";
    return std::string(kind == Kind::kInt8 ? "int8" : "int4") + "(block=" + std::to_string(block) +
           (rounding == Rounding::kStochastic ? ", stochastic)" : ")");
  }
  bool cast() const { return kind == Kind::kFp16 || kind == Kind::kBf16; }
};

class Sweep {
 public:
  explicit Sweep(bool quick) : quick_(quick) {}
  void reduce_all();
  void encode_all();
  void decode_all();
  void rotate_all();
  void bad_input();
  void report(int selftests, double selftest_seconds) const;

 private:
  // Runs `call` on every device (its arguments placed by `place`), then `check`; throws Failure naming the
  // case and the device. The shadow map tracks what `place` registered.
  template <class Place, class Call, class Check>
  void on_devices(Tally& t, const std::string& what, Place place, Call call, Check check);
  uint8_t* buffer(int slot, size_t n, size_t offset, uint8_t fill, shadow::Use use, const char* name);
  uint8_t* input(int slot, const void* data, size_t n, size_t offset, shadow::Use use, const char* name);

  std::vector<Spec> specs() const;
  template <class Case>
  void codec_cases(uint64_t salt, int variants, Case run);
  std::vector<size_t> reduce_sizes(size_t es) const;
  std::vector<size_t> codec_sizes(const Spec& s) const;
  void reduce_case(DType dt, RedOp op, size_t n, const size_t (&off)[3], bool dst2, bool in_place, int divisor, Rng& r);
  void encode_case(const Spec& s, size_t n, int variant, size_t foff, size_t woff, Rng& r);
  void decode_case(const Spec& s, size_t n, int variant, size_t foff, size_t woff, bool arbitrary, Rng& r);
  void rotate_case(uint32_t block, size_t part, size_t parts, bool inverse, size_t off, Rng& r);

  bool quick_;
  Arena arena_;
  const Device* device_ = nullptr;
  bool at_tail_ = false;
  Tally reduce_, encode_, decode_, rotate_, bad_;
};

uint8_t* Sweep::buffer(int slot, size_t n, size_t offset, uint8_t fill, shadow::Use use, const char* name) {
  uint8_t* p = arena_.place(slot, n, offset, at_tail_, fill);
  shadow::track(p, n, use, name);
  return p;
}

uint8_t* Sweep::input(int slot, const void* data, size_t n, size_t offset, shadow::Use use, const char* name) {
  uint8_t* p = buffer(slot, n, offset, 0, use, name);
  if (n) std::memcpy(p, data, n);
  return p;
}

template <class Place, class Call, class Check>
void Sweep::on_devices(Tally& t, const std::string& what, Place place, Call call, Check check) {
  const auto start = std::chrono::steady_clock::now();
  ++t.cases;
  for (const Device& d : kDevices) {
    device_ = &d;
    emulation::use_device(d.shape, Schedule{d.order, t.cases});
    at_tail_ = ((t.cases + static_cast<uint64_t>(&d - kDevices)) & 1) != 0;
    shadow::reset();
    place();
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    arena_.ranges(ranges);
    shadow::set_arena(ranges);
    std::string problem;
    try {
      call();
      ++t.launches;
      problem = check();
    } catch (const Error& e) {
      problem = std::string("the call threw: ") + e.what();
    }
    if (problem.empty()) problem = arena_.damaged();
    if (problem.empty()) problem = shadow::verdict();
    if (!problem.empty())
      throw Failure(what + " on " + d.name + (at_tail_ ? " (buffers at the trailing guard)" : "") + ": " + problem);
  }
  t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Elements from 0 to 17, around a warp, and around 1 to 3 times what one block of the first device covers
// per grid-stride step (256 threads x 2 vectors of 16 bytes), +-1 and +1 vector.
std::vector<size_t> Sweep::reduce_sizes(size_t es) const {
  const size_t v = 16 / es, step = 256 * 2 * v;
  std::vector<size_t> n;
  for (size_t i = 0; i <= 17; ++i) n.push_back(i);
  for (size_t i : {31, 32, 33}) n.push_back(i);
  n.push_back(8 * v + 1);
  for (size_t m = 1; m <= (quick_ ? 1u : 3u); ++m)
    for (long d : {-1L, 0L, 1L, static_cast<long>(v) + 1}) n.push_back(m * step + d);
  return n;
}

void Sweep::reduce_case(DType dt, RedOp op, size_t n, const size_t (&off)[3], bool with_dst2, bool in_place,
                        int divisor, Rng& r) {
  const size_t es = dtype_size(dt), bytes = n * es;
  const std::vector<uint8_t> a = reduce_data(dt, n, r), b = reduce_data(dt, n, r);
  std::vector<uint8_t> want(bytes);
  cpu::reduce_fn(dt, op)(want.data(), nullptr, a.data(), b.data(), n, divisor, false);
  uint8_t *pa = nullptr, *pb = nullptr, *pd = nullptr, *pd2 = nullptr;
  const std::string what = std::string("reduce(") + dtype_name(dt) + ", " + redop_name(op) +
                           ") n=" + std::to_string(n) + " offsets dst/a/b " + std::to_string(off[0]) + "/" +
                           std::to_string(off[1]) + "/" + std::to_string(off[2]) + (with_dst2 ? " dst2" : "") +
                           (in_place ? " in place" : "") + " divisor " + std::to_string(divisor);
  on_devices(
      reduce_, what,
      [&] {
        pa = input(0, a.data(), bytes, off[1], in_place ? shadow::Use::kInOut : shadow::Use::kIn, "a");
        pb = input(1, b.data(), bytes, off[2], shadow::Use::kIn, "b");
        pd = in_place ? pa : buffer(2, bytes, off[0], device_->poison, shadow::Use::kOut, "dst");
        pd2 = with_dst2 ? buffer(3, bytes, off[0], device_->poison, shadow::Use::kOut, "dst2") : nullptr;
      },
      [&] { cuda::reduce(dt, op, pd, pd2, pa, pb, n, divisor, nullptr); },
      [&] {
        std::string d = differs(pd, want.data(), n, es, fmt_of(dt), "dst");
        if (d.empty() && pd2) d = differs(pd2, want.data(), n, es, fmt_of(dt), "dst2");
        if (d.empty() && bytes && std::memcmp(pb, b.data(), bytes) != 0) d = "b changed";
        if (d.empty() && bytes && !in_place && std::memcmp(pa, a.data(), bytes) != 0) d = "a changed";
        return d;
      });
}

void Sweep::reduce_all() {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                          DType::kInt32,   DType::kInt64,   DType::kUInt8,   DType::kInt8};
  const RedOp ops[] = {RedOp::kSum, RedOp::kAvg, RedOp::kMin, RedOp::kMax, RedOp::kProd};
  for (DType dt : dtypes) {
    const size_t es = dtype_size(dt);
    // Offsets of (dst, a, b): all at one offset, or one pointer off the others' 16-byte boundary.
    std::vector<size_t> offsets;
    for (size_t o : {0, 1, 2, 3, 4, 8, 12})
      if (o % es == 0) offsets.push_back(o);
    std::vector<std::array<size_t, 3>> combos;
    for (size_t o : offsets) combos.push_back({o, o, o});
    for (size_t o : offsets)
      if (o) {
        combos.push_back({o, 0, 0});
        combos.push_back({0, o, 0});
        combos.push_back({0, 0, o});
      }
    for (RedOp op : ops) {
      Rng r(static_cast<uint64_t>(dt) * 16 + static_cast<uint64_t>(op));
      size_t k = 0;
      for (size_t n : reduce_sizes(es)) {
        // a rotating window of the combinations, so that every one meets small and large sizes
        for (size_t j = 0; j < (quick_ ? 2u : 4u); ++j, ++k) {
          const auto& c = combos[k % combos.size()];
          const size_t off[3] = {c[0], c[1], c[2]};
          const bool in_place = k % 5 == 4 && off[0] == off[1];
          const int divisor = op == RedOp::kAvg ? 3 : (k % 7 == 3 ? 5 : 0);
          reduce_case(dt, op, n, off, k % 2 == 1, in_place, divisor, r);
        }
      }
    }
  }
}

// Every built-in codec: block sizes from 8 to 4096 whose lane groups are 1, 2, 4, 8, 16 and 32 lanes
// (csrc/cuda/codec.cu: up to 4 quads a lane), and blocks that are not powers of two.
std::vector<Spec> Sweep::specs() const {
  std::vector<Spec> s = {{Kind::kFp16, 0, Rounding::kNearest}, {Kind::kBf16, 0, Rounding::kNearest}};
  const uint32_t blocks_full[] = {8, 16, 24, 32, 40, 64, 72, 128, 136, 256, 264, 512, 520, 1024, 4096};
  const uint32_t blocks_quick[] = {8, 24, 64, 256, 520, 4096};
  for (Kind k : {Kind::kInt8, Kind::kInt4})
    for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
      if (quick_) {
        for (uint32_t b : blocks_quick) s.push_back({k, b, r});
      } else {
        for (uint32_t b : blocks_full) s.push_back({k, b, r});
      }
    }
  return s;
}

// 0 to 9, around a block, and around one and two passes of one block of 8 warps over the codec blocks
// (the first device's grid-stride step).
std::vector<size_t> Sweep::codec_sizes(const Spec& s) const {
  std::vector<size_t> n;
  for (size_t i = 0; i <= 9; ++i) n.push_back(i);
  if (s.cast()) {
    for (size_t i : {15, 16, 17, 2047, 2048, 2049}) n.push_back(i);
    if (!quick_)
      for (size_t i : {4103, 6145}) n.push_back(i);
    return n;
  }
  uint32_t group = 1;
  while (group < 32 && 4 * group < s.block / 4) group *= 2;
  const size_t b = s.block, pass = 8 * (32 / group) * b;
  for (size_t i : {b - 1, b, b + 1, b + 3, 2 * b + 5, pass - 1, pass + 3}) n.push_back(i);
  if (!quick_) n.push_back(2 * pass + b / 2 + 1);
  return n;
}

// Encode variants: residual (scale), decoded (0 none, 1 its own buffer, 2 over src), out2.
struct EncodeVariant {
  float residual_scale;  // 0: no residual
  int decoded;
  bool out2;
};
const EncodeVariant kEncodeVariants[] = {{0, 0, false},   {0, 1, true},    {1.0f, 1, false},
                                         {0.5f, 0, true}, {1.0f, 2, true}, {1.0f, 0, false}};

void Sweep::encode_case(const Spec& s, size_t n, int variant, size_t foff, size_t woff, Rng& r) {
  const EncodeVariant& v = kEncodeVariants[variant];
  const auto cpu_codec = cpu::make_builtin_codec(s.kind, s.cast() ? 8 : s.block, s.rounding);
  const size_t bytes = cpu_codec->encoded_bytes(n), fbytes = 4 * n;
  const std::vector<float> x = codec_data(n, s.cast() ? 16 : s.block, r);
  std::vector<float> residual;
  if (v.residual_scale != 0)
    for (float xi : x) residual.push_back(std::isfinite(xi) ? static_cast<float>(r.normal() * 1e-3 * xi) : 0.0f);
  const uint64_t index = s.rounding == Rounding::kStochastic && variant % 2 ? r.below(1ull << 40) * s.block : 0;
  const uint32_t key = static_cast<uint32_t>(r.bits());
  // the oracle
  std::vector<uint8_t> want(bytes);
  std::vector<float> want_res = residual, want_dec = v.decoded == 2 ? x : std::vector<float>(n);
  codec::EncodeArgs c;
  c.src = v.decoded == 2 ? want_dec.data() : x.data();
  c.residual = residual.empty() ? nullptr : want_res.data();
  c.residual_scale = v.residual_scale;
  c.out = want.data();
  c.decoded = v.decoded ? want_dec.data() : nullptr;
  c.n = n;
  c.index = index;
  c.key = key;
  cpu_codec->encode(c);

  codec::EncodeArgs a = c;
  const std::string what = "encode " + s.name() + " n=" + std::to_string(n) + " variant " + std::to_string(variant) +
                           " float offset " + std::to_string(foff) + " wire offset " + std::to_string(woff);
  on_devices(
      encode_, what,
      [&] {
        using U = shadow::Use;
        a.src = reinterpret_cast<float*>(input(0, x.data(), fbytes, foff, v.decoded == 2 ? U::kInOut : U::kIn, "src"));
        a.out = buffer(1, bytes, woff, device_->poison, U::kOut, "out");
        a.out2 = v.out2 ? buffer(2, bytes, (woff + 5) % 16, device_->poison, U::kOut, "out2") : nullptr;
        a.residual =
            residual.empty()
                ? nullptr
                : reinterpret_cast<float*>(input(3, residual.data(), fbytes, (foff + 4) % 16, U::kInOut, "residual"));
        a.decoded =
            v.decoded == 2 ? const_cast<float*>(a.src)
            : v.decoded == 1
                ? reinterpret_cast<float*>(buffer(4, fbytes, (foff + 8) % 16, device_->poison, U::kOut, "decoded"))
                : nullptr;
      },
      [&] { cuda::encode(cuda::CodecSpec{s.kind, s.block, s.rounding}, a, nullptr); },
      [&] {
        std::string d = encoding_differs(s.kind, s.block, n, a.out, want.data());
        if (d.empty() && a.out2 && bytes && std::memcmp(a.out2, a.out, bytes) != 0) d = "out2 differs from out";
        if (d.empty() && a.residual) d = differs(a.residual, want_res.data(), n, 4, Fmt::kF32, "residual");
        if (d.empty() && a.decoded) d = differs(a.decoded, want_dec.data(), n, 4, Fmt::kF32, "decoded");
        if (d.empty() && v.decoded != 2 && fbytes && std::memcmp(a.src, x.data(), fbytes) != 0) d = "src changed";
        return d;
      });
}

// Every codec x size x variant, the float arrays and the wire bytes at offsets that rotate through
// kFloatOffsets and kWireOffsets; --quick takes half the variants.
template <class Case>
void Sweep::codec_cases(uint64_t salt, int variants, Case run) {
  static const size_t kFloatOffsets[] = {0, 4, 8, 12};
  static const size_t kWireOffsets[] = {0, 1, 2, 3, 4, 8, 12};
  size_t k = 0;
  for (const Spec& s : specs()) {
    Rng r(static_cast<uint64_t>(s.kind) * 100000 + s.block * 2 + static_cast<uint64_t>(s.rounding) + salt);
    for (size_t n : codec_sizes(s))
      for (int v = 0; v < variants; ++v, ++k)
        if (!quick_ || v % 2 == static_cast<int>(n % 2)) run(s, n, v, kFloatOffsets[k % 4], kWireOffsets[k % 7], k, r);
  }
}

void Sweep::encode_all() {
  codec_cases(0, static_cast<int>(std::size(kEncodeVariants)),
              [&](const Spec& s, size_t n, int v, size_t foff, size_t woff, size_t, Rng& r) {
                encode_case(s, n, v, foff, woff, r);
              });
}

// Decode variants: acc (0 none, 1 its own buffer, 2 dst itself), residual, divisor. A residual without acc
// is ignored (it stays as it was), as by the CPU codecs.
struct DecodeVariant {
  int acc;
  bool residual;
  int divisor;
};
const DecodeVariant kDecodeVariants[] = {{0, false, 0}, {1, false, 0}, {1, true, 3}, {2, true, 0},
                                         {2, false, 7}, {0, false, 4}, {1, true, 0}, {0, true, 0}};

void Sweep::decode_case(const Spec& s, size_t n, int variant, size_t foff, size_t woff, bool arbitrary, Rng& r) {
  const DecodeVariant& v = kDecodeVariants[variant];
  const auto cpu_codec = cpu::make_builtin_codec(s.kind, s.cast() ? 8 : s.block, s.rounding);
  const size_t bytes = cpu_codec->encoded_bytes(n), fbytes = 4 * n;
  std::vector<uint8_t> wire(bytes);
  if (arbitrary) {
    for (uint8_t& b : wire) b = static_cast<uint8_t>(r.bits());
  } else {
    const std::vector<float> x = codec_data(n, s.cast() ? 16 : s.block, r);
    codec::EncodeArgs e;
    e.src = x.data();
    e.out = wire.data();
    e.n = n;
    e.key = static_cast<uint32_t>(r.bits());
    cpu_codec->encode(e);
  }
  std::vector<float> acc, residual;
  if (v.acc) {
    for (size_t i = 0; i < n; ++i) acc.push_back(static_cast<float>(r.normal() * 100));
    if (n > 4) acc[0] = NAN, acc[1] = -0.0f;
  }
  if (v.residual)
    for (size_t i = 0; i < n; ++i) residual.push_back(static_cast<float>(r.normal()));
  std::vector<float> want = v.acc == 2 ? acc : std::vector<float>(n), want_res = residual;
  codec::DecodeArgs c;
  c.dst = want.data();
  c.acc = v.acc == 2 ? want.data() : (v.acc ? acc.data() : nullptr);
  c.residual = residual.empty() ? nullptr : want_res.data();
  c.in = wire.data();
  c.n = n;
  c.divisor = v.divisor;
  cpu_codec->decode(c);

  codec::DecodeArgs a = c;
  const std::string what = "decode " + s.name() + " n=" + std::to_string(n) + " variant " + std::to_string(variant) +
                           (arbitrary ? " (arbitrary bytes)" : "") + " float offset " + std::to_string(foff) +
                           " wire offset " + std::to_string(woff);
  on_devices(
      decode_, what,
      [&] {
        using U = shadow::Use;
        a.in = input(0, wire.data(), bytes, woff, U::kIn, "in");
        a.dst = v.acc == 2 ? reinterpret_cast<float*>(input(1, acc.data(), fbytes, foff, U::kInOut, "dst"))
                           : reinterpret_cast<float*>(buffer(1, fbytes, foff, device_->poison, U::kOut, "dst"));
        a.acc = v.acc == 2 ? a.dst
                : v.acc    ? reinterpret_cast<float*>(input(2, acc.data(), fbytes, (foff + 4) % 16, U::kIn, "acc"))
                           : nullptr;
        a.residual = residual.empty() ? nullptr
                                      : reinterpret_cast<float*>(input(3, residual.data(), fbytes, (foff + 8) % 16,
                                                                       v.acc ? U::kInOut : U::kIn, "residual"));
      },
      [&] { cuda::decode(cuda::CodecSpec{s.kind, s.block, s.rounding}, a, nullptr); },
      [&] {
        std::string d = differs(a.dst, want.data(), n, 4, Fmt::kF32, "dst");
        if (d.empty() && a.residual) d = differs(a.residual, want_res.data(), n, 4, Fmt::kF32, "residual");
        if (d.empty() && bytes && std::memcmp(a.in, wire.data(), bytes) != 0) d = "the encoding changed";
        return d;
      });
}

void Sweep::decode_all() {
  codec_cases(7, static_cast<int>(std::size(kDecodeVariants)),
              [&](const Spec& s, size_t n, int v, size_t foff, size_t woff, size_t k, Rng& r) {
                decode_case(s, n, v, foff, woff, k % 5 == 0, r);
              });
}

// The rotation of `parts` parts of `part` elements, in place at byte offset `off` (kernels/rotation.h).
void Sweep::rotate_case(uint32_t block, size_t part, size_t parts, bool inverse, size_t off, Rng& r) {
  const size_t n = part * parts;
  const std::vector<float> x = codec_data(n, block, r);
  std::vector<float> want = x;
  const std::vector<uint64_t> counts(parts, part);
  cpu::rotate(want.data(), counts.data(), counts.size(), block, inverse);
  float* px = nullptr;
  const std::string what = std::string(inverse ? "rotate back" : "rotate") + "(block=" + std::to_string(block) + ") " +
                           std::to_string(parts) + " parts of " + std::to_string(part) + " offset " +
                           std::to_string(off);
  on_devices(
      rotate_, what, [&] { px = reinterpret_cast<float*>(input(0, x.data(), n * 4, off, shadow::Use::kInOut, "x")); },
      [&] { cuda::rotate(px, n, part, block, inverse, nullptr); },
      [&] { return differs(px, want.data(), n, 4, Fmt::kF32, "x"); });
}

// Blocks of powers of two (one piece each) and of other multiples of 8 (several pieces), up to the largest
// a rotation takes; parts of whole blocks, with a short last block, and empty; one part and several;
// forward and back.
void Sweep::rotate_all() {
  static const size_t kFloatOffsets[] = {0, 4, 8, 12};
  Rng r(31);
  size_t k = 0;
  for (uint32_t block : {8u, 24u, 32u, 40u, 64u, 96u, 128u, 256u}) {
    for (size_t part : {size_t{1}, size_t{block - 1}, size_t{block}, size_t{3 * block + 5}, size_t{300 * 8 + 3}}) {
      for (size_t parts : {size_t{1}, size_t{3}}) {
        if (quick_ && parts == 3 && part != block) continue;
        for (bool inverse : {false, true}) rotate_case(block, part, parts, inverse, kFloatOffsets[k++ % 4], r);
      }
    }
  }
  rotate_case(64, 0, 1, false, 0, r);
}

// Bad input is refused before a launch, or by the launch, with pycoll's error, and nothing is written:
// float arrays off their 4-byte alignment (byte offset 2), null required pointers, bad codes and blocks,
// and a device that cannot run the kernels' blocks of 256 threads.
void Sweep::bad_input() {
  struct Bad {
    const char* what;
    ErrorKind kind;
    const char* says;
    std::function<void(uint8_t*, uint8_t*)> call;
  };
  const size_t n = 1000;
  codec::EncodeArgs e;
  e.n = n;
  codec::DecodeArgs d;
  d.n = n;
  const cuda::CodecSpec int8{Kind::kInt8, 64, Rounding::kNearest};
  const std::vector<Bad> bad = {
      {"a float array at byte offset 2", ErrorKind::kInvalidUsage, "not aligned",
       [&](uint8_t* in, uint8_t* out) {
         e.src = reinterpret_cast<const float*>(in + 2), e.out = out;
         cuda::encode(int8, e, nullptr);
       }},
      {"a residual at byte offset 2", ErrorKind::kInvalidUsage, "residual is not aligned",
       [&](uint8_t* in, uint8_t* out) {
         codec::EncodeArgs x = e;
         x.src = reinterpret_cast<const float*>(in), x.out = out, x.residual = reinterpret_cast<float*>(out + 2);
         cuda::encode(cuda::CodecSpec{Kind::kFp16, 0, Rounding::kNearest}, x, nullptr);
       }},
      {"a decode into byte offset 2", ErrorKind::kInvalidUsage, "dst is not aligned",
       [&](uint8_t* in, uint8_t* out) {
         d.in = in, d.dst = reinterpret_cast<float*>(out + 2);
         cuda::decode(int8, d, nullptr);
       }},
      {"a float32 reduce at byte offset 2", ErrorKind::kInvalidUsage, "b is not aligned",
       [&](uint8_t* in, uint8_t* out) {
         cuda::reduce(DType::kFloat32, RedOp::kSum, out, nullptr, in, in + 2, n, 0, nullptr);
       }},
      {"a null source", ErrorKind::kInvalidUsage, "src is a null device pointer",
       [&](uint8_t*, uint8_t* out) {
         e.src = nullptr, e.out = out;
         cuda::encode(int8, e, nullptr);
       }},
      {"a block of 20", ErrorKind::kInvalidUsage, "multiple of 8",
       [&](uint8_t* in, uint8_t* out) {
         d.in = in, d.dst = reinterpret_cast<float*>(out);
         cuda::decode(cuda::CodecSpec{Kind::kInt4, 20, Rounding::kNearest}, d, nullptr);
       }},
      {"a rotation of 1000 values in parts of 300", ErrorKind::kInvalidUsage, "are not parts of 300",
       [&](uint8_t*, uint8_t* out) { cuda::rotate(reinterpret_cast<float*>(out), n, 300, 32, false, nullptr); }},
      {"a rotation in blocks of 512", ErrorKind::kInvalidUsage, "in blocks of 512 (1 to 256)",
       [&](uint8_t*, uint8_t* out) { cuda::rotate(reinterpret_cast<float*>(out), n, n, 512, false, nullptr); }},
      {"an unknown op", ErrorKind::kInvalidUsage, "unknown op code 9",
       [&](uint8_t* in, uint8_t* out) {
         cuda::reduce(DType::kInt32, static_cast<RedOp>(9), out, nullptr, in, in, n, 0, nullptr);
       }},
      {"a device of 128 threads per block", ErrorKind::kSystem,
       "cudaErrorInvalidConfiguration (invalid configuration argument; emulation: a block of 256 threads, more "
       "than the device's 128) in launch of encode(int8(block=64)) with grid (1, 1, 1), block (256, 1, 1)",
       [&](uint8_t* in, uint8_t* out) {
         emulation::use_device(DeviceShape{4, 1, 128}, Schedule{});
         e.src = reinterpret_cast<const float*>(in), e.out = out;
         cuda::encode(int8, e, nullptr);
       }},
  };
  const auto start = std::chrono::steady_clock::now();
  for (const Bad& b : bad) {
    ++bad_.cases;
    emulation::use_device(kDevices[0].shape, Schedule{});
    shadow::reset();
    uint8_t* in = arena_.place(0, 4 * n + 16, 0, false, 0);
    uint8_t* out = arena_.place(1, 4 * n + 16, 0, false, 0xEE);
    std::string problem = "it did not raise";
    try {
      b.call(in, out);
    } catch (const Error& err) {
      problem.clear();
      if (err.kind() != b.kind) problem = std::string("the wrong kind of error: ") + err.what();
      if (std::string(err.what()).find(b.says) == std::string::npos)
        problem = std::string("the error does not say '") + b.says + "': " + err.what();
    }
    for (size_t i = 0; problem.empty() && i < 4 * n + 16; ++i)
      if (out[i] != 0xEE) problem = "a refused call wrote";
    if (problem.empty()) problem = arena_.damaged();
    if (!problem.empty()) throw Failure(std::string("bad input, ") + b.what + ": " + problem);
  }
  bad_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Sweep::report(int selftests, double selftest_seconds) const {
  std::printf("\n%-28s %8s %9s %9s\n", "kernels", "cases", "launches", "seconds");
  auto row = [](const char* name, const Tally& t) {
    std::printf("%-28s %8llu %9llu %9.1f\n", name, static_cast<unsigned long long>(t.cases),
                static_cast<unsigned long long>(t.launches), t.seconds);
  };
  row("reduce (8 dtypes x 5 ops)", reduce_);
  row("encode (fp16 bf16 int8 int4)", encode_);
  row("decode (fp16 bf16 int8 int4)", decode_);
  row("rotate (Hadamard blocks)", rotate_);
  row("bad input (refused)", bad_);
  std::printf("%-28s %8d %9s %9.1f\n", "self-tests", selftests, "", selftest_seconds);
  const double total =
      reduce_.seconds + encode_.seconds + decode_.seconds + rotate_.seconds + bad_.seconds + selftest_seconds;
  std::printf(
      "%-28s %8llu %9llu %9.1f\n", "total",
      static_cast<unsigned long long>(reduce_.cases + encode_.cases + decode_.cases + rotate_.cases + bad_.cases +
                                      selftests),
      static_cast<unsigned long long>(reduce_.launches + encode_.launches + decode_.launches + rotate_.launches),
      total);
}

}  // namespace
}  // namespace pycoll::kernel_tests

int main(int argc, char** argv) {
  using namespace pycoll::kernel_tests;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("kernel sweep (%s%s): the CUDA kernels on the CPU emulation against the CPU loops, on %zu devices\n",
              shadow::enabled() ? "shadow map" : "AddressSanitizer + UBSan, guard pages", quick ? ", quick" : "",
              std::size(kDevices));
  try {
    const auto start = std::chrono::steady_clock::now();
    int selftests = run_selftests();
#if PYCOLL_SHADOW
    selftests += run_shadow_selftests();
#endif
    const double selftest_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Sweep sweep(quick);
    sweep.reduce_all();
    sweep.encode_all();
    sweep.decode_all();
    sweep.rotate_all();
    sweep.bad_input();
    sweep.report(selftests, selftest_seconds);
  } catch (const Failure& f) {
    std::fprintf(stderr, "FAILED: %s\n", f.what());
    return 1;
  }
  std::printf("every case bit for bit against the CPU loops\n");
  return 0;
}
