#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/copy.h"
#include "engine/executor.h"
#include "engine/op_semantics.h"
#include "engine/waiter.h"

namespace pycoll {

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
  if (a.dtype != DType::kFloat32 || !op_compressible(a.op))
    throw Error(ErrorKind::kInternal, "compressed plans run on float32 sums and averages only");
  if (!plan.codec_compatible)
    throw Error(ErrorKind::kInternal, "a compressed plan cannot COPY and sends final values from kEncoded, not OUTPUT");
  if (t_.fragment_bytes() < a.codec->block_bytes())
    throw Error(ErrorKind::kInvalidUsage, "codec " + a.codec->name() + " encodes a block into " +
                                              std::to_string(a.codec->block_bytes()) +
                                              " bytes, more than one transport fragment (" +
                                              std::to_string(t_.fragment_bytes()) + " bytes); use a smaller block");
}

void Executor::run_steps(const NativePlan& plan, const RunArgs& a) {
  const size_t isz = dtype_size(a.dtype);
  const cpu::ReduceFn reduce = cpu::reduce_fn(a.dtype, a.op);
  const int world = t_.world();
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
  auto encoded_offset = [&](uint64_t elem) { return elem / codec->block_elems() * block_bytes; };
  std::vector<uint64_t>& msg_bytes = msg_bytes_;
  msg_bytes.resize(plan.ops.size());
  for (size_t i = 0; i < plan.ops.size(); ++i)
    msg_bytes[i] = coded(plan.ops[i]) ? codec->encoded_bytes(plan.ops[i].bytes / 4) : plan.ops[i].bytes;
  if (codec) {
    encoded_.resize(codec->encoded_bytes(plan.output_bytes / 4));
    scratch_.resize(coded_frag_bytes / block_bytes * codec->block_elems() + codec->block_elems());
  }

  const Waiter::Clock::time_point start = Waiter::Clock::now();
  Waiter waiter(t_, policy_, spin_budget_ns_, seq, a.desc, start, start + std::chrono::nanoseconds(a.timeout_ns));

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
    d.divisor = finalize_divisor(a.op, op.finalize, world);
    cpu::EncodeArgs e;
    e.residual = residual;
    e.residual_scale = residual_scale(a.op, op.finalize, world);
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
    const int divisor = finalize_divisor(a.op, op.finalize, world);
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
      check_header(t_, op.recv_peer, h, seq, hash, a.desc, total, pos[i], whole);
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
      waiter.after_pass(progressed, waits.data(), waits.size(), ctx);
    }
  }
  if (stream_outputs) cpu::stream_fence();
}

}  // namespace pycoll
