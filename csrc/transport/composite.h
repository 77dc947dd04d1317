// A transport per peer: a communicator whose peers are reached in different ways (shared memory to the
// ranks of this host, TCP to the others) runs over one CompositeTransport that holds one member transport
// per way and a table saying which member serves each peer. The members number ranks globally and serve
// only their own peers (the shared-memory one maps no segment of a rank of another host, the TCP one
// connects to no rank of this host); their fragment sizes are equal, so plans need not know which link a
// message takes.
//
// Waiting is one wait over all members (doorbell.h): the composite sleeps on one futex word that every
// member's events ring, so a rank waiting for data from both kinds of peers at once wakes for whichever
// comes first, without polling either.
#pragma once

#include <memory>
#include <vector>

#include "transport/doorbell.h"
#include "transport/shm.h"
#include "transport/tcp.h"

namespace pycoll {

class CompositeTransport final : public Transport {
 public:
  // member_of_peer[r]: the index in `members` of the transport that serves rank r (for this rank, any).
  CompositeTransport(std::vector<std::unique_ptr<MemberTransport>> members, std::vector<int> member_of_peer);
  // Shared memory to the ranks r with local[r], TCP to the others.
  CompositeTransport(std::unique_ptr<ShmTransport> shm, std::unique_ptr<TcpTransport> tcp,
                     const std::vector<bool>& local);
  ~CompositeTransport() override;
  CompositeTransport(const CompositeTransport&) = delete;
  CompositeTransport& operator=(const CompositeTransport&) = delete;

  size_t members() const { return members_.size(); }
  MemberTransport& member(size_t k) { return *members_[k]; }
  int member_of(int peer) const { return member_of_[peer]; }

  int rank() const override { return members_[0]->rank(); }
  int world() const override { return members_[0]->world(); }
  size_t fragment_bytes() const override { return members_[0]->fragment_bytes(); }
  size_t segment_bytes() const override { return members_[0]->segment_bytes(); }

  void* acquire_send(int peer) override { return of(peer).acquire_send(peer); }
  void commit_send(int peer, const FragHeader& h) override { of(peer).commit_send(peer, h); }
  const void* peek_recv(int peer, FragHeader* h) override { return of(peer).peek_recv(peer, h); }
  void release_recv(int peer) override { of(peer).release_recv(peer); }
  void wait(const WaitItem* items, size_t n, int64_t timeout_ns) override;

  void begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) override;
  bool entry_stamp(int peer, uint64_t seq, EntryStamp* out) override;
  void check_health(const WaitContext& ctx) override;
  void abort(const Error& error) override;
  std::vector<int> ranks_not_entered(uint64_t seq) override;
  [[noreturn]] void raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                          uint64_t expected_msg_bytes) override;

 private:
  MemberTransport& of(int peer) { return *members_[member_of_[peer]]; }

  // The doorbell's word and flag when no member owns one (declared first: they outlive the members).
  std::atomic<uint32_t> own_word_{0}, own_sleeping_{0};
  Doorbell own_bell_{&own_word_, &own_sleeping_};
  std::vector<std::unique_ptr<MemberTransport>> members_;
  std::vector<int> member_of_;
  int bell_owner_ = -1;  // the member whose doorbell this is, or -1 (own_bell_)
  const Doorbell* bell_ = nullptr;
  std::vector<size_t> arm_order_;             // the bell's owner first: arming it says the rank sleeps
  std::vector<std::vector<WaitItem>> items_;  // per member, the share of the current wait
};

}  // namespace pycoll
