"""Plans lowered to *grouped programs*: for transports that move whole messages in groups (NCCL).

NCCL has no "peek at the next fragment": a rank posts a group of sends and receives (``ncclGroupStart``
... ``ncclGroupEnd``) on its stream, the group completes when every one of them has, and what the rank
enqueues next on the stream (a reduce kernel, the next group) runs only after that. A plan's fused ops
(RECV_REDUCE_SEND and friends) and its step order must therefore be cut into a sequence of groups with
kernels between them, and the cut must not deadlock: if rank a's group waits for a message that rank b
posts only in a group that waits for a, both wait forever.

The lowering runs all ranks' plans together in *rounds*. In round t, every ordered pair of ranks matches
its next messages, in the FIFO order plan.py defines, as long as the sender has the message ready (its
step has begun, and a fused op has its value). The receiver takes it into staging even when the op that
consumes it belongs to a later step: a fused op's message may be what lets the receiver finish its own
step, so waiting for that step would be circular. Each rank's round is then

    PREPARE*     encode the messages it sends from INPUT (compressed plans), into staging
    SEND* RECV*  one group: exactly the matched messages, so every op in it has its partner in the
                 partner's round-t group
    GROUP_END
    FINISH*      the ops whose messages have arrived, in list order (copy, reduce, decode, encode): their
                 own outputs, and what fused ops send on in a later round

Since each group holds matched pairs only and everything before it on a rank's stream belongs to earlier
rounds, round t completes on every rank once round t-1 has: a program never deadlocks, whatever the
algorithm. A plan that cannot be cut this way (no pair can match while ranks still have work) is
rejected with ``GroupingError``, which well-formed plans never raise (the tests run every algorithm).

Messages arrive in *staging* memory (one region per message, reused once dead), and FINISH moves them
where the op says; fused ops compute what they send into staging too. So a value a rank sends is never a
region a later kernel of its stream may still rewrite. Staging offsets are laid out here, per rank, by
lifetime: a region lives from the first action that writes it to the last that reads it, and a group is
one instant (every message in it is in flight at once).

The native side (csrc/engine/grouped_executor.cc) walks the actions; the same program runs over NCCL
on GPUs and over shared memory on CPUs (which is how the CPU tests check it).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from pycoll.algorithms.plan import RECEIVES, SENDS, Buf, Op, OpKind, Plan

#: Staging regions start on this many bytes (vector loads and NCCL's own alignment).
STAGING_ALIGN = 256


class Action(enum.IntEnum):
    """Action codes; the values are shared with csrc/engine/grouped_executor.h."""

    PREPARE = 0
    SEND = 1
    RECV = 2
    GROUP_END = 3
    FINISH = 4


class GroupingError(RuntimeError):
    """The plans cannot be cut into rounds of matched groups (a malformed plan)."""


@dataclass(frozen=True)
class GroupedProgram:
    """One rank's program. Arrays are indexed by the op's position in ``plan.ops()`` order.

    ``actions``: int64 [n, 2] of (Action, op index; -1 for GROUP_END). ``msg_bytes``: bytes on the wire.
    ``recv_stage`` / ``send_stage`` / ``work_stage``: byte offsets into the staging buffer (-1: none) of
    the message as received, of the message the op sends (encoded or reduced), and of a float32 scratch
    for a compressed RECV_REDUCE_SEND's sum.
    """

    rank: int
    world: int
    actions: np.ndarray
    msg_bytes: np.ndarray
    recv_stage: np.ndarray
    send_stage: np.ndarray
    work_stage: np.ndarray
    staging_bytes: int
    rounds: int

    @property
    def groups(self) -> int:
        return int(np.count_nonzero(self.actions[:, 0] == Action.GROUP_END)) if len(self.actions) else 0


def _align(n: int) -> int:
    return -(-n // STAGING_ALIGN) * STAGING_ALIGN


def _layout(intervals: list[tuple[int, int, int, int, str]], n_ops: int) -> tuple[dict[str, np.ndarray], int]:
    """First-fit placement of (start, end, bytes, op, kind) lifetimes; returns offsets per kind and size."""
    offsets = {k: np.full(n_ops, -1, dtype=np.int64) for k in ("recv", "send", "work")}
    live: list[tuple[int, int, int]] = []  # (offset, size, end)
    top = 0
    for start, end, size, op, kind in sorted(intervals, key=lambda iv: (iv[0], -iv[2])):
        live = [iv for iv in live if iv[2] >= start]  # inclusive ends: a region dies after its last use
        size = _align(max(size, 1))
        at = 0
        for off, sz, _ in sorted(live):
            if at + size <= off:
                break
            at = max(at, off + sz)
        live.append((at, size, end))
        top = max(top, at + size)
        offsets[kind][op] = at
    return offsets, top


def lower_to_groups(
    plans: Sequence[Plan], message_bytes: Callable[[Op], int], *, compressed: bool = False
) -> list[GroupedProgram]:
    """Every rank's grouped program for ``plans`` (one per rank, all of one collective call).

    ``message_bytes(op)`` is the size of the op's message on the wire (count * itemsize, or a codec's
    encoded size). ``compressed``: the plans are compressed plans (SENDs from INPUT are encoded first and
    RECV_REDUCE_SEND needs a float32 scratch of its count), whose ops marked ``uncompressed`` send their
    float32 elements instead (``message_bytes`` is not asked about them).
    """
    world = len(plans)
    ops = [list(p.ops()) for p in plans]
    step_of: list[list[int]] = []
    step_begin: list[list[int]] = []
    for p in plans:
        s_of, begins = [], [0]
        for s, step in enumerate(p.steps):
            s_of += [s] * len(step)
            begins.append(begins[-1] + len(step))
        step_of.append(s_of)
        step_begin.append(begins)
    sends: dict[tuple[int, int], deque[int]] = {}
    recvs: dict[tuple[int, int], deque[int]] = {}
    for r in range(world):
        for i, op in enumerate(ops[r]):
            if op.kind in SENDS:
                sends.setdefault((r, op.send_peer), deque()).append(i)
            if op.kind in RECEIVES:
                recvs.setdefault((op.recv_peer, r), deque()).append(i)
    for (a, b), q in sends.items():
        if len(q) != len(recvs.get((a, b), ())):
            raise GroupingError(
                f"rank {a} sends {len(q)} messages to rank {b}, which receives "
                f"{len(recvs.get((a, b), ()))} from it"
            )
    for key, q in recvs.items():
        if key not in sends:
            raise GroupingError(
                f"rank {key[1]} receives {len(q)} messages from rank {key[0]}, which sends none"
            )

    active = [0] * world  # the step each rank is in
    next_local = [0] * world  # next op (in list order) of the active step that receives or copies
    finished = [[False] * len(o) for o in ops]
    sent = [[False] * len(o) for o in ops]
    received = [[False] * len(o) for o in ops]
    actions: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    clock = [0] * world  # per-rank time of the last action (groups count as one instant)
    first_write: list[dict[tuple[int, str], int]] = [{} for _ in range(world)]  # (op, region) -> time
    last_read: list[dict[tuple[int, str], int]] = [{} for _ in range(world)]

    def coded(op: Op) -> bool:  # its message is encoded (plan.py, "Compressed plans")
        return compressed and not op.uncompressed

    def encodes_input(op: Op) -> bool:  # a SEND whose message is encoded from INPUT first (PREPARE)
        return coded(op) and op.kind == OpKind.SEND and op.src[0] == Buf.INPUT

    def tick(r: int) -> int:
        clock[r] += 1
        return clock[r]

    def note(r: int, op: int, kind: str, t: int, write: bool) -> None:
        if write:
            first_write[r].setdefault((op, kind), t)
        last_read[r][(op, kind)] = max(last_read[r].get((op, kind), t), t)

    def run_local(r: int) -> None:
        """FINISH what has arrived, in list order, and move on to the next step when this one is done."""
        steps = plans[r].steps
        while active[r] < len(steps):
            s = active[r]
            end = step_begin[r][s + 1]
            while next_local[r] < end:
                i = next_local[r]
                op = ops[r][i]
                if op.kind == OpKind.SEND:
                    next_local[r] += 1
                    continue
                if op.kind != OpKind.COPY and not received[r][i]:
                    break
                t = tick(r)
                actions[r].append((Action.FINISH, i))
                if op.kind in RECEIVES:
                    note(r, i, "recv", t, write=False)
                if op.kind in (OpKind.RECV_REDUCE_SEND, OpKind.RECV_REDUCE_COPY_SEND):
                    note(r, i, "send", t, write=True)
                if coded(op) and op.kind == OpKind.RECV_REDUCE_SEND:
                    note(r, i, "work", t, write=True)
                finished[r][i] = True
                next_local[r] += 1
            begin = step_begin[r][s]
            if next_local[r] < end or not all(
                sent[r][i] for i in range(begin, end) if ops[r][i].kind in SENDS
            ):
                return
            active[r] += 1
            next_local[r] = step_begin[r][active[r]] if active[r] < len(steps) else end

    def send_ready(r: int, i: int) -> bool:
        op = ops[r][i]
        return step_of[r][i] == active[r] and (op.kind == OpKind.SEND or finished[r][i])

    for r in range(world):
        run_local(r)
    rounds = 0
    while True:
        group: list[list[tuple[int, int]]] = [[] for _ in range(world)]
        for a, b in sorted(sends):
            sq, rq = sends[(a, b)], recvs[(a, b)]
            while sq and send_ready(a, sq[0]):
                i, j = sq.popleft(), rq.popleft()
                group[a].append((Action.SEND, i))
                group[b].append((Action.RECV, j))
        if not any(group):
            if all(active[r] == len(plans[r].steps) for r in range(world)):
                break
            stuck = [f"rank {r} in step {active[r]}" for r in range(world) if active[r] < len(plans[r].steps)]
            raise GroupingError("no message can be matched while " + ", ".join(stuck) + " still have work")
        rounds += 1
        for r in range(world):
            if not group[r]:
                continue
            for kind, i in group[r]:
                op = ops[r][i]
                if kind == Action.SEND and encodes_input(op):
                    t = tick(r)
                    actions[r].append((Action.PREPARE, i))
                    note(r, i, "send", t, write=True)
            t = tick(r)
            for kind, i in group[r]:
                actions[r].append((kind, i))
                op = ops[r][i]
                if kind == Action.RECV:
                    received[r][i] = True
                    note(r, i, "recv", t, write=True)
                else:
                    sent[r][i] = True
                    if op.kind == OpKind.RECV_COPY_SEND:
                        note(r, i, "recv", t, write=False)  # forwarded from where it arrived
                    elif encodes_input(op) or op.kind in (
                        OpKind.RECV_REDUCE_SEND,
                        OpKind.RECV_REDUCE_COPY_SEND,
                    ):
                        note(r, i, "send", t, write=False)
            actions[r].append((Action.GROUP_END, -1))
        for r in range(world):
            run_local(r)

    programs = []
    for r in range(world):
        n = len(ops[r])
        wire = [op.count * 4 if compressed and op.uncompressed else message_bytes(op) for op in ops[r]]
        msg = np.array(wire, dtype=np.int64)
        intervals = []
        for (i, region), start in first_write[r].items():
            nbytes = int(msg[i]) if region != "work" else ops[r][i].count * 4
            intervals.append((start, last_read[r].get((i, region), start), nbytes, i, region))
        offsets, staging = _layout(intervals, n)
        table = np.array(actions[r], dtype=np.int64).reshape(len(actions[r]), 2)
        programs.append(
            GroupedProgram(
                r, world, table, msg, offsets["recv"], offsets["send"], offsets["work"], staging, rounds
            )
        )
    return programs


def check_grouped(programs: Sequence[GroupedProgram], plans: Sequence[Plan]) -> None:
    """Runs the programs with NCCL's semantics, independently of how they were made: each rank walks its
    actions; a group completes only when every message in it meets its partner in the partner's current
    group (FIFO per ordered pair, equal sizes). Raises GroupingError on a deadlock or a mismatch."""
    world = len(programs)
    ops = [list(p.ops()) for p in plans]
    groups: list[list[list[tuple[int, int, int]]]] = []  # rank -> groups -> (kind, peer, op)
    for r, prog in enumerate(programs):
        gs: list[list[tuple[int, int, int]]] = []
        cur: list[tuple[int, int, int]] = []
        for act, i in prog.actions.tolist():
            if act == Action.SEND:
                cur.append((act, ops[r][i].send_peer, i))
            elif act == Action.RECV:
                cur.append((act, ops[r][i].recv_peer, i))
            elif act == Action.GROUP_END:
                gs.append(cur)
                cur = []
        groups.append(gs)
    at = [0] * world
    pending = [0] * world  # ops of the current group not yet matched
    posted_send: dict[tuple[int, int], deque[tuple[int, int]]] = {}  # (a, b) -> (rank a, op) in order
    posted_recv: dict[tuple[int, int], deque[tuple[int, int]]] = {}

    def post(r: int) -> None:
        while at[r] < len(groups[r]) and not groups[r][at[r]]:
            at[r] += 1
        if at[r] < len(groups[r]):
            pending[r] = len(groups[r][at[r]])
            for kind, peer, i in groups[r][at[r]]:
                if kind == Action.SEND:
                    posted_send.setdefault((r, peer), deque()).append((r, i))
                else:
                    posted_recv.setdefault((peer, r), deque()).append((r, i))

    for r in range(world):
        post(r)
    while True:
        done: list[int] = []
        for pair, sq in posted_send.items():
            rq = posted_recv.get(pair)
            while sq and rq:
                (a, i), (b, j) = sq.popleft(), rq.popleft()
                if programs[a].msg_bytes[i] != programs[b].msg_bytes[j]:
                    raise GroupingError(f"rank {a} op {i} and rank {b} op {j} disagree on a message size")
                done += [a, b]
        for r in done:
            pending[r] -= 1
        advanced = False
        for r in sorted(set(done)):
            if pending[r] == 0:
                at[r] += 1
                post(r)
                advanced = True
        if all(at[r] == len(groups[r]) for r in range(world)):
            return
        if not advanced:
            raise GroupingError(
                "grouped programs deadlock: "
                + ", ".join(f"rank {r} at group {at[r]}/{len(groups[r])}" for r in range(world))
            )
