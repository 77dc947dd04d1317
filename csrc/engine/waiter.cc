#include "engine/waiter.h"

#include <algorithm>
#include <string>
#include <vector>

namespace pycoll {

namespace {

constexpr int64_t kMinSpinNs = 2000;

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void Waiter::adapt_spin(Clock::time_point now) {
  const bool spin_paid = ns_between(idle_since_, now) <= spin_budget_ns_;
  spin_budget_ns_ =
      spin_paid ? std::min(policy_.spin_ns, 2 * spin_budget_ns_) : std::max(kMinSpinNs, spin_budget_ns_ / 2);
}

void Waiter::sleep(Clock::time_point now, const WaitItem* waits, size_t n_waits, const WaitContext& ctx) {
  if (now >= deadline_) raise_timeout(ctx.waiting_on_peer, now);
  if (ns_between(last_progress_, now) >= slice_ns_) {
    // Nothing happened for a whole slice: look for dead peers, mismatches and aborts.
    t_.check_health(ctx);
    if (policy_.on_idle) policy_.on_idle();
    last_progress_ = now;
    slice_ns_ = std::min(slice_ns_ * 2, policy_.max_slice_ns);
  }
  t_.wait(waits, n_waits, std::min<int64_t>(slice_ns_, ns_between(now, deadline_)));
}

void Waiter::raise_timeout(int waiting_on_peer, Clock::time_point now) const {
  const double seconds = ns_between(start_, now) * 1e-9;
  std::vector<int> missing = t_.ranks_not_entered(seq_);
  std::string msg = describe(desc_) + " (collective #" + std::to_string(seq_) + ") timed out on rank " +
                    std::to_string(t_.rank()) + " after " + std::to_string(seconds) + " s: ";
  if (!missing.empty()) {
    msg += "rank(s) " + join_ranks(missing) + " have not entered it";
    if (waiting_on_peer >= 0) msg += "; this rank was waiting for rank " + std::to_string(waiting_on_peer);
  } else if (waiting_on_peer >= 0) {
    msg += "every rank entered it, but rank " + std::to_string(waiting_on_peer) +
           " was not heard from (it may be stuck or far slower)";
  } else {
    msg += "every rank entered it";
  }
  msg += ". Raise the timeout with timeout= or PYCOLL_TIMEOUT if the job is only slow.";
  throw Error(ErrorKind::kTimeout, msg, waiting_on_peer);
}

}  // namespace pycoll
