// The fault plane's wire, native side (pycoll/fault/wire.py is the Python side of the same frames).
//
// A frame is a 4-byte big-endian length and that many bytes of body. Bodies the Python layer reads are
// JSON objects; two kinds of frame never reach it:
//   heartbeat  an empty frame (length 0): "this process runs", sent and read by the links' I/O thread
//              (links.h), never by Python, so that a rank whose Python is busy still sends them.
//   hello      the first frame a plane member sends on a link it dialled, binary, starting with 'H':
//              version, its rank, the rank it means to reach, the plane's id and token, and with a job
//              secret an HMAC over the listener's challenge and those fields. JSON bodies start with '{',
//              so a listener tells a hello from a joining process's JSON request by the first byte.
// A listener's first frame on every connection is its challenge, JSON: {"t":"challenge","c":"<hex>"}
// (a joining process reads it with pycoll/fault/wire.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pycoll::fault {

// The largest frame body accepted (as pycoll/fault/wire.py MAX_FRAME): a control message is a few hundred
// bytes, a key-value store value at most a few KiB.
constexpr uint32_t kMaxFrame = 4u << 20;
constexpr size_t kChallengeHexChars = 32;
constexpr uint8_t kHelloVersion = 1;

// `body` with its length in front.
std::string frame(const std::string& body);
// The length of the frame starting at `p` (4 bytes there).
uint32_t frame_length(const uint8_t* p);

std::string challenge_body(const std::string& challenge_hex);
// The challenge's hex from a listener's first frame body; empty if it is not one.
std::string parse_challenge(const std::string& body);

struct Hello {
  int rank = -1;                    // the dialler's
  int to = -1;                      // the rank it means to reach
  std::string plane, token, proof;  // proof: 32 bytes, or 32 zero bytes without a secret
};
std::string hello_body(const Hello& h);
// false if `body` is not a well-formed hello.
bool parse_hello(const std::string& body, Hello* out);
// HMAC-SHA256 of the job's secret over the challenge and the hello's fields (32 zero bytes without one).
std::string hello_proof(const std::string& secret, const std::string& challenge_hex, const Hello& h);
bool proof_ok(const std::string& secret, const std::string& challenge_hex, const Hello& h);

// Random bytes as lowercase hex (2 characters a byte).
std::string random_hex(size_t bytes);

}  // namespace pycoll::fault
