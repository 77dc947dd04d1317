// What the files of the TCP transport share and nobody else needs: the wire format of frames and of the
// connection handshake, and small socket helpers.
//   tcp.cc            the Transport methods: set-up and teardown, data plane, waiting, announcements
//   tcp_listener.cc   the listening socket, and accepting the ranks above this one (the listener's side
//                     of the handshake)
//   tcp_handshake.cc  dialing the ranks below this one (the dialer's side), the proofs both sides send
//   tcp_io.cc         the I/O thread: frames between the rings and the sockets
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/hmac.h"
#include "transport/tcp.h"

namespace pycoll {

// Every frame starts with this header; DATA frames carry `bytes` (= frag.bytes) of payload after it,
// control frames `bytes` of their own payload.
struct TcpTransport::Frame {
  uint32_t type;
  uint32_t bytes;
  FragHeader frag;
};

namespace tcp_detail {

enum FrameType : uint32_t { kData = 1, kEnter = 2, kAbort = 3, kBye = 4 };
constexpr size_t kMaxControlBytes = 64 * 1024;
// An ENTER frame's payload: the collective's number, the descriptor and the entry stamp.
constexpr size_t kEnterBytes = sizeof(uint64_t) + sizeof(Descriptor) + sizeof(EntryStamp);

struct AbortHead {
  int32_t kind;
  int32_t peer;
};

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
Digest handshake_proof(const std::string& key, char role, const Hello& hello, const uint8_t* listener_nonce);
bool proof_matches(const uint8_t* got, const Digest& want);

using Clock = std::chrono::steady_clock;

// "what: <errno text>".
std::string errno_text(const char* what);
void set_nonblocking(int fd);
// TCP_NODELAY and large socket buffers, for a connection that carries fragments.
void tune(int fd);
// Milliseconds until `deadline`, for poll(): at least 0, at most 1000.
int ms_left(Clock::time_point deadline);
// "a.b.c.d:port" as an IPv4 address; false if it is not one.
bool parse_address(const std::string& text, sockaddr_in* out);

}  // namespace tcp_detail
}  // namespace pycoll
