// One rank's native communicator: its transport (shared memory, TCP, or both: shared memory to the ranks
// on this host and TCP to the others), the executor that runs plans over it, and the buffers reused from
// call to call. Bound as pycoll._C.NativeCommunicator (csrc/python/module.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/codec.h"
#include "engine/executor.h"
#include "engine/flight_recorder.h"
#include "engine/grouped_executor.h"
#include "engine/plan.h"
#include "engine/skew.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/transport.h"

#if PYCOLL_WITH_CUDA
#include "engine/gpu_backend.h"
#endif

namespace pycoll {

struct CommunicatorConfig {
  int rank = 0;
  int world = 1;
  size_t slot_bytes = 0;
  uint32_t slots = 0;
  int64_t spin_ns = 0;
  int64_t yield_ns = 0;
  uint64_t stream_min_bytes = 0;
  // The address to listen on for TCP connections; empty: shared memory only. With both this and `local`
  // (local[r]: rank r is on this host), shared memory to this host's ranks and TCP to the others.
  std::string tcp_bind;
  std::vector<bool> local;
  SkewConfig skew;
  // Called between sleeps of a waiting rank (ExecutorPolicy::on_idle); it may throw, e.g. to deliver
  // Ctrl-C.
  std::function<void()> on_idle;
};

// One collective on host memory, as pycoll/call.py's Call reaches the engine (bound as pycoll._C.Call, made
// by the CPU executors of pycoll/dispatch.py).
struct Call {
  std::shared_ptr<NativePlan> plan;
  uintptr_t input = 0, output = 0;
  int dtype = 0;  // DType code of the caller's buffers
  int op = 0;     // RedOp code
  int collective = 0, algorithm = 0;
  int64_t count = 0;
  int root = 0;
  // Compressed all-reduce: the codec (null for plain collectives), its wire id, the float32
  // error-feedback residual (0: none) and the stochastic-rounding seed.
  std::shared_ptr<cpu::Codec> codec;
  int64_t codec_id = 0;
  uintptr_t residual = 0;
  uint64_t seed = 0;
  // A codec with a rotation (kernels/rotation.h): the collective runs on rotated copies of its buffers, in
  // blocks of `rotation_block` elements (0: no rotation) from the start of each of INPUT's and OUTPUT's
  // parts (element counts, one after another: pycoll/call.py codec_parts).
  uint32_t rotation_block = 0;
  std::vector<uint64_t> rotate_input, rotate_output;
  // With a rotation: the caller's elements [exact_src, + exact_count) of its input, copied to [exact_dst, ...)
  // of its output at the end, which must hold them bit for bit (an all-to-all's own part, an all-gather's own
  // chunk with exact_own), where rotating there and back would round them.
  uint64_t exact_src = 0, exact_dst = 0, exact_count = 0;
  double timeout_s = 0;
  // With a program: run the grouped executor over this transport instead of the fragment executor.
  std::shared_ptr<GroupedProgram> program;
  // Whether it counts in the skew report (false: one of the library's own, which only feed its clock).
  bool skew = true;
  // The flight recorder's (engine/flight_recorder.h): where the user called it (a site id; -1 unknown),
  // and the record made when it was enqueued (an asynchronous collective; 0: none, one is made when it
  // starts). Set per run by the binding, never kept in the Python layer's Call.
  int32_t site = -1;
  uint64_t ticket = 0;
#if PYCOLL_WITH_CUDA
  // A collective on GPU memory whose messages travel through this transport (host-staged: for ranks that
  // share one GPU, which NCCL refuses, or that have no NCCL): the GPU communicator whose kernels run the
  // plan's grouped program, and the call as the GPU side takes it. Null for host memory.
  std::shared_ptr<cuda::GpuCommunicator> gpu;
  cuda::GpuCommunicator::Call device{};
#endif
};

class Communicator {
 public:
  explicit Communicator(const CommunicatorConfig& config);

  // Runs one collective, the only way in. `codec` (null for plain collectives) encodes the messages of a
  // compressed collective; its plan works on float32, so float16 / bfloat16 buffers are widened into a work buffer
  // first and rounded back once at the end (accumulation is always float32), and with a rotation the buffers are
  // rotated first and rotated back at the end (staged). With `gpu`, the call is on
  // GPU memory and host-staged: enqueued on its stream, the host waiting for that stream at every group. Collectives of
  // one communicator run one at a time. Returns the number of straggler events waiting (SkewRecorder; none for GPU
  // memory).
  size_t run(const Call& call);

  void abort(int kind, const std::string& message);

  Transport& transport() { return *transport_; }
  ShmTransport& shm();
  TcpTransport& tcp();
  uint64_t seq() const { return executor_->seq(); }
  // Where this rank's time in its CPU collectives went (engine/waiter.h), summed since it was made.
  const WaitStats& wait_stats() const { return executor_->stats(); }
  SkewRecorder& skew() { return *skew_; }
  // This communicator's id in the flight recorder (FlightRecorder::comm_id; -1 until named).
  void set_trace_comm(int id) { trace_comm_ = id; }
  int trace_comm() const { return trace_comm_; }
  Executor& executor() { return *executor_; }

 private:
  // The fragment executor, or with a program the grouped executor (over this transport and the CPU loops:
  // how the CPU tests check the programs GPUs run over NCCL).
  void execute(const NativePlan& plan, const RunArgs& args, const cpu::Codec* codec, const GroupedProgram* program);
  void staged(const Call& c, RunArgs& args, const cpu::Codec* codec);
  static void check_parts(const std::vector<uint64_t>& parts, size_t n, const char* what);
  // The flight record of collective `seq`, starting at `now`: the call's own (enqueued) one, started now, or
  // a new one, to be written (trace::DeferredBegin; `gpu`: a host-staged GPU collective); none when the
  // recorder is off.
  trace::DeferredBegin trace_record(const Call& c, const Descriptor& desc, uint64_t seq, int64_t now, bool gpu);
#if PYCOLL_WITH_CUDA
  size_t run_device(const Call& c);
#endif

  std::unique_ptr<Transport> transport_;
  ShmTransport* shm_ = nullptr;
  TcpTransport* tcp_ = nullptr;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<SkewRecorder> skew_;
  std::mutex mu_;
  std::vector<uint8_t> work_;  // work copies of a collective's buffers (staged)
  std::function<void()> on_idle_;
  int trace_comm_ = -1;
  std::vector<uint8_t> staging_, encoded_;  // grouped programs' staging and kEncoded buffers
};

}  // namespace pycoll
