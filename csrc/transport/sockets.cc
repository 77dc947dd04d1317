#include "transport/sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "pycoll/errors.h"

namespace pycoll::net {

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  PYCOLL_CHECK_SYS(flags);
  PYCOLL_CHECK_SYS(::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1000)));
}

bool parse_address(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return false;
  for (size_t i = colon + 1; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (port < 0 || port > 65535) return false;
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  return ::inet_pton(AF_INET, text.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

UniqueFd listen_on(const std::string& host, int backlog, int* port) {
  sockaddr_in addr{};
  if (!parse_address(host + ":0", &addr))
    throw Error(ErrorKind::kInvalidUsage, "cannot listen on '" + host + "': not an IPv4 address");
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  PYCOLL_CHECK_SYS(fd.get());
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    throw Error(ErrorKind::kInvalidUsage, "cannot listen on " + host + ": " + std::strerror(errno));
  PYCOLL_CHECK_SYS(::listen(fd.get(), backlog));
  socklen_t len = sizeof addr;
  PYCOLL_CHECK_SYS(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len));
  *port = ntohs(addr.sin_port);
  return fd;
}

UniqueFd start_connect(const std::string& address, std::string* error) {
  sockaddr_in addr{};
  if (!parse_address(address, &addr)) {
    *error = "'" + address + "' is not an IPv4 address and port";
    return UniqueFd();
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {  // out of descriptors, say: the caller's peer is not reached (no throw on an I/O thread)
    *error = errno_text("socket");
    return UniqueFd();
  }
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 && errno != EINPROGRESS) {
    *error = errno_text("connect");
    return UniqueFd();
  }
  set_nodelay(fd.get());
  return fd;
}

bool accept_starved(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

std::string connect_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
  if (err == 0) return "";
  return std::string("connect: ") + std::strerror(err);
}

}  // namespace pycoll::net
