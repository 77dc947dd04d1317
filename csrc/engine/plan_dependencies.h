// What each op of a plan must wait for before it may start, so that the executor can run ops of later
// steps while earlier ones are still in flight (engine/executor.cc) and still end with exactly the results
// of running the steps one after another.
//
// The parts, named once:
//
//   space      a byte address space. ENCODED is addressed like OUTPUT and the error-feedback residual
//              like INPUT. INPUT and OUTPUT alias in an in-place collective, so all four share one space;
//              an out-of-place one (NativePlan::distinct: a reduce-scatter, all-gather or all-to-all,
//              whose buffers the API keeps apart) has two, INPUT's and OUTPUT's. (One space there would
//              only add orderings, but an all-to-all's receive from a peer would then wait for its send to
//              that peer, whose region has the same offsets: past what a ring holds, both ranks would
//              wait for each other.)
//   region     the bytes [off, off + bytes) of a space an op reads or writes.
//   hazard     two ops whose regions overlap where at least one of them writes: the later one waits for
//              the earlier (read after write, write after read, write after write). This keeps every float
//              reduction in plan order, so results stay deterministic.
//   link order messages to one peer leave in plan order and messages from one peer are consumed in plan
//              order (the channels are FIFO and matched by position), so an op that sends to peer p waits
//              for the op before it that sends to p, and one that receives from p for the one before it
//              that receives from p.
//   fence      an empty message (count 0) carries no data, only the fact that its sender got so far: a
//              barrier's rounds, a broadcast's acknowledgements to its root, the empty chunks of a tiny
//              all-reduce. It starts only once every op of the earlier steps is done, as in step order.
//   deps       the ops an op waits for: every hazard and link order above, each op listed once.
//
// With a codec every region an op touches counts as written: the ops that read INPUT reset the residual
// there and every encode stores its loss there.
#pragma once

#include "engine/plan.h"

namespace pycoll {

// Fills plan.deps, every op's [deps_begin, deps_end) and its fence (after_all_before). `coded`: the plan
// runs with a codec.
void link_dependencies(NativePlan& plan, bool coded);

}  // namespace pycoll
