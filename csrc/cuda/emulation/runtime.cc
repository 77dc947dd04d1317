// The CUDA runtime functions the kernels' launch code calls (csrc/cuda/launch.cuh, cuda_check.h),
// answered from the emulated device the test chose (emulation.h use_device): device ordinals, attributes,
// occupancy, and the last error with its name and text. A function the launch code starts to call and
// this file lacks is a link error of the emulated build, not a silent answer.
#include "cuda/emulation/runtime.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace pycoll::emulation {
namespace {

constexpr int kMaxThreadsPerBlock = 1024;

std::mutex devices_mutex;
std::vector<DeviceShape> devices;  // by ordinal

thread_local int current_device = -1;
thread_local Schedule current_sched;
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaError_t explained_error = cudaSuccess;  // the error `explanation` is about
thread_local std::string explanation;
thread_local std::string error_text;  // what cudaGetErrorString returned last
thread_local LaunchRecord last_record;

bool same(const DeviceShape& a, const DeviceShape& b) {
  return a.sms == b.sms && a.blocks_per_sm == b.blocks_per_sm && a.max_threads_per_block == b.max_threads_per_block;
}

int ordinal_of(const DeviceShape& shape) {
  std::lock_guard<std::mutex> lock(devices_mutex);
  for (size_t i = 0; i < devices.size(); ++i)
    if (same(devices[i], shape)) return static_cast<int>(i);
  devices.push_back(shape);
  return static_cast<int>(devices.size() - 1);
}

bool shape_of(int ordinal, DeviceShape& shape) {
  std::lock_guard<std::mutex> lock(devices_mutex);
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= devices.size()) return false;
  shape = devices[static_cast<size_t>(ordinal)];
  return true;
}

int device_here() {
  if (current_device < 0) current_device = ordinal_of(DeviceShape{});
  return current_device;
}

cudaError_t fail(cudaError_t err, std::string why) {
  detail::set_last_error(err, std::move(why));
  return err;
}

const char* error_name(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}

// The runtime's own texts for these codes.
const char* error_string(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "unknown error";
  }
}

}  // namespace

const char* order_name(Order order) {
  switch (order) {
    case Order::kInOrder:
      return "in order";
    case Order::kReversed:
      return "reversed";
    case Order::kRandom:
      return "random";
  }
  return "?";
}

int use_device(const DeviceShape& shape, const Schedule& schedule) {
  if (shape.sms < 1 || shape.blocks_per_sm < 1)
    throw std::invalid_argument("an emulated device needs at least 1 multiprocessor and 1 block per multiprocessor");
  if (shape.max_threads_per_block < 1 || shape.max_threads_per_block > kMaxThreadsPerBlock)
    throw std::invalid_argument("max_threads_per_block must be in [1, 1024], got " +
                                std::to_string(shape.max_threads_per_block));
  if (schedule.order != Order::kInOrder && schedule.order != Order::kReversed && schedule.order != Order::kRandom)
    throw std::invalid_argument("unknown schedule order code " + std::to_string(static_cast<int>(schedule.order)));
  current_device = ordinal_of(shape);
  current_sched = schedule;
  return current_device;
}

LaunchRecord last_launch() {
  return last_record;
}

namespace detail {

DeviceShape current_shape() {
  DeviceShape shape;
  shape_of(device_here(), shape);
  return shape;
}

Schedule current_schedule() {
  return current_sched;
}

void set_last_error(cudaError_t err, std::string why) {
  last_error = err;
  explained_error = err;
  explanation = std::move(why);
}

void set_last_launch(const LaunchRecord& record) {
  last_record = record;
}

}  // namespace detail
}  // namespace pycoll::emulation

using pycoll::emulation::DeviceShape;
namespace emu = pycoll::emulation;

extern "C" {

cudaError_t cudaGetDevice(int* device) {
  if (!device) return emu::fail(cudaErrorInvalidValue, "cudaGetDevice(nullptr)");
  *device = emu::device_here();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  DeviceShape s;
  if (!value) return emu::fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(nullptr, ...)");
  if (!emu::shape_of(device, s))
    return emu::fail(cudaErrorInvalidDevice, "no emulated device " + std::to_string(device));
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = s.sms;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
      *value = s.max_threads_per_block;
      return cudaSuccess;
    case cudaDevAttrMaxBlockDimZ:
      *value = 64;
      return cudaSuccess;
    case cudaDevAttrMaxGridDimX:
      *value = 2147483647;
      return cudaSuccess;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ:
      *value = 65535;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    default:
      return emu::fail(cudaErrorInvalidValue,
                       "device attribute " + std::to_string(static_cast<int>(attr)) + " is not emulated");
  }
}

// The device shape's blocks per multiprocessor, for any kernel whose block fits the device (0 else, as
// CUDA answers for a block size the kernel cannot be launched with).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func, int block_size,
                                                          size_t dynamic_smem_bytes) {
  if (!num_blocks || !func) return emu::fail(cudaErrorInvalidValue, "occupancy of a null kernel or into nullptr");
  if (block_size < 1) return emu::fail(cudaErrorInvalidValue, "occupancy for a block of less than one thread");
  const DeviceShape s = emu::detail::current_shape();
  *num_blocks = block_size <= s.max_threads_per_block && dynamic_smem_bytes == 0 ? s.blocks_per_sm : 0;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t err = emu::last_error;
  emu::last_error = cudaSuccess;
  return err;
}

cudaError_t cudaPeekAtLastError(void) {
  return emu::last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  return emu::error_name(error);
}

const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == emu::explained_error && !emu::explanation.empty()) {
    emu::error_text = std::string(emu::error_string(error)) + "; emulation: " + emu::explanation;
    return emu::error_text.c_str();
  }
  return emu::error_string(error);
}

}  // extern "C"
