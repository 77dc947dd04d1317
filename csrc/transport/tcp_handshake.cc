// Dialing the ranks below this one and the dialer's side of the connection handshake (tcp.h describes
// it; tcp_internal.h has the messages), the proofs both sides compute, and the socket helpers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transport/tcp_internal.h"

namespace pycoll {

namespace tcp_detail {

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

bool parse_address(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(std::stoi(text.substr(colon + 1))));
  return ::inet_pton(AF_INET, text.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

}  // namespace tcp_detail

namespace {

using namespace tcp_detail;

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

}  // namespace

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

}  // namespace pycoll
