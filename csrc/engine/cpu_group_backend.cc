#include "engine/cpu_group_backend.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/reduce.h"

namespace pycoll {

namespace {
constexpr int64_t kYieldNs = 50'000;  // before sleeping, yield this long: a peer may share this core
constexpr int64_t kFirstSliceNs = 2'000'000;
constexpr int64_t kMaxSliceNs = 50'000'000;

int64_t ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}
}  // namespace

void CpuGroupBackend::begin(uint64_t seq, const Descriptor& desc) {
  seq_ = seq;
  desc_ = desc;
  hash_ = desc.hash();
  start_ = Clock::now();
  deadline_ = start_ + std::chrono::nanoseconds(timeout_ns_);
  t_.begin_collective(seq, desc);
}

void CpuGroupBackend::raise_timeout(int waiting_on_peer) {
  const double seconds = ns_between(start_, Clock::now()) * 1e-9;
  std::vector<int> missing = t_.ranks_not_entered(seq_);
  std::string msg = describe(desc_) + " (collective #" + std::to_string(seq_) + ") timed out on rank " +
                    std::to_string(t_.rank()) + " after " + std::to_string(seconds) + " s";
  if (!missing.empty()) {
    msg += ": rank(s)";
    for (size_t i = 0; i < missing.size(); ++i) msg += (i ? ", " : " ") + std::to_string(missing[i]);
    msg += " have not entered it";
  } else if (waiting_on_peer >= 0) {
    msg += ": rank " + std::to_string(waiting_on_peer) + " was not heard from";
  }
  throw Error(ErrorKind::kTimeout, msg + ". Raise the timeout with timeout= or PYCOLL_TIMEOUT if the job is only slow.",
              waiting_on_peer);
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
  Clock::time_point idle_since{}, last_progress = Clock::now();
  bool idle = false;
  int64_t slice = kFirstSliceNs;
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
          if (h.seq != seq_ || h.desc_hash != hash_ || h.msg_bytes != o.bytes || h.offset != pos_[k] || h.bytes > rest)
            t_.raise_header_mismatch(o.peer, h, seq_, desc_, o.bytes);
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
    const Clock::time_point now = Clock::now();
    if (progressed) {
      idle = false;
      slice = kFirstSliceNs;
      last_progress = now;
      continue;
    }
    if (!idle) {
      idle = true;
      idle_since = now;
    }
    if (ns_between(idle_since, now) < kYieldNs) {
      sched_yield();
      continue;
    }
    if (now >= deadline_) raise_timeout(ctx.waiting_on_peer);
    if (ns_between(last_progress, now) >= slice) {
      t_.check_health(ctx);
      if (on_idle_) on_idle_();
      last_progress = now;
      slice = std::min(slice * 2, kMaxSliceNs);
    }
    t_.wait(waits_.data(), waits_.size(), std::min<int64_t>(slice, ns_between(now, deadline_)));
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
