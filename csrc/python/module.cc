// The pybind11 module pycoll._C: the native communicator (csrc/engine/communicator.h), plans and
// grouped programs (csrc/engine/plan_compiler.h), the codec and reduce loops on numpy arrays, and the
// mapping of pycoll::Error kinds to the exception classes of pycoll/errors.py. Only conversions between
// Python objects and the engine's plain C++ types live here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/codec.h"
#include "cpu/reduce.h"
#include "cpu/rotation.h"
#include "engine/communicator.h"
#include "engine/descriptor.h"
#include "engine/grouped_executor.h"
#include "engine/plan.h"
#include "engine/plan_compiler.h"
#include "kernels/rotation.h"
#include "python/bindings.h"
#include "python/call_site.h"
#include "python/error_translation.h"
#include "python/gil.h"
#include "python/numpy_args.h"

#if PYCOLL_WITH_CUDA
#include "engine/gpu_backend.h"
#endif

namespace py = pybind11;
using namespace pycoll;
using python::array_data;
using python::array_items;
using python::array_nbytes;

namespace {

using Int64In = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// A numpy int64 array as the engine takes it (csrc/engine/plan_compiler.h). With `one_dim`, anything
// else raises as pybind11's unchecked<1>() does.
Int64Array int64_array(const Int64In& a, bool one_dim = false) {
  if (one_dim) (void)a.unchecked<1>();
  Int64Array v;
  v.data = a.data();
  v.ndim = static_cast<int>(a.ndim());
  v.rows = a.ndim() >= 1 ? a.shape(0) : 0;
  v.cols = a.ndim() == 2 ? a.shape(1) : 1;
  v.size = a.size();
  return v;
}

std::shared_ptr<NativePlan> bind_compile_plan(const Int64In& table, const Int64In& starts, int64_t itemsize,
                                              int64_t input_count, int64_t output_count, int rank, int world,
                                              bool coded, bool distinct, int64_t result_off, int64_t result_count) {
  return compile_plan(int64_array(table), int64_array(starts, true), itemsize, input_count, output_count, rank, world,
                      coded, distinct, result_off, result_count);
}

// A grouped program (pycoll/algorithms/grouped.py) for one compiled plan; validated against it.
std::shared_ptr<GroupedProgram> bind_compile_program(const NativePlan& plan, const Int64In& actions,
                                                     const Int64In& msg_bytes, const Int64In& recv_stage,
                                                     const Int64In& send_stage, const Int64In& work_stage,
                                                     int64_t staging_bytes) {
  ProgramArrays arrays;
  arrays.actions = int64_array(actions);
  arrays.msg_bytes = int64_array(msg_bytes, true);
  arrays.recv_stage = int64_array(recv_stage, true);
  arrays.send_stage = int64_array(send_stage, true);
  arrays.work_stage = int64_array(work_stage, true);
  arrays.staging_bytes = staging_bytes;
  return compile_program(plan, arrays);
}

template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};

// The fields of Call by name, in order: for its keyword constructor and its attributes.
template <class F>
void for_each_call_field(F&& f) {
  f("plan", &Call::plan);
  f("input", &Call::input);
  f("output", &Call::output);
  f("dtype", &Call::dtype);
  f("op", &Call::op);
  f("collective", &Call::collective);
  f("algorithm", &Call::algorithm);
  f("count", &Call::count);
  f("root", &Call::root);
  f("codec", &Call::codec);
  f("codec_id", &Call::codec_id);
  f("residual", &Call::residual);
  f("seed", &Call::seed);
  f("rotation_block", &Call::rotation_block);
  f("rotate_input", &Call::rotate_input);
  f("rotate_output", &Call::rotate_output);
  f("exact_src", &Call::exact_src);
  f("exact_dst", &Call::exact_dst);
  f("exact_count", &Call::exact_count);
  f("timeout_s", &Call::timeout_s);
  f("program", &Call::program);
  f("skew", &Call::skew);
#if PYCOLL_WITH_CUDA
  f("gpu", &Call::gpu);
  f("device", &Call::device);
#endif
}

// Call(**fields), made once per collective. The keywords are looked up with interned names:
// pybind11's own keyword matching builds a string per name per call, several microseconds for 15 fields.
Call make_call(const py::kwargs& kwargs) {
  static const std::vector<PyObject*> names = [] {
    std::vector<PyObject*> v;
    for_each_call_field([&](const char* name, auto) { v.push_back(PyUnicode_InternFromString(name)); });
    return v;
  }();
  Call a;
  size_t i = 0;
  Py_ssize_t found = 0;
  for_each_call_field([&](const char* name, auto member) {
    PyObject* value = PyDict_GetItemWithError(kwargs.ptr(), names[i++]);
    if (!value) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return;
    }
    ++found;
    using T = std::remove_reference_t<decltype(a.*member)>;
    if constexpr (is_shared_ptr<T>::value) {  // pybind11's cast of None is slow
      if (value == Py_None) {
        a.*member = nullptr;
        return;
      }
    }
    try {
      a.*member = py::cast<T>(py::handle(value));
    } catch (const py::cast_error&) {
      throw py::type_error(std::string("Call(): ") + name + " cannot be a " + Py_TYPE(value)->tp_name);
    }
  });
  if (found != PyDict_Size(kwargs.ptr())) {
    for (auto item : kwargs) {
      const std::string key = py::str(item.first);
      bool known = false;
      for_each_call_field([&](const char* name, auto) { known |= key == name; });
      if (!known) throw py::type_error("Call() got an unexpected keyword argument '" + key + "'");
    }
  }
  return a;
}

std::unique_ptr<Communicator> make_communicator(int rank, int world, size_t slot_bytes, uint32_t slots, int64_t spin_ns,
                                                int64_t yield_ns, uint64_t stream_min_bytes,
                                                const std::string& tcp_bind, const std::vector<bool>& local, bool skew,
                                                size_t skew_window, int64_t clock_offset_ns) {
  CommunicatorConfig config;
  config.rank = rank;
  config.world = world;
  config.slot_bytes = slot_bytes;
  config.slots = slots;
  config.spin_ns = spin_ns;
  config.yield_ns = yield_ns;
  config.stream_min_bytes = stream_min_bytes;
  config.tcp_bind = tcp_bind;
  config.local = local;
  config.skew = SkewConfig{skew, skew_window, clock_offset_ns};
  // Deliver Ctrl-C (and other Python signal handlers) to a rank stuck waiting for its peers.
  config.on_idle = [] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
  return std::make_unique<Communicator>(config);
}

// Codec kernels on numpy arrays, for tests and benchmarks: the executor calls the same functions.
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

// The rotation's CPU loop on a float32 numpy array, in place (tests and pycoll.compression.rotate).
void rotate_array(py::handle x, py::handle parts, uint32_t block, bool inverse) {
  float* data = array_data<float>(x, "x");
  if (py::reinterpret_borrow<py::array>(x).itemsize() != 4) throw Error(ErrorKind::kInvalidUsage, "x must be float32");
  const uint64_t* counts = array_data<uint64_t>(parts, "parts");
  const size_t n_parts = array_items(parts);
  uint64_t total = 0;
  for (size_t p = 0; p < n_parts; ++p) total += counts[p];
  if (total != array_items(x)) throw Error(ErrorKind::kInvalidUsage, "parts must add up to x's elements");
  if (block < 1 || block > codec::kMaxRotationBlock)
    throw Error(ErrorKind::kInvalidUsage,
                "block must be 1 to " + std::to_string(codec::kMaxRotationBlock) + ", got " + std::to_string(block));
  py::gil_scoped_release release;
  cpu::rotate(data, counts, n_parts, block, inverse);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pycoll native core: shared-memory transport, plan executor, reduce kernels";

  python::register_error_translator();

  py::list collectives, algorithms;
  for (auto* n : kCollectiveNames) collectives.append(n);
  for (auto* n : kAlgorithmNames) algorithms.append(n);
  m.attr("COLLECTIVE_NAMES") = collectives;
  m.attr("ALGORITHM_NAMES") = algorithms;
  py::dict error_kinds;
  for (int k = 0; k < kNumErrorKinds; ++k) error_kinds[kErrorKindNames[k]] = k;
  m.attr("ERROR_KINDS") = error_kinds;
  m.def("rotate", &rotate_array, py::arg("x"), py::arg("parts"), py::arg("block"), py::arg("inverse"),
        "rotates float32 x in place (csrc/kernels/rotation.h): parts (uint64 element counts) one after another, "
        "each in blocks of `block` from its start");
  m.def("reduce_isa", &cpu::reduce_isa, "instruction set of the CPU reduce loops in use");
  // The data address of a numpy array, without the dict that __array_interface__ builds on every call.
  m.def("array_address", [](py::handle obj) {
    if (!py::isinstance<py::array>(obj)) throw Error(ErrorKind::kInvalidUsage, "expected a numpy.ndarray");
    return reinterpret_cast<uintptr_t>(py::reinterpret_borrow<py::array>(obj).data());
  });

  py::class_<NativePlan, std::shared_ptr<NativePlan>>(m, "NativePlan")
      .def(py::init(&bind_compile_plan), py::arg("table"), py::arg("starts"), py::arg("itemsize"),
           py::arg("input_count"), py::arg("output_count"), py::arg("rank"), py::arg("world"), py::arg("coded") = false,
           py::arg("distinct") = false, py::arg("result_off") = 0, py::arg("result_count") = 0)
      .def_property_readonly("num_ops", [](const NativePlan& p) { return p.ops.size(); })
      .def_property_readonly("num_steps",
                             [](const NativePlan& p) { return p.step_begin.empty() ? 0 : p.step_begin.size() - 1; });

  py::class_<GroupedProgram, std::shared_ptr<GroupedProgram>>(m, "GroupedProgram")
      .def(py::init(&bind_compile_program), py::arg("plan"), py::arg("actions"), py::arg("msg_bytes"),
           py::arg("recv_stage"), py::arg("send_stage"), py::arg("work_stage"), py::arg("staging_bytes"))
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
  m.def("rounding_key", &codec::rounding_key, py::arg("seed"), py::arg("rank"), py::arg("seq"));
  m.def("codec_isa", &cpu::codec_isa, "instruction set of the CPU codec loops in use");
  // One collective (csrc/engine/communicator.h Call), made by the CPU executors of pycoll/dispatch.py.
  py::class_<Call> call_class(m, "Call");
  call_class.def(py::init(&make_call), "Call(**fields): keyword arguments only");
  for_each_call_field([&](const char* name, auto member) { call_class.def_readwrite(name, member); });

  py::class_<Communicator> communicator(m, "NativeCommunicator");
  communicator
      .def(py::init(&make_communicator), py::arg("rank"), py::arg("world"), py::arg("slot_bytes"), py::arg("slots"),
           py::arg("spin_ns"), py::arg("yield_ns"), py::arg("stream_min_bytes"), py::arg("tcp_bind") = "",
           py::arg("local") = std::vector<bool>{}, py::arg("skew") = true, py::arg("skew_window") = 1024,
           py::arg("clock_offset_ns") = 0)
      .def_property_readonly("segment_fd", [](Communicator& c) { return c.shm().segment_fd(); })
      .def_property(
          "fuse", [](Communicator& c) { return c.executor().fuse(); },
          [](Communicator& c, bool on) { c.executor().set_fuse(on); },
          "whether chains of receive-reduces run in one pass (csrc/engine/plan_fusion.h); off only to compare")
      .def_property_readonly("tcp_port", [](Communicator& c) { return c.tcp().listen_port(); })
      .def(
          "set_tcp_peers",
          [](Communicator& c, const std::vector<std::string>& addresses, const py::bytes& key, double dial_timeout_s) {
            c.tcp().set_peers(addresses, std::string(key), dial_timeout_s);
          },
          py::arg("addresses"), py::arg("key"), py::arg("dial_timeout_s"),
          "where the peers listen and the job's key; each link is made at its first use")
      .def_property_readonly("segment_bytes", [](Communicator& c) { return c.transport().segment_bytes(); })
      .def_property_readonly("fragment_bytes", [](Communicator& c) { return c.transport().fragment_bytes(); })
      .def_property_readonly("seq", &Communicator::seq)
      .def(
          "ranks_not_entered", [](Communicator& c, uint64_t seq) { return c.transport().ranks_not_entered(seq); },
          py::arg("seq"), "the ranks that have not announced entering collective `seq` (as a timeout names them)")
      .def("wait_stats",
           [](Communicator& c) {
             // Sums since the communicator was made; bench/profile.py takes differences.
             const WaitStats& s = c.wait_stats();
             py::dict d;
             d["collectives"] = s.collectives.get();
             d["run_ns"] = s.run_ns.get();
             d["wait_ns"] = s.wait_ns.get();
             d["waits"] = s.waits.get();
             d["yields"] = s.yields.get();
             d["sleeps"] = s.sleeps.get();
             return d;
           })
      .def(
          "set_shm_peers",
          [](Communicator& c, const std::vector<int>& pids, const std::vector<int>& fds) {
            c.shm().set_peers(pids, fds);
          },
          py::arg("pids"), py::arg("fds"), "where the peers' segments are; each is mapped at its first use")
      .def("shm_mapped_peers", [](Communicator& c) { return c.shm().mapped_peers(); })
      .def(
          "run",
          [](Communicator& c, const Call& call, uintptr_t input, uintptr_t output, uint64_t ticket) {
            // The call on these buffers: the caller keeps one Call per kind of call (making one costs
            // microseconds) and only the addresses change from call to call. A copy: the Python object's
            // fields (and the plan, codec and program they hold) may be reassigned by another thread while
            // this one runs without the GIL. `ticket`: its flight record, made when it was enqueued
            // (trace_enqueue); 0: made now, with the caller's call site.
            Call mine = call;
            mine.input = input;
            mine.output = output;
            mine.ticket = ticket;
            if (ticket == 0) mine.site = python::call_site();
            return python::without_gil([&] { return c.run(mine); });
          },
          py::arg("call"), py::arg("input"), py::arg("output"), py::arg("ticket") = 0)
      .def(
          "run_in_place",
          [](Communicator& c, const Call& call, py::handle array) -> int64_t {
            // run() in place on an object with the buffer protocol (a numpy array), for the small calls
            // whose Python layer costs more than the collective: its address comes from the buffer
            // protocol here. The caller has matched the array's type, dtype and length to `call`; what
            // may differ from one array to the next is checked here, and -1 (nothing run) sends the
            // call down the full path, which names what is wrong.
            Py_buffer view;
            if (PyObject_GetBuffer(array.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
              PyErr_Clear();
              return -1;
            }
            const std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> held(&view, PyBuffer_Release);
            if (call.dtype < 0 || call.dtype >= kNumDTypes) return -1;
            const auto bytes = static_cast<Py_ssize_t>(call.count) *
                               static_cast<Py_ssize_t>(dtype_size(static_cast<DType>(call.dtype)));
            if (view.len != bytes) return -1;
            Call mine = call;
            mine.input = mine.output = reinterpret_cast<uintptr_t>(view.buf);
            mine.site = python::call_site();
            return static_cast<int64_t>(python::without_gil([&] { return c.run(mine); }));
          },
          py::arg("call"), py::arg("array"))
      .def("abort", &Communicator::abort, py::arg("kind"), py::arg("message"));

  python::bind_skew(m, communicator);
  python::bind_trace(m, communicator);
  python::bind_fault(m);
  python::bind_testing(m);
  python::bind_cuda(m);
  python::bind_nccl(m);
  python::bind_gpu(m);
}
