#include "engine/cpu_group_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "cpu/reduce.h"

namespace pycoll {

namespace {
// How a group waits (engine/waiter.h): no spinning, but before sleeping, yield this long: a peer may
// share this core.
WaitPolicy group_wait_policy(std::function<void()> on_idle) {
  WaitPolicy p;
  p.spin_ns = 0;
  p.yield_ns = 50'000;
  p.first_slice_ns = 2'000'000;
  p.max_slice_ns = 50'000'000;
  p.on_idle = std::move(on_idle);
  return p;
}
}  // namespace

CpuGroupBackend::CpuGroupBackend(Transport& transport, const cpu::Codec* codec, int64_t timeout_ns,
                                 std::function<void()> on_idle, const EntryStamp& stamp)
    : t_(transport),
      codec_(codec),
      timeout_ns_(timeout_ns),
      policy_(group_wait_policy(std::move(on_idle))),
      stamp_(stamp) {}

void CpuGroupBackend::begin(uint64_t seq, const Descriptor& desc) {
  seq_ = seq;
  desc_ = desc;
  hash_ = desc.hash();
  start_ = Clock::now();
  deadline_ = start_ + std::chrono::nanoseconds(timeout_ns_);
  t_.begin_collective(seq, desc, stamp_);
}

// Every message of the group progresses as far as the transport allows on each pass; messages to (from)
// one peer go in list order, as the FIFO matching of the programs requires.
void CpuGroupBackend::group(const P2P* ops, size_t n) {
  const size_t frag = t_.fragment_bytes();
  pos_.assign(n, 0);
  done_.assign(n, 0);
  busy_.assign(2 * static_cast<size_t>(t_.world()), 0);
  size_t left = n;
  WaitContext ctx{seq_, &desc_, -1};
  Waiter waiter(t_, policy_, spin_budget_ns_, seq_, desc_, start_, deadline_);
  while (left) {
    bool progressed = false;
    waits_.clear();
    std::fill(busy_.begin(), busy_.end(), 0);
    for (size_t k = 0; k < n; ++k) {
      if (done_[k]) continue;
      const P2P& o = ops[k];
      uint8_t& busy = busy_[2 * static_cast<size_t>(o.peer) + (o.send ? 0 : 1)];
      if (busy) continue;  // an earlier message to / from this peer is not through yet
      uint8_t* buf = static_cast<uint8_t*>(o.buf);
      while (!done_[k]) {
        const uint64_t rest = o.bytes - pos_[k];
        const uint32_t want = static_cast<uint32_t>(std::max<uint64_t>(1, (rest + frag - 1) / frag));
        if (o.send) {
          void* room = t_.acquire_send(o.peer);
          if (!room) {
            waits_.push_back({o.peer, true, want});
            ctx.waiting_on_peer = o.peer;
            break;
          }
          const uint64_t m = std::min<uint64_t>(frag, rest);
          std::memcpy(room, buf + pos_[k], m);
          t_.commit_send(o.peer, FragHeader{seq_, hash_, o.bytes, pos_[k], static_cast<uint32_t>(m), 0});
          pos_[k] += m;
        } else {
          FragHeader h;
          const void* data = t_.peek_recv(o.peer, &h);
          if (!data) {
            waits_.push_back({o.peer, false, want});
            ctx.waiting_on_peer = o.peer;
            break;
          }
          check_header(t_, o.peer, h, seq_, hash_, desc_, o.bytes, pos_[k]);
          std::memcpy(buf + pos_[k], data, h.bytes);
          t_.release_recv(o.peer);
          pos_[k] += h.bytes;
        }
        progressed = true;
        if (pos_[k] == o.bytes) {
          done_[k] = 1;
          --left;
        }
      }
      if (!done_[k]) busy = 1;
    }
    if (!left) break;
    waiter.after_pass(progressed, waits_.data(), waits_.size(), ctx);
  }
}

void CpuGroupBackend::reduce(DType dtype, RedOp op, void* dst, void* dst2, const void* a, const void* b, size_t n,
                             int avg_divisor) {
  cpu::reduce_fn(dtype, op)(dst, dst2, a, b, n, avg_divisor, false);
}

void CpuGroupBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

void CpuGroupBackend::encode(const codec::EncodeArgs& a) {
  if (!codec_) throw Error(ErrorKind::kInternal, "encode without a codec");
  codec_->encode(a);
}

void CpuGroupBackend::decode(const codec::DecodeArgs& a) {
  if (!codec_) throw Error(ErrorKind::kInternal, "decode without a codec");
  codec_->decode(a);
}

}  // namespace pycoll
