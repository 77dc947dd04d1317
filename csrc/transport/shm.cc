#include "transport/shm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

#include "transport/announce.h"
#include "transport/futex.h"

namespace pycoll {

namespace {

constexpr uint64_t kMagic = 0x7079636f6c6c3031ull;  // "pycoll01"
constexpr uint32_t kVersion = 2;                    // 2: the descriptor ring of announce.h
constexpr size_t kFragHeaderBytes = 64;
constexpr size_t kAbortMsgBytes = 2048;

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

int64_t pidfd_open(int pid) {
  return syscall(SYS_pidfd_open, pid, 0);
}

}  // namespace

constexpr uint32_t kMaxWaitEntries = 16;
constexpr uint32_t kWakeOnAnything = ~0u;  // n_waits value: the sleeper wants every event

struct WaitEntry {
  std::atomic<int32_t> peer;
  std::atomic<uint32_t> room;
  std::atomic<uint64_t> target;  // the peer's counter value that satisfies it (head for data, tail for room)
};

struct ShmTransport::ControlBlock {
  // Written once at creation.
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t world;
  int32_t pid;
  uint64_t slot_bytes;
  uint32_t slots;
  // The owner sleeps on wake_word; while `sleeping`, waits[0..n_waits) say what would wake it.
  alignas(64) std::atomic<uint32_t> wake_word;
  std::atomic<uint32_t> sleeping;
  std::atomic<uint32_t> n_waits;
  WaitEntry waits[kMaxWaitEntries];
  // The last collective this rank entered (0: none yet).
  alignas(64) std::atomic<uint64_t> entered_seq;
  DescriptorRing descs;
  // Abort record: 0 none, 1 being written, 2 readable.
  alignas(64) std::atomic<uint32_t> abort_state;
  int32_t abort_kind;
  int32_t abort_peer;
  char abort_msg[kAbortMsgBytes];
};

struct ShmTransport::Channel {
  alignas(64) std::atomic<uint64_t> head;  // fragments committed by the owner
  alignas(64) std::atomic<uint64_t> tail;  // fragments released by the peer
};

ShmTransport::ShmTransport(int rank, int world, const ShmConfig& config) : rank_(rank), world_(world), config_(config) {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(ErrorKind::kInvalidUsage,
                "rank " + std::to_string(rank) + " out of range for world size " + std::to_string(world));
  if (config.slots < 2 || config.slot_bytes < 4096 || config.slot_bytes % 64 != 0)
    throw Error(ErrorKind::kInvalidUsage,
                "shared-memory slots must be >= 2 and slot_bytes a multiple of 64 "
                ">= 4096, got slots=" +
                    std::to_string(config.slots) + " slot_bytes=" + std::to_string(config.slot_bytes));
  channel_stride_ = round_up(sizeof(Channel), 64) + config.slots * (kFragHeaderBytes + config.slot_bytes);
  size_t control = round_up(sizeof(ControlBlock), 4096);
  size_ = control + static_cast<size_t>(world) * channel_stride_;
  size_ = round_up(size_, 4096);

  char name[64];
  std::snprintf(name, sizeof name, "pycoll-rank%d", rank);
  fd_.reset(static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC)));
  PYCOLL_CHECK_SYS(fd_.get());
  if (ftruncate(fd_.get(), static_cast<off_t>(size_)) < 0)
    throw_system_error("ftruncate(shared-memory segment)", __FILE__, __LINE__);
  void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (base == MAP_FAILED) throw_system_error("mmap(shared-memory segment)", __FILE__, __LINE__);
  segments_.reset(new std::atomic<uint8_t*>[world]);
  for (int r = 0; r < world; ++r) segments_[r].store(nullptr, std::memory_order_relaxed);
  mapped_.reset(new int[world]);
  segments_[rank].store(static_cast<uint8_t*>(base), std::memory_order_release);

  auto* cb = new (base) ControlBlock();
  cb->magic = kMagic;
  cb->version = kVersion;
  cb->rank = rank;
  cb->world = world;
  cb->pid = static_cast<int32_t>(getpid());
  cb->slot_bytes = config.slot_bytes;
  cb->slots = config.slots;
  cb->wake_word.store(0);
  cb->sleeping.store(0);
  cb->n_waits.store(0);
  cb->entered_seq.store(0);
  for (auto& d : cb->descs.slots) d.seq.store(0);
  cb->abort_state.store(0);
  // The channels' counters are not written: a memfd's pages read as zeros until written, and a counter
  // of zero is what a new channel holds. Writing them would touch a page per peer of the world, where a
  // rank of a ring uses two.
  pidfds_.resize(world);
  pids_.assign(world, 0);
  fds_.assign(world, -1);
  pids_[rank] = getpid();
  send_head_.assign(world, 0);
  send_tail_seen_.assign(world, 0);
  recv_tail_.assign(world, 0);
  recv_head_seen_.assign(world, 0);
  bell_ = Doorbell{&cb->wake_word, &cb->sleeping};
}

ShmTransport::~ShmTransport() {
  for (int r = 0; r < world_; ++r)
    if (uint8_t* s = segments_[r].load(std::memory_order_acquire)) munmap(s, size_);
}

void ShmTransport::set_peers(const std::vector<int>& pids, const std::vector<int>& fds) {
  if (static_cast<int>(pids.size()) != world_ || static_cast<int>(fds.size()) != world_)
    throw Error(ErrorKind::kInvalidUsage, "set_peers() needs one pid and one fd per rank");
  std::lock_guard<std::mutex> lock(map_mu_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    pids_[r] = pids[r];
    fds_[r] = fds[r];
  }
}

std::vector<int> ShmTransport::mapped_peers() const {
  return std::vector<int>(mapped_.get(), mapped_.get() + n_mapped_.load(std::memory_order_acquire));
}

uint8_t* ShmTransport::map_peer(int r, bool gone_ok) {
  std::lock_guard<std::mutex> lock(map_mu_);
  if (uint8_t* s = segments_[r].load(std::memory_order_acquire)) return s;  // mapped meanwhile
  if (pids_[r] <= 0)
    throw Error(ErrorKind::kInternal, "rank " + std::to_string(r) + " is not reached over shared memory");
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pids_[r], fds_[r]);
  UniqueFd fd(::open(path, O_RDWR | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (err != ENOENT && err != ESRCH)
      throw Error(ErrorKind::kPeerLost,
                  "cannot map the shared-memory segment of rank " + std::to_string(r) + " (" + path + "): " +
                      std::strerror(err) + ". All ranks of a host must run in one PID namespace as the same user",
                  r);
    if (gone_ok) return nullptr;
    throw Error(ErrorKind::kPeerLost, gone_peer(r) + " while rank " + std::to_string(rank_) + " needed it", r);
  }
  struct stat st;
  if (fstat(fd.get(), &st) < 0 || static_cast<size_t>(st.st_size) != size_)
    throw Error(ErrorKind::kMismatch, "rank " + std::to_string(r) +
                                          "'s shared-memory segment has another size: the ranks were "
                                          "configured differently (PYCOLL_SHM_SLOT_BYTES / PYCOLL_SHM_SLOTS "
                                          "or world size)");
  void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throw_system_error("mmap(peer segment)", __FILE__, __LINE__);
  fd.reset();  // the mapping holds the segment
  const auto* cb = static_cast<const ControlBlock*>(base);
  if (cb->magic != kMagic || cb->version != kVersion || cb->rank != r || cb->world != world_ ||
      cb->slot_bytes != config_.slot_bytes || cb->slots != config_.slots) {
    munmap(base, size_);
    throw Error(ErrorKind::kMismatch, "rank " + std::to_string(r) +
                                          "'s shared-memory segment does not match this rank's "
                                          "(different pycoll version, world size or slot configuration)");
  }
  pidfds_[r].reset(static_cast<int>(pidfd_open(pids_[r])));  // -1 (ENOSYS/EPERM): fall back to /proc
  const int n = n_mapped_.load(std::memory_order_relaxed);
  mapped_[n] = r;
  n_mapped_.store(n + 1, std::memory_order_release);
  segments_[r].store(static_cast<uint8_t*>(base), std::memory_order_release);
  return static_cast<uint8_t*>(base);
}

// Rank r's segment is gone: its process exited, or is leaving (it finalized its communicator, which
// closed the segment, and its interpreter is still winding down). A leaving one is given a moment to be
// gone first (kLeavingGrace), so that whoever watches the processes (a launcher) sees it end before this
// rank, whose failure it caused; one that keeps running after finalizing is named as such.
std::string ShmTransport::gone_peer(int r) {
  constexpr auto kLeavingGrace = std::chrono::seconds(1);
  const std::string who = "rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) + ")";
  UniqueFd pidfd(static_cast<int>(pidfd_open(pids_[r])));
  if (!pidfd) return who + " has exited";  // ESRCH: gone (or pidfds unavailable: said the same way)
  struct pollfd p = {pidfd.get(), POLLIN, 0};
  const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(kLeavingGrace).count());
  if (::poll(&p, 1, ms) > 0) return who + " has exited";
  return who + " left its communicator (it finalized it)";
}

ShmTransport::Channel* ShmTransport::channel(int owner, int peer) {
  size_t control_bytes = round_up(sizeof(ControlBlock), 4096);
  return reinterpret_cast<Channel*>(segment(owner) + control_bytes + peer * channel_stride_);
}

uint8_t* ShmTransport::slot(Channel* ch, uint64_t index) const {
  return reinterpret_cast<uint8_t*>(ch) + round_up(sizeof(Channel), 64) +
         (index % config_.slots) * (kFragHeaderBytes + config_.slot_bytes);
}

void* ShmTransport::acquire_send(int peer) {
  if (send_head_[peer] - send_tail_seen_[peer] >= config_.slots) {
    send_tail_seen_[peer] = channel(rank_, peer)->tail.load(std::memory_order_acquire);
    if (send_head_[peer] - send_tail_seen_[peer] >= config_.slots) return nullptr;
  }
  return slot(channel(rank_, peer), send_head_[peer]) + kFragHeaderBytes;
}

void ShmTransport::commit_send(int peer, const FragHeader& h) {
  Channel* ch = channel(rank_, peer);
  std::memcpy(slot(ch, send_head_[peer]), &h, sizeof h);
  ch->head.store(++send_head_[peer], std::memory_order_release);
  notify(peer, false, send_head_[peer]);
}

const void* ShmTransport::peek_recv(int peer, FragHeader* h) {
  Channel* ch = channel(peer, rank_);
  if (recv_tail_[peer] == recv_head_seen_[peer]) {
    recv_head_seen_[peer] = ch->head.load(std::memory_order_acquire);
    if (recv_tail_[peer] == recv_head_seen_[peer]) return nullptr;
  }
  const uint8_t* s = slot(ch, recv_tail_[peer]);
  std::memcpy(h, s, sizeof *h);
  return s + kFragHeaderBytes;
}

void ShmTransport::release_recv(int peer) {
  channel(peer, rank_)->tail.store(++recv_tail_[peer], std::memory_order_release);
  notify(peer, true, recv_tail_[peer]);
}

// The sleeper and its peers pair a store, a seq_cst fence and a load (the sleeper: `sleeping`, then the
// channel counters; a peer: a channel counter, then `sleeping`), so at least one of them sees the other:
// either the sleeper notices the new fragment or slot before it sleeps, or the peer sees it asleep.
void ShmTransport::notify(int peer, bool room, uint64_t counter) {
  ControlBlock* cb = control(peer);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (cb->sleeping.load(std::memory_order_relaxed) == 0) return;
  uint32_t n = cb->n_waits.load(std::memory_order_acquire);
  if (n == kWakeOnAnything) return wake(peer);
  for (uint32_t i = 0; i < n && i < kMaxWaitEntries; ++i) {
    const WaitEntry& e = cb->waits[i];
    if (e.peer.load(std::memory_order_relaxed) == rank_ && (e.room.load(std::memory_order_relaxed) != 0) == room &&
        counter >= e.target.load(std::memory_order_relaxed))
      return wake(peer);
  }
}

void ShmTransport::wake(int peer) {
  ControlBlock* cb = control(peer);
  cb->wake_word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&cb->wake_word);
}

bool ShmTransport::satisfied(const WaitItem& item, uint64_t* available) {
  const uint64_t slots = config_.slots;
  if (item.room) {
    uint64_t tail = channel(rank_, item.peer)->tail.load(std::memory_order_acquire);
    *available = slots - (send_head_[item.peer] - tail);
  } else {
    uint64_t head = channel(item.peer, rank_)->head.load(std::memory_order_acquire);
    *available = head - recv_tail_[item.peer];
  }
  uint64_t want = std::min<uint64_t>(std::max<uint32_t>(item.fragments, 1), slots / 2);
  return *available >= want;
}

void ShmTransport::wake_partial_waiters() {
  const uint64_t slots = config_.slots;
  const int mapped = n_mapped_.load(std::memory_order_acquire);
  for (int i = 0; i < mapped; ++i) {
    const int q = mapped_[i];
    ControlBlock* cb = control(q);
    if (cb->sleeping.load(std::memory_order_relaxed) == 0) continue;
    uint32_t n = cb->n_waits.load(std::memory_order_acquire);
    bool partial = n == kWakeOnAnything;
    for (uint32_t i = 0; !partial && i < n && i < kMaxWaitEntries; ++i) {
      const WaitEntry& e = cb->waits[i];
      if (e.peer.load(std::memory_order_relaxed) != rank_) continue;
      if (e.room.load(std::memory_order_relaxed)) {  // q waits for room in its ring to this rank
        partial = channel(q, rank_)->head.load(std::memory_order_acquire) - recv_tail_[q] < slots;
      } else {  // q waits for data from this rank
        partial = send_head_[q] > channel(rank_, q)->tail.load(std::memory_order_acquire);
      }
    }
    if (partial) wake(q);
  }
}

bool ShmTransport::arm(const WaitItem* items, size_t n, bool any) {
  ControlBlock* cb = control(rank_);
  const uint64_t slots = config_.slots;
  if (any || n > kMaxWaitEntries) {
    cb->n_waits.store(kWakeOnAnything, std::memory_order_release);
  } else {
    for (size_t i = 0; i < n; ++i) {
      const WaitItem& it = items[i];
      uint64_t want = std::min<uint64_t>(std::max<uint32_t>(it.fragments, 1), slots / 2);
      uint64_t target = it.room ? send_head_[it.peer] - slots + want : recv_tail_[it.peer] + want;
      cb->waits[i].peer.store(it.peer, std::memory_order_relaxed);
      cb->waits[i].room.store(it.room ? 1 : 0, std::memory_order_relaxed);
      cb->waits[i].target.store(target, std::memory_order_relaxed);
    }
    cb->n_waits.store(static_cast<uint32_t>(n), std::memory_order_release);  // 0: nothing here wakes it
  }
  cb->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Look once more: enough has arrived, or a little has and its producer sleeps too (it will not send
  // more until someone wakes it, so waiting for a full batch would stall both).
  bool go = false;
  for (size_t i = 0; !go && i < n; ++i) {
    uint64_t available = 0;
    go = satisfied(items[i], &available) ||
         (available > 0 && control(items[i].peer)->sleeping.load(std::memory_order_relaxed) != 0);
  }
  return go;
}

void ShmTransport::disarm() {
  control(rank_)->sleeping.store(0, std::memory_order_relaxed);
}

void ShmTransport::ring_also(const Doorbell* bell) {
  if (bell && bell != &bell_)
    throw Error(ErrorKind::kInternal, "the shared-memory transport can ring only its own doorbell");
}

void ShmTransport::wait(const WaitItem* items, size_t n, int64_t timeout_ns) {
  ControlBlock* cb = control(rank_);
  const uint32_t word = cb->wake_word.load(std::memory_order_acquire);
  if (!arm(items, n, n == 0)) {
    before_sleep();
    try {
      futex_wait(&cb->wake_word, word, timeout_ns);
    } catch (...) {
      disarm();
      throw;
    }
  }
  disarm();
}

void ShmTransport::begin_collective(uint64_t seq, const Descriptor& desc, const EntryStamp& stamp) {
  throw_if_aborted();
  ControlBlock* cb = control(rank_);
  cb->descs.publish(seq, desc, stamp);
  cb->entered_seq.store(seq, std::memory_order_release);
}

// After a collective (the skew report): a peer that left since has no stamp, and the call that finished
// does not fail for it.
bool ShmTransport::entry_stamp(int peer, uint64_t seq, EntryStamp* out) {
  if (pids_[peer] <= 0) return false;
  const uint8_t* s = nullptr;
  try {
    s = try_segment(peer);
  } catch (const Error&) {
    return false;
  }
  return s && reinterpret_cast<const ControlBlock*>(s)->descs.find_stamp(seq, out);
}

// A peer not mapped has published nothing this rank waits for (it never exchanged a fragment with it).
bool ShmTransport::published_descriptor(int peer, uint64_t seq, Descriptor* out) {
  const uint8_t* s = segments_[peer].load(std::memory_order_acquire);
  return s && reinterpret_cast<const ControlBlock*>(s)->descs.find(seq, out);
}

// Every rank's abort record is read; the one raised is the first in rank order, unless a later one
// supersedes it (abort_supersedes: a revocation yields to the error it reacted to).
void ShmTransport::throw_if_aborted() {
  const ControlBlock* raised = nullptr;
  for (int r = 0; r < world_; ++r) {
    const uint8_t* s = segments_[r].load(std::memory_order_acquire);
    if (!s) continue;
    const auto* cb = reinterpret_cast<const ControlBlock*>(s);
    if (cb->abort_state.load(std::memory_order_acquire) != 2) continue;
    if (!raised || abort_supersedes(static_cast<ErrorKind>(raised->abort_kind), static_cast<ErrorKind>(cb->abort_kind)))
      raised = cb;
  }
  if (raised) {
    std::string msg(raised->abort_msg, strnlen(raised->abort_msg, kAbortMsgBytes));
    throw Error(static_cast<ErrorKind>(raised->abort_kind), msg, raised->abort_peer);
  }
}

void ShmTransport::abort(const Error& error) {
  ControlBlock* cb = control(rank_);
  uint32_t expected = 0;
  if (!cb->abort_state.compare_exchange_strong(expected, 1)) return;  // this rank already aborted
  cb->abort_kind = static_cast<int32_t>(error.kind());
  cb->abort_peer = error.peer();
  const std::string msg = reported_by(rank_, error.what());
  std::strncpy(cb->abort_msg, msg.c_str(), kAbortMsgBytes - 1);
  cb->abort_msg[kAbortMsgBytes - 1] = '\0';
  cb->abort_state.store(2, std::memory_order_release);
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && segments_[r].load(std::memory_order_acquire)) wake(r);
}

// The peers this rank exchanged fragments with (mapped): one that exited while this rank waits for it
// never answers.
void ShmTransport::check_peers_alive() {
  const int mapped = n_mapped_.load(std::memory_order_acquire);
  for (int i = 0; i < mapped; ++i) {
    const int r = mapped_[i];
    bool dead = false;
    if (pidfds_[r]) {
      struct pollfd p = {pidfds_[r].get(), POLLIN, 0};
      int rc = ::poll(&p, 1, 0);
      PYCOLL_CHECK_SYS(rc);
      dead = rc > 0;  // a pidfd becomes readable when its process exits
    } else {
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%d/stat", pids_[r]);
      FILE* f = std::fopen(path, "r");
      if (!f) {
        dead = true;
      } else {
        char buf[256] = {0};
        size_t n = std::fread(buf, 1, sizeof buf - 1, f);
        std::fclose(f);
        const char* close_paren = std::strrchr(buf, ')');
        dead = n == 0 || !close_paren || close_paren[2] == 'Z' || close_paren[2] == 'X';
      }
    }
    if (dead)
      throw Error(ErrorKind::kPeerLost,
                  "rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) + ") exited while rank " +
                      std::to_string(rank_) + " depended on it; the communicator cannot be used any more",
                  r);
  }
}

void ShmTransport::check_health(const WaitContext& ctx) {
  throw_if_aborted();
  check_peers_alive();
  check_descriptors(rank_, world_, ctx,
                    [this](int peer, uint64_t seq, Descriptor* out) { return published_descriptor(peer, seq, out); });
}

// Maps every peer of this host (on the way to a timeout's message only): one that cannot be (it exited)
// has not entered.
std::vector<int> ShmTransport::ranks_not_entered(uint64_t seq) {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r) {
    if (pids_[r] <= 0) continue;
    bool entered = false;
    try {
      const uint8_t* s = try_segment(r);
      entered = s && reinterpret_cast<const ControlBlock*>(s)->entered_seq.load(std::memory_order_acquire) >= seq;
    } catch (const Error&) {
    }
    if (!entered) out.push_back(r);
  }
  return out;
}

void ShmTransport::raise_header_mismatch(int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                                         uint64_t expected_msg_bytes) {
  throw_header_mismatch_from(rank_, peer, got, seq, desc, expected_msg_bytes,
                             [this](int p, uint64_t s, Descriptor* out) { return published_descriptor(p, s, out); });
}

}  // namespace pycoll
