// The CPU emulation of the CUDA execution model: what a test chooses before it runs the kernels of
// csrc/cuda on the host (pycoll._emulated_kernels, tests/kernels). The kernels themselves are the real
// .cu files, compiled by the host compiler after cuda_emulation.h (kernels_*.cc).
//
// A launch runs its blocks one after another on the calling thread, in the order the schedule gives.
// Within a block, threads run as plain calls, one after another, until one reaches a warp operation
// (__shfl*_sync, __syncwarp, votes) or __syncthreads; from there each waiting thread keeps a fiber of
// its own (a stack with a guard page under it) and the next threads start on a new one. A warp operation
// returns once every lane of its mask that has not exited has arrived at the same call site, with CUDA's
// semantics where CUDA defines them; what it leaves undefined (a shuffle reading a lane that exited or is
// outside the mask, a bad width, a mask without the caller) and a lane waiting at another call site stop
// the launch with a fault (below; scheduler.cc lists them). Launches are synchronous and serialized
// process-wide (a __shared__ array is a static of its kernel).
//
// Faults and bad configurations are reported as a GPU reports them, through cudaGetLastError(): a
// configuration the device cannot run is cudaErrorInvalidConfiguration and runs nothing; a misused warp
// operation or barrier is cudaErrorLaunchFailure, and the rest of the launch is abandoned. In both cases
// cudaGetErrorString() adds what the emulation saw.
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>

namespace pycoll::emulation {

// The order of blocks, of the threads of a block, and of the threads a warp operation or barrier
// releases. kInOrder resumes released threads before it starts new ones, kReversed the other way
// round, kRandom picks by a coin drawn from the seed (the same seed gives the same schedule).
enum class Order : int32_t { kInOrder = 0, kReversed = 1, kRandom = 2 };
const char* order_name(Order order);

// What the CUDA runtime calls of the kernels' launch code answer: cudaDeviceGetAttribute and
// cudaOccupancyMaxActiveBlocksPerMultiprocessor (the same answer for every kernel).
struct DeviceShape {
  int sms = 132;
  int blocks_per_sm = 4;
  int max_threads_per_block = 1024;
};

struct Schedule {
  Order order = Order::kInOrder;
  uint64_t seed = 0;  // of kRandom
};

// Makes `shape` the calling thread's current device, as cudaSetDevice would, and `schedule` the way
// its launches run. Returns the device's ordinal (what cudaGetDevice answers): one per distinct shape,
// so that caches keyed by device (csrc/cuda/launch.cuh) stay right when a test changes the shape.
// Throws std::invalid_argument for a shape no device has (counts below 1, more than 1024 threads).
int use_device(const DeviceShape& shape, const Schedule& schedule);

// The calling thread's last launch: its configuration, and what ran.
struct LaunchRecord {
  dim3 grid{0, 0, 0};
  dim3 block{0, 0, 0};
  size_t shared_bytes = 0;
  bool ran = false;       // false: refused (a bad configuration) or nothing launched yet
  uint64_t threads = 0;   // threads that ran to the end
  uint64_t warp_ops = 0;  // warp operations completed (one per mask, not per lane)
  uint64_t barriers = 0;  // __syncthreads completed
  uint64_t switches = 0;  // fiber switches
};
LaunchRecord last_launch();

}  // namespace pycoll::emulation
