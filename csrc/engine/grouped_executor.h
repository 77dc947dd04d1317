// Runs a plan lowered to a grouped program (pycoll/algorithms/grouped.py: rounds of matched sends and
// receives, each followed by the kernels of the ops whose messages arrived) over a GroupBackend: NCCL
// and CUDA kernels on a stream on GPUs (csrc/engine/gpu_backend.cc), the shared-memory transport and the
// CPU loops on CPUs (cpu_group_backend.cc, which is how the CPU tests check this file).
//
// Whole messages travel at once, into staging memory; FINISH moves each where its op says, exactly as
// the fragment-by-fragment executor (executor.cc) does, so both give the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/descriptor.h"
#include "engine/plan.h"
#include "kernels/codec_args.h"
#include "kernels/types.h"
#include "pycoll/errors.h"

namespace pycoll {

// Action codes of pycoll/algorithms/grouped.py (Action); append, never reorder.
enum class GroupAction : int32_t { kPrepare = 0, kSend = 1, kRecv = 2, kGroupEnd = 3, kFinish = 4 };

struct GroupedProgram {
  std::vector<GroupAction> action;
  std::vector<int32_t> op;  // per action; -1 for kGroupEnd
  // Per plan op: bytes on the wire, and staging offsets (-1: none) of the message as received, of what
  // the op sends (encoded or reduced), and of a float32 scratch (compressed RECV_REDUCE_SEND).
  std::vector<uint64_t> msg_bytes;
  std::vector<int64_t> recv_stage, send_stage, work_stage;
  uint64_t staging_bytes = 0;
};

// Checks a program against its plan (every op sent and received once, offsets inside staging).
void validate_program(const GroupedProgram& program, const NativePlan& plan);

// What moves the messages and runs the kernels. Calls are made in program order; a GPU backend only
// enqueues them on its stream, a CPU backend performs them before returning.
class GroupBackend {
 public:
  struct P2P {
    bool send;
    int peer;
    void* buf;
    uint64_t bytes;
  };

  virtual ~GroupBackend() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Called once per collective before anything else (seq: the collective's number).
  virtual void begin(uint64_t seq, const Descriptor& desc) = 0;
  // Sends and receives that progress together; all of them are matched by the peers' groups.
  virtual void group(const P2P* ops, size_t n) = 0;
  // Semantics of cpu::ReduceFn (dst may alias a or b).
  virtual void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
                      int avg_divisor) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // The run's codec (set by the caller of GroupedExecutor::run), on the backend's memory.
  virtual void encode(const codec::EncodeArgs& a) = 0;
  virtual void decode(const codec::DecodeArgs& a) = 0;
  // Tell the peers that this collective failed (the first error wins).
  virtual void abort(const Error& error) = 0;
};

struct GroupedArgs {
  const void* input;
  void* output;
  DType dtype;
  RedOp op;
  Descriptor desc;
  uint64_t seq;
  // Memory of the backend: staging (program.staging_bytes) and, with a codec, the kEncoded buffer of
  // the plan (encoded_layout.size of its output); both reused across calls by the caller.
  uint8_t* staging;
  uint8_t* encoded;
  // Compressed plans: the codec's layout (block elements and bytes), kEncoded's layout, the float32
  // error-feedback residual (may be null) and the stochastic-rounding key.
  bool compressed = false;
  uint32_t block_elems = 1;
  uint32_t block_bytes = 1;
  EncodedLayout encoded_layout;
  float* residual = nullptr;
  uint32_t rounding_key = 0;
};

class GroupedExecutor {
 public:
  // Runs the program; on an error the backend is aborted first so that the peers raise too.
  static void run(const NativePlan& plan, const GroupedProgram& program, const GroupedArgs& args,
                  GroupBackend& backend);
};

}  // namespace pycoll
