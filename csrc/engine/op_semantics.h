// What a reduction op means to a collective, in one place for the fragment executor (executor.cc) and
// the grouped executor (grouped_executor.cc); the element arithmetic itself is kernels/reduce_ops.h.
//
//   sum, min, max, prod  combine elementwise; a final value is the combination of every rank's input.
//   avg                  a sum, which the op that finalizes a value divides by the world size (the
//                        divisor the reduce and decode kernels take); with error feedback, the residual
//                        left where a value is finalized is scaled by the world size (it feeds a sum).
//   compression          (codecs) runs on float32 sums and averages only; float16 and bfloat16 data are
//                        widened to float32 first and rounded back once (compressible). The Python
//                        layer's rule is pycoll/call.py compression_refusal; tests/unit/test_call_path.py
//                        checks the two agree.
#pragma once

#include "kernels/types.h"

namespace pycoll {

// The divisor of a finalizing reduce (0: none): the world size for avg.
inline int avg_divisor(RedOp op, int world) {
  return op == RedOp::kAvg ? world : 0;
}

// The divisor the kernels apply for a plan op that finalizes (or not) its values.
inline int finalize_divisor(RedOp op, bool finalize, int world) {
  return finalize ? avg_divisor(op, world) : 0;
}

// The scale of the error-feedback residual where a plan op encodes its values.
inline float residual_scale(RedOp op, bool finalize, int world) {
  return finalize && op == RedOp::kAvg ? static_cast<float>(world) : 1.0f;
}

// Whether a codec can compress collectives of this op.
inline bool op_compressible(RedOp op) {
  return op == RedOp::kSum || op == RedOp::kAvg;
}

// Whether a codec can compress a collective of this data and op (after widening float16 / bfloat16).
inline bool compressible(DType type, RedOp op) {
  return (type == DType::kFloat32 || type == DType::kFloat16 || type == DType::kBFloat16) && op_compressible(op);
}

// What a compressed collective that `compressible` refuses raises.
constexpr const char* kNotCompressible = "compression needs float32, float16 or bfloat16 data and op sum or avg";

}  // namespace pycoll
