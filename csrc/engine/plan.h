// A plan as the executor runs it: the op table of pycoll/algorithms/plan.py (same op codes and
// semantics; read that file's docstring) with element offsets turned into byte offsets.
#pragma once

#include <cstdint>
#include <vector>

namespace pycoll {

enum class OpKind : int32_t {
  kSend = 0,
  kRecv = 1,
  kRecvReduce = 2,
  kRecvReduceSend = 3,
  kRecvReduceCopySend = 4,
  kRecvCopySend = 5,
  kCopy = 6,
};

inline bool op_sends(OpKind k) {
  return k == OpKind::kSend || k == OpKind::kRecvReduceSend || k == OpKind::kRecvReduceCopySend ||
         k == OpKind::kRecvCopySend;
}
inline bool op_receives(OpKind k) {
  return k != OpKind::kSend && k != OpKind::kCopy;
}
// Ops whose region is named by dst (they write it); the others by src.
inline bool op_receives_into_dst(OpKind k) {
  return k != OpKind::kSend && k != OpKind::kRecvReduceSend;
}
// Ops that read their src region.
inline bool op_reads_src(OpKind k) {
  return k == OpKind::kSend || k == OpKind::kRecvReduce || k == OpKind::kRecvReduceSend ||
         k == OpKind::kRecvReduceCopySend || k == OpKind::kCopy;
}

// kEncoded: with a codec, the encoded final values of the regions this rank finalized or forwarded, at the
// same element offsets as OUTPUT (see "Compressed plans" in pycoll/algorithms/plan.py; EncodedLayout).
enum BufferId : int32_t { kInput = 0, kOutput = 1, kEncoded = 2 };

struct PlanOp {
  OpKind kind;
  int32_t send_peer;
  int32_t recv_peer;
  int32_t src_buf;
  int32_t dst_buf;
  bool finalize;
  // With a codec: this op's message is the float32 elements, not their encoding, and it does what it does
  // without a codec (the hierarchical all-reduce's intra-host stages; "Compressed plans" in plan.py).
  bool uncompressed;
  // With a codec: a finalizing RECV_REDUCE whose value stays here (a reduce-scatter's owner), kept in
  // float32 and not encoded; a COPY (an all-gather's own chunk) that keeps its source exact rather than the
  // decoding of its encoding ("Compressed plans" in plan.py).
  bool exact;
  uint64_t bytes;
  uint64_t src_off;  // bytes
  uint64_t dst_off;  // bytes
  // The ops this one waits for before it starts: NativePlan::deps[deps_begin, deps_end) (engine/plan_dependencies.h).
  uint32_t deps_begin;
  uint32_t deps_end;
  // And every op before this index (a fence: the first op of its step; 0 for other ops).
  uint32_t after_all_before;
  // The chain this op is a member of (NativePlan::chains; engine/plan_fusion.h), or -1.
  int32_t chain = -1;
};

// Ops the executor does in one pass (engine/plan_fusion.h): the members [first, first + count) and the
// SENDs it publishes to, NativePlan::publishers[publish_begin, publish_end).
struct Chain {
  uint32_t first;
  uint32_t count;
  uint32_t publish_begin;
  uint32_t publish_end;
};

struct NativePlan {
  std::vector<PlanOp> ops;
  std::vector<uint32_t> step_begin;  // ops of step s are [step_begin[s], step_begin[s+1])
  std::vector<int32_t> deps;         // every op's dependencies, op after op
  std::vector<Chain> chains;
  std::vector<uint32_t> publishers;  // every chain's publishers, chain after chain
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
  // Set when the plan is compiled: whether some SEND reads kEncoded (a compressed plan), whether kEncoded
  // must be kept at all with a codec (some op reads it or encodes a final value into it: not a
  // reduce-scatter, whose finals stay exact, nor an all-to-all, whose messages are decoded once), and
  // whether the plan can run with a codec at all (no SEND of OUTPUT but uncompressed ones).
  bool uses_encoded = false;
  bool keeps_encoded = false;
  bool codec_compatible = true;
  // Compiled for a codec (its dependencies count every region an op touches as written).
  bool coded = false;
  // INPUT and OUTPUT are different memory (an out-of-place collective: engine/plan_dependencies.h).
  bool distinct = false;
  // A plan that runs in place on a copy of the caller's input (the hierarchical reduce-scatter, whose
  // partial sums need the whole buffer): the caller's output is OUTPUT[result_off, result_off + result_bytes)
  // (Communicator::staged). result_bytes 0: the caller's buffers are the plan's.
  uint64_t result_off = 0;
  uint64_t result_bytes = 0;
  int world = 0;
  int rank = 0;
};

// Where kEncoded keeps the encoding of OUTPUT's element `elem`: OUTPUT is cut in chunks of `chunk`
// elements, each encoded in codec blocks from its start into `chunk_bytes` (the last block may be short).
// The chunk is an all-reduce's whole buffer, and one rank's share for a reduce-scatter or an all-gather,
// whose blocks start at their chunk: the smaller of INPUT and OUTPUT (encoded_chunk).
struct EncodedLayout {
  uint64_t chunk = 0;
  uint64_t chunk_bytes = 0;
  uint64_t block_elems = 1;
  uint64_t block_bytes = 1;

  // Byte offset of `elem` (the first element of a block of its chunk, or the end of a chunk).
  uint64_t offset(uint64_t elem) const {
    return chunk == 0 ? 0 : elem / chunk * chunk_bytes + elem % chunk / block_elems * block_bytes;
  }
  // Bytes of kEncoded for an OUTPUT of `elems` elements (a whole number of chunks).
  uint64_t size(uint64_t elems) const { return chunk == 0 ? 0 : elems / chunk * chunk_bytes; }
};

// The chunk of a compressed plan's EncodedLayout, in float32 elements.
inline uint64_t encoded_chunk(const NativePlan& plan) {
  return (plan.input_bytes < plan.output_bytes ? plan.input_bytes : plan.output_bytes) / 4;
}

// The EncodedLayout of `plan` for a codec's layout: `encoded_bytes(n)` is what n elements encode into.
template <class EncodedBytes>
EncodedLayout encoded_layout(const NativePlan& plan, uint64_t block_elems, uint64_t block_bytes,
                             const EncodedBytes& encoded_bytes) {
  const uint64_t chunk = encoded_chunk(plan);
  return EncodedLayout{chunk, encoded_bytes(chunk), block_elems, block_bytes};
}

}  // namespace pycoll
