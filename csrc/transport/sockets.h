// Small socket helpers shared by the TCP transport (tcp*.cc) and the fault plane's links
// (csrc/fault/): non-blocking IPv4 sockets, addresses as "a.b.c.d:port", and errno in messages.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <string>

#include "transport/fd.h"

namespace pycoll::net {

using Clock = std::chrono::steady_clock;

// "what: <errno text>".
std::string errno_text(const char* what);
void set_nonblocking(int fd);
void set_nodelay(int fd);
// Milliseconds until `deadline`, for poll(): at least 0, at most 1000.
int ms_left(Clock::time_point deadline);
// "a.b.c.d:port" as an IPv4 address; false if it is not one.
bool parse_address(const std::string& text, sockaddr_in* out);
// A non-blocking socket listening on `host` (IPv4, "0.0.0.0" for every interface) at a port the kernel
// picks (*port). Throws pycoll::Error (kInvalidUsage for a bad address, kSystem else).
UniqueFd listen_on(const std::string& host, int backlog, int* port);
// A non-blocking socket connecting to `address` ("a.b.c.d:port"): the connection completes (or fails,
// SO_ERROR) when it polls writable. An invalid fd with *error set when it failed at once.
UniqueFd start_connect(const std::string& address, std::string* error);
// After accept failed: whether for want of descriptors or memory (the listening socket stays readable, so
// its caller stops polling it for kAcceptBackoff rather than spin).
bool accept_starved(int err);
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// The error of a non-blocking connect that polled writable ("" when it connected).
std::string connect_error(int fd);

}  // namespace pycoll::net
