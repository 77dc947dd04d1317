// PYCOLL_CHECK_CUDA(call): a CUDA runtime call that fails throws pycoll::Error (kSystem) naming the error,
// its text, the call and file:line (kernel launches are checked the same way by csrc/cuda/launch.cuh).
// Library code never prints or exits on a CUDA failure.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "pycoll/errors.h"

namespace pycoll {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // cudart (linked statically, so this state is pycoll's own) keeps a non-sticky error as its "last
  // error" too: clear it, or the next launch check would report this failure a second time.
  (void)cudaGetLastError();
  throw Error(ErrorKind::kSystem, std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                                      ") in " + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace pycoll

#define PYCOLL_CHECK_CUDA(call)                                                                                   \
  do {                                                                                                            \
    const cudaError_t pycoll_cuda_err_ = (call);                                                                  \
    if (pycoll_cuda_err_ != cudaSuccess) ::pycoll::throw_cuda_error(pycoll_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
