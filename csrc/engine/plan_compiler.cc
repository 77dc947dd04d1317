#include "engine/plan_compiler.h"

#include <string>
#include <type_traits>
#include <vector>

#include "engine/plan_dependencies.h"
#include "engine/plan_fusion.h"
#include "pycoll/errors.h"

namespace pycoll {

namespace {

// Column order of the op table (pycoll/algorithms/plan.py OP_COLUMNS).
enum Col {
  kKind,
  kCount,
  kSendPeer,
  kRecvPeer,
  kSrcBuf,
  kSrcOff,
  kDstBuf,
  kDstOff,
  kFinalize,
  kUncompressed,
  kExact,
  kNumCols
};
static_assert(kNumCols == kPlanColumns, "kPlanColumns must match the op table's columns");

}  // namespace

std::shared_ptr<NativePlan> compile_plan(const Int64Array& table, const Int64Array& starts, int64_t itemsize,
                                         int64_t input_count, int64_t output_count, int rank, int world, bool coded,
                                         bool distinct, int64_t result_off, int64_t result_count) {
  if (table.ndim != 2 || (table.rows > 0 && table.cols != kNumCols))
    throw Error(ErrorKind::kInternal, "plan table must be [n_ops, " + std::to_string(kNumCols) + "]");
  if (itemsize <= 0 || itemsize > 8) throw Error(ErrorKind::kInternal, "bad itemsize");
  auto plan = std::make_shared<NativePlan>();
  plan->rank = rank;
  plan->world = world;
  plan->coded = coded;
  plan->distinct = distinct;
  if (result_off < 0 || result_count < 0 ||
      (result_count > 0 && (distinct || input_count != output_count || result_off + result_count > output_count)))
    throw Error(ErrorKind::kInternal, "a plan's result range must lie in its one, in-place buffer");
  plan->result_off = static_cast<uint64_t>(result_off) * itemsize;
  plan->result_bytes = static_cast<uint64_t>(result_count) * itemsize;
  plan->input_bytes = static_cast<uint64_t>(input_count) * itemsize;
  plan->output_bytes = static_cast<uint64_t>(output_count) * itemsize;
  const int64_t n = table.rows;
  const Int64Array& t = table;
  const Int64Array& st = starts;
  if (starts.size < 1 || st(0) != 0 || st(starts.size - 1) != n)
    throw Error(ErrorKind::kInternal, "plan step starts must run from 0 to the number of ops");
  plan->ops.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    PlanOp op{};
    op.kind = static_cast<OpKind>(t(i, kKind));
    if (t(i, kKind) < 0 || t(i, kKind) > static_cast<int64_t>(OpKind::kCopy))
      throw Error(ErrorKind::kInternal, "plan op " + std::to_string(i) + " has unknown kind");
    op.bytes = static_cast<uint64_t>(t(i, kCount)) * itemsize;
    op.send_peer = static_cast<int32_t>(t(i, kSendPeer));
    op.recv_peer = static_cast<int32_t>(t(i, kRecvPeer));
    op.src_buf = static_cast<int32_t>(t(i, kSrcBuf));
    op.dst_buf = static_cast<int32_t>(t(i, kDstBuf));
    op.src_off = static_cast<uint64_t>(t(i, kSrcOff)) * itemsize;
    op.dst_off = static_cast<uint64_t>(t(i, kDstOff)) * itemsize;
    op.finalize = t(i, kFinalize) != 0;
    op.uncompressed = t(i, kUncompressed) != 0;
    op.exact = t(i, kExact) != 0;
    auto bad = [&](const std::string& why) {
      throw Error(ErrorKind::kInternal, "plan op " + std::to_string(i) + " is invalid: " + why);
    };
    if (t(i, kCount) < 0) bad("negative count");
    if (op.exact && !((op.kind == OpKind::kRecvReduce && op.finalize) || op.kind == OpKind::kCopy))
      bad("only a finalizing RECV_REDUCE or a COPY is exact");
    if (op_sends(op.kind) && (op.send_peer < 0 || op.send_peer >= world || op.send_peer == rank))
      bad("send peer out of range");
    if (op_receives(op.kind) && (op.recv_peer < 0 || op.recv_peer >= world || op.recv_peer == rank))
      bad("receive peer out of range");
    auto limit = [&](int32_t buf) { return buf == kInput ? plan->input_bytes : plan->output_bytes; };
    if (op.src_buf < 0 || op.src_buf > kEncoded || op.dst_buf < 0 || op.dst_buf > kOutput) bad("unknown buffer");
    if (op.src_buf == kEncoded && op.kind != OpKind::kSend) bad("only SEND reads the encoded buffer");
    if (op_reads_src(op.kind) && op.src_off + op.bytes > limit(op.src_buf)) bad("reads past the end of its buffer");
    if (op_receives_into_dst(op.kind) && op.dst_off + op.bytes > limit(op.dst_buf))
      bad("writes past the end of its buffer");
    plan->uses_encoded |= op.src_buf == kEncoded;
    // kEncoded is kept where a SEND forwards from it, a finalizing RECV_REDUCE encodes its final value into it
    // or a compressed COPY encodes its source into it (NativePlan::keeps_encoded).
    plan->keeps_encoded |= op.src_buf == kEncoded || (op.kind == OpKind::kCopy && !op.uncompressed) ||
                           (op.kind == OpKind::kRecvReduce && op.finalize && !op.uncompressed && !op.exact);
    plan->codec_compatible &= !(op.kind == OpKind::kSend && op.src_buf == kOutput && !op.uncompressed);
    plan->ops.push_back(op);
  }
  for (int64_t s = 0; s < starts.size; ++s) {
    if (s > 0 && st(s) < st(s - 1)) throw Error(ErrorKind::kInternal, "plan step starts must not decrease");
    plan->step_begin.push_back(static_cast<uint32_t>(st(s)));
  }
  link_dependencies(*plan, coded);
  find_chains(*plan);
  return plan;
}

std::shared_ptr<GroupedProgram> compile_program(const NativePlan& plan, const ProgramArrays& arrays) {
  const Int64Array& actions = arrays.actions;
  if (actions.ndim != 2 || (actions.rows > 0 && actions.cols != 2))
    throw Error(ErrorKind::kInternal, "program actions must be [n, 2]");
  auto p = std::make_shared<GroupedProgram>();
  const Int64Array& t = actions;
  for (int64_t k = 0; k < actions.rows; ++k) {
    if (t(k, 0) < 0 || t(k, 0) > static_cast<int64_t>(GroupAction::kFinish))
      throw Error(ErrorKind::kInternal, "grouped program has an unknown action code");
    p->action.push_back(static_cast<GroupAction>(t(k, 0)));
    p->op.push_back(static_cast<int32_t>(t(k, 1)));
  }
  auto copy = [](auto& out, const Int64Array& in) {
    for (int64_t i = 0; i < in.size; ++i) out.push_back(static_cast<std::decay_t<decltype(out[0])>>(in(i)));
  };
  copy(p->msg_bytes, arrays.msg_bytes);
  copy(p->recv_stage, arrays.recv_stage);
  copy(p->send_stage, arrays.send_stage);
  copy(p->work_stage, arrays.work_stage);
  if (arrays.staging_bytes < 0) throw Error(ErrorKind::kInternal, "negative staging size");
  p->staging_bytes = static_cast<uint64_t>(arrays.staging_bytes);
  validate_program(*p, plan);
  return p;
}

}  // namespace pycoll
