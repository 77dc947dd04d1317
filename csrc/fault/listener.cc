#include "fault/listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>

#include "fault/probe.h"
#include "fault/wire.h"
#include "pycoll/errors.h"
#include "transport/sockets.h"

namespace pycoll::fault {

namespace {

constexpr size_t kMaxPending = 1024;
// A hello or a join request is a few hundred bytes; anything longer at this point is not one of ours.
constexpr uint32_t kMaxHandshakeFrame = 64 * 1024;

void wake(int fd) {
  uint64_t one = 1;
  ssize_t rc = ::write(fd, &one, sizeof one);
  (void)rc;  // EAGAIN: a wake-up is pending already
}

}  // namespace

ControlListener::ControlListener(const std::string& bind_host, const std::string& secret) : secret_(secret) {
  listen_fd_ = net::listen_on(bind_host, 4096, &port_);
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOLL_CHECK_SYS(wake_fd_.get());
  thread_ = std::thread([this] { loop(); });
}

ControlListener::~ControlListener() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake(wake_fd_.get());
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return probes_ == 0; });  // each is over within its send timeout
  for (Join& j : joins_) ::close(j.fd);
}

int ControlListener::claim(const std::string& plane, int from, int to, const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = parked_.find(Key{plane, from, to});
  if (it == parked_.end()) return -1;
  Parked got = std::move(it->second);
  parked_.erase(it);
  if (got.token.size() != token.size()) return -1;
  unsigned diff = 0;  // in time that does not depend on where they differ
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned>(got.token[i] ^ token[i]);
  return diff == 0 ? got.fd.release() : -1;
}

uint64_t ControlListener::generation() {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void ControlListener::wait_change(uint64_t seen, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)),
               [&] { return generation_ != seen || stop_; });
}

void ControlListener::poke() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  cv_.notify_all();
}

void ControlListener::forget(const std::string& plane) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = parked_.begin(); it != parked_.end();)
    it = std::get<0>(it->first) == plane ? parked_.erase(it) : std::next(it);
}

bool ControlListener::next_join(double timeout_s, Join* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] { return !joins_.empty() || stop_; });
  if (joins_.empty()) return false;
  *out = std::move(joins_.front());
  joins_.pop_front();
  return true;
}

void ControlListener::accept_all() {
  while (pending_.size() < kMaxPending) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {  // EAGAIN (nothing waiting), a connection that went away before it was accepted, or starved
      if (net::accept_starved(errno)) accept_paused_until_ = Clock::now() + net::kAcceptBackoff;
      return;
    }
    net::set_nodelay(fd.get());
    Pending p;
    p.fd = std::move(fd);
    p.challenge = random_hex(kChallengeHexChars / 2);
    p.out = frame(challenge_body(p.challenge));
    p.give_up = Clock::now() + kHandshakeTimeout;
    pending_.push_back(std::move(p));
  }
}

bool ControlListener::advance(Pending& p) {
  while (p.out_off < p.out.size()) {
    const ssize_t k = ::send(p.fd.get(), p.out.data() + p.out_off, p.out.size() - p.out_off, MSG_NOSIGNAL);
    if (k < 0) return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    p.out_off += static_cast<size_t>(k);
  }
  for (;;) {
    // Exactly one frame: its length, then its body, never a byte past it.
    size_t want = 4;
    if (p.in.size() >= 4) {
      const uint32_t n = frame_length(reinterpret_cast<const uint8_t*>(p.in.data()));
      if (n == 0 || n > kMaxHandshakeFrame) return true;
      want = 4 + n;
    }
    if (p.in.size() == want) {
      finish(p);
      return true;
    }
    char buf[4096];
    const size_t n = std::min(sizeof buf, want - p.in.size());
    const ssize_t k = ::recv(p.fd.get(), buf, n, 0);
    if (k == 0) return true;
    if (k < 0) return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    p.in.append(buf, static_cast<size_t>(k));
  }
}

void ControlListener::finish(Pending& p) {
  const std::string body = p.in.substr(4);
  if (body[0] == '{') {  // a joining process: the Python layer checks and answers its request
    std::lock_guard<std::mutex> lock(mu_);
    joins_.push_back(Join{p.fd.release(), p.challenge, body});
    cv_.notify_all();
    return;
  }
  ProbeRequest probe;
  if (parse_probe(body, &probe)) {
    if (probe_proof_ok(secret_, p.challenge, probe.proof)) answer_probe(std::move(p.fd), probe);
    return;  // a wrong proof: closed with p
  }
  Hello h;
  if (!parse_hello(body, &h) || !proof_ok(secret_, p.challenge, h)) return;  // closed with p
  std::lock_guard<std::mutex> lock(mu_);
  parked_[Key{h.plane, h.rank, h.to}] = Parked{std::move(p.fd), h.token, Clock::now()};
  ++generation_;
  cv_.notify_all();
}

void ControlListener::answer_probe(UniqueFd fd, const ProbeRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (probe_queue_.size() >= kMaxQueuedProbes) return;  // closed unanswered
  probe_queue_.emplace_back(std::move(fd), request);
  if (probes_ >= kMaxProbes) return;  // a running probe thread takes it next
  ++probes_;
  std::thread([this] { serve_probes(); }).detach();
}

// A probe thread: answers queued probes until none is left (or the listener stops), one at a time.
void ControlListener::serve_probes() {
  for (;;) {
    std::pair<UniqueFd, ProbeRequest> next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (probe_queue_.empty() || stop_) {
        probe_queue_.clear();
        --probes_;
        cv_.notify_all();
        return;
      }
      next = std::move(probe_queue_.front());
      probe_queue_.pop_front();
    }
    const int fd = next.first.get();
    // Blocking, with a deadline: the report is written in one go, whatever its size.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const std::string out = frame(probe_report(next.second));
    for (size_t off = 0; off < out.size();) {
      const ssize_t k = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (k <= 0 && errno != EINTR) break;
      if (k > 0) off += static_cast<size_t>(k);
    }
  }
}

void ControlListener::expire(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = parked_.begin(); it != parked_.end();)
    it = now - it->second.since > kParkedTimeout ? parked_.erase(it) : std::next(it);
}

void ControlListener::loop() {
  std::vector<struct pollfd> fds;
  Clock::time_point next_expiry = Clock::now() + std::chrono::seconds(1);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    const bool paused = Clock::now() < accept_paused_until_;
    fds.push_back({listen_fd_.get(), static_cast<short>(pending_.size() < kMaxPending && !paused ? POLLIN : 0), 0});
    Clock::time_point wake_at = paused ? std::min(next_expiry, accept_paused_until_) : next_expiry;
    for (const Pending& p : pending_) {
      fds.push_back({p.fd.get(), static_cast<short>(p.out_off < p.out.size() ? POLLOUT : POLLIN), 0});
      wake_at = std::min(wake_at, p.give_up);
    }
    if (::poll(fds.data(), fds.size(), net::ms_left(wake_at)) < 0 && errno != EINTR) return;  // nothing to serve
    if (fds[0].revents & POLLIN) {
      uint64_t drained;
      ssize_t k = ::read(wake_fd_.get(), &drained, sizeof drained);
      (void)k;
    }
    const size_t before = pending_.size();
    if (fds[1].revents & POLLIN) accept_all();
    const Clock::time_point now = Clock::now();
    std::vector<Pending> still;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& p = pending_[i];
      const bool touched = i >= before || fds[2 + i].revents != 0;  // accepted just now, or its socket polled
      const bool over = touched && advance(p);
      if (!over && now < p.give_up) still.push_back(std::move(p));
    }  // the others' sockets close here, unless they were parked or queued
    pending_.swap(still);
    if (now >= next_expiry) {
      expire(now);
      // An idle listener sleeps: parked hellos are expired within a few seconds of kParkedTimeout.
      next_expiry = now + std::chrono::seconds(5);
    }
  }
}

}  // namespace pycoll::fault
