// numpy arrays as the bindings' loops take them: a C-contiguous array's data, items and bytes, or a clear
// InvalidUsageError naming the argument that is not one. Shared by module.cc and testing.cc.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "pycoll/errors.h"

namespace pycoll::python {

namespace py = pybind11;

// The data of the numpy array `obj` (the argument `what`); None gives nullptr unless `required`.
template <class T>
inline T* array_data(py::handle obj, const char* what, bool required = true) {
  if (obj.is_none()) {
    if (required) throw Error(ErrorKind::kInvalidUsage, std::string(what) + " is required");
    return nullptr;
  }
  if (!py::isinstance<py::array>(obj))
    throw Error(ErrorKind::kInvalidUsage, std::string(what) + " must be a numpy array");
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (!(arr.flags() & py::array::c_style))
    throw Error(ErrorKind::kInvalidUsage, std::string(what) + " must be C-contiguous");
  return static_cast<T*>(arr.mutable_data());
}

inline size_t array_items(py::handle obj) {
  return obj.is_none() ? 0 : static_cast<size_t>(py::reinterpret_borrow<py::array>(obj).size());
}
inline size_t array_nbytes(py::handle obj) {
  return obj.is_none() ? 0 : static_cast<size_t>(py::reinterpret_borrow<py::array>(obj).nbytes());
}

}  // namespace pycoll::python
