// The randomized Hadamard rotation on the GPU: the element code of kernels/rotation.h, one codec block per
// thread, so the same additions in the same order as the CPU loop (csrc/cpu/rotation.cc) and the same bits.
//
// Parts are all of one size here (an all-reduce's buffer, a reduce-scatter's or all-gather's chunks, an
// all-to-all's even parts); a block is `block` elements of a part from its start, the last may be shorter.
// A thread reads its block into its own registers and local memory (at most kMaxRotationBlock elements),
// rotates it there and writes it back: each element is read once and written once.
#include <string>

#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "kernels/rotation.h"

namespace pycoll::cuda {
namespace {

using detail::kThreads;

struct RotateParams {
  float* x;
  uint64_t n;       // elements of x
  uint64_t part;    // elements of each part (n is a whole number of them)
  uint32_t block;   // elements of a codec block
  uint64_t blocks;  // blocks of each part
  bool inverse;
};

__global__ void __launch_bounds__(kThreads) rotate_kernel(const RotateParams p) {
  const uint64_t total = p.n / p.part * p.blocks;
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (uint64_t b = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; b < total; b += threads) {
    const uint64_t within = b % p.blocks * p.block;
    float* x = p.x + b / p.blocks * p.part + within;
    const uint32_t m = static_cast<uint32_t>(p.part - within < p.block ? p.part - within : p.block);
    float v[codec::kMaxRotationBlock];
    for (uint32_t j = 0; j < m; ++j) v[j] = x[j];
    codec::rotate_block(v, m, p.inverse);
    for (uint32_t j = 0; j < m; ++j) x[j] = v[j];
  }
}

}  // namespace

void rotate(float* x, uint64_t n, uint64_t part, uint32_t block, bool inverse, cudaStream_t stream) {
  if (n == 0) return;
  detail::check_pointer(x, "x", 4, true);
  if (block < 1 || block > codec::kMaxRotationBlock || part < 1 || n % part)
    throw Error(ErrorKind::kInvalidUsage, "rotate: " + std::to_string(n) + " elements are not parts of " +
                                              std::to_string(part) + " in blocks of " + std::to_string(block) +
                                              " (1 to " + std::to_string(codec::kMaxRotationBlock) + ")");
  const RotateParams p{x, n, part, block, (part + block - 1) / block, inverse};
  const auto name = [&] {
    return std::string(inverse ? "rotate back" : "rotate") + "(block=" + std::to_string(block) + ")";
  };
  detail::launch(name, rotate_kernel, n / part * p.blocks, stream, p);
}

}  // namespace pycoll::cuda
