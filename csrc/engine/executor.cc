#include "engine/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/copy.h"
#include "engine/op_semantics.h"
#include "engine/waiter.h"

namespace pycoll {

void Executor::run(const NativePlan& plan, const RunArgs& args) {
  check_codec_plan(plan, args);  // before anything is sent: every rank makes the same call and raises alike
  uint64_t seq = ++seq_;
  t_.begin_collective(seq, args.desc, args.stamp);  // throws the original error if the communicator was aborted
  try {
    run_plan(plan, args);
  } catch (const Error& e) {
    t_.abort(e);
    throw;
  } catch (...) {  // e.g. KeyboardInterrupt from on_idle: the peers must not wait for this rank
    t_.abort(Error(ErrorKind::kPeerLost,
                   "rank " + std::to_string(t_.rank()) + " was interrupted during " + describe(args.desc), t_.rank()));
    throw;
  }
}

void Executor::check_codec_plan(const NativePlan& plan, const RunArgs& a) {
  if (!a.codec) {
    if (plan.uses_encoded) throw Error(ErrorKind::kInternal, "a compressed plan was run without a codec");
    return;
  }
  if (!plan.coded) throw Error(ErrorKind::kInternal, "a plan compiled without a codec was run with one");
  if (a.dtype != DType::kFloat32 || !op_compressible(a.op))
    throw Error(ErrorKind::kInternal, "compressed plans run on float32 sums and averages only");
  if (!plan.codec_compatible)
    throw Error(ErrorKind::kInternal, "a compressed plan sends final values from kEncoded, not OUTPUT");
  if (t_.fragment_bytes() < a.codec->block_bytes())
    throw Error(ErrorKind::kInvalidUsage, "codec " + a.codec->name() + " encodes a block into " +
                                              std::to_string(a.codec->block_bytes()) +
                                              " bytes, more than one transport fragment (" +
                                              std::to_string(t_.fragment_bytes()) + " bytes); use a smaller block");
}

// One run of a plan: the per-run constants and the parts of a run, by the plan's names (see
// pycoll/algorithms/plan.py). Ops run as soon as what they wait for is done (their deps:
// engine/plan_dependencies.h), not step after step: each pass goes over the ops of a window, from the
// first op not done through the end of the step kLookaheadSteps after its own, and moves every op that
// may start as far as the transport lets it (a SEND fragment by fragment while there is room; a
// receiving op, RECV, RECV_REDUCE, RECV_REDUCE_SEND, RECV_REDUCE_COPY_SEND or RECV_COPY_SEND, fragment by
// fragment as they arrive; a COPY at once). So sends run ahead of their step and a link keeps several
// segments in flight, up to what its transport holds, while the results are those of running the steps
// in order. A pass that moves nothing hands over to the Waiter with what blocked it.
//
// With a codec, plan offsets and counts are float32 elements of the buffers, and a message carries the
// encoding of its op's elements, cut into fragments of whole blocks (the last may end on a partial one),
// so each fragment is encoded and decoded on its own. Without one, or for an op marked uncompressed, a
// message is the op's bytes.
class Executor::PlanRunner {
 public:
  PlanRunner(Executor& x, const NativePlan& plan, const RunArgs& a);
  // Runs every op of the plan to its end.
  void run();

  // How many steps past the step of the first op not done a pass looks for ops that may start.
  static constexpr size_t kLookaheadSteps = 8;

 private:
  bool coded(const PlanOp& op) const { return codec_ && !op.uncompressed; }
  // FragHeader::count_lo of op's message: its elements with a codec (its encoded size may not tell them).
  uint32_t count_lo(const PlanOp& op) const { return coded(op) ? static_cast<uint32_t>(op.bytes / 4) : 0; }
  size_t frag_bytes(const PlanOp& op) const { return coded(op) ? coded_frag_bytes_ : t_.fragment_bytes(); }
  uint8_t* buffer(int32_t id) const { return id == kInput ? in_ : out_; }
  uint64_t encoded_offset(uint64_t elem) const { return encoded_.offset(elem); }
  static uint32_t fragments_left(uint64_t bytes, uint64_t frag) {
    return static_cast<uint32_t>(std::max<uint64_t>(1, (bytes + frag - 1) / frag));
  }
  static void copy(void* dst, const void* src, size_t n, bool stream) {
    if (stream)
      cpu::stream_copy(dst, src, n);
    else
      std::memcpy(dst, src, n);
  }
  // Whether every op that op i waits for is done (remembered once true); `first`: the first op not done.
  bool ready(size_t i, size_t first);
  // Moves op i as far as it can go now; true if it moved.
  bool pump(size_t i);
  // Whether op i may start but for the ops [skip_begin, skip_end) (a chain's members): its fence is passed
  // and every other op it waits for is done.
  bool deps_done(size_t i, size_t first, uint32_t skip_begin, uint32_t skip_end) const;
  bool chain_ready(const Chain& c, size_t first);
  bool pump_chain(const Chain& c, size_t first);
  void reduce_chain(const Chain& c, uint64_t pos, uint64_t n, uint8_t* room);
  void blocked_on(int peer, bool room, uint64_t fragments) {
    if (ctx_.waiting_on_peer < 0) ctx_.waiting_on_peer = peer;  // the earliest blocked op names the peer
    waits_.push_back({peer, room, static_cast<uint32_t>(fragments)});
  }
  bool pump_send(size_t i);
  void encode_fragment(const PlanOp& op, uint64_t op_pos, uint64_t n, void* room);
  bool pump_recv(size_t i);
  void plain_recv(const PlanOp& op, uint64_t op_pos, const uint8_t* frag, uint64_t n, void* room, bool stream);
  void codec_recv(const PlanOp& op, uint64_t op_pos, const uint8_t* frag, uint64_t n, void* room);
  void codec_copy(const PlanOp& op);

  Executor& x_;
  Transport& t_;
  const NativePlan& plan_;
  const RunArgs& a_;
  const size_t isz_;
  const cpu::ReduceFn reduce_;
  const int world_;
  const uint64_t hash_;
  const uint64_t seq_;
  uint8_t* const in_;
  uint8_t* const out_;
  const cpu::Codec* const codec_;
  const size_t block_bytes_;
  const size_t coded_frag_bytes_;
  const EncodedLayout encoded_;
  const bool keep_encoded_;  // plan.keeps_encoded: received and encoded final values are kept in kEncoded
  const uint32_t rounding_key_;
  const bool stream_outputs_;
  const bool fused_;  // chains run as one pass (engine/plan_fusion.h)
  // Per op: bytes on the wire, bytes done (sent for SEND, received for the others), whether done, and
  // whether everything it waits for is done.
  std::vector<uint64_t>& msg_bytes_;
  std::vector<uint64_t>& pos_;
  std::vector<uint8_t>& done_;
  std::vector<uint8_t>& ready_;
  std::vector<WaitItem>& waits_;  // what blocked this pass, for Transport::wait
  WaitContext ctx_;
  const Waiter::Clock::time_point start_;
  Waiter waiter_;
};

Executor::PlanRunner::PlanRunner(Executor& x, const NativePlan& plan, const RunArgs& a)
    : x_(x),
      t_(x.t_),
      plan_(plan),
      a_(a),
      isz_(dtype_size(a.dtype)),
      reduce_(cpu::reduce_fn(a.dtype, a.op)),
      world_(x.t_.world()),
      hash_(a.desc.hash()),
      seq_(x.seq_),
      in_(const_cast<uint8_t*>(static_cast<const uint8_t*>(a.input))),
      out_(static_cast<uint8_t*>(a.output)),
      codec_(a.codec),
      block_bytes_(codec_ ? codec_->block_bytes() : 1),
      coded_frag_bytes_(codec_ ? t_.fragment_bytes() / block_bytes_ * block_bytes_ : 0),
      encoded_(codec_ ? encoded_layout(plan, codec_->block_elems(), block_bytes_,
                                       [&](uint64_t n) { return codec_->encoded_bytes(n); })
                      : EncodedLayout{}),
      keep_encoded_(codec_ && plan.keeps_encoded),
      rounding_key_(codec_ ? codec::rounding_key(a.seed, static_cast<uint32_t>(t_.rank()), seq_) : 0),
      stream_outputs_(!codec_ && plan.output_bytes >= x.policy_.stream_min_bytes),
      fused_(!codec_ && x.policy_.fuse),
      msg_bytes_(x.msg_bytes_),
      pos_(x.pos_),
      done_(x.done_),
      ready_(x.ready_),
      waits_(x.waits_),
      ctx_{seq_, &a.desc, -1},
      start_(a.start_ns ? Waiter::Clock::time_point(std::chrono::nanoseconds(a.start_ns)) : Waiter::Clock::now()),
      waiter_(t_, x.policy_, x.spin_budget_ns_, seq_, a.desc, start_, start_ + std::chrono::nanoseconds(a.timeout_ns),
              &x.stats_) {
  const size_t n_ops = plan.ops.size();
  msg_bytes_.resize(n_ops);
  for (size_t i = 0; i < n_ops; ++i)
    msg_bytes_[i] = coded(plan.ops[i]) ? codec_->encoded_bytes(plan.ops[i].bytes / 4) : plan.ops[i].bytes;
  if (codec_) {
    if (keep_encoded_) x.encoded_.resize(encoded_.size(plan.output_bytes / 4));
    x.scratch_.resize(coded_frag_bytes_ / block_bytes_ * codec_->block_elems() + codec_->block_elems());
  }
  pos_.assign(n_ops, 0);
  x.chain_frags_.resize(static_cast<size_t>(world_));
  done_.assign(n_ops, 0);
  ready_.assign(n_ops, 0);
}

void Executor::PlanRunner::run() {
  const size_t n = plan_.ops.size();
  const size_t n_steps = plan_.step_begin.empty() ? 0 : plan_.step_begin.size() - 1;
  size_t first = 0, step = 0;  // the first op not done, and its step
  while (first < n) {
    while (plan_.step_begin[step + 1] <= first) ++step;
    const size_t window_end = plan_.step_begin[std::min(step + 1 + kLookaheadSteps, n_steps)];
    waits_.clear();
    ctx_.waiting_on_peer = -1;
    bool progressed = false;
    for (size_t i = first; i < window_end; ++i) {
      if (done_[i]) continue;
      const int32_t chain = plan_.ops[i].chain;
      if (chain < 0) {
        if (ready(i, first)) progressed |= pump(i);
      } else if (plan_.chains[chain].first == i && fused_ && chain_ready(plan_.chains[chain], first)) {
        progressed |= pump_chain(plan_.chains[chain], first);
      } else if (!fused_ && ready(i, first)) {
        progressed |= pump(i);
      }
    }
    while (first < n && done_[first]) ++first;
    if (first == n) break;
    if (a_.record) a_.record->flush();  // this rank has sent what it could: its record is written while it waits
    waiter_.after_pass(progressed, waits_.data(), waits_.size(), ctx_);
  }
  waiter_.finish();
  if (stream_outputs_) cpu::stream_fence();
  x_.stats_.collectives.add(1);
  const Waiter::Clock::time_point end = Waiter::Clock::now();
  x_.last_end_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count();
  x_.stats_.run_ns.add(static_cast<uint64_t>(Waiter::ns_between(start_, end)));
}

bool Executor::PlanRunner::ready(size_t i, size_t first) {
  if (ready_[i]) return true;
  if (!deps_done(i, first, 0, 0)) return false;
  ready_[i] = 1;
  return true;
}

bool Executor::PlanRunner::deps_done(size_t i, size_t first, uint32_t skip_begin, uint32_t skip_end) const {
  const PlanOp& op = plan_.ops[i];
  if (first < op.after_all_before) return false;
  for (uint32_t d = op.deps_begin; d < op.deps_end; ++d) {
    const auto dep = static_cast<uint32_t>(plan_.deps[d]);
    if (!done_[dep] && (dep < skip_begin || dep >= skip_end)) return false;
  }
  return true;
}

bool Executor::PlanRunner::chain_ready(const Chain& c, size_t first) {
  if (ready_[c.first]) return true;
  for (uint32_t k = c.first; k < c.first + c.count; ++k)
    if (!deps_done(k, first, c.first, c.first + c.count)) return false;
  ready_[c.first] = 1;
  return true;
}

// A chain (engine/plan_fusion.h): fragment by fragment, as soon as one has arrived from every member's
// peer (and the last member, if it sends, has room), one pass reduces them all and writes the results
// where the members would, and into the slot of every publisher that is ready but for the chain, has
// room and has sent exactly as much.
bool Executor::PlanRunner::pump_chain(const Chain& c, size_t first) {
  const PlanOp& last = plan_.ops[c.first + c.count - 1];
  const uint64_t total = last.bytes;
  uint64_t& pos = pos_[c.first];
  bool progressed = false;
  while (pos < total) {
    uint64_t n = 0;
    for (uint32_t m = 0; m < c.count; ++m) {
      const PlanOp& op = plan_.ops[c.first + m];
      FragHeader h;
      x_.chain_frags_[m] = static_cast<const uint8_t*>(t_.peek_recv(op.recv_peer, &h));
      if (!x_.chain_frags_[m]) {
        blocked_on(op.recv_peer, false, fragments_left(total - pos, t_.fragment_bytes()));
        return progressed;
      }
      check_header(t_, op.recv_peer, h, seq_, hash_, a_.desc, total, pos, h.bytes % isz_ == 0);
      if (m > 0 && h.bytes != n)
        throw Error(ErrorKind::kInternal, "fragments of one chain differ in size (" + std::to_string(n) + " and " +
                                              std::to_string(h.bytes) + " bytes)");
      n = h.bytes;
    }
    void* room = nullptr;
    if (op_sends(last.kind) && !(room = t_.acquire_send(last.send_peer))) {
      blocked_on(last.send_peer, true, 1);
      return progressed;
    }
    x_.publish_ops_.clear();
    x_.publish_rooms_.clear();
    for (uint32_t p = c.publish_begin; p < c.publish_end; ++p) {
      const uint32_t j = plan_.publishers[p];
      if (done_[j] || pos_[j] != pos || !deps_done(j, first, c.first, c.first + c.count)) continue;
      if (void* r = t_.acquire_send(plan_.ops[j].send_peer)) {
        x_.publish_ops_.push_back(j);
        x_.publish_rooms_.push_back(static_cast<uint8_t*>(r));
      }
    }
    reduce_chain(c, pos, n, static_cast<uint8_t*>(room));
    const FragHeader h{seq_, hash_, total, pos, static_cast<uint32_t>(n), 0};
    if (room) t_.commit_send(last.send_peer, h);
    for (uint32_t j : x_.publish_ops_) {
      t_.commit_send(plan_.ops[j].send_peer, h);
      pos_[j] += n;
      done_[j] = pos_[j] == total;
    }
    for (uint32_t m = 0; m < c.count; ++m) t_.release_recv(plan_.ops[c.first + m].recv_peer);
    pos += n;
    progressed = true;
  }
  for (uint32_t k = c.first; k < c.first + c.count; ++k) done_[k] = 1;
  return progressed;
}

// One fragment of a chain, `n` bytes at `pos` of every member's message, block by block through a buffer
// that stays in L1: the members' reductions in their order, each step rounded as its op would; then the
// result where it goes (D, the last member's send `room` if it sends, the publishers' rooms).
void Executor::PlanRunner::reduce_chain(const Chain& c, uint64_t pos, uint64_t n, uint8_t* room) {
  constexpr uint64_t kBlockBytes = 8192;  // a multiple of every element size
  alignas(64) uint8_t block[kBlockBytes];
  const PlanOp& head = plan_.ops[c.first];
  const PlanOp& last = plan_.ops[c.first + c.count - 1];
  const uint8_t* src = buffer(head.src_buf) + head.src_off + pos;
  uint8_t* dst = buffer(head.dst_buf) + head.dst_off + pos;
  const int divisor = finalize_divisor(a_.op, last.finalize, world_);
  const bool stream = stream_outputs_ && last.finalize;
  for (uint64_t o = 0; o < n; o += kBlockBytes) {
    const uint64_t len = std::min(kBlockBytes, n - o);
    const size_t count = len / isz_;
    const uint8_t* partial = src + o;
    for (uint32_t m = 0; m + 1 < c.count; ++m) {
      reduce_(block, nullptr, partial, x_.chain_frags_[m] + o, count, 0, false);
      partial = block;
    }
    reduce_(block, nullptr, block, x_.chain_frags_[c.count - 1] + o, count, divisor, false);
    copy(dst + o, block, len, stream);
    if (room) std::memcpy(room + o, block, len);
    for (uint8_t* r : x_.publish_rooms_) std::memcpy(r + o, block, len);
  }
}

bool Executor::PlanRunner::pump(size_t i) {
  const PlanOp& op = plan_.ops[i];
  if (op.kind == OpKind::kSend) return pump_send(i);
  if (op.kind == OpKind::kCopy && coded(op)) {
    codec_copy(op);
    done_[i] = 1;
    return true;
  }
  if (op.kind == OpKind::kCopy) {
    uint8_t* dst = buffer(op.dst_buf) + op.dst_off;
    const uint8_t* src = buffer(op.src_buf) + op.src_off;
    if (dst != src && op.bytes) std::memmove(dst, src, op.bytes);
    done_[i] = 1;
    return true;
  }
  return pump_recv(i);
}

// SEND: one fragment at a time, as long as the transport has room.
bool Executor::PlanRunner::pump_send(size_t i) {
  const PlanOp& op = plan_.ops[i];
  const uint64_t frag = frag_bytes(op);
  bool progressed = false;
  while (!done_[i]) {
    void* room = t_.acquire_send(op.send_peer);
    if (!room) {
      blocked_on(op.send_peer, true, fragments_left(msg_bytes_[i] - pos_[i], frag));
      break;
    }
    const uint64_t total = msg_bytes_[i];
    const uint64_t n = std::min<uint64_t>(frag, total - pos_[i]);
    if (!coded(op)) {
      std::memcpy(room, buffer(op.src_buf) + op.src_off + pos_[i], n);
    } else if (op.src_buf == kEncoded) {  // a final value, encoded once by its owner: forward its bits
      std::memcpy(room, x_.encoded_.data() + encoded_offset(op.src_off / 4) + pos_[i], n);
    } else {
      encode_fragment(op, pos_[i], n, room);
    }
    t_.commit_send(op.send_peer, FragHeader{seq_, hash_, total, pos_[i], static_cast<uint32_t>(n), count_lo(op)});
    pos_[i] += n;
    done_[i] = pos_[i] == total;
    progressed = true;
  }
  return progressed;
}

// A compressed SEND of its own values: the fragment at `op_pos` (n bytes) of the message, encoded
// (with the error-feedback residual) straight into the transport's room.
void Executor::PlanRunner::encode_fragment(const PlanOp& op, uint64_t op_pos, uint64_t n, void* room) {
  const uint64_t elem = op.src_off / 4 + op_pos / block_bytes_ * codec_->block_elems();
  cpu::EncodeArgs e;
  e.src = reinterpret_cast<const float*>(buffer(op.src_buf)) + elem;
  e.residual = a_.residual ? a_.residual + elem : nullptr;
  e.out = static_cast<uint8_t*>(room);
  e.n = codec_->elements_in(n, elem - op.src_off / 4, op.bytes / 4);
  e.index = elem;
  e.key = rounding_key_;
  codec_->encode(e);
}

// A receiving op: consumes the fragments that have arrived (forwarding them if it also sends).
bool Executor::PlanRunner::pump_recv(size_t i) {
  const PlanOp& op = plan_.ops[i];
  const bool sends = op_sends(op.kind);
  const uint64_t total = msg_bytes_[i];
  // Final values go to memory with streaming stores in large collectives (never partials read again).
  const bool stream = stream_outputs_ && (op.finalize || op.kind == OpKind::kRecv || op.kind == OpKind::kRecvCopySend ||
                                          op.kind == OpKind::kRecvReduceCopySend);
  bool progressed = false;
  while (!done_[i]) {
    FragHeader h;
    const uint8_t* frag = static_cast<const uint8_t*>(t_.peek_recv(op.recv_peer, &h));
    if (!frag) {
      blocked_on(op.recv_peer, false, fragments_left(total - pos_[i], frag_bytes(op)));
      break;
    }
    // A fragment is whole elements, or with a codec whole blocks unless it ends the message.
    const bool whole = coded(op) ? (h.bytes % block_bytes_ == 0 || pos_[i] + h.bytes == total) : h.bytes % isz_ == 0;
    check_header(t_, op.recv_peer, h, seq_, hash_, a_.desc, total, pos_[i], whole);
    if (h.count_lo != count_lo(op))
      throw_count_mismatch(t_.rank(), op.recv_peer, h.count_lo, count_lo(op), seq_, a_.desc);
    void* room = nullptr;
    if (sends) {
      room = t_.acquire_send(op.send_peer);
      if (!room) {
        blocked_on(op.send_peer, true, 1);
        break;
      }
    }
    const uint64_t n = h.bytes;
    if (coded(op))
      codec_recv(op, pos_[i], frag, n, room);
    else
      plain_recv(op, pos_[i], frag, n, room, stream);
    if (sends)
      t_.commit_send(op.send_peer, FragHeader{seq_, hash_, total, pos_[i], static_cast<uint32_t>(n), count_lo(op)});
    t_.release_recv(op.recv_peer);
    pos_[i] += n;
    done_[i] = pos_[i] == total;
    progressed = true;
  }
  return progressed;
}

// A received fragment without a codec: copy or reduce it where the op says (and into `room`, the
// outgoing fragment, for the ops that also send).
void Executor::PlanRunner::plain_recv(const PlanOp& op, uint64_t op_pos, const uint8_t* frag, uint64_t n, void* room,
                                      bool stream) {
  const int divisor = finalize_divisor(a_.op, op.finalize, world_);
  uint8_t* dst = buffer(op.dst_buf) + op.dst_off + op_pos;
  const uint8_t* src = buffer(op.src_buf) + op.src_off + op_pos;
  switch (op.kind) {
    case OpKind::kRecv:
      copy(dst, frag, n, stream);
      break;
    case OpKind::kRecvReduce:
      reduce_(dst, nullptr, src, frag, n / isz_, divisor, stream);
      break;
    case OpKind::kRecvReduceSend:
      reduce_(room, nullptr, src, frag, n / isz_, divisor, false);
      break;
    case OpKind::kRecvReduceCopySend:
      reduce_(dst, room, src, frag, n / isz_, divisor, stream);
      break;
    case OpKind::kRecvCopySend:
      cpu::copy_twice(dst, room, frag, n, stream);
      break;
    default:
      throw Error(ErrorKind::kInternal, "op kind " + std::to_string(int(op.kind)) + " does not receive");
  }
}

// The codec's work on one received fragment of `n` bytes (see "Compressed plans" in
// pycoll/algorithms/plan.py): decode (and accumulate), and where the op finalizes or sends a reduced
// value, encode it once; the decoded encoding is what is kept, so every rank ends with the same bits.
void Executor::PlanRunner::codec_recv(const PlanOp& op, uint64_t op_pos, const uint8_t* frag, uint64_t n, void* room) {
  const uint64_t first = (op_pos / block_bytes_) * codec_->block_elems();  // element within the op
  const uint64_t m = codec_->elements_in(n, first, op.bytes / 4);
  const uint64_t elem = (op_receives_into_dst(op.kind) ? op.dst_off : op.src_off) / 4 + first;
  float* const dst = reinterpret_cast<float*>(buffer(op.dst_buf) + op.dst_off) + first;
  const float* const src = reinterpret_cast<const float*>(buffer(op.src_buf) + op.src_off) + first;
  float* const residual = a_.residual ? a_.residual + elem : nullptr;
  // What a read of INPUT consumes: the residual of the elements read (a reduce-scatter reads its own chunk
  // of INPUT into OUTPUT, so that is not `elem`).
  float* const consumed = a_.residual && op.src_buf == kInput ? a_.residual + op.src_off / 4 + first : nullptr;
  uint8_t* const keep = keep_encoded_ ? x_.encoded_.data() + encoded_offset(op.dst_off / 4 + first) : nullptr;
  cpu::DecodeArgs d;
  d.in = frag;
  d.n = m;
  d.divisor = finalize_divisor(a_.op, op.finalize, world_);
  cpu::EncodeArgs e;
  e.residual = residual;
  e.residual_scale = residual_scale(a_.op, op.finalize, world_);
  e.n = m;
  e.index = elem;
  e.key = rounding_key_;
  switch (op.kind) {
    case OpKind::kRecv:  // a final value: kept, as it may be forwarded later (hierarchical all-reduce)
      if (keep) std::memcpy(keep, frag, n);
      d.dst = dst;
      codec_->decode(d);
      break;
    case OpKind::kRecvCopySend:
      std::memcpy(room, frag, n);
      if (keep) std::memcpy(keep, frag, n);
      d.dst = dst;
      codec_->decode(d);
      break;
    case OpKind::kRecvReduce:
    case OpKind::kRecvReduceCopySend:
    case OpKind::kRecvReduceSend: {
      const bool to_dst = op.kind != OpKind::kRecvReduceSend;
      d.dst = to_dst ? dst : x_.scratch_.data();
      d.acc = src;
      d.residual = consumed;  // the input is read here: consume it
      codec_->decode(d);
      // A partial kept for a later op, or a reduce-scatter's final value, which stays here in float32.
      if (op.kind == OpKind::kRecvReduce && (!op.finalize || op.exact)) break;
      e.src = d.dst;
      e.decoded = to_dst ? dst : nullptr;
      e.out = op.kind == OpKind::kRecvReduce ? keep : static_cast<uint8_t*>(room);
      e.out2 = op.kind == OpKind::kRecvReduceCopySend ? keep : nullptr;
      codec_->encode(e);
      break;
    }
    default:
      throw Error(ErrorKind::kInternal, "op kind " + std::to_string(int(op.kind)) + " does not receive");
  }
}

// A compressed COPY (an all-gather's own chunk): encoded once into kEncoded, from where its SENDs
// forward the bytes, and the decoding of that encoding kept in dst, as every other rank decodes it (or,
// exact, the source itself).
void Executor::PlanRunner::codec_copy(const PlanOp& op) {
  const float* const src = reinterpret_cast<const float*>(buffer(op.src_buf) + op.src_off);
  float* const dst = reinterpret_cast<float*>(buffer(op.dst_buf) + op.dst_off);
  cpu::EncodeArgs e;
  e.src = src;
  e.out = x_.encoded_.data() + encoded_offset(op.dst_off / 4);
  e.decoded = op.exact ? nullptr : dst;
  e.n = op.bytes / 4;
  e.index = op.dst_off / 4;
  e.key = rounding_key_;
  codec_->encode(e);
  if (op.exact && op.bytes && static_cast<const void*>(dst) != src) std::memmove(dst, src, op.bytes);
}

void Executor::run_plan(const NativePlan& plan, const RunArgs& a) {
  PlanRunner(*this, plan, a).run();
}

}  // namespace pycoll
