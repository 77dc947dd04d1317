"""What agreement (pycoll/fault/agreement.py) and the plane's key-value store (pycoll/fault/kvstore.py)
ask of the plane they run on (pycoll/fault/plane.py ``Plane``, which holds them): its members and how to
reach them. They see the plane through this view only, so that each can be built and tested without it.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol


class Members(Protocol):
    """A plane's members, as agreement and the key-value store reach them."""

    #: This member's rank, the plane's size, its id (for messages), and the members it has links to (the
    #: others are reached by routing: pycoll/fault/overlay.py).
    rank: int
    world: int
    id: str
    fingers: list[int]
    #: The plane's lock (reentrant) and its condition: their methods run with it held.
    lock: threading.RLock
    cv: threading.Condition
    #: Members found dead, and why; those of them certainly gone (not only silent); those that left; this
    #: member's eviction, or None.
    dead: dict[int, str]
    confirmed: set[int]
    left: set[int]
    evicted: str | None

    def live(self) -> list[int]:
        """Members neither dead nor left, this one included, in rank order."""
        ...

    def send(self, peer: int, msg: dict[str, Any]) -> bool:
        """To one member, over its link or routed (pycoll/fault/overlay.py)."""
        ...

    def found_dead(self, peer: int, why: str, *, tell: bool = True, confirmed: bool = False) -> None: ...
    def evict_self(self, why: str) -> None: ...
    def raise_if_evicted(self) -> None: ...
