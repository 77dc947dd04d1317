#include "transport/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "transport/hmac.h"

namespace pycoll {

// Every frame starts with this header; DATA frames carry `bytes` (= frag.bytes) of payload after it,
// control frames `bytes` of their own payload.
struct TcpTransport::Frame {
  uint32_t type;
  uint32_t bytes;
  FragHeader frag;
};

namespace {

enum FrameType : uint32_t { kData = 1, kEnter = 2, kAbort = 3, kBye = 4 };
constexpr size_t kMaxControlBytes = 64 * 1024;

// The connection handshake (see tcp.h): three messages, then the connection carries frames.
constexpr uint64_t kHelloMagic = 0x32706374637970ull;  // "pyctcp2" (version 2: challenge-response)
constexpr uint64_t kChallengeMagic = 0x32686374637970ull;
constexpr size_t kNonceBytes = 16;
// A connection that has not finished its handshake after this long is dropped.
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
// Handshakes the listener runs at once; more waiting connections stay in the kernel's backlog.
constexpr size_t kMaxPending = 64;

struct Hello {  // dialer -> listener
  uint64_t magic;
  int32_t rank;  // the dialer's
  int32_t world;
  int32_t to;  // the rank the dialer means to reach
  int32_t reserved;
  uint8_t nonce[kNonceBytes];
};
struct Challenge {  // listener -> dialer: its nonce, and its proof that it holds the key
  uint64_t magic;
  uint8_t nonce[kNonceBytes];
  uint8_t proof[32];
};
struct Proof {  // dialer -> listener
  uint8_t proof[32];
};

// HMAC of the key over who proves ('D'ialer or 'L'istener), the dialer's Hello (ranks, world, its nonce)
// and the listener's nonce: fresh nonces on both sides make every proof good for one connection only,
// and the role byte keeps a listener's proof from serving as a dialer's.
Digest handshake_proof(const std::string& key, char role, const Hello& hello, const uint8_t* listener_nonce) {
  uint8_t msg[1 + sizeof(Hello) + kNonceBytes];
  msg[0] = static_cast<uint8_t>(role);
  std::memcpy(msg + 1, &hello, sizeof hello);
  std::memcpy(msg + 1 + sizeof hello, listener_nonce, kNonceBytes);
  return hmac_sha256(key.data(), key.size(), msg, sizeof msg);
}

bool proof_matches(const uint8_t* got, const Digest& want) {
  Digest d;
  std::memcpy(d.data(), got, d.size());
  return digests_equal(d, want);
}

struct AbortHead {
  int32_t kind;
  int32_t peer;
};

using Clock = std::chrono::steady_clock;

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  PYCOLL_CHECK_SYS(flags);
  PYCOLL_CHECK_SYS(::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
}

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;  // a few fragments in flight on a fast link; the kernel caps it
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1000)));
}

// Sends or receives exactly n bytes on a blocking-style loop over a non-blocking socket, by the deadline.
bool exchange(int fd, void* buf, size_t n, bool send, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t k = send ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (Clock::now() >= deadline) return false;
    struct pollfd pfd = {fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
  return true;
}

bool parse_address(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(std::stoi(text.substr(colon + 1))));
  return ::inet_pton(AF_INET, text.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

}  // namespace

TcpTransport::TcpTransport(int rank, int world, const TcpConfig& config, const std::string& bind_host)
    : rank_(rank), world_(world), config_(config), peers_(static_cast<size_t>(world)) {
  if (world < 1 || rank < 0 || rank >= world) throw Error(ErrorKind::kInvalidUsage, "bad rank or world size");
  if (config.slots < 2 || config.fragment_bytes < 4096)
    throw Error(ErrorKind::kInvalidUsage, "TCP transport needs >= 2 slots of >= 4096 bytes");
  listen_fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  PYCOLL_CHECK_SYS(listen_fd_.get());
  int one = 1;
  ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  if (!parse_address(bind_host + ":0", &addr))
    throw Error(ErrorKind::kInvalidUsage, "cannot listen on '" + bind_host + "': not an IPv4 address");
  PYCOLL_CHECK_SYS(::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr));
  PYCOLL_CHECK_SYS(::listen(listen_fd_.get(), std::max(16, world)));
  socklen_t len = sizeof addr;
  PYCOLL_CHECK_SYS(::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len));
  listen_port_ = ntohs(addr.sin_port);
  set_nonblocking(listen_fd_.get());
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOLL_CHECK_SYS(wake_fd_.get());
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    Peer& p = peers_[r];
    p.send_ring.resize(slot_stride() * config.slots);
    p.recv_ring.resize(slot_stride() * config.slots);
    p.in_header.resize(sizeof(Frame));
  }
}

TcpTransport::~TcpTransport() {
  {
    // A collective returns once its last fragments are committed, not written: let the I/O thread put
    // them on the wire (bounded, for peers that stopped reading), or a peer still finishing that
    // collective would see the connection close before its data.
    std::unique_lock<std::mutex> lock(mu_);
    // BYE tells the peers this is an orderly end, not a failure (they may still be finishing with others).
    for (int r = 0; r < world_; ++r)
      if (r != rank_) queue_control(r, kBye, nullptr, 0);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    auto flushed = [this] {
      for (const Peer& p : peers_)
        if (!p.lost && p.fd && !p.out.empty()) return false;
      return true;
    };
    while (io_.joinable() && !flushed() && Clock::now() < deadline) {
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
    if (p.fd) {
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

void TcpTransport::connect(const std::vector<std::string>& addresses, const std::string& key, double timeout_s) {
  if (static_cast<int>(addresses.size()) != world_) throw Error(ErrorKind::kInternal, "need one address per rank");
  if (key.size() < 16) throw Error(ErrorKind::kInternal, "the TCP handshake key must have at least 16 bytes");
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, timeout_s) * 1000));
  // Dial the ranks below this one, in order (each of them accepts the ranks above it). An empty address
  // is a rank this transport does not serve (one of this host's, under CompositeTransport).
  for (int r = 0; r < rank_; ++r) {
    if (addresses[r].empty()) continue;
    sockaddr_in addr{};
    if (!parse_address(addresses[r], &addr))
      throw Error(ErrorKind::kInvalidUsage,
                  "rank " + std::to_string(r) + " published a bad address '" + addresses[r] + "'");
    std::string last = "no answer";
    bool impostor = false;  // a listener answered there without the key: the likelier cause, said first
    while (!peers_[r].fd) {
      UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      PYCOLL_CHECK_SYS(fd.get());
      set_nonblocking(fd.get());
      int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      bool ok = rc == 0 || errno == EINPROGRESS;
      if (rc != 0 && ok) {
        struct pollfd pfd = {fd.get(), POLLOUT, 0};
        ok = ::poll(&pfd, 1, ms_left(deadline)) == 1;
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
          errno = err;
          ok = false;
        }
      }
      Hello hello{kHelloMagic, rank_, world_, r, 0, {}};
      random_bytes(hello.nonce, kNonceBytes);
      Challenge challenge{};
      if (!ok) {
        last = errno_text("connect");
      } else if (!exchange(fd.get(), &hello, sizeof hello, true, deadline) ||
                 !exchange(fd.get(), &challenge, sizeof challenge, false, deadline) ||
                 challenge.magic != kChallengeMagic) {
        last = "the handshake failed";
      } else if (!proof_matches(challenge.proof, handshake_proof(key, 'L', hello, challenge.nonce))) {
        impostor = true;
        last = "a wrong proof";
      } else {
        const Digest proof = handshake_proof(key, 'D', hello, challenge.nonce);
        Proof mine{};
        std::memcpy(mine.proof, proof.data(), proof.size());
        if (exchange(fd.get(), &mine, sizeof mine, true, deadline)) {
          tune(fd.get());
          peers_[r].fd = std::move(fd);
          break;
        }
        last = "the handshake failed";
      }
      fd.reset();
      if (Clock::now() >= deadline) {
        const std::string why =
            impostor ? "whoever listens there did not prove it holds this job's key; last attempt: " + last : last;
        throw Error(ErrorKind::kTimeout, "rank " + std::to_string(rank_) + " could not connect to rank " +
                                             std::to_string(r) + " at " + addresses[r] + " (" + why + ") within " +
                                             std::to_string(timeout_s) + " s");
      }
      ::usleep(20000);
    }
  }
  accept_ranks_above(addresses, key, deadline, timeout_s);
  // Nobody else may connect from now on: anything that tries is refused by the kernel.
  listen_fd_.reset();
  io_ = std::thread([this] { io_loop(); });
}

// Accepts the ranks above this one. Handshakes run side by side, each a small state machine on a
// non-blocking socket, so that a connection that stalls (or several) cannot hold back the job's ranks;
// one that fails its handshake or takes longer than kHandshakeTimeout is closed and counted.
void TcpTransport::accept_ranks_above(const std::vector<std::string>& addresses, const std::string& key,
                                      Clock::time_point deadline, double timeout_s) {
  struct Pending {
    UniqueFd fd;
    Clock::time_point give_up;
    int stage = 0;    // 0: reading the Hello, 1: writing the Challenge, 2: reading the Proof
    size_t done = 0;  // bytes of the current stage's message
    Hello hello{};
    Challenge challenge{};
    Proof proof{};
  };
  std::vector<Pending> pending;
  auto drop = [&](size_t i) {
    pending[i] = std::move(pending.back());  // closes pending[i]'s socket
    pending.pop_back();
    ++rejected_;  // not one of this job's ranks: close it and go on
  };
  // Moves a handshake on as far as its socket allows.
  enum Outcome { kWaiting, kFailed, kAccepted };
  auto advance = [&](Pending& p) -> Outcome {
    for (;;) {
      void* buf = p.stage == 0   ? static_cast<void*>(&p.hello)
                  : p.stage == 1 ? static_cast<void*>(&p.challenge)
                                 : static_cast<void*>(&p.proof);
      const size_t n = p.stage == 0 ? sizeof p.hello : p.stage == 1 ? sizeof p.challenge : sizeof p.proof;
      const bool send = p.stage == 1;
      while (p.done < n) {
        const ssize_t k = send ? ::send(p.fd.get(), static_cast<uint8_t*>(buf) + p.done, n - p.done, MSG_NOSIGNAL)
                               : ::recv(p.fd.get(), static_cast<uint8_t*>(buf) + p.done, n - p.done, 0);
        if (k > 0) {
          p.done += static_cast<size_t>(k);
          continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return kWaiting;
        return kFailed;  // closed or failed
      }
      p.done = 0;
      const Hello& h = p.hello;
      if (p.stage == 0) {
        if (h.magic != kHelloMagic || h.world != world_ || h.to != rank_ || h.rank <= rank_ || h.rank >= world_ ||
            addresses[h.rank].empty() || peers_[h.rank].fd)
          return kFailed;
        p.challenge.magic = kChallengeMagic;
        random_bytes(p.challenge.nonce, kNonceBytes);
        const Digest proof = handshake_proof(key, 'L', h, p.challenge.nonce);
        std::memcpy(p.challenge.proof, proof.data(), proof.size());
        p.stage = 1;
      } else if (p.stage == 1) {
        p.stage = 2;
      } else {
        const bool good = proof_matches(p.proof.proof, handshake_proof(key, 'D', h, p.challenge.nonce));
        return good && !peers_[h.rank].fd ? kAccepted : kFailed;
      }
    }
  };
  int missing = 0;
  for (int r = rank_ + 1; r < world_; ++r) missing += !addresses[r].empty();
  std::vector<struct pollfd> fds;
  while (missing > 0) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      while (!pending.empty()) drop(pending.size() - 1);
      std::string who;
      for (int r = rank_ + 1; r < world_; ++r)
        if (!peers_[r].fd && !addresses[r].empty()) who += (who.empty() ? "" : ", ") + std::to_string(r);
      throw Error(ErrorKind::kTimeout, "rank " + std::to_string(rank_) + ": rank(s) " + who +
                                           " did not connect within " + std::to_string(timeout_s) + " s");
    }
    Clock::time_point wake = deadline;
    fds.clear();
    fds.push_back({listen_fd_.get(), static_cast<short>(pending.size() < kMaxPending ? POLLIN : 0), 0});
    for (const Pending& p : pending) {
      fds.push_back({p.fd.get(), static_cast<short>(p.stage == 1 ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, p.give_up);
    }
    ::poll(fds.data(), fds.size(), ms_left(wake));
    while (pending.size() < kMaxPending) {
      UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd) break;
      Pending p;
      p.fd = std::move(fd);
      p.give_up = Clock::now() + kHandshakeTimeout;
      pending.push_back(std::move(p));
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      const Outcome outcome = advance(p);
      if (outcome == kAccepted) {
        tune(p.fd.get());
        peers_[p.hello.rank].fd = std::move(p.fd);
        --missing;
        pending[i] = std::move(pending.back());
        pending.pop_back();
      } else if (outcome == kFailed || Clock::now() >= p.give_up) {
        drop(i);
      } else {
        ++i;
      }
    }
  }
  while (!pending.empty()) drop(pending.size() - 1);
}

// ---- data plane ---------------------------------------------------------------------------------------

void* TcpTransport::acquire_send(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
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

void TcpTransport::wait(const WaitItem* items, size_t n, int64_t timeout_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] {
    if (aborted_ || stop_) return true;
    for (size_t i = 0; i < n; ++i) {
      const Peer& p = peers_[items[i].peer];
      if (p.lost) return true;
      if (items[i].room ? p.committed - p.sent < config_.slots : p.arrived > p.released) return true;
    }
    return false;
  };
  cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(0, timeout_ns)), ready);
}

// ---- I/O thread -----------------------------------------------------------------------------------------

void TcpTransport::wake_io() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_fd_.get(), &one, sizeof one);
  (void)rc;  // EAGAIN: a wake-up is already pending
}

void TcpTransport::mark_lost(Peer& p, const std::string& why) {
  if (p.lost) return;
  p.lost = true;
  p.lost_why = why;
  p.out.clear();
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
  if (type == kEnter && p.in_control.size() == sizeof(uint64_t) + sizeof(Descriptor)) {
    uint64_t seq;
    std::memcpy(&seq, p.in_control.data(), sizeof seq);
    std::memcpy(&p.descs[seq % kDescRing], p.in_control.data() + sizeof seq, sizeof(Descriptor));
    p.desc_seq[seq % kDescRing] = seq;
    p.entered = std::max(p.entered, seq);
  } else if (type == kBye) {
    p.finalized = true;
  } else if (type == kAbort && p.in_control.size() >= sizeof(AbortHead)) {
    AbortHead head;
    std::memcpy(&head, p.in_control.data(), sizeof head);
    std::string msg(reinterpret_cast<const char*>(p.in_control.data()) + sizeof head,
                    p.in_control.size() - sizeof head);
    if (!aborted_) {
      aborted_ = true;
      abort_error_ = std::make_unique<Error>(static_cast<ErrorKind>(head.kind), msg, head.peer);
    }
  } else {
    mark_lost(p, "rank " + std::to_string(r) + " sent a malformed control frame");
  }
}

void TcpTransport::io_loop() {
  std::vector<struct pollfd> fds;
  std::vector<int> owner;
  for (;;) {
    fds.clear();
    owner.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    owner.push_back(-1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (int r = 0; r < world_; ++r) {
        Peer& p = peers_[r];
        if (r == rank_ || p.lost || !p.fd) continue;
        short events = 0;
        const bool header_pending = p.in_offset < sizeof(Frame);
        if (aborted_ || header_pending || p.arrived - p.released < config_.slots) events |= POLLIN;
        if (!p.out.empty()) events |= POLLOUT;
        fds.push_back({p.fd.get(), events, 0});
        owner.push_back(r);
      }
    }
    int rc = ::poll(fds.data(), fds.size(), 100);
    if (rc < 0 && errno != EINTR) return;  // cannot happen with valid descriptors; waiters time out
    if (fds[0].revents & POLLIN) {
      uint64_t drained;
      ssize_t k = ::read(wake_fd_.get(), &drained, sizeof drained);
      (void)k;
    }
    bool progressed = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (size_t i = 1; i < fds.size(); ++i) {
        Peer& p = peers_[owner[i]];
        // A frame whose bytes all arrived while the receive ring was full (an empty fragment: just its
        // header) completes once there is room, with nothing more to read: no POLLIN will say so.
        const bool pending = p.in_offset >= sizeof(Frame);
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || pending) progressed |= pump_in(owner[i], p, lock);
        if (fds[i].revents & (POLLOUT | POLLHUP | POLLERR)) progressed |= pump_out(p, lock);
        // Frames committed while poll() slept go out now rather than after another round trip.
        if (!p.out.empty() && !(fds[i].revents & POLLOUT)) progressed |= pump_out(p, lock);
      }
    }
    if (progressed) cv_.notify_all();
  }
}

// ---- control plane ----------------------------------------------------------------------------------------

void TcpTransport::queue_control(int peer, uint32_t type, const void* payload, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.lost || !p.fd) return;
  Frame f{type, static_cast<uint32_t>(bytes), FragHeader{}};
  Outgoing o{-1, std::vector<uint8_t>(sizeof f + bytes)};
  std::memcpy(o.bytes.data(), &f, sizeof f);
  if (bytes) std::memcpy(o.bytes.data() + sizeof f, payload, bytes);
  p.out.push_back(std::move(o));
}

void TcpTransport::throw_if_aborted() {
  if (aborted_ && abort_error_) throw *abort_error_;
}

void TcpTransport::begin_collective(uint64_t seq, const Descriptor& desc) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_aborted();
    entered_ = seq;
    uint8_t payload[sizeof(uint64_t) + sizeof(Descriptor)];
    std::memcpy(payload, &seq, sizeof seq);
    std::memcpy(payload + sizeof seq, &desc, sizeof desc);
    for (int r = 0; r < world_; ++r)
      if (r != rank_) queue_control(r, kEnter, payload, sizeof payload);
  }
  wake_io();
}

bool TcpTransport::published_descriptor(int peer, uint64_t seq, Descriptor* out) {
  const Peer& p = peers_[peer];
  if (p.desc_seq[seq % kDescRing] != seq) return false;
  *out = p.descs[seq % kDescRing];
  return true;
}

void TcpTransport::check_health(const WaitContext& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers_[r];
    // A peer that said BYE finished the collectives it needed this rank for; it is an error only to
    // wait for it, and only once what it sent before its BYE has been consumed (the executor may not
    // have looked at the ring since the I/O thread filled it and saw the connection close).
    if (p.lost && p.finalized && ctx.waiting_on_peer == r && p.arrived == p.released)
      throw Error(ErrorKind::kPeerLost,
                  "rank " + std::to_string(r) + " finalized its communicator while rank " + std::to_string(rank_) +
                      " waited for it in " + describe(*ctx.desc) + ": the ranks did not call the same collectives",
                  r);
    if (p.lost && !p.finalized)
      throw Error(ErrorKind::kPeerLost,
                  "rank " + std::to_string(r) + " was lost while rank " + std::to_string(rank_) + " depended on it (" +
                      p.lost_why +
                      "): its process died or the network failed; the communicator cannot be used any more",
                  r);
    Descriptor theirs;
    if (published_descriptor(r, ctx.seq, &theirs) && theirs.hash() != ctx.desc->hash())
      throw descriptor_mismatch(rank_, r, ctx.seq, *ctx.desc, theirs);
  }
}

void TcpTransport::abort(const Error& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;  // the first abort wins
    aborted_ = true;
    std::string msg = error.what();
    if (msg.rfind("(reported by rank", 0) != 0) msg = "(reported by rank " + std::to_string(rank_) + ") " + msg;
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
  cv_.notify_all();
}

std::vector<int> TcpTransport::ranks_not_entered(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if ((r == rank_ || peers_[r].fd) && (r == rank_ ? entered_ : peers_[r].entered) < seq) out.push_back(r);
  return out;
}

void TcpTransport::raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                         uint64_t expected_msg_bytes) {
  Descriptor at_got, at_seq;
  bool has_got, has_seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    has_got = published_descriptor(peer, got.seq, &at_got);
    has_seq = published_descriptor(peer, seq, &at_seq);
  }
  throw_header_mismatch(rank_, peer, got, seq, desc, expected_msg_bytes, has_got ? &at_got : nullptr,
                        has_seq ? &at_seq : nullptr);
}

}  // namespace pycoll
