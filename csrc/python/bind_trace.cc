// The flight recorder (csrc/engine/flight_recorder.h) and probes (csrc/fault/probe.h) as pycoll/flight/
// drives them, and the one reader of Python stacks that needs no GIL.
#include <dlfcn.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "engine/communicator.h"
#include "engine/flight_recorder.h"
#include "fault/probe.h"
#include "python/bindings.h"
#include "python/call_site.h"
#include "python/gil.h"

namespace py = pybind11;

namespace pycoll::python {

namespace {

// Every thread's Python stack, as faulthandler writes it when a fatal signal arrives or its watchdog fires
// (CPython's _Py_DumpTracebackThreads): read from the interpreter's thread states without the GIL, so that
// it works while the thread that holds the GIL is busy in C. What it cannot see: C frames (a thread in a C
// call shows the Python line that called it), more than 100 frames or 100 threads, and a frame that is being
// pushed or popped at that instant (faulthandler's own caveat).
using DumpThreads = const char* (*)(int fd, PyInterpreterState* interp, PyThreadState* current);
std::atomic<PyInterpreterState*> g_interp{nullptr};

std::string dump_stacks() {
  static const auto dump = reinterpret_cast<DumpThreads>(::dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads"));
  if (!dump) return "(this Python has no _Py_DumpTracebackThreads: its stacks cannot be read without the GIL)";
  PyInterpreterState* interp = g_interp.load();
  if (!interp) return "(the interpreter is shutting down)";
  const int fd = ::memfd_create("pycoll-stacks", MFD_CLOEXEC);
  if (fd < 0) return "(no memory file for the stacks)";
  const char* failed = dump(fd, interp, nullptr);
  std::string text;
  if (::lseek(fd, 0, SEEK_SET) == 0) {
    char buf[4096];
    for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(k));
  }
  ::close(fd);
  if (failed) text += std::string("(") + failed + ")\n";
  return text;
}

Descriptor descriptor_of(const Call& c) {
  return Descriptor{c.collective, c.algorithm, c.dtype, c.op, c.count, c.root, c.codec_id};
}

}  // namespace

void bind_trace(py::module_& m, py::class_<Communicator>& cls) {
  using trace::FlightRecorder;
  cls.def_property(
      "trace_comm", &Communicator::trace_comm, &Communicator::set_trace_comm,
      "this communicator's id in the flight recorder (trace_comm_id); -1: its records name no communicator");
  m.def(
      "trace_configure", [](size_t capacity) { FlightRecorder::get().configure(capacity); }, py::arg("capacity"),
      "keep the process's last `capacity` collectives (the first capacity holds); 0: record nothing");
  m.def(
      "trace_set_on", [](bool on) { FlightRecorder::get().set_on(on); }, py::arg("on"),
      "switch recording on or off (the overhead benchmark)");
  m.def("trace_on", [] { return FlightRecorder::get().on(); });
  m.def(
      "trace_comm_id",
      [](const std::string& info_json, const std::string& members_json) {
        const int id = FlightRecorder::get().comm_id(info_json);
        fault::set_comm_info(id, info_json, members_json);
        return id;
      },
      py::arg("info"), py::arg("members"),
      "a new communicator's id: its info (a JSON object) and its members' control addresses (a JSON array)");
  m.def(
      "trace_enqueue",
      [](Communicator& comm, const Call& call) {
        // An asynchronous collective, as its caller enqueues it (its call site is the caller's).
        return FlightRecorder::get().begin(comm.trace_comm(), descriptor_of(call), call_site(), 0, false,
                                           trace::now_ns());
      },
      py::arg("comm"), py::arg("call"));
  m.def(
      "trace_begin",
      [](int comm, int collective, int algorithm, int dtype, int op, int64_t count, int root, int64_t codec,
         uint64_t seq) {
        // A GPU collective, enqueued on its stream now (collective `seq` of its communicator).
        const Descriptor d{collective, algorithm, dtype, op, count, root, codec};
        return FlightRecorder::get().begin(comm, d, call_site(), seq, true, trace::now_ns());
      },
      py::arg("comm"), py::arg("collective"), py::arg("algorithm"), py::arg("dtype"), py::arg("op"), py::arg("count"),
      py::arg("root"), py::arg("codec"), py::arg("seq"));
  m.def(
      "trace_end", [](uint64_t ticket, bool ok) { FlightRecorder::get().end(ticket, ok, trace::now_ns()); },
      py::arg("ticket"), py::arg("ok"),
      "the collective of `ticket` completed (ok) or failed: a GPU one, as its watchdog saw it");
  m.def(
      "trace_call_site", [] { return FlightRecorder::get().site_name(call_site()); },
      "the calling thread's call site as the recorder would record it (tests)");
  m.def(
      "trace_internal_paths", [](const std::vector<std::string>& prefixes) { add_internal_paths(prefixes); },
      py::arg("prefixes"), "frames of files under these directories are not call sites (pycoll's, torch's)");
  m.def(
      "trace_report",
      [](size_t records, unsigned flags) {
        fault::ProbeRequest r;
        r.records = records;
        r.flags = flags;
        return without_gil([&] { return fault::probe_report(r); });
      },
      py::arg("records"), py::arg("flags") = 0u, "this process's probe report (JSON), as a probe of it gets it");
  m.def(
      "trace_start_stacks",
      [](long tid, unsigned long ident) {
        g_interp.store(PyInterpreterState_Get());
        fault::set_stack_dumper(&dump_stacks);
        fault::set_main_thread(tid, ident);
      },
      py::arg("main_tid"), py::arg("main_ident"), "let probes read this process's stacks; the main thread's ids");
  m.def("trace_stop_stacks", [] { g_interp.store(nullptr); }, "the interpreter shuts down: no more stacks");
  m.def(
      "probe_body",
      [](size_t records, unsigned flags, const py::bytes& secret, const std::string& challenge) {
        fault::ProbeRequest r;
        r.records = records;
        r.flags = flags;
        r.proof = fault::probe_proof(std::string(secret), challenge);
        return py::bytes(fault::probe_body(r));
      },
      py::arg("records"), py::arg("flags"), py::arg("secret"), py::arg("challenge"),
      "the body of a probe frame, with its proof over the listener's challenge");
  m.attr("TRACE_WITH_STACKS") = fault::kWithStacks;
  m.attr("TRACE_WITH_MEMBERS") = fault::kWithMembers;
}

}  // namespace pycoll::python
