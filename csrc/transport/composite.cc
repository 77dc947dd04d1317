#include "transport/composite.h"

#include <algorithm>

namespace pycoll {

namespace {
// With waits on both kinds of links at once, neither transport can wake on the other's events: each is
// waited on for at most this long in turn (a TCP link's own latency is larger).
constexpr int64_t kMixedSliceNs = 100'000;
}  // namespace

CompositeTransport::CompositeTransport(std::unique_ptr<ShmTransport> shm, std::unique_ptr<TcpTransport> tcp,
                                       std::vector<bool> local)
    : shm_(std::move(shm)), tcp_(std::move(tcp)), local_(std::move(local)) {
  if (static_cast<int>(local_.size()) != shm_->world() || shm_->world() != tcp_->world() ||
      shm_->fragment_bytes() != tcp_->fragment_bytes() || shm_->segment_bytes() != tcp_->segment_bytes())
    throw Error(ErrorKind::kInternal, "the shared-memory and TCP transports of a communicator must agree");
}

void CompositeTransport::wait(const WaitItem* items, size_t n, int64_t timeout_ns) {
  shm_items_.clear();
  tcp_items_.clear();
  for (size_t i = 0; i < n; ++i) (local_[items[i].peer] ? shm_items_ : tcp_items_).push_back(items[i]);
  if (tcp_items_.empty()) return shm_->wait(shm_items_.data(), shm_items_.size(), timeout_ns);
  if (shm_items_.empty()) return tcp_->wait(tcp_items_.data(), tcp_items_.size(), timeout_ns);
  const int64_t slice = std::min(timeout_ns, kMixedSliceNs);
  tcp_->wait(tcp_items_.data(), tcp_items_.size(), slice);
  shm_->wait(shm_items_.data(), shm_items_.size(), slice);
}

void CompositeTransport::begin_collective(uint64_t seq, const Descriptor& desc) {
  shm_->begin_collective(seq, desc);
  tcp_->begin_collective(seq, desc);
}

void CompositeTransport::check_health(const WaitContext& ctx) {
  shm_->check_health(ctx);
  tcp_->check_health(ctx);
}

void CompositeTransport::abort(const Error& error) {
  shm_->abort(error);
  tcp_->abort(error);
}

std::vector<int> CompositeTransport::ranks_not_entered(uint64_t seq) {
  std::vector<int> out;
  const std::vector<int> a = shm_->ranks_not_entered(seq), b = tcp_->ranks_not_entered(seq);
  for (int r = 0; r < world(); ++r) {
    const std::vector<int>& from = local_[r] ? a : b;
    if (std::find(from.begin(), from.end(), r) != from.end()) out.push_back(r);
  }
  return out;
}

}  // namespace pycoll
