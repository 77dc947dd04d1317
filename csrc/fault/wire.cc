#include "fault/wire.h"

#include <cstring>

#include "transport/hmac.h"

namespace pycoll::fault {

namespace {

constexpr char kHelloTag = 'H';
constexpr size_t kHelloFixed = 1 + 1 + 4 + 4 + 2 + 2;  // tag, version, rank, to, plane length, token length
constexpr size_t kProofBytes = 32;

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
uint32_t get32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t get16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

}  // namespace

std::string frame(const std::string& body) {
  const auto n = static_cast<uint32_t>(body.size());
  std::string out;
  out.reserve(4 + body.size());
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
  out += body;
  return out;
}

uint32_t frame_length(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string challenge_body(const std::string& challenge_hex) {
  return "{\"t\":\"challenge\",\"c\":\"" + challenge_hex + "\"}";
}

std::string parse_challenge(const std::string& body) {
  static const std::string head = "{\"t\":\"challenge\",\"c\":\"";
  if (body.size() != head.size() + kChallengeHexChars + 2 || body.compare(0, head.size(), head) != 0 ||
      body.compare(body.size() - 2, 2, "\"}") != 0)
    return "";
  std::string hex = body.substr(head.size(), kChallengeHexChars);
  for (char c : hex)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return "";
  return hex;
}

std::string hello_body(const Hello& h) {
  std::string s;
  s.push_back(kHelloTag);
  s.push_back(static_cast<char>(kHelloVersion));
  put32(s, static_cast<uint32_t>(h.rank));
  put32(s, static_cast<uint32_t>(h.to));
  put16(s, static_cast<uint16_t>(h.plane.size()));
  put16(s, static_cast<uint16_t>(h.token.size()));
  s += h.plane;
  s += h.token;
  s += h.proof.size() == kProofBytes ? h.proof : std::string(kProofBytes, '\0');
  return s;
}

bool parse_hello(const std::string& body, Hello* out) {
  if (body.size() < kHelloFixed + kProofBytes || body[0] != kHelloTag || static_cast<uint8_t>(body[1]) != kHelloVersion)
    return false;
  const auto* p = reinterpret_cast<const uint8_t*>(body.data());
  const size_t plane = get16(p + 10), token = get16(p + 12);
  if (body.size() != kHelloFixed + plane + token + kProofBytes) return false;
  out->rank = static_cast<int32_t>(get32(p + 2));
  out->to = static_cast<int32_t>(get32(p + 6));
  out->plane = body.substr(kHelloFixed, plane);
  out->token = body.substr(kHelloFixed + plane, token);
  out->proof = body.substr(kHelloFixed + plane + token, kProofBytes);
  return out->rank >= 0 && out->to >= 0;
}

std::string hello_proof(const std::string& secret, const std::string& challenge_hex, const Hello& h) {
  if (secret.empty()) return std::string(kProofBytes, '\0');
  std::string text = "pycoll control hello";
  for (const std::string& field : {challenge_hex, h.plane, std::to_string(h.rank), std::to_string(h.to), h.token}) {
    text.push_back('\0');
    text += field;
  }
  const Digest d = hmac_sha256(secret.data(), secret.size(), text.data(), text.size());
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

bool proof_ok(const std::string& secret, const std::string& challenge_hex, const Hello& h) {
  if (secret.empty()) return true;
  const std::string want = hello_proof(secret, challenge_hex, h);
  if (h.proof.size() != want.size()) return false;
  Digest a, b;
  std::memcpy(a.data(), want.data(), a.size());
  std::memcpy(b.data(), h.proof.data(), b.size());
  return digests_equal(a, b);
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  random_bytes(raw.data(), bytes);
  static const char* digits = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes);
  for (unsigned char c : raw) {
    hex.push_back(digits[c >> 4]);
    hex.push_back(digits[c & 15]);
  }
  return hex;
}

}  // namespace pycoll::fault
