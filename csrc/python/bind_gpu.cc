// pycoll._C.gpu: the GPU side of a communicator (grouped programs over NCCL, csrc/cuda/gpu_backend.h),
// CUDA events for Work, and where a pointer lives.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "python/bindings.h"

#if PYCOLL_WITH_CUDA
#include "cuda/gpu_backend.h"
#include "pycoll/cuda_check.h"
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
  py::class_<cuda::GpuCommunicator>(gpu, "GpuCommunicator")
      .def(py::init<std::shared_ptr<nccl::Comm>>(), py::arg("nccl_comm"))
      .def_property_readonly("seq", &cuda::GpuCommunicator::seq)
      .def(
          "run",
          [](cuda::GpuCommunicator& self, const NativePlan& plan, const GroupedProgram& program, uintptr_t input,
             uintptr_t output, int dtype, int op, int collective, int algorithm, int64_t count, int root,
             int64_t codec_id, int codec_kind, uint32_t codec_block, int codec_rounding, uint32_t block_elems,
             uint32_t block_bytes, uint64_t encoded_bytes, uintptr_t residual, uint64_t seed, uintptr_t stream) {
            if (dtype < 0 || dtype >= kNumDTypes || op < 0 || op >= kNumRedOps)
              throw Error(ErrorKind::kInvalidUsage, "unknown dtype or op code");
            cuda::GpuCommunicator::Call c;
            c.input = input;
            c.output = output;
            c.dtype = static_cast<DType>(dtype);
            c.op = static_cast<RedOp>(op);
            c.desc = Descriptor{collective, algorithm, dtype, op, count, root, codec_id};
            c.codec.kind = static_cast<codec::Kind>(codec_kind);
            c.codec.block = codec_block;
            c.codec.rounding = static_cast<codec::Rounding>(codec_rounding);
            c.block_elems = block_elems;
            c.block_bytes = block_bytes;
            c.encoded_bytes = encoded_bytes;
            c.residual = residual;
            c.seed = seed;
            c.stream = stream;
            py::gil_scoped_release release;
            self.run(plan, program, c);
          },
          py::arg("plan"), py::arg("program"), py::arg("input"), py::arg("output"), py::arg("dtype"), py::arg("op"),
          py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("root"), py::arg("codec_id"),
          py::arg("codec_kind"), py::arg("codec_block"), py::arg("codec_rounding"), py::arg("block_elems"),
          py::arg("block_bytes"), py::arg("encoded_bytes"), py::arg("residual"), py::arg("seed"), py::arg("stream"));
}

#else

void bind_gpu(py::module_& m) {
  py::module_ gpu = m.def_submodule("gpu", "collectives on GPUs (this build has no CUDA)");
  gpu.attr("built") = false;
  gpu.def("pointer_device", [](uintptr_t) { return -1; }, py::arg("ptr"));
}

#endif

}  // namespace pycoll::python
