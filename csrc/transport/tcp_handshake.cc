// The proofs both sides of a TCP connection's handshake send (tcp.h describes the handshake;
// tcp_internal.h has the messages), and the tuning of a connection that carries fragments.
#include <netinet/tcp.h>
#include <sys/socket.h>

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

void tune(int fd) {
  set_nodelay(fd);
  int buf = 4 << 20;  // a few fragments in flight on a fast link; the kernel caps it
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

}  // namespace tcp_detail

}  // namespace pycoll
