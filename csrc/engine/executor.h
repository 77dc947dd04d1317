// Runs one rank's plan over a transport: posts sends and receives as soon as what they depend on is done
// (later steps run ahead of earlier ones where the plan allows), calls the reduce kernels on fragments in
// place, and waits without burning a core. Every wait has a deadline; errors abort the communicator so
// that every rank raises, none hangs.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/codec.h"
#include "cpu/reduce.h"
#include "engine/descriptor.h"
#include "engine/flight_recorder.h"
#include "engine/plan.h"
#include "engine/waiter.h"
#include "transport/transport.h"

namespace pycoll {

// How the executor waits (engine/waiter.h), and how it writes large outputs.
struct ExecutorPolicy : WaitPolicy {
  // Collectives whose output is at least this large write final values with non-temporal stores: the
  // output would not stay in cache anyway, and skipping read-for-ownership saves a third of the traffic.
  uint64_t stream_min_bytes = 8ull << 20;
  // Run a plan's chains of receive-reduces in one pass each (engine/plan_fusion.h); off: op after op, for
  // comparing the two.
  bool fuse = true;
};

struct RunArgs {
  const void* input;
  void* output;
  DType dtype;
  RedOp op;
  Descriptor desc;
  int64_t timeout_ns;  // for the whole collective
  // Compressed collectives (float32 buffers only): messages are encoded by `codec`; `residual` (float32,
  // like the input, may be null) is the error-feedback state; `seed` keys stochastic rounding.
  const cpu::Codec* codec = nullptr;
  float* residual = nullptr;
  uint64_t seed = 0;
  EntryStamp stamp;  // announced with the collective (engine/skew.h)
  // When the collective began, on the steady clock in ns (trace::now_ns), read once by the caller for its
  // flight record and stamp as well; its deadline is `timeout_ns` after. 0: the executor reads the clock.
  int64_t start_ns = 0;
  // The collective's flight record, written when this rank first waits (trace::DeferredBegin); may be null.
  trace::DeferredBegin* record = nullptr;
};

class Executor {
 public:
  Executor(Transport& transport, const ExecutorPolicy& policy)
      : t_(transport), policy_(policy), spin_budget_ns_(policy.spin_ns) {}

  // Runs `plan` as collective number seq()+1. Throws pycoll::Error; on any error the communicator is
  // aborted first, so the other ranks raise too.
  void run(const NativePlan& plan, const RunArgs& args);
  uint64_t seq() const { return seq_; }
  // When the last collective run by run() ended, on the steady clock in ns (its flight record's end).
  int64_t last_end_ns() const { return last_end_ns_; }
  // Where this rank's time in the collectives run here went (WaitStats, engine/waiter.h).
  const WaitStats& stats() const { return stats_; }
  // Whether chains run in one pass (ExecutorPolicy::fuse); switched off only to compare the two.
  bool fuse() const { return policy_.fuse; }
  void set_fuse(bool on) { policy_.fuse = on; }
  // The number of a collective run by other means on the same transport (GroupedExecutor), so that the
  // numbers stay one sequence.
  uint64_t claim_seq() { return ++seq_; }

 private:
  class PlanRunner;  // one run of a plan (executor.cc)
  void run_plan(const NativePlan& plan, const RunArgs& args);
  void check_codec_plan(const NativePlan& plan, const RunArgs& args);

  Transport& t_;
  ExecutorPolicy policy_;
  int64_t spin_budget_ns_ = 0;  // adaptive, <= policy_.spin_ns
  uint64_t seq_ = 0;
  int64_t last_end_ns_ = 0;
  WaitStats stats_;
  // Per-run state, kept to avoid allocating on every collective.
  std::vector<uint64_t> pos_;
  std::vector<uint8_t> done_;
  std::vector<uint8_t> ready_;
  std::vector<WaitItem> waits_;
  std::vector<uint64_t> msg_bytes_;          // per op: bytes on the wire
  std::vector<uint8_t> encoded_;             // the kEncoded buffer of a compressed plan
  std::vector<float> scratch_;               // one fragment of partial sums (RECV_REDUCE_SEND with a codec)
  std::vector<const uint8_t*> chain_frags_;  // a chain's received fragments, member by member
  std::vector<uint32_t> publish_ops_;        // the publishers a chain's fragment goes to, and their rooms
  std::vector<uint8_t*> publish_rooms_;
};

}  // namespace pycoll
