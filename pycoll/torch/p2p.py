"""Point-to-point messages of the pycoll backend: one channel per direction between two ranks.

A channel ``src -> dst`` is a 2-rank pycoll communicator (``src`` its rank 0) formed on first use over
the group's store (keys ``p2p/<src>-<dst>/``), and a send is a broadcast from rank 0 on it. Each channel
has its own thread: a channel being formed waits for its peer there, not in the caller, so the orders
ranks post their sends and receives in (``batch_isend_irecv``, a ring exchange, an all-to-all) never
deadlock, and the two directions between a pair run at once. Messages between two ranks arrive in the
order they were sent; tags are not matched (every tag shares the channel), and a message's size and
dtype must equal what the receiver posted (a mismatch raises CollectiveMismatchError on both ranks).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

import pycoll
from pycoll.bootstrap.store import PrefixStore
from pycoll.comm import Communicator


class Channel:
    """One direction between two ranks: its communicator (formed on its thread) and that thread."""

    def __init__(self, store: Any, src: int, dst: int, me: int, timeout: float) -> None:
        self._store = PrefixStore(store, f"p2p/{src}-{dst}")
        self._my_rank = 0 if me == src else 1
        self._timeout = timeout
        self._comm: Communicator | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pycoll-p2p-{src}-{dst}")

    def _communicator(self) -> Communicator:
        if self._comm is None:
            self._comm = pycoll.init(
                fault_tolerance=False,
                store=self._store, rank=self._my_rank, world_size=2, timeout=self._timeout, set_default=False
            )
        return self._comm

    def transfer(self, tensor: torch.Tensor, timeout: float | None) -> Future:
        """Sends (on src) or receives (on dst) ``tensor``, a contiguous tensor, on the channel's thread."""

        def run() -> None:
            pycoll.broadcast(tensor, 0, comm=self._communicator(), timeout=timeout)

        return self._thread.submit(run)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        if self._comm is not None:
            self._comm.finalize()
            self._comm = None


class Channels:
    """The channels of one rank of a process group, formed on first use."""

    def __init__(self, store: Any, rank: int, timeout: float) -> None:
        self._store = store
        self._rank = rank
        self._timeout = timeout
        self._lock = threading.Lock()
        self._by_pair: dict[tuple[int, int], Channel] = {}

    def _channel(self, src: int, dst: int) -> Channel:
        with self._lock:
            channel = self._by_pair.get((src, dst))
            if channel is None:
                channel = Channel(self._store, src, dst, self._rank, self._timeout)
                self._by_pair[(src, dst)] = channel
            return channel

    def send(self, tensor: torch.Tensor, dst: int, timeout: float | None) -> Future:
        return self._channel(self._rank, dst).transfer(tensor, timeout)

    def recv(self, tensor: torch.Tensor, src: int, timeout: float | None) -> Future:
        return self._channel(src, self._rank).transfer(tensor, timeout)

    def close(self) -> None:
        with self._lock:
            channels, self._by_pair = list(self._by_pair.values()), {}
        for channel in channels:
            channel.close()


def when_all(futures: list[Future], then: Callable[[], None] | None = None) -> Future:
    """A future done when every one of ``futures`` is (failing with the first error), after ``then``."""
    done: Future = Future()
    if not futures:
        if then is not None:
            then()
        done.set_result(None)
        return done
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            done.set_exception(errors[0])
            return
        try:
            if then is not None:
                then()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            done.set_exception(e)
            return
        done.set_result(None)

    for f in futures:
        f.add_done_callback(one_done)
    return done
