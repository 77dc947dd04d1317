// TCP transport: ranks on different hosts, one full-duplex connection per pair of ranks that talk.
//
// Each direction of a connection has a ring of `slots` fragment buffers on each side: the executor writes
// a fragment into a send slot and commits it; an I/O thread writes committed slots to the socket in
// order (several in flight) and reads the peer's frames into receive slots, which the executor consumes
// in place and releases. When a peer's receive ring is full the I/O thread stops reading that socket, so
// TCP's own flow control holds the sender back: memory stays bounded.
//
// The announcements travel on the same connections as small frames: ENTER (the collective number and
// descriptor a rank entered, for mismatch and timeout messages), ABORT (the error a rank failed with, so
// that every rank raises it) and BYE (an orderly end: the peer finalized). A connection that closes or
// fails without BYE marks its peer lost: waiting ranks raise PeerLostError at their next health check
// (within milliseconds). A finalizing rank first finishes the links being made that its peer may count
// as up already, and says BYE on them too; a peer that could not be dialled at all fails only the ranks
// that wait for it. If the I/O thread itself fails (poll() returns an error), every peer is lost at once
// and the connections are shut down, so that waiters here and on the peers raise PeerLostError instead
// of timing out.
//
// Links are made when a collective first needs them (tcp_links.cc), not at set-up: the executor's first
// send to or receive from a peer *wants* it, and the I/O thread dials every wanted peer at once (a
// fragment committed meanwhile waits in its ring). Each rank keeps listening for as long as it lives, and
// whichever side needs the link first dials. Both ends prove they hold the job's key (from the rendezvous
// store, mixed with PYCOLL_SECRET when that is set) without sending it: the dialer sends its rank and a
// random nonce, the listener answers with its own nonce and an HMAC-SHA256 of both under the key, the
// dialer answers with its own HMAC (hmac.h; tcp_internal.h has the exact messages), and the listener,
// the dialer proven, gives its *verdict*: the link is this connection, or, when both ranks dialled each
// other at once, the one the lower rank dialled (the higher rank's is closed: both ends decide alike). A
// connection that fails its handshake (wrong bytes, wrong proof, silence for 5 s) is closed and counted;
// handshakes run side by side, so stalled connections hold nobody back. A peer that cannot be dialled
// (its process exited: the connection is refused) is lost: PeerLostError naming it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/announce.h"
#include "transport/doorbell.h"
#include "transport/fd.h"
#include "transport/transport.h"

namespace pycoll {

struct TcpConfig {
  size_t fragment_bytes = 256 * 1024;
  uint32_t slots = 8;
};

class TcpTransport final : public MemberTransport {
 public:
  // Listens on `bind_host` (an IPv4 address; "0.0.0.0" for every interface) on a port the kernel picks.
  TcpTransport(int rank, int world, const TcpConfig& config, const std::string& bind_host);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int listen_port() const { return listen_port_; }
  // Where the peers listen (`addresses[r]`: "host:port" of rank r's listening socket; "" for a rank this
  // transport does not serve, and its own, ignored) and the key (at least 16 bytes) both ends of every
  // connection prove they hold; a dial that has not made a link after `dial_timeout_s` loses its peer.
  // No connection is made here (see above).
  void set_peers(const std::vector<std::string>& addresses, const std::string& key, double dial_timeout_s);
  // Every collective announces itself to every peer (ENTER), which makes a link to each: what the skew
  // recorder needs to learn every rank's entry time (engine/skew.h). Off: to the linked peers only.
  void announce_to_all(bool on);
  // For the tests: makes the link to `peer` now, waiting up to timeout_s (throws as a collective would:
  // PeerLostError if it cannot be made, kTimeout after the timeout).
  void link_now(int peer, double timeout_s);
  // The peers linked now, and the connections dropped because they did not prove they belong to the job.
  std::vector<int> linked_peers();
  uint64_t rejected_connections() const { return rejected_.load(); }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  size_t fragment_bytes() const override { return config_.fragment_bytes; }
  size_t segment_bytes() const override { return config_.fragment_bytes * config_.slots / 2; }

  void* acquire_send(int peer) override;
  void commit_send(int peer, const FragHeader& h) override;
  const void* peek_recv(int peer, FragHeader* h) override;
  void release_recv(int peer) override;
  void wait(const WaitItem* items, size_t n, int64_t timeout_ns) override;

  // As a member of a CompositeTransport: the I/O thread rings the composite's doorbell as well.
  void ring_also(const Doorbell* bell) override { bell_.store(bell, std::memory_order_release); }
  bool arm(const WaitItem* items, size_t n, bool any) override;
  void disarm() override;

  void begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) override;
  bool entry_stamp(int peer, uint64_t seq, EntryStamp* out) override;
  void check_health(const WaitContext& ctx) override;
  void abort(const Error& error) override;
  std::vector<int> ranks_not_entered(uint64_t seq) override;
  [[noreturn]] void raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                          uint64_t expected_msg_bytes) override;

 private:
  struct Frame;  // wire header (tcp.cc)
  struct Outgoing {
    int64_t slot;                // a send slot, or -1 for a control frame
    std::vector<uint8_t> bytes;  // the control frame
  };
  // A peer's link: none; wanted (to be dialled); dialling; waiting for the peer's own dial (ours was the
  // duplicate); up; lost (lost, the member below).
  enum class Link { kNone, kWanted, kDialing, kAwaiting, kUp };
  struct Dial;      // a dial's handshake (tcp_links.cc)
  struct Incoming;  // an accepted connection's handshake (tcp_links.cc)
  struct Peer {
    UniqueFd fd;
    Link link = Link::kNone;
    std::unique_ptr<Dial> dial;
    int dial_attempts = 0;
    std::chrono::steady_clock::time_point awaiting_until{};  // kAwaiting: the peer's own connection must come by then
    bool lost = false;
    bool finalized = false;  // the peer said BYE: its connection closing next is no failure
    bool linked = false;     // a link to it was up at some time
    std::string lost_why;
    // send side: slots [sent, committed) wait for the socket; [committed, committed + free) are free
    std::vector<uint8_t> send_ring;
    uint64_t committed = 0, sent = 0;
    std::deque<Outgoing> out;
    size_t out_offset = 0;  // bytes of out.front() already written
    bool sending = false;   // the I/O thread is writing out.front() with mu_ released
    // receive side: slots [released, arrived) hold whole fragments; one more may be filling
    std::vector<uint8_t> recv_ring;
    uint64_t arrived = 0, released = 0;
    size_t in_offset = 0;             // bytes of the frame being read
    std::vector<uint8_t> in_header;   // the frame header being read
    std::vector<uint8_t> in_control;  // a control frame's payload
    uint64_t entered = 0;             // highest collective the peer said it entered
    DescriptorRing descs;             // the descriptors it announced
  };

  // The links (tcp_links.cc), mu_ held.
  void want(int peer);                  // the executor needs `peer`: dial it unless linked or dialling
  void ensure_rings(Peer& p);           // the peer's rings, made when it is first wanted or linked
  void link_up(int peer, UniqueFd fd);  // this connection is the link to `peer`
  void start_dials();                   // every wanted peer not dialled yet is dialled now
  void advance_dial(int peer);          // moves a dial's handshake on
  void accept_incoming();               // new connections to the listening socket
  bool advance_incoming(Incoming& in);  // moves an accepted connection's handshake on (true: over)
  void expire_dials(std::chrono::steady_clock::time_point now);
  size_t slot_stride() const;
  uint8_t* send_slot(Peer& p, uint64_t i);
  uint8_t* recv_slot(Peer& p, uint64_t i);
  void queue_control(int peer, uint32_t type, const void* payload, size_t bytes);  // mu_ held
  void io_loop();
  // mu_ held (through `lock`), released around the socket calls.
  bool pump_out(Peer& p, std::unique_lock<std::mutex>& lock);
  bool pump_in(int r, Peer& p, std::unique_lock<std::mutex>& lock);
  void on_control(int r, Peer& p, uint32_t type);   // mu_ held
  void mark_lost(Peer& p, const std::string& why);  // mu_ held
  // The I/O thread cannot go on (`why`: what failed, with its errno text): every peer is lost and the
  // communicator aborted with that error, so that waiters raise it at once instead of timing out.
  void fail_io(const std::string& why);
  void wake_io();
  // Wakes the waiters: those of wait() (cv_), and with `ring` a composite's sleeper (its doorbell).
  void wake_waiters(bool ring);
  bool ready(const WaitItem* items, size_t n) const;                   // mu_ held: one of `items` may go on
  void throw_if_aborted();                                             // mu_ held
  bool published_descriptor(int peer, uint64_t seq, Descriptor* out);  // mu_ held

  int rank_;
  int world_;
  TcpConfig config_;
  UniqueFd listen_fd_;
  int listen_port_ = 0;
  UniqueFd wake_fd_;
  std::vector<Peer> peers_;
  std::vector<std::string> addresses_;  // set_peers (mu_)
  std::string key_;                     // empty until set_peers: no connection is accepted before
  std::chrono::steady_clock::duration dial_timeout_{};
  std::vector<std::unique_ptr<Incoming>> incoming_;              // the I/O thread's own
  std::chrono::steady_clock::time_point accept_paused_until_{};  // the I/O thread's: accept starved
  bool announce_all_ = false;
  std::vector<uint8_t> enter_;  // the last ENTER's payload, for a link made during its collective
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread io_;
  bool stop_ = false;
  bool finalizing_ = false;  // the destructor runs: a link made now is told BYE at once
  uint64_t entered_ = 0;
  bool aborted_ = false;  // an abort was raised here or received: every rank raises abort_error_
  std::unique_ptr<Error> abort_error_;
  std::atomic<uint64_t> rejected_{0};
  // A composite's doorbell, and while its rank sleeps what it waits for here (mu_): the I/O thread rings
  // the doorbell only when that is there, or when the transport fails.
  std::atomic<const Doorbell*> bell_{nullptr};
  bool armed_ = false, armed_any_ = false;
  std::vector<WaitItem> armed_items_;
};

}  // namespace pycoll
