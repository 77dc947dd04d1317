// Shared-memory transport between the processes of one host.
//
// Each rank owns one segment: an anonymous memfd (so nothing ever appears in /dev/shm, and the kernel
// frees it when the last process that maps it exits, however it exits). The others map it by opening
// /proc/<owner pid>/fd/<fd> once, during set-up. A segment holds
//   - the owner's control block: what it is waiting for while it sleeps (a futex word and a short list
//     of wait items), the descriptors of the collectives it entered, its abort record;
//   - one outbound channel per peer: a ring of `slots` fragments of `slot_bytes` each, written by the
//     owner (head) and consumed in place by that peer (tail).
// A fragment is therefore copied once into the ring by the sender and read once by the receiver, who
// reduces or copies it straight into its own buffer (or into its own outbound ring, for a fused
// receive-reduce-send). Waiting spins briefly (only when every rank has a core of its own) and then
// sleeps on the futex word, waking every few milliseconds to check that peers are alive. A sleeping rank
// publishes what it waits for, e.g. "half a ring of data from rank 3", and peers wake it only when that
// is there (or when they go to sleep themselves): with more ranks than cores this turns one wake-up per
// fragment into one per batch.
//
// A peer's segment is mapped when this rank first needs it (it sends to or receives from that peer, or
// reads its announcements), not at set-up: a rank of a ring maps its two neighbours' segments, whatever
// the world size, and a segment's pages are touched only where a channel carries fragments (a memfd's
// pages read as zeros until written). So the owner keeps its segment's fd open for its peers to open
// through /proc as long as the communicator lives. A peer whose process has exited cannot be mapped:
// PeerLostError naming it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/doorbell.h"
#include "transport/fd.h"
#include "transport/transport.h"

namespace pycoll {

struct ShmConfig {
  size_t slot_bytes = 64 * 1024;
  uint32_t slots = 8;
};

class ShmTransport final : public MemberTransport {
 public:
  ShmTransport(int rank, int world, const ShmConfig& config);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // This rank's segment, for the others to map: the owner's pid, its fd, the size.
  int segment_fd() const { return fd_.get(); }
  size_t segment_size() const { return size_; }
  // Where the peers' segments are (pids[r], fds[r] as they published them; pid 0: a rank of another host,
  // which this transport does not serve; this rank's entry is ignored). Each is mapped at first use.
  void set_peers(const std::vector<int>& pids, const std::vector<int>& fds);
  // The peers whose segments are mapped here (for the tests: a ring maps two).
  std::vector<int> mapped_peers() const;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  size_t fragment_bytes() const override { return config_.slot_bytes; }
  size_t segment_bytes() const override { return config_.slot_bytes * config_.slots / 2; }

  void* acquire_send(int peer) override;
  void commit_send(int peer, const FragHeader& h) override;
  const void* peek_recv(int peer, FragHeader* h) override;
  void release_recv(int peer) override;

  void wait(const WaitItem* items, size_t n, int64_t timeout_ns) override;

  // As a member of a CompositeTransport: the doorbell is this rank's wake word, which its peers ring.
  const Doorbell* own_doorbell() override { return &bell_; }
  void ring_also(const Doorbell* bell) override;
  bool arm(const WaitItem* items, size_t n, bool any) override;
  void before_sleep() override { wake_partial_waiters(); }
  void disarm() override;

  void begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) override;
  bool entry_stamp(int peer, uint64_t seq, EntryStamp* out) override;
  void check_health(const WaitContext& ctx) override;
  void abort(const Error& error) override;
  std::vector<int> ranks_not_entered(uint64_t seq) override;
  [[noreturn]] void raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                          uint64_t expected_msg_bytes) override;

  struct ControlBlock;
  struct Channel;

 private:
  // Rank r's segment, mapped at its first use (PeerLostError if its process has exited).
  uint8_t* segment(int r) {
    uint8_t* s = segments_[r].load(std::memory_order_acquire);
    return s ? s : map_peer(r);
  }
  // Rank r's segment if it is mapped or can be; nullptr if it is gone (no PeerLostError, no grace).
  uint8_t* try_segment(int r) {
    uint8_t* s = segments_[r].load(std::memory_order_acquire);
    return s ? s : map_peer(r, true);
  }
  uint8_t* map_peer(int r, bool gone_ok = false);
  std::string gone_peer(int r);  // why rank r's segment cannot be mapped: exited, or left (map_peer)
  ControlBlock* control(int r) { return reinterpret_cast<ControlBlock*>(segment(r)); }
  Channel* channel(int owner, int peer);  // owner's outbound channel to peer
  uint8_t* slot(Channel* ch, uint64_t index) const;
  // After this rank moved its counter on the channel it shares with `peer` (room: it released a slot of
  // peer's ring; else it committed a fragment to peer), wake peer if that is what it sleeps for.
  void notify(int peer, bool room, uint64_t counter);
  void wake(int peer);
  // Fragments available to the sleeper of `entry` on this rank's side, and whether that meets its target.
  bool satisfied(const WaitItem& item, uint64_t* available);
  // Before sleeping: wake peers that sleep waiting on this rank while something is there for them.
  void wake_partial_waiters();
  void throw_if_aborted();
  bool published_descriptor(int peer, uint64_t seq, Descriptor* out);
  void check_peers_alive();

  int rank_;
  int world_;
  ShmConfig config_;
  UniqueFd fd_;
  size_t size_ = 0;
  size_t channel_stride_ = 0;
  // segments_[r]: rank r's segment mapped here, or null. Written once (map_peer, under map_mu_); read by
  // every thread (abort() comes from the fault plane's).
  std::unique_ptr<std::atomic<uint8_t*>[]> segments_;
  // The peers mapped, in the order they were: mapped_[0, n_mapped_). Room for every rank is made at the
  // start, so that a thread reading it never sees it move (map_peer appends under map_mu_).
  std::unique_ptr<int[]> mapped_;
  std::atomic<int> n_mapped_{0};
  mutable std::mutex map_mu_;
  std::vector<UniqueFd> pidfds_;  // none where pidfd_open is unavailable (then /proc is read)
  std::vector<int> pids_, fds_;   // where each peer's segment is (set_peers)
  // Local copies of the ring counters, so the shared ones are read only when a ring looks full / empty.
  std::vector<uint64_t> send_head_, send_tail_seen_, recv_tail_, recv_head_seen_;
  Doorbell bell_;  // this rank's wake word and sleeping flag (in its control block)
};

}  // namespace pycoll
