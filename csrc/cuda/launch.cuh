// What the kernels of csrc/cuda share: launch sizes, the launch and its check, alignment tests, and the
// checks of pointers that every host function does before it enqueues anything.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "pycoll/cuda_check.h"
#include "pycoll/errors.h"

namespace pycoll::cuda::detail {

// Threads per block of every kernel here: 8 warps.
constexpr int kThreads = 256;

inline bool aligned(const void* p, uintptr_t to) {
  return (reinterpret_cast<uintptr_t>(p) & (to - 1)) == 0;
}

// Multiprocessors of the current device, looked up once per device.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  PYCOLL_CHECK_CUDA(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int sms = 0;
  PYCOLL_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms <= 0) sms = 1;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

// Blocks of kThreads threads of `kernel` that one multiprocessor of the current device holds at once (its
// register use decides), looked up once per device and kernel.
inline int resident_blocks(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  PYCOLL_CHECK_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, kernel});
  if (it != cache.end()) return it->second;
  int blocks = 0;
  PYCOLL_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
  if (blocks <= 0) blocks = 1;
  cache[{dev, kernel}] = blocks;
  return blocks;
}

// Blocks for `items` units of work of one thread each: enough for every item, at most one full wave of
// resident blocks (the kernels' grid-stride loops do the rest; a partial second wave would leave
// multiprocessors idle at the end).
template <class... Args>
unsigned grid_for(void (*kernel)(Args...), size_t items) {
  const size_t per_sm = static_cast<size_t>(resident_blocks(reinterpret_cast<const void*>(kernel)));
  const size_t want = (items + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sm_count()) * per_sm;
  return static_cast<unsigned>(want < cap ? (want > 0 ? want : 1) : cap);
}

inline std::string dims_text(const dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

// kernel<<<grid_for(kernel, items), kThreads, 0, stream>>>(args...), then the launch's own check: a launch
// that failed (a configuration the device cannot run, no device, a sticky error of an earlier kernel)
// throws pycoll::Error naming the kernel, `name()` (called only then), and the configuration. Built for the
// CPU emulation (csrc/cuda/emulation/), the same call runs the kernel there.
template <class Name, class... Params, class... Args>
void launch(const Name& name, void (*kernel)(Params...), size_t items, cudaStream_t stream, const Args&... args) {
  const dim3 grid(grid_for(kernel, items)), block(kThreads);
#if PYCOLL_CUDA_EMULATION
  ::pycoll::emulation::launch(kernel, grid, block, 0, stream, args...);
#else
  // (clang-format would split the launch's >>> inside this #if)
  // clang-format off
  kernel<<<grid, block, 0, stream>>>(args...);
  // clang-format on
#endif
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    const std::string call = "launch of " + name() + " with grid " + dims_text(grid) + ", block " + dims_text(block);
    throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
  }
}

// A pointer the kernel reads or writes: required ones must not be null, and every one must be aligned to
// its element size (the kernels use vector accesses where pointers allow, plain ones elsewhere).
inline void check_pointer(const void* p, const char* what, size_t align, bool required) {
  if (!p) {
    if (required) throw Error(ErrorKind::kInvalidUsage, std::string(what) + " is a null device pointer");
    return;
  }
  if (!aligned(p, align))
    throw Error(ErrorKind::kInvalidUsage,
                std::string(what) + " is not aligned to its element size (" + std::to_string(align) + " bytes)");
}

}  // namespace pycoll::cuda::detail
