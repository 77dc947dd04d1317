// Data types and reduction operators, with codes shared with pycoll/_types.py.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycoll {

enum class DType : int32_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
};
constexpr int kNumDTypes = 8;

enum class RedOp : int32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };
constexpr int kNumRedOps = 5;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDTypes) ? names[i] : "?";
}

inline const char* redop_name(RedOp op) {
  static const char* names[] = {"sum", "avg", "min", "max", "prod"};
  int i = static_cast<int>(op);
  return (i >= 0 && i < kNumRedOps) ? names[i] : "?";
}

}  // namespace pycoll
