#include "engine/plan_dependencies.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace pycoll {

namespace {

// The space cut into pieces, each with the last op that wrote it and the ops that read it since.
class Space {
 public:
  explicit Space(uint64_t bytes) { pieces_[0] = Piece{std::max<uint64_t>(bytes, 1), -1, {}}; }

  // Adds to `deps` the ops that a read (or write) of the region [off, off + bytes) must wait for.
  void hazards(uint64_t off, uint64_t bytes, bool write, std::vector<int32_t>& deps) {
    for_pieces(off, bytes, [&](Piece& p) {
      if (p.writer >= 0) deps.push_back(p.writer);
      if (write) deps.insert(deps.end(), p.readers.begin(), p.readers.end());
    });
  }
  // Records that op `i` reads (or writes) the region.
  void touch(uint64_t off, uint64_t bytes, bool write, int32_t i) {
    for_pieces(off, bytes, [&](Piece& p) {
      if (write) {
        p.writer = i;
        p.readers.clear();
      } else if (p.readers.empty() || p.readers.back() != i) {
        p.readers.push_back(i);
      }
    });
  }

 private:
  struct Piece {
    uint64_t end;
    int32_t writer;
    std::vector<int32_t> readers;
  };

  // Splits the piece holding `at` so that a piece starts there (`at` inside the space).
  void split(uint64_t at) {
    auto it = std::prev(pieces_.upper_bound(at));
    if (it->first == at || at >= it->second.end) return;
    Piece tail = it->second;
    it->second.end = at;
    pieces_.emplace(at, std::move(tail));
  }
  template <class F>
  void for_pieces(uint64_t off, uint64_t bytes, F&& f) {
    if (bytes == 0) return;
    const uint64_t end = off + bytes;
    const uint64_t space_end = std::prev(pieces_.end())->second.end;
    if (end > space_end) pieces_[space_end] = Piece{end, -1, {}};  // never past the plan's buffers; be safe
    split(off);
    split(end);
    for (auto it = pieces_.find(off); it != pieces_.end() && it->first < end; ++it) f(it->second);
  }

  std::map<uint64_t, Piece> pieces_;  // start -> piece; the pieces tile [0, end of the last)
};

struct Region {
  int32_t buf;
  uint64_t off, bytes;
  bool write;
};

// The regions op `op` touches (see the header: with a codec every one counts as written).
int regions_of(const PlanOp& op, bool coded, Region out[2]) {
  int n = 0;
  if (op_reads_src(op.kind)) out[n++] = Region{op.src_buf, op.src_off, op.bytes, coded};
  if (op_receives_into_dst(op.kind)) out[n++] = Region{op.dst_buf, op.dst_off, op.bytes, true};
  return n;
}

}  // namespace

void link_dependencies(NativePlan& plan, bool coded) {
  Space shared(std::max(plan.input_bytes, plan.output_bytes));
  Space output(plan.distinct ? plan.output_bytes : 0);
  auto space_of = [&](int32_t buf) -> Space& { return plan.distinct && buf != kInput ? output : shared; };
  std::vector<int32_t> last_sender(plan.world, -1), last_receiver(plan.world, -1);
  std::vector<int32_t> deps;
  plan.deps.clear();
  size_t step = 0;
  for (size_t k = 0; k < plan.ops.size(); ++k) {
    PlanOp& op = plan.ops[k];
    const int32_t i = static_cast<int32_t>(k);
    while (plan.step_begin[step + 1] <= k) ++step;
    op.after_all_before = op.bytes == 0 ? plan.step_begin[step] : 0;
    deps.clear();
    if (op_sends(op.kind)) {
      if (last_sender[op.send_peer] >= 0) deps.push_back(last_sender[op.send_peer]);
      last_sender[op.send_peer] = i;
    }
    if (op_receives(op.kind)) {
      if (last_receiver[op.recv_peer] >= 0) deps.push_back(last_receiver[op.recv_peer]);
      last_receiver[op.recv_peer] = i;
    }
    Region regions[2];
    const int n = regions_of(op, coded, regions);
    for (int r = 0; r < n; ++r)
      space_of(regions[r].buf).hazards(regions[r].off, regions[r].bytes, regions[r].write, deps);
    for (int r = 0; r < n; ++r) space_of(regions[r].buf).touch(regions[r].off, regions[r].bytes, regions[r].write, i);
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    op.deps_begin = static_cast<uint32_t>(plan.deps.size());
    plan.deps.insert(plan.deps.end(), deps.begin(), deps.end());
    op.deps_end = static_cast<uint32_t>(plan.deps.size());
  }
}

}  // namespace pycoll
