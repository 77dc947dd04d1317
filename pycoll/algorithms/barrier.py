"""Dissemination barrier.

The parts, named as the code names them:

    round     ceil(log2(world)) rounds, one step each. In round k rank r SENDs an empty message (count 0)
              to ``r + 2**k`` and RECVs one from ``r - 2**k`` (mod world).
    distance  2**k, the offset of round k. After round k a rank has heard, directly or through others,
              from the 2**(k+1) - 1 ranks before it, so after the last round it has heard from all.

The messages carry no elements: the executor still sends a header, which is what synchronises.
"""

from __future__ import annotations

from pycoll.algorithms._layout import recv, send
from pycoll.algorithms.plan import Buf, Plan, make_plan


def dissemination_barrier(rank: int, world: int) -> Plan:
    steps = []
    distance = 1
    while distance < world:
        steps.append([send(0, (rank + distance) % world, (Buf.INPUT, 0)),
                      recv(0, (rank - distance) % world, (Buf.OUTPUT, 0))])
        distance *= 2
    return make_plan(rank, world, "barrier", "dissemination", 0, 0, steps)
