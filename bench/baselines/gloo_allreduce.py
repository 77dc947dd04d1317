"""Gloo baseline on its own: ``torch.distributed.all_reduce`` (gloo backend) on CPU tensors sharing
memory with the numpy arrays, timed by the same loop as ``pycoll bench`` (pycoll/bench/timing.py). A thin
wrapper over pycoll/bench/baselines.py; ``pycoll bench --baseline gloo`` times the same all-reduce in the
same ranks as pycoll's, interleaved size by size, which compares better on a noisy machine.

Run with any launcher that sets the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)::

    torchrun --standalone --nproc-per-node 4 bench/baselines/gloo_allreduce.py --json gloo.jsonl
    pycoll run -n 4 bench/baselines/gloo_allreduce.py --json gloo.jsonl

Flags are those of ``pycoll bench`` (-b -e -f -n -w -c --json, -o, -d). Needs CPU torch (torch==2.13.0).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a checkout: import pycoll from it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("gloo", __doc__))
