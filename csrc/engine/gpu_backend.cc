#include "engine/gpu_backend.h"

#include <string>
#include <vector>

#include "engine/op_semantics.h"
#include "pycoll/cuda_check.h"

namespace pycoll::cuda {

namespace {
constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

void NcclGroupBackend::begin(uint64_t, const Descriptor&) {
  comm_.check_async("the start of a collective");
}

void NcclGroupBackend::group(const P2P* ops, size_t n) {
  // Empty messages carry nothing on NCCL (both sides know their size from the plan): leave them out.
  size_t nonempty = 0;
  for (size_t k = 0; k < n; ++k) nonempty += ops[k].bytes > 0;
  if (!nonempty) return;
  nccl::group_start();
  try {
    for (size_t k = 0; k < n; ++k) {
      const P2P& o = ops[k];
      if (!o.bytes) continue;
      if (o.send)
        comm_.send(o.buf, o.bytes, o.peer, stream_);
      else
        comm_.recv(o.buf, o.bytes, o.peer, stream_);
    }
  } catch (...) {
    try {
      nccl::group_end();  // leave NCCL's group depth as it was; the first error is the one to report
    } catch (...) {
    }
    throw;
  }
  nccl::group_end();
}

void GpuKernelBackend::reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
                              int avg_divisor) {
  cuda::reduce(dtype, op, dst, dst2, a, b, n, avg_divisor, stream_);
}

void GpuKernelBackend::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes || dst == src) return;
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d < s + bytes && s < d + bytes)  // cudaMemcpyAsync does not allow overlap; plans never ask for it
    throw Error(ErrorKind::kInternal, "overlapping device copy in a grouped program");
  PYCOLL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void GpuKernelBackend::encode(const codec::EncodeArgs& a) {
  if (!codec_) throw Error(ErrorKind::kInternal, "encode without a codec");
  cuda::encode(*codec_, a, stream_);
}

void GpuKernelBackend::decode(const codec::DecodeArgs& a) {
  if (!codec_) throw Error(ErrorKind::kInternal, "decode without a codec");
  cuda::decode(*codec_, a, stream_);
}

// Work already enqueued may wait on peers that will not come: NCCL's abort is what unblocks it.
void NcclGroupBackend::abort(const Error&) {
  comm_.abort();
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

uint8_t* PinnedBuffer::reserve(uint64_t bytes) {
  if (bytes > bytes_) {
    if (ptr_) PYCOLL_CHECK_CUDA(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    void* p = nullptr;
    const uint64_t want = align_up(bytes + bytes / 4);
    PYCOLL_CHECK_CUDA(cudaMallocHost(&p, want));
    ptr_ = static_cast<uint8_t*>(p);
    bytes_ = want;
  }
  return ptr_;
}

void HostStagedGroupBackend::group(const P2P* ops, size_t n) {
  uint64_t total = 0;
  for (size_t k = 0; k < n; ++k) total += align_up(ops[k].bytes);
  // The previous group's copies into the device were enqueued before the synchronization below, so the
  // bounce buffer is not rewritten while they read it.
  PYCOLL_CHECK_CUDA(cudaStreamSynchronize(stream_));
  uint8_t* bounce = bounce_.reserve(total);
  staged_.assign(ops, ops + n);
  uint64_t at = 0;
  for (P2P& o : staged_) {
    if (o.send && o.bytes)
      PYCOLL_CHECK_CUDA(cudaMemcpyAsync(bounce + at, o.buf, o.bytes, cudaMemcpyDeviceToHost, stream_));
    o.buf = bounce + at;
    at += align_up(o.bytes);
  }
  PYCOLL_CHECK_CUDA(cudaStreamSynchronize(stream_));  // the messages leave only once computed
  host_.group(staged_.data(), staged_.size());
  for (size_t k = 0; k < n; ++k)
    if (!ops[k].send && ops[k].bytes)
      PYCOLL_CHECK_CUDA(cudaMemcpyAsync(ops[k].buf, staged_[k].buf, ops[k].bytes, cudaMemcpyHostToDevice, stream_));
}

Workspace::~Workspace() {
  // Teardown must not throw; memory still used by enqueued work is freed after the device finishes it.
  if (last_use_) {
    cudaEventSynchronize(last_use_);
    cudaEventDestroy(last_use_);
  }
  if (ptr_) cudaFree(ptr_);
}

uint8_t* Workspace::acquire(uint64_t bytes, cudaStream_t stream) {
  if (!last_use_) PYCOLL_CHECK_CUDA(cudaEventCreateWithFlags(&last_use_, cudaEventDisableTiming));
  if (pending_) PYCOLL_CHECK_CUDA(cudaStreamWaitEvent(stream, last_use_, 0));
  if (bytes > bytes_) {
    if (pending_) PYCOLL_CHECK_CUDA(cudaEventSynchronize(last_use_));  // rare: the memory grows
    if (ptr_) PYCOLL_CHECK_CUDA(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    void* p = nullptr;
    const uint64_t want = align_up(bytes + bytes / 4);  // some headroom against growing on every call
    PYCOLL_CHECK_CUDA(cudaMalloc(&p, want));
    ptr_ = static_cast<uint8_t*>(p);
    bytes_ = want;
  }
  return ptr_;
}

void Workspace::release(cudaStream_t stream) {
  PYCOLL_CHECK_CUDA(cudaEventRecord(last_use_, stream));
  pending_ = true;
}

void GpuCommunicator::run(const NativePlan& plan, const GroupedProgram& program, const Call& c, GroupBackend* host) {
  if (!host && !comm_) throw Error(ErrorKind::kInternal, "a host-staged GPU communicator needs a host backend");
  const int rank = host ? host->rank() : comm_->rank();
  const int world = host ? host->world() : comm_->world();
  if (plan.world != world || plan.rank != rank)
    throw Error(ErrorKind::kInternal, "plan was built for another rank or world size");
  if (!host && comm_->aborted())
    throw Error(ErrorKind::kBroken, "the NCCL communicator was aborted after an earlier failure; create a new one");
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(c.stream);
  const bool compressed = c.codec.kind != codec::Kind::kNone;
  const bool widen = compressed && c.dtype != DType::kFloat32;
  const bool rotate = compressed && c.rotation_block > 0;
  if (compressed && !compressible(c.dtype, c.op)) throw Error(ErrorKind::kInvalidUsage, kNotCompressible);
  if (plan.result_bytes > 0)
    throw Error(ErrorKind::kInvalidUsage,
                "a plan with a result range (the hierarchical reduce-scatter) runs on host "
                "memory only");
  // Workspace layout: staging | kEncoded | float32 work copies (Communicator::staged on the CPU): of the input
  // when it is widened, or rotated out of place; then of the output when it is widened out of place.
  const uint64_t n_in = plan.input_bytes / 4, n_out = plan.output_bytes / 4;
  const bool in_place = c.input == c.output;
  const bool own_in = widen || (rotate && !in_place), own_out = widen && !in_place;
  const uint64_t staging = align_up(program.staging_bytes);
  const EncodedLayout layout =
      compressed ? encoded_layout(plan, c.block_elems, c.block_bytes,
                                  [&](uint64_t n) { return codec::encoded_bytes(c.codec.kind, c.codec.block, n); })
                 : EncodedLayout{};
  const uint64_t encoded = compressed ? align_up(layout.size(n_out)) : 0;
  const uint64_t wide = align_up(((own_in ? n_in : 0) + (own_out ? n_out : 0)) * 4);
  uint8_t* ws = workspace_.acquire(staging + encoded + wide, stream);
  // Also when enqueuing fails part-way: what was enqueued uses the workspace, the next call must wait for it.
  struct ReleaseOnError {
    Workspace& workspace;
    cudaStream_t stream;
    bool armed = true;
    ~ReleaseOnError() {
      if (!armed) return;
      try {
        workspace.release(stream);
      } catch (...) {
      }
    }
  } release_on_error{workspace_, stream};

  GroupedArgs g;
  g.input = reinterpret_cast<const void*>(c.input);
  g.output = reinterpret_cast<void*>(c.output);
  g.dtype = widen ? DType::kFloat32 : c.dtype;
  g.op = c.op;
  g.desc = c.desc;
  g.seq = c.seq ? c.seq : ++seq_;
  g.staging = ws;
  g.encoded = ws + staging;
  // float16 / bfloat16 data is compressed as float32: widened by the matching cast codec's decode (its
  // wire format is exactly those 16 bits) and rounded back by its encode, as the CPU path does.
  CodecSpec cast;
  cast.kind = c.dtype == DType::kFloat16 ? codec::Kind::kFp16 : codec::Kind::kBf16;
  float* const work = reinterpret_cast<float*>(ws + staging + encoded);
  float* const work_in = own_in ? work : reinterpret_cast<float*>(c.input);
  float* const work_out = in_place ? work_in : own_out ? work + n_in : reinterpret_cast<float*>(c.output);
  if (widen) {
    codec::DecodeArgs d;
    d.in = reinterpret_cast<const uint8_t*>(c.input);
    d.dst = work;
    d.n = n_in;
    cuda::decode(cast, d, stream);
  } else if (own_in) {
    PYCOLL_CHECK_CUDA(
        cudaMemcpyAsync(work_in, reinterpret_cast<const void*>(c.input), n_in * 4, cudaMemcpyDeviceToDevice, stream));
  }
  if (rotate) cuda::rotate(work_in, n_in, c.rotate_input_part, c.rotation_block, false, stream);
  g.input = work_in;
  g.output = work_out;
  if (compressed) {
    g.compressed = true;
    g.block_elems = c.block_elems;
    g.block_bytes = c.block_bytes;
    g.encoded_layout = layout;
    g.residual = reinterpret_cast<float*>(c.residual);
    g.rounding_key = codec::rounding_key(c.seed, static_cast<uint32_t>(rank), g.seq);
  }
  const CodecSpec* spec = compressed ? &c.codec : nullptr;
  if (host) {
    HostStagedGroupBackend backend(*host, bounce_, stream, spec);
    GroupedExecutor::run(plan, program, g, backend);
  } else {
    NcclGroupBackend backend(*comm_, stream, spec);
    GroupedExecutor::run(plan, program, g, backend);
  }
  if (rotate) cuda::rotate(work_out, n_out, c.rotate_output_part, c.rotation_block, true, stream);
  if (widen) {
    codec::EncodeArgs e;
    e.src = work_out;
    e.out = reinterpret_cast<uint8_t*>(c.output);
    e.n = n_out;
    cuda::encode(cast, e, stream);
  }
  if (rotate && c.exact_count) {  // the caller's own elements, which rotating there and back would round
    const size_t isz = dtype_size(c.dtype);
    PYCOLL_CHECK_CUDA(cudaMemcpyAsync(reinterpret_cast<uint8_t*>(c.output) + c.exact_dst * isz,
                                      reinterpret_cast<const uint8_t*>(c.input) + c.exact_src * isz,
                                      c.exact_count * isz, cudaMemcpyDeviceToDevice, stream));
  }
  release_on_error.armed = false;
  workspace_.release(stream);
}

}  // namespace pycoll::cuda
