// The announcements every transport carries, written once: what a rank announces of the collectives it
// enters (a ring of descriptors and entry stamps, by collective number), how an abort names the rank that reported it,
// and the checks that turn a peer's announced descriptor, or a fragment's header, into a mismatch error.
//
// Each transport carries these its own way (shared memory holds the rings in the segment a rank owns;
// TCP sends ENTER and ABORT frames and its I/O thread files them), but the ring, its size, the wording and
// the order of the checks are the ones here.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace pycoll {

// How many of the last collectives a rank entered its peers can look up: enough that a rank running a
// few collectives ahead of (or behind) another can still name what that one called.
constexpr int kDescriptorRing = 16;

// The descriptors and entry stamps of the last kDescriptorRing collectives one rank entered, by
// seq % kDescriptorRing. One writer, any number of readers, also in other processes (it may live in shared
// memory): a slot's seq is 0 while it is being written, and a reader checks it again after copying. A slot
// is one cache line, so a peer reading a stamp (engine/skew.cc, after every collective) costs one line.
struct DescriptorRing {
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    Descriptor desc{};
    EntryStamp stamp{};
  };
  static_assert(sizeof(Slot) == 64, "a descriptor ring slot is one cache line");
  Slot slots[kDescriptorRing];

  void publish(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) {
    Slot& s = slots[seq % kDescriptorRing];
    s.seq.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.desc = desc;
    s.stamp = stamp;
    s.seq.store(seq, std::memory_order_release);
  }
  bool find_stamp(uint64_t seq, EntryStamp* out) const {
    const Slot& s = slots[seq % kDescriptorRing];
    if (s.seq.load(std::memory_order_acquire) != seq) return false;
    *out = s.stamp;
    std::atomic_thread_fence(std::memory_order_acquire);
    return s.seq.load(std::memory_order_relaxed) == seq;
  }
  // What was announced for collective `seq`; false if nothing was (or it was overwritten since).
  bool find(uint64_t seq, Descriptor* out) const {
    const Slot& s = slots[seq % kDescriptorRing];
    if (s.seq.load(std::memory_order_acquire) != seq) return false;
    *out = s.desc;
    std::atomic_thread_fence(std::memory_order_acquire);
    return s.seq.load(std::memory_order_relaxed) == seq;
  }
};

// An abort's message as every rank raises it: prefixed once with the rank that reported it.
std::string reported_by(int rank, const std::string& message);

// Which abort a rank raises when it holds several: the first, except that a revocation (kBroken:
// comm.revoke(), often a peer's reaction to the very error another rank recorded first) never hides a
// specific error such as the mismatch or the lost peer that caused it.
inline bool abort_supersedes(ErrorKind held, ErrorKind incoming) {
  return held == ErrorKind::kBroken && incoming != ErrorKind::kBroken;
}

// Throws the mismatch error for the first peer (in rank order) that announced another descriptor for
// collective ctx.seq than this rank's. `published(peer, seq, &out)` looks up what a peer announced;
// `before(peer)` runs first for each peer (a transport's own checks of that peer, in the same order).
template <class Published, class Before>
void check_descriptors(int rank, int world, const WaitContext& ctx, Published&& published, Before&& before) {
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    before(r);
    Descriptor theirs;
    if (published(r, ctx.seq, &theirs) && theirs.hash() != ctx.desc->hash())
      throw descriptor_mismatch(rank, r, ctx.seq, *ctx.desc, theirs);
  }
}
template <class Published>
void check_descriptors(int rank, int world, const WaitContext& ctx, Published&& published) {
  check_descriptors(rank, world, ctx, published, [](int) {});
}

// Transport::raise_header_mismatch for a transport whose peers' descriptors `published` looks up.
template <class Published>
[[noreturn]] void throw_header_mismatch_from(int rank, int peer, const FragHeader& got, uint64_t seq,
                                             const Descriptor& desc, uint64_t expected_msg_bytes,
                                             Published&& published) {
  Descriptor at_got, at_seq;
  const bool has_got = published(peer, got.seq, &at_got);
  const bool has_seq = published(peer, seq, &at_seq);
  throw_header_mismatch(rank, peer, got, seq, desc, expected_msg_bytes, has_got ? &at_got : nullptr,
                        has_seq ? &at_seq : nullptr);
}

}  // namespace pycoll
