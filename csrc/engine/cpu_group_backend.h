// A GroupBackend on CPUs: groups of whole messages moved over a Transport (shared memory) fragment by
// fragment, all of a group's messages progressing together, and the CPU reduce and codec loops. It runs
// the grouped programs that GPUs run over NCCL, so the CPU tests check them end to end.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "cpu/codec.h"
#include "engine/grouped_executor.h"
#include "engine/waiter.h"
#include "transport/transport.h"

namespace pycoll {

class CpuGroupBackend final : public GroupBackend {
 public:
  // `codec` may be null (plain collectives); `timeout_ns` bounds the whole collective; `on_idle` is called
  // between sleeps (it may throw, e.g. to deliver Ctrl-C).
  // `stamp`: what this rank announces of its timing as it begins (EntryStamp).
  CpuGroupBackend(Transport& transport, const cpu::Codec* codec, int64_t timeout_ns, std::function<void()> on_idle,
                  const EntryStamp& stamp = {});

  int rank() const override { return t_.rank(); }
  int world() const override { return t_.world(); }
  void begin(uint64_t seq, const Descriptor& desc) override;
  void group(const P2P* ops, size_t n) override;
  void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
              int avg_divisor) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void encode(const codec::EncodeArgs& a) override;
  void decode(const codec::DecodeArgs& a) override;
  void abort(const Error& error) override { t_.abort(error); }

 private:
  using Clock = Waiter::Clock;
  Transport& t_;
  const cpu::Codec* codec_;
  int64_t timeout_ns_;
  WaitPolicy policy_;
  EntryStamp stamp_;
  int64_t spin_budget_ns_ = 0;  // the policy does not spin
  uint64_t seq_ = 0;
  uint64_t hash_ = 0;
  Descriptor desc_{};
  Clock::time_point start_{}, deadline_{};
  std::vector<uint64_t> pos_;
  std::vector<uint8_t> done_, busy_;
  std::vector<WaitItem> waits_;
};

}  // namespace pycoll
