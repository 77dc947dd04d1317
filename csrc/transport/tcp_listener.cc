// The listening socket, and accepting the ranks above this one: the listener's side of the connection
// handshake (tcp.h describes it; tcp_internal.h has the messages).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transport/tcp_internal.h"

namespace pycoll {

using namespace tcp_detail;

void TcpTransport::listen(const std::string& bind_host) {
  listen_fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  PYCOLL_CHECK_SYS(listen_fd_.get());
  int one = 1;
  ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  if (!parse_address(bind_host + ":0", &addr))
    throw Error(ErrorKind::kInvalidUsage, "cannot listen on '" + bind_host + "': not an IPv4 address");
  PYCOLL_CHECK_SYS(::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr));
  PYCOLL_CHECK_SYS(::listen(listen_fd_.get(), std::max(16, world_)));
  socklen_t len = sizeof addr;
  PYCOLL_CHECK_SYS(::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len));
  listen_port_ = ntohs(addr.sin_port);
  set_nonblocking(listen_fd_.get());
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

}  // namespace pycoll
