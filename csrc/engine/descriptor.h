// What a rank says it is calling. Every rank publishes its descriptor when it enters a collective and
// stamps a hash of it on every fragment it sends, so ranks that called differently are detected
// (CollectiveMismatchError) instead of exchanging garbage or waiting forever.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/types.h"

namespace pycoll {

// Codes shared with Python through the _C module (COLLECTIVES / ALGORITHMS); append, never reorder.
inline const char* const kCollectiveNames[] = {"allreduce", "reduce_scatter", "all_gather",
                                               "broadcast", "barrier",        "all_to_all"};
// The algorithms a descriptor names: the plans' and, last, NCCL's own collectives (only GPU flight records carry it).
inline const char* const kAlgorithmNames[] = {"ring", "tree", "direct", "dissemination", "hierarchical", "nccl"};
constexpr int kNumCollectives = 6;
// Whether no rank can leave collective `collective` before every rank entered it (all but broadcast):
// what the skew recorder's clock estimate relies on (engine/skew.h).
inline bool synchronizes_all(int collective) {
  return collective != 3;
}
constexpr int kNumAlgorithms = 6;

struct Descriptor {
  int32_t collective = 0;
  int32_t algorithm = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int64_t count = 0;  // elements per rank as the caller gave them
  int32_t root = 0;
  int64_t codec = 0;  // 0: none; otherwise the codec's wire id (pycoll/compression: Codec.wire_id)

  uint64_t hash() const {
    // FNV-1a over the fields; any difference between ranks changes it.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
      }
    };
    mix(uint64_t(uint32_t(collective)));
    mix(uint64_t(uint32_t(algorithm)));
    mix(uint64_t(uint32_t(dtype)));
    mix(uint64_t(uint32_t(op)));
    mix(uint64_t(count));
    mix(uint64_t(uint32_t(root)));
    mix(uint64_t(codec));
    return h;
  }
};

// A codec's wire id spelled out: kind in the low byte, rounding in the next (its rotation in that byte's high
// nibble), block size above
// (pycoll/compression/codecs.py builds the same ids); user codecs carry a hash of their definition.
inline std::string codec_name(int64_t id) {
  const int kind = static_cast<int>(id & 0xff);
  const int rounding = static_cast<int>((id >> 8) & 0xf);
  const bool hadamard = ((id >> 12) & 0xf) == 1;  // codec::Rotation::kHadamard
  const long long block = static_cast<long long>(id >> 16);
  switch (kind) {
    case 1:
      return "fp16";
    case 2:
      return "bf16";
    case 3:
    case 4:
      return std::string(kind == 3 ? "int8" : "int4") + "(block=" + std::to_string(block) +
             (rounding ? ", stochastic" : "") + (hadamard ? ", hadamard)" : ")");
    case 15: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(block));
      return std::string("user codec #") + hex;
    }
    default:
      return "#" + std::to_string(id);
  }
}

inline std::string code_name(const char* const* names, int n, int32_t code) {
  return (code >= 0 && code < n) ? names[code] : ("#" + std::to_string(code));
}

constexpr int kAllToAll = 5;  // kCollectiveNames: its ranks agree on no count (each part's size is checked)

// "allreduce(count=1000, dtype=float32, op=sum, algorithm=ring)"; an all-to-all has no count and no op
inline std::string describe(const Descriptor& d) {
  std::string s = code_name(kCollectiveNames, kNumCollectives, d.collective) + "(";
  if (d.collective != kAllToAll)
    s += "count=" + std::to_string(d.count) + ", dtype=" + dtype_name(DType(d.dtype)) +
         ", op=" + redop_name(RedOp(d.op));
  else
    s += "dtype=" + std::string(dtype_name(DType(d.dtype)));
  s += ", algorithm=" + code_name(kAlgorithmNames, kNumAlgorithms, d.algorithm);
  if (d.collective == 3) s += ", root=" + std::to_string(d.root);
  if (d.codec) s += ", compression=" + codec_name(d.codec);
  return s + ")";
}

// The fields in which two descriptors differ, e.g. "count, dtype".
inline std::string differences(const Descriptor& a, const Descriptor& b) {
  std::string s;
  auto add = [&s](bool differ, const char* name) {
    if (!differ) return;
    if (!s.empty()) s += ", ";
    s += name;
  };
  add(a.collective != b.collective, "collective");
  add(a.count != b.count, "count");
  add(a.dtype != b.dtype, "dtype");
  add(a.op != b.op, "op");
  add(a.algorithm != b.algorithm, "algorithm");
  add(a.root != b.root, "root");
  add(a.codec != b.codec, "codec");
  return s;
}

}  // namespace pycoll
