"""The fault plane's protocol at scale, in the simulation (pycoll/testing/fault_sim.py: every rank's real
Plane over an in-memory network): the guarantees after every scripted fault, and the counts the design
promises (messages per rank, hops, rounds). The sizes here fit CI; bench/fault_sim.py runs 1k-16k."""

from __future__ import annotations

import math
import random

import pytest

from pycoll.fault import overlay
from pycoll.testing.fault_sim import SimNet


def log2(n: int) -> int:
    return math.ceil(math.log2(n))


def survivors_agree(net: SimNet, run) -> list[int]:
    """Every live (neither killed nor evicted) rank decided, and all the same."""
    live = net.live()
    assert run.finished, f"not every live rank decided: {sorted(set(live) - set(run.decisions))}"
    assert run.uniform(live), {r: run.decisions.get(r) for r in live}
    return live


# ---- the shape -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 13, 64, 100, 1024])
def test_fingers_are_symmetric_and_log_sized(world):
    for r in range(world):
        f = overlay.fingers(r, world)
        assert len(f) <= 2 * max(1, log2(max(world, 2)))
        assert r not in f
        assert all(r in overlay.fingers(p, world) for p in f)


@pytest.mark.parametrize("world", [2, 7, 64, 1000])
def test_the_tree_covers_every_live_member_once(world):
    rng = random.Random(world)
    dead = set(rng.sample(range(world), world // 5))
    gone = dead.__contains__
    root = overlay.tree_root(world, gone)
    live = [r for r in range(world) if r not in dead]
    assert root == live[0]
    children = {r: overlay.tree_children(r, root, world, gone) for r in live}
    parents = {r: overlay.tree_parent(r, root, world, gone) for r in live}
    assert parents[root] is None
    for r in live:
        if r != root:
            assert r in children[parents[r]]
        assert sorted(overlay.tree_subtree(r, root, world, gone)) == sorted(
            [r] + [x for c in children[r] for x in overlay.tree_subtree(c, root, world, gone)])
    assert sorted(overlay.tree_subtree(root, root, world, gone)) == live


def test_routes_reach_every_member_within_the_bound():
    world = 1000
    for src in range(0, world, 37):
        for dst in range(0, world, 53):
            at, hops = src, 0
            while at != dst:
                at = overlay.next_hop(at, dst, world, overlay.fingers(at, world))
                hops += 1
            assert hops <= log2(world)


# ---- agreement ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 64, 1024])
def test_agreement_takes_2_log2_n_rounds_and_2_messages_per_rank(world):
    net = SimNet(world)
    run = net.agree(flag=lambda r: r != world // 2, payload=lambda r: {"r": r} if r % 7 == 0 else None)
    survivors_agree(net, run)
    d = run.decisions[0]
    assert d.flag is False and d.dead == frozenset() and d.quorum
    assert d.payloads == {r: ({"r": r} if r % 7 == 0 else None) for r in range(world)}
    assert max(run.rounds.values()) <= 2 * log2(world)
    assert run.messages == 2 * (world - 1)  # one up, one down, per member but the root
    assert run.max_per_rank <= 2 * log2(world) + 1  # the root: one decision per child


def test_a_death_reaches_every_rank_in_log_n_hops_with_one_message_per_finger():
    world = 1024
    net = SimNet(world)
    net.kill(300)
    net.run()
    learned = net.dead_learned[300]
    assert sorted(learned.at) == [r for r in range(world) if r != 300]
    assert max(learned.depth.values()) <= log2(world)
    assert net.sent["lost"] <= sum(len(overlay.fingers(r, world)) for r in range(world))
    assert all(p.dead.keys() == {300} and p.confirmed == {300} for r, p in enumerate(net.planes) if r != 300)


@pytest.mark.parametrize("victim", ["root", "interior", "leaf"])
def test_a_member_killed_at_every_step_of_an_agreement(victim):
    """The victim sends s frames in an agreement when nobody dies; for every i < s it is killed right after
    its i-th: every survivor decides, the same, and no survivor's decision is contradicted (a decision the
    victim reached a member with before it died is the one every survivor ends with)."""
    world = 64
    who = {"root": 0, "interior": 32, "leaf": 63}[victim]
    probe = SimNet(world)
    sends = [0]
    probe.on_send = lambda src, dst, msg: sends.__setitem__(0, sends[0] + (src == who))
    probe.agree()
    assert sends[0] >= 1
    for i in range(sends[0]):
        net = SimNet(world, jitter_ms=0.3, seed=i)
        count = [0]
        early: list = []

        def on_send(src, dst, msg, net=net, count=count, i=i):
            if src == who and net.alive[who]:
                count[0] += 1
                if count[0] > i:
                    net.kill(who)

        net.on_send = on_send
        run = net.agree()
        live = survivors_agree(net, run)
        if who == 0 and any(r in run.decisions and run.decisions[r].dead == frozenset() for r in live):
            early.append(i)  # the dead root's own decision reached someone: everyone has it
            assert all(run.decisions[r].dead == frozenset() for r in live)
        again = net.agree()
        assert all(d.dead == frozenset({who}) for d in again.decisions.values())
        survivors_agree(net, again)


def test_random_kills_during_agreements_never_split_the_survivors():
    for seed in range(12):
        rng = random.Random(seed)
        world = rng.choice([16, 33, 128])
        net = SimNet(world, jitter_ms=rng.choice([0.0, 1.0]), loss=rng.choice([0.0, 0.05]), seed=seed)
        for _ in range(4):
            plan = {rng.randrange(world): rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))}
            count = dict.fromkeys(plan, 0)

            def on_send(src, dst, msg, net=net, plan=plan, count=count):
                if src in plan and net.alive[src]:
                    count[src] += 1
                    if count[src] >= plan[src]:
                        net.kill(src)

            net.on_send = on_send
            run = net.agree()
            net.on_send = None
            survivors_agree(net, run)
        final = net.agree()
        live = survivors_agree(net, final)
        killed = {r for r in range(world) if not net.alive[r]}
        assert all(final.decisions[r].dead == frozenset(killed) for r in live), seed


def test_losses_and_jitter_change_the_time_not_the_decision():
    net = SimNet(256, jitter_ms=2.0, loss=0.1, seed=3)
    run = net.agree(payload=lambda r: r)
    survivors_agree(net, run)
    assert run.decisions[5].payloads == {r: r for r in range(256)}
    assert run.seconds > 2 * log2(256) * 0.5e-3  # the retransmissions cost time


# ---- silence, partitions -----------------------------------------------------------------------------------
def test_a_stopped_rank_is_found_by_its_fingers_and_evicted_when_it_resumes():
    world = 256
    net = SimNet(world, heartbeat_timeout=5.0)
    net.stop(77)
    net.run(lambda: 77 in net.dead_learned and len(net.dead_learned[77].at) == world - 1)
    learned = net.dead_learned[77]
    assert len(learned.at) == world - 1
    assert 5.0 <= min(learned.at.values()) and max(learned.at.values()) < 5.1
    assert all(77 not in p.confirmed for p in net.planes)  # suspected, not certain
    run = net.agree()
    survivors_agree(net, run)
    assert run.decisions[0].dead == frozenset({77})
    net.resume(77)
    net.run()
    assert net.planes[77].evicted is not None and net.planes[77].revoked is not None


@pytest.mark.parametrize("world,side", [(64, 40), (64, 32), (64, 10), (33, 16)])
def test_a_partition_leaves_one_side_at_most(world, side):
    """The ranks below ``side`` are cut off from the others: each side finds the other's fingers silent.
    The side with more than half (or exactly half with rank 0) decides and goes on; the other never does: it
    is evicted (when it knows every member of the other side silent) or its agreement does not end (it
    waits for members no finger of it watches: agree's deadline raises there). No hang, and never two
    different decisions among ranks that survive."""
    net = SimNet(world, heartbeat_timeout=2.0)
    a = set(range(side))
    b = set(range(world)) - a
    net.partition(a)
    net.run(lambda: all(len(net.planes[r].dead) == side for r in b), max_s=30)
    run = net.agree(max_s=60)
    winner, loser = (a, b) if 2 * side >= world else (b, a)
    assert all(r in run.decisions and run.decisions[r].quorum for r in winner)
    assert run.uniform(sorted(winner))
    assert all(r not in run.decisions or not run.decisions[r].quorum for r in loser)
    assert all(net.planes[r].evicted is not None for r in loser if r in run.decisions)
    net.heal()
    net.run(max_s=30)
    assert all(net.planes[r].evicted is None for r in winner)  # the other side cannot evict the winners
    again = net.agree(sorted(winner))
    assert again.finished and again.uniform(sorted(winner))


def test_shrink_counts_at_1024():
    net = SimNet(1024)
    net.kill(5)
    net.kill(700)
    net.run()
    s = net.shrink()
    assert s.survivors == [r for r in range(1024) if r not in (5, 700)]
    survivors_agree(net, s.decision)
    assert s.messages_per_rank() < 4 + 2 * 2 * log2(1024)
