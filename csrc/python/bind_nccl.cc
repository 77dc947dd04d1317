// pycoll._C.nccl: the lazily loaded NCCL (csrc/nccl/nccl.h) on raw device pointers and streams passed as
// ints. pycoll/nccl.py is the Python face of it. In a build without CUDA the submodule exists, built()
// is False and everything else raises InvalidUsageError.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/types.h"
#include "pycoll/errors.h"
#include "python/bindings.h"

#if PYCOLL_WITH_CUDA
#include "nccl/nccl.h"
#include "python/nccl_handle.h"
#endif

namespace py = pybind11;

namespace pycoll::python {

#if PYCOLL_WITH_CUDA

namespace {

DType dtype_arg(int code) {
  if (code < 0 || code >= kNumDTypes)
    throw Error(ErrorKind::kInvalidUsage, "unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

RedOp op_arg(int code) {
  if (code < 0 || code >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code " + std::to_string(code));
  return static_cast<RedOp>(code);
}

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

cudaStream_t stream_arg(uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

}  // namespace

void bind_nccl(py::module_& m) {
  py::module_ n = m.def_submodule("nccl", "NCCL, loaded at first use (pycoll/nccl.py)");
  // Ctrl-C reaches a rank waiting for NCCL (init, a launch): the waiting communicator is aborted.
  nccl::set_wait_hook([] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });
  // Unset the hook before the interpreter goes away (it would take a GIL that no longer exists).
  py::module_::import("atexit").attr("register")(py::cpp_function([] { nccl::set_wait_hook(nullptr); }));

  n.def("built", [] { return true; }, "True: this pycoll was built with CUDA, so NCCL can be loaded");
  n.def(
      "load",
      [](const std::string& path) {
        py::gil_scoped_release release;
        nccl::load(path);
      },
      py::arg("path"), "dlopen libnccl from `path` (once per process)");
  n.def("is_loaded", &nccl::is_loaded);
  n.def("loaded_path", &nccl::loaded_path);
  n.def("version", &nccl::version, "ncclGetVersion's code, e.g. 22805 for 2.28.5");
  n.def("unique_id", [] {
    nccl::UniqueId id;
    {
      py::gil_scoped_release release;
      id = nccl::unique_id();
    }
    return py::bytes(id.data(), id.size());
  });
  n.def("group_start", [] {
    py::gil_scoped_release release;
    nccl::group_start();
  });
  n.def("group_end", [] {
    py::gil_scoped_release release;
    nccl::group_end();
  });

  py::class_<PyComm>(n, "Comm")
      .def(py::init<const py::bytes&, int, int, double>(), py::arg("unique_id"), py::arg("world"), py::arg("rank"),
           py::arg("timeout_s"))
      .def_property_readonly("rank", [](PyComm& c) { return c.get().rank(); })
      .def_property_readonly("world", [](PyComm& c) { return c.get().world(); })
      .def_property_readonly("device", [](PyComm& c) { return c.get().device(); })
      .def_property_readonly("aborted", [](PyComm& c) { return c.get().aborted(); })
      .def_property_readonly("destroyed", [](PyComm& c) { return c.get().destroyed(); })
      .def(
          "all_reduce",
          [](PyComm& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, uintptr_t stream) {
            DType t = dtype_arg(dtype);
            RedOp o = op_arg(op);
            py::gil_scoped_release release;
            c.get().all_reduce(ptr<const void>(send), ptr<void>(recv), count, t, o, stream_arg(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream"))
      .def(
          "reduce_scatter",
          [](PyComm& c, uintptr_t send, uintptr_t recv, size_t recv_count, int dtype, int op, uintptr_t stream) {
            DType t = dtype_arg(dtype);
            RedOp o = op_arg(op);
            py::gil_scoped_release release;
            c.get().reduce_scatter(ptr<const void>(send), ptr<void>(recv), recv_count, t, o, stream_arg(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("recv_count"), py::arg("dtype"), py::arg("op"), py::arg("stream"))
      .def(
          "all_gather",
          [](PyComm& c, uintptr_t send, uintptr_t recv, size_t send_count, int dtype, uintptr_t stream) {
            DType t = dtype_arg(dtype);
            py::gil_scoped_release release;
            c.get().all_gather(ptr<const void>(send), ptr<void>(recv), send_count, t, stream_arg(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("send_count"), py::arg("dtype"), py::arg("stream"))
      .def(
          "broadcast",
          [](PyComm& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root, uintptr_t stream) {
            DType t = dtype_arg(dtype);
            py::gil_scoped_release release;
            c.get().broadcast(ptr<const void>(send), ptr<void>(recv), count, t, root, stream_arg(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream"))
      .def(
          "send",
          [](PyComm& c, uintptr_t buf, size_t bytes, int peer, uintptr_t stream) {
            py::gil_scoped_release release;
            c.get().send(ptr<const void>(buf), bytes, peer, stream_arg(stream));
          },
          py::arg("buf"), py::arg("bytes"), py::arg("peer"), py::arg("stream"))
      .def(
          "recv",
          [](PyComm& c, uintptr_t buf, size_t bytes, int peer, uintptr_t stream) {
            py::gil_scoped_release release;
            c.get().recv(ptr<void>(buf), bytes, peer, stream_arg(stream));
          },
          py::arg("buf"), py::arg("bytes"), py::arg("peer"), py::arg("stream"))
      .def("check_async",
           [](PyComm& c) {
             // Released: the communicator's lock may be held by a wait that needs the GIL for its hook.
             py::gil_scoped_release release;
             c.get().check_async("check_async");
           })
      .def("abort",
           [](PyComm& c) {
             py::gil_scoped_release release;
             c.get().abort();
           })
      .def("destroy", [](PyComm& c) {
        py::gil_scoped_release release;
        c.get().destroy();
      });
}

#else  // !PYCOLL_WITH_CUDA

namespace {

[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::kInvalidUsage,
              "pycoll was built without CUDA, so it cannot use NCCL (rebuild where nvcc is found, or with "
              "PYCOLL_CUDA=on)");
}

class NoComm {};

}  // namespace

void bind_nccl(py::module_& m) {
  py::module_ n = m.def_submodule("nccl", "NCCL (unavailable: pycoll was built without CUDA)");
  n.def("built", [] { return false; });
  n.def("load", [](const std::string&) { no_cuda(); }, py::arg("path"));
  n.def("is_loaded", [] { return false; });
  n.def("loaded_path", []() -> std::string { no_cuda(); });
  n.def("version", []() -> int { no_cuda(); });
  n.def("unique_id", []() -> py::bytes { no_cuda(); });
  n.def("group_start", [] { no_cuda(); });
  n.def("group_end", [] { no_cuda(); });
  py::class_<NoComm>(n, "Comm").def(py::init([](const py::bytes&, int, int, double) -> NoComm* { no_cuda(); }),
                                    py::arg("unique_id"), py::arg("world"), py::arg("rank"), py::arg("timeout_s"));
}

#endif

}  // namespace pycoll::python
