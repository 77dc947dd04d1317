"""The key-value store a new communicator is set up through when it is formed on a fault plane (a
shrink or a grow), instead of the job's rendezvous store: that one may have died with rank 0.

The store lives on the plane's rank 0 (``KvServer``); every member reaches it with ``kv`` requests over
its link (``PlaneStore``, the ``Store`` interface pycoll.comm.Communicator is formed with). A wait ends
with PeerLostError as soon as any member of the plane is found dead: a communicator being formed with a
dead member cannot succeed, and its members give up together instead of waiting for their deadline.
"""

from __future__ import annotations

import base64
import itertools
import time
from typing import Any, Protocol

from pycoll.errors import CollectiveTimeoutError, PeerLostError
from pycoll.fault.members import Members


class KvServer:
    """Rank 0's store (and every rank's pending requests); every method runs with ``plane.lock`` held."""

    def __init__(self, plane: Members) -> None:
        self.plane = plane
        self.data: dict[str, bytes] = {}
        self.parked: list[tuple[int, dict[str, Any]]] = []  # waits / gets for keys not there yet
        self.answers: dict[int, dict[str, Any]] = {}  # this rank's requests answered, by request id

    def on_message(self, peer: int, msg: dict[str, Any]) -> None:
        if msg["t"] == "kvr":
            self.answers[int(msg["id"])] = msg
            self.plane.cv.notify_all()
            return
        self.serve(peer, msg)

    def serve(self, peer: int, req: dict[str, Any]) -> None:
        op, keys = req["op"], req.get("keys", [])
        if op == "set":
            self.data[keys[0]] = base64.b64decode(req["value"])
            self._reply(peer, req, None)
            self._unpark()
        elif op == "add":
            value = int(self.data.get(keys[0], b"0")) + int(req["value"])
            self.data[keys[0]] = str(value).encode()
            self._reply(peer, req, value)
            self._unpark()
        elif op == "check":
            self._reply(peer, req, all(k in self.data for k in keys))
        elif op == "delete":
            self._reply(peer, req, self.data.pop(keys[0], None) is not None)
        elif op in ("get", "wait"):
            if not self._answer(peer, req):
                self.parked.append((peer, req))

    def _answer(self, peer: int, req: dict[str, Any]) -> bool:
        keys = req["keys"]
        if not all(k in self.data for k in keys):
            return False
        value = base64.b64encode(self.data[keys[0]]).decode() if req["op"] == "get" else None
        self._reply(peer, req, value)
        return True

    def _unpark(self) -> None:
        self.parked = [(p, r) for p, r in self.parked if not self._answer(p, r)]

    def _reply(self, peer: int, req: dict[str, Any], value: Any) -> None:
        answer = {"t": "kvr", "id": req["id"], "value": value}
        if peer == self.plane.rank:
            self.answers[int(req["id"])] = answer
            self.plane.cv.notify_all()
        else:
            self.plane.send(peer, answer)


_ids = itertools.count(1)


class StoreMembers(Members, Protocol):
    """A plane that holds a KvServer (its rank 0's serves the store)."""

    kv: KvServer


class PlaneStore:
    """The ``Store`` interface over a plane's rank-0 store."""

    def __init__(self, plane: StoreMembers, timeout: float) -> None:
        self.plane = plane
        self.timeout = timeout

    def _call(self, op: str, keys: list[str], value: Any = None, timeout: float | None = None) -> Any:
        plane = self.plane
        req = {"t": "kv", "id": next(_ids), "op": op, "keys": keys, "value": value}
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with plane.cv:
            if plane.rank == 0:
                plane.kv.serve(0, req)
            elif not plane.send(0, req):
                raise PeerLostError("rank 0 of the communicator being formed is lost", rank=0)
            while True:
                answer = plane.kv.answers.pop(req["id"], None)
                if answer is not None:
                    return answer["value"]
                if plane.dead:
                    r, why = next(iter(plane.dead.items()))
                    raise PeerLostError(
                        f"rank {r} was lost while the communicator was being formed ({why})", rank=r
                    )
                plane.raise_if_evicted()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"the new communicator's store did not answer {op} {keys} in time"
                    )
                plane.cv.wait(min(left, 0.25))

    def set(self, key: str, value: bytes) -> None:
        self._call("set", [key], base64.b64encode(value).decode())

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return base64.b64decode(self._call("get", [key], timeout=timeout))

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", [key], int(amount)))

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self._call("wait", list(keys), timeout=timeout)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def delete(self, key: str) -> bool:
        return bool(self._call("delete", [key]))

    def delete_key(self, key: str) -> bool:
        return self.delete(key)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"PlaneStore(plane {self.plane.id})"
