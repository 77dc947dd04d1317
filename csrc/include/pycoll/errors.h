// pycoll's native error type and the check macros that turn failures of the OS (and later CUDA and
// NCCL) into it. Library code throws; it never prints and never exits. csrc/python/module.cc maps
// each ErrorKind to the Python class of the same name in pycoll/errors.py.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pycoll {

enum class ErrorKind : int {
  kInternal = 0,
  kTimeout = 1,       // CollectiveTimeoutError
  kPeerLost = 2,      // PeerLostError
  kMismatch = 3,      // CollectiveMismatchError
  kInvalidUsage = 4,  // InvalidUsageError
  kNccl = 5,          // NcclError
  kBroken = 6,        // CommunicatorBrokenError
  kSystem = 7,        // PycollError carrying an OS error
};
// The kinds' names in code order, as pycoll/codes.py ERROR_KIND_CODES spells them (_C.ERROR_KINDS is made
// from this table, and tests/unit/test_layers.py checks it against that one).
inline const char* const kErrorKindNames[] = {"internal",      "timeout", "peer_lost", "mismatch",
                                              "invalid_usage", "nccl",    "broken",    "system"};
constexpr int kNumErrorKinds = 8;
static_assert(sizeof(kErrorKindNames) / sizeof(kErrorKindNames[0]) == kNumErrorKinds, "a name per ErrorKind");
static_assert(static_cast<int>(ErrorKind::kSystem) == kNumErrorKinds - 1, "kErrorKindNames follows ErrorKind");

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg, int peer = -1) : std::runtime_error(msg), kind_(kind), peer_(peer) {}
  ErrorKind kind() const { return kind_; }
  int peer() const { return peer_; }

 private:
  ErrorKind kind_;
  int peer_;
};

[[noreturn]] inline void throw_system_error(const char* what, const char* file, int line) {
  int err = errno;
  throw Error(ErrorKind::kSystem, std::string(what) + " failed: " + std::strerror(err) + " (errno " +
                                      std::to_string(err) + ", " + file + ":" + std::to_string(line) + ")");
}

}  // namespace pycoll

// PYCOLL_CHECK_SYS(call): call returns -1 (or any negative) on failure with errno set.
#define PYCOLL_CHECK_SYS(call)                                               \
  do {                                                                       \
    if ((call) < 0) ::pycoll::throw_system_error(#call, __FILE__, __LINE__); \
  } while (0)
