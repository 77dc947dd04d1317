#include "transport/tcp.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "transport/tcp_internal.h"

namespace pycoll {

using namespace tcp_detail;

TcpTransport::TcpTransport(int rank, int world, const TcpConfig& config, const std::string& bind_host)
    : rank_(rank), world_(world), config_(config), peers_(static_cast<size_t>(world)) {
  if (world < 1 || rank < 0 || rank >= world) throw Error(ErrorKind::kInvalidUsage, "bad rank or world size");
  if (config.slots < 2 || config.fragment_bytes < 4096)
    throw Error(ErrorKind::kInvalidUsage, "TCP transport needs >= 2 slots of >= 4096 bytes");
  listen_fd_ = listen_on(bind_host, std::max(64, std::min(world, 4096)), &listen_port_);
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOLL_CHECK_SYS(wake_fd_.get());
  addresses_.assign(world, "");
  io_ = std::thread([this] { io_loop(); });  // it accepts connections once set_peers gave the key
}

TcpTransport::~TcpTransport() {
  // An aborted transport (a lost peer, a revoked communicator) owes its peers nothing: no flush, no wait
  // for their FIN, which a stopped peer would never send. Its peers have failed this collective too.
  bool orderly = true;
  {
    std::unique_lock<std::mutex> lock(mu_);
    orderly = !aborted_;
    // A collective returns once its last fragments are committed, not written: let the I/O thread put
    // them on the wire (bounded, for peers that stopped reading), or a peer still finishing that
    // collective would see the connection close before its data.
    // BYE tells the peers this is an orderly end, not a failure (they may still be finishing with others).
    // Two kinds of link still being made are finished first (bounded like the flush), and get their BYE as
    // they come up (link_up, `finalizing_`): a dial whose proof the peer has, for the peer may have given its
    // verdict and count the link as up (closing it unannounced would be a death to that peer); and a link
    // that fragments committed before it was made wait for. Any other is dropped: the peer has not linked
    // it, and its dial failing is no failure unless it waits for this rank (check_health).
    finalizing_ = orderly;
    for (int r = 0; r < world_ && orderly; ++r)
      if (r != rank_ && peers_[r].link == Link::kUp) queue_control(r, kBye, nullptr, 0);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    auto flushed = [this] {
      for (const Peer& p : peers_) {
        if (p.lost || p.link == Link::kNone) continue;
        if (p.link == Link::kUp) {
          if (!p.out.empty()) return false;
          continue;
        }
        if (p.link == Link::kDialing && p.dial->stage == Dial::kVerdict) return false;
        for (const Outgoing& o : p.out)
          if (o.slot >= 0) return false;
      }
      return true;
    };
    while (orderly && io_.joinable() && !flushed() && Clock::now() < deadline) {
      lock.unlock();
      wake_io();
      lock.lock();
      cv_.wait_for(lock, std::chrono::milliseconds(5), flushed);
    }
    stop_ = true;
  }
  wake_io();
  if (io_.joinable()) io_.join();
  // Close gracefully: FIN first, then read (and drop) what the peer still sends until its own FIN.
  // Closing with unread bytes would send a reset, and a reset can make the peer drop data of ours it
  // has not read yet. Bounded: a peer that keeps its end open is closed on after a moment.
  std::vector<struct pollfd> open;
  for (Peer& p : peers_)
    if (p.fd && orderly) {
      ::shutdown(p.fd.get(), SHUT_WR);
      open.push_back({p.fd.get(), POLLIN, 0});
    }
  const Clock::time_point linger = Clock::now() + std::chrono::seconds(2);
  char sink[65536];
  while (!open.empty() && Clock::now() < linger) {
    ::poll(open.data(), open.size(), ms_left(linger));
    for (size_t i = 0; i < open.size();) {
      ssize_t k = ::recv(open[i].fd, sink, sizeof sink, MSG_DONTWAIT);
      const bool done = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      if (done) {
        open[i] = open.back();
        open.pop_back();
      } else {
        ++i;
      }
    }
  }
}

size_t TcpTransport::slot_stride() const {
  return (sizeof(Frame) + config_.fragment_bytes + 63) / 64 * 64;
}
uint8_t* TcpTransport::send_slot(Peer& p, uint64_t i) {
  return p.send_ring.data() + (i % config_.slots) * slot_stride();
}
uint8_t* TcpTransport::recv_slot(Peer& p, uint64_t i) {
  return p.recv_ring.data() + (i % config_.slots) * slot_stride();
}

// ---- data plane ---------------------------------------------------------------------------------------

// A peer not linked yet is wanted here: its link is made meanwhile, and fragments wait in its ring.
void* TcpTransport::acquire_send(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  if (p.link == Link::kNone) want(peer);
  if (p.lost || p.committed - p.sent >= config_.slots) return nullptr;
  return send_slot(p, p.committed) + sizeof(Frame);
}

void TcpTransport::commit_send(int peer, const FragHeader& h) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    Frame f{kData, h.bytes, h};
    std::memcpy(send_slot(p, p.committed), &f, sizeof f);
    p.out.push_back({static_cast<int64_t>(p.committed), {}});
    ++p.committed;
  }
  wake_io();
}

const void* TcpTransport::peek_recv(int peer, FragHeader* h) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  if (p.link == Link::kNone) want(peer);
  if (p.arrived == p.released) return nullptr;
  const uint8_t* slot = recv_slot(p, p.released);
  Frame f;
  std::memcpy(&f, slot, sizeof f);
  *h = f.frag;
  return slot + sizeof(Frame);
}

void TcpTransport::release_recv(int peer) {
  bool was_full;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    was_full = p.arrived - p.released >= config_.slots;
    ++p.released;
  }
  if (was_full) wake_io();  // the I/O thread stopped reading this peer
}

bool TcpTransport::ready(const WaitItem* items, size_t n) const {
  if (aborted_ || stop_) return true;
  for (size_t i = 0; i < n; ++i) {
    const Peer& p = peers_[items[i].peer];
    if (p.lost) return true;
    if (items[i].room ? p.committed - p.sent < config_.slots : p.arrived > p.released) return true;
  }
  return false;
}

void TcpTransport::wait(const WaitItem* items, size_t n, int64_t timeout_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(0, timeout_ns)), [&] { return ready(items, n); });
}

bool TcpTransport::arm(const WaitItem* items, size_t n, bool any) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready(items, n)) return true;
  armed_ = true;
  armed_any_ = any;
  armed_items_.assign(items, items + n);
  return false;
}

void TcpTransport::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

// ---- announcements (ENTER, ABORT) ---------------------------------------------------------------------------

void TcpTransport::queue_control(int peer, uint32_t type, const void* payload, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.lost || p.link == Link::kNone) return;
  Frame f{type, static_cast<uint32_t>(bytes), FragHeader{}};
  Outgoing o{-1, std::vector<uint8_t>(sizeof f + bytes)};
  std::memcpy(o.bytes.data(), &f, sizeof f);
  if (bytes) std::memcpy(o.bytes.data() + sizeof f, payload, bytes);
  p.out.push_back(std::move(o));
}

void TcpTransport::throw_if_aborted() {
  if (aborted_ && abort_error_) throw *abort_error_;
}

void TcpTransport::begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_aborted();
    entered_ = seq;
    enter_.resize(kEnterBytes);
    std::memcpy(enter_.data(), &seq, sizeof seq);
    std::memcpy(enter_.data() + sizeof seq, &desc, sizeof desc);
    std::memcpy(enter_.data() + sizeof seq + sizeof desc, &stamp, sizeof stamp);
    // To the peers linked or wanted (a link made later in the collective starts with it); to every peer
    // when every peer's entry must be known (announce_to_all: skew recording).
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      if (peers_[r].link == Link::kNone) {
        if (announce_all_) want(r);  // queues the ENTER itself
        continue;
      }
      queue_control(r, kEnter, enter_.data(), enter_.size());
    }
  }
  wake_io();
}

// The ring is written by the I/O thread and read here without mu_ (it is made for one writer and readers
// that check what they copied): this runs after every collective.
bool TcpTransport::entry_stamp(int peer, uint64_t seq, EntryStamp* out) {
  return peer != rank_ && peers_[peer].descs.find_stamp(seq, out);
}

bool TcpTransport::published_descriptor(int peer, uint64_t seq, Descriptor* out) {
  return peers_[peer].descs.find(seq, out);
}

void TcpTransport::check_health(const WaitContext& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted();
  auto published = [this](int peer, uint64_t seq, Descriptor* out) { return published_descriptor(peer, seq, out); };
  check_descriptors(rank_, world_, ctx, published, [&](int r) {
    const Peer& p = peers_[r];
    // A peer that said BYE finished the collectives it needed this rank for; it is an error only to
    // wait for it, and only once what it sent before its BYE has been consumed (the executor may not
    // have looked at the ring since the I/O thread filled it and saw the connection close).
    if (p.lost && p.finalized && ctx.waiting_on_peer == r && p.arrived == p.released)
      throw Error(ErrorKind::kPeerLost,
                  "rank " + std::to_string(r) + " finalized its communicator while rank " + std::to_string(rank_) +
                      " waited for it in " + describe(*ctx.desc) + ": the ranks did not call the same collectives",
                  r);
    // A peer never linked is lost when it cannot be dialled; that fails this collective only if this rank
    // waits for it: the link may have been wanted only for announcements (ENTER) and the peer finished
    // and left first. A linked peer that vanishes without BYE is a failure wherever this rank waits.
    if (p.lost && !p.finalized && (p.linked || ctx.waiting_on_peer == r))
      throw Error(ErrorKind::kPeerLost,
                  "rank " + std::to_string(r) + " was lost while rank " + std::to_string(rank_) + " depended on it (" +
                      p.lost_why +
                      "): its process died or the network failed; the communicator cannot be used any more",
                  r);
  });
}

void TcpTransport::abort(const Error& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ && !(abort_error_ && abort_supersedes(abort_error_->kind(), error.kind()))) return;  // the first wins
    aborted_ = true;
    const std::string msg = reported_by(rank_, error.what());
    abort_error_ = std::make_unique<Error>(error.kind(), msg, error.peer());
    std::vector<uint8_t> payload(sizeof(AbortHead) + msg.size());
    AbortHead head{static_cast<int32_t>(error.kind()), error.peer()};
    std::memcpy(payload.data(), &head, sizeof head);
    std::memcpy(payload.data() + sizeof head, msg.data(), msg.size());
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      Peer& p = peers_[r];
      // Fragments not yet on the wire are dropped: the peer needs the ABORT, not the rest of the data.
      while (!p.out.empty() && p.out.back().slot >= 0 && (p.out.size() > 1 || (p.out_offset == 0 && !p.sending)))
        p.out.pop_back();
      queue_control(r, kAbort, payload.data(), payload.size());
    }
  }
  wake_io();
  wake_waiters(true);
}

std::vector<int> TcpTransport::ranks_not_entered(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;  // of the ranks this one knows of: itself and its linked peers
  for (int r = 0; r < world_; ++r)
    if ((r == rank_ || peers_[r].link == Link::kUp) && (r == rank_ ? entered_ : peers_[r].entered) < seq)
      out.push_back(r);
  return out;
}

void TcpTransport::raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                         uint64_t expected_msg_bytes) {
  throw_header_mismatch_from(rank_, peer, got, seq, desc, expected_msg_bytes,
                             [this](int p, uint64_t s, Descriptor* out) {
                               std::lock_guard<std::mutex> lock(mu_);
                               return published_descriptor(p, s, out);
                             });
}

}  // namespace pycoll
