// Collectives on GPUs: grouped programs (pycoll/algorithms/grouped.py) run with NCCL send / recv in
// groups and pycoll's CUDA kernels between them, all enqueued on the caller's stream. Nothing here waits
// for the GPU: the host synchronizes only when the caller asks (pycoll's Work.wait()).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/kernels.h"
#include "engine/grouped_executor.h"
#include "nccl/nccl.h"

namespace pycoll::cuda {

// The kernels of a GroupBackend on GPU memory, enqueued on one stream; subclasses move the messages.
class GpuKernelBackend : public GroupBackend {
 public:
  GpuKernelBackend(cudaStream_t stream, const CodecSpec* codec) : stream_(stream), codec_(codec) {}
  void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
              int avg_divisor) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void encode(const codec::EncodeArgs& a) override;
  void decode(const codec::DecodeArgs& a) override;

 protected:
  cudaStream_t stream_;
  const CodecSpec* codec_;
};

// Messages as NCCL send / recv in groups on the stream.
class NcclGroupBackend final : public GpuKernelBackend {
 public:
  NcclGroupBackend(nccl::Comm& comm, cudaStream_t stream, const CodecSpec* codec)
      : GpuKernelBackend(stream, codec), comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int world() const override { return comm_.world(); }
  void begin(uint64_t seq, const Descriptor& desc) override;
  void group(const P2P* ops, size_t n) override;
  void abort(const Error& error) override;

 private:
  nccl::Comm& comm_;
};

// Pinned host memory that grows on demand.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* reserve(uint64_t bytes);

 private:
  uint8_t* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Messages through a host-memory GroupBackend (shared memory between processes): each group's outgoing
// messages are copied to pinned memory, exchanged there, and the incoming ones copied to the device.
// For ranks that share one GPU, which NCCL refuses, or that have no NCCL; the host waits for the
// stream at every group, so it is for correctness and small jobs rather than speed.
class HostStagedGroupBackend final : public GpuKernelBackend {
 public:
  HostStagedGroupBackend(GroupBackend& host, PinnedBuffer& bounce, cudaStream_t stream, const CodecSpec* codec)
      : GpuKernelBackend(stream, codec), host_(host), bounce_(bounce) {}
  int rank() const override { return host_.rank(); }
  int world() const override { return host_.world(); }
  void begin(uint64_t seq, const Descriptor& desc) override { host_.begin(seq, desc); }
  void group(const P2P* ops, size_t n) override;
  void abort(const Error& error) override { host_.abort(error); }

 private:
  GroupBackend& host_;
  PinnedBuffer& bounce_;
  std::vector<P2P> staged_;
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

// One rank's GPU side of a communicator: how its messages travel (its NCCL communicator, or a host
// backend handed to each run) and the device memory its collectives reuse.
class GpuCommunicator {
 public:
  explicit GpuCommunicator(std::shared_ptr<nccl::Comm> comm) : comm_(std::move(comm)) {}
  GpuCommunicator() = default;  // host-staged: every run is given the host backend to exchange through

  struct Call {
    uintptr_t input, output;
    DType dtype;  // of the caller's buffers
    RedOp op;
    Descriptor desc;
    // A compressed collective: the codec (kind kNone for none), its layout and error-feedback state.
    CodecSpec codec;
    uint32_t block_elems = 1, block_bytes = 1;
    uintptr_t residual = 0;
    uint64_t seed = 0;
    // A codec with a rotation (kernels/rotation.h): blocks of `rotation_block` elements (0: none) from the start
    // of each part of INPUT and of OUTPUT, parts of these sizes (cuda::rotate).
    uint32_t rotation_block = 0;
    uint64_t rotate_input_part = 0, rotate_output_part = 0;
    // With a rotation: the caller's input elements [exact_src, + exact_count) copied to [exact_dst, ...) of its
    // output at the end (communicator.h Call).
    uint64_t exact_src = 0, exact_dst = 0, exact_count = 0;
    uintptr_t stream = 0;
    uint64_t seq = 0;  // the collective's number; 0: this communicator counts its own
  };
  // Enqueues the plan's grouped program on the call's stream, over NCCL, or through `host` when given.
  void run(const NativePlan& plan, const GroupedProgram& program, const Call& call, GroupBackend* host = nullptr);

 private:
  // Destroyed bottom-up: the workspace first, whose destructor waits for the last call's work (the
  // host-staged copies out of the bounce buffer included) before the bounce buffer is freed, and the
  // NCCL communicator last.
  std::shared_ptr<nccl::Comm> comm_;
  PinnedBuffer bounce_;
  Workspace workspace_;
  uint64_t seq_ = 0;
};

}  // namespace pycoll::cuda
