// One owner per file descriptor: every socket, memfd, pidfd and eventfd of the transports is held by a
// UniqueFd from the moment the kernel returns it, so that a throw anywhere after leaks nothing.
#pragma once

#include <unistd.h>

#include <utility>

namespace pycoll {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (a negative value: none, e.g. a failed call; check it after taking it).
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives the descriptor up without closing it.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held (if any) and takes `fd`. Errors of close() are ignored: the descriptor is
  // released either way, and nothing of ours is left to flush.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace pycoll
