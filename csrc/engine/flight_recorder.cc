#include "engine/flight_recorder.h"

#include <algorithm>
#include <chrono>

namespace pycoll::trace {

RecorderStorage g_recorder;

namespace {
constexpr size_t kMaxNames = 1 << 16;  // sites past this many are recorded as unknown (-1)
}

// A slot's spin lock, held for one copy of its record. A writer and a reader meet on a slot only when a
// probe reads it while its collective starts or ends: the wait is one copy long.
class FlightRecorder::Held {
 public:
  explicit Held(std::atomic<bool>& lock) : lock_(lock) {
    while (lock_.exchange(true, std::memory_order_acquire)) {
    }
  }
  ~Held() { lock_.store(false, std::memory_order_release); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  std::atomic<bool>& lock_;
};

const char* state_name(State s) {
  switch (s) {
    case State::kEnqueued:
      return "enqueued";
    case State::kStarted:
      return "started";
    case State::kCompleted:
      return "completed";
    case State::kFailed:
      return "failed";
  }
  return "unknown";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void FlightRecorder::configure(size_t capacity) {
  std::lock_guard<std::mutex> lock(names_mu_);
  if (capacity > 0 && !slots_) {
    size_t n = 1;
    while (n < capacity) n *= 2;  // a record's slot is its ticket & mask_: no division per record
    slots_.reset(new Slot[n]);
    capacity_ = n;
    mask_ = n - 1;
  }
  on_.store(capacity > 0 && capacity_ > 0, std::memory_order_release);
}

uint64_t FlightRecorder::begin(int comm, const Descriptor& desc, int site, uint64_t seq, bool gpu, int64_t now) {
  if (!on()) return 0;
  const uint64_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = slots_[ticket & mask_];
  Held held(slot.lock);
  Record& r = slot.record;
  r.ticket = ticket;
  r.comm = comm;
  r.site = site;
  r.seq = seq;
  r.desc = desc;
  r.state = seq ? State::kStarted : State::kEnqueued;
  r.gpu = gpu;
  r.enqueue_ns = now;
  r.start_ns = seq ? now : 0;
  r.end_ns = 0;
  return ticket;
}

bool FlightRecorder::start(uint64_t ticket, uint64_t seq, int64_t now) {
  if (ticket == 0 || capacity_ == 0) return false;
  Slot& slot = slots_[ticket & mask_];
  Held held(slot.lock);
  Record& r = slot.record;
  if (r.ticket != ticket) return false;
  r.seq = seq;
  r.state = State::kStarted;
  r.start_ns = now;
  return true;
}

void FlightRecorder::end(uint64_t ticket, bool ok, int64_t now) {
  if (ticket == 0 || capacity_ == 0) return;
  Slot& slot = slots_[ticket & mask_];
  Held held(slot.lock);
  Record& r = slot.record;
  if (r.ticket != ticket) return;
  r.state = ok ? State::kCompleted : State::kFailed;
  r.end_ns = now;
  prefetch_next();
}

// The slot the next begin writes was last written `capacity` collectives ago: its lines have left the caches.
// Stores to them waited for the lines to come back, and so did the next locked instruction after them (the
// transport's), which cost 40-50 ns per collective (measured at 2 ranks, 4 KiB). Fetched now, between two
// collectives, they are in the cache when the next one begins.
void FlightRecorder::prefetch_next() const {
  const uint64_t next = next_.load(std::memory_order_relaxed);
  const char* const first = reinterpret_cast<const char*>(&slots_[next & mask_]);
  __builtin_prefetch(first, 1, 3);
  __builtin_prefetch(first + sizeof(Slot) - 1, 1, 3);
}

std::vector<Record> FlightRecorder::snapshot(size_t last) const {
  std::vector<Record> out;
  if (capacity_ == 0) return out;
  const uint64_t next = next_.load(std::memory_order_relaxed);
  size_t n = std::min<uint64_t>(next - 1, capacity_);
  if (last > 0) n = std::min(n, last);
  out.reserve(n);
  for (uint64_t t = next - n; t < next; ++t) {
    const Slot& slot = slots_[t & mask_];
    Held held(slot.lock);
    if (slot.record.ticket == t) out.push_back(slot.record);
  }
  return out;
}

int FlightRecorder::comm_id(const std::string& name) {
  std::lock_guard<std::mutex> lock(names_mu_);
  comms_.push_back(name);
  return static_cast<int>(comms_.size() - 1);
}

std::string FlightRecorder::comm_name(int id) const {
  std::lock_guard<std::mutex> lock(names_mu_);
  return id >= 0 && id < static_cast<int>(comms_.size()) ? comms_[id] : "";
}

int FlightRecorder::site_id(const std::string& text) {
  std::lock_guard<std::mutex> lock(names_mu_);
  auto it = site_ids_.find(text);
  if (it != site_ids_.end()) return it->second;
  if (sites_.size() >= kMaxNames) return -1;
  sites_.push_back(text);
  return site_ids_[text] = static_cast<int>(sites_.size() - 1);
}

std::string FlightRecorder::site_name(int id) const {
  std::lock_guard<std::mutex> lock(names_mu_);
  return id >= 0 && id < static_cast<int>(sites_.size()) ? sites_[id] : "";
}

}  // namespace pycoll::trace
