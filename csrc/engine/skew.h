// Who arrives late at the collectives, and how long the others wait for it (docs/skew.md). Every rank
// learns every peer's entry time from what the peers announce as they enter (Transport::begin_collective
// and entry_stamp: shared memory keeps it in the announcing rank's segment, TCP in the ENTER frame every
// rank already sends), so recording costs no message of its own.
//
// The parts, by the names used below:
//   stamp     what this rank announces as it enters collective seq: its entry time and the time it left
//             the collective before, on its own clock (the steady clock, plus a test offset).
//   entries   collective seq's stamps of every rank, read back after this rank's own collectives (kBatch
//             at a time) once all have arrived; a collective still missing one kHorizon collectives later
//             is dropped (counted as unmatched), as is one a rank that records nothing took part in.
//   clock     per rank, the offset that turns its clock into rank 0's: 0 in rank 0's clock domain (one
//             kernel, so one steady clock), else the midpoint of what causality leaves possible. No rank
//             leaves an N x N collective (every kind but broadcast) before every rank entered it, so on
//             each one rank i's offset lies in (e_0 - x_i, x_0 - e_i) (e: entry, x: exit, own clocks).
//             These intervals are intersected, widened by kDriftPpm of the time that passed, and reset
//             when they contradict each other (a clock that stepped); the ranks of one domain share them.
//   lateness  a rank's entry on rank 0's clock minus the collective's earliest entry.
//   wait      each rank waits from its own entry until the last rank enters (suffered); the last rank
//             inflicts the sum of those waits (Scalasca's "Wait at N x N" attribution).
//   totals    per collective kind and rank: count, sum and max of lateness and a histogram of it (16
//             buckets per octave from 1 us), wait inflicted and suffered, times last.
//   recent    the last `capacity` collectives: seq, kind, last rank, every rank's lateness.
//   notices   thresholds on one rank's mean lateness over the last `window` collectives (window <=
//             capacity); crossing one queues an event, and again once per window while it stays crossed.
//
// All of it runs on this rank's thread after each collective, under the recorder's own lock (so that
// reports and notices can be read from another thread while a collective runs).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "engine/descriptor.h"
#include "transport/transport.h"

namespace pycoll {

struct SkewConfig {
  bool enabled = true;
  size_t capacity = 1024;       // collectives kept in `recent`
  int64_t clock_offset_ns = 0;  // added to this rank's clock (tests of the clock estimate)
};

// A notice that fired: `rank`'s mean lateness over the last `window` collectives passed the notice's
// threshold; the others lost `inflicted_ns` waiting for it over that window.
struct SkewEvent {
  int notice;
  int rank;
  uint64_t seq;
  uint32_t window;
  int64_t mean_late_ns;
  int64_t inflicted_ns;
};

// Everything the Python layer turns into a report (pycoll/skew.py); arrays are row-major.
struct SkewSnapshot {
  int world = 0;
  int kinds = kNumCollectives;
  int buckets = 0;
  uint64_t recorded = 0, unmatched = 0, unsynced = 0;
  // totals: [kind][rank], and hist [kind][rank][bucket]
  std::vector<uint64_t> count, last;
  std::vector<int64_t> sum_ns, max_ns, inflicted_ns, suffered_ns;
  std::vector<uint32_t> hist;
  // recent, oldest first: [n], and late [n][rank]
  std::vector<uint64_t> recent_seq;
  std::vector<int32_t> recent_kind, recent_last;
  std::vector<int64_t> recent_late_ns;
  // clock: offset to rank 0's clock, and half the width of the interval it was taken from (0: same
  // clock domain as rank 0; -1: not known yet)
  std::vector<int64_t> offset_ns, uncertainty_ns;
};

class SkewRecorder {
 public:
  static constexpr int kBucketsPerOctave = 16;
  static constexpr int kBuckets = 512;  // the last starts at 30 * 2^37 ns (68 minutes) and takes all above
  // Collectives are processed kBatch at a time, after each collective whose number is a multiple of it
  // (the recorder's state stays in cache across them; a notice is up to kBatch - 1 collectives late, the
  // same on every rank); one whose stamps are still missing kHorizon collectives later is dropped. Both
  // well below kDescriptorRing, so that no peer has overwritten a stamp not read yet.
  static constexpr uint32_t kBatch = 4;
  static constexpr uint64_t kHorizon = 12;
  static constexpr uint32_t kPendingSlots = 16;
  static constexpr double kDriftPpm = 100;

  SkewRecorder(int rank, int world, const SkewConfig& config);

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Stops (false) or resumes recording on this rank; meant for measuring what it costs (the others count
  // the collectives this rank records nothing of as unmatched). Starts as config.enabled.
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  // This rank's clock (what stamps are written in).
  int64_t now_ns() const;
  // The stamp to announce for the collective this rank enters at `steady_ns` (the steady clock, in ns: the
  // caller reads it once for the collective's flight record, deadline and stamp); zeros when disabled.
  EntryStamp enter(int64_t steady_ns);
  // After collective `seq` (of kind `collective`) ran on this rank: files it, then processes every
  // collective whose stamps have all arrived. `report`: whether it counts in the report (the library's
  // own collectives only feed the clock estimate). Returns the number of events waiting, after the
  // collectives that end a batch (0 after the others).
  size_t exit(Transport& t, uint64_t seq, int collective, bool report);
  // Processes what has arrived without waiting for a next collective (before a report).
  void flush(Transport& t);
  // Clock domains by rank (ranks with one value share a clock); until set, every rank shares rank 0's.
  void set_domains(const std::vector<int64_t>& domains);
  // Adds a notice (its id); throws InvalidUsage for a window of 0 or above the capacity.
  int add_notice(int64_t late_ns, uint32_t window);
  void remove_notice(int id);
  std::vector<SkewEvent> take_events();
  SkewSnapshot snapshot() const;

  // The histogram bucket of a lateness, and the smallest value of a bucket (pycoll/skew.py mirrors them).
  static int bucket(int64_t ns);
  static int64_t bucket_floor(int b);

 private:
  struct Pending {
    uint64_t seq;
    int kind;
    bool report;
    EntryStamp own;
  };
  struct Notice {
    int id;
    int64_t late_ns;
    uint32_t window;
    std::vector<int64_t> sum_late, sum_inflicted;  // per rank, over the window
    std::vector<uint64_t> quiet_until;             // per rank: no new event before this many recorded
  };
  struct Bounds {
    int64_t lo, hi;
    bool known = false;
  };

  // The stamps of p from every rank, or false if one has not arrived.
  bool gather(Transport& t, const Pending& p);
  void process(const Pending& p);
  void update_clock(const Pending& p);
  // Offsets of every rank for the entries in entries_; false if one is not known yet.
  bool offsets();
  void record(const Pending& p);
  void notify(size_t slot);
  void process_ready(Transport& t);

  const int rank_, world_;
  const SkewConfig config_;
  std::atomic<bool> enabled_;
  mutable std::mutex mu_;
  EntryStamp next_;  // this rank's stamp for the collective it is entering
  int64_t last_exit_ns_ = 0;
  std::vector<Pending> pending_;  // a ring of kPendingSlots: pending_count_ from pending_head_, oldest first
  uint32_t pending_head_ = 0, pending_count_ = 0;
  std::vector<EntryStamp> entries_;  // the stamps of the collective being processed, by rank
  // The previous processed collective, for the clock (its exits arrive with the next one's stamps).
  uint64_t prev_seq_ = 0;
  int prev_kind_ = -1;
  std::vector<int64_t> prev_entered_;
  std::vector<int> domain_index_;  // per rank: its clock domain, numbered by first appearance
  int domains_ = 1;
  std::vector<Bounds> bounds_;         // per rank: its offset to rank 0's clock
  std::vector<Bounds> domain_bounds_;  // per domain: the intersection of its ranks' bounds
  int64_t widened_at_ = 0;             // rank 0's entry (its clock) when the bounds were last widened
  std::vector<int64_t> offset_, late_;
  // totals: per kind, and per kind and rank ([kind][rank])
  struct Kind {
    uint64_t count = 0;
    int64_t spread = 0;  // sum over its collectives of last entry - first entry
  };
  uint64_t recorded_ = 0, unmatched_ = 0, unsynced_ = 0;
  std::vector<Kind> kinds_;
  std::vector<uint64_t> last_;
  std::vector<int64_t> sum_, max_, inflicted_;
  std::vector<std::vector<uint32_t>> hist_;  // per kind ([rank][bucket]), made at its first collective
  // recent: a ring of `capacity` + 1 collectives
  struct Recent {
    uint64_t seq = 0;
    int32_t kind = 0, last = 0;
    int64_t inflicted = 0;
  };
  std::vector<Recent> recent_;
  std::vector<int64_t> recent_late_;  // [slot][rank]
  std::vector<Notice> notices_;
  int next_notice_ = 1;
  std::vector<SkewEvent> events_;
};

}  // namespace pycoll
