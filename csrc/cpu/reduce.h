// CPU reduction loops around the element code of csrc/kernels/reduce_ops.h.
#pragma once

#include <cstddef>

#include "kernels/types.h"

namespace pycoll::cpu {

// dst[i] = a[i] (+) b[i] for i < n; when dst2 is not null the same value is also written to dst2.
// avg_divisor > 0 divides each result by it (the finalize step of an average). stream_dst writes dst
// with non-temporal stores (see copy.h); dst2 is always written normally. dst may alias a or b.
using ReduceFn = void (*)(void* dst, void* dst2, const void* a, const void* b, size_t n, int avg_divisor,
                          bool stream_dst);

// The loop for (dtype, op), vectorised for the best instruction set this CPU supports.
ReduceFn reduce_fn(DType dtype, RedOp op);

// Name of the instruction set reduce_fn() picked ("avx2" or "baseline"), for logs and benchmarks.
const char* reduce_isa();

}  // namespace pycoll::cpu
