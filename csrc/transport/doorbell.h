// One wait over several transports (CompositeTransport): the rank sleeps on one futex word, the doorbell,
// and whatever can satisfy its wait rings it.
//
// Who can ring what decides where the word lives. A shared-memory sender is another process on the hot
// path: all it can reach is the segment the sleeper owns, and all it should pay is what it pays today (a
// fence and a look at the sleeper's published wait; a futex wake only when that wait is met). So the
// doorbell is the shared-memory transport's own wake word, rung by its peers exactly as before. The TCP
// I/O thread is in the sleeper's own process and can ring any word: it rings the doorbell when the rank
// is armed and what it waits for over TCP has arrived, or when the transport aborts or its I/O fails (not
// once per frame).
// A composite of transports none of which owns a doorbell uses a word of its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/futex.h"
#include "transport/transport.h"

namespace pycoll {

struct Doorbell {
  std::atomic<uint32_t>* word = nullptr;      // what the sleeper futex-waits on
  std::atomic<uint32_t>* sleeping = nullptr;  // nonzero while the sleeper is (about to be) asleep

  // Wakes the sleeper if there is one. Pairs with the sleeper's store of `sleeping`, a seq_cst fence and
  // its look at the state (the ringer: the state, a fence, `sleeping`), so that one of them sees the other.
  // Never throws: I/O threads ring it.
  void ring() const noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping->load(std::memory_order_relaxed) == 0) return;
    word->fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all_nothrow(word);
  }
};

// A transport that serves some of the peers of a CompositeTransport. The composite waits for all of its
// members at once: it reads the doorbell's word, arms every member (each publishes what would wake the
// rank from its side and says whether something is there already), and if none is ready sleeps once on
// the word until a member's event rings it, the timeout passes, or the communicator is aborted.
class MemberTransport : public Transport {
 public:
  // The doorbell this transport's peers ring by themselves (its word in memory they share), or null when
  // it can ring any doorbell it is given. At most one member of a composite owns one.
  virtual const Doorbell* own_doorbell() { return nullptr; }
  // From now on also ring `bell` (null: stop) whenever something a waiter may want happens here.
  virtual void ring_also(const Doorbell* bell) = 0;
  // Prepares this rank's sleep: `items` (this member's share of the wait; with `any`, every event counts)
  // will wake it. Returns true if one of them may be satisfied already, or the transport failed: then the
  // composite does not sleep. Spurious trues are allowed, as spurious returns of wait() are.
  virtual bool arm(const WaitItem* items, size_t n, bool any) = 0;
  // Every member armed and none is ready: the rank sleeps now.
  virtual void before_sleep() {}
  // The sleep is over (or did not happen); called for every member that was armed.
  virtual void disarm() {}
};

}  // namespace pycoll
