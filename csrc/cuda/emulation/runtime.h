// Between the emulated CUDA runtime (runtime.cc: devices, the last error) and the scheduler
// (scheduler.cc): what a launch reads of the calling thread's device and what it leaves behind.
#pragma once

#include <driver_types.h>

#include <string>

#include "cuda/emulation/emulation.h"

namespace pycoll::emulation::detail {

// The calling thread's current device and schedule (the default device when none was chosen).
DeviceShape current_shape();
Schedule current_schedule();

// What cudaGetLastError() returns next on this thread; `why` is what cudaGetErrorString adds to the
// error's own text.
void set_last_error(cudaError_t err, std::string why);
void set_last_launch(const LaunchRecord& record);

}  // namespace pycoll::emulation::detail
