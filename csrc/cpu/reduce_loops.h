// The reduce loops, compiled once per instruction set: reduce_base.cc and reduce_avx2.cc include this
// file with PYCOLL_ISA_NS set to a namespace of their own.
#include <cstddef>

#include "cpu/copy.h"
#include "cpu/reduce.h"
#include "kernels/reduce_ops.h"

namespace pycoll::cpu::PYCOLL_ISA_NS {

template <class E, class Op>
static void reduce_plain(void* dst, void* dst2, const void* a, const void* b, size_t n, int avg_divisor) {
  using S = typename Elem<E>::storage;
  using C = typename Elem<E>::compute;
  S* d = static_cast<S*>(dst);
  S* d2 = static_cast<S*>(dst2);
  const S* pa = static_cast<const S*>(a);
  const S* pb = static_cast<const S*>(b);
  if (avg_divisor > 0) {
    const C div = static_cast<C>(avg_divisor);
    if (d2) {
      for (size_t i = 0; i < n; ++i) {
        S v = reduce_elem_div<E, Op>(pa[i], pb[i], div);
        d[i] = v;
        d2[i] = v;
      }
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = reduce_elem_div<E, Op>(pa[i], pb[i], div);
    }
    return;
  }
  if (d2) {
    for (size_t i = 0; i < n; ++i) {
      S v = reduce_elem<E, Op>(pa[i], pb[i]);
      d[i] = v;
      d2[i] = v;
    }
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = reduce_elem<E, Op>(pa[i], pb[i]);
  }
}

// Streaming variant: reduce a block into a buffer that stays in L1, then stream it to dst.
template <class E, class Op>
static void reduce_loop(void* dst, void* dst2, const void* a, const void* b, size_t n, int avg_divisor,
                        bool stream_dst) {
  if (!stream_dst) return reduce_plain<E, Op>(dst, dst2, a, b, n, avg_divisor);
  using S = typename Elem<E>::storage;
  constexpr size_t kBlock = 4096 / sizeof(S);
  alignas(64) S block[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    size_t m = n - i < kBlock ? n - i : kBlock;
    reduce_plain<E, Op>(block, dst2 ? static_cast<S*>(dst2) + i : nullptr, static_cast<const S*>(a) + i,
                        static_cast<const S*>(b) + i, m, avg_divisor);
    stream_copy(static_cast<S*>(dst) + i, block, m * sizeof(S));
  }
}

template <class E>
static ReduceFn for_type(RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return &reduce_loop<E, OpSum>;
    case RedOp::kMin:
      return &reduce_loop<E, OpMin>;
    case RedOp::kMax:
      return &reduce_loop<E, OpMax>;
    case RedOp::kProd:
      return &reduce_loop<E, OpProd>;
  }
  return nullptr;
}

ReduceFn lookup(DType dtype, RedOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return for_type<float>(op);
    case DType::kFloat64:
      return for_type<double>(op);
    case DType::kFloat16:
      return for_type<half_bits>(op);
    case DType::kBFloat16:
      return for_type<bf16_bits>(op);
    case DType::kInt32:
      return for_type<int32_t>(op);
    case DType::kInt64:
      return for_type<int64_t>(op);
    case DType::kUInt8:
      return for_type<uint8_t>(op);
    case DType::kInt8:
      return for_type<int8_t>(op);
  }
  return nullptr;
}

}  // namespace pycoll::cpu::PYCOLL_ISA_NS
