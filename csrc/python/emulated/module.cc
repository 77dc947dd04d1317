// The pybind11 module pycoll._emulated_kernels: the CUDA kernels of csrc/cuda compiled for the CPU
// emulation (csrc/cuda/emulation/), on raw host pointers, with the same calls as pycoll._C.cuda
// (python/kernel_bindings.h), plus the choice of emulated device and schedule and what the last launch
// did. A module of its own: its pycoll::cuda functions and CUDA runtime are the emulation's, never linked
// beside the real ones of pycoll._C. pycoll.testing.emulated_kernels is its Python face.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/emulation/emulation.h"
#include "pycoll/errors.h"
#include "python/error_translation.h"
#include "python/kernel_bindings.h"

namespace py = pybind11;
using namespace pycoll;

namespace {

// Host memory needs no check: the emulated kernels read and write it directly.
void host_pointers(python::PointerList) {}

py::tuple dims(const dim3& d) {
  return py::make_tuple(d.x, d.y, d.z);
}

}  // namespace

PYBIND11_MODULE(_emulated_kernels, m) {
  m.doc() = "pycoll's CUDA kernels run on the CPU by an emulation of the CUDA execution model (tests)";
  python::register_error_translator();

  m.def(
      "use_device",
      [](int sms, int blocks_per_sm, int max_threads_per_block, int order, uint64_t seed) {
        emulation::DeviceShape shape;
        shape.sms = sms;
        shape.blocks_per_sm = blocks_per_sm;
        shape.max_threads_per_block = max_threads_per_block;
        try {
          return emulation::use_device(shape, emulation::Schedule{static_cast<emulation::Order>(order), seed});
        } catch (const std::invalid_argument& e) {
          throw Error(ErrorKind::kInvalidUsage, e.what());
        }
      },
      py::arg("sms"), py::arg("blocks_per_sm"), py::arg("max_threads_per_block"), py::arg("order"), py::arg("seed"),
      "makes this shape the calling thread's emulated device and sets how its launches are scheduled (order: 0 in "
      "order, 1 reversed, 2 random); returns the device's ordinal");
  m.def(
      "last_launch",
      [] {
        const emulation::LaunchRecord r = emulation::last_launch();
        py::dict d;
        d["grid"] = dims(r.grid);
        d["block"] = dims(r.block);
        d["shared_bytes"] = r.shared_bytes;
        d["ran"] = r.ran;
        d["threads"] = r.threads;
        d["warp_ops"] = r.warp_ops;
        d["barriers"] = r.barriers;
        d["switches"] = r.switches;
        return d;
      },
      "what the calling thread's last launch was and did");
  python::def_kernels(m, host_pointers);
}
