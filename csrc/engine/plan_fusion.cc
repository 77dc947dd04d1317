#include "engine/plan_fusion.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pycoll {

namespace {

// Whether `op` may be the next member of a chain into the region (buf, off, bytes): it reads the chain's
// partial there and writes it back (see the header).
bool continues_chain(const PlanOp& op, int32_t buf, uint64_t off, uint64_t bytes) {
  return (op.kind == OpKind::kRecvReduce || op.kind == OpKind::kRecvReduceCopySend) && op.bytes == bytes &&
         op.src_buf == buf && op.src_off == off && op.dst_buf == buf && op.dst_off == off;
}

bool overlaps(uint64_t a_off, uint64_t a_bytes, uint64_t b_off, uint64_t b_bytes) {
  return a_off < b_off + b_bytes && b_off < a_off + a_bytes;
}

// The chain's publishers: SENDs of the region its last member finalizes, from the op after the chain to
// the end of the next step, until an op writes that region (in either buffer: they may alias).
void add_publishers(NativePlan& plan, Chain& chain, size_t step) {
  const PlanOp& last = plan.ops[chain.first + chain.count - 1];
  chain.publish_begin = chain.publish_end = static_cast<uint32_t>(plan.publishers.size());
  if (!last.finalize) return;
  const size_t n_steps = plan.step_begin.size() - 1;
  const uint32_t stop = plan.step_begin[std::min(step + 2, n_steps)];
  std::vector<int32_t> peers;  // one publisher per peer; none to the peer the last member sends to
  if (op_sends(last.kind)) peers.push_back(last.send_peer);
  for (uint32_t k = chain.first + chain.count; k < stop; ++k) {
    const PlanOp& op = plan.ops[k];
    if (op.kind == OpKind::kSend && op.src_buf == last.dst_buf && op.src_off == last.dst_off &&
        op.bytes == last.bytes && op.after_all_before == 0 &&
        std::find(peers.begin(), peers.end(), op.send_peer) == peers.end()) {
      peers.push_back(op.send_peer);
      plan.publishers.push_back(k);
    } else if (op_receives_into_dst(op.kind) && overlaps(op.dst_off, op.bytes, last.dst_off, last.bytes)) {
      break;
    }
  }
  chain.publish_end = static_cast<uint32_t>(plan.publishers.size());
}

}  // namespace

void find_chains(NativePlan& plan) {
  plan.chains.clear();
  plan.publishers.clear();
  for (PlanOp& op : plan.ops) op.chain = -1;
  if (plan.coded) return;
  std::vector<uint8_t> peer_taken(static_cast<size_t>(std::max(plan.world, 1)));
  for (size_t step = 0; step + 1 < plan.step_begin.size(); ++step) {
    const uint32_t end = plan.step_begin[step + 1];
    for (uint32_t i = plan.step_begin[step]; i < end;) {
      const PlanOp& head = plan.ops[i];
      if (head.kind != OpKind::kRecvReduce || head.finalize || head.bytes == 0 || head.src_off != head.dst_off) {
        ++i;
        continue;
      }
      std::fill(peer_taken.begin(), peer_taken.end(), 0);
      peer_taken[head.recv_peer] = 1;
      uint32_t j = i + 1;
      while (j < end && continues_chain(plan.ops[j], head.dst_buf, head.dst_off, head.bytes) &&
             !peer_taken[plan.ops[j].recv_peer]) {
        const PlanOp& member = plan.ops[j++];
        peer_taken[member.recv_peer] = 1;
        if (member.kind != OpKind::kRecvReduce || member.finalize) break;  // it sends or finalizes: the last
      }
      if (j - i < 2) {
        ++i;
        continue;
      }
      Chain chain{i, j - i, 0, 0};
      add_publishers(plan, chain, step);
      for (uint32_t k = i; k < j; ++k) plan.ops[k].chain = static_cast<int32_t>(plan.chains.size());
      plan.chains.push_back(chain);
      i = j;
    }
  }
}

}  // namespace pycoll
