"""Rank bodies for tests/distributed/test_elastic.py: pycoll.elastic.run under scripted kills and joins.

The model is a float32 vector p; step s on rank r of W adds g = (s % 5) + 1 + r to every element of a
gradient that is summed over the ranks, and p -= sum / 1024. Every value is a multiple of 1/1024 far
below 2**24 / 1024, so each step is exact in float32 whatever the order of the sum, and the expected p
follows in closed form from the world size of each step (``replay``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import pycoll
import pycoll.elastic

N = 3000  # elements of p (several segments of a shared-memory ring at 4 KiB slots? no: one message)


def gradient(step: int, rank: int) -> float:
    return float((step % 5) + 1 + rank)


def replay(steps: int, world_by_step: dict[int, int]) -> np.ndarray:
    """The expected p, from the world size each step ran with."""
    p = np.zeros(N, np.float32)
    for s in range(steps):
        total = sum(gradient(s, r) for r in range(world_by_step[s]))
        p -= np.float32(total / 1024)
    return p


def _step(ctx: pycoll.elastic.StepContext, kills: dict[int, int], started_as: int) -> None:
    if kills.get(ctx.step) == started_as:
        os.kill(os.getpid(), signal.SIGKILL)
    g = np.full(N, gradient(ctx.step, ctx.rank), np.float32)
    pycoll.allreduce(g, comm=ctx.comm)
    ctx.state["p"] -= g / np.float32(1024)


JOINER = r"""
import sys
import numpy as np
sys.path[:0] = sys.argv[4].split(":")
import pycoll, pycoll.elastic
import _elastic
comm = pycoll.init(join=sys.argv[1], timeout=60)
state = {"p": np.zeros(_elastic.N, np.float32)}
res = pycoll.elastic.run(lambda ctx: _elastic._step(ctx, {}, -1), state, steps=int(sys.argv[2]), comm=comm,
                         commit_every=int(sys.argv[3]))
np.save(sys.stdout.buffer, state["p"])
"""


def body(comm, rank, world, steps, commit_every, kills, joins):
    """Every rank of the job: ``kills`` {step: original rank}, ``joins``: steps at which rank 0 starts a
    joiner and waits until the job holds its request (so the join lands at a known commit)."""
    started: list[subprocess.Popen] = []
    started_at: list[int] = []  # the step each joiner was started at (a step redone starts none again)

    def step(ctx: pycoll.elastic.StepContext) -> None:
        if ctx.step in joins and ctx.rank == 0 and started_at.count(ctx.step) < joins.count(ctx.step):
            started_at.append(ctx.step)
            path = ":".join(p for p in sys.path if p)
            cmd = [sys.executable, "-c", JOINER, ctx.comm.join_address, str(steps), str(commit_every), path]
            started.append(subprocess.Popen(cmd, stdout=subprocess.PIPE))
            deadline = time.monotonic() + 60
            while not ctx.comm.joiners.alive():
                assert time.monotonic() < deadline, "the joiner never asked to join"
                time.sleep(0.01)
        _step(ctx, kills, rank)

    state = {"p": np.zeros(N, np.float32)}
    res = pycoll.elastic.run(step, state, steps=steps, comm=comm, commit_every=commit_every, timeout=30)
    joined = [np.load(__import__("io").BytesIO(p.communicate(timeout=60)[0])).tobytes() for p in started]
    return {
        "p": state["p"].tobytes(),
        "world_by_step": res.world_by_step,
        "changes": [(c.kind, c.step, c.world_before, c.world_after) for c in res.changes],
        "redone": res.redone,
        "final_world": res.comm.world_size,
        "joined": joined,
    }
