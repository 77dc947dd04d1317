// One rank's links of a fault plane (pycoll/fault/plane.py runs the plane's protocol over them), with the
// plane's failure detector: a native I/O thread that never needs the GIL, so that a rank is alive as long
// as its process runs, whatever its Python does.
//
// The parts, named once and used by these names below:
//
// - **link**: the one connection between this rank and one of its *peers*, the members the plane's shape
//   links it to (pycoll/fault/overlay.py: O(log world) of them, the same set seen from both ends). A rank
//   dials the peers below it (the I/O thread: every dial at once, non-blocking) and claims the peers above
//   it from its listener (listener.h) as their hellos arrive (wait_formed, on the caller's thread). Every
//   table here is per peer, so a rank's memory and each I/O pass cost O(peers), not O(world).
// - **frames** (wire.h): the Python layer's JSON bodies, queued per link (send) and written by the I/O
//   thread; a body read from a link becomes an *event* for the Python layer (take).
// - **heartbeat**: an empty frame the I/O thread sends, at its *tick*, on every link that sent nothing
//   since the tick before, and reads and drops. Ticks come every heartbeat interval (heartbeat_timeout / 5)
//   at instants aligned on the steady clock, the same for every process of a host, so that the heartbeats
//   a rank gets arrive together and cost it one wake-up, not one per link.
// - **detector**: a link that closes or fails becomes a `closed` event (a killed process's sockets are
//   closed by the kernel at once); one that was silent for heartbeat_timeout a `silent` event (a stopped
//   process, a hung host, a cut link), once. If the I/O thread itself did not run for half the timeout
//   (this process was stopped, or starved of CPU), the silence it saw is its own and is forgotten.
//   Deciding what an event means (dead, evicted, left) is the Python layer's.
//
// Everything is under one mutex; no call blocks on a peer (sends are queued when the socket is full).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fault/listener.h"
#include "transport/fd.h"

namespace pycoll::fault {

struct LinksConfig {
  int rank = 0;
  int world = 1;
  std::string plane, token;
  double heartbeat_timeout_s = 5.0;
  // The members this rank links to (sorted, without itself); empty: every member (a full mesh).
  std::vector<int> peers;
  // How long a member this rank dialled may take to answer (to make its own links: the rest of the
  // formation) before its silence counts; never less than heartbeat_timeout_s.
  double answer_timeout_s = 0.0;
};

class ControlLinks {
 public:
  using Clock = std::chrono::steady_clock;
  // Frames queued to a member past which it counts as not reading them (send returns false).
  static constexpr size_t kMaxQueued = 16u << 20;

  // Starts forming: dials every peer below `config.rank` at `addresses[r]` ("a.b.c.d:port").
  ControlLinks(std::shared_ptr<ControlListener> listener, const LinksConfig& config,
               const std::vector<std::string>& addresses);
  ~ControlLinks();
  ControlLinks(const ControlLinks&) = delete;
  ControlLinks& operator=(const ControlLinks&) = delete;

  // Forming: claims the members above this rank whose hellos have arrived, waiting up to `timeout_s` for
  // more; returns the members not linked yet (empty: formed). A member whose dial failed for good is in
  // failures() with why.
  std::vector<int> wait_formed(double timeout_s);
  std::vector<std::pair<int, std::string>> failures();

  // Queues `body` (a frame body) to `peer`: kSent, or kGone (its link closed: a `closed` event says why,
  // or this rank dropped it, or it is not a peer), or kBackedUp (it reads
  // nothing of what it is sent: kMaxQueued bytes wait).
  enum SendResult { kSent = 0, kGone = 1, kBackedUp = 2 };
  SendResult send(int peer, const std::string& body);
  // Closes the link to `peer` once what was queued to it is written (at most 0.2 s later).
  void drop(int peer);

  struct Event {
    int peer;
    char kind;  // 'f': a frame (data: its body); 'c': the link closed (data: why); 's': silent (data: seconds)
    std::string data;
  };
  // The events since the last call, waiting up to `timeout_s` for one.
  std::vector<Event> take(double timeout_s);
  // After the I/O thread has read what had arrived (bounded): the number of events made so far.
  uint64_t settle();
  // Writes what is queued (at most `flush_s`), closes every link and stops the I/O thread.
  void close(double flush_s);
  // For the tests: the I/O thread, and every call, stand still for `seconds`, as when the process is
  // stopped (SIGSTOP).
  void hold(double seconds);

 private:
  enum class State { kIdle, kConnecting, kChallenge, kUp, kClosing, kClosed };
  struct Link {
    State state = State::kIdle;
    UniqueFd fd;
    std::string in;   // bytes read, not yet a whole frame
    std::string out;  // bytes to write
    size_t out_off = 0;
    Clock::time_point heard, sent, closing_deadline;
    bool silence_reported = false;
    bool answered = false;  // a frame came from the member (a dialled one answers once it made its links)
  };

  // The index of member `rank` in peers_ / links_, or -1 when it is not a peer.
  int index(int rank) const;
  void loop();
  void wake();
  // Below, `i` is a peer's index (links_[i], peers_[i]); `peer` a member's rank. All with mu_ held.
  void event(int peer, char kind, std::string data);
  void link_up(int i, UniqueFd fd, const std::string& first);
  void close_link(int i, const std::string& why, bool report);
  void fail_dial(int i, const std::string& why);
  void on_connected(int i);
  void read_challenge(int i);
  void read_frames(int i);
  void write_out(int i);
  void tick(Clock::time_point now);  // mu_ held

  std::shared_ptr<ControlListener> listener_;
  const LinksConfig config_;
  const std::vector<std::string> addresses_;
  const Clock::duration interval_, timeout_;
  const Clock::time_point answer_by_;  // config_.answer_timeout_s from construction
  std::mutex close_mu_;                // close() runs once at a time (it joins thread_)
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> peers_;   // ranks, sorted
  std::vector<Link> links_;  // links_[i]: the link to peers_[i]
  std::vector<std::pair<int, std::string>> failures_;
  std::deque<Event> events_;
  uint64_t made_ = 0;    // events made so far
  uint64_t passes_ = 0;  // I/O passes done so far (settle waits for one more)
  int settling_ = 0;     // callers waiting in settle (the I/O thread does not sleep meanwhile)
  bool stop_ = false;
  Clock::time_point hold_until_{};
  UniqueFd wake_fd_;
  std::thread thread_;
  Clock::time_point last_loop_;
};

}  // namespace pycoll::fault
