// NCCL, loaded at first use with dlopen from the path pycoll/libraries.py finds (the nvidia-nccl-cu13 or
// -cu12 wheel, NCCL_LIBRARY, or the system), so that the module imports and every CPU path works where
// NCCL is absent. Only the entry points pycoll calls are resolved; their types are declared here from
// NCCL's documented API (nccl.h is not needed to build). Every call is checked: a failure throws
// pycoll::Error of kind kNccl carrying NCCL's own text (ncclGetErrorString, ncclGetLastError), the
// call and the rank. Nothing here prints or exits.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

#include "kernels/types.h"

namespace pycoll::nccl {

// ncclUniqueId: 128 opaque bytes made by one rank and handed to the others (through pycoll's store).
using UniqueId = std::array<char, 128>;

// Loads libnccl from `path` (a file or a name for the dynamic loader). Once loaded, later calls with the
// same path do nothing and another path throws InvalidUsage (a process can hold one NCCL). Throws kNccl
// naming the path and dlerror()'s text when it cannot be loaded or lacks an entry point.
void load(const std::string& path);
bool is_loaded();
std::string loaded_path();
// ncclGetVersion's code, e.g. 22805 for 2.28.5. Throws InvalidUsage when no NCCL is loaded.
int version();
UniqueId unique_id();

// ncclGroupStart / ncclGroupEnd: the sends and receives between them progress together. Groups are per
// thread and nest; the outermost group_end launches the operations and waits (with each communicator's
// deadline) until NCCL has taken them, aborting the communicators that miss it (kTimeout).
void group_start();
void group_end();

// Called about every 100 ms while a call waits for NCCL (init, a launch, destroy), e.g. to let the Python
// layer deliver Ctrl-C. It may throw: the communicator being waited for is then aborted and the
// exception passes on. Empty by default.
void set_wait_hook(std::function<void()> hook);

// One rank's membership in an NCCL communicator, on the CUDA device current at construction. The
// communicator is non-blocking (ncclConfig_t blocking = 0): every call that NCCL answers with ncclInProgress
// is waited for here, at most timeout_s, so the methods return only once NCCL has taken the operation (the
// work itself runs on the stream). Calls on one communicator are serialized by a mutex; abort() may come
// from any thread and also ends a wait in progress on another one.
class Comm {
 public:
  // Joins the communicator of `world` ranks named by `id` as `rank`. Waits at most timeout_s for the
  // other ranks (a rank that never comes raises kTimeout instead of hanging). timeout_s is also the
  // deadline of every later wait (a launch, destroy).
  Comm(const UniqueId& id, int world, int rank, double timeout_s);
  ~Comm();  // destroy(); ncclCommAbort if the communicator failed, or destroy() does not finish in time
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }  // -1 when cudaGetDevice failed (NCCL's init normally fails then)

  // Collectives on `stream` (counts in elements; avg needs NCCL >= 2.10). The dtypes NCCL lacks
  // (none of pycoll's today) throw InvalidUsage.
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, RedOp op, cudaStream_t stream);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, RedOp op, cudaStream_t stream);
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype, cudaStream_t stream);
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, cudaStream_t stream);
  // Point to point, in bytes; match a peer's recv / send of the same size in the same order.
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream);
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream);

  // Throws kNccl (or kPeerLost where NCCL says a remote peer failed) if NCCL reported an asynchronous
  // error on this communicator; `during` names what the caller was waiting for.
  void check_async(const char* during);
  // ncclCommAbort: unblocks every operation of this communicator; later calls throw kBroken.
  void abort();
  bool aborted() const { return aborted_.load(); }
  // ncclCommFinalize (where NCCL has it; waits for the operations in flight, at most timeout_s, else
  // aborts and throws kTimeout) then ncclCommDestroy. Later calls throw kBroken; a second destroy()
  // does nothing.
  void destroy();
  bool destroyed() const { return destroyed_.load(); }

 private:
  // These expect mu_ to be held.
  void* live(const char* call) const;  // comm_, or throws kBroken when aborted or destroyed
  int op_for(RedOp op) const;          // the NCCL op: an average at one rank is asked for as a sum
  // Waits while NCCL reports ncclInProgress for this communicator; throws (and aborts on timeout).
  void wait_ready(const char* call);
  void launched(int result, const char* call);  // checks a collective's or send/recv's result
  [[noreturn]] void fail(int result, const char* call, bool async);
  void abort_locked();

  std::mutex mu_;
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0;
  int world_ = 0;
  int device_ = 0;
  double timeout_s_ = 0;
  bool failed_ = false;                       // NCCL reported an asynchronous error: destroy aborts instead
  std::atomic<bool> abort_requested_{false};  // abort() from another thread ends wait_ready
  std::atomic<bool> aborted_{false};
  std::atomic<bool> destroyed_{false};

  friend void group_end();
};

}  // namespace pycoll::nccl
