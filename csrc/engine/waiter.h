// How a rank waits for its peers: one policy, one deadline, one timeout message and one header check for
// the fragment executor (executor.cc) and the CPU group backend (cpu_group_backend.cc).
//
// After every pass over its pending messages that moved nothing, a rank backs off in three stages:
//   spin   poll again at once (cpu_relax) for an adaptive budget <= spin_ns: a wait that ended while
//          spinning doubles the next budget, one that had to go further halves it (down to a floor
//          that keeps probing whether spinning pays again);
//   yield  then, for yield_ns, hand the core to a peer that may share it (sched_yield);
//   sleep  then Transport::wait in slices from first_slice_ns doubling to max_slice_ns; after each
//          slice without progress the health checks run (dead peers, published mismatches, aborts)
//          and on_idle is called. Past the deadline: the timeout error (raise_timeout).
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include "engine/descriptor.h"
#include "transport/transport.h"

namespace pycoll {

struct WaitPolicy {
  // Longest time a waiting rank polls the transport before it yields. Worth it only when every rank has
  // a core of its own; with more ranks than cores a spinning rank steals the core its peer needs (the
  // communicator sets 0 then). The waiter adapts below this: a long wait halves the next spin, so a
  // loaded machine stops spinning by itself, and a short one doubles it again.
  int64_t spin_ns = 0;
  // Then, for this long, yield the core instead of sleeping. With more ranks than cores the peer this
  // rank waits for is usually runnable on the same core: a yield lets it run at once, while a sleep
  // costs a futex wake-up and, in a VM, an inter-processor interrupt to an idle vCPU.
  int64_t yield_ns = 0;
  // First sleep slice; it doubles up to max_slice_ns. Health checks (dead peers, published mismatches,
  // aborts) run after each slice that passed without progress.
  int64_t first_slice_ns = 2'000'000;
  int64_t max_slice_ns = 50'000'000;
  // Called after every sleep slice that passed without progress (at most every few ms), e.g. to let
  // the Python layer deliver Ctrl-C. It may throw; the communicator is then aborted.
  std::function<void()> on_idle;
};

// Where a rank's time in collectives went, summed over its collectives (bench/profile.py reads it): a
// wait is the time from the first pass that moved nothing to the next that moved something; what is
// not waiting is work (copies, reductions, codecs, the transport's own calls). Yields and sleeps count
// the sched_yield calls and the Transport::wait calls (a futex or condition-variable wait) of the waits.
// The counters have one writer (the thread running the collectives) and may be read from another while
// it runs (a profiler's snapshot): relaxed atomics, each read on its own.
struct WaitStats {
  struct Counter {
    std::atomic<uint64_t> v{0};
    void add(uint64_t n) { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
    uint64_t get() const { return v.load(std::memory_order_relaxed); }
  };
  Counter collectives, run_ns, wait_ns, waits, yields, sleeps;
};

// Checks that a received fragment is the next one of the message this rank expects: the same collective
// (seq) and call (hash of desc), the same message size, the next offset, inside the message, and
// `whole` (a size the message is cut into). Raises the transport's mismatch error otherwise.
inline void check_header(Transport& t, int peer, const FragHeader& h, uint64_t seq, uint64_t hash,
                         const Descriptor& desc, uint64_t msg_bytes, uint64_t offset, bool whole = true) {
  if (h.seq != seq || h.desc_hash != hash || h.msg_bytes != msg_bytes || h.offset != offset ||
      h.bytes > msg_bytes - offset || !whole)
    t.raise_header_mismatch(peer, h, seq, desc, msg_bytes);
}

// One wait state: made where a rank starts moving messages, told after each pass whether it progressed.
class Waiter {
 public:
  using Clock = std::chrono::steady_clock;

  // `spin_budget_ns` is the adaptive spin budget, kept by the caller from one collective to the next;
  // `start` and `deadline` are the collective's (for the timeout and its message).
  // `stats` (may be null) receives the waits (WaitStats).
  Waiter(Transport& t, const WaitPolicy& policy, int64_t& spin_budget_ns, uint64_t seq, const Descriptor& desc,
         Clock::time_point start, Clock::time_point deadline, WaitStats* stats = nullptr)
      : t_(t),
        policy_(policy),
        spin_budget_ns_(spin_budget_ns),
        seq_(seq),
        desc_(desc),
        start_(start),
        deadline_(deadline),
        idle_since_(Clock::now()),
        last_progress_(idle_since_),
        slice_ns_(policy.first_slice_ns),
        stats_(stats) {}

  // After a pass over the pending messages: with progress, resets the back-off; without, takes one step
  // of it (spin, yield, or sleep until `waits` can progress). ctx.waiting_on_peer names the peer the
  // pass was blocked on (-1: none).
  void after_pass(bool progressed, const WaitItem* waits, size_t n_waits, const WaitContext& ctx) {
    const Clock::time_point now = Clock::now();
    if (progressed) {
      if (idle_) end_wait(resumed_);  // the wait ended where the pass that progressed began
      idle_ = false;
      slice_ns_ = policy_.first_slice_ns;
      last_progress_ = now;
      return;
    }
    if (!idle_) {
      idle_ = true;
      idle_since_ = now;
    }
    const int64_t idle_ns = ns_between(idle_since_, now);
    if (idle_ns < spin_budget_ns_) {
      cpu_relax();
      resumed_ = now;
      return;
    }
    if (idle_ns < spin_budget_ns_ + policy_.yield_ns) {
      sched_yield();  // hand the core to a peer that shares it: far cheaper than sleep + wake-up
      if (stats_) stats_->yields.add(1);
      resumed_ = Clock::now();
      return;
    }
    if (stats_) stats_->sleeps.add(1);
    sleep(now, waits, n_waits, ctx);
    resumed_ = Clock::now();
  }

  // The collective is complete: a wait that the last pass ended is counted.
  void finish() {
    if (idle_) end_wait(resumed_);
    idle_ = false;
  }

  // The collective timed out on this rank: names the ranks that have not entered it, else the peer it
  // was waiting for.
  [[noreturn]] void raise_timeout(int waiting_on_peer, Clock::time_point now) const;

  static int64_t ns_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  }

 private:
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  // A wait that ended while spinning says spinning pays: spin longer next time. One that had to sleep
  // anyway (a loaded machine, or the peer waiting for this very core) halves it.
  void adapt_spin(Clock::time_point now);
  void end_wait(Clock::time_point now) {
    if (policy_.spin_ns > 0) adapt_spin(now);
    if (stats_) {
      stats_->wait_ns.add(static_cast<uint64_t>(ns_between(idle_since_, now)));
      stats_->waits.add(1);
    }
  }
  // The deadline, the health checks after a slice without progress, and Transport::wait.
  void sleep(Clock::time_point now, const WaitItem* waits, size_t n_waits, const WaitContext& ctx);

  Transport& t_;
  const WaitPolicy& policy_;
  int64_t& spin_budget_ns_;
  const uint64_t seq_;
  const Descriptor& desc_;
  const Clock::time_point start_, deadline_;
  bool idle_ = false;  // whether this rank is in a wait (idle_since_ is its start)
  Clock::time_point idle_since_, last_progress_;
  Clock::time_point resumed_;  // in a wait: when the pass after the last spin, yield or sleep began
  int64_t slice_ns_;
  WaitStats* stats_;
};

}  // namespace pycoll
