// The NCCL communicator as Python holds it (pycoll._C.nccl.Comm), shared by bind_nccl.cc and bind_gpu.cc.
// Only for builds with CUDA.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <memory>
#include <string>

#include "nccl/nccl.h"
#include "pycoll/errors.h"

namespace pycoll::python {

// The communicator as Python holds it: NCCL's destroy waits (up to the communicator's timeout) for the
// operations in flight, so the GIL is released around it even when the last reference goes away.
class PyComm {
 public:
  PyComm(const pybind11::bytes& id, int world, int rank, double timeout_s) {
    std::string raw = id;
    nccl::UniqueId uid;
    if (raw.size() != uid.size())
      throw Error(ErrorKind::kInvalidUsage,
                  "an NCCL unique id is " + std::to_string(uid.size()) + " bytes, got " + std::to_string(raw.size()));
    std::copy(raw.begin(), raw.end(), uid.begin());
    pybind11::gil_scoped_release release;
    comm_ = std::make_shared<nccl::Comm>(uid, world, rank, timeout_s);
  }
  ~PyComm() {
    pybind11::gil_scoped_release release;
    comm_.reset();
  }
  nccl::Comm& get() { return *comm_; }
  // For the GPU communicator (csrc/python/bind_gpu.cc), which keeps the NCCL communicator alive too.
  std::shared_ptr<nccl::Comm> shared() const { return comm_; }

 private:
  std::shared_ptr<nccl::Comm> comm_;
};

}  // namespace pycoll::python
