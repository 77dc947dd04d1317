// Where fault-plane connections arrive: one listening socket per process and address, served by a native
// thread (pycoll/fault/listener.py wraps it; every plane of the process and every join request comes here).
//
//     dialler                                listener
//       connect  ------------------------->  accept; challenge frame {"t":"challenge","c":<random hex>}
//       hello (binary, wire.h)               proof checked (with a job secret), then *parked* under
//                                            (plane, from, to) until that plane's links claim it
//       or {"t":"join", ...} (JSON)          queued for the Python layer with its challenge (next_join),
//                                            which checks the request and answers it
//       or a probe (probe.h)                 answered by a probe thread of its own, natively: where this
//                                            process is (its flight records, its threads' stacks)
//
// The handshake reads exactly one frame: what the dialler sends after it stays in the socket for the
// plane. Handshakes run side by side on non-blocking sockets, so one stalled connection holds up nobody;
// one that takes longer than kHandshakeTimeout, or sends what is neither, is closed. A hello whose plane
// never claims it is closed after kParkedTimeout (a plane whose forming failed).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fault/probe.h"
#include "transport/fd.h"

namespace pycoll::fault {

class ControlListener {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
  static constexpr auto kParkedTimeout = std::chrono::seconds(120);

  // Listens on `bind_host` (IPv4; "0.0.0.0" for every interface) on a port the kernel picks. `secret`
  // (empty: none) is the job's PYCOLL_SECRET, which every hello must prove it holds.
  ControlListener(const std::string& bind_host, const std::string& secret);
  ~ControlListener();
  ControlListener(const ControlListener&) = delete;
  ControlListener& operator=(const ControlListener&) = delete;

  int port() const { return port_; }
  const std::string& secret() const { return secret_; }

  // The connection rank `from` of `plane` dialled to rank `to`, once its hello is here: its descriptor
  // (the caller owns it), or -1. A parked hello with another token is closed: whoever sent it does not
  // know the plane's token.
  int claim(const std::string& plane, int from, int to, const std::string& token);
  // A count of what happened here that a plane being formed may wait for: hellos parked, and pokes (a
  // plane's links poke it when a dial of theirs went on). wait_change blocks until it differs from `seen`
  // or `timeout_s` passes.
  uint64_t generation();
  void wait_change(uint64_t seen, double timeout_s);
  void poke();
  // Closes the connections parked for `plane` (a plane whose forming failed).
  void forget(const std::string& plane);

  // A joining process's request: its connection (the caller owns it), the challenge it was sent, the JSON.
  struct Join {
    int fd = -1;
    std::string challenge, body;
  };
  // The next join request, or false after `timeout_s` (or once closed).
  bool next_join(double timeout_s, Join* out);

 private:
  struct Pending {
    UniqueFd fd;
    std::string challenge;
    std::string out;  // the challenge frame, until written
    size_t out_off = 0;
    std::string in;  // the frame being read: 4 bytes of length, then the body
    Clock::time_point give_up;
  };
  struct Parked {
    UniqueFd fd;
    std::string token;
    Clock::time_point since;
  };
  using Key = std::tuple<std::string, int, int>;  // (plane, from, to)

  void loop();
  void accept_all();  // accept_paused_until_ set when the process is out of descriptors
  // Moves a handshake on as far as its socket allows: true when it is over (parked, queued or failed).
  bool advance(Pending& p);
  void finish(Pending& p);
  void expire(Clock::time_point now);
  // Queues a probe for the probe threads (at most kMaxProbes, started as needed; every rank of a failed
  // collective may probe this one at once); past kMaxQueuedProbes waiting, it is closed unanswered.
  void answer_probe(UniqueFd fd, const ProbeRequest& request);
  void serve_probes();

  std::string secret_;
  UniqueFd listen_fd_, wake_fd_;
  int port_ = 0;
  Clock::time_point accept_paused_until_{};  // the I/O thread's: accept starved (net::accept_starved)
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Pending> pending_;  // the I/O thread's own
  std::map<Key, Parked> parked_;
  uint64_t generation_ = 0;
  std::deque<Join> joins_;
  std::deque<std::pair<UniqueFd, ProbeRequest>> probe_queue_;
  int probes_ = 0;  // probe threads running (the destructor waits for them)
};

}  // namespace pycoll::fault
