#include "cpu/isa.h"
#include "cpu/reduce.h"
#include "pycoll/errors.h"

namespace pycoll::cpu {
namespace base {
ReduceFn lookup(DType dtype, RedOp op);
}
namespace avx2 {
ReduceFn lookup(DType dtype, RedOp op);
}

ReduceFn reduce_fn(DType dtype, RedOp op) {
  ReduceFn fn = have_avx2() ? avx2::lookup(dtype, op) : base::lookup(dtype, op);
  if (!fn)
    throw Error(ErrorKind::kInvalidUsage, "no reduce kernel for dtype code " + std::to_string(int(dtype)) +
                                              " and op code " + std::to_string(int(op)));
  return fn;
}

const char* reduce_isa() {
  return have_avx2() ? "avx2" : "baseline";
}

}  // namespace pycoll::cpu
