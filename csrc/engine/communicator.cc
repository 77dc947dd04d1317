#include "engine/communicator.h"

#include <cstring>
#include <string>
#include <utility>

#include "cpu/rotation.h"
#include "engine/cpu_group_backend.h"
#include "engine/descriptor.h"
#include "engine/op_semantics.h"
#include "kernels/half.h"
#include "transport/composite.h"

namespace pycoll {

Communicator::Communicator(const CommunicatorConfig& config) {
  const int rank = config.rank, world = config.world;
  std::unique_ptr<ShmTransport> shm;
  std::unique_ptr<TcpTransport> tcp;
  if (config.tcp_bind.empty() || !config.local.empty())
    shm = std::make_unique<ShmTransport>(rank, world, ShmConfig{config.slot_bytes, config.slots});
  if (!config.tcp_bind.empty()) {
    tcp = std::make_unique<TcpTransport>(rank, world, TcpConfig{config.slot_bytes, config.slots}, config.tcp_bind);
    tcp->announce_to_all(config.skew.enabled);  // the skew recorder reads every rank's entry stamp
  }
  shm_ = shm.get();
  tcp_ = tcp.get();
  if (shm && tcp)
    transport_ = std::make_unique<CompositeTransport>(std::move(shm), std::move(tcp), config.local);
  else if (shm)
    transport_ = std::move(shm);
  else
    transport_ = std::move(tcp);
  ExecutorPolicy policy;
  policy.spin_ns = config.spin_ns;
  policy.yield_ns = config.yield_ns;
  policy.stream_min_bytes = config.stream_min_bytes;
  policy.on_idle = config.on_idle;
  on_idle_ = policy.on_idle;
  executor_ = std::make_unique<Executor>(*transport_, policy);
  skew_ = std::make_unique<SkewRecorder>(rank, world, config.skew);
}

size_t Communicator::run(const Call& c) {
  if (!c.plan) throw Error(ErrorKind::kInternal, "a collective was run without a plan");
  const NativePlan& plan = *c.plan;
  if (plan.world != transport_->world() || plan.rank != transport_->rank())
    throw Error(ErrorKind::kInternal, "plan was built for another rank or world size");
#if PYCOLL_WITH_CUDA
  if (c.gpu) return run_device(c);
#endif
  if (c.dtype < 0 || c.dtype >= kNumDTypes) throw Error(ErrorKind::kInvalidUsage, "unknown dtype code");
  if (c.op < 0 || c.op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code");
  const DType type = static_cast<DType>(c.dtype);
  const cpu::Codec* const codec = c.codec.get();
  const bool widen = codec && type != DType::kFloat32;
  const bool rotate = codec && c.rotation_block > 0;
  if (codec && !compressible(type, static_cast<RedOp>(c.op))) throw Error(ErrorKind::kInvalidUsage, kNotCompressible);
  RunArgs args;
  args.input = reinterpret_cast<const void*>(c.input);
  args.output = reinterpret_cast<void*>(c.output);
  args.dtype = widen ? DType::kFloat32 : type;
  args.op = static_cast<RedOp>(c.op);
  args.desc = Descriptor{c.collective, c.algorithm, c.dtype, c.op, c.count, c.root, c.codec_id};
  args.timeout_ns = static_cast<int64_t>(c.timeout_s * 1e9);
  args.codec = codec;
  args.residual = reinterpret_cast<float*>(c.residual);
  args.seed = c.seed;
  std::lock_guard<std::mutex> lock(mu_);
  // The one reading of the clock for the collective's start: its flight record, its skew stamp and its
  // deadline (the executor's) share it, and its end is the executor's last reading. The recorder reads no
  // clock of its own here: two readings were half of what recording cost.
  args.start_ns = trace::now_ns();
  trace::DeferredBegin record = trace_record(c, args.desc, executor_->seq() + 1, args.start_ns, false);
  args.record = &record;
  trace::FlightRecorder& recorder = trace::FlightRecorder::get();
  try {
    args.stamp = skew_->enter(args.start_ns);
    if (c.program) record.flush();  // a grouped program waits outside the executor
    if (widen || rotate || plan.result_bytes > 0)
      staged(c, args, codec);
    else
      execute(plan, args, codec, c.program.get());
  } catch (...) {
    recorder.end(record.flush(), false, trace::now_ns());
    throw;
  }
  // A grouped program (c.program) runs outside the executor, which then has no reading of its end.
  if (record.flush()) recorder.end(record.ticket, true, c.program ? trace::now_ns() : executor_->last_end_ns());
  return skew_->exit(*transport_, executor_->seq(), c.collective, c.skew);
}

trace::DeferredBegin Communicator::trace_record(const Call& c, const Descriptor& desc, uint64_t seq, int64_t now,
                                                bool gpu) {
  trace::FlightRecorder& recorder = trace::FlightRecorder::get();
  trace::DeferredBegin record;
  if (recorder.start(c.ticket, seq, now)) {
    record.ticket = c.ticket;
  } else if (recorder.on()) {
    record = trace::DeferredBegin{trace_comm_, c.site, seq, now, desc, gpu, true, 0};
  }
  return record;
}

// A collective on work copies of its buffers, for any of three reasons at once: float16 / bfloat16 data
// compressed (widened to float32, the result rounded back once at the end); a codec's rotation (the input
// rotated, the result rotated back: kernels/rotation.h; the plan runs unchanged on rotated values, which
// sum as the values do); a plan with a result range (NativePlan::result_bytes: it runs in place on a copy
// of the input, the caller's output is a range of it). An in-place call works on one copy (a float32 one
// on the caller's buffer itself, which is its output); an out-of-place one on a copy of the input, and
// writes a float32 output of its own only when it widens.
void Communicator::staged(const Call& c, RunArgs& args, const cpu::Codec* codec) {
  const NativePlan& plan = *c.plan;
  const DType type = static_cast<DType>(c.dtype);
  const bool widen = codec && type != DType::kFloat32, rotate = codec && c.rotation_block > 0;
  const bool ranged = plan.result_bytes > 0, in_place = args.input == args.output;
  const size_t isz = dtype_size(args.dtype);  // the plan's elements: float32 with a codec
  const size_t n_in = plan.input_bytes / isz, n_out = (ranged ? plan.result_bytes : plan.output_bytes) / isz;
  if (rotate) check_parts(c.rotate_input, n_in, "input"), check_parts(c.rotate_output, n_out, "output");
  const bool own_in = widen || ranged || (rotate && !in_place), own_out = widen && !in_place && !ranged;
  work_.resize(((own_in ? n_in : 0) + (own_out ? n_out : 0)) * isz);
  uint8_t* const w_in = own_in ? work_.data() : static_cast<uint8_t*>(args.output);
  uint8_t* const w_out = in_place || ranged ? w_in
                         : own_out          ? work_.data() + n_in * isz
                                            : static_cast<uint8_t*>(args.output);
  const bool half = type == DType::kFloat16;
  if (widen) {
    const uint16_t* in = static_cast<const uint16_t*>(args.input);
    float* w = reinterpret_cast<float*>(w_in);
    for (size_t i = 0; i < n_in; ++i) w[i] = half ? half_to_float(in[i]) : bf16_to_float(in[i]);
  } else if (own_in && n_in) {
    std::memcpy(w_in, args.input, n_in * isz);
  }
  if (rotate)
    cpu::rotate(reinterpret_cast<float*>(w_in), c.rotate_input.data(), c.rotate_input.size(), c.rotation_block, false);
  args.input = w_in;
  args.output = w_out;
  execute(plan, args, codec, c.program.get());
  uint8_t* const result = w_out + (ranged ? plan.result_off : 0);
  if (rotate)
    cpu::rotate(reinterpret_cast<float*>(result), c.rotate_output.data(), c.rotate_output.size(), c.rotation_block,
                true);
  if (widen) {
    uint16_t* out = reinterpret_cast<uint16_t*>(c.output);
    const float* r = reinterpret_cast<const float*>(result);
    for (size_t i = 0; i < n_out; ++i) out[i] = half ? float_to_half(r[i]) : float_to_bf16(r[i]);
  } else if (ranged) {
    std::memcpy(reinterpret_cast<void*>(c.output), result, n_out * isz);
  }
  if (rotate && c.exact_count) {  // the caller's own elements, which rotating there and back would round
    const size_t caller_isz = dtype_size(type);
    std::memmove(reinterpret_cast<uint8_t*>(c.output) + c.exact_dst * caller_isz,
                 reinterpret_cast<const uint8_t*>(c.input) + c.exact_src * caller_isz, c.exact_count * caller_isz);
  }
}

// Throws unless `parts` add up to a buffer of `n` elements (`what`: input or output).
void Communicator::check_parts(const std::vector<uint64_t>& parts, size_t n, const char* what) {
  uint64_t total = 0;
  for (uint64_t p : parts) total += p;
  if (total != n)
    throw Error(ErrorKind::kInternal, std::string("the rotation's ") + what + " parts add up to " +
                                          std::to_string(total) + " elements, the buffer holds " + std::to_string(n));
}

void Communicator::execute(const NativePlan& plan, const RunArgs& args, const cpu::Codec* codec,
                           const GroupedProgram* program) {
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
  if (codec) {
    g.encoded_layout = encoded_layout(plan, codec->block_elems(), codec->block_bytes(),
                                      [&](uint64_t n) { return codec->encoded_bytes(n); });
  }
  encoded_.resize(g.encoded_layout.size(plan.output_bytes / 4));
  g.staging = staging_.data();
  g.encoded = encoded_.data();
  if (codec) {
    g.compressed = true;
    g.block_elems = codec->block_elems();
    g.block_bytes = codec->block_bytes();
    g.residual = args.residual;
    g.rounding_key = codec::rounding_key(args.seed, static_cast<uint32_t>(transport_->rank()), g.seq);
  }
  CpuGroupBackend backend(*transport_, codec, args.timeout_ns, on_idle_, args.stamp);
  GroupedExecutor::run(plan, *program, g, backend);
}

#if PYCOLL_WITH_CUDA
size_t Communicator::run_device(const Call& c) {
  if (!c.program) throw Error(ErrorKind::kInternal, "a host-staged collective was run without its grouped program");
  cuda::GpuCommunicator::Call call = c.device;
  std::lock_guard<std::mutex> lock(mu_);
  call.seq = executor_->claim_seq();
  const Descriptor desc{c.collective, c.algorithm, c.dtype, c.op, c.count, c.root, c.codec_id};
  trace::FlightRecorder& recorder = trace::FlightRecorder::get();
  const uint64_t ticket = trace_record(c, desc, call.seq, trace::now_ns(), true).flush();
  CpuGroupBackend host(*transport_, nullptr, static_cast<int64_t>(c.timeout_s * 1e9), on_idle_);
  try {
    c.gpu->run(*c.plan, *c.program, call, &host);
  } catch (...) {
    recorder.end(ticket, false, trace::now_ns());
    throw;
  }
  // Ended when the host has run every group: the GPU may still be finishing the last one's kernels.
  recorder.end(ticket, true, trace::now_ns());
  return 0;
}
#endif

void Communicator::abort(int kind, const std::string& message) {
  transport_->abort(Error(static_cast<ErrorKind>(kind), message));
}

ShmTransport& Communicator::shm() {
  if (!shm_) throw Error(ErrorKind::kInternal, "this communicator's transport is not shared memory");
  return *shm_;
}

TcpTransport& Communicator::tcp() {
  if (!tcp_) throw Error(ErrorKind::kInternal, "this communicator's transport is not TCP");
  return *tcp_;
}

}  // namespace pycoll
