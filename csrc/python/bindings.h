// Parts of the pybind11 module pycoll._C defined in their own files (module.cc calls each once).
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {
class Communicator;
}

namespace pycoll::python {

// pycoll._C.cuda: device queries, memory and the kernels on raw device pointers (tests, benchmarks).
void bind_cuda(pybind11::module_& m);
// pycoll._C.nccl: the lazily loaded NCCL library and its communicators.
void bind_nccl(pybind11::module_& m);
// pycoll._C.gpu: GPU communicators (grouped programs over NCCL), CUDA events, pointer queries.
void bind_gpu(pybind11::module_& m);
// pycoll._C.testing: what only the tests ask of the native core (testing.cc).
void bind_testing(pybind11::module_& m);
// pycoll._C.ControlListener and ControlLinks: the fault plane's native side (csrc/fault/).
void bind_fault(pybind11::module_& m);
// The skew recorder's methods on pycoll._C.NativeCommunicator (csrc/engine/skew.h).
void bind_skew(pybind11::module_& m, pybind11::class_<Communicator>& cls);
// The flight recorder and probes (csrc/engine/flight_recorder.h, csrc/fault/probe.h): pycoll/flight/.
void bind_trace(pybind11::module_& m, pybind11::class_<Communicator>& cls);

}  // namespace pycoll::python
