// pycoll._C.gpu: the GPU side of a communicator (grouped programs over NCCL, csrc/engine/gpu_backend.h),
// CUDA events for Work, and where a pointer lives.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "python/bindings.h"

#if PYCOLL_WITH_CUDA
#include "engine/gpu_backend.h"
#include "pycoll/cuda_check.h"
#include "python/nccl_handle.h"
#endif

namespace py = pybind11;

namespace pycoll::python {

#if PYCOLL_WITH_CUDA
namespace {

// A CUDA event recorded on a stream: what a GPU Work polls (never blocking without a deadline).
class Event {
 public:
  Event() { PYCOLL_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(uintptr_t stream) { PYCOLL_CHECK_CUDA(cudaEventRecord(event_, reinterpret_cast<cudaStream_t>(stream))); }
  // True once the work before the record has finished; throws the CUDA error a failed kernel left.
  bool query() {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    PYCOLL_CHECK_CUDA(e);
    return true;
  }
  // Makes `stream` wait for the event (no host synchronization).
  void block(uintptr_t stream) {
    PYCOLL_CHECK_CUDA(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), event_, 0));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// The device a pointer's memory is on, -1 for host memory pycoll should treat as such.
int pointer_device(uintptr_t ptr) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unregistered pointer
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}

}  // namespace

void bind_gpu(py::module_& m) {
  py::module_ gpu = m.def_submodule("gpu", "collectives on GPUs: grouped programs over NCCL, events");
  gpu.attr("built") = true;
  gpu.def("pointer_device", &pointer_device, py::arg("ptr"));
  py::class_<Event>(gpu, "Event")
      .def(py::init<>())
      .def("record", &Event::record, py::arg("stream"))
      .def("query", &Event::query)
      .def("block", &Event::block, py::arg("stream"));
  // One collective's arguments (cuda::GpuCommunicator::Call), filled in by pycoll/gpu.py.
  using Call = cuda::GpuCommunicator::Call;
  py::class_<Call>(gpu, "Call")
      .def(py::init<>())
      .def_readwrite("input", &Call::input)
      .def_readwrite("output", &Call::output)
      .def_property(
          "dtype", [](const Call& c) { return static_cast<int>(c.dtype); },
          [](Call& c, int v) {
            if (v < 0 || v >= kNumDTypes) throw Error(ErrorKind::kInvalidUsage, "unknown dtype code");
            c.dtype = static_cast<DType>(v);
            c.desc.dtype = v;
          })
      .def_property(
          "op", [](const Call& c) { return static_cast<int>(c.op); },
          [](Call& c, int v) {
            if (v < 0 || v >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code");
            c.op = static_cast<RedOp>(v);
            c.desc.op = v;
          })
      .def_property(
          "collective", [](const Call& c) { return c.desc.collective; }, [](Call& c, int v) { c.desc.collective = v; })
      .def_property(
          "algorithm", [](const Call& c) { return c.desc.algorithm; }, [](Call& c, int v) { c.desc.algorithm = v; })
      .def_property(
          "count", [](const Call& c) { return c.desc.count; }, [](Call& c, int64_t v) { c.desc.count = v; })
      .def_property(
          "root", [](const Call& c) { return c.desc.root; }, [](Call& c, int v) { c.desc.root = v; })
      .def_property(
          "codec_id", [](const Call& c) { return c.desc.codec; }, [](Call& c, int64_t v) { c.desc.codec = v; })
      .def_property(
          "codec_kind", [](const Call& c) { return static_cast<int>(c.codec.kind); },
          [](Call& c, int v) { c.codec.kind = static_cast<codec::Kind>(v); })
      .def_property(
          "codec_block", [](const Call& c) { return c.codec.block; }, [](Call& c, uint32_t v) { c.codec.block = v; })
      .def_property(
          "codec_rounding", [](const Call& c) { return static_cast<int>(c.codec.rounding); },
          [](Call& c, int v) { c.codec.rounding = static_cast<codec::Rounding>(v); })
      .def_readwrite("block_elems", &Call::block_elems)
      .def_readwrite("block_bytes", &Call::block_bytes)
      .def_readwrite("residual", &Call::residual)
      .def_readwrite("seed", &Call::seed)
      .def_readwrite("rotation_block", &Call::rotation_block)
      .def_readwrite("rotate_input_part", &Call::rotate_input_part)
      .def_readwrite("rotate_output_part", &Call::rotate_output_part)
      .def_readwrite("exact_src", &Call::exact_src)
      .def_readwrite("exact_dst", &Call::exact_dst)
      .def_readwrite("exact_count", &Call::exact_count)
      .def_readwrite("stream", &Call::stream);
  py::class_<cuda::GpuCommunicator, std::shared_ptr<cuda::GpuCommunicator>>(gpu, "GpuCommunicator")
      .def(py::init([](PyComm& nccl) { return std::make_shared<cuda::GpuCommunicator>(nccl.shared()); }),
           py::arg("nccl_comm"))
      .def(py::init<>(), "a host-staged GPU communicator: NativeCommunicator.run (Call.gpu) moves its messages")
      .def(
          "run",
          [](cuda::GpuCommunicator& self, const NativePlan& plan, const GroupedProgram& program, const Call& call) {
            py::gil_scoped_release release;
            self.run(plan, program, call);
          },
          py::arg("plan"), py::arg("program"), py::arg("call"));
}

#else

void bind_gpu(py::module_& m) {
  py::module_ gpu = m.def_submodule("gpu", "collectives on GPUs (this build has no CUDA)");
  gpu.attr("built") = false;
  gpu.def("pointer_device", [](uintptr_t) { return -1; }, py::arg("ptr"));
}

#endif

}  // namespace pycoll::python
