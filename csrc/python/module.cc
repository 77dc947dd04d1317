// The pybind11 module pycoll._C: the native communicator (shared-memory transport + executor), plans
// compiled from the op tables of pycoll/algorithms/plan.py, and the mapping of pycoll::Error kinds to
// the exception classes of pycoll/errors.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cpu/codec.h"
#include "cpu/reduce.h"
#include "engine/cpu_group_backend.h"
#include "engine/descriptor.h"
#include "engine/executor.h"
#include "engine/grouped_executor.h"
#include "engine/plan.h"
#include "kernels/half.h"
#include "python/bindings.h"
#include "transport/composite.h"
#include "transport/hmac.h"
#include "transport/shm.h"
#include "transport/tcp.h"

#if PYCOLL_WITH_CUDA
#include "cuda/gpu_backend.h"
#endif

namespace py = pybind11;
using namespace pycoll;

namespace {

// Column order of the op table (pycoll/algorithms/plan.py OP_COLUMNS).
enum Col {
  kKind,
  kCount,
  kSendPeer,
  kRecvPeer,
  kSrcBuf,
  kSrcOff,
  kDstBuf,
  kDstOff,
  kFinalize,
  kUncompressed,
  kNumCols
};

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
    op.uncompressed = t(i, kUncompressed) != 0;
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
    if (op.src_buf < 0 || op.src_buf > kEncoded || op.dst_buf < 0 || op.dst_buf > kOutput) bad("unknown buffer");
    if (op.src_buf == kEncoded && op.kind != OpKind::kSend) bad("only SEND reads the encoded buffer");
    bool reads_src = op.kind == OpKind::kSend || op.kind == OpKind::kRecvReduce || op.kind == OpKind::kRecvReduceSend ||
                     op.kind == OpKind::kRecvReduceCopySend || op.kind == OpKind::kCopy;
    bool writes_dst = op.kind != OpKind::kSend && op.kind != OpKind::kRecvReduceSend;
    if (reads_src && op.src_off + op.bytes > limit(op.src_buf)) bad("reads past the end of its buffer");
    if (writes_dst && op.dst_off + op.bytes > limit(op.dst_buf)) bad("writes past the end of its buffer");
    plan->uses_encoded |= op.src_buf == kEncoded;
    plan->codec_compatible &=
        op.kind != OpKind::kCopy && !(op.kind == OpKind::kSend && op.src_buf == kOutput && !op.uncompressed);
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
  // Shared memory between the ranks; with `tcp_bind` (the address to listen on) TCP connections; with both
  // that and `local` (local[r]: rank r is on this host) shared memory to this host's ranks and TCP to the
  // others.
  NativeCommunicator(int rank, int world, size_t slot_bytes, uint32_t slots, int64_t spin_ns, int64_t yield_ns,
                     uint64_t stream_min_bytes, const std::string& tcp_bind, const std::vector<bool>& local) {
    std::unique_ptr<ShmTransport> shm;
    std::unique_ptr<TcpTransport> tcp;
    if (tcp_bind.empty() || !local.empty())
      shm = std::make_unique<ShmTransport>(rank, world, ShmConfig{slot_bytes, slots});
    if (!tcp_bind.empty()) tcp = std::make_unique<TcpTransport>(rank, world, TcpConfig{slot_bytes, slots}, tcp_bind);
    shm_ = shm.get();
    tcp_ = tcp.get();
    if (shm && tcp)
      transport_ = std::make_unique<CompositeTransport>(std::move(shm), std::move(tcp), local);
    else if (shm)
      transport_ = std::move(shm);
    else
      transport_ = std::move(tcp);
    ExecutorPolicy policy;
    policy.spin_ns = spin_ns;
    policy.yield_ns = yield_ns;
    policy.stream_min_bytes = stream_min_bytes;
    // Deliver Ctrl-C (and other Python signal handlers) to a rank stuck waiting for its peers.
    policy.on_idle = [] {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    };
    on_idle_ = policy.on_idle;
    executor_ = std::make_unique<Executor>(*transport_, policy);
  }

  // `codec` (None for plain collectives) encodes the messages of a compressed all-reduce; its plan works
  // on float32, so float16 / bfloat16 buffers are widened into a work buffer first and rounded back once
  // at the end (accumulation is always float32).
  void run(const NativePlan& plan, uintptr_t input, uintptr_t output, int dtype, int op, int collective, int algorithm,
           int64_t count, int root, const std::shared_ptr<cpu::Codec>& codec, int64_t codec_id, uintptr_t residual,
           uint64_t seed, double timeout_s, const std::shared_ptr<GroupedProgram>& program) {
    if (plan.world != transport_->world() || plan.rank != transport_->rank())
      throw Error(ErrorKind::kInternal, "plan was built for another rank or world size");
    if (dtype < 0 || dtype >= kNumDTypes) throw Error(ErrorKind::kInvalidUsage, "unknown dtype code");
    if (op < 0 || op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code");
    const DType type = static_cast<DType>(dtype);
    const bool widen = codec && type != DType::kFloat32;
    if (codec && type != DType::kFloat16 && type != DType::kBFloat16 && type != DType::kFloat32)
      throw Error(ErrorKind::kInvalidUsage, "compression needs float32, float16 or bfloat16 data");
    RunArgs args;
    args.input = reinterpret_cast<const void*>(input);
    args.output = reinterpret_cast<void*>(output);
    args.dtype = widen ? DType::kFloat32 : type;
    args.op = static_cast<RedOp>(op);
    args.desc = Descriptor{collective, algorithm, dtype, op, count, root, codec_id};
    args.timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
    args.codec = codec.get();
    args.residual = reinterpret_cast<float*>(residual);
    args.seed = seed;
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    if (!widen) {
      execute(plan, args, codec.get(), program.get());
      return;
    }
    const uint16_t* in = static_cast<const uint16_t*>(args.input);
    uint16_t* out = static_cast<uint16_t*>(args.output);
    const size_t n = static_cast<size_t>(count);
    work_.resize(n);
    float* w = work_.data();
    if (type == DType::kFloat16) {
      for (size_t i = 0; i < n; ++i) w[i] = half_to_float(in[i]);
    } else {
      for (size_t i = 0; i < n; ++i) w[i] = bf16_to_float(in[i]);
    }
    args.input = args.output = w;
    execute(plan, args, codec.get(), program.get());
    if (type == DType::kFloat16) {
      for (size_t i = 0; i < n; ++i) out[i] = float_to_half(w[i]);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(w[i]);
    }
  }

  // The fragment executor, or with a program the grouped executor (over this transport and the CPU loops:
  // how the CPU tests check the programs GPUs run over NCCL).
  void execute(const NativePlan& plan, const RunArgs& args, const cpu::Codec* codec, const GroupedProgram* program) {
    if (!program) {
      executor_->run(plan, args);
      return;
    }
    GroupedArgs g;
    g.input = args.input;
    g.output = args.output;
    g.dtype = args.dtype;
    g.op = args.op;
    g.desc = args.desc;
    g.seq = executor_->claim_seq();
    staging_.resize(program->staging_bytes);
    encoded_.resize(codec ? codec->encoded_bytes(plan.output_bytes / 4) : 0);
    g.staging = staging_.data();
    g.encoded = encoded_.data();
    if (codec) {
      g.compressed = true;
      g.block_elems = codec->block_elems();
      g.block_bytes = codec->block_bytes();
      g.residual = args.residual;
      g.rounding_key = codec::rounding_key(args.seed, static_cast<uint32_t>(transport_->rank()), g.seq);
    }
    CpuGroupBackend backend(*transport_, codec, args.timeout_ns, on_idle_);
    GroupedExecutor::run(plan, *program, g, backend);
  }

#if PYCOLL_WITH_CUDA
  // A collective on GPU memory whose messages travel through this transport (host-staged): for ranks
  // that share one GPU, which NCCL refuses, or that have no NCCL. Enqueued on the call's stream, but the
  // host waits for that stream at every group.
  void run_device(cuda::GpuCommunicator& gpu, const NativePlan& plan, const GroupedProgram& program,
                  cuda::GpuCommunicator::Call call, double timeout_s) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    call.seq = executor_->claim_seq();
    CpuGroupBackend host(*transport_, nullptr, static_cast<int64_t>(timeout_s * 1e9), on_idle_);
    gpu.run(plan, program, call, &host);
  }
#endif

  void abort(int kind, const std::string& message) { transport_->abort(Error(static_cast<ErrorKind>(kind), message)); }

  Transport& transport() { return *transport_; }
  ShmTransport& shm() {
    if (!shm_) throw Error(ErrorKind::kInternal, "this communicator's transport is not shared memory");
    return *shm_;
  }
  TcpTransport& tcp() {
    if (!tcp_) throw Error(ErrorKind::kInternal, "this communicator's transport is not TCP");
    return *tcp_;
  }
  uint64_t seq() const { return executor_->seq(); }

 private:
  std::unique_ptr<Transport> transport_;
  ShmTransport* shm_ = nullptr;
  TcpTransport* tcp_ = nullptr;
  std::unique_ptr<Executor> executor_;
  std::mutex mu_;
  std::vector<float> work_;  // float32 copy of a float16 / bfloat16 buffer being all-reduced with a codec
  std::function<void()> on_idle_;
  std::vector<uint8_t> staging_, encoded_;  // grouped programs' staging and kEncoded buffers
};

// A grouped program (pycoll/algorithms/grouped.py) for one compiled plan; validated against it here.
std::shared_ptr<GroupedProgram> compile_program(
    const NativePlan& plan, py::array_t<int64_t, py::array::c_style | py::array::forcecast> actions,
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> msg_bytes,
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> recv_stage,
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> send_stage,
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> work_stage, int64_t staging_bytes) {
  if (actions.ndim() != 2 || (actions.shape(0) > 0 && actions.shape(1) != 2))
    throw Error(ErrorKind::kInternal, "program actions must be [n, 2]");
  auto p = std::make_shared<GroupedProgram>();
  auto t = actions.unchecked<2>();
  for (py::ssize_t k = 0; k < actions.shape(0); ++k) {
    if (t(k, 0) < 0 || t(k, 0) > static_cast<int64_t>(GroupAction::kFinish))
      throw Error(ErrorKind::kInternal, "grouped program has an unknown action code");
    p->action.push_back(static_cast<GroupAction>(t(k, 0)));
    p->op.push_back(static_cast<int32_t>(t(k, 1)));
  }
  auto copy = [](auto& out, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& in) {
    auto v = in.unchecked<1>();
    for (py::ssize_t i = 0; i < in.size(); ++i) out.push_back(static_cast<std::decay_t<decltype(out[0])>>(v(i)));
  };
  copy(p->msg_bytes, msg_bytes);
  copy(p->recv_stage, recv_stage);
  copy(p->send_stage, send_stage);
  copy(p->work_stage, work_stage);
  if (staging_bytes < 0) throw Error(ErrorKind::kInternal, "negative staging size");
  p->staging_bytes = static_cast<uint64_t>(staging_bytes);
  validate_program(*p, plan);
  return p;
}

// Codec kernels on numpy arrays, for tests and benchmarks: the executor calls the same functions.
template <class T>
T* array_data(py::handle obj, const char* what, bool required = true) {
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

size_t array_items(py::handle obj) {
  return obj.is_none() ? 0 : static_cast<size_t>(py::reinterpret_borrow<py::array>(obj).size());
}
size_t array_nbytes(py::handle obj) {
  return obj.is_none() ? 0 : static_cast<size_t>(py::reinterpret_borrow<py::array>(obj).nbytes());
}

void codec_encode(const cpu::Codec& c, py::handle src, py::handle out, py::handle residual, double residual_scale,
                  py::handle decoded, uint64_t index, uint32_t key) {
  cpu::EncodeArgs a;
  a.src = array_data<float>(src, "src");
  a.n = array_items(src);
  if (py::reinterpret_borrow<py::array>(src).itemsize() != 4)
    throw Error(ErrorKind::kInvalidUsage, "src must be float32");
  a.out = array_data<uint8_t>(out, "out");
  if (array_nbytes(out) < c.encoded_bytes(a.n))
    throw Error(ErrorKind::kInvalidUsage, "out holds " + std::to_string(array_nbytes(out)) +
                                              " bytes, the encoding needs " + std::to_string(c.encoded_bytes(a.n)));
  a.residual = array_data<float>(residual, "residual", false);
  a.decoded = array_data<float>(decoded, "decoded", false);
  if ((a.residual && array_items(residual) != a.n) || (a.decoded && array_items(decoded) != a.n))
    throw Error(ErrorKind::kInvalidUsage, "residual and decoded must have as many elements as src");
  a.residual_scale = static_cast<float>(residual_scale);
  a.index = index;
  a.key = key;
  py::gil_scoped_release release;
  c.encode(a);
}

void codec_decode(const cpu::Codec& c, py::handle in, py::handle dst, py::handle acc, py::handle residual,
                  int divisor) {
  cpu::DecodeArgs a;
  a.dst = array_data<float>(dst, "dst");
  a.n = array_items(dst);
  a.in = array_data<uint8_t>(in, "in");
  if (array_nbytes(in) < c.encoded_bytes(a.n))
    throw Error(ErrorKind::kInvalidUsage, "in holds " + std::to_string(array_nbytes(in)) + " bytes, " +
                                              std::to_string(a.n) + " elements need " +
                                              std::to_string(c.encoded_bytes(a.n)));
  a.acc = array_data<float>(acc, "acc", false);
  a.residual = array_data<float>(residual, "residual", false);
  if ((a.acc && array_items(acc) != a.n) || (a.residual && array_items(residual) != a.n))
    throw Error(ErrorKind::kInvalidUsage, "acc and residual must have as many elements as dst");
  if (a.residual && !a.acc) throw Error(ErrorKind::kInvalidUsage, "residual needs acc");
  a.divisor = divisor;
  py::gil_scoped_release release;
  c.decode(a);
}

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

  py::class_<GroupedProgram, std::shared_ptr<GroupedProgram>>(m, "GroupedProgram")
      .def(py::init(&compile_program), py::arg("plan"), py::arg("actions"), py::arg("msg_bytes"), py::arg("recv_stage"),
           py::arg("send_stage"), py::arg("work_stage"), py::arg("staging_bytes"))
      .def_property_readonly("num_actions", [](const GroupedProgram& p) { return p.action.size(); })
      .def_property_readonly("staging_bytes", [](const GroupedProgram& p) { return p.staging_bytes; });

  py::class_<cpu::Codec, std::shared_ptr<cpu::Codec>>(m, "Codec")
      .def_property_readonly("block_elems", &cpu::Codec::block_elems)
      .def_property_readonly("block_bytes", &cpu::Codec::block_bytes)
      .def_property_readonly("name", &cpu::Codec::name)
      .def("encoded_bytes", &cpu::Codec::encoded_bytes, py::arg("n"))
      .def("encode", &codec_encode, py::arg("src"), py::arg("out"), py::arg("residual") = py::none(),
           py::arg("residual_scale") = 1.0, py::arg("decoded") = py::none(), py::arg("index") = 0, py::arg("key") = 0)
      .def("decode", &codec_decode, py::arg("data"), py::arg("dst"), py::arg("acc") = py::none(),
           py::arg("residual") = py::none(), py::arg("divisor") = 0);
  m.def(
      "builtin_codec",
      [](int kind, uint32_t block, int rounding) {
        return cpu::make_builtin_codec(static_cast<codec::Kind>(kind), block, static_cast<codec::Rounding>(rounding));
      },
      py::arg("kind"), py::arg("block"), py::arg("rounding"));
  m.def(
      "user_codec",
      [](std::string name, uint32_t block_elems, uint32_t block_bytes, std::vector<uint32_t> tail_bytes,
         uintptr_t encode, uintptr_t decode) {
        return cpu::make_user_codec(std::move(name), block_elems, block_bytes, std::move(tail_bytes),
                                    reinterpret_cast<cpu::UserEncodeFn>(encode),
                                    reinterpret_cast<cpu::UserDecodeFn>(decode));
      },
      py::arg("name"), py::arg("block_elems"), py::arg("block_bytes"), py::arg("tail_bytes"), py::arg("encode"),
      py::arg("decode"));
  m.def("cpu_reduce", &cpu_reduce, py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("a"), py::arg("b"),
        py::arg("avg_divisor") = 0, py::arg("dst2") = py::none(),
        "the CPU reduce loop on numpy arrays: dst = a (+) b (also into dst2), / avg_divisor when > 0");
  m.def("rounding_key", &codec::rounding_key, py::arg("seed"), py::arg("rank"), py::arg("seq"));
  m.def("codec_isa", &cpu::codec_isa, "instruction set of the CPU codec loops in use");
  m.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        const std::string k = key, msg = message;
        const Digest d = hmac_sha256(k.data(), k.size(), msg.data(), msg.size());
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      py::arg("key"), py::arg("message"), "HMAC-SHA256 as the TCP handshake computes it (csrc/transport/hmac.cc)");

  py::class_<NativeCommunicator>(m, "NativeCommunicator")
      .def(py::init<int, int, size_t, uint32_t, int64_t, int64_t, uint64_t, const std::string&,
                    const std::vector<bool>&>(),
           py::arg("rank"), py::arg("world"), py::arg("slot_bytes"), py::arg("slots"), py::arg("spin_ns"),
           py::arg("yield_ns"), py::arg("stream_min_bytes"), py::arg("tcp_bind") = "",
           py::arg("local") = std::vector<bool>{})
      .def_property_readonly("segment_fd", [](NativeCommunicator& c) { return c.shm().segment_fd(); })
      .def_property_readonly("tcp_port", [](NativeCommunicator& c) { return c.tcp().listen_port(); })
      .def_property_readonly("tcp_rejected", [](NativeCommunicator& c) { return c.tcp().rejected_connections(); })
      .def(
          "connect_tcp",
          [](NativeCommunicator& c, const std::vector<std::string>& addresses, const py::bytes& key, double timeout_s) {
            std::string k = key;
            py::gil_scoped_release release;
            c.tcp().connect(addresses, k, timeout_s);
          },
          py::arg("addresses"), py::arg("key"), py::arg("timeout_s"))
      .def_property_readonly("segment_bytes", [](NativeCommunicator& c) { return c.transport().segment_bytes(); })
      .def_property_readonly("fragment_bytes", [](NativeCommunicator& c) { return c.transport().fragment_bytes(); })
      .def_property_readonly("seq", &NativeCommunicator::seq)
      .def("connect", [](NativeCommunicator& c, const std::vector<int>& pids,
                         const std::vector<int>& fds) { c.shm().connect(pids, fds); })
      .def("close_segment_fd", [](NativeCommunicator& c) { c.shm().close_segment_fd(); })
      .def("run", &NativeCommunicator::run, py::arg("plan"), py::arg("input"), py::arg("output"), py::arg("dtype"),
           py::arg("op"), py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::arg("root"),
           py::arg("codec"), py::arg("codec_id"), py::arg("residual"), py::arg("seed"), py::arg("timeout_s"),
           py::arg("program") = nullptr)
#if PYCOLL_WITH_CUDA
      .def("run_device", &NativeCommunicator::run_device, py::arg("gpu"), py::arg("plan"), py::arg("program"),
           py::arg("call"), py::arg("timeout_s"))
#endif
      .def("abort", &NativeCommunicator::abort, py::arg("kind"), py::arg("message"));

  python::bind_cuda(m);
  python::bind_nccl(m);
  python::bind_gpu(m);
}
