"""The fault plane's protocol at 1k-16k ranks, in the simulation (issue 52): every rank's real Plane
(pycoll/fault/plane.py, agreement.py, overlay.py) over pycoll/testing/fault_sim.py's in-memory network,
in simulated time. Prints one table.

    python bench/fault_sim.py                        # 1024, 4096, 16384 ranks
    python bench/fault_sim.py --ranks 1024 --delay-ms 0.05

Per size, on one net, in this order:

    formation    frames per rank to form the plane's links (a hello and an answer per finger link)
    heartbeats   frames per rank and heartbeat interval when idle (one per live finger)
    agreement    a failure-free agreement: rounds (the hops of its longest causal chain: up the tree, then
                 down), frames (all ranks), the most any rank sent, simulated time
    death        rank world // 3 SIGKILLed: the hops and the simulated time until every rank knows, and the
                 frames of its flood per rank
    root death   rank 0 (the agreements' root) SIGKILLed as an agreement starts: that agreement's rounds
                 and frames (the flood of the death counted apart)
    shrink       after the two kills: the shrink's agreement, the new plane's links and the commit
                 agreement, frames per survivor

The link delay (``--delay-ms``, default 0.5 ms: a switched Ethernet hop with a busy receiver) is the
simulated one-way latency of every frame; handling a frame costs no simulated time. Heartbeats are
counted, not simulated one by one (see pycoll/testing/fault_sim.py). Wall-clock seconds of the run are
printed too: the simulation runs every rank in one Python process.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pycoll.testing.fault_sim import SimNet  # noqa: E402


def one(world: int, delay_ms: float) -> dict[str, float]:
    started = time.perf_counter()
    net = SimNet(world, delay_ms=delay_ms)
    out: dict[str, float] = {"world": world, "log2": math.ceil(math.log2(world))}
    out["formation"] = net.formation_messages()
    out["heartbeats"] = net.idle_heartbeats()
    run = net.agree()
    assert run.finished and run.uniform(net.live())
    out["agree_rounds"] = max(run.rounds.values())
    out["agree_frames"] = run.messages
    out["agree_max"] = run.max_per_rank
    out["agree_ms"] = run.seconds * 1e3
    victim = world // 3
    lost0, t0 = net.sent["lost"], net.now
    net.kill(victim)
    net.run(lambda: victim in net.dead_learned and len(net.dead_learned[victim].at) == world - 1)
    learned = net.dead_learned[victim]
    out["death_hops"] = max(learned.depth.values())
    out["death_ms"] = (max(learned.at.values()) - t0) * 1e3
    out["death_frames"] = (net.sent["lost"] - lost0) / (world - 1)
    net.run()
    net.kill(0)
    run = net.agree()
    assert run.finished and run.uniform(net.live())
    out["root_rounds"] = max(run.rounds.values())
    out["root_frames"] = run.messages / (world - 2)
    out["root_ms"] = run.seconds * 1e3
    net.run()
    shrink = net.shrink()
    assert shrink.decision.finished and shrink.decision.uniform(net.live())
    assert len(shrink.survivors) == world - 2
    out["shrink_frames"] = shrink.messages_per_rank()
    out["shrink_rounds"] = max(shrink.decision.rounds.values()) + max(shrink.commit.rounds.values())
    out["wall_s"] = time.perf_counter() - started
    return out


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--delay-ms", type=float, default=0.5)
    args = parser.parse_args()
    rows = [one(int(n), args.delay_ms) for n in args.ranks.split(",")]
    print(f"fault plane in the simulation, link delay {args.delay_ms} ms")
    print()
    head = ("ranks", "log2 n", "form f/rank", "hb f/rank/int", "agree rounds", "agree f/rank", "agree max f",
            "agree ms", "death hops", "death ms", "death f/rank", "root-death rounds", "root-death f/rank",
            "shrink f/rank", "shrink rounds", "wall s")
    keys = ("world", "log2", "formation", "heartbeats", "agree_rounds", "agree_frames", "agree_max",
            "agree_ms",
            "death_hops", "death_ms", "death_frames", "root_rounds", "root_frames", "shrink_frames",
            "shrink_rounds", "wall_s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for row in rows:
        cells = []
        for k in keys:
            v = row[k] / row["world"] if k == "agree_frames" else row[k]
            cells.append(f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
