// What the files of the TCP transport share and nobody else needs: the wire format of frames and of the
// connection handshake.
//   tcp.cc            the Transport methods: set-up and teardown, data plane, waiting, announcements
//   tcp_links.cc      the links: wanting, dialling and accepting peers, both sides of the handshake
//   tcp_handshake.cc  the proofs both sides send, and socket tuning
//   tcp_io.cc         the I/O thread: frames between the rings and the sockets, and the links' sockets
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/hmac.h"
#include "transport/sockets.h"
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

// The connection handshake (see tcp.h): four messages, then the connection carries frames.
constexpr uint64_t kHelloMagic = 0x33706374637970ull;  // "pyctcp3" (version 3: links made at first use)
constexpr uint64_t kChallengeMagic = 0x33686374637970ull;
constexpr uint64_t kVerdictLink = 0x6b6e696c746376ull;    // "vctlink": this connection is the link
constexpr uint64_t kVerdictDouble = 0x6c627564746376ull;  // "vctdubl": both dialled; the lower rank's wins
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
struct Verdict {  // listener -> dialer, once the dialer is proven
  uint64_t verdict;
};

// HMAC of the key over who proves ('D'ialer or 'L'istener), the dialer's Hello (ranks, world, its nonce)
// and the listener's nonce: fresh nonces on both sides make every proof good for one connection only,
// and the role byte keeps a listener's proof from serving as a dialer's.
Digest handshake_proof(const std::string& key, char role, const Hello& hello, const uint8_t* listener_nonce);
bool proof_matches(const uint8_t* got, const Digest& want);

using namespace ::pycoll::net;  // Clock, errno_text, ms_left ... (transport/sockets.h)

// TCP_NODELAY and large socket buffers, for a connection that carries fragments.
void tune(int fd);

}  // namespace tcp_detail

// One attempt at dialling a peer, and what the attempts so far learned.
struct TcpTransport::Dial {
  enum Stage { kConnecting, kHello, kChallenge, kProof, kVerdict, kPaused };
  UniqueFd fd;
  Stage stage = kPaused;
  size_t done = 0;
  tcp_detail::Hello hello{};
  tcp_detail::Challenge challenge{};
  tcp_detail::Proof proof{};
  tcp_detail::Verdict verdict{};
  std::chrono::steady_clock::time_point give_up{};   // this attempt's handshake must be over by then
  std::chrono::steady_clock::time_point deadline{};  // the peer counts as lost if no attempt made the link by then
  std::chrono::steady_clock::time_point retry_at{};  // kPaused: the next attempt starts then
  std::string last;                                  // why the last attempt failed
  bool impostor = false;                             // a listener answered at the address without the key
};

// A connection accepted on the listening socket, until its dialler is proven (or not).
struct TcpTransport::Incoming {
  enum Stage { kHello, kChallenge, kProof };
  UniqueFd fd;
  Stage stage = kHello;
  size_t done = 0;
  bool spoke = false;  // a whole Hello came
  tcp_detail::Hello hello{};
  tcp_detail::Challenge challenge{};
  tcp_detail::Proof proof{};
  std::chrono::steady_clock::time_point give_up{};
};

}  // namespace pycoll
