#include "engine/grouped_executor.h"

#include <string>

#include "engine/op_semantics.h"

namespace pycoll {

namespace {

[[noreturn]] void bad_program(const std::string& why) {
  throw Error(ErrorKind::kInternal, "grouped program is invalid: " + why);
}

// Where the op's message is sent from (see "Compressed plans" in pycoll/algorithms/plan.py).
struct Places {
  const NativePlan& plan;
  const GroupedProgram& prog;
  const GroupedArgs& a;

  uint8_t* buffer(int32_t id) const {
    return id == kInput ? const_cast<uint8_t*>(static_cast<const uint8_t*>(a.input)) : static_cast<uint8_t*>(a.output);
  }
  uint8_t* stage(int64_t off) const { return a.staging + off; }
  // The kEncoded bytes of the region starting at byte offset `off` of OUTPUT (float32 elements).
  uint8_t* encoded_at(uint64_t off) const { return a.encoded + a.encoded_layout.offset(off / 4); }

  void* send_source(size_t i) const {
    const PlanOp& op = plan.ops[i];
    switch (op.kind) {
      case OpKind::kSend:
        if (!a.compressed || op.uncompressed) return buffer(op.src_buf) + op.src_off;
        return op.src_buf == kEncoded ? encoded_at(op.src_off) : stage(prog.send_stage[i]);
      case OpKind::kRecvCopySend:
        return stage(prog.recv_stage[i]);  // forwarded as it arrived
      default:
        return stage(prog.send_stage[i]);
    }
  }
};

void finish_plain(const Places& p, const PlanOp& op, size_t i, GroupBackend& be) {
  const GroupedArgs& a = p.a;
  const size_t n = op.bytes / dtype_size(a.dtype);
  const int divisor = finalize_divisor(a.op, op.finalize, be.world());
  uint8_t* dst = p.buffer(op.dst_buf) + op.dst_off;
  const uint8_t* src = p.buffer(op.src_buf) + op.src_off;
  const uint8_t* msg = op.kind == OpKind::kCopy ? nullptr : p.stage(p.prog.recv_stage[i]);
  switch (op.kind) {
    case OpKind::kRecv:
    case OpKind::kRecvCopySend:
      be.copy(dst, msg, op.bytes);
      break;
    case OpKind::kRecvReduce:
      be.reduce(a.dtype, a.op, dst, nullptr, src, msg, n, divisor);
      break;
    case OpKind::kRecvReduceSend:
      be.reduce(a.dtype, a.op, p.stage(p.prog.send_stage[i]), nullptr, src, msg, n, divisor);
      break;
    case OpKind::kRecvReduceCopySend:
      be.reduce(a.dtype, a.op, dst, p.stage(p.prog.send_stage[i]), src, msg, n, divisor);
      break;
    case OpKind::kCopy:
      if (dst != src && op.bytes) be.copy(dst, src, op.bytes);
      break;
    default:
      bad_program("FINISH of an op that neither receives nor copies");
  }
}

// executor.cc's codec_recv on a whole message: decode (and accumulate); where the op finalizes or sends
// a reduced value, encode it once and keep the decoding of that encoding.
void finish_compressed(const Places& p, const PlanOp& op, size_t i, GroupBackend& be) {
  const GroupedArgs& a = p.a;
  const int world = be.world();
  const uint64_t m = op.bytes / 4;
  const uint64_t elem = (op_receives_into_dst(op.kind) ? op.dst_off : op.src_off) / 4;
  float* const dst = reinterpret_cast<float*>(p.buffer(op.dst_buf) + op.dst_off);
  const float* const src = reinterpret_cast<const float*>(p.buffer(op.src_buf) + op.src_off);
  float* const residual = a.residual ? a.residual + elem : nullptr;
  float* const consumed = a.residual && op.src_buf == kInput ? a.residual + op.src_off / 4 : nullptr;
  const uint8_t* const msg = op.kind == OpKind::kCopy ? nullptr : p.stage(p.prog.recv_stage[i]);
  codec::DecodeArgs d;
  d.in = msg;
  d.n = m;
  d.divisor = finalize_divisor(a.op, op.finalize, world);
  codec::EncodeArgs e;
  e.residual = residual;
  e.residual_scale = residual_scale(a.op, op.finalize, world);
  e.n = m;
  e.index = elem;
  e.key = a.rounding_key;
  switch (op.kind) {
    case OpKind::kRecv:
    case OpKind::kRecvCopySend:  // kept: a final value this rank may forward (RECV: later, hierarchical)
      be.copy(p.encoded_at(op.dst_off), msg, p.prog.msg_bytes[i]);
      d.dst = dst;
      be.decode(d);
      break;
    case OpKind::kRecvReduce:
    case OpKind::kRecvReduceCopySend:
    case OpKind::kRecvReduceSend: {
      const bool to_dst = op.kind != OpKind::kRecvReduceSend;
      d.dst = to_dst ? dst : reinterpret_cast<float*>(p.stage(p.prog.work_stage[i]));
      d.acc = src;
      d.residual = consumed;  // the input is read here: consume it
      be.decode(d);
      // A partial kept for a later op, or a reduce-scatter's final value, which stays here in float32.
      if (op.kind == OpKind::kRecvReduce && (!op.finalize || op.exact)) break;
      e.src = d.dst;
      e.decoded = to_dst ? dst : nullptr;
      e.out = op.kind == OpKind::kRecvReduce ? p.encoded_at(op.dst_off) : p.stage(p.prog.send_stage[i]);
      e.out2 = op.kind == OpKind::kRecvReduceCopySend ? p.encoded_at(op.dst_off) : nullptr;
      be.encode(e);
      break;
    }
    case OpKind::kCopy:  // an all-gather's own chunk: encoded once (its SENDs forward the bytes), decoded
      e.src = src;
      e.residual = nullptr;  // (an all-gather has no error feedback)
      e.out = p.encoded_at(op.dst_off);
      e.decoded = op.exact ? nullptr : dst;
      be.encode(e);
      if (op.exact && op.bytes && static_cast<const void*>(dst) != src) be.copy(dst, src, op.bytes);
      break;
    default:
      bad_program("a compressed plan has an op that neither receives nor sends");
  }
}

void run_actions(const NativePlan& plan, const GroupedProgram& prog, const GroupedArgs& a, GroupBackend& be) {
  const Places places{plan, prog, a};
  std::vector<GroupBackend::P2P> group;
  be.begin(a.seq, a.desc);
  for (size_t k = 0; k < prog.action.size(); ++k) {
    const GroupAction act = prog.action[k];
    if (act == GroupAction::kGroupEnd) {
      be.group(group.data(), group.size());
      group.clear();
      continue;
    }
    const size_t i = static_cast<size_t>(prog.op[k]);
    const PlanOp& op = plan.ops[i];
    switch (act) {
      case GroupAction::kPrepare: {  // a compressed SEND from INPUT: encode (src + residual) into staging
        codec::EncodeArgs e;
        e.src = reinterpret_cast<const float*>(places.buffer(op.src_buf) + op.src_off);
        e.residual = a.residual ? a.residual + op.src_off / 4 : nullptr;
        e.out = places.stage(prog.send_stage[i]);
        e.n = op.bytes / 4;
        e.index = op.src_off / 4;
        e.key = a.rounding_key;
        be.encode(e);
        break;
      }
      case GroupAction::kSend:
        group.push_back({true, op.send_peer, places.send_source(i), prog.msg_bytes[i]});
        break;
      case GroupAction::kRecv:
        group.push_back({false, op.recv_peer, places.stage(prog.recv_stage[i]), prog.msg_bytes[i]});
        break;
      case GroupAction::kFinish:
        if (a.compressed && !op.uncompressed)
          finish_compressed(places, op, i, be);
        else
          finish_plain(places, op, i, be);
        break;
      default:
        bad_program("unknown action");
    }
  }
  if (!group.empty()) bad_program("sends or receives after the last GROUP_END");
}

}  // namespace

void validate_program(const GroupedProgram& prog, const NativePlan& plan) {
  const size_t n = plan.ops.size();
  if (prog.op.size() != prog.action.size()) bad_program("one op index per action");
  if (prog.msg_bytes.size() != n || prog.recv_stage.size() != n || prog.send_stage.size() != n ||
      prog.work_stage.size() != n)
    bad_program("per-op arrays must have one entry per plan op");
  std::vector<uint8_t> sends(n, 0), recvs(n, 0), finishes(n, 0);
  auto in_staging = [&](int64_t off, uint64_t bytes, size_t i, const char* what) {
    if (off < 0 || static_cast<uint64_t>(off) + bytes > prog.staging_bytes)
      bad_program(std::string("op ") + std::to_string(i) + " has no room for its " + what + " in staging");
  };
  for (size_t k = 0; k < prog.action.size(); ++k) {
    const GroupAction act = prog.action[k];
    if (act == GroupAction::kGroupEnd) continue;
    if (prog.op[k] < 0 || static_cast<size_t>(prog.op[k]) >= n) bad_program("op index out of range");
    const size_t i = static_cast<size_t>(prog.op[k]);
    const PlanOp& op = plan.ops[i];
    switch (act) {
      case GroupAction::kPrepare:
        if (op.kind != OpKind::kSend || op.src_buf != kInput) bad_program("PREPARE of an op that is no SEND of INPUT");
        in_staging(prog.send_stage[i], prog.msg_bytes[i], i, "message");
        break;
      case GroupAction::kSend:
        if (!op_sends(op.kind) || sends[i]++) bad_program("op " + std::to_string(i) + " is sent twice or never sends");
        break;
      case GroupAction::kRecv:
        if (!op_receives(op.kind) || recvs[i]++) bad_program("op " + std::to_string(i) + " is received twice");
        in_staging(prog.recv_stage[i], prog.msg_bytes[i], i, "message");
        break;
      case GroupAction::kFinish:
        if (op.kind == OpKind::kSend || finishes[i]++) bad_program("op " + std::to_string(i) + " is finished twice");
        if (op_receives(op.kind) && !recvs[i])
          bad_program("op " + std::to_string(i) + " is finished before it arrives");
        if (op.kind == OpKind::kRecvReduceSend || op.kind == OpKind::kRecvReduceCopySend)
          in_staging(prog.send_stage[i], prog.msg_bytes[i], i, "result");
        break;
      default:
        bad_program("unknown action code");
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const OpKind kind = plan.ops[i].kind;
    if (op_sends(kind) != (sends[i] == 1) || op_receives(kind) != (recvs[i] == 1) ||
        (kind != OpKind::kSend) != (finishes[i] == 1))
      bad_program("op " + std::to_string(i) + " is not sent, received and finished exactly as its kind says");
  }
}

void GroupedExecutor::run(const NativePlan& plan, const GroupedProgram& program, const GroupedArgs& args,
                          GroupBackend& backend) {
  try {
    run_actions(plan, program, args, backend);
  } catch (const Error& e) {
    backend.abort(e);
    throw;
  } catch (...) {  // e.g. KeyboardInterrupt while waiting: the peers must not wait for this rank
    backend.abort(Error(ErrorKind::kPeerLost,
                        "rank " + std::to_string(backend.rank()) + " was interrupted during " + describe(args.desc),
                        backend.rank()));
    throw;
  }
}

}  // namespace pycoll
