// The seam between the executor and whatever moves bytes between two ranks.
//
// A transport lends buffers instead of copying from the caller's: the sender asks for room for the
// next fragment to a peer (acquire_send), writes it there (a plain copy, or an encoder or a reduction
// writing straight into it) and commits it; the receiver looks at the oldest fragment from a peer in
// place (peek_recv), consumes it (copy, reduce, decode-accumulate) and releases it. Shared memory lends
// slots of a ring in a segment both processes map; TCP lends staging buffers that its I/O threads
// drain and fill; CUDA IPC lends slots in device memory. Nothing here blocks except wait().
//
// Fragments to one peer arrive in the order they were committed. Each carries a FragHeader so that the
// receiver can check it belongs to the collective it is running (CollectiveMismatchError otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/descriptor.h"
#include "pycoll/errors.h"

namespace pycoll {

struct FragHeader {
  uint64_t seq;        // collective number on the communicator (the same on every rank for one call)
  uint64_t desc_hash;  // Descriptor::hash() of the sender's call
  uint64_t msg_bytes;  // size of the whole message this fragment belongs to
  uint64_t offset;     // where the fragment starts within the message
  uint32_t bytes;      // payload bytes in this fragment
  // With a codec: the message's element count (its low 32 bits), which its encoded size cannot always tell
  // (an int4 last block of 2k - 1 elements encodes into as many bytes as one of 2k); 0 otherwise.
  uint32_t count_lo;
};

// What a rank says of its timing as it enters a collective, on its own clock (engine/skew.h): when it
// entered this collective and when it left the one before. 0: not recorded (skew reporting is off, or
// there was no collective before).
struct EntryStamp {
  int64_t entered_ns = 0;
  int64_t prev_exit_ns = 0;
};

// One thing a blocked executor waits for: `fragments` more fragments from `peer` (room == false), or
// that many free fragment slots toward `peer` (room == true). Asking for several at once lets a rank
// that shares its core with others sleep until a batch is ready instead of waking per fragment.
struct WaitItem {
  int peer;
  bool room;
  uint32_t fragments;
};

// What the executor knows while it waits; the transport uses it to word its errors.
struct WaitContext {
  uint64_t seq;
  const Descriptor* desc;
  int waiting_on_peer;  // the peer whose data or room the executor is waiting for, or -1
};

// The mismatch errors every transport raises, worded in one place. `theirs...` is what the peer announced
// for that collective, or null when it has not (yet).
Error descriptor_mismatch(int rank, int peer, uint64_t seq, const Descriptor& mine, const Descriptor& theirs);
[[noreturn]] void throw_header_mismatch(int rank, int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                        uint64_t expected_msg_bytes, const Descriptor* theirs_at_got_seq,
                                        const Descriptor* theirs_at_seq);
// An encoded message of `got` elements (FragHeader::count_lo) where `expected` were (the same encoded size).
[[noreturn]] void throw_count_mismatch(int rank, int peer, uint32_t got, uint32_t expected, uint64_t seq,
                                       const Descriptor& desc);
// How the ranks' sizes of a message must agree, for a mismatch's message ("" where the call's count says it).
std::string sizes_hint(int rank, int peer, const Descriptor& desc);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Largest payload of one fragment (the same on every rank of a communicator).
  virtual size_t fragment_bytes() const = 0;
  // Largest message a plan step may send on one link: plans cut data into segments no larger than this,
  // so that bounded channels never hold up a step (half of one channel's capacity).
  virtual size_t segment_bytes() const = 0;

  // --- data plane, non-blocking ---
  // Room for the next fragment to `peer`, at least fragment_bytes() large, or nullptr if none is free now.
  virtual void* acquire_send(int peer) = 0;
  virtual void commit_send(int peer, const FragHeader& h) = 0;
  // The oldest unconsumed fragment from `peer` (header copied to *h), or nullptr if none has arrived.
  virtual const void* peek_recv(int peer, FragHeader* h) = 0;
  virtual void release_recv(int peer) = 0;

  // --- waiting ---
  // Blocks until one of `items` may be satisfied, the communicator is aborted, or timeout_ns passes
  // (spurious returns are allowed: the caller polls again). A transport may wait for fewer fragments
  // than asked (it wakes a rank early rather than let two sleeping ranks wait on each other), never more.
  virtual void wait(const struct WaitItem* items, size_t n, int64_t timeout_ns) = 0;

  // --- announcements: ENTER (what a rank calls) and ABORT ---
  // Announce that this rank enters collective `seq`, with its stamp; throws if the communicator was aborted.
  virtual void begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) = 0;
  // The stamp `peer` announced for collective `seq`; false if it has not reached this rank (yet), or was
  // overwritten since (the last kDescriptorRing collectives are kept).
  virtual bool entry_stamp(int peer, uint64_t seq, EntryStamp* out) = 0;
  // Called while waiting long enough to suspect trouble: throws PeerLost (a peer died), Mismatch (a peer
  // published a different descriptor for this collective) or the error some other rank aborted with.
  virtual void check_health(const WaitContext& ctx) = 0;
  // Tell every rank that this communicator failed with `error` (the first abort wins).
  virtual void abort(const Error& error) = 0;
  // Ranks that have not yet entered collective `seq`, for timeout messages.
  virtual std::vector<int> ranks_not_entered(uint64_t seq) = 0;
  // Throws the Mismatch error for a fragment whose header does not fit the running collective.
  [[noreturn]] virtual void raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                                  uint64_t expected_msg_bytes) = 0;
};

}  // namespace pycoll
