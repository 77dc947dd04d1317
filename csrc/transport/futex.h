// Process-shared futex wait / wake on a 32-bit word in shared memory.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>

#include "pycoll/errors.h"

namespace pycoll {

// Sleeps while *word == expected, at most timeout_ns. Returns on wake, timeout, signal or value change.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  struct timespec ts;
  ts.tv_sec = timeout_ns / 1000000000;
  ts.tv_nsec = timeout_ns % 1000000000;
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  long rc = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
  // EAGAIN (value changed), ETIMEDOUT and EINTR all mean "look again"; the caller re-checks state.
  if (rc < 0 && errno != EAGAIN && errno != ETIMEDOUT && errno != EINTR)
    throw_system_error("futex(FUTEX_WAIT)", __FILE__, __LINE__);
}

inline long futex_wake_all_nothrow(std::atomic<uint32_t>* word) noexcept {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  PYCOLL_CHECK_SYS(futex_wake_all_nothrow(word));
}

}  // namespace pycoll
