// The reduce kernel: dst[i] = a[i] (+) b[i] (and / avg_divisor) through the element code that the CPU
// loops use (kernels/reduce_ops.h), so both give the same bits.
//
// Layout of one launch: a scalar head (the elements before `a` reaches a 16-byte boundary), a vector part
// of 16-byte vectors when every pointer is 16-byte aligned from there on, and a scalar tail. Pointers that
// disagree about alignment make the whole range scalar. Each thread of the grid-stride loop keeps kUnroll
// vector loads of a and of b in flight before it computes and stores.
#include <cstring>

#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "kernels/reduce_ops.h"

namespace pycoll::cuda {
namespace {

using detail::kThreads;

// 16-byte vectors of a and of b each thread loads before it computes: 64 bytes in flight per thread, with
// the 4..6 resident blocks of 256 threads, plenty to cover HBM latency (more unrolling costs compile time).
constexpr int kUnroll = 2;

struct ReduceParams {
  void* dst;
  void* dst2;  // may be null
  const void* a;
  const void* b;
  size_t n;     // elements
  size_t head;  // scalar elements before the vector part
  size_t nvec;  // 16-byte vectors after the head
  int avg_divisor;
};

template <class E, class Op, bool kDiv>
__device__ __forceinline__ typename Elem<E>::storage one(typename Elem<E>::storage x, typename Elem<E>::storage y,
                                                         typename Elem<E>::compute div) {
  if constexpr (kDiv) {
    return reduce_elem_div<E, Op>(x, y, div);
  } else {
    return reduce_elem<E, Op>(x, y);
  }
}

template <class E, class Op, bool kDiv>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const ReduceParams p) {
  using S = typename Elem<E>::storage;
  using C = typename Elem<E>::compute;
  constexpr int kVec = 16 / sizeof(S);
  const C div = static_cast<C>(p.avg_divisor);
  S* d = static_cast<S*>(p.dst);
  S* d2 = static_cast<S*>(p.dst2);
  const S* a = static_cast<const S*>(p.a);
  const S* b = static_cast<const S*>(p.b);
  const size_t threads = static_cast<size_t>(gridDim.x) * kThreads;

  const uint4* va = reinterpret_cast<const uint4*>(a + p.head);
  const uint4* vb = reinterpret_cast<const uint4*>(b + p.head);
  uint4* vd = reinterpret_cast<uint4*>(d + p.head);
  uint4* vd2 = d2 ? reinterpret_cast<uint4*>(d2 + p.head) : nullptr;
  for (size_t base = static_cast<size_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < p.nvec;
       base += threads * kUnroll) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * kThreads;
      if (i < p.nvec) {
        x[u] = va[i];
        y[u] = vb[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * kThreads;
      if (i < p.nvec) {
        S xs[kVec], ys[kVec], rs[kVec];
        memcpy(xs, &x[u], sizeof xs);
        memcpy(ys, &y[u], sizeof ys);
#pragma unroll
        for (int k = 0; k < kVec; ++k) rs[k] = one<E, Op, kDiv>(xs[k], ys[k], div);
        uint4 r;
        memcpy(&r, rs, sizeof r);
        vd[i] = r;
        if (vd2) vd2[i] = r;
      }
    }
  }

  // The scalar elements: [0, head) and [head + nvec * kVec, n).
  const size_t tail_begin = p.head + p.nvec * kVec;
  const size_t scalars = p.head + (p.n - tail_begin);
  for (size_t s = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; s < scalars; s += threads) {
    const size_t i = s < p.head ? s : tail_begin + (s - p.head);
    const S v = one<E, Op, kDiv>(a[i], b[i], div);
    d[i] = v;
    if (d2) d2[i] = v;
  }
}

template <class E, class Op>
void launch_reduce(const ReduceParams& p, DType dtype, RedOp op, cudaStream_t stream) {
  const size_t scalars = p.n - p.nvec * (16 / sizeof(typename Elem<E>::storage));
  const size_t vec_items = (p.nvec + kUnroll - 1) / kUnroll;
  const size_t items = vec_items > scalars ? vec_items : scalars;
  const auto name = [&] { return std::string("reduce(") + dtype_name(dtype) + ", " + redop_name(op) + ")"; };
  if (p.avg_divisor > 0) {
    detail::launch(name, reduce_kernel<E, Op, true>, items, stream, p);
  } else {
    detail::launch(name, reduce_kernel<E, Op, false>, items, stream, p);
  }
}

template <class E>
void launch_for_op(const ReduceParams& p, DType dtype, RedOp op, cudaStream_t stream) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:  // a sum; the average's division comes from avg_divisor, as on the CPU
      return launch_reduce<E, OpSum>(p, dtype, op, stream);
    case RedOp::kMin:
      return launch_reduce<E, OpMin>(p, dtype, op, stream);
    case RedOp::kMax:
      return launch_reduce<E, OpMax>(p, dtype, op, stream);
    case RedOp::kProd:
      return launch_reduce<E, OpProd>(p, dtype, op, stream);
  }
}

}  // namespace

void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n, int avg_divisor,
            cudaStream_t stream) {
  const int dt = static_cast<int>(dtype), o = static_cast<int>(op);
  if (dt < 0 || dt >= kNumDTypes) throw Error(ErrorKind::kInvalidUsage, "unknown dtype code " + std::to_string(dt));
  if (o < 0 || o >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code " + std::to_string(o));
  if (n == 0) return;
  const size_t es = dtype_size(dtype);
  detail::check_pointer(dst, "dst", es, true);
  detail::check_pointer(dst2, "dst2", es, false);
  detail::check_pointer(a, "a", es, true);
  detail::check_pointer(b, "b", es, true);

  ReduceParams p{dst, dst2, a, b, n, n, 0, avg_divisor};
  // Vectors from the first element at which `a` is 16-byte aligned, when the other pointers are too.
  const size_t head = ((16 - (reinterpret_cast<uintptr_t>(a) & 15)) & 15) / es;
  auto at16 = [&](const void* ptr) { return !ptr || detail::aligned(static_cast<const char*>(ptr) + head * es, 16); };
  if (head < n && at16(dst) && at16(dst2) && at16(b)) {
    p.head = head;
    p.nvec = (n - head) / (16 / es);
  }

  switch (dtype) {
    case DType::kFloat32:
      return launch_for_op<float>(p, dtype, op, stream);
    case DType::kFloat64:
      return launch_for_op<double>(p, dtype, op, stream);
    case DType::kFloat16:
      return launch_for_op<half_bits>(p, dtype, op, stream);
    case DType::kBFloat16:
      return launch_for_op<bf16_bits>(p, dtype, op, stream);
    case DType::kInt32:
      return launch_for_op<int32_t>(p, dtype, op, stream);
    case DType::kInt64:
      return launch_for_op<int64_t>(p, dtype, op, stream);
    case DType::kUInt8:
      return launch_for_op<uint8_t>(p, dtype, op, stream);
    case DType::kInt8:
      return launch_for_op<int8_t>(p, dtype, op, stream);
  }
}

}  // namespace pycoll::cuda
