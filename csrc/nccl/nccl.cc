// NCCL through dlopen (see nccl.h). The library is opened once per process; its entry points live in one
// table that is written under a mutex before `loaded` is published and only read after.
//
// Non-blocking mode: communicators are created with ncclConfig_t blocking = 0, so no NCCL call waits for
// other ranks inside NCCL. A call that needs them (init, the launch in the outermost ncclGroupEnd,
// ncclCommFinalize, and any collective NCCL has not finished taking) returns ncclInProgress, and
// wait_ready() polls ncclCommGetAsyncError until the state leaves ncclInProgress or the communicator's
// deadline passes; then ncclCommAbort frees it and kTimeout names the rank and the communicator size.
#include "nccl/nccl.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "pycoll/errors.h"

namespace pycoll::nccl {
namespace {

// ---------------------------------------------------------------------------------------------------
// NCCL's ABI, declared from its documented header (NVIDIA/nccl, src/nccl.h.in; checked against the
// nccl.h that nvidia-nccl-cu13 2.32.3 ships). The enums are int-sized and passed as int.

using ncclResult = int;
constexpr ncclResult kSuccess = 0;
constexpr ncclResult kRemoteError = 6;  // a peer failed (NCCL >= 2.13)
constexpr ncclResult kInProgress = 7;   // non-blocking communicator: the call has not finished yet

const char* result_name(ncclResult r) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress",         "ncclTimeout"};
  return (r >= 0 && r < static_cast<int>(sizeof(names) / sizeof(names[0]))) ? names[r] : "unknown ncclResult_t";
}

// ncclDataType_t and ncclRedOp_t codes.
enum NcclType : int {
  kI8 = 0,
  kU8 = 1,
  kI32 = 2,
  kU32 = 3,
  kI64 = 4,
  kU64 = 5,
  kF16 = 6,
  kF32 = 7,
  kF64 = 8,
  kBF16 = 9
};
enum NcclOp : int { kOpSum = 0, kOpProd = 1, kOpMax = 2, kOpMin = 3, kOpAvg = 4 };

// ncclUniqueId: passed by value to ncclCommInitRankConfig (a 128-byte struct, so in memory).
struct NcclUniqueId {
  char internal[128];
};

// ncclConfig_t as NCCL 2.14 (the first release with ncclCommInitRankConfig and non-blocking mode)
// declared it: size, magic, version, blocking. Every later release appends fields only, copies
// min(size, sizeof(its own ncclConfig_t)) bytes of the caller's struct over its NCCL_CONFIG_INITIALIZER
// defaults, checks `magic`, and resets to their defaults the fields introduced after `version` (src/init.cc,
// parseCommConfig). So this prefix, declared as version 2.14.0, reads as "blocking = 0, all else default"
// to 2.14 and to every newer NCCL alike. `unset` is the padding a 24-byte struct has anyway: it overlaps
// cgaClusterSize (2.17+), which the version check resets; it holds NCCL_CONFIG_UNDEF_INT to be doubly safe.
struct ConfigV2_14 {
  size_t size = sizeof(ConfigV2_14);
  unsigned int magic = 0xcafebeef;  // NCCL_API_MAGIC
  unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0)
  int blocking = 0;
  int unset = INT_MIN;  // NCCL_CONFIG_UNDEF_INT
};
static_assert(sizeof(ConfigV2_14) == 24, "ncclConfig_t prefix layout");

using Stream = cudaStream_t;
struct Api {
  ncclResult (*GetVersion)(int*);
  ncclResult (*GetUniqueId)(NcclUniqueId*);
  ncclResult (*CommInitRankConfig)(void**, int, NcclUniqueId, int, ConfigV2_14*);
  ncclResult (*CommDestroy)(void*);
  ncclResult (*CommAbort)(void*);
  ncclResult (*CommGetAsyncError)(void*, ncclResult*);
  const char* (*GetErrorString)(ncclResult);
  const char* (*GetLastError)(void*);
  ncclResult (*AllReduce)(const void*, void*, size_t, int, int, void*, Stream);
  ncclResult (*ReduceScatter)(const void*, void*, size_t, int, int, void*, Stream);
  ncclResult (*AllGather)(const void*, void*, size_t, int, void*, Stream);
  ncclResult (*Broadcast)(const void*, void*, size_t, int, int, void*, Stream);
  ncclResult (*Send)(const void*, size_t, int, int, void*, Stream);
  ncclResult (*Recv)(void*, size_t, int, int, void*, Stream);
  ncclResult (*GroupStart)();
  ncclResult (*GroupEnd)();
  ncclResult (*CommFinalize)(void*);  // optional: destroy() skips it where NCCL lacks it
};

std::mutex g_load_mu;
std::atomic<bool> g_loaded{false};
Api g_api{};
std::string g_path;
std::mutex g_hook_mu;
std::shared_ptr<const std::function<void()>> g_hook;

// Groups are per thread in NCCL; these follow the calling thread's group so that the outermost
// group_end knows which communicators to wait for. g_live holds the Comm objects that exist, so that
// group_end skips one destroyed (by another thread) since it joined the group.
thread_local int t_group_depth = 0;
thread_local std::vector<Comm*> t_group_comms;
std::mutex g_live_mu;
std::unordered_set<Comm*> g_live;

const Api& api() {
  if (!g_loaded.load(std::memory_order_acquire))
    throw Error(ErrorKind::kInvalidUsage, "NCCL is not loaded (pycoll.nccl.load_nccl() loads it)");
  return g_api;
}

std::string nccl_text(ncclResult r, void* comm) {
  const Api& a = g_api;
  const char* what = a.GetErrorString ? a.GetErrorString(r) : nullptr;
  const char* last = a.GetLastError ? a.GetLastError(comm) : nullptr;
  std::string text = std::string(what ? what : "?") + " (" + result_name(r) + ")";
  text += "; last error: ";
  text += (last && *last) ? last : "(none)";
  return text;
}

// "NCCL <call> failed[ on rank R]: <ncclGetErrorString> (<name>); last error: <ncclGetLastError>"
Error nccl_error(ncclResult r, const char* call, int rank, void* comm, const std::string& extra = "") {
  std::string msg = std::string("NCCL ") + call + " failed";
  if (rank >= 0) msg += " on rank " + std::to_string(rank);
  msg += ": " + nccl_text(r, comm) + extra;
  return Error(r == kRemoteError ? ErrorKind::kPeerLost : ErrorKind::kNccl, msg);
}

void call_hook() {
  std::shared_ptr<const std::function<void()>> hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    hook = g_hook;
  }
  if (hook && *hook) (*hook)();
}

// "a communicator of 1 rank", "a communicator of 4 ranks"
std::string communicator_text(int world) {
  return "a communicator of " + std::to_string(world) + (world == 1 ? " rank" : " ranks");
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

constexpr ncclResult kStopped = -1;  // poll_state: `stop` was set

// Polls ncclCommGetAsyncError while it says ncclInProgress, until `deadline`. Returns the final state
// (kInProgress: the deadline passed; kStopped: `stop` was set). A failure of the query itself is returned
// as the state, too. `hook` false: never call the wait hook (destructors).
ncclResult poll_state(void* comm, std::chrono::steady_clock::time_point deadline, bool hook,
                      const std::atomic<bool>* stop) {
  using Clock = std::chrono::steady_clock;
  const Api& a = g_api;
  // Launches finish within microseconds, init and finalize within seconds: yield first, then sleep in
  // slices growing to 1 ms.
  const auto start = Clock::now();
  auto next_hook = start + std::chrono::milliseconds(100);
  auto slice = std::chrono::microseconds(20);
  for (;;) {
    ncclResult state = kSuccess;
    ncclResult r = a.CommGetAsyncError(comm, &state);
    if (r != kSuccess) return r;
    if (state != kInProgress) return state;
    if (stop && stop->load()) return kStopped;
    auto now = Clock::now();
    if (now >= deadline) return kInProgress;
    if (hook && now >= next_hook) {
      call_hook();
      next_hook = now + std::chrono::milliseconds(100);
    }
    if (now - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(slice);
      slice = std::min<std::chrono::microseconds>(slice * 2, std::chrono::milliseconds(1));
    }
  }
}

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  // Clamp: a huge timeout (or inf) must not overflow the clock.
  double s = std::isfinite(seconds) ? std::min(seconds, 1e9) : 1e9;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

int nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return kF32;
    case DType::kFloat64:
      return kF64;
    case DType::kFloat16:
      return kF16;
    case DType::kBFloat16:
      return kBF16;
    case DType::kInt32:
      return kI32;
    case DType::kInt64:
      return kI64;
    case DType::kUInt8:
      return kU8;
    case DType::kInt8:
      return kI8;
  }
  throw Error(ErrorKind::kInvalidUsage,
              "NCCL has no data type for pycoll dtype code " + std::to_string(static_cast<int>(t)));
}

int nccl_op(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return kOpSum;
    case RedOp::kAvg:
      return kOpAvg;
    case RedOp::kMin:
      return kOpMin;
    case RedOp::kMax:
      return kOpMax;
    case RedOp::kProd:
      return kOpProd;
  }
  throw Error(ErrorKind::kInvalidUsage,
              "NCCL has no reduction for pycoll op code " + std::to_string(static_cast<int>(op)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Loading

void load(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (g_loaded.load(std::memory_order_acquire)) {
    if (path == g_path) return;
    throw Error(ErrorKind::kInvalidUsage,
                "NCCL is already loaded from " + g_path + "; cannot load " + path + " too (a process holds one NCCL)");
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    throw Error(ErrorKind::kNccl, "cannot load NCCL from " + path + ": " + (err ? err : "dlopen failed"));
  }
  Api a{};
  auto resolve = [&](auto& fn, const char* name, bool required) {
    dlerror();
    void* sym = dlsym(handle, name);
    if (!sym && required) {
      const char* err = dlerror();
      std::string msg = path + " is not a usable NCCL: entry point " + name + " is missing (pycoll needs NCCL >= 2.14)";
      if (err) msg += std::string(": ") + err;
      dlclose(handle);
      throw Error(ErrorKind::kNccl, msg);
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  resolve(a.GetVersion, "ncclGetVersion", true);
  resolve(a.GetUniqueId, "ncclGetUniqueId", true);
  resolve(a.CommInitRankConfig, "ncclCommInitRankConfig", true);
  resolve(a.CommDestroy, "ncclCommDestroy", true);
  resolve(a.CommAbort, "ncclCommAbort", true);
  resolve(a.CommGetAsyncError, "ncclCommGetAsyncError", true);
  resolve(a.GetErrorString, "ncclGetErrorString", true);
  resolve(a.GetLastError, "ncclGetLastError", true);
  resolve(a.AllReduce, "ncclAllReduce", true);
  resolve(a.ReduceScatter, "ncclReduceScatter", true);
  resolve(a.AllGather, "ncclAllGather", true);
  resolve(a.Broadcast, "ncclBroadcast", true);
  resolve(a.Send, "ncclSend", true);
  resolve(a.Recv, "ncclRecv", true);
  resolve(a.GroupStart, "ncclGroupStart", true);
  resolve(a.GroupEnd, "ncclGroupEnd", true);
  resolve(a.CommFinalize, "ncclCommFinalize", false);
  int code = 0;
  ncclResult r = a.GetVersion(&code);
  if (r != kSuccess) {
    dlclose(handle);
    throw Error(ErrorKind::kNccl, "NCCL ncclGetVersion failed for " + path + ": ncclResult_t " + std::to_string(r) +
                                      " (" + result_name(r) + ")");
  }
  if (code < 21400) {  // codes below 10000 are the pre-2.9 encoding
    dlclose(handle);
    throw Error(ErrorKind::kNccl, path + " is NCCL version code " + std::to_string(code) +
                                      "; pycoll needs NCCL >= 2.14 (non-blocking communicators)");
  }
  g_api = a;
  g_path = path;
  g_loaded.store(true, std::memory_order_release);
}

bool is_loaded() {
  return g_loaded.load(std::memory_order_acquire);
}

std::string loaded_path() {
  std::lock_guard<std::mutex> lock(g_load_mu);
  return g_path;
}

int version() {
  int code = 0;
  ncclResult r = api().GetVersion(&code);
  if (r != kSuccess) throw nccl_error(r, "ncclGetVersion", -1, nullptr);
  return code;
}

UniqueId unique_id() {
  NcclUniqueId id{};
  ncclResult r = api().GetUniqueId(&id);
  if (r != kSuccess) throw nccl_error(r, "ncclGetUniqueId", -1, nullptr);
  UniqueId out;
  std::copy(std::begin(id.internal), std::end(id.internal), out.begin());
  return out;
}

void set_wait_hook(std::function<void()> hook) {
  auto p = hook ? std::make_shared<const std::function<void()>>(std::move(hook)) : nullptr;
  std::lock_guard<std::mutex> lock(g_hook_mu);
  g_hook = std::move(p);
}

void group_start() {
  ncclResult r = api().GroupStart();
  if (r != kSuccess) throw nccl_error(r, "ncclGroupStart", -1, nullptr);
  ++t_group_depth;
}

void group_end() {
  const Api& a = api();
  ncclResult r = a.GroupEnd();
  std::vector<Comm*> comms;
  if (t_group_depth > 0 && --t_group_depth == 0) comms.swap(t_group_comms);
  if (r == kSuccess) return;
  if (r != kInProgress) {
    bool one = comms.size() == 1;  // then the error names its rank
    throw nccl_error(r, "ncclGroupEnd", one ? comms[0]->rank_ : -1, nullptr);
  }
  // Non-blocking: the launch goes on in NCCL; wait for every communicator the group used. After a
  // failure the others are still waited for (or aborted), so that none is left mid-launch.
  std::unique_ptr<Error> first;
  for (size_t i = 0; i < comms.size(); ++i) {
    std::unique_lock<std::mutex> lock;
    {
      std::lock_guard<std::mutex> live_lock(g_live_mu);
      if (!g_live.count(comms[i])) continue;  // destroyed meanwhile
      lock = std::unique_lock<std::mutex>(comms[i]->mu_);
    }
    try {
      comms[i]->wait_ready("ncclGroupEnd");
    } catch (const Error& e) {
      if (!first) first = std::make_unique<Error>(e);
    } catch (...) {  // the wait hook's exception (Ctrl-C): abort what is still launching, then pass it on
      lock.unlock();
      for (size_t j = i + 1; j < comms.size(); ++j) {
        std::lock_guard<std::mutex> live_lock(g_live_mu);
        if (!g_live.count(comms[j])) continue;
        std::lock_guard<std::mutex> comm_lock(comms[j]->mu_);
        comms[j]->abort_locked();
      }
      throw;
    }
  }
  if (first) throw *first;
}

// ---------------------------------------------------------------------------------------------------
// Comm

Comm::Comm(const UniqueId& id, int world, int rank, double timeout_s)
    : rank_(rank), world_(world), timeout_s_(timeout_s) {
  const Api& a = api();
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(ErrorKind::kInvalidUsage, "NCCL communicator: rank " + std::to_string(rank) +
                                              " is not in [0, world size " + std::to_string(world) + ")");
  if (!(timeout_s > 0)) throw Error(ErrorKind::kInvalidUsage, "NCCL communicator: timeout must be > 0 seconds");
  // The device is the caller's choice (pycoll.nccl.create_nccl_comm documents how). When no device can be
  // had, NCCL's own init reports it; CUDA's reason is added to that message.
  std::string cuda_note;
  cudaError_t ce = cudaGetDevice(&device_);
  if (ce != cudaSuccess) {
    device_ = -1;
    cuda_note = std::string("; cudaGetDevice: ") + cudaGetErrorString(ce) + " (" + cudaGetErrorName(ce) + ")";
    cudaGetLastError();  // clear it, so that it does not surface in the caller's next CUDA call
  }
  const std::string where = " (" + communicator_text(world) + ", CUDA device " + std::to_string(device_) + ")";
  NcclUniqueId nid;
  std::copy(id.begin(), id.end(), nid.internal);
  ConfigV2_14 config;
  void* comm = nullptr;
  ncclResult r = a.CommInitRankConfig(&comm, world, nid, rank, &config);
  if (r != kSuccess && r != kInProgress) {
    Error e = nccl_error(r, "ncclCommInitRankConfig", rank, comm, where + cuda_note);
    if (comm) a.CommAbort(comm);  // a failed non-blocking init still holds resources
    throw e;
  }
  if (!comm) throw Error(ErrorKind::kInternal, "ncclCommInitRankConfig returned no communicator");
  comm_ = comm;
  std::lock_guard<std::mutex> lock(mu_);  // for wait_ready's contract; nobody else knows this object yet
  try {
    wait_ready("ncclCommInitRankConfig");
  } catch (Error& e) {
    abort_locked();  // a destructor does not run for a constructor that throws
    if (e.kind() == ErrorKind::kTimeout)
      throw Error(ErrorKind::kTimeout, "NCCL communicator init timed out after " + seconds_text(timeout_s) +
                                           " on rank " + std::to_string(rank) + " of " + communicator_text(world) +
                                           ": not every rank joined (are all ranks running, with the "
                                           "same unique id?); the communicator was aborted");
    throw Error(e.kind(), e.what() + where + cuda_note, e.peer());
  }
  std::lock_guard<std::mutex> live_lock(g_live_mu);
  g_live.insert(this);
}

Comm::~Comm() {
  {
    std::lock_guard<std::mutex> live_lock(g_live_mu);
    g_live.erase(this);
  }
  t_group_comms.erase(std::remove(t_group_comms.begin(), t_group_comms.end(), this), t_group_comms.end());
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return;
  try {
    if (failed_) {
      abort_locked();
      return;
    }
    // No wait hook here: a destructor must not throw a Python exception.
    const Api& a = g_api;
    if (a.CommFinalize) {
      ncclResult r = a.CommFinalize(comm_);
      if (r == kInProgress || r == kSuccess) r = poll_state(comm_, deadline_after(timeout_s_), false, nullptr);
      if (r != kSuccess) {
        abort_locked();
        return;
      }
    }
    a.CommDestroy(comm_);
    comm_ = nullptr;
    destroyed_ = true;
  } catch (...) {
  }
}

void* Comm::live(const char* call) const {
  if (comm_) return comm_;
  throw Error(ErrorKind::kBroken, std::string("NCCL ") + call + " on rank " + std::to_string(rank_) +
                                      ": the communicator was " + (aborted_ ? "aborted" : "destroyed"));
}

void Comm::fail(int result, const char* call, bool async) {
  if (async) failed_ = true;
  throw nccl_error(result, call, rank_, comm_);
}

void Comm::wait_ready(const char* call) {
  void* comm = live(call);
  ncclResult state;
  try {
    state = poll_state(comm, deadline_after(timeout_s_), true, &abort_requested_);
  } catch (...) {  // the wait hook's exception: NCCL is mid-call, so the communicator cannot be reused
    abort_locked();
    throw;
  }
  if (state == kSuccess) return;
  if (state == kStopped) {
    abort_locked();
    throw Error(ErrorKind::kBroken, std::string("NCCL ") + call + " on rank " + std::to_string(rank_) +
                                        ": the communicator was aborted while waiting");
  }
  if (state == kInProgress) {
    abort_locked();
    throw Error(ErrorKind::kTimeout, std::string("NCCL ") + call + " did not finish within " +
                                         seconds_text(timeout_s_) + " on rank " + std::to_string(rank_) + " of " +
                                         communicator_text(world_) +
                                         " (a peer did not take part); the communicator was aborted");
  }
  fail(state, call, true);
}

void Comm::launched(int result, const char* call) {
  if (t_group_depth > 0) {
    // Inside a group NCCL only queues the call; the outermost group_end launches and waits.
    if (std::find(t_group_comms.begin(), t_group_comms.end(), this) == t_group_comms.end())
      t_group_comms.push_back(this);
    if (result == kSuccess || result == kInProgress) return;
    fail(result, call, false);
  }
  if (result == kInProgress) return wait_ready(call);
  if (result != kSuccess) fail(result, call, false);
}

// The NCCL op of a reduction on this communicator. At one rank an average is its input (x * 1/1 == x
// exactly), so it is asked for as a sum, which NCCL's one-rank path runs as a plain copy: its pre-multiplied
// sum kernel, which NCCL runs for an average of floating-point data at one rank, left the tail of a
// 1,000,003-element float64 out-of-place call unwritten on an H100 (the GPU check of 2026-12-05).
int Comm::op_for(RedOp op) const {
  return nccl_op(world_ == 1 && op == RedOp::kAvg ? RedOp::kSum : op);
}

void Comm::all_reduce(const void* send, void* recv, size_t count, DType dtype, RedOp op, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclAllReduce");
  launched(g_api.AllReduce(send, recv, count, nccl_type(dtype), op_for(op), c, stream), "ncclAllReduce");
}

void Comm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, RedOp op, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclReduceScatter");
  launched(g_api.ReduceScatter(send, recv, recv_count, nccl_type(dtype), op_for(op), c, stream), "ncclReduceScatter");
}

void Comm::all_gather(const void* send, void* recv, size_t send_count, DType dtype, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclAllGather");
  launched(g_api.AllGather(send, recv, send_count, nccl_type(dtype), c, stream), "ncclAllGather");
}

void Comm::broadcast(const void* send, void* recv, size_t count, DType dtype, int root, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclBroadcast");
  if (root < 0 || root >= world_)
    throw Error(ErrorKind::kInvalidUsage,
                "NCCL broadcast: root " + std::to_string(root) + " is not in [0, " + std::to_string(world_) + ")");
  launched(g_api.Broadcast(send, recv, count, nccl_type(dtype), root, c, stream), "ncclBroadcast");
}

void Comm::send(const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclSend");
  if (peer < 0 || peer >= world_)
    throw Error(ErrorKind::kInvalidUsage,
                "NCCL send: peer " + std::to_string(peer) + " is not in [0, " + std::to_string(world_) + ")");
  launched(g_api.Send(buf, bytes, kU8, peer, c, stream), "ncclSend");
}

void Comm::recv(void* buf, size_t bytes, int peer, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live("ncclRecv");
  if (peer < 0 || peer >= world_)
    throw Error(ErrorKind::kInvalidUsage,
                "NCCL recv: peer " + std::to_string(peer) + " is not in [0, " + std::to_string(world_) + ")");
  launched(g_api.Recv(buf, bytes, kU8, peer, c, stream), "ncclRecv");
}

void Comm::check_async(const char* during) {
  std::lock_guard<std::mutex> lock(mu_);
  void* c = live(during);
  ncclResult state = kSuccess;
  ncclResult r = g_api.CommGetAsyncError(c, &state);
  if (r != kSuccess) fail(r, "ncclCommGetAsyncError", false);
  // ncclInProgress: a non-blocking call is still being taken; not an error.
  if (state != kSuccess && state != kInProgress) {
    failed_ = true;
    throw nccl_error(state, "ncclCommGetAsyncError", rank_, c, std::string(" (while ") + during + ")");
  }
}

void Comm::abort() {
  abort_requested_ = true;  // a wait on another thread (holding mu_) sees it and aborts there
  std::lock_guard<std::mutex> lock(mu_);
  abort_locked();
}

void Comm::abort_locked() {
  t_group_comms.erase(std::remove(t_group_comms.begin(), t_group_comms.end(), this), t_group_comms.end());
  if (!comm_) return;
  void* c = comm_;
  comm_ = nullptr;
  aborted_ = true;
  g_api.CommAbort(c);  // frees the communicator whatever it returns
}

void Comm::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return;
  t_group_comms.erase(std::remove(t_group_comms.begin(), t_group_comms.end(), this), t_group_comms.end());
  const Api& a = g_api;
  if (failed_) {
    abort_locked();
    return;
  }
  if (a.CommFinalize) {
    ncclResult r = a.CommFinalize(comm_);
    if (r != kSuccess && r != kInProgress) {
      Error e = nccl_error(r, "ncclCommFinalize", rank_, comm_);
      abort_locked();
      throw e;
    }
    try {
      wait_ready("ncclCommFinalize");
    } catch (...) {
      abort_locked();
      throw;
    }
  }
  void* c = comm_;
  comm_ = nullptr;
  destroyed_ = true;
  ncclResult r = a.CommDestroy(c);
  if (r != kSuccess) throw nccl_error(r, "ncclCommDestroy", rank_, nullptr);
}

}  // namespace pycoll::nccl
