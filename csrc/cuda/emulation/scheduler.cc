// The scheduler of the emulation (emulation.h): a grid's blocks one after another, a block's threads as
// plain calls on a runner fiber until one waits, warp operations and barriers as rendezvous.
//
// Names used below:
//   thread      one emulated CUDA thread of the current block (Thread), linear id = x + y*bx + z*bx*by;
//               its warp is id / 32 and its lane id % 32.
//   runner      a fiber that takes the next pending thread, calls the kernel for it and, when the call
//               returns, takes the next. A thread that waits keeps its runner; the scheduler starts a
//               new runner for the threads still pending.
//   pending     threads not started yet, in the schedule's order.
//   ready       threads released by a completed rendezvous or barrier, waiting to be resumed.
//   rendezvous  the lanes of one warp waiting in one warp operation: opened by the first lane of its
//               mask to arrive (with its call site, operation, mask and width), complete when every lane of
//               the mask that has not exited has arrived (lanes past the end of a partial warp count as
//               exited); masks of one warp that do not overlap are separate rendezvous.
//   fault       what CUDA leaves undefined, and a call-site mismatch: the launch stops and reports it.
//
// The semantics are CUDA's where it defines them: exited lanes take no part in __syncwarp and the votes
// (a ballot has 0 for them); a shuffle source out of range is the caller's own value (up / down past the
// width's segment, xor into a later segment) or taken modulo the width (__shfl_sync). Faults: a mask that
// leaves out the caller; a width that is not a power of two in [1, 32]; a shuffle that reads a lane outside
// its mask, or one that exited or does not exist; a lane that waits at another call site, operation, mask
// or width than the lanes it overlaps (stricter than sm_70 and later, where different shfl.sync
// instructions may pair up: kernels that rely on it are fragile); __syncthreads at two call sites, or after
// a thread of the block exited (the CUDA guide leaves barriers in divergent code undefined); a deadlock.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "cuda/emulation/cuda_emulation.h"
#include "cuda/emulation/fiber.h"
#include "cuda/emulation/runtime.h"

namespace pycoll::emulation::detail {
namespace {

constexpr uint32_t kWarp = 32;

enum class State : uint8_t { kPending, kRunning, kWaiting, kReady, kExited };

struct Wait {
  WarpOp op;
  int arg;
  uint64_t value;
  uint64_t result;
};

struct Thread {
  ThreadIndex index;
  uint32_t id = 0;
  State state = State::kPending;
  Fiber* fiber = nullptr;
  Wait wait{};
};

struct Rendezvous {
  WarpOp op;
  const char* file;
  int line;
  unsigned mask;
  int width;
  unsigned arrived;
};

struct Warp {
  unsigned present = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;   // lanes that returned from the kernel, and those that do not exist
  std::vector<Rendezvous> open;
};

struct Barrier {
  const char* file = nullptr;
  int line = 0;
  uint32_t arrived = 0;
};

// The launch in progress (one at a time: launch_mutex).
struct Launch {
  dim3 grid, block;
  Body body = nullptr;
  const void* call = nullptr;
  Order order = Order::kInOrder;
  std::mt19937_64 rng;
  LaunchRecord record;

  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::vector<uint32_t> pending;
  size_t next_pending = 0;
  std::deque<uint32_t> ready;
  uint32_t waiting = 0;
  const Thread* first_exited = nullptr;
  bool out_of_memory = false;
  Barrier barrier;

  Thread* current = nullptr;
  Fiber* starting = nullptr;  // the runner being started
  Fiber* finished = nullptr;  // a runner that ran out of pending threads
  std::vector<Fiber*> busy;   // fibers taken for this block
  std::string fault;
};

std::mutex launch_mutex;
Launch L;

// ---- messages ------------------------------------------------------------------------------------------------
std::string index_text(const uint3& i, const dim3& of) {
  if (of.y == 1 && of.z == 1) return std::to_string(i.x);
  return "(" + std::to_string(i.x) + "," + std::to_string(i.y) + "," + std::to_string(i.z) + ")";
}
std::string who(const Thread& t) {
  return "thread " + index_text(t.index.thread, t.index.block_dim) + " of block " +
         index_text(t.index.block, t.index.grid_dim) + " (warp " + std::to_string(t.id / kWarp) + ", lane " +
         std::to_string(t.id % kWarp) + ")";
}
// "codec.cu:412": the last two parts of the path the compiler was given.
std::string site(const char* file, int line) {
  const char* f = file ? file : "?";
  const char* last = std::strrchr(f, '/');
  if (last && last != f) {
    const char* prev = last - 1;
    while (prev > f && *prev != '/') --prev;
    f = *prev == '/' ? prev + 1 : f;
  }
  return std::string(f) + ":" + std::to_string(line);
}
std::string lanes(unsigned mask) {
  std::string s;
  for (uint32_t l = 0; l < kWarp;) {
    if (!((mask >> l) & 1u)) {
      ++l;
      continue;
    }
    uint32_t e = l;
    while (e + 1 < kWarp && ((mask >> (e + 1)) & 1u)) ++e;
    if (!s.empty()) s += ",";
    s += e == l ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e);
    l = e + 1;
  }
  return (mask & (mask - 1)) == 0 ? "lane " + s : "lanes " + s;
}
std::string hex(unsigned mask) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", mask);
  return buf;
}
const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShfl:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kSyncwarp:
      return "__syncwarp";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
  }
  return "?";
}
std::string call_text(WarpOp op, const char* file, int line, unsigned mask, int width) {
  std::string s = std::string(op_name(op)) + "(mask " + hex(mask);
  if (width != static_cast<int>(kWarp)) s += ", width " + std::to_string(width);
  return s + ") at " + site(file, line);
}

// ---- faults -------------------------------------------------------------------------------------------------
// From a thread's fiber: the launch stops here (the scheduler gives every fiber of the block back). The
// message is complete, and its temporaries gone, before the switch: nothing that owns memory is left on the
// stack it abandons (so no caller below may hold a string or vector of its own).
#define FAULT(message)   \
  do {                   \
    L.fault = (message); \
    finish();            \
  } while (0)

// ---- order --------------------------------------------------------------------------------------------------
void order_ids(std::vector<uint32_t>& ids) {
  if (L.order == Order::kReversed) std::reverse(ids.begin(), ids.end());
  if (L.order == Order::kRandom) std::shuffle(ids.begin(), ids.end(), L.rng);
}
void release(std::vector<uint32_t>& ids) {
  order_ids(ids);
  for (uint32_t id : ids) {
    Thread& t = L.threads[id];
    if (t.state == State::kWaiting) --L.waiting;
    t.state = State::kReady;
    L.ready.push_back(id);
  }
}
// Whether a released thread goes before a pending one (emulation.h Order).
bool ready_first() {
  switch (L.order) {
    case Order::kInOrder:
      return true;
    case Order::kReversed:
      return false;
    case Order::kRandom:
      return (L.rng() & 1u) != 0;
  }
  return true;
}

// ---- warp operations ----------------------------------------------------------------------------------------
void check_call(const Thread& t, WarpOp op, unsigned mask, int width, const char* file, int line) {
  const unsigned me = 1u << (t.id % kWarp);
  const auto call = [&] { return call_text(op, file, line, mask, width); };  // no string lives across a fault
  if (!(mask & me)) FAULT(who(t) + " calls " + call() + ", whose mask leaves out its own lane");
  if (width < 1 || width > static_cast<int>(kWarp) || (width & (width - 1)) != 0)
    FAULT(who(t) + " calls " + call() + ": the width must be a power of two in [1, 32]");
}

// The lane whose value lane `l` receives, for the shuffles (CUDA's rules for sources out of range).
uint32_t source_lane(WarpOp op, uint32_t l, int arg, int width) {
  const uint32_t w = static_cast<uint32_t>(width), a = static_cast<uint32_t>(arg);
  switch (op) {
    case WarpOp::kShfl:
      return (l & ~(w - 1)) | (a & (w - 1));
    case WarpOp::kShflUp:
      return (l & (w - 1)) >= a ? l - a : l;
    case WarpOp::kShflDown:
      return static_cast<uint64_t>(l & (w - 1)) + a < w ? l + a : l;
    case WarpOp::kShflXor: {
      const uint32_t src = l ^ a;
      return src > (l | (w - 1)) ? l : src;  // a later segment (or past the warp): its own value
    }
    default:
      return l;
  }
}

// Whether every lane of `r`'s mask has arrived or exited.
bool all_arrived(const Warp& warp, const Rendezvous& r) {
  return (r.mask & ~warp.exited & ~r.arrived) == 0;
}

// Every lane of `r` that has not exited has arrived: each one's result, then all of them released. (The
// sources are checked first, while no vector is alive: a fault abandons this frame.)
void complete(uint32_t warp, const Rendezvous& r) {
  const uint32_t base = warp * kWarp;
  const Warp& w = L.warps[warp];
  const bool shuffle =
      r.op == WarpOp::kShfl || r.op == WarpOp::kShflUp || r.op == WarpOp::kShflDown || r.op == WarpOp::kShflXor;
  unsigned votes = 0;
  for (uint32_t l = 0; l < kWarp; ++l) {
    if (!((r.arrived >> l) & 1u)) continue;
    const Thread& t = L.threads[base + l];
    if (t.wait.value != 0) votes |= 1u << l;
    const uint32_t src = shuffle ? source_lane(r.op, l, t.wait.arg, r.width) : l;
    if ((r.arrived >> src) & 1u) continue;
    const char* why = !((r.mask >> src) & 1u)     ? ", a lane outside the mask"
                      : ((w.present >> src) & 1u) ? ", which exited"
                                                  : ", which does not exist (a partial warp)";
    FAULT(who(t) + " reads lane " + std::to_string(src) + " in " + call_text(r.op, r.file, r.line, r.mask, r.width) +
          why);
  }
  std::vector<uint32_t> ids;
  for (uint32_t l = 0; l < kWarp; ++l) {
    if (!((r.arrived >> l) & 1u)) continue;
    Thread& t = L.threads[base + l];
    switch (r.op) {
      case WarpOp::kBallot:
        t.wait.result = votes;
        break;
      case WarpOp::kAny:
        t.wait.result = votes != 0;
        break;
      case WarpOp::kAll:
        t.wait.result = votes == r.arrived;
        break;
      case WarpOp::kSyncwarp:
        t.wait.result = 0;
        break;
      default:
        t.wait.result = L.threads[base + source_lane(r.op, l, t.wait.arg, r.width)].wait.value;
    }
    ids.push_back(base + l);
  }
  ++L.record.warp_ops;
  release(ids);
}

}  // namespace

const ThreadIndex& here() {
  return L.current->index;
}

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  Thread& t = *L.current;
  const uint32_t w = t.id / kWarp;
  Warp& warp = L.warps[w];
  check_call(t, op, mask, width, file, line);
  auto it = std::find_if(warp.open.begin(), warp.open.end(), [&](const Rendezvous& r) { return (r.mask & mask) != 0; });
  if (it == warp.open.end()) {
    warp.open.push_back(Rendezvous{op, file, line, mask, width, 0});
    it = warp.open.end() - 1;
  } else if (it->op != op || it->line != line || std::strcmp(it->file, file) != 0 || it->mask != mask ||
             it->width != width) {
    FAULT(who(t) + " calls " + call_text(op, file, line, mask, width) + " while " + lanes(it->arrived) +
          " of its warp waited in " + call_text(it->op, it->file, it->line, it->mask, it->width));
  }
  it->arrived |= 1u << (t.id % kWarp);
  t.wait = Wait{op, arg, value, 0};
  if (all_arrived(warp, *it)) {
    const Rendezvous r = *it;
    warp.open.erase(it);
    complete(w, r);
  } else {
    t.state = State::kWaiting;
    ++L.waiting;
  }
  leave(t.fiber);
  return t.wait.result;
}

void block_barrier(const char* file, int line) {
  Thread& t = *L.current;
  if (L.first_exited)
    FAULT(who(t) + " calls __syncthreads at " + site(file, line) + " after " + who(*L.first_exited) + " exited");
  if (L.barrier.arrived > 0 && (L.barrier.line != line || std::strcmp(L.barrier.file, file) != 0))
    FAULT(who(t) + " calls __syncthreads at " + site(file, line) + " while " + std::to_string(L.barrier.arrived) +
          " threads of its block waited in __syncthreads at " + site(L.barrier.file, L.barrier.line));
  L.barrier.file = file;
  L.barrier.line = line;
  t.state = State::kWaiting;
  ++L.waiting;
  if (++L.barrier.arrived == L.threads.size()) {
    std::vector<uint32_t> ids(L.threads.size());
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
    L.barrier = Barrier{};
    ++L.record.barriers;
    release(ids);
  }
  leave(t.fiber);
}

namespace {

// A thread returned from the kernel. Rendezvous that waited only for it complete without it.
void thread_exited(Thread& t) {
  t.state = State::kExited;
  if (!L.first_exited) L.first_exited = &t;
  const unsigned me = 1u << (t.id % kWarp);
  const uint32_t w = t.id / kWarp;
  Warp& warp = L.warps[w];
  warp.exited |= me;
  if (L.barrier.arrived > 0)
    FAULT(who(t) + " exited while " + std::to_string(L.barrier.arrived) +
          " threads of its block waited in __syncthreads at " + site(L.barrier.file, L.barrier.line));
  for (size_t i = 0; i < warp.open.size();) {
    if ((warp.open[i].mask & me) && all_arrived(warp, warp.open[i])) {
      const Rendezvous r = warp.open[i];
      warp.open.erase(warp.open.begin() + static_cast<std::ptrdiff_t>(i));
      complete(w, r);
    } else {
      ++i;
    }
  }
  ++L.record.threads;
}

// A runner's entry (the names above). Nothing may unwind past it (it is the bottom of its stack): the
// scheduler's own allocations failing in a thread's warp operation stop the launch as a fault.
void runner() {
  started();
  Fiber* self = L.starting;
  try {
    while (L.next_pending < L.pending.size()) {
      Thread& t = L.threads[L.pending[L.next_pending++]];
      t.fiber = self;
      t.state = State::kRunning;
      L.current = &t;
      L.body(L.call);
      thread_exited(t);
    }
  } catch (const std::bad_alloc&) {
    L.out_of_memory = true;
    FAULT("out of memory in the emulation's scheduler");
  }
  L.finished = self;
  finish();
}

// After the scheduler's switch into a fiber returns: a runner that finished goes back to the pool.
void after_switch() {
  if (!L.finished) return;
  L.busy.erase(std::find(L.busy.begin(), L.busy.end(), L.finished));
  give_back(L.finished, false);
  L.finished = nullptr;
}

std::string deadlock() {
  std::string s = "no thread of block " + index_text(L.threads[0].index.block, L.grid) +
                  " can go on (a warp operation or barrier that some thread never reaches):";
  for (size_t w = 0; w < L.warps.size(); ++w)
    for (const Rendezvous& r : L.warps[w].open)
      s += " in warp " + std::to_string(w) + ", " + lanes(r.arrived) + " waited in " +
           call_text(r.op, r.file, r.line, r.mask, r.width) + ";";
  if (L.barrier.arrived > 0)
    s += " " + std::to_string(L.barrier.arrived) + " threads waited in __syncthreads at " +
         site(L.barrier.file, L.barrier.line) + ";";
  return s;
}

void setup_block(uint64_t linear) {
  const dim3 g = L.grid, b = L.block;
  const uint3 block_index{static_cast<unsigned>(linear % g.x), static_cast<unsigned>(linear / g.x % g.y),
                          static_cast<unsigned>(linear / (static_cast<uint64_t>(g.x) * g.y))};
  const uint32_t n = static_cast<uint32_t>(L.threads.size());
  for (uint32_t id = 0; id < n; ++id) {
    Thread& t = L.threads[id];
    t.index = ThreadIndex{{id % b.x, id / b.x % b.y, id / (b.x * b.y)}, block_index, b, g};
    t.id = id;
    t.state = State::kPending;
    t.fiber = nullptr;
  }
  for (uint32_t w = 0; w < L.warps.size(); ++w) {
    const uint32_t count = std::min(kWarp, n - w * kWarp);
    L.warps[w] = Warp{};
    L.warps[w].present = count == kWarp ? ~0u : (1u << count) - 1u;
    L.warps[w].exited = ~L.warps[w].present;
  }
  L.pending.resize(n);
  for (uint32_t id = 0; id < n; ++id) L.pending[id] = id;
  order_ids(L.pending);
  L.next_pending = 0;
  L.ready.clear();
  L.waiting = 0;
  L.first_exited = nullptr;
  L.barrier = Barrier{};
}

// Runs the block until every thread exited or a fault; returns false on a fault.
bool run_block(uint64_t linear) {
  setup_block(linear);
  for (;;) {
    if (!L.fault.empty()) return false;
    const bool have_ready = !L.ready.empty(), have_pending = L.next_pending < L.pending.size();
    if (have_ready && (!have_pending || ready_first())) {
      Thread& t = L.threads[L.ready.front()];
      L.ready.pop_front();
      t.state = State::kRunning;
      L.current = &t;
      enter(t.fiber);
    } else if (have_pending) {
      L.starting = take_fiber(runner);
      L.busy.push_back(L.starting);
      enter(L.starting);
    } else if (L.waiting > 0) {
      L.fault = deadlock();
      return false;
    } else {
      return true;
    }
    after_switch();
  }
}

// The order of the grid's blocks: a seeded shuffle up to 2^22 blocks, a seeded affine permutation above.
class BlockOrder {
 public:
  explicit BlockOrder(uint64_t n) : n_(n) {
    if (L.order != Order::kRandom) return;
    if (n <= (1u << 22)) {
      shuffled_.resize(n);
      for (uint64_t i = 0; i < n; ++i) shuffled_[i] = static_cast<uint32_t>(i);
      std::shuffle(shuffled_.begin(), shuffled_.end(), L.rng);
    } else {
      do mul_ = L.rng() % n | 1u;
      while (gcd(mul_, n) != 1);
      add_ = L.rng() % n;
    }
  }
  uint64_t operator[](uint64_t i) const {
    if (L.order == Order::kInOrder) return i;
    if (L.order == Order::kReversed) return n_ - 1 - i;
    if (!shuffled_.empty()) return shuffled_[i];
    return static_cast<uint64_t>((static_cast<unsigned __int128>(mul_) * i + add_) % n_);
  }

 private:
  static uint64_t gcd(uint64_t a, uint64_t b) { return b ? gcd(b, a % b) : a; }
  uint64_t n_;
  std::vector<uint32_t> shuffled_;
  uint64_t mul_ = 1, add_ = 0;
};

// Why the current device cannot run this configuration, empty when it can (launch.cuh's check names the
// configuration itself).
std::string configuration_problem(dim3 grid, dim3 block, size_t shared_bytes) {
  const DeviceShape shape = current_shape();
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "a grid dimension is 0";
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u) return "the grid exceeds (2147483647, 65535, 65535)";
  if (block.x == 0 || block.y == 0 || block.z == 0) return "a block dimension is 0";
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads > static_cast<uint64_t>(shape.max_threads_per_block))
    return "a block of " + std::to_string(threads) + " threads, more than the device's " +
           std::to_string(shape.max_threads_per_block);
  if (block.z > 64) return "a block deeper than 64 threads in z";
  if (shared_bytes > 0) return std::to_string(shared_bytes) + " bytes of dynamic shared memory (not emulated)";
  return std::string();
}

void run_launch(const Schedule& schedule) {
  const uint64_t nblocks = static_cast<uint64_t>(L.grid.x) * L.grid.y * L.grid.z;
  const uint32_t nthreads = L.block.x * L.block.y * L.block.z;
  L.order = schedule.order;
  L.rng.seed(schedule.seed);
  L.threads.assign(nthreads, Thread{});
  L.warps.assign((nthreads + kWarp - 1) / kWarp, Warp{});
  L.fault.clear();
  L.busy.clear();
  L.finished = nullptr;
  const BlockOrder order(nblocks);
  for (uint64_t i = 0; i < nblocks; ++i) {
    if (!run_block(order[i])) break;
  }
}

}  // namespace

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, Body body, const void* call) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  L.record = LaunchRecord{grid, block, shared_bytes};
  const std::string problem = configuration_problem(grid, block, shared_bytes);
  if (!problem.empty()) {
    set_last_launch(L.record);
    set_last_error(cudaErrorInvalidConfiguration, problem);
    return;
  }
  L.grid = grid;
  L.block = block;
  L.body = body;
  L.call = call;
  L.record.ran = true;
  const uint64_t switches_before = switch_count();
  L.out_of_memory = false;
  try {
    run_launch(current_schedule());
  } catch (const std::bad_alloc&) {
    L.out_of_memory = true;
    L.fault = "out of memory in the emulation's scheduler (a fiber's stack, or its thread tables)";
  }
  const cudaError_t err = L.out_of_memory ? cudaErrorMemoryAllocation : cudaErrorLaunchFailure;
  // A fault abandons the fibers of its block where they stand: back to the pool, reset when next taken.
  for (Fiber* f : L.busy) give_back(f, true);
  L.busy.clear();
  L.current = nullptr;
  L.record.switches = switch_count() - switches_before;
  set_last_launch(L.record);
  if (!L.fault.empty()) set_last_error(err, L.fault);
}

}  // namespace pycoll::emulation::detail
