// pycoll._C.testing: what only the tests and the tools that check pycoll ask of the native core (the real
// bindings are in module.cc): a compiled plan's dependencies and chains, the engine's compression rule, the CPU reduce
// loop and HMAC-SHA256 on numpy arrays and bytes, how many connections a TCP transport turned away, and a
// flight recorder read while it is written.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "cpu/reduce.h"
#include "engine/communicator.h"
#include "engine/flight_recorder.h"
#include "engine/op_semantics.h"
#include "engine/plan.h"
#include "python/bindings.h"
#include "python/numpy_args.h"
#include "transport/hmac.h"

namespace py = pybind11;

namespace pycoll::python {
namespace {

// The CPU reduce loop on numpy arrays (any dtype of the right itemsize: float16 / bfloat16 as uint16),
// so that tests can compare the GPU kernel with it bit for bit.
void cpu_reduce(int dtype, int op, py::handle dst, py::handle a, py::handle b, int avg_divisor, py::handle dst2) {
  if (dtype < 0 || dtype >= kNumDTypes)
    throw Error(ErrorKind::kInvalidUsage, "unknown dtype code " + std::to_string(dtype));
  if (op < 0 || op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code " + std::to_string(op));
  const size_t es = dtype_size(static_cast<DType>(dtype));
  void* d = array_data<void>(dst, "dst");
  void* d2 = array_data<void>(dst2, "dst2", false);
  const size_t nbytes = array_nbytes(dst);
  auto input = [&](py::handle h, const char* what) -> const void* {
    if (!py::isinstance<py::array>(h))
      throw Error(ErrorKind::kInvalidUsage, std::string(what) + " must be a numpy array");
    py::array arr = py::reinterpret_borrow<py::array>(h);
    if (!(arr.flags() & py::array::c_style))
      throw Error(ErrorKind::kInvalidUsage, std::string(what) + " must be C-contiguous");
    if (static_cast<size_t>(arr.nbytes()) != nbytes)
      throw Error(ErrorKind::kInvalidUsage, std::string(what) + " must have as many bytes as dst");
    return arr.data();
  };
  const void* pa = input(a, "a");
  const void* pb = input(b, "b");
  if (d2 && array_nbytes(dst2) != nbytes) throw Error(ErrorKind::kInvalidUsage, "dst2 must have as many bytes as dst");
  if (py::reinterpret_borrow<py::array>(dst).itemsize() != static_cast<py::ssize_t>(es))
    throw Error(ErrorKind::kInvalidUsage, std::string("dst must have items of ") + std::to_string(es) + " bytes for " +
                                              dtype_name(static_cast<DType>(dtype)));
  const cpu::ReduceFn fn = cpu::reduce_fn(static_cast<DType>(dtype), static_cast<RedOp>(op));
  py::gil_scoped_release release;
  fn(d, d2, pa, pb, nbytes / es, avg_divisor, false);
}

// Per op: (the ops it waits for, the index before which every op must be done).
py::list plan_dependencies(const NativePlan& p) {
  py::list out;
  for (const PlanOp& op : p.ops) {
    py::list deps;
    for (uint32_t d = op.deps_begin; d < op.deps_end; ++d) deps.append(p.deps[d]);
    out.append(py::make_tuple(deps, op.after_all_before));
  }
  return out;
}

// Per chain of receive-reduces run in one pass (engine/plan_fusion.h): (its member ops, its publishers).
py::list plan_chains(const NativePlan& p) {
  py::list out;
  for (const Chain& c : p.chains) {
    py::list members, publishers;
    for (uint32_t k = c.first; k < c.first + c.count; ++k) members.append(k);
    for (uint32_t k = c.publish_begin; k < c.publish_end; ++k) publishers.append(p.publishers[k]);
    out.append(py::make_tuple(members, publishers));
  }
  return out;
}

}  // namespace

// A flight recorder of `capacity` records written by one thread (begin, start, end of every collective,
// each field a function of its ticket) and read by another (snapshot) for `seconds`: how many records the
// reader got, and how many of them mixed two collectives' fields (the slots' locks let none through).
py::dict flight_recorder_race(double seconds, size_t capacity) {
  trace::FlightRecorder rec;  // its own, not the process's
  rec.configure(capacity);
  std::atomic<bool> stop{false};
  uint64_t writes = 0, reads = 0, torn = 0;
  {
    py::gil_scoped_release release;
    std::thread writer([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto next = static_cast<int64_t>(writes + 1);  // the ticket this begin gets (the only writer)
        Descriptor d;
        d.count = next * 3;
        const uint64_t t = rec.begin(1, d, 2, 0, false, next * 10);
        const auto ns = static_cast<int64_t>(t) * 10;
        rec.start(t, t + 1000, ns + 1);
        rec.end(t, true, ns + 2);
        ++writes;
      }
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const trace::Record& r : rec.snapshot()) {
        ++reads;
        const auto ns = static_cast<int64_t>(r.ticket) * 10;
        bool whole = r.comm == 1 && r.site == 2 && r.desc.count == ns / 10 * 3 && r.enqueue_ns == ns;
        if (r.state == trace::State::kEnqueued) whole = whole && r.seq == 0 && r.start_ns == 0 && r.end_ns == 0;
        if (r.state != trace::State::kEnqueued) whole = whole && r.seq == r.ticket + 1000 && r.start_ns == ns + 1;
        if (r.state == trace::State::kStarted) whole = whole && r.end_ns == 0;
        if (r.state == trace::State::kCompleted) whole = whole && r.end_ns == ns + 2;
        torn += !whole;
      }
    }
    stop.store(true);
    writer.join();
  }
  py::dict out;
  out["writes"] = writes;
  out["reads"] = reads;
  out["torn"] = torn;
  return out;
}

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule("testing", "what only the tests ask of the native core");
  t.def("plan_dependencies", &plan_dependencies, py::arg("plan"));
  t.def(
      "compressible",
      [](int dtype, int op) {
        if (dtype < 0 || dtype >= kNumDTypes || op < 0 || op >= kNumRedOps)
          throw Error(ErrorKind::kInvalidUsage, "unknown dtype or op code");
        return compressible(static_cast<DType>(dtype), static_cast<RedOp>(op));
      },
      py::arg("dtype"), py::arg("op"), "the engine's rule of what a codec compresses (engine/op_semantics.h)");
  t.def("plan_chains", &plan_chains, py::arg("plan"));
  t.def("flight_recorder_race", &flight_recorder_race, py::arg("seconds"), py::arg("capacity"),
        "a recorder written by one thread and read by another: {writes, reads, torn}");
  t.def("cpu_reduce", &cpu_reduce, py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("a"), py::arg("b"),
        py::arg("avg_divisor") = 0, py::arg("dst2") = py::none(),
        "the CPU reduce loop on numpy arrays: dst = a (+) b (also into dst2), / avg_divisor when > 0");
  t.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        const std::string k = key, msg = message;
        const Digest d = hmac_sha256(k.data(), k.size(), msg.data(), msg.size());
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      py::arg("key"), py::arg("message"), "HMAC-SHA256 as the TCP handshake computes it (csrc/transport/hmac.cc)");
  t.def(
      "tcp_rejected", [](Communicator& c) { return c.tcp().rejected_connections(); }, py::arg("comm"),
      "how many connections this rank's TCP transport turned away (failed handshakes)");
  t.def(
      "hold_gil",
      [](double seconds) {
        // Sleeps with the GIL held, as a long C call that never releases it does (a sort of a huge list,
        // pickling a checkpoint, an extension that computes in one call): every other Python thread of the
        // process stands still meanwhile.
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      },
      py::arg("seconds"), "holds the GIL for `seconds` (the busy-rank tests)");
  t.def(
      "tcp_link_now",
      [](Communicator& c, int peer, double timeout_s) {
        py::gil_scoped_release release;
        c.tcp().link_now(peer, timeout_s);
      },
      py::arg("comm"), py::arg("peer"), py::arg("timeout_s"),
      "makes this rank's TCP link to `peer` now, as a collective's first message to it would");
  t.def(
      "tcp_linked", [](Communicator& c) { return c.tcp().linked_peers(); }, py::arg("comm"),
      "the peers this rank's TCP transport has a link to");
}

}  // namespace pycoll::python
