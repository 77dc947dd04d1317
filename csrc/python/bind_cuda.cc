// pycoll._C.cuda: device queries and the CUDA kernels (csrc/cuda/kernels.h) on raw device pointers, for
// tests and benchmarks (device memory comes from torch or cupy; pointers and streams are ints). Without
// CUDA at build time the module is still there: built() is False, device_count() 0, the rest raise.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "pycoll/errors.h"
#include "python/bindings.h"

#if PYCOLL_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/kernels.h"
#include "pycoll/cuda_check.h"
#endif

namespace py = pybind11;

namespace pycoll::python {

#if PYCOLL_WITH_CUDA
namespace {

cudaStream_t as_stream(uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

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

void check_device_pointers(std::initializer_list<std::pair<uintptr_t, const char*>> ptrs) {
  const int dev = current_device();
  for (const auto& [p, what] : ptrs) check_device_pointer(p, what, dev);
}

codec::Kind kind_of(int kind) {
  return static_cast<codec::Kind>(kind);
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

  c.def(
      "reduce",
      [](int dtype, int op, uintptr_t dst, uintptr_t dst2, uintptr_t a, uintptr_t b, size_t n, int avg_divisor,
         uintptr_t stream) {
        if (dtype < 0 || dtype >= kNumDTypes)
          throw Error(ErrorKind::kInvalidUsage, "unknown dtype code " + std::to_string(dtype));
        if (op < 0 || op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code " + std::to_string(op));
        if (n == 0) return;
        py::gil_scoped_release release;
        check_device_pointers({{dst, "dst"}, {dst2, "dst2"}, {a, "a"}, {b, "b"}});
        cuda::reduce(static_cast<DType>(dtype), static_cast<RedOp>(op), reinterpret_cast<void*>(dst),
                     reinterpret_cast<void*>(dst2), reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b),
                     n, avg_divisor, as_stream(stream));
      },
      py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("dst2"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("avg_divisor") = 0, py::arg("stream") = 0,
      "dst[i] = a[i] (+) b[i] (also into dst2 unless 0), / avg_divisor when > 0; enqueued on `stream`");

  c.def(
      "encode",
      [](int kind, uint32_t block, int rounding, uintptr_t src, uintptr_t out, size_t n, uintptr_t residual,
         double residual_scale, uintptr_t decoded, uintptr_t out2, uint64_t index, uint32_t key, uintptr_t stream) {
        const cuda::CodecSpec spec{kind_of(kind), block, static_cast<codec::Rounding>(rounding)};
        cuda::check_codec(spec);
        codec::EncodeArgs a;
        a.src = reinterpret_cast<const float*>(src);
        a.out = reinterpret_cast<uint8_t*>(out);
        a.n = n;
        a.residual = reinterpret_cast<float*>(residual);
        a.residual_scale = static_cast<float>(residual_scale);
        a.decoded = reinterpret_cast<float*>(decoded);
        a.out2 = reinterpret_cast<uint8_t*>(out2);
        a.index = index;
        a.key = key;
        py::gil_scoped_release release;
        if (n > 0)
          check_device_pointers(
              {{src, "src"}, {out, "out"}, {residual, "residual"}, {decoded, "decoded"}, {out2, "out2"}});
        cuda::encode(spec, a, as_stream(stream));
      },
      py::arg("kind"), py::arg("block"), py::arg("rounding"), py::arg("src"), py::arg("out"), py::arg("n"),
      py::arg("residual") = 0, py::arg("residual_scale") = 1.0, py::arg("decoded") = 0, py::arg("out2") = 0,
      py::arg("index") = 0, py::arg("key") = 0, py::arg("stream") = 0,
      "encodes n float32 values at src into out (see pycoll._C.Codec.encode); enqueued on `stream`");

  c.def(
      "decode",
      [](int kind, uint32_t block, int rounding, uintptr_t data, uintptr_t dst, size_t n, uintptr_t acc,
         uintptr_t residual, int divisor, uintptr_t stream) {
        if (residual && !acc) throw Error(ErrorKind::kInvalidUsage, "residual needs acc");
        const cuda::CodecSpec spec{kind_of(kind), block, static_cast<codec::Rounding>(rounding)};
        cuda::check_codec(spec);
        codec::DecodeArgs a;
        a.in = reinterpret_cast<const uint8_t*>(data);
        a.dst = reinterpret_cast<float*>(dst);
        a.n = n;
        a.acc = reinterpret_cast<const float*>(acc);
        a.residual = reinterpret_cast<float*>(residual);
        a.divisor = divisor;
        py::gil_scoped_release release;
        if (n > 0) check_device_pointers({{data, "data"}, {dst, "dst"}, {acc, "acc"}, {residual, "residual"}});
        cuda::decode(spec, a, as_stream(stream));
      },
      py::arg("kind"), py::arg("block"), py::arg("rounding"), py::arg("data"), py::arg("dst"), py::arg("n"),
      py::arg("acc") = 0, py::arg("residual") = 0, py::arg("divisor") = 0, py::arg("stream") = 0,
      "dst = [acc (+ residual) +] decoded, then / divisor (see pycoll._C.Codec.decode); enqueued on `stream`");
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
