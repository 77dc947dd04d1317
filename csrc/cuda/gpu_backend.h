// Collectives on GPUs: grouped programs (pycoll/algorithms/grouped.py) run with NCCL send / recv in
// groups and pycoll's CUDA kernels between them, all enqueued on the caller's stream. Nothing here waits
// for the GPU: the host synchronizes only when the caller asks (pycoll's Work.wait()).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "cuda/kernels.h"
#include "engine/grouped_executor.h"
#include "nccl/nccl.h"

namespace pycoll::cuda {

// A GroupBackend that enqueues on one stream: NCCL groups for the messages, kernels for the rest.
class GpuGroupBackend final : public GroupBackend {
 public:
  GpuGroupBackend(nccl::Comm& comm, cudaStream_t stream, const CodecSpec* codec)
      : comm_(comm), stream_(stream), codec_(codec) {}

  int rank() const override { return comm_.rank(); }
  int world() const override { return comm_.world(); }
  void begin(uint64_t seq, const Descriptor& desc) override;
  void group(const P2P* ops, size_t n) override;
  void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
              int avg_divisor) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void encode(const codec::EncodeArgs& a) override;
  void decode(const codec::DecodeArgs& a) override;
  void abort(const Error& error) override;

 private:
  nccl::Comm& comm_;
  cudaStream_t stream_;
  const CodecSpec* codec_;
};

// Device memory that grows on demand and is reused across calls (staging, the kEncoded buffer, the
// float32 copy of float16 / bfloat16 data being compressed). Calls on different streams are ordered by
// an event: the next call's stream waits for the previous call's work before the memory is reused.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // At least `bytes` bytes, usable by work enqueued on `stream` from now on.
  uint8_t* acquire(uint64_t bytes, cudaStream_t stream);
  // Marks the end of this call's use of the memory on `stream`.
  void release(cudaStream_t stream);

 private:
  uint8_t* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  cudaEvent_t last_use_ = nullptr;
  bool pending_ = false;
};

// One rank's GPU side of a communicator: its NCCL communicator and the memory its collectives reuse.
class GpuCommunicator {
 public:
  explicit GpuCommunicator(std::shared_ptr<nccl::Comm> comm) : comm_(std::move(comm)) {}

  nccl::Comm& nccl() { return *comm_; }
  uint64_t seq() const { return seq_; }

  struct Call {
    uintptr_t input, output;
    DType dtype;  // of the caller's buffers
    RedOp op;
    Descriptor desc;
    // Compressed all-reduce: the codec (kind kNone for none), its layout and error-feedback state.
    CodecSpec codec;
    uint32_t block_elems = 1, block_bytes = 1;
    uint64_t encoded_bytes = 0;  // of the whole (float32) buffer
    uintptr_t residual = 0;
    uint64_t seed = 0;
    uintptr_t stream = 0;
  };
  // Enqueues the plan's grouped program on the call's stream.
  void run(const NativePlan& plan, const GroupedProgram& program, const Call& call);

 private:
  std::shared_ptr<nccl::Comm> comm_;
  Workspace workspace_;
  uint64_t seq_ = 0;
};

}  // namespace pycoll::cuda
