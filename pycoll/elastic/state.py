"""The training state the elastic loop keeps: a mapping of names to arrays (numpy arrays or CPU torch
tensors, e.g. ``{**model.state_dict(), **momentum}``), copied at each commit, written back in place on a
roll-back (so a model's parameters and an optimizer's references to them stay the same objects), and
sent to processes that join, striped across the members that hold it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import pycoll
from pycoll.comm import Communicator
from pycoll.errors import InvalidUsageError

State = Mapping[str, Any]


def _as_numpy(name: str, value: Any) -> np.ndarray:
    """A numpy view of ``value`` (no copy): writes through it change the caller's array."""
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        if getattr(value, "is_cuda", False) or str(getattr(value, "device", "cpu")) != "cpu":
            raise InvalidUsageError(
                f"state[{name!r}] is on {value.device}; the elastic state must be in host memory"
            )
        array = value.detach().numpy()
    else:
        raise InvalidUsageError(
            f"state[{name!r}] must be a numpy array or a CPU torch tensor, got {type(value).__name__}"
        )
    if not array.flags.c_contiguous:
        raise InvalidUsageError(f"state[{name!r}] must be contiguous")
    return array


def views(state: State) -> dict[str, np.ndarray]:
    return {name: _as_numpy(name, value) for name, value in state.items()}


def snapshot(state: State) -> dict[str, np.ndarray]:
    """A copy of every array (a commit)."""
    return {name: array.copy() for name, array in views(state).items()}


def restore(state: State, commit: Mapping[str, np.ndarray]) -> None:
    """Writes a commit back into the caller's arrays, in place."""
    for name, array in views(state).items():
        np.copyto(array, commit[name])


def send_to_joiners(comm: Communicator, state: State, holders: int, step: int) -> int:
    """Run by every rank of a grown communicator: ranks 0..holders-1 hold the state, the others (joiners)
    receive it. The bytes are cut into one stripe per holder and each holder broadcasts its own, so the
    holders share the sending. Returns the step every rank goes on from (the holders')."""
    arrays = views(state)
    sizes = np.array([a.nbytes for a in arrays.values()] + [step], np.int64)
    mine = sizes.copy()
    pycoll.broadcast(sizes, 0, comm=comm)
    if not np.array_equal(sizes[:-1], mine[:-1]):
        raise InvalidUsageError(
            "a joining process's state has other array sizes than the members' "
            f"({mine[:-1].tolist()} against {sizes[:-1].tolist()}): build it the same way on every rank"
        )
    total = int(sizes[:-1].sum())
    blob = np.empty(total, np.uint8)
    holding = comm.rank < holders
    offset = 0
    for array in arrays.values():
        if holding:
            blob[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)
        offset += array.nbytes
    bounds = np.linspace(0, total, holders + 1).astype(np.int64)
    for root in range(holders):
        lo, hi = int(bounds[root]), int(bounds[root + 1])
        if hi > lo:
            pycoll.broadcast(blob[lo:hi], root, comm=comm)
    if not holding:
        offset = 0
        for array in arrays.values():
            array.reshape(-1).view(np.uint8)[:] = blob[offset : offset + array.nbytes]
            offset += array.nbytes
    return int(sizes[-1])
