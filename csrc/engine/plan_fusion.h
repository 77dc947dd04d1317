// Where the executor may do several ops of a plan in one pass over memory, with exactly the results of
// doing them one after another (engine/executor.cc). Memory traffic is what a large all-reduce on one
// host is bound by: the direct all-reduce with 4 ranks reduces three peers' segments into its chunk one
// op at a time (reading and writing the chunk three times) and then copies the final chunk into a slot
// for every peer (reading it three more times). Done in one pass, it reads each source once and writes
// each destination once.
//
// The parts, named once:
//
//   chain      consecutive receive-reduces of one step into one region D, from different peers: the
//              first reads its src at D's offset (INPUT in place, or D itself) and writes D; every later
//              one reads D and writes D, the last possibly also sending it (RECV_REDUCE_COPY_SEND). Only
//              the last may finalize. The executor takes fragment k of every member's message at once and
//              computes, block by block in a buffer that stays in L1, ((src (+) m1) (+) m2) ... in the
//              members' order, so every element is combined in plan order and rounded to its type after
//              every step, as the ops would. Members receive from different peers (lockstep on one link
//              would wait on itself), and every message fits in its channel (plans cut messages at
//              Transport::segment_bytes, half a channel), so waiting for all of them at once holds no
//              sender back that op-by-op order would let go on. A tree node's two children (RECV_REDUCE,
//              then RECV_REDUCE_SEND to its parent) are not a chain: fused, the 4-rank tree ran 1.15x
//              slower at 64 MiB (the lockstep holds the child that is ahead back; docs/performance.md).
//   publisher  a SEND of exactly the region D that the chain finalizes, in the chain's step or the next,
//              with no op writing D between them: the executor writes the final fragment into the
//              publisher's send slot in the same pass, while the publisher is ready but for the chain and
//              has room, and the SEND then goes on normally from where the chain left it (reading D).
//
// Fusion is skipped for plans compiled for a codec (their ops encode and decode per message).
#pragma once

#include "engine/plan.h"

namespace pycoll {

// Fills plan.chains and plan.publishers and every member's PlanOp::chain; needs link_dependencies first.
void find_chains(NativePlan& plan);

}  // namespace pycoll
