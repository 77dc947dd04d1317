// The CUDA kernels, as host functions that enqueue them on a stream: reduce and the codecs, around the
// same element code as the CPU loops (csrc/kernels/), so a GPU and a CPU give the same bits for the same
// input. Pointers are device pointers, aligned to their element size (16-byte vector accesses where
// alignment allows). Every function checks its arguments and the launch and throws pycoll::Error (never
// prints or exits); n == 0 enqueues nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/codec.h"
#include "kernels/codec_args.h"
#include "kernels/types.h"

namespace pycoll::cuda {

// dst[i] = a[i] (+) b[i] for i < n, also written to dst2 when it is not null; avg_divisor > 0 divides
// each result by it. The same semantics and bits as cpu::ReduceFn (csrc/cpu/reduce.h).
void reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n, int avg_divisor,
            cudaStream_t stream);

// A built-in codec: fp16, bf16, int8 or int4 (block ignored by the casts).
struct CodecSpec {
  codec::Kind kind = codec::Kind::kNone;
  uint32_t block = 0;
  codec::Rounding rounding = codec::Rounding::kNearest;
};

// Throws InvalidUsage for a codec the kernels do not implement (or a bad block size or rounding code).
void check_codec(const CodecSpec& codec);

// The same semantics and bits as the CPU codecs' encode / decode (csrc/cpu/codec.h), on device memory.
// Float arrays must be 4-byte aligned; the encoded bytes may start at any address.
void encode(const CodecSpec& codec, const codec::EncodeArgs& a, cudaStream_t stream);
void decode(const CodecSpec& codec, const codec::DecodeArgs& a, cudaStream_t stream);

// The randomized Hadamard rotation (kernels/rotation.h) of x's n float32 values in place: parts of `part`
// elements (n a whole number of them), each in blocks of `block` from its start; forward or back (inverse).
// The same bits as cpu::rotate.
void rotate(float* x, uint64_t n, uint64_t part, uint32_t block, bool inverse, cudaStream_t stream);

}  // namespace pycoll::cuda
