"""Stores built on other stores: ``PrefixStore`` (a key namespace over any store) and
``TorchStoreAdapter`` (a ``torch.distributed.Store`` seen as a pycoll ``Store``).

They depend only on the ``Store`` interface of ``protocol.py``, not on the TCP client or server:
rendezvous wraps a ``TCPStoreClient`` or a torch store in them. Duck typed; torch is never imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pycoll.bootstrap.store.protocol import Store, _as_bytes, _fmt_seconds
from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, PeerLostError

__all__ = ["PrefixStore", "TorchStoreAdapter", "get_many"]


class PrefixStore:
    """Every key of ``store`` seen through this object is ``f"{prefix}/{key}"``.

    ``close()`` closes the wrapped store only when ``close_underlying`` is true (by default the
    wrapped store belongs to whoever created it).
    """

    def __init__(self, store: Store, prefix: str, *, close_underlying: bool = False) -> None:
        self.store = store
        self.prefix = prefix
        self._close_underlying = close_underlying

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.store.get(self._k(key), timeout)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._k(key), amount)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self.store.wait([self._k(k) for k in keys], timeout)

    def check(self, keys: list[str]) -> bool:
        check = getattr(self.store, "check", None)
        if check is None:
            raise InvalidUsageError(f"{type(self.store).__name__} has no check()")
        return bool(check([self._k(k) for k in keys]))

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        return get_many(self.store, [self._k(k) for k in keys], timeout)

    def delete(self, key: str) -> bool:
        return bool(self.store.delete(self._k(key)))

    def close(self) -> None:
        if self._close_underlying:
            self.store.close()

    def __repr__(self) -> str:
        return f"PrefixStore({self.store!r}, {self.prefix!r})"


def get_many(store: Store, keys: list[str], timeout: float | None = None) -> list[bytes]:
    """Every key's value, in order, once all exist: ``store.multi_get`` (one request) where the store has
    it, else one ``get`` per key, all within ``timeout``."""
    multi = getattr(store, "multi_get", None)
    if multi is not None:
        return list(multi(list(keys), timeout))
    if timeout is None:
        return [store.get(k) for k in keys]
    deadline = time.monotonic() + timeout
    return [store.get(k, max(0.0, deadline - time.monotonic())) for k in keys]


class TorchStoreAdapter:
    """A ``torch.distributed.Store`` (TCPStore, FileStore, PrefixStore...) seen as a pycoll ``Store``.

    Duck typed: torch is never imported here. Torch's timeout errors become CollectiveTimeoutError and
    its connection errors PeerLostError. ``close()`` does nothing: the torch store belongs to its creator.
    """

    def __init__(self, torch_store: Any, *, name: str | None = None) -> None:
        self.torch_store = torch_store
        self.name = name or type(torch_store).__name__

    def set(self, key: str, value: bytes) -> None:
        self._call("set", [key], lambda: self.torch_store.set(key, _as_bytes(value)))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        if timeout is not None:
            self.wait([key], timeout)
        value = self._call("get", [key], lambda: self.torch_store.get(key), timeout)
        return _as_bytes(value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", [key], lambda: self.torch_store.add(key, int(amount))))

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        keys = list(keys)
        if timeout is None:
            self._call("wait", keys, lambda: self.torch_store.wait(keys))
        else:
            delta = timedelta(seconds=float(timeout))
            self._call("wait", keys, lambda: self.torch_store.wait(keys, delta), timeout)

    def check(self, keys: list[str]) -> bool:
        keys = list(keys)
        return bool(self._call("check", keys, lambda: self.torch_store.check(keys)))

    def delete(self, key: str) -> bool:
        return bool(self._call("delete_key", [key], lambda: self.torch_store.delete_key(key)))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"TorchStoreAdapter({self.torch_store!r})"

    def _call(self, op: str, keys: list[str], fn: Callable[[], Any], timeout: float | None = None) -> Any:
        start = time.monotonic()
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, (CollectiveTimeoutError, PeerLostError, InvalidUsageError)):
                raise
            text = str(exc)
            low = text.lower()
            waited = time.monotonic() - start
            what = f"key {keys[0]!r}" if len(keys) == 1 else f"keys {keys!r}"
            if "timeout" in low or "timed out" in low:
                raise CollectiveTimeoutError(
                    f"timed out after {_fmt_seconds(waited)} waiting for {what} in the torch store "
                    f"{self.name} ({op}: {text})"
                ) from exc
            if any(
                s in low
                for s in (
                    "connection reset",
                    "broken pipe",
                    "connection closed",
                    "refused",
                    "connection was closed",
                    "peer",
                )
            ):
                raise PeerLostError(
                    f"rendezvous store {self.name} closed the connection during {op} of {what}: {text}",
                    rank=0,
                ) from exc
            raise
