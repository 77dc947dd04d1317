// What nvcc gives device code and the host compiler does not, for compiling the unchanged .cu files of
// csrc/cuda as C++ (included first, by kernels_*.cc): the built-in indices, warpSize, __launch_bounds__,
// __shared__, __syncthreads, the warp operations, the integer max / min overloads of CUDA's math library,
// and emulation::launch, which csrc/cuda/launch.cuh calls in place of kernel<<<...>>>.
//
// The types and runtime declarations are the real ones (cuda_runtime_api.h, vector_types.h,
// vector_functions.h), so alignments and signatures are those nvcc sees; the runtime functions the
// launch code calls are defined by runtime.cc. threadIdx and its kin read the scheduler's current thread
// through a function call each time: a fiber switch can happen only inside a call (a warp operation),
// so no value read before one is reused after it.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/emulation/emulation.h"

#define PYCOLL_CUDA_EMULATION 1

namespace pycoll::emulation::detail {

struct ThreadIndex {
  uint3 thread;
  uint3 block;
  dim3 block_dim;
  dim3 grid_dim;
};

// The thread the scheduler runs now (set at every switch; launches are serialized process-wide).
const ThreadIndex& here();

enum class WarpOp : int { kShfl, kShflUp, kShflDown, kShflXor, kSyncwarp, kBallot, kAny, kAll };

// One lane's arrival at a warp operation: returns once every lane of `mask` has arrived at the same
// call site (file:line) with the same operation, mask and width. `value` is the lane's operand (its
// bits), `arg` the source lane, delta or lane mask of a shuffle.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);
void block_barrier(const char* file, int line);

using Body = void (*)(const void* call);
// Runs `body(call)` once per thread of the grid on the current emulated device (emulation.h).
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, Body body, const void* call);

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp operations move values of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace pycoll::emulation::detail

namespace pycoll::emulation {

// kernel<<<grid, block, shared_bytes, stream>>>(args...): the arguments are converted to the kernel's
// parameter types once, as a launch copies them, and every thread of the grid runs the kernel on that
// copy. The stream is not used: the launch has run when this returns.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t /*stream*/,
            const Args&... args) {
  using Call = std::pair<void (*)(Params...), std::tuple<std::decay_t<Params>...>>;
  const Call call{kernel, std::tuple<std::decay_t<Params>...>(args...)};
  detail::run_grid(
      grid, block, shared_bytes,
      [](const void* c) {
        const Call& k = *static_cast<const Call*>(c);
        std::apply(k.first, k.second);
      },
      &call);
}

}  // namespace pycoll::emulation

// ---- built-in variables ------------------------------------------------------------------------------------
#define threadIdx (::pycoll::emulation::detail::here().thread)
#define blockIdx (::pycoll::emulation::detail::here().block)
#define blockDim (::pycoll::emulation::detail::here().block_dim)
#define gridDim (::pycoll::emulation::detail::here().grid_dim)
#define warpSize 32

// Launch bounds tell nvcc how many registers a thread may use; the emulation has no registers to share.
#define __launch_bounds__(...)
// A block's shared memory: a static of the kernel (blocks run one at a time). Dynamic shared memory is not
// emulated: `extern __shared__` does not compile here, and a launch asking for shared bytes is refused.
#undef __shared__
#define __shared__ static
#define __syncthreads() ::pycoll::emulation::detail::block_barrier(__FILE__, __LINE__)

// ---- warp operations ---------------------------------------------------------------------------------------
// The call site comes from the default arguments, which the compiler fills in where each one is called.
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  using pycoll::emulation::detail::WarpOp;
  return pycoll::emulation::detail::from_bits<T>(pycoll::emulation::detail::warp_op(
      WarpOp::kShfl, mask, pycoll::emulation::detail::to_bits(var), src_lane, width, file, line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  using pycoll::emulation::detail::WarpOp;
  return pycoll::emulation::detail::from_bits<T>(pycoll::emulation::detail::warp_op(
      WarpOp::kShflUp, mask, pycoll::emulation::detail::to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  using pycoll::emulation::detail::WarpOp;
  return pycoll::emulation::detail::from_bits<T>(pycoll::emulation::detail::warp_op(
      WarpOp::kShflDown, mask, pycoll::emulation::detail::to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  using pycoll::emulation::detail::WarpOp;
  return pycoll::emulation::detail::from_bits<T>(pycoll::emulation::detail::warp_op(
      WarpOp::kShflXor, mask, pycoll::emulation::detail::to_bits(var), lane_mask, width, file, line));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  pycoll::emulation::detail::warp_op(pycoll::emulation::detail::WarpOp::kSyncwarp, mask, 0, 0, warpSize, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(pycoll::emulation::detail::warp_op(pycoll::emulation::detail::WarpOp::kBallot, mask,
                                                                  predicate != 0, 0, warpSize, file, line));
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(pycoll::emulation::detail::warp_op(pycoll::emulation::detail::WarpOp::kAny, mask,
                                                             predicate != 0, 0, warpSize, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(pycoll::emulation::detail::warp_op(pycoll::emulation::detail::WarpOp::kAll, mask,
                                                             predicate != 0, 0, warpSize, file, line));
}

// ---- CUDA's integer and floating max / min (device math library overloads) --------------------------------
#define PYCOLL_EMULATION_MINMAX(T) \
  inline T max(T a, T b) {         \
    return a > b ? a : b;          \
  }                                \
  inline T min(T a, T b) {         \
    return a < b ? a : b;          \
  }
PYCOLL_EMULATION_MINMAX(int)
PYCOLL_EMULATION_MINMAX(unsigned int)
PYCOLL_EMULATION_MINMAX(long)
PYCOLL_EMULATION_MINMAX(unsigned long)
PYCOLL_EMULATION_MINMAX(long long)
PYCOLL_EMULATION_MINMAX(unsigned long long)
#undef PYCOLL_EMULATION_MINMAX
inline float max(float a, float b) {
  return __builtin_fmaxf(a, b);
}
inline float min(float a, float b) {
  return __builtin_fminf(a, b);
}
inline double max(double a, double b) {
  return __builtin_fmax(a, b);
}
inline double min(double a, double b) {
  return __builtin_fmin(a, b);
}
