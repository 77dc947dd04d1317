"""Point-to-point messages of the pycoll backend: one channel per direction between two ranks.

A channel ``src -> dst`` is a 2-rank pycoll communicator (``src`` its rank 0) formed on first use over
the group's store (keys ``p2p/<src>-<dst>/``), and a send is a broadcast from rank 0 on it. Each channel
has its own thread: a channel being formed waits for its peer there, not in the caller, so the orders
ranks post their sends and receives in (``batch_isend_irecv``, a ring exchange, an all-to-all) never
deadlock, and the two directions between a pair run at once. Messages between two ranks arrive in the
order they were sent; tags are not matched (every tag shares the channel), and a message's size and
dtype must equal what the receiver posted (a mismatch raises CollectiveMismatchError on both ranks).

Receiving from any source (``recv`` without ``src``), by these names:

- **doorbell**: every send on the user channels also sends ``{"t": "p2p"}`` to its receiver over the group
  communicator's fault plane (its control links), before the data. The receiver counts them per sender
  (``Doorbells``): a sender has a message waiting while it rang more often than it was received from.
- **match**: receives are matched in the order they were posted. A receive from any source waits (on the
  plane's condition, with the group's deadline: no polling) for a sender with a message waiting, the one
  that rang first, and receives from that sender's channel; a receive from a named sender posted while
  one from any source waits is queued behind it (the **matcher** thread), so it cannot take the message
  the earlier receive was matched with. Per sender, messages are received in the order they were sent.
- **source**: the sender a receive was matched with, given to ``Work.source_rank``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

import pycoll
from pycoll.bootstrap.store import PrefixStore
from pycoll.comm import Communicator
from pycoll.errors import CollectiveTimeoutError, CommunicatorBrokenError, InvalidUsageError, PeerLostError
from pycoll.fault.plane import Plane


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
                store=self._store,
                rank=self._my_rank,
                world_size=2,
                timeout=self._timeout,
                set_default=False,
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


class Doorbells:
    """The doorbells of one rank's user channels (module docstring): per sender, the arrival numbers of the
    messages it announced that no receive took yet, and the receives that took a message before its
    doorbell came. Guarded by the plane's lock; waiters wait on its condition."""

    def __init__(self, plane: Plane, rank: int) -> None:
        self.plane, self.rank = plane, rank
        self._waiting: dict[int, deque[int]] = {}
        self._ahead: dict[int, int] = {}
        self._arrivals = itertools.count()
        self._closed = False
        plane.on("p2p", self._rang)

    def close(self) -> None:
        """Ends a receive from any source still waiting (the group is being destroyed)."""
        with self.plane.cv:
            self._closed = True
            self.plane.cv.notify_all()

    def _rang(self, peer: int, msg: dict[str, Any]) -> None:  # the plane's thread, its lock held
        if self._ahead.get(peer, 0):
            self._ahead[peer] -= 1
        else:
            self._waiting.setdefault(peer, deque()).append(next(self._arrivals))
            self.plane.cv.notify_all()

    def ring(self, dst: int) -> None:
        self.plane.send(dst, {"t": "p2p"})

    def took(self, src: int) -> None:
        """A receive from ``src`` was matched with its next message."""
        with self.plane.lock:
            waiting = self._waiting.get(src)
            if waiting:
                waiting.popleft()
            else:
                self._ahead[src] = self._ahead.get(src, 0) + 1

    def take_first(self, timeout: float) -> int:
        """The sender whose waiting message rang first (taken), once there is one; raises
        CollectiveTimeoutError past ``timeout`` seconds, PeerLostError once a member of the group is lost."""
        plane, deadline = self.plane, time.monotonic() + timeout
        with plane.cv:
            while True:
                ready = [(w[0], src) for src, w in self._waiting.items() if w]
                if ready:
                    src = min(ready)[1]
                    self._waiting[src].popleft()
                    return src
                if self._closed:
                    raise CommunicatorBrokenError(
                        f"rank {self.rank}'s receive from any source: the group was destroyed while it waited"
                    )
                if not plane.dead and len(plane.left) == plane.world - 1:
                    raise PeerLostError(
                        f"rank {self.rank}'s receive from any source: every other rank of the group left it"
                    )
                if plane.dead:
                    lost, why = next(iter(sorted(plane.dead.items())))
                    raise PeerLostError(
                        f"rank {lost} of the group is lost ({why}); rank {self.rank}'s receive from any "
                        "source gives up", rank=lost,
                    )  # fmt: skip
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"rank {self.rank}'s receive from any source: no rank sent it a message within "
                        f"{timeout:g} s"
                    )
                plane.cv.wait(left)


class Channels:
    """The channels of one rank of a process group, formed on first use. ``plane``: the group's fault
    plane, for the user channels (sends ring a doorbell; receives from any source); None for the
    collective channels."""

    def __init__(self, store: Any, rank: int, timeout: float, plane: Plane | None = None) -> None:
        self._store = store
        self._rank = rank
        self._timeout = timeout
        self._lock = threading.Lock()
        self._by_pair: dict[tuple[int, int], Channel] = {}
        self._closed = False
        self._bells = Doorbells(plane, rank) if plane is not None else None
        # matching in posting order: receives posted but not yet handed to their channel, and the thread
        # that hands them over while one from any source waits for its sender
        self._match_lock = threading.Lock()
        self._queued = 0
        self._matcher: ThreadPoolExecutor | None = None

    def _channel(self, src: int, dst: int) -> Channel:
        with self._lock:
            if self._closed:
                raise CommunicatorBrokenError(
                    f"the point-to-point channel {src} -> {dst} belongs to a process group that was destroyed"
                )
            channel = self._by_pair.get((src, dst))
            if channel is None:
                channel = Channel(self._store, src, dst, self._rank, self._timeout)
                self._by_pair[(src, dst)] = channel
            return channel

    def send(self, tensor: torch.Tensor, dst: int, timeout: float | None) -> Future:
        if self._bells is not None:
            self._bells.ring(dst)
        return self._channel(self._rank, dst).transfer(tensor, timeout)

    def recv(self, tensor: torch.Tensor, src: int, timeout: float | None) -> Future:
        with self._match_lock:
            if self._queued == 0:  # nothing posted earlier is still unmatched: straight to the channel
                return self._hand_over(tensor, src, timeout)
            self._queued += 1
        done: Future = Future()
        self._matching().submit(self._queued_recv, tensor, src, timeout, done)
        return done

    def recv_any(self, tensor: torch.Tensor, timeout: float | None) -> tuple[Future, Future]:
        """Receives ``tensor`` from whichever rank sends first: (the receive's future, its source's)."""
        if self._bells is None:
            raise InvalidUsageError(
                "receiving from any source needs the group communicator's fault plane "
                "(PYCOLL_FAULT_TOLERANCE is off); name the sender"
            )
        with self._match_lock:
            self._queued += 1
        done: Future = Future()
        source: Future = Future()
        self._matching().submit(self._queued_recv_any, tensor, timeout, done, source)
        return done, source

    def _matching(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise CommunicatorBrokenError("a receive was posted on a process group that was destroyed")
            if self._matcher is None:
                self._matcher = ThreadPoolExecutor(1, thread_name_prefix=f"pycoll-p2p-match-{self._rank}")
            return self._matcher

    def _hand_over(self, tensor: torch.Tensor, src: int, timeout: float | None) -> Future:
        """Matches a receive with ``src``'s next message. In posting order: only the caller with nothing
        queued (``_match_lock`` held) or the matcher (while something is queued) hands receives over."""
        if self._bells is not None:
            self._bells.took(src)
        return self._channel(src, self._rank).transfer(tensor, timeout)

    def _queued_recv(self, tensor: torch.Tensor, src: int, timeout: float | None, done: Future) -> None:
        self._queued_done(done, None, lambda: src, lambda s: self._hand_over(tensor, s, timeout))

    def _queued_recv_any(
        self, tensor: torch.Tensor, timeout: float | None, done: Future, source: Future
    ) -> None:
        assert self._bells is not None
        bells, wait = self._bells, self._timeout if timeout is None else timeout
        self._queued_done(
            done, source, lambda: bells.take_first(wait),
            lambda s: self._channel(s, self._rank).transfer(tensor, timeout),
        )  # fmt: skip

    def _queued_done(
        self, done: Future, source: Future | None, sender: Callable[[], int], start: Callable[[int], Future]
    ) -> None:
        """A queued receive, on the matcher: its sender, its transfer handed to the channel, and only then
        out of the queue (so that a receive posted directly after it cannot overtake it)."""
        try:
            src = sender()
            if source is not None:
                source.set_result(src)
            _chain(start(src), done)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the receive
            if source is not None and not source.done():
                source.set_exception(e)
            done.set_exception(e)
        finally:
            with self._match_lock:
                self._queued -= 1

    def close(self) -> None:
        """Ends every receive still queued or waiting (CommunicatorBrokenError), then closes the channels."""
        with self._lock:
            self._closed = True  # no channel is formed from now on
            matcher = self._matcher
        if self._bells is not None:
            self._bells.close()
        if matcher is not None:
            matcher.shutdown(wait=True)
        with self._lock:
            channels, self._by_pair = list(self._by_pair.values()), {}
        for channel in channels:
            channel.close()


def _chain(inner: Future, outer: Future) -> None:
    """``outer`` ends as ``inner`` does."""

    def copy(f: Future) -> None:
        err = f.exception()
        if err is not None:
            outer.set_exception(err)
        else:
            outer.set_result(f.result())

    inner.add_done_callback(copy)


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
