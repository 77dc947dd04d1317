// The I/O thread: writes committed send slots and control frames to the sockets, reads the peers' frames
// into receive slots, and marks a peer lost when its connection fails.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transport/tcp_internal.h"

namespace pycoll {

using namespace tcp_detail;

void TcpTransport::wake_io() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_fd_.get(), &one, sizeof one);
  (void)rc;  // EAGAIN: a wake-up is already pending
}

void TcpTransport::wake_waiters(bool ring) {
  cv_.notify_all();
  if (!ring) return;
  if (const Doorbell* bell = bell_.load(std::memory_order_acquire)) bell->ring();
}

void TcpTransport::mark_lost(Peer& p, const std::string& why) {
  if (p.lost) return;
  p.lost = true;
  p.lost_why = why;
  p.out.clear();
  wake_waiters(true);  // a rank waiting for it raises at once
}

bool TcpTransport::pump_out(Peer& p, std::unique_lock<std::mutex>& lock) {
  bool progressed = false;
  while (!p.out.empty() && !p.lost) {
    Outgoing& o = p.out.front();
    const uint8_t* data;
    size_t total;
    if (o.slot >= 0) {
      data = send_slot(p, static_cast<uint64_t>(o.slot));
      Frame f;
      std::memcpy(&f, data, sizeof f);
      total = sizeof(Frame) + f.bytes;
    } else {
      data = o.bytes.data();
      total = o.bytes.size();
    }
    // The copy into the socket runs unlocked, so that the executor meanwhile fills and reduces other
    // slots; `sending` keeps abort() from dropping this frame under it.
    p.sending = true;
    lock.unlock();
    ssize_t k = ::send(p.fd.get(), data + p.out_offset, total - p.out_offset, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    lock.lock();
    p.sending = false;
    errno = err;
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      mark_lost(p, errno_text("send"));
      return true;
    }
    progressed = true;
    p.out_offset += static_cast<size_t>(k);
    if (p.out_offset < total) break;
    p.out_offset = 0;
    if (o.slot >= 0) ++p.sent;
    p.out.pop_front();
  }
  return progressed;
}

bool TcpTransport::pump_in(int r, Peer& p, std::unique_lock<std::mutex>& lock) {
  bool progressed = false;
  while (!p.lost) {
    Frame f;
    uint8_t* dst;
    size_t want;
    if (p.in_offset < sizeof(Frame)) {
      dst = p.in_header.data() + p.in_offset;
      want = sizeof(Frame) - p.in_offset;
    } else {
      std::memcpy(&f, p.in_header.data(), sizeof f);
      const size_t body = p.in_offset - sizeof(Frame);
      const bool full = p.arrived - p.released >= config_.slots;
      if (f.type == kData && !aborted_ && full) return progressed;  // TCP's flow control holds the peer back
      if (body == f.bytes) {                                        // a whole frame
        p.in_offset = 0;
        if (f.type != kData) {
          on_control(r, p, f.type);
        } else if (!aborted_) {
          std::memcpy(recv_slot(p, p.arrived), &f, sizeof f);
          ++p.arrived;
        }
        progressed = true;
        continue;
      }
      want = f.bytes - body;
      if (f.type != kData) {
        dst = p.in_control.data() + body;
      } else if (!aborted_) {
        dst = recv_slot(p, p.arrived) + sizeof(Frame) + body;
      } else {  // this communicator is over: drain the peer's data so that it gets to read our ABORT
        p.in_control.resize(65536);
        dst = p.in_control.data();
        want = std::min(want, p.in_control.size());
      }
    }
    // Unlocked, like pump_out's send: `dst` is a slot the executor cannot see before `arrived` moves, or
    // this thread's own header and control buffers.
    lock.unlock();
    ssize_t k = ::recv(p.fd.get(), dst, want, MSG_DONTWAIT);
    const int err = errno;
    lock.lock();
    errno = err;
    if (k <= 0) {
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return progressed;
      mark_lost(p, k == 0 ? "rank " + std::to_string(r) + " closed its connection" : errno_text("recv"));
      return true;
    }
    progressed = true;
    const bool header_done = p.in_offset < sizeof(Frame) && p.in_offset + static_cast<size_t>(k) == sizeof(Frame);
    p.in_offset += static_cast<size_t>(k);
    if (!header_done) continue;
    std::memcpy(&f, p.in_header.data(), sizeof f);
    if (f.type == kData && f.bytes > config_.fragment_bytes) {
      mark_lost(p, "rank " + std::to_string(r) + " sent a fragment larger than the transport's");
    } else if (f.type != kData && f.type != kEnter && f.type != kAbort && f.type != kBye) {
      mark_lost(p, "rank " + std::to_string(r) + " sent a frame pycoll does not know");
    } else if (f.type != kData) {
      if (f.bytes > kMaxControlBytes)
        mark_lost(p, "rank " + std::to_string(r) + " sent an oversized control frame");
      else
        p.in_control.assign(f.bytes, 0);
    }
  }
  return progressed;
}

void TcpTransport::on_control(int r, Peer& p, uint32_t type) {
  if (type == kEnter && p.in_control.size() == kEnterBytes) {
    uint64_t seq;
    Descriptor desc;
    EntryStamp stamp;
    std::memcpy(&seq, p.in_control.data(), sizeof seq);
    std::memcpy(&desc, p.in_control.data() + sizeof seq, sizeof desc);
    std::memcpy(&stamp, p.in_control.data() + sizeof seq + sizeof desc, sizeof stamp);
    p.descs.publish(seq, desc, stamp);
    p.entered = std::max(p.entered, seq);
  } else if (type == kBye) {
    p.finalized = true;
  } else if (type == kAbort && p.in_control.size() >= sizeof(AbortHead)) {
    AbortHead head;
    std::memcpy(&head, p.in_control.data(), sizeof head);
    std::string msg(reinterpret_cast<const char*>(p.in_control.data()) + sizeof head,
                    p.in_control.size() - sizeof head);
    if (!aborted_ || (abort_error_ && abort_supersedes(abort_error_->kind(), static_cast<ErrorKind>(head.kind)))) {
      aborted_ = true;
      abort_error_ = std::make_unique<Error>(static_cast<ErrorKind>(head.kind), msg, head.peer);
    }
  } else {
    mark_lost(p, "rank " + std::to_string(r) + " sent a malformed control frame");
  }
}

void TcpTransport::fail_io(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r = 0; r < world_; ++r) {
      Peer& p = peers_[r];
      if (r == rank_ || !p.fd) continue;
      mark_lost(p, "rank " + std::to_string(rank_) + "'s I/O thread failed: " + why);
      ::shutdown(p.fd.get(), SHUT_RDWR);  // the peer hears at once that this end is gone
    }
    if (!aborted_) {
      aborted_ = true;
      abort_error_ = std::make_unique<Error>(
          ErrorKind::kPeerLost,
          "rank " + std::to_string(rank_) + "'s TCP I/O thread failed (" + why +
              "): it lost every peer it reaches over TCP; the communicator cannot be used any more");
    }
  }
  wake_waiters(true);
}

void TcpTransport::io_loop() {
  std::vector<struct pollfd> fds;
  std::vector<int> owner;  // per fd: -1 the wake fd, -2 the listener, -3 - i incoming_[i], r peer r's link,
                           // world_ + r peer r's dial
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return;
    start_dials();
    fds.clear();
    owner.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    owner.push_back(-1);
    // Every change that needs this thread wakes it (wake_io); an idle one sleeps up to a second.
    Clock::time_point wake_at = Clock::now() + std::chrono::seconds(1);
    if (Clock::now() < accept_paused_until_) {
      wake_at = std::min(wake_at, accept_paused_until_);
    } else if (!key_.empty() && incoming_.size() < kMaxPending) {
      fds.push_back({listen_fd_.get(), POLLIN, 0});
      owner.push_back(-2);
    }
    for (size_t i = 0; i < incoming_.size(); ++i) {
      const bool writing = incoming_[i]->stage == Incoming::kChallenge;
      fds.push_back({incoming_[i]->fd.get(), static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      owner.push_back(-3 - static_cast<int>(i));
      wake_at = std::min(wake_at, incoming_[i]->give_up);
    }
    for (int r = 0; r < world_; ++r) {
      Peer& p = peers_[r];
      if (r == rank_ || p.lost) continue;
      if (p.link == Link::kAwaiting) wake_at = std::min(wake_at, p.awaiting_until);
      if (p.link == Link::kDialing) {
        const Dial& d = *p.dial;
        if (d.stage == Dial::kPaused) {
          wake_at = std::min(wake_at, d.retry_at);
          continue;
        }
        const bool reading = d.stage == Dial::kChallenge || d.stage == Dial::kVerdict;
        fds.push_back({d.fd.get(), static_cast<short>(reading ? POLLIN : POLLOUT), 0});
        owner.push_back(world_ + r);
        wake_at = std::min(wake_at, d.give_up);
        continue;
      }
      if (p.link != Link::kUp) continue;
      short events = 0;
      const bool header_pending = p.in_offset < sizeof(Frame);
      if (aborted_ || header_pending || p.arrived - p.released < config_.slots) events |= POLLIN;
      if (!p.out.empty()) events |= POLLOUT;
      fds.push_back({p.fd.get(), events, 0});
      owner.push_back(r);
    }
    lock.unlock();
    const int rc = ::poll(fds.data(), fds.size(), ms_left(wake_at));
    const int err = errno;
    if (fds[0].revents & POLLIN) {
      uint64_t drained;
      ssize_t k = ::read(wake_fd_.get(), &drained, sizeof drained);
      (void)k;
    }
    if (rc < 0 && err != EINTR) {
      errno = err;
      fail_io(errno_text("poll"));
      lock.lock();
      continue;
    }
    lock.lock();
    if (stop_) return;
    bool progressed = false;
    const size_t incoming_before = incoming_.size();
    std::vector<bool> incoming_over(incoming_before, false);
    for (size_t i = 1; i < fds.size(); ++i) {
      const int who = owner[i];
      if (who == -2) {
        if (fds[i].revents & POLLIN) accept_incoming();
      } else if (who <= -3) {
        const size_t k = static_cast<size_t>(-3 - who);
        if (fds[i].revents && advance_incoming(*incoming_[k])) {
          incoming_over[k] = true;
          progressed = true;
        }
      } else if (who >= world_) {
        const int r = who - world_;
        Peer& p = peers_[r];
        if (fds[i].revents && p.link == Link::kDialing && p.dial && p.dial->fd.get() == fds[i].fd) {
          advance_dial(r);
          progressed = true;
        }
      } else {
        Peer& p = peers_[who];
        if (p.link != Link::kUp || p.fd.get() != fds[i].fd) continue;
        // A frame whose bytes all arrived while the receive ring was full (an empty fragment: just its
        // header) completes once there is room, with nothing more to read: no POLLIN will say so.
        const bool pending = p.in_offset >= sizeof(Frame);
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || pending) progressed |= pump_in(who, p, lock);
        if (fds[i].revents & (POLLOUT | POLLHUP | POLLERR)) progressed |= pump_out(p, lock);
        // Frames committed while poll() slept go out now rather than after another round trip.
        if (!p.out.empty() && !(fds[i].revents & POLLOUT)) progressed |= pump_out(p, lock);
      }
    }
    // Connections accepted in this pass start their handshake at once (the Hello is usually there).
    for (size_t k = incoming_before; k < incoming_.size(); ++k)
      incoming_over.push_back(advance_incoming(*incoming_[k]));
    for (size_t k = incoming_over.size(); k-- > 0;)
      if (incoming_over[k]) incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(k));
    expire_dials(Clock::now());
    // A composite's sleeper is woken for what it waits for here, not for every frame.
    const bool ring = progressed && armed_ && (armed_any_ || ready(armed_items_.data(), armed_items_.size()));
    if (progressed) {
      lock.unlock();
      wake_waiters(ring);
      lock.lock();
    }
  }
}

}  // namespace pycoll
