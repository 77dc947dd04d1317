// The TCP transport's links, made at first use (tcp.h describes them): wanting a peer, dialling every
// wanted peer at once, accepting the peers that dial this rank, both sides of the handshake, and the
// verdict that leaves one link when two ranks dialled each other at the same time. Everything here runs
// with mu_ held (the I/O thread's handshakes are a few small non-blocking reads and writes).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp_internal.h"

namespace pycoll {

using namespace tcp_detail;

namespace {

// How long a failed attempt waits before the next (an impostor or a broken handshake at the address: the
// peer may still come).
constexpr auto kRetryPause = std::chrono::milliseconds(20);

enum class Io { kDone, kWait, kFailed };

// Moves `n` bytes of `buf` (from *done on) to or from a non-blocking socket as far as it goes.
Io transfer(int fd, void* buf, size_t n, size_t* done, bool send) {
  auto* p = static_cast<uint8_t*>(buf);
  while (*done < n) {
    const ssize_t k =
        send ? ::send(fd, p + *done, n - *done, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(fd, p + *done, n - *done, 0);
    if (k > 0) {
      *done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Io::kWait;
    return Io::kFailed;  // closed, or failed
  }
  *done = 0;
  return Io::kDone;
}

}  // namespace

void TcpTransport::ensure_rings(Peer& p) {
  if (!p.send_ring.empty()) return;
  p.send_ring.resize(slot_stride() * config_.slots);
  p.recv_ring.resize(slot_stride() * config_.slots);
  p.in_header.resize(sizeof(Frame));
}

void TcpTransport::want(int peer) {
  Peer& p = peers_[peer];
  if (p.lost || p.link != Link::kNone || peer == rank_) return;
  if (!key_.empty() && addresses_[peer].empty()) return;  // a rank this transport does not serve
  ensure_rings(p);
  p.link = Link::kWanted;
  if (!enter_.empty()) queue_control(peer, kEnter, enter_.data(), enter_.size());  // first in its queue
  wake_io();
}

void TcpTransport::link_up(int peer, UniqueFd fd) {
  Peer& p = peers_[peer];
  const bool unwanted = p.link == Link::kNone;
  ensure_rings(p);
  tune(fd.get());
  p.fd = std::move(fd);
  p.link = Link::kUp;
  p.linked = true;
  p.dial.reset();
  p.in_offset = 0;
  if (unwanted && !enter_.empty()) queue_control(peer, kEnter, enter_.data(), enter_.size());
  // A link made while this rank finalizes (~TcpTransport) is told at once that the rank is leaving.
  if (finalizing_) queue_control(peer, kBye, nullptr, 0);
  cv_.notify_all();  // link_now() waits for it
}

void TcpTransport::start_dials() {
  if (key_.empty()) return;
  const Clock::time_point now = Clock::now();
  for (int r = 0; r < world_; ++r) {
    Peer& p = peers_[r];
    if (p.lost || !(p.link == Link::kWanted || (p.link == Link::kDialing && p.dial->stage == Dial::kPaused))) continue;
    if (p.link == Link::kWanted) {
      if (addresses_[r].empty()) {
        mark_lost(p, "rank " + std::to_string(r) + " is not reached over TCP from rank " + std::to_string(rank_));
        continue;
      }
      p.dial = std::make_unique<Dial>();
      p.dial->deadline = now + dial_timeout_;
      p.link = Link::kDialing;
    }
    Dial& d = *p.dial;
    if (now < d.retry_at) continue;
    ++p.dial_attempts;
    std::string why;
    d.fd = start_connect(addresses_[r], &why);
    if (!d.fd) {
      mark_lost(p, "rank " + std::to_string(r) + " cannot be reached at " + addresses_[r] + " (" + why +
                       "): its process has exited, or the address is wrong");
      continue;
    }
    d.stage = Dial::kConnecting;
    d.done = 0;
    d.give_up = now + kHandshakeTimeout;
  }
}

void TcpTransport::advance_dial(int peer) {
  Peer& p = peers_[peer];
  Dial& d = *p.dial;
  auto failed = [&](const std::string& why, bool impostor = false) {
    d.fd.reset();
    d.last = why;
    d.impostor |= impostor;
    d.stage = Dial::kPaused;
    d.retry_at = Clock::now() + kRetryPause;
  };
  const int fd = d.fd.get();
  if (d.stage == Dial::kConnecting) {
    const std::string error = connect_error(fd);
    if (!error.empty()) {
      d.fd.reset();
      if (d.impostor)  // an earlier attempt reached a listener without the key: the likelier cause
        return mark_lost(
            p, "rank " + std::to_string(rank_) + " could not connect to rank " + std::to_string(peer) + " at " +
                   addresses_[peer] +
                   " (whoever listens there did not prove it holds this job's key; last attempt: " + error + ")");
      return mark_lost(p, "rank " + std::to_string(peer) + " cannot be reached at " + addresses_[peer] + " (" + error +
                              "): its process has exited, or the address is wrong");
    }
    d.hello = Hello{kHelloMagic, rank_, world_, peer, 0, {}};
    random_bytes(d.hello.nonce, kNonceBytes);
    d.stage = Dial::kHello;
  }
  if (d.stage == Dial::kHello) {
    const Io io = transfer(fd, &d.hello, sizeof d.hello, &d.done, true);
    if (io != Io::kDone) return io == Io::kWait ? void() : failed("the handshake failed");
    d.stage = Dial::kChallenge;
  }
  if (d.stage == Dial::kChallenge) {
    const Io io = transfer(fd, &d.challenge, sizeof d.challenge, &d.done, false);
    if (io != Io::kDone) return io == Io::kWait ? void() : failed("the handshake failed");
    if (d.challenge.magic != kChallengeMagic) return failed("the handshake failed");
    if (!proof_matches(d.challenge.proof, handshake_proof(key_, 'L', d.hello, d.challenge.nonce)))
      return failed("a wrong proof", true);  // this rank's own proof is never sent to it
    const Digest proof = handshake_proof(key_, 'D', d.hello, d.challenge.nonce);
    std::memcpy(d.proof.proof, proof.data(), proof.size());
    d.stage = Dial::kProof;
  }
  if (d.stage == Dial::kProof) {
    const Io io = transfer(fd, &d.proof, sizeof d.proof, &d.done, true);
    if (io != Io::kDone) return io == Io::kWait ? void() : failed("the handshake failed");
    d.stage = Dial::kVerdict;
  }
  if (d.stage == Dial::kVerdict) {
    const Io io = transfer(fd, &d.verdict, sizeof d.verdict, &d.done, false);
    if (io != Io::kDone) return io == Io::kWait ? void() : failed("the handshake failed");
    if (d.verdict.verdict == kVerdictLink) return link_up(peer, std::move(d.fd));
    if (d.verdict.verdict != kVerdictDouble) return failed("the handshake failed");
    // Both ranks dialled at once: the lower rank's connection is the link, and it is on its way here (by
    // this dial's deadline: the lower rank's own dial may fail too).
    p.awaiting_until = d.deadline;
    p.dial.reset();
    p.link = Link::kAwaiting;
  }
}

void TcpTransport::accept_incoming() {
  while (incoming_.size() < kMaxPending) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {  // nothing waiting; or starved of descriptors, and then not polled for a while
      if (accept_starved(errno)) accept_paused_until_ = Clock::now() + kAcceptBackoff;
      return;
    }
    auto in = std::make_unique<Incoming>();
    in->fd = std::move(fd);
    in->give_up = Clock::now() + kHandshakeTimeout;
    incoming_.push_back(std::move(in));
  }
}

bool TcpTransport::advance_incoming(Incoming& in) {
  const int fd = in.fd.get();
  auto reject = [&] {
    // Not one of this job's ranks: closed and counted, and this rank goes on. Not counted: a dial its rank
    // gave up (closed before it said a word, or when the two ranks dialled each other and the other
    // connection is, or is about to be, the link).
    const bool said_nothing = in.stage == Incoming::kHello && in.done == 0 && !in.spoke;
    const Link link = in.stage != Incoming::kHello ? peers_[in.hello.rank].link : Link::kNone;
    const bool abandoned = link == Link::kUp || link == Link::kDialing;
    if (!said_nothing && !abandoned) ++rejected_;
    return true;
  };
  if (in.stage == Incoming::kHello) {
    const Io io = transfer(fd, &in.hello, sizeof in.hello, &in.done, false);
    if (io != Io::kDone) return io == Io::kWait ? false : reject();
    in.spoke = true;
    const Hello& h = in.hello;
    if (h.magic != kHelloMagic || h.world != world_ || h.to != rank_ || h.rank < 0 || h.rank >= world_ ||
        h.rank == rank_ || addresses_[h.rank].empty() || peers_[h.rank].lost)
      return reject();
    in.challenge.magic = kChallengeMagic;
    random_bytes(in.challenge.nonce, kNonceBytes);
    const Digest proof = handshake_proof(key_, 'L', h, in.challenge.nonce);
    std::memcpy(in.challenge.proof, proof.data(), proof.size());
    in.stage = Incoming::kChallenge;
  }
  if (in.stage == Incoming::kChallenge) {
    const Io io = transfer(fd, &in.challenge, sizeof in.challenge, &in.done, true);
    if (io != Io::kDone) return io == Io::kWait ? false : reject();
    in.stage = Incoming::kProof;
  }
  const Io io = transfer(fd, &in.proof, sizeof in.proof, &in.done, false);
  if (io != Io::kDone) return io == Io::kWait ? false : reject();
  if (!proof_matches(in.proof.proof, handshake_proof(key_, 'D', in.hello, in.challenge.nonce))) return reject();
  // The dialler is proven: the verdict. Two dials between one pair at once leave the lower rank's.
  const int peer = in.hello.rank;
  Peer& p = peers_[peer];
  const bool ours_wins = (p.link == Link::kDialing && rank_ < peer) || p.link == Link::kUp;
  Verdict verdict{ours_wins ? kVerdictDouble : kVerdictLink};
  if (ours_wins) {
    size_t done = 0;  // 8 bytes on a fresh connection: the socket's buffer takes them at once
    transfer(fd, &verdict, sizeof verdict, &done, true);
    return true;
  }
  // This connection is the link; the verdict is the first thing on it, before what was queued.
  link_up(peer, std::move(in.fd));
  Outgoing first{-1, std::vector<uint8_t>(sizeof verdict)};
  std::memcpy(first.bytes.data(), &verdict, sizeof verdict);
  p.out.push_front(std::move(first));
  return true;
}

void TcpTransport::expire_dials(Clock::time_point now) {
  for (int r = 0; r < world_; ++r) {
    Peer& p = peers_[r];
    if (!p.lost && p.link == Link::kAwaiting && now >= p.awaiting_until) {
      mark_lost(p, "rank " + std::to_string(r) + " answered that its own connection to rank " + std::to_string(rank_) +
                       " was the link, and that connection did not come within " +
                       std::to_string(std::chrono::duration<double>(dial_timeout_).count()) + " s");
      continue;
    }
    if (p.lost || p.link != Link::kDialing) continue;
    Dial& d = *p.dial;
    if (d.stage != Dial::kPaused && now >= d.give_up) {
      d.fd.reset();
      d.last = "no answer to the handshake";
      d.stage = Dial::kPaused;
      d.retry_at = now;
    }
    if (d.stage == Dial::kPaused && now >= d.deadline) {
      const std::string why =
          d.impostor ? "whoever listens there did not prove it holds this job's key; last attempt: " : "";
      mark_lost(p, "rank " + std::to_string(rank_) + " could not connect to rank " + std::to_string(r) + " at " +
                       addresses_[r] + " (" + why + d.last + ") within " +
                       std::to_string(std::chrono::duration<double>(dial_timeout_).count()) + " s");
      p.dial.reset();
    }
  }
  incoming_.erase(std::remove_if(incoming_.begin(), incoming_.end(),
                                 [&](const std::unique_ptr<Incoming>& in) {
                                   if (now < in->give_up) return false;
                                   ++rejected_;
                                   return true;
                                 }),
                  incoming_.end());
}

void TcpTransport::set_peers(const std::vector<std::string>& addresses, const std::string& key, double dial_timeout_s) {
  if (static_cast<int>(addresses.size()) != world_) throw Error(ErrorKind::kInternal, "need one address per rank");
  if (key.size() < 16) throw Error(ErrorKind::kInternal, "the TCP handshake key must have at least 16 bytes");
  for (int r = 0; r < world_; ++r) {
    sockaddr_in addr{};
    if (r != rank_ && !addresses[r].empty() && !parse_address(addresses[r], &addr))
      throw Error(ErrorKind::kInvalidUsage,
                  "rank " + std::to_string(r) + " published a bad address '" + addresses[r] + "'");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    addresses_ = addresses;
    key_ = key;
    dial_timeout_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(dial_timeout_s));
  }
  wake_io();
}

void TcpTransport::announce_to_all(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  announce_all_ = on;
}

void TcpTransport::link_now(int peer, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (peer < 0 || peer >= world_ || peer == rank_) throw Error(ErrorKind::kInvalidUsage, "no such peer");
  want(peer);
  const Peer& p = peers_[peer];
  const bool done = cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                 [&] { return p.link == Link::kUp || p.lost || aborted_; });
  throw_if_aborted();
  if (p.lost) throw Error(ErrorKind::kPeerLost, p.lost_why, peer);
  if (!done) throw Error(ErrorKind::kTimeout, "no link to rank " + std::to_string(peer) + " in time");
}

std::vector<int> TcpTransport::linked_peers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (peers_[r].link == Link::kUp && !peers_[r].lost) out.push_back(r);
  return out;
}

}  // namespace pycoll
