#include "transport/composite.h"

#include <algorithm>
#include <string>

namespace pycoll {

namespace {

std::vector<int> member_table(const std::vector<bool>& local) {
  std::vector<int> table(local.size());
  for (size_t r = 0; r < local.size(); ++r) table[r] = local[r] ? 0 : 1;
  return table;
}

std::vector<std::unique_ptr<MemberTransport>> two(std::unique_ptr<ShmTransport> shm,
                                                  std::unique_ptr<TcpTransport> tcp) {
  std::vector<std::unique_ptr<MemberTransport>> members;
  members.push_back(std::move(shm));
  members.push_back(std::move(tcp));
  return members;
}

}  // namespace

CompositeTransport::CompositeTransport(std::unique_ptr<ShmTransport> shm, std::unique_ptr<TcpTransport> tcp,
                                       const std::vector<bool>& local)
    : CompositeTransport(two(std::move(shm), std::move(tcp)), member_table(local)) {}

CompositeTransport::CompositeTransport(std::vector<std::unique_ptr<MemberTransport>> members,
                                       std::vector<int> member_of_peer)
    : members_(std::move(members)), member_of_(std::move(member_of_peer)) {
  if (members_.empty() || !members_[0])
    throw Error(ErrorKind::kInternal, "a composite transport needs at least one member");
  const MemberTransport& first = *members_[0];
  for (const auto& m : members_)
    if (!m || m->rank() != first.rank() || m->world() != first.world() ||
        m->fragment_bytes() != first.fragment_bytes() || m->segment_bytes() != first.segment_bytes())
      throw Error(ErrorKind::kInternal,
                  "the transports of a communicator must agree (rank, world size, fragment and segment sizes)");
  if (static_cast<int>(member_of_.size()) != first.world())
    throw Error(ErrorKind::kInternal,
                "the transports of a communicator must agree: " + std::to_string(member_of_.size()) +
                    " peer entries for world size " + std::to_string(first.world()));
  for (int k : member_of_)
    if (k < 0 || static_cast<size_t>(k) >= members_.size())
      throw Error(ErrorKind::kInternal, "a composite transport's peer table names no member");
  for (size_t k = 0; k < members_.size(); ++k) {
    if (!members_[k]->own_doorbell()) continue;
    if (bell_owner_ >= 0)
      throw Error(ErrorKind::kInternal, "at most one member of a composite transport may own its doorbell");
    bell_owner_ = static_cast<int>(k);
  }
  bell_ = bell_owner_ >= 0 ? members_[bell_owner_]->own_doorbell() : &own_bell_;
  if (bell_owner_ >= 0) arm_order_.push_back(static_cast<size_t>(bell_owner_));
  for (size_t k = 0; k < members_.size(); ++k)
    if (static_cast<int>(k) != bell_owner_) arm_order_.push_back(k);
  items_.resize(members_.size());
  for (auto& m : members_) m->ring_also(bell_);
}

CompositeTransport::~CompositeTransport() {
  // The members that ring the doorbell go first (a TCP transport joins its I/O thread), then its owner.
  for (size_t k = 0; k < members_.size(); ++k)
    if (static_cast<int>(k) != bell_owner_) members_[k].reset();
  members_.clear();
}

void CompositeTransport::wait(const WaitItem* items, size_t n, int64_t timeout_ns) {
  for (auto& share : items_) share.clear();
  for (size_t i = 0; i < n; ++i) items_[member_of_[items[i].peer]].push_back(items[i]);
  const bool any = n == 0;
  const uint32_t word = bell_->word->load(std::memory_order_acquire);
  if (bell_owner_ < 0) {
    own_sleeping_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  size_t armed = 0;  // members armed (or being armed: disarming one that is not is harmless)
  auto disarm = [&] {
    for (size_t i = 0; i < armed; ++i) members_[arm_order_[i]]->disarm();
    own_sleeping_.store(0, std::memory_order_relaxed);
  };
  try {
    bool ready = false;
    while (!ready && armed < arm_order_.size()) {
      const size_t k = arm_order_[armed++];
      ready = members_[k]->arm(items_[k].data(), items_[k].size(), any);
    }
    if (!ready) {
      for (auto& m : members_) m->before_sleep();
      futex_wait(bell_->word, word, timeout_ns);
    }
  } catch (...) {
    disarm();
    throw;
  }
  disarm();
}

void CompositeTransport::begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) {
  for (auto& m : members_) m->begin_collective(seq, desc, stamp);
}

bool CompositeTransport::entry_stamp(int peer, uint64_t seq, EntryStamp* out) {
  return of(peer).entry_stamp(peer, seq, out);
}

void CompositeTransport::check_health(const WaitContext& ctx) {
  for (auto& m : members_) m->check_health(ctx);
}

void CompositeTransport::abort(const Error& error) {
  for (auto& m : members_) m->abort(error);
}

std::vector<int> CompositeTransport::ranks_not_entered(uint64_t seq) {
  std::vector<std::vector<int>> lists;
  for (auto& m : members_) lists.push_back(m->ranks_not_entered(seq));
  std::vector<int> out;
  for (int r = 0; r < world(); ++r) {
    const std::vector<int>& from = lists[member_of_[r]];
    if (std::find(from.begin(), from.end(), r) != from.end()) out.push_back(r);
  }
  return out;
}

void CompositeTransport::raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                               uint64_t expected_msg_bytes) {
  of(peer).raise_header_mismatch(peer, got, seq, desc, expected_msg_bytes);
  throw Error(ErrorKind::kInternal, "raise_header_mismatch returned");  // members' overrides never do
}

}  // namespace pycoll
