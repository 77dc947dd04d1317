// The pybind11 module pycoll._C: the native communicator (shared-memory transport + executor), plans
// compiled from the op tables of pycoll/algorithms/plan.py, and the mapping of pycoll::Error kinds to
// the exception classes of pycoll/errors.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cpu/reduce.h"
#include "engine/descriptor.h"
#include "engine/executor.h"
#include "engine/plan.h"
#include "transport/shm.h"

namespace py = pybind11;
using namespace pycoll;

namespace {

// Column order of the op table (pycoll/algorithms/plan.py OP_COLUMNS).
enum Col { kKind, kCount, kSendPeer, kRecvPeer, kSrcBuf, kSrcOff, kDstBuf, kDstOff, kFinalize, kNumCols };

std::shared_ptr<NativePlan> compile_plan(py::array_t<int64_t, py::array::c_style | py::array::forcecast> table,
                                         py::array_t<int64_t, py::array::c_style | py::array::forcecast> starts,
                                         int64_t itemsize, int64_t input_count, int64_t output_count, int rank,
                                         int world) {
  if (table.ndim() != 2 || (table.shape(0) > 0 && table.shape(1) != kNumCols))
    throw Error(ErrorKind::kInternal, "plan table must be [n_ops, " + std::to_string(kNumCols) + "]");
  if (itemsize <= 0 || itemsize > 8) throw Error(ErrorKind::kInternal, "bad itemsize");
  auto plan = std::make_shared<NativePlan>();
  plan->rank = rank;
  plan->world = world;
  plan->input_bytes = static_cast<uint64_t>(input_count) * itemsize;
  plan->output_bytes = static_cast<uint64_t>(output_count) * itemsize;
  const int64_t n = table.shape(0);
  auto t = table.unchecked<2>();
  auto st = starts.unchecked<1>();
  if (starts.size() < 1 || st(0) != 0 || st(starts.size() - 1) != n)
    throw Error(ErrorKind::kInternal, "plan step starts must run from 0 to the number of ops");
  plan->ops.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    PlanOp op{};
    op.kind = static_cast<OpKind>(t(i, kKind));
    if (t(i, kKind) < 0 || t(i, kKind) > static_cast<int64_t>(OpKind::kCopy))
      throw Error(ErrorKind::kInternal, "plan op " + std::to_string(i) + " has unknown kind");
    op.bytes = static_cast<uint64_t>(t(i, kCount)) * itemsize;
    op.send_peer = static_cast<int32_t>(t(i, kSendPeer));
    op.recv_peer = static_cast<int32_t>(t(i, kRecvPeer));
    op.src_buf = static_cast<int32_t>(t(i, kSrcBuf));
    op.dst_buf = static_cast<int32_t>(t(i, kDstBuf));
    op.src_off = static_cast<uint64_t>(t(i, kSrcOff)) * itemsize;
    op.dst_off = static_cast<uint64_t>(t(i, kDstOff)) * itemsize;
    op.finalize = t(i, kFinalize) != 0;
    op.prev_send_same_peer = -1;
    auto bad = [&](const std::string& why) {
      throw Error(ErrorKind::kInternal, "plan op " + std::to_string(i) + " is invalid: " + why);
    };
    if (t(i, kCount) < 0) bad("negative count");
    if (op_sends(op.kind) && (op.send_peer < 0 || op.send_peer >= world || op.send_peer == rank))
      bad("send peer out of range");
    if (op_receives(op.kind) && (op.recv_peer < 0 || op.recv_peer >= world || op.recv_peer == rank))
      bad("receive peer out of range");
    auto limit = [&](int32_t buf) { return buf == kInput ? plan->input_bytes : plan->output_bytes; };
    if (op.src_buf < 0 || op.src_buf > 1 || op.dst_buf < 0 || op.dst_buf > 1) bad("unknown buffer");
    bool reads_src = op.kind == OpKind::kSend || op.kind == OpKind::kRecvReduce || op.kind == OpKind::kRecvReduceSend ||
                     op.kind == OpKind::kRecvReduceCopySend || op.kind == OpKind::kCopy;
    bool writes_dst = op.kind != OpKind::kSend && op.kind != OpKind::kRecvReduceSend;
    if (reads_src && op.src_off + op.bytes > limit(op.src_buf)) bad("reads past the end of its buffer");
    if (writes_dst && op.dst_off + op.bytes > limit(op.dst_buf)) bad("writes past the end of its buffer");
    plan->ops.push_back(op);
  }
  for (py::ssize_t s = 0; s < starts.size(); ++s) {
    if (s > 0 && st(s) < st(s - 1)) throw Error(ErrorKind::kInternal, "plan step starts must not decrease");
    plan->step_begin.push_back(static_cast<uint32_t>(st(s)));
  }
  // Messages to one peer within a step go out in list order.
  for (size_t s = 0; s + 1 < plan->step_begin.size(); ++s) {
    std::vector<int32_t> last_sender(world, -1);
    for (uint32_t i = plan->step_begin[s]; i < plan->step_begin[s + 1]; ++i) {
      PlanOp& op = plan->ops[i];
      if (!op_sends(op.kind)) continue;
      op.prev_send_same_peer = last_sender[op.send_peer];
      last_sender[op.send_peer] = static_cast<int32_t>(i);
    }
  }
  return plan;
}

class NativeCommunicator {
 public:
  NativeCommunicator(int rank, int world, size_t slot_bytes, uint32_t slots, int64_t spin_ns, int64_t yield_ns,
                     uint64_t stream_min_bytes)
      : transport_(rank, world, ShmConfig{slot_bytes, slots}) {
    ExecutorPolicy policy;
    policy.spin_ns = spin_ns;
    policy.yield_ns = yield_ns;
    policy.stream_min_bytes = stream_min_bytes;
    // Deliver Ctrl-C (and other Python signal handlers) to a rank stuck waiting for its peers.
    policy.on_idle = [] {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    };
    executor_ = std::make_unique<Executor>(transport_, policy);
  }

  void run(const NativePlan& plan, uintptr_t input, uintptr_t output, int dtype, int op, int collective, int algorithm,
           int64_t count, int root, int codec, double timeout_s) {
    if (plan.world != transport_.world() || plan.rank != transport_.rank())
      throw Error(ErrorKind::kInternal, "plan was built for another rank or world size");
    if (dtype < 0 || dtype >= kNumDTypes) throw Error(ErrorKind::kInvalidUsage, "unknown dtype code");
    if (op < 0 || op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code");
    RunArgs args;
    args.input = reinterpret_cast<const void*>(input);
    args.output = reinterpret_cast<void*>(output);
    args.dtype = static_cast<DType>(dtype);
    args.op = static_cast<RedOp>(op);
    args.desc = Descriptor{collective, algorithm, dtype, op, count, root, codec};
    args.timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    executor_->run(plan, args);
  }

  void abort(int kind, const std::string& message) { transport_.abort(Error(static_cast<ErrorKind>(kind), message)); }

  ShmTransport& transport() { return transport_; }
  uint64_t seq() const { return executor_->seq(); }

 private:
  ShmTransport transport_;
  std::unique_ptr<Executor> executor_;
  std::mutex mu_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pycoll native core: shared-memory transport, plan executor, reduce kernels";

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

  py::list collectives, algorithms;
  for (auto* n : kCollectiveNames) collectives.append(n);
  for (auto* n : kAlgorithmNames) algorithms.append(n);
  m.attr("COLLECTIVES") = collectives;
  m.attr("ALGORITHMS") = algorithms;
  m.attr("ERROR_KINDS") =
      py::dict(py::arg("internal") = 0, py::arg("timeout") = 1, py::arg("peer_lost") = 2, py::arg("mismatch") = 3,
               py::arg("invalid_usage") = 4, py::arg("nccl") = 5, py::arg("broken") = 6, py::arg("system") = 7);
  m.def("reduce_isa", &cpu::reduce_isa, "instruction set of the CPU reduce loops in use");
  m.def("hardware_concurrency", [] { return std::thread::hardware_concurrency(); });
  // The data address of a numpy array, without the dict that __array_interface__ builds on every call.
  m.def("array_address", [](py::handle obj) {
    if (!py::isinstance<py::array>(obj)) throw Error(ErrorKind::kInvalidUsage, "expected a numpy.ndarray");
    return reinterpret_cast<uintptr_t>(py::reinterpret_borrow<py::array>(obj).data());
  });

  py::class_<NativePlan, std::shared_ptr<NativePlan>>(m, "NativePlan")
      .def(py::init(&compile_plan), py::arg("table"), py::arg("starts"), py::arg("itemsize"), py::arg("input_count"),
           py::arg("output_count"), py::arg("rank"), py::arg("world"))
      .def_property_readonly("num_ops", [](const NativePlan& p) { return p.ops.size(); })
      .def_property_readonly("num_steps",
                             [](const NativePlan& p) { return p.step_begin.empty() ? 0 : p.step_begin.size() - 1; });

  py::class_<NativeCommunicator>(m, "NativeCommunicator")
      .def(py::init<int, int, size_t, uint32_t, int64_t, int64_t, uint64_t>(), py::arg("rank"), py::arg("world"),
           py::arg("slot_bytes"), py::arg("slots"), py::arg("spin_ns"), py::arg("yield_ns"),
           py::arg("stream_min_bytes"))
      .def_property_readonly("segment_fd", [](NativeCommunicator& c) { return c.transport().segment_fd(); })
      .def_property_readonly("segment_bytes", [](NativeCommunicator& c) { return c.transport().segment_bytes(); })
      .def_property_readonly("fragment_bytes", [](NativeCommunicator& c) { return c.transport().fragment_bytes(); })
      .def_property_readonly("seq", &NativeCommunicator::seq)
      .def("connect", [](NativeCommunicator& c, const std::vector<int>& pids,
                         const std::vector<int>& fds) { c.transport().connect(pids, fds); })
      .def("close_segment_fd", [](NativeCommunicator& c) { c.transport().close_segment_fd(); })
      .def("run", &NativeCommunicator::run, py::arg("plan"), py::arg("input"), py::arg("output"), py::arg("dtype"),
           py::arg("op"), py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("root"),
           py::arg("codec"), py::arg("timeout_s"))
      .def("abort", &NativeCommunicator::abort, py::arg("kind"), py::arg("message"));
}
