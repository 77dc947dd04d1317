#include "engine/flight_recorder.h"

#include <time.h>

#include <algorithm>

namespace pycoll::trace {

namespace {
constexpr size_t kMaxNames = 1 << 16;  // sites past this many are recorded as unknown (-1)
}

// A slot's spin lock, held for one copy of its record. A writer and a reader meet on a slot only when a
// probe reads it while its collective starts or ends: the wait is one copy long.
class FlightRecorder::Held {
 public:
  explicit Held(Slot& s) : s_(s) {
    while (s_.busy.exchange(true, std::memory_order_acquire)) {
    }
  }
  ~Held() { s_.busy.store(false, std::memory_order_release); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  Slot& s_;
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
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: threads may record at exit
  return *recorder;
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

uint64_t FlightRecorder::begin(int comm, const Descriptor& desc, int site, uint64_t seq, bool gpu) {
  if (!on()) return 0;
  const uint64_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = now_ns();
  Slot& s = slots_[ticket & mask_];
  Held held(s);
  s.r.ticket = ticket;
  s.r.comm = comm;
  s.r.site = site;
  s.r.seq = seq;
  s.r.desc = desc;
  s.r.state = seq ? State::kStarted : State::kEnqueued;
  s.r.gpu = gpu;
  s.r.enqueue_ns = now;
  s.r.start_ns = seq ? now : 0;
  s.r.end_ns = 0;
  return ticket;
}

bool FlightRecorder::start(uint64_t ticket, uint64_t seq) {
  if (ticket == 0 || capacity_ == 0) return false;
  const int64_t now = now_ns();
  Slot& s = slots_[ticket & mask_];
  Held held(s);
  if (s.r.ticket != ticket) return false;
  s.r.seq = seq;
  s.r.state = State::kStarted;
  s.r.start_ns = now;
  return true;
}

void FlightRecorder::end(uint64_t ticket, bool ok) {
  if (ticket == 0 || capacity_ == 0) return;
  const int64_t now = now_ns();
  Slot& s = slots_[ticket & mask_];
  Held held(s);
  if (s.r.ticket != ticket) return;
  s.r.state = ok ? State::kCompleted : State::kFailed;
  s.r.end_ns = now;
}

std::vector<Record> FlightRecorder::snapshot(size_t last) const {
  std::vector<Record> out;
  if (capacity_ == 0) return out;
  const uint64_t next = next_.load(std::memory_order_relaxed);
  size_t n = std::min<uint64_t>(next - 1, capacity_);
  if (last > 0) n = std::min(n, last);
  out.reserve(n);
  for (uint64_t t = next - n; t < next; ++t) {
    Slot& s = slots_[t & mask_];
    Held held(s);
    if (s.r.ticket == t) out.push_back(s.r);
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
