// Native work without the GIL, safe in daemon threads at interpreter exit.
//
// pybind11's gil_scoped_release takes the GIL back in its destructor. When a daemon thread does that after
// the interpreter began to finalize, CPython ends the thread with pthread_exit, and that exit unwinds the
// stack; unwinding through a destructor (implicitly noexcept) calls std::terminate, so the whole process
// aborts at exit ("terminate called without an active exception", status 134). The fault plane's threads
// are daemon threads that wait in native code (ControlLinks.take, ControlListener.next_join), and a user's
// thread may be one that runs a collective. without_gil takes the GIL back in a plain call instead: the
// thread's exit unwinds through it, and through pybind11's dispatcher, which lets such an unwinding pass.
#pragma once

#include <Python.h>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace pycoll::python {

template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  using R = decltype(f());
  std::exception_ptr error;
  PyThreadState* state = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
    PyEval_RestoreThread(state);  // not in a destructor: see above
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> out;
    try {
      out.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
    PyEval_RestoreThread(state);  // not in a destructor: see above
    if (error) std::rethrow_exception(error);
    return std::move(*out);
  }
}

}  // namespace pycoll::python
