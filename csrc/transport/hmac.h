// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the TCP transport's connection handshake: a
// rank proves it holds the job's key without sending it. Small and dependency-free on purpose (no
// OpenSSL to find at build time); the handshake hashes a few hundred bytes per connection, so speed
// does not matter.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace pycoll {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t bytes);
Digest hmac_sha256(const void* key, size_t key_bytes, const void* message, size_t message_bytes);

// Compares two digests in time that does not depend on where they differ.
bool digests_equal(const Digest& a, const Digest& b);

// `bytes` random bytes from the kernel (getrandom); throws pycoll::Error (kSystem) if it cannot.
void random_bytes(void* out, size_t bytes);

}  // namespace pycoll
