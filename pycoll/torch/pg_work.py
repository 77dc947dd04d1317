"""``TorchWork``: the ``torch.distributed.Work`` every call of the pycoll backend returns.

It behaves as gloo's: ``wait()`` blocks until the collective finished and raises its error (pycoll's own
types: PeerLostError, CollectiveMismatchError, CollectiveTimeoutError...), ``wait(timeout)`` raises
CollectiveTimeoutError past that many seconds, ``is_completed()`` / ``is_success()`` never block,
``exception()`` is the error of a finished collective (None while it runs or when it succeeded),
``result()`` the output tensors, and ``get_future()`` a ``torch.futures.Future`` of the output tensors
that completes (or fails with the same error) when the collective does. A synchronous call
(``async_op=False``) comes back finished.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pycoll.errors import CollectiveTimeoutError


class TorchWork(dist.Work):
    def __init__(self, future: Future | None, outputs: list[torch.Tensor], description: str) -> None:
        super().__init__()
        self._future = future
        self._outputs = outputs
        self._description = description
        self._torch_future: Any = None
        #: The rank a recv came from (``source_rank()``); -1 for the other ops.
        self.peer = -1
        #: A receive from any source: its sender, once matched (``source_rank()``).
        self.source: Future | None = None

    @classmethod
    def finished(cls, outputs: list[torch.Tensor], description: str) -> TorchWork:
        """The Work of a call that already succeeded (no future: the per-call cost stays small)."""
        return cls(None, outputs, description)

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        if self._future is None:
            return True
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        try:
            self._future.result(timeout=seconds if seconds and seconds > 0 else None)
        except FutureTimeout:
            raise CollectiveTimeoutError(
                f"{self._description} did not finish within the {seconds} s given to Work.wait()"
            ) from None
        return True

    def is_completed(self) -> bool:
        return self._future is None or self._future.done()

    def is_success(self) -> bool:
        return self._future is None or (self._future.done() and self._future.exception() is None)

    def exception(self) -> BaseException | None:
        if self._future is None or not self._future.done():
            return None
        return self._future.exception()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        if self.source is not None:
            return self.source.result() if self.source.done() and not self.source.exception() else -1
        return self.peer

    # What dist.recv asks of a receive's Work (torch's C++ Work answers it only for its own receives).
    _source_rank = source_rank

    def get_future(self) -> torch.futures.Future:
        if self._torch_future is None:
            fut: torch.futures.Future = torch.futures.Future()
            outputs = self._outputs

            def done(f: Future) -> None:
                err = f.exception()
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(outputs)

            self._torch_future = fut
            if self._future is None:
                fut.set_result(outputs)
            else:
                self._future.add_done_callback(done)
        return self._torch_future

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "running"
        return f"<pycoll.torch.TorchWork {self._description} {state}>"
