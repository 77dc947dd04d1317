"""``Work``: the handle an asynchronous collective returns, shaped like torch.distributed's."""

from __future__ import annotations

import sys
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pycoll.errors import CollectiveTimeoutError


class Work:
    """An asynchronous collective in flight.

    ``wait()`` blocks until it finished and returns True, or raises the collective's error;
    ``wait(timeout=s)`` raises CollectiveTimeoutError if it has not finished within s seconds (the
    collective itself keeps its own deadline). ``result()`` is the array the collective wrote.
    """

    def __init__(self, future: Future, description: str) -> None:
        self._future = future
        self._description = description
        self._torch_future: Any = None

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._future.result(timeout=timeout)
        except FutureTimeout:
            raise CollectiveTimeoutError(
                f"{self._description} did not finish within the {timeout} s given to Work.wait()"
            ) from None
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The error the collective raised, None if it succeeded; blocks until it finished."""
        return self._future.exception()

    def result(self) -> Any:
        return self._future.result()

    def get_future(self) -> Any:
        """A torch.futures.Future when torch is imported, else a concurrent.futures.Future."""
        torch = sys.modules.get("torch")
        if torch is None:
            return self._future
        if self._torch_future is None:
            fut = torch.futures.Future()

            def done(f: Future) -> None:
                err = f.exception()
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(f.result())

            self._torch_future = fut
            self._future.add_done_callback(done)
        return self._torch_future

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "running"
        return f"<pycoll.Work {self._description} {state}>"
