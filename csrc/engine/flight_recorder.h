// The flight recorder: this process's last collectives, kept so that a hang or a mismatch can be explained
// (pycoll/flight/: the error's paragraph, the dump files, `pycoll trace`).
//
// The parts, named once and used by these names below:
//
// - **record**: one collective of one communicator: its *ticket* (the recorder's own number, across the
//   process's communicators), the communicator (*comm*: an id, comm_name), its collective number there
//   (*seq*: the executor's, the number every rank gives the same collective; 0 while it is only
//   enqueued), its descriptor, its *site* (where the user called it: an id, site_name), its *state*
//   (enqueued, started, completed, failed) and the steady-clock instants it was enqueued, started and
//   ended at (ns; 0: not yet).
// - **ring**: `capacity` records (rounded up to a power of two) by ticket % capacity; a record is
//   overwritten `capacity` tickets later. One
//   writer per record at a time (the thread that runs its communicator's collectives, or the one that
//   enqueued it); readers (a probe's thread, a dump) copy a slot under its spin lock, held for a copy of
//   one record, so that a reader never sees half a record and a writer never waits for more than a copy.
//   A slot is its lock and its record, in two cache lines of their own.
// - **tables**: communicators' and call sites' names, appended to (rarely) under a mutex and never
//   removed: an id stays valid for the life of the process.
//
// What recording costs adds to every collective's latency, so a record touches as little as it can: its
// instants are the communicator's own clock readings (no clock is read here); the slot a begin writes was
// fetched into the cache when the collective before ended (prefetch_next: stores to a slot last written
// `capacity` collectives ago waited for its lines); a collective's begin is made when its rank first
// waits for a peer (DeferredBegin); and it touches few cache lines: the recorder's own state in one, its
// slot (lock and record) in two.
//
// Off (never configured, capacity 0, or switched off), begin returns ticket 0 and every call on ticket 0 does
// nothing. The ring is allocated once, by the first configure with a capacity: the process keeps that size.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/descriptor.h"

namespace pycoll::trace {

enum class State : int32_t { kEnqueued = 0, kStarted = 1, kCompleted = 2, kFailed = 3 };
const char* state_name(State s);

struct Record {
  uint64_t ticket = 0;
  int32_t comm = -1;
  int32_t site = -1;
  uint64_t seq = 0;
  Descriptor desc{};
  State state = State::kEnqueued;
  bool gpu = false;
  int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;
};

// The steady clock in ns (std::chrono::steady_clock: CLOCK_MONOTONIC), what every instant of a record is on.
// A collective's instants are the readings its communicator and executor make anyway (Communicator::run):
// the recorder reads no clock on that path.
int64_t now_ns();

class FlightRecorder {
 public:
  // The process's recorder (off until configure). Every collective asks for it: an object at an address
  // the linker knows, with no pointer or guard to load first.
  static FlightRecorder& get();

  // Keeps the last `capacity` records (rounded up to a power of two; the first call's capacity holds for
  // the process) and records from
  // now on; 0: records nothing from now on.
  void configure(size_t capacity);
  // Switches recording on and off (what the overhead benchmark compares); off until configured.
  void set_on(bool on) { on_.store(on && capacity_ > 0, std::memory_order_release); }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

  // A new record: enqueued (seq 0) or, with `seq`, started at `now` (now_ns). Its ticket (0 when off).
  uint64_t begin(int comm, const Descriptor& desc, int site, uint64_t seq, bool gpu, int64_t now);
  // The record of `ticket` started as collective `seq` at `now`; false (nothing done) if it was overwritten.
  bool start(uint64_t ticket, uint64_t seq, int64_t now);
  // The record of `ticket` ended (completed or failed) at `now`.
  void end(uint64_t ticket, bool ok, int64_t now);
  // The last `last` records (all: 0), oldest first.
  std::vector<Record> snapshot(size_t last = 0) const;

  int comm_id(const std::string& name);
  std::string comm_name(int id) const;
  int site_id(const std::string& text);
  std::string site_name(int id) const;

 private:
  struct alignas(64) Slot {
    mutable std::atomic<bool> lock{false};  // taken by readers too (snapshot is const)
    Record record;
  };
  class Held;                  // a slot's spin lock, held for one copy
  void prefetch_next() const;  // the lines the next begin writes

  // What every collective reads, in the recorder's first cache line.
  alignas(64) std::atomic<bool> on_{false};
  size_t capacity_ = 0, mask_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{1};
  // The rest: names, rarely.
  alignas(64) mutable std::mutex names_mu_;  // also guards the ring's allocation (configure)
  std::vector<std::string> comms_, sites_;
  std::unordered_map<std::string, int> site_ids_;
};

// A record's begin made a little later than its collective's start: by the executor when this rank first
// waits for a peer (PlanRunner::run), or by the communicator before a grouped program runs, or at the end for
// a collective that never waited. So the record is written before any wait a hang could be in, and while
// this rank's first messages are on their way: its cost overlaps the peers' work instead of delaying what
// they wait for.
struct DeferredBegin {
  int comm = -1, site = -1;
  uint64_t seq = 0;
  int64_t now = 0;
  Descriptor desc{};
  bool gpu = false;
  bool pending = false;
  uint64_t ticket = 0;  // once begun (or resumed: an enqueued record)

  // Writes the record if it is still to be written; its ticket (0: none).
  uint64_t flush() {
    if (pending) {
      pending = false;
      ticket = FlightRecorder::get().begin(comm, desc, site, seq, gpu, now);
    }
    return ticket;
  }
};

// The process's recorder, never destroyed: threads may record while the process exits (the union's
// destructor does nothing).
union RecorderStorage {
  RecorderStorage() : recorder() {}
  ~RecorderStorage() {}
  FlightRecorder recorder;
};
extern RecorderStorage g_recorder;
inline FlightRecorder& FlightRecorder::get() {
  return g_recorder.recorder;
}

}  // namespace pycoll::trace
