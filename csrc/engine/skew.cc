#include "engine/skew.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "pycoll/errors.h"

namespace pycoll {

SkewRecorder::SkewRecorder(int rank, int world, const SkewConfig& config)
    : rank_(rank),
      world_(world),
      config_(config),
      enabled_(config.enabled),
      pending_(kPendingSlots),
      entries_(world),
      prev_entered_(world),
      domain_index_(world, 0),
      bounds_(world),
      offset_(world),
      late_(world) {
  const size_t cells = static_cast<size_t>(kNumCollectives) * world;
  last_.assign(cells, 0);
  sum_.assign(cells, 0);
  max_.assign(cells, 0);
  inflicted_.assign(cells, 0);
  hist_.resize(kNumCollectives);
  // One slot more than reported: a notice whose window is the whole capacity still finds the collective
  // that leaves its window.
  const size_t cap = std::max<size_t>(1, config_.capacity) + 1;
  recent_.assign(cap, Recent{});
  kinds_.assign(kNumCollectives, Kind{});
  recent_late_.assign(cap * world, 0);
  bounds_[0] = Bounds{0, 0, true};
}

int64_t SkewRecorder::now_ns() const {
  const auto t = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t).count() + config_.clock_offset_ns;
}

EntryStamp SkewRecorder::enter(int64_t steady_ns) {
  if (!enabled()) return {};
  next_ = EntryStamp{steady_ns + config_.clock_offset_ns, last_exit_ns_};
  return next_;
}

size_t SkewRecorder::exit(Transport& t, uint64_t seq, int collective, bool report) {
  if (!enabled()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (domains_ > 1) last_exit_ns_ = now_ns();  // exits only feed the clock estimate
  const int kind = collective >= 0 && collective < kNumCollectives ? collective : -1;
  pending_[(pending_head_ + pending_count_) % kPendingSlots] = Pending{seq, kind, report && kind >= 0, next_};
  ++pending_count_;
  // Batches end at the same collective numbers on every rank, and so do the events handed out: every
  // rank's callbacks run after the same collective (as long as the stamps they need have arrived).
  if (seq % kBatch != 0 && pending_count_ < kPendingSlots) return 0;
  process_ready(t);
  return events_.size();
}

void SkewRecorder::flush(Transport& t) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  process_ready(t);
}

// Oldest first, so that each collective's exits (in the next one's stamps) meet its entries.
void SkewRecorder::process_ready(Transport& t) {
  const uint64_t latest = pending_[(pending_head_ + pending_count_ + kPendingSlots - 1) % kPendingSlots].seq;
  for (; pending_count_ > 0; --pending_count_, pending_head_ = (pending_head_ + 1) % kPendingSlots) {
    const Pending& p = pending_[pending_head_];
    if (gather(t, p)) {
      process(p);
      continue;
    }
    if (latest - p.seq < kHorizon && pending_count_ < kPendingSlots) break;
    if (p.report) ++unmatched_;
    prev_kind_ = -1;
  }
}

bool SkewRecorder::gather(Transport& t, const Pending& p) {
  entries_[rank_] = p.own;
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && !t.entry_stamp(r, p.seq, &entries_[r])) return false;
  return true;
}

void SkewRecorder::process(const Pending& p) {
  for (const EntryStamp& e : entries_) {
    if (e.entered_ns == 0) {  // a rank that records nothing (PYCOLL_SKEW=0 there)
      if (p.report) ++unmatched_;
      prev_kind_ = -1;
      return;
    }
  }
  update_clock(p);
  if (!p.report) return;
  if (!offsets()) {
    ++unsynced_;
    return;
  }
  record(p);
}

void SkewRecorder::update_clock(const Pending& p) {
  if (domains_ == 1) {  // one clock: no offset to bound
    prev_kind_ = -1;
    return;
  }
  const bool chained = prev_kind_ >= 0 && synchronizes_all(prev_kind_) && prev_seq_ + 1 == p.seq;
  bool exits = chained;
  for (const EntryStamp& e : entries_) exits &= e.prev_exit_ns != 0;
  if (exits) {
    const int64_t e0 = entries_[0].entered_ns;
    const int64_t waited = e0 - widened_at_;
    if (widened_at_ != 0 && waited > 0) {
      const int64_t w = static_cast<int64_t>(static_cast<double>(waited) * (kDriftPpm * 1e-6)) + 1;
      for (int r = 1; r < world_; ++r) {
        bounds_[r].lo -= w;
        bounds_[r].hi += w;
      }
    }
    widened_at_ = e0;
    const int64_t x0 = entries_[0].prev_exit_ns;
    for (int r = 1; r < world_; ++r) {
      const int64_t a = prev_entered_[0] - entries_[r].prev_exit_ns;  // rank 0 entered before r left
      const int64_t b = x0 - prev_entered_[r];                        // r entered before rank 0 left
      Bounds& bd = bounds_[r];
      if (!bd.known || std::max(bd.lo, a) > std::min(bd.hi, b)) {
        bd = Bounds{a, b, true};  // the first interval, or a clock that stepped: start again
      } else {
        bd.lo = std::max(bd.lo, a);
        bd.hi = std::min(bd.hi, b);
      }
    }
  }
  for (int r = 0; r < world_; ++r) prev_entered_[r] = entries_[r].entered_ns;
  prev_seq_ = p.seq;
  prev_kind_ = p.kind;
}

void SkewRecorder::set_domains(const std::vector<int64_t>& domains) {
  if (static_cast<int>(domains.size()) != world_)
    throw Error(ErrorKind::kInternal,
                "clock domains for " + std::to_string(domains.size()) + " ranks, not " + std::to_string(world_));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> seen;
  for (int r = 0; r < world_; ++r) {
    const auto at = std::find(seen.begin(), seen.end(), domains[r]);
    domain_index_[r] = static_cast<int>(at - seen.begin());
    if (at == seen.end()) seen.push_back(domains[r]);
  }
  domains_ = static_cast<int>(seen.size());
  domain_bounds_.assign(seen.size(), Bounds{});
  std::fill(offset_.begin(), offset_.end(), 0);
}

bool SkewRecorder::offsets() {
  if (domains_ == 1) return true;  // one clock (offset_ stays 0): nothing to estimate
  // The ranks of one domain share its offset: intersect what each of them bounds.
  for (Bounds& d : domain_bounds_) d = Bounds{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (int r = 1; r < world_; ++r) {
    Bounds& d = domain_bounds_[domain_index_[r]];
    if (!bounds_[r].known) continue;
    d.lo = std::max(d.lo, bounds_[r].lo);
    d.hi = std::min(d.hi, bounds_[r].hi);
    d.known = true;
  }
  for (int r = 0; r < world_; ++r) {
    if (domain_index_[r] == domain_index_[0]) {
      offset_[r] = 0;
      continue;
    }
    Bounds b = domain_bounds_[domain_index_[r]];
    if (b.known && b.lo > b.hi) b = bounds_[r];  // they disagree (one of them reset): this rank's own
    if (!b.known) return false;
    offset_[r] = b.lo + (b.hi - b.lo) / 2;
  }
  return true;
}

int SkewRecorder::bucket(int64_t ns) {
  if (ns < 1024) return 0;
  const int e = 63 - __builtin_clzll(static_cast<uint64_t>(ns));
  const int m = static_cast<int>((static_cast<uint64_t>(ns) >> (e - 4)) & 15);
  return std::min(kBuckets - 1, (e - 10) * kBucketsPerOctave + m + 1);
}

int64_t SkewRecorder::bucket_floor(int b) {
  if (b <= 0) return 0;
  const int e = (b - 1) / kBucketsPerOctave + 10, m = (b - 1) % kBucketsPerOctave;
  return static_cast<int64_t>(16 + m) << (e - 4);
}

// What is per rank is what differs by rank (sum, max, histogram of lateness); counts and the wait are
// kept per kind (every rank takes part in every collective, and a rank's wait is the collective's spread
// minus its own lateness), so that a collective touches few cache lines.
void SkewRecorder::record(const Pending& p) {
  // Locals, not members, in the loops: the stores below could otherwise alias this object's counters.
  const int world = world_;
  const EntryStamp* const entries = entries_.data();
  const int64_t* const offset = offset_.data();
  int64_t* const at = late_.data();
  int64_t first = std::numeric_limits<int64_t>::max(), latest = std::numeric_limits<int64_t>::min();
  int last = 0;
  for (int r = 0; r < world; ++r) {
    at[r] = entries[r].entered_ns + offset[r];
    first = std::min(first, at[r]);
    if (at[r] > latest) {
      latest = at[r];
      last = r;
    }
  }
  const size_t cap = recent_.size(), slot = recorded_ % cap;
  const size_t base = static_cast<size_t>(p.kind) * world;
  std::vector<uint32_t>& hist_of_kind = hist_[p.kind];
  if (hist_of_kind.empty()) hist_of_kind.assign(static_cast<size_t>(world) * kBuckets, 0);
  uint32_t* const hist = hist_of_kind.data();
  int64_t* const sum = sum_.data() + base;
  int64_t* const top = max_.data() + base;
  int64_t* const recent = recent_late_.data() + slot * world;
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t late = at[r] - first;
    sum[r] += late;
    top[r] = std::max(top[r], late);
    total += late;
    ++hist[static_cast<size_t>(r) * kBuckets + bucket(late)];
    recent[r] = late;
  }
  const int64_t spread = latest - first, inflicted = spread * world - total;
  Kind& k = kinds_[p.kind];
  ++k.count;
  k.spread += spread;
  inflicted_[base + last] += inflicted;
  ++last_[base + last];
  recent_[slot] = Recent{p.seq, p.kind, last, inflicted};
  ++recorded_;
  if (!notices_.empty()) notify(slot);
}

// Each notice keeps per rank the sums over its window: the collective that just came in is added, the
// one that left the window taken out.
void SkewRecorder::notify(size_t slot) {
  const size_t cap = recent_.size();
  for (Notice& n : notices_) {
    const int64_t* in = recent_late_.data() + slot * world_;
    if (recorded_ > n.window) {
      const size_t old = (slot + cap - n.window) % cap;
      const int64_t* out = recent_late_.data() + old * world_;
      for (int r = 0; r < world_; ++r) n.sum_late[r] -= out[r];
      n.sum_inflicted[recent_[old].last] -= recent_[old].inflicted;
    }
    for (int r = 0; r < world_; ++r) n.sum_late[r] += in[r];
    n.sum_inflicted[recent_[slot].last] += recent_[slot].inflicted;
    if (recorded_ < n.window) continue;
    const int64_t limit = n.late_ns * static_cast<int64_t>(n.window);
    for (int r = 0; r < world_; ++r) {
      if (n.sum_late[r] <= limit || recorded_ < n.quiet_until[r]) continue;
      n.quiet_until[r] = recorded_ + n.window;
      events_.push_back(SkewEvent{n.id, r, recent_[slot].seq, n.window, n.sum_late[r] / static_cast<int64_t>(n.window),
                                  n.sum_inflicted[r]});
    }
  }
}

int SkewRecorder::add_notice(int64_t late_ns, uint32_t window) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t cap = recent_.size(), keep = cap - 1;
  if (window == 0 || window > keep)
    throw Error(ErrorKind::kInvalidUsage, "a straggler notice's window must be 1.." + std::to_string(keep) +
                                              " collectives (PYCOLL_SKEW_WINDOW keeps " + std::to_string(keep) +
                                              "), got " + std::to_string(window));
  Notice n{next_notice_++,
           late_ns,
           window,
           std::vector<int64_t>(world_, 0),
           std::vector<int64_t>(world_, 0),
           std::vector<uint64_t>(world_, 0)};
  // Start from the collectives already recorded, so that it judges a full window from the next one on.
  const uint64_t have = std::min<uint64_t>(recorded_, window);
  for (uint64_t k = 0; k < have; ++k) {
    const size_t s = (recorded_ - 1 - k) % cap;
    for (int r = 0; r < world_; ++r) n.sum_late[r] += recent_late_[s * world_ + r];
    n.sum_inflicted[recent_[s].last] += recent_[s].inflicted;
  }
  notices_.push_back(std::move(n));
  return notices_.back().id;
}

void SkewRecorder::remove_notice(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  notices_.erase(std::remove_if(notices_.begin(), notices_.end(), [id](const Notice& n) { return n.id == id; }),
                 notices_.end());
}

std::vector<SkewEvent> SkewRecorder::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SkewEvent> out;
  out.swap(events_);
  return out;
}

SkewSnapshot SkewRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  SkewSnapshot s;
  s.world = world_;
  s.buckets = kBuckets;
  s.recorded = recorded_;
  s.unmatched = unmatched_;
  s.unsynced = unsynced_;
  s.count.resize(last_.size());
  s.suffered_ns.resize(last_.size());
  for (size_t i = 0; i < last_.size(); ++i) {
    const Kind& k = kinds_[i / world_];
    s.count[i] = k.count;
    s.suffered_ns[i] = k.spread - sum_[i];  // each collective: its spread minus this rank's lateness
  }
  s.last = last_;
  s.sum_ns = sum_;
  s.max_ns = max_;
  s.inflicted_ns = inflicted_;
  s.hist.assign(static_cast<size_t>(kNumCollectives) * world_ * kBuckets, 0);
  for (int k = 0; k < kNumCollectives; ++k)
    if (!hist_[k].empty()) std::copy(hist_[k].begin(), hist_[k].end(), s.hist.begin() + k * world_ * kBuckets);
  const size_t cap = recent_.size(), n = std::min<uint64_t>(recorded_, cap - 1);
  for (size_t j = 0; j < n; ++j) {
    const size_t slot = (recorded_ - n + j) % cap;
    s.recent_seq.push_back(recent_[slot].seq);
    s.recent_kind.push_back(recent_[slot].kind);
    s.recent_last.push_back(recent_[slot].last);
    s.recent_late_ns.insert(s.recent_late_ns.end(), recent_late_.begin() + slot * world_,
                            recent_late_.begin() + (slot + 1) * world_);
  }
  for (int r = 0; r < world_; ++r) {
    const bool same = domain_index_[r] == domain_index_[0];
    s.offset_ns.push_back(same ? 0 : offset_[r]);
    s.uncertainty_ns.push_back(same ? 0 : bounds_[r].known ? (bounds_[r].hi - bounds_[r].lo) / 2 : -1);
  }
  return s;
}

}  // namespace pycoll
