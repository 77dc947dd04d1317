// pycoll._C.cuda: device queries and the CUDA kernels (csrc/cuda/kernels.h) on raw device pointers, for
// tests and benchmarks (device memory comes from torch or cupy; pointers and streams are ints). Without
// CUDA at build time the module is still there: built() is False, device_count() 0, the rest raise.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "pycoll/errors.h"
#include "python/bindings.h"

#if PYCOLL_WITH_CUDA
#include <cuda_runtime_api.h>

#include "pycoll/cuda_check.h"
#include "python/kernel_bindings.h"
#endif

namespace py = pybind11;

namespace pycoll::python {

#if PYCOLL_WITH_CUDA
namespace {

int current_device() {
  int dev = 0;
  PYCOLL_CHECK_CUDA(cudaGetDevice(&dev));
  return dev;
}

// A pointer handed in from Python must be memory the current device can use: a kernel that touched a
// host address would leave the context unusable (a sticky illegal-address error) instead of raising.
void check_device_pointer(uintptr_t ptr, const char* what, int device) {
  if (ptr == 0) return;
  cudaPointerAttributes attr{};
  PYCOLL_CHECK_CUDA(cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr)));
  if (attr.type == cudaMemoryTypeUnregistered)
    throw Error(ErrorKind::kInvalidUsage, std::string(what) + " is not device memory (a host address unknown to CUDA)");
  if (attr.type == cudaMemoryTypeDevice && attr.device != device)
    throw Error(ErrorKind::kInvalidUsage, std::string(what) + " is on cuda:" + std::to_string(attr.device) +
                                              " but the current device is cuda:" + std::to_string(device));
}

void check_device_pointers(PointerList ptrs) {
  const int dev = current_device();
  for (const auto& [p, what] : ptrs) check_device_pointer(p, what, dev);
}

}  // namespace

void bind_cuda(py::module_& m) {
  py::module_ c = m.def_submodule("cuda", "CUDA kernels on raw device pointers (tests, benchmarks)");
  c.def("built", [] { return true; }, "whether pycoll was compiled with CUDA");
  c.def(
      "device_count",
      [] {
        int n = 0;
        const cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          return 0;
        }
        return n;
      },
      "CUDA devices visible; 0 when there is no driver or no device (device_error() says why)");
  c.def(
      "device_error",
      [] {
        int n = 0;
        const cudaError_t err = cudaGetDeviceCount(&n);
        if (err == cudaSuccess) return n > 0 ? std::string() : std::string("no CUDA device");
        (void)cudaGetLastError();
        // The usual cause of cudaErrorInsufficientDriver: no NVIDIA driver at all, or one older than the
        // CUDA runtime pycoll is linked with.
        int driver = 0;
        const std::string drv = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0
                                    ? std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10)
                                    : std::string("none found");
        return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err) + " (pycoll's CUDA runtime " +
               std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) + ", driver " +
               drv + ")";
      },
      "why device_count() is 0 (empty when there are devices)");
  c.def("get_device", &current_device);
  c.def("set_device", [](int device) { PYCOLL_CHECK_CUDA(cudaSetDevice(device)); }, py::arg("device"));
  c.def(
      "synchronize",
      [](uintptr_t stream) {
        py::gil_scoped_release release;
        PYCOLL_CHECK_CUDA(cudaStreamSynchronize(as_stream(stream)));
      },
      py::arg("stream") = 0, "waits for the work enqueued on `stream` (0: the legacy default stream)");

  def_kernels(c, check_device_pointers);
}

#else  // !PYCOLL_WITH_CUDA

void bind_cuda(py::module_& m) {
  py::module_ c = m.def_submodule("cuda", "CUDA kernels on raw device pointers (not built: no nvcc at build time)");
  auto unavailable = [](py::args, py::kwargs) -> py::object {
    throw Error(ErrorKind::kInvalidUsage, "pycoll was built without CUDA (nvcc not found at build time)");
  };
  c.def("built", [] { return false; }, "whether pycoll was compiled with CUDA");
  c.def("device_count", [] { return 0; });
  c.def("device_error", [] { return std::string("pycoll was built without CUDA (nvcc not found at build time)"); });
  for (const char* name : {"get_device", "set_device", "synchronize", "reduce", "encode", "decode"})
    c.def(name, unavailable);
}

#endif

}  // namespace pycoll::python
