#include "engine/executor.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/copy.h"

namespace pycoll {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMinSpinNs = 2000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void Executor::run(const NativePlan& plan, const RunArgs& args) {
  check_codec_plan(plan, args);  // before anything is sent: every rank makes the same call and raises alike
  uint64_t seq = ++seq_;
  t_.begin_collective(seq, args.desc);  // throws the original error if the communicator was aborted
  try {
    run_steps(plan, args);
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
  if (a.dtype != DType::kFloat32 || a.op == RedOp::kMin || a.op == RedOp::kMax || a.op == RedOp::kProd)
    throw Error(ErrorKind::kInternal, "compressed plans run on float32 sums and averages only");
  if (!plan.codec_compatible)
    throw Error(ErrorKind::kInternal, "a compressed plan cannot COPY and sends final values from kEncoded, not OUTPUT");
  if (t_.fragment_bytes() < a.codec->block_bytes())
    throw Error(ErrorKind::kInvalidUsage, "codec " + a.codec->name() + " encodes a block into " +
                                              std::to_string(a.codec->block_bytes()) +
                                              " bytes, more than one transport fragment (" +
                                              std::to_string(t_.fragment_bytes()) + " bytes); use a smaller block");
}

void Executor::raise_timeout(const RunArgs& args, int waiting_on_peer, double seconds) {
  std::vector<int> missing = t_.ranks_not_entered(seq_);
  std::string msg = describe(args.desc) + " (collective #" + std::to_string(seq_) + ") timed out on rank " +
                    std::to_string(t_.rank()) + " after " + std::to_string(seconds) + " s: ";
  if (!missing.empty()) {
    msg += "rank(s) " + join_ranks(missing) + " have not entered it";
    if (waiting_on_peer >= 0) msg += "; this rank was waiting for rank " + std::to_string(waiting_on_peer);
  } else if (waiting_on_peer >= 0) {
    msg += "every rank entered it, but rank " + std::to_string(waiting_on_peer) +
           " was not heard from (it may be stuck or far slower)";
  } else {
    msg += "every rank entered it";
  }
  msg += ". Raise the timeout with timeout= or PYCOLL_TIMEOUT if the job is only slow.";
  throw Error(ErrorKind::kTimeout, msg, waiting_on_peer);
}

void Executor::run_steps(const NativePlan& plan, const RunArgs& a) {
  const size_t isz = dtype_size(a.dtype);
  const cpu::ReduceFn reduce = cpu::reduce_fn(a.dtype, a.op);
  const int avg_divisor = a.op == RedOp::kAvg ? t_.world() : 0;
  const uint64_t hash = a.desc.hash();
  const uint64_t seq = seq_;
  uint8_t* const in = const_cast<uint8_t*>(static_cast<const uint8_t*>(a.input));
  uint8_t* const out = static_cast<uint8_t*>(a.output);
  auto buffer = [&](int32_t id) { return id == kInput ? in : out; };

  // With a codec, plan offsets and counts are float32 elements of the buffers, and a message carries the
  // encoding of its op's elements, cut into fragments of whole blocks (the last may end on a partial one),
  // so each fragment is encoded and decoded on its own. Without one, or for an op marked uncompressed, a
  // message is the op's bytes.
  const cpu::Codec* const codec = a.codec;
  auto coded = [codec](const PlanOp& op) { return codec && !op.uncompressed; };
  const size_t block_bytes = codec ? codec->block_bytes() : 1;
  const size_t coded_frag_bytes = codec ? t_.fragment_bytes() / block_bytes * block_bytes : 0;
  auto frag_bytes = [&](const PlanOp& op) -> size_t { return coded(op) ? coded_frag_bytes : t_.fragment_bytes(); };
  const uint32_t rounding_key = codec ? codec::rounding_key(a.seed, static_cast<uint32_t>(t_.rank()), seq_) : 0;
  const float residual_scale = a.op == RedOp::kAvg ? static_cast<float>(t_.world()) : 1.0f;
  auto encoded_offset = [&](uint64_t elem) { return elem / codec->block_elems() * block_bytes; };
  std::vector<uint64_t>& msg_bytes = msg_bytes_;
  msg_bytes.resize(plan.ops.size());
  for (size_t i = 0; i < plan.ops.size(); ++i)
    msg_bytes[i] = coded(plan.ops[i]) ? codec->encoded_bytes(plan.ops[i].bytes / 4) : plan.ops[i].bytes;
  if (codec) {
    encoded_.resize(codec->encoded_bytes(plan.output_bytes / 4));
    scratch_.resize(coded_frag_bytes / block_bytes * codec->block_elems() + codec->block_elems());
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::nanoseconds(a.timeout_ns);

  const bool stream_outputs = !codec && plan.output_bytes >= policy_.stream_min_bytes;
  auto copy = [](void* dst, const void* src, size_t n, bool stream) {
    if (stream)
      cpu::stream_copy(dst, src, n);
    else
      std::memcpy(dst, src, n);
  };
  const size_t n_ops = plan.ops.size();
  std::vector<uint64_t>& pos = pos_;  // bytes done (sent for SEND, received for the others)
  std::vector<uint8_t>& done = done_;
  pos.assign(n_ops, 0);
  done.assign(n_ops, 0);

  WaitContext ctx{seq, &a.desc, -1};
  std::vector<WaitItem>& waits = waits_;  // what blocked this pass, for Transport::wait
  auto fragments_left = [](uint64_t bytes, uint64_t frag) {
    return static_cast<uint32_t>(std::max<uint64_t>(1, (bytes + frag - 1) / frag));
  };
  bool idle = false;  // whether this rank is in a wait (idle_since is its start)
  Clock::time_point idle_since = start;
  int64_t slice = policy_.first_slice_ns;
  Clock::time_point last_progress = start;

  // Sends one fragment at a time of a pure SEND, as long as the transport has room.
  auto pump_send = [&](size_t i) {
    const PlanOp& op = plan.ops[i];
    const uint64_t frag = frag_bytes(op);
    bool progressed = false;
    while (!done[i]) {
      void* room = t_.acquire_send(op.send_peer);
      if (!room) {
        ctx.waiting_on_peer = op.send_peer;
        waits.push_back({op.send_peer, true, fragments_left(msg_bytes[i] - pos[i], frag)});
        break;
      }
      const uint64_t total = msg_bytes[i];
      const uint64_t n = std::min<uint64_t>(frag, total - pos[i]);
      if (!coded(op)) {
        std::memcpy(room, buffer(op.src_buf) + op.src_off + pos[i], n);
      } else if (op.src_buf == kEncoded) {  // a final value, encoded once by its owner: forward its bits
        std::memcpy(room, encoded_.data() + encoded_offset(op.src_off / 4) + pos[i], n);
      } else {
        const uint64_t elem = op.src_off / 4 + pos[i] / block_bytes * codec->block_elems();
        cpu::EncodeArgs e;
        e.src = reinterpret_cast<const float*>(buffer(op.src_buf)) + elem;
        e.residual = a.residual ? a.residual + elem : nullptr;
        e.out = static_cast<uint8_t*>(room);
        e.n = codec->elements_in(n, elem - op.src_off / 4, op.bytes / 4);
        e.index = elem;
        e.key = rounding_key;
        codec->encode(e);
      }
      t_.commit_send(op.send_peer, FragHeader{seq, hash, total, pos[i], static_cast<uint32_t>(n), 0});
      pos[i] += n;
      done[i] = pos[i] == total;
      progressed = true;
    }
    return progressed;
  };

  // The codec's work on one received fragment of `n` bytes (see "Compressed plans" in
  // pycoll/algorithms/plan.py): decode (and accumulate), and where the op finalizes or sends a reduced
  // value, encode it once; the decoded encoding is what is kept, so every rank ends with the same bits.
  auto codec_recv = [&](const PlanOp& op, uint64_t op_pos, const uint8_t* frag, uint64_t n, void* room) {
    const uint64_t first = (op_pos / block_bytes) * codec->block_elems();  // element within the op
    const uint64_t m = codec->elements_in(n, first, op.bytes / 4);
    const uint64_t elem = (op_receives_into_dst(op.kind) ? op.dst_off : op.src_off) / 4 + first;
    float* const dst = reinterpret_cast<float*>(buffer(op.dst_buf) + op.dst_off) + first;
    const float* const src = reinterpret_cast<const float*>(buffer(op.src_buf) + op.src_off) + first;
    float* const residual = a.residual ? a.residual + elem : nullptr;
    uint8_t* const keep = encoded_.data() + encoded_offset(op.dst_off / 4 + first);
    cpu::DecodeArgs d;
    d.in = frag;
    d.n = m;
    d.divisor = op.finalize ? avg_divisor : 0;
    cpu::EncodeArgs e;
    e.residual = residual;
    e.residual_scale = op.finalize ? residual_scale : 1.0f;
    e.n = m;
    e.index = elem;
    e.key = rounding_key;
    switch (op.kind) {
      case OpKind::kRecv:  // a final value: kept, as it may be forwarded later (hierarchical all-reduce)
        std::memcpy(keep, frag, n);
        d.dst = dst;
        codec->decode(d);
        break;
      case OpKind::kRecvCopySend:
        std::memcpy(room, frag, n);
        std::memcpy(keep, frag, n);
        d.dst = dst;
        codec->decode(d);
        break;
      case OpKind::kRecvReduce:
      case OpKind::kRecvReduceCopySend:
      case OpKind::kRecvReduceSend: {
        const bool to_dst = op.kind != OpKind::kRecvReduceSend;
        d.dst = to_dst ? dst : scratch_.data();
        d.acc = src;
        d.residual = op.src_buf == kInput ? residual : nullptr;  // the input is read here: consume it
        codec->decode(d);
        if (op.kind == OpKind::kRecvReduce && !op.finalize) break;  // a partial kept for a later op
        e.src = d.dst;
        e.decoded = to_dst ? dst : nullptr;
        e.out = op.kind == OpKind::kRecvReduce ? keep : static_cast<uint8_t*>(room);
        e.out2 = op.kind == OpKind::kRecvReduceCopySend ? keep : nullptr;
        codec->encode(e);
        break;
      }
      default:
        throw Error(ErrorKind::kInternal, "op kind " + std::to_string(int(op.kind)) + " does not receive");
    }
  };

  // Consumes the fragments of a receiving op that have arrived (forwarding them if it also sends).
  auto pump_recv = [&](size_t i) {
    const PlanOp& op = plan.ops[i];
    const bool sends = op_sends(op.kind);
    const int divisor = op.finalize ? avg_divisor : 0;
    const uint64_t total = msg_bytes[i];
    // Final values go to memory with streaming stores in large collectives (never partials read again).
    const bool stream = stream_outputs && (op.finalize || op.kind == OpKind::kRecv ||
                                           op.kind == OpKind::kRecvCopySend || op.kind == OpKind::kRecvReduceCopySend);
    bool progressed = false;
    while (!done[i]) {
      FragHeader h;
      const uint8_t* frag = static_cast<const uint8_t*>(t_.peek_recv(op.recv_peer, &h));
      if (!frag) {
        ctx.waiting_on_peer = op.recv_peer;
        waits.push_back({op.recv_peer, false, fragments_left(total - pos[i], frag_bytes(op))});
        break;
      }
      // A fragment is whole elements, or with a codec whole blocks unless it ends the message.
      const bool whole = coded(op) ? (h.bytes % block_bytes == 0 || pos[i] + h.bytes == total) : h.bytes % isz == 0;
      if (h.seq != seq || h.desc_hash != hash || h.msg_bytes != total || h.offset != pos[i] ||
          h.bytes > total - pos[i] || !whole)
        t_.raise_header_mismatch(op.recv_peer, h, seq, a.desc, total);
      void* room = nullptr;
      if (sends) {
        room = t_.acquire_send(op.send_peer);
        if (!room) {
          ctx.waiting_on_peer = op.send_peer;
          waits.push_back({op.send_peer, true, 1});
          break;
        }
      }
      const uint64_t n = h.bytes;
      if (coded(op)) {
        codec_recv(op, pos[i], frag, n, room);
      } else {
        uint8_t* dst = buffer(op.dst_buf) + op.dst_off + pos[i];
        const uint8_t* src = buffer(op.src_buf) + op.src_off + pos[i];
        switch (op.kind) {
          case OpKind::kRecv:
            copy(dst, frag, n, stream);
            break;
          case OpKind::kRecvReduce:
            reduce(dst, nullptr, src, frag, n / isz, divisor, stream);
            break;
          case OpKind::kRecvReduceSend:
            reduce(room, nullptr, src, frag, n / isz, divisor, false);
            break;
          case OpKind::kRecvReduceCopySend:
            reduce(dst, room, src, frag, n / isz, divisor, stream);
            break;
          case OpKind::kRecvCopySend:
            std::memcpy(room, frag, n);
            copy(dst, frag, n, stream);
            break;
          default:
            throw Error(ErrorKind::kInternal, "op kind " + std::to_string(int(op.kind)) + " does not receive");
        }
      }
      if (sends) t_.commit_send(op.send_peer, FragHeader{seq, hash, total, pos[i], static_cast<uint32_t>(n), 0});
      t_.release_recv(op.recv_peer);
      pos[i] += n;
      done[i] = pos[i] == total;
      progressed = true;
    }
    return progressed;
  };

  const size_t n_steps = plan.step_begin.empty() ? 0 : plan.step_begin.size() - 1;
  for (size_t s = 0; s < n_steps; ++s) {
    const size_t b = plan.step_begin[s], e = plan.step_begin[s + 1];
    size_t next_recv = b;  // receiving ops (and COPY) complete in list order
    for (;;) {
      waits.clear();
      bool progressed = false;
      bool sends_done = true;
      for (size_t i = b; i < e; ++i) {
        const PlanOp& op = plan.ops[i];
        if (op.kind != OpKind::kSend || done[i]) continue;
        if (op.prev_send_same_peer < 0 || done[op.prev_send_same_peer]) progressed |= pump_send(i);
        sends_done &= done[i] != 0;
      }
      while (next_recv < e) {
        const PlanOp& op = plan.ops[next_recv];
        if (op.kind == OpKind::kSend) {
          ++next_recv;
          continue;
        }
        if (op.kind == OpKind::kCopy) {
          uint8_t* dst = buffer(op.dst_buf) + op.dst_off;
          const uint8_t* src = buffer(op.src_buf) + op.src_off;
          if (dst != src && op.bytes) std::memmove(dst, src, op.bytes);
          done[next_recv++] = 1;
          progressed = true;
          continue;
        }
        // A fused op's output must queue behind earlier messages of this step to the same peer.
        if (op_sends(op.kind) && op.prev_send_same_peer >= 0 && !done[op.prev_send_same_peer]) break;
        progressed |= pump_recv(next_recv);
        if (!done[next_recv]) break;
        ++next_recv;
      }
      if (sends_done && next_recv == e) break;

      const Clock::time_point now = Clock::now();
      if (progressed) {
        if (idle && policy_.spin_ns > 0) {
          // A wait that ended while spinning says spinning pays: spin longer next time. One that had to
          // sleep anyway (a loaded machine, or the peer waiting for this very core) halves it, down to
          // a floor that keeps probing whether spinning pays again.
          const bool spin_paid = ns_between(idle_since, now) <= spin_budget_ns_;
          spin_budget_ns_ =
              spin_paid ? std::min(policy_.spin_ns, 2 * spin_budget_ns_) : std::max(kMinSpinNs, spin_budget_ns_ / 2);
        }
        idle = false;
        slice = policy_.first_slice_ns;
        last_progress = now;
        continue;
      }
      if (!idle) {
        idle = true;
        idle_since = now;
      }
      if (ns_between(idle_since, now) < spin_budget_ns_) {
        cpu_relax();
        continue;
      }
      if (ns_between(idle_since, now) < spin_budget_ns_ + policy_.yield_ns) {
        sched_yield();  // hand the core to a peer that shares it: far cheaper than sleep + wake-up
        continue;
      }
      if (now >= deadline) raise_timeout(a, ctx.waiting_on_peer, ns_between(start, now) * 1e-9);
      if (ns_between(last_progress, now) >= slice) {
        // Nothing happened for a whole slice: look for dead peers, mismatches and aborts.
        t_.check_health(ctx);
        if (policy_.on_idle) policy_.on_idle();
        last_progress = now;
        slice = std::min(slice * 2, policy_.max_slice_ns);
      }
      t_.wait(waits.data(), waits.size(), std::min<int64_t>(slice, ns_between(now, deadline)));
    }
  }
  if (stream_outputs) cpu::stream_fence();
}

}  // namespace pycoll
