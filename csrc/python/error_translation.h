// pycoll::Error, as Python sees it: each ErrorKind becomes the class of the same name in pycoll/errors.py.
// Registered once by each native module (pycoll._C, pycoll._emulated_kernels).
#pragma once

#include <pybind11/pybind11.h>

#include <exception>

#include "pycoll/errors.h"

namespace pycoll::python {

inline void register_error_translator() {
  namespace py = pybind11;
  py::module_ errors = py::module_::import("pycoll.errors");
  static py::object base_error = errors.attr("PycollError");
  static py::object timeout_error = errors.attr("CollectiveTimeoutError");
  static py::object peer_lost_error = errors.attr("PeerLostError");
  static py::object mismatch_error = errors.attr("CollectiveMismatchError");
  static py::object usage_error = errors.attr("InvalidUsageError");
  static py::object nccl_error = errors.attr("NcclError");
  static py::object broken_error = errors.attr("CommunicatorBrokenError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object cls = base_error;
      switch (e.kind()) {
        case ErrorKind::kTimeout:
          cls = timeout_error;
          break;
        case ErrorKind::kPeerLost: {
          py::object exc = peer_lost_error(e.what(), e.peer());
          PyErr_SetObject(peer_lost_error.ptr(), exc.ptr());
          return;
        }
        case ErrorKind::kMismatch:
          cls = mismatch_error;
          break;
        case ErrorKind::kInvalidUsage:
          cls = usage_error;
          break;
        case ErrorKind::kNccl:
          cls = nccl_error;
          break;
        case ErrorKind::kBroken:
          cls = broken_error;
          break;
        default:
          break;
      }
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
}

}  // namespace pycoll::python
