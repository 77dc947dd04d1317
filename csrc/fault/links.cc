#include "fault/links.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "fault/wire.h"
#include "pycoll/errors.h"
#include "transport/sockets.h"

namespace pycoll::fault {

namespace {

constexpr auto kDropLinger = std::chrono::milliseconds(200);
const std::string kHeartbeat(4, '\0');   // an empty frame
constexpr double kMaxAnswerS = 86400.0;  // answer_timeout_s past this is "no limit" (and fits a time_point)

// Milliseconds until `t`, rounded up (a poll that woke before its deadline would poll again at once, and
// an idle rank would wake many times a tick), at most a second.
int ms_until(ControlLinks::Clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - ControlLinks::Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>((us + 999) / 1000, 0, 1000));
}

// The next tick after `now`: a multiple of `interval` on the steady clock (CLOCK_MONOTONIC, one clock for
// every process of a host). Every rank of a host ticks at the same instants, so the heartbeats a rank gets
// from its fingers on the host arrive together and are read in one wake-up, not one each: an idle rank
// wakes a few times an interval, not once per finger.
ControlLinks::Clock::time_point aligned_tick(ControlLinks::Clock::time_point now,
                                             ControlLinks::Clock::duration interval) {
  const auto since = now.time_since_epoch();
  return ControlLinks::Clock::time_point((since / interval + 1) * interval);
}

ControlLinks::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<ControlLinks::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

ControlLinks::ControlLinks(std::shared_ptr<ControlListener> listener, const LinksConfig& config,
                           const std::vector<std::string>& addresses)
    : listener_(std::move(listener)),
      config_(config),
      addresses_(addresses),
      interval_(seconds(config.heartbeat_timeout_s / 5)),
      timeout_(seconds(config.heartbeat_timeout_s)),
      answer_by_(Clock::now() +
                 seconds(std::min(std::max(config.answer_timeout_s, config.heartbeat_timeout_s), kMaxAnswerS))),
      peers_(config.peers) {
  if (config.world < 1 || config.rank < 0 || config.rank >= config.world ||
      static_cast<int>(addresses.size()) != config.world)
    throw Error(ErrorKind::kInternal, "control links need a rank in 0..world-1 and an address per member");
  if (peers_.empty())
    for (int r = 0; r < config.world; ++r)
      if (r != config.rank) peers_.push_back(r);
  std::sort(peers_.begin(), peers_.end());
  peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
  for (int r : peers_)
    if (r < 0 || r >= config.world || r == config.rank)
      throw Error(ErrorKind::kInternal, "control links: a peer must be another member of the plane");
  links_.resize(peers_.size());
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOLL_CHECK_SYS(wake_fd_.get());
  last_loop_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < peers_.size() && peers_[i] < config.rank; ++i) {
      std::string why;
      UniqueFd fd = net::start_connect(addresses[peers_[i]], &why);
      if (!fd) {
        fail_dial(static_cast<int>(i), why);
        continue;
      }
      links_[i].fd = std::move(fd);
      links_[i].state = State::kConnecting;
    }
  }
  thread_ = std::thread([this] { loop(); });
}

ControlLinks::~ControlLinks() {
  close(0.0);
}

int ControlLinks::index(int rank) const {
  const auto it = std::lower_bound(peers_.begin(), peers_.end(), rank);
  return it != peers_.end() && *it == rank ? static_cast<int>(it - peers_.begin()) : -1;
}

void ControlLinks::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_fd_.get(), &one, sizeof one);
  (void)rc;
}

void ControlLinks::event(int peer, char kind, std::string data) {
  events_.push_back(Event{peer, kind, std::move(data)});
  ++made_;
  cv_.notify_all();
}

// ---- forming -------------------------------------------------------------------------------------------

std::vector<int> ControlLinks::wait_formed(double timeout_s) {
  const Clock::time_point deadline = Clock::now() + seconds(timeout_s);
  for (;;) {
    const uint64_t seen = listener_->generation();
    std::vector<int> missing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
        if (peers_[i] < config_.rank || links_[i].state != State::kIdle) continue;
        const int fd = listener_->claim(config_.plane, peers_[i], config_.rank, config_.token);
        if (fd >= 0) {
          link_up(i, UniqueFd(fd), "");
          links_[i].answered = true;    // its hello came
          links_[i].out += kHeartbeat;  // the answer: the member that dialled counts this rank as formed
          write_out(i);
        }
      }
      for (size_t i = 0; i < peers_.size(); ++i) {
        // A dialled member is in once it answered (it made its own links): one that dies before that
        // is a failure, not a member of a plane that formed without it.
        const State s = links_[i].state;
        const bool in = (s == State::kUp && links_[i].answered) || s == State::kClosing || s == State::kClosed;
        if (!in) missing.push_back(peers_[i]);
      }
    }
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (missing.empty() || left <= 0) return missing;
    listener_->wait_change(seen, left);  // a hello arrived, or a dial of ours went on (poke), or time is up
  }
}

std::vector<std::pair<int, std::string>> ControlLinks::failures() {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

void ControlLinks::fail_dial(int i, const std::string& why) {
  failures_.emplace_back(peers_[i], why);
  Link& l = links_[i];
  l.state = State::kClosed;
  l.fd.reset();
  listener_->poke();
}

void ControlLinks::link_up(int i, UniqueFd fd, const std::string& first) {
  Link& l = links_[i];
  l.fd = std::move(fd);
  l.state = State::kUp;
  l.in.clear();
  l.out = first + l.out.substr(l.out_off);  // the hello goes before what was queued while dialling
  l.out_off = 0;
  l.heard = l.sent = Clock::now();
  l.answered = false;
  wake();
}

void ControlLinks::on_connected(int i) {
  Link& l = links_[i];
  const std::string error = net::connect_error(l.fd.get());
  if (!error.empty()) return fail_dial(i, "cannot reach its control socket at " + addresses_[peers_[i]] + ": " + error);
  l.state = State::kChallenge;
  l.in.clear();
}

void ControlLinks::read_challenge(int i) {
  Link& l = links_[i];
  const std::string& address = addresses_[peers_[i]];
  for (;;) {
    size_t want = 4;
    if (l.in.size() >= 4) {
      const uint32_t n = frame_length(reinterpret_cast<const uint8_t*>(l.in.data()));
      if (n > 256) return fail_dial(i, address + " is not a pycoll control socket");
      want = 4 + n;
    }
    if (l.in.size() == want) break;
    char buf[256];
    const ssize_t k = ::recv(l.fd.get(), buf, std::min(sizeof buf, want - l.in.size()), 0);
    if (k == 0) return fail_dial(i, "its control socket at " + address + " closed the connection");
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return fail_dial(i, "its control socket at " + address + ": " + net::errno_text("recv"));
    }
    l.in.append(buf, static_cast<size_t>(k));
  }
  const std::string challenge = parse_challenge(l.in.substr(4));
  if (challenge.empty()) return fail_dial(i, address + " is not a pycoll control socket");
  Hello h;
  h.rank = config_.rank;
  h.to = peers_[i];
  h.plane = config_.plane;
  h.token = config_.token;
  h.proof = hello_proof(listener_->secret(), challenge, h);
  link_up(i, std::move(l.fd), frame(hello_body(h)));
  listener_->poke();
}

// ---- messages ------------------------------------------------------------------------------------------

ControlLinks::SendResult ControlLinks::send(int peer, const std::string& body) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = index(peer);
  if (i < 0) return kGone;
  Link& l = links_[i];
  if (body.size() > kMaxFrame)
    throw Error(ErrorKind::kInvalidUsage, "a control message of " + std::to_string(body.size()) +
                                              " bytes is larger than a control frame may be (" +
                                              std::to_string(kMaxFrame) + ")");
  if (l.state == State::kClosed || l.state == State::kClosing || stop_) return kGone;
  if (l.out.size() - l.out_off + body.size() > kMaxQueued) return kBackedUp;
  l.out += frame(body);
  if (l.state != State::kUp) return kSent;  // written once the link is up
  write_out(i);
  if (l.state == State::kUp && l.out_off < l.out.size()) wake();  // the I/O thread writes the rest
  return l.state == State::kUp ? kSent : kGone;
}

void ControlLinks::drop(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = index(peer);
  if (i < 0) return;
  Link& l = links_[i];
  if (l.state == State::kClosed) return;
  if (l.state == State::kUp && l.out_off < l.out.size()) {
    l.state = State::kClosing;
    l.closing_deadline = Clock::now() + kDropLinger;
    wake();
    return;
  }
  close_link(i, "", false);
}

std::vector<ControlLinks::Event> ControlLinks::take(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, seconds(std::max(0.0, timeout_s)), [&] { return !events_.empty() || stop_; });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

uint64_t ControlLinks::settle() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = passes_ + 2;  // the pass under way may have begun before this call: one more
  ++settling_;
  wake();
  cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return passes_ >= target || stop_; });
  --settling_;
  return made_;
}

void ControlLinks::close(double flush_s) {
  std::lock_guard<std::mutex> closing(close_mu_);  // a second caller waits, then finds it closed
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_ && !thread_.joinable()) return;
  const Clock::time_point deadline = Clock::now() + seconds(std::max(0.0, flush_s));
  for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
    Link& l = links_[i];
    if (l.state == State::kUp && l.out_off < l.out.size() && flush_s > 0) {
      l.state = State::kClosing;
      l.closing_deadline = deadline;
    } else if (l.state != State::kClosing) {
      close_link(i, "", false);
    }
  }
  wake();
  cv_.wait_until(lock, deadline, [&] {
    return std::none_of(links_.begin(), links_.end(), [](const Link& l) { return l.state == State::kClosing; });
  });
  stop_ = true;
  cv_.notify_all();
  lock.unlock();
  wake();
  if (thread_.joinable()) thread_.join();
  lock.lock();
  for (int i = 0; i < static_cast<int>(links_.size()); ++i) close_link(i, "", false);
}

void ControlLinks::hold(double seconds_held) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_until_ = Clock::now() + seconds(seconds_held);
  wake();
}

// ---- the I/O thread ------------------------------------------------------------------------------------

void ControlLinks::close_link(int i, const std::string& why, bool report) {
  Link& l = links_[i];
  const int peer = peers_[i];
  if (l.state == State::kClosed) return;
  const bool was_linked = l.state == State::kUp || l.state == State::kClosing;
  if (report && was_linked && !l.answered) failures_.emplace_back(peer, why);  // it died while forming
  l.state = State::kClosed;
  l.fd.reset();
  l.in.clear();
  l.out.clear();
  l.out_off = 0;
  if (report && was_linked) event(peer, 'c', why);
  cv_.notify_all();
}

void ControlLinks::read_frames(int i) {
  Link& l = links_[i];
  const int peer = peers_[i];
  char buf[65536];
  std::string ended;  // why the link ended, once its last frames are events (a "bye" before the EOF)
  for (;;) {
    const ssize_t k = ::recv(l.fd.get(), buf, sizeof buf, 0);
    if (k == 0) {
      ended = "its control link closed: the process exited or was killed";
      break;
    }
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      ended = "its control link failed (" + net::errno_text("recv") + ")";
      break;
    }
    l.heard = Clock::now();
    l.silence_reported = false;
    if (!l.answered) {
      l.answered = true;
      listener_->poke();  // wait_formed counts it now
    }
    l.in.append(buf, static_cast<size_t>(k));
    if (static_cast<size_t>(k) < sizeof buf) break;
  }
  size_t at = 0;
  while (l.in.size() - at >= 4) {
    const uint32_t n = frame_length(reinterpret_cast<const uint8_t*>(l.in.data() + at));
    if (n > kMaxFrame)
      return close_link(i,
                        "it sent a malformed control frame (" + std::to_string(n) + " bytes, at most " +
                            std::to_string(kMaxFrame) + ")",
                        true);
    if (l.in.size() - at < 4 + static_cast<size_t>(n)) break;
    if (n > 0) event(peer, 'f', l.in.substr(at + 4, n));  // an empty frame is a heartbeat
    at += 4 + n;
  }
  l.in.erase(0, at);
  if (!ended.empty()) close_link(i, ended, true);
}

void ControlLinks::write_out(int i) {
  Link& l = links_[i];
  while (l.out_off < l.out.size()) {
    const ssize_t k =
        ::send(l.fd.get(), l.out.data() + l.out_off, l.out.size() - l.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return close_link(i, "its control link failed (" + net::errno_text("send") + ")", true);
    }
    l.out_off += static_cast<size_t>(k);
    l.sent = Clock::now();
  }
  l.out.clear();
  l.out_off = 0;
  if (l.state == State::kClosing) close_link(i, "", false);
}

void ControlLinks::tick(Clock::time_point now) {
  if (now - last_loop_ > timeout_ / 2) {
    // This thread did not run for that long: the process was stopped or starved, and the silence it would
    // see now is its own, not its peers'.
    for (Link& l : links_) l.heard = now;
  }
  last_loop_ = now;
  for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
    Link& l = links_[i];
    if (l.state != State::kUp) continue;
    if (now - l.sent >= interval_ * 3 / 4 && l.out_off == l.out.size()) {  // nothing sent since the last tick
      l.out += kHeartbeat;
      write_out(i);
      if (l.state != State::kUp) continue;
    }
    // A member dialled but not yet answering is still making its links: silent only past answer_by_.
    if (now - l.heard > timeout_ && !l.silence_reported && (l.answered || now > answer_by_)) {
      l.silence_reported = true;
      char text[32];
      std::snprintf(text, sizeof text, "%.1f", std::chrono::duration<double>(now - l.heard).count());
      event(peers_[i], 's', text);
    }
  }
}

void ControlLinks::loop() {
  std::vector<struct pollfd> fds;
  std::vector<int> owner;
  Clock::time_point next_tick = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    fds.assign(1, {wake_fd_.get(), POLLIN, 0});
    owner.assign(1, -1);
    Clock::time_point wake_at = next_tick;
    for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
      const Link& l = links_[i];
      if (l.state == State::kClosing) wake_at = std::min(wake_at, l.closing_deadline);
      short events = 0;
      if (l.state == State::kConnecting) events = POLLOUT;
      if (l.state == State::kChallenge) events = POLLIN;
      if (l.state == State::kUp || l.state == State::kClosing)
        events = static_cast<short>(POLLIN | (l.out_off < l.out.size() ? POLLOUT : 0));
      if (!events) continue;
      fds.push_back({l.fd.get(), events, 0});
      owner.push_back(i);
    }
    const int wait_ms = settling_ > 0 ? 0 : ms_until(wake_at);  // a settle waits for passes
    lock.unlock();
    const int rc = ::poll(fds.data(), fds.size(), wait_ms);
    const int err = errno;
    lock.lock();
    if (Clock::now() < hold_until_) std::this_thread::sleep_until(hold_until_);  // mu_ held: everything waits
    if (rc < 0 && err != EINTR) {  // it cannot go on: every link is lost, and so every peer learns it at once
      errno = err;
      const std::string why = "this rank's control I/O thread failed (" + net::errno_text("poll") + ")";
      for (int i = 0; i < static_cast<int>(links_.size()); ++i) close_link(i, why, true);
      break;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t drained;
      ssize_t k = ::read(wake_fd_.get(), &drained, sizeof drained);
      (void)k;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      const int k = owner[i];
      Link& l = links_[k];
      if (!fds[i].revents || l.fd.get() != fds[i].fd) continue;  // changed while this thread polled
      if (l.state == State::kConnecting) {
        on_connected(k);
      } else if (l.state == State::kChallenge) {
        read_challenge(k);
      } else {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_frames(k);
        if ((l.state == State::kUp || l.state == State::kClosing) && l.out_off < l.out.size()) write_out(k);
      }
    }
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < static_cast<int>(links_.size()); ++i)
      if (links_[i].state == State::kClosing && now >= links_[i].closing_deadline) close_link(i, "", false);
    if (now >= next_tick) {
      tick(now);
      next_tick = aligned_tick(now, interval_);
    }
    ++passes_;
    if (settling_ > 0) cv_.notify_all();  // a settle counts passes; take() waits for events only
  }
}

}  // namespace pycoll::fault
