// A transport per peer: shared memory to the ranks of this host, TCP to the others. Both inner transports
// number ranks globally and serve only their own peers (the shared-memory one maps no segment of a rank
// of another host, the TCP one connects to no rank of this host); the fragment sizes of both are equal,
// so plans need not know which link a message takes.
#pragma once

#include <memory>
#include <vector>

#include "transport/shm.h"
#include "transport/tcp.h"

namespace pycoll {

class CompositeTransport final : public Transport {
 public:
  // local[r]: rank r is on this host (shared memory); the others are reached over TCP.
  CompositeTransport(std::unique_ptr<ShmTransport> shm, std::unique_ptr<TcpTransport> tcp, std::vector<bool> local);

  ShmTransport& shm() { return *shm_; }
  TcpTransport& tcp() { return *tcp_; }
  const std::vector<bool>& local() const { return local_; }

  int rank() const override { return shm_->rank(); }
  int world() const override { return shm_->world(); }
  size_t fragment_bytes() const override { return shm_->fragment_bytes(); }
  size_t segment_bytes() const override { return shm_->segment_bytes(); }

  void* acquire_send(int peer) override { return of(peer).acquire_send(peer); }
  void commit_send(int peer, const FragHeader& h) override { of(peer).commit_send(peer, h); }
  const void* peek_recv(int peer, FragHeader* h) override { return of(peer).peek_recv(peer, h); }
  void release_recv(int peer) override { of(peer).release_recv(peer); }
  void wait(const WaitItem* items, size_t n, int64_t timeout_ns) override;

  void begin_collective(uint64_t seq, const Descriptor& desc) override;
  void check_health(const WaitContext& ctx) override;
  void abort(const Error& error) override;
  std::vector<int> ranks_not_entered(uint64_t seq) override;
  [[noreturn]] void raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                          uint64_t expected_msg_bytes) override {
    of(peer).raise_header_mismatch(peer, got, seq, desc, expected_msg_bytes);
  }

 private:
  Transport& of(int peer) { return local_[peer] ? static_cast<Transport&>(*shm_) : *tcp_; }

  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<TcpTransport> tcp_;
  std::vector<bool> local_;
  std::vector<WaitItem> shm_items_, tcp_items_;
};

}  // namespace pycoll
