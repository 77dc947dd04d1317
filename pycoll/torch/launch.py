"""``pycoll.torch.init_process_group()``: torch.distributed's default group under any launcher.

    import pycoll.torch
    pycoll.torch.init_process_group()                       # backend "pycoll"
    pycoll.torch.init_process_group("gloo", timeout=timedelta(minutes=5))

torch's own ``init_process_group("pycoll")`` (env://) needs torch's TCPStore at MASTER_ADDR:MASTER_PORT,
which torchrun's agent provides. Other launchers give less: Open MPI's mpirun and Slurm's srun set only
their own rank variables, and ``pycoll run`` serves *pycoll's* store at MASTER_PORT, which torch cannot
talk to. This function reads the launcher as ``pycoll.init()`` does (torchrun, ``pycoll run``, mpirun,
srun) and then:

- under torchrun (torch's store at MASTER_PORT): plain ``dist.init_process_group(init_method="env://")``;
- elsewhere: pycoll's rendezvous (rank 0 hosts the store unless ``pycoll run`` does; PYCOLL_SECRET
  authenticates it), and torch gets that store through ``StoreForTorch``.

Every other keyword goes to ``dist.init_process_group`` (``pg_options=``, ``device_id=``...).
"""

from __future__ import annotations

import atexit
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from pycoll.bootstrap import detect_launch, rendezvous
from pycoll.env import Settings, launcher_hosts_store
from pycoll.errors import InvalidUsageError

_OWNED: list[Any] = []  # the rendezvous store (and server) this process opened, closed at exit


class StoreForTorch(dist.Store):
    """A pycoll store (``pycoll.bootstrap.Store``) as a ``torch.distributed.Store``.

    What torch and the pycoll backend ask of a store: set, get (waiting up to the store's timeout), add,
    wait, check, delete_key. ``compare_set`` and ``num_keys`` are not part of pycoll's store and raise
    InvalidUsageError naming them.
    """

    def __init__(self, store: Any, timeout: timedelta) -> None:
        super().__init__()
        self._store = store
        self._timeout_s = timeout.total_seconds()

    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value if isinstance(value, bytes) else str(value).encode())

    def get(self, key: str) -> bytes:
        return self._store.get(key, self._timeout_s)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(key, int(amount))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else self._timeout_s
        self._store.wait(list(keys), seconds)

    def check(self, keys: list[str]) -> bool:
        return bool(self._store.check(list(keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self._store.delete(key))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        raise InvalidUsageError("pycoll's rendezvous store has no compare_set (torch's TCPStore has)")

    def num_keys(self) -> int:
        raise InvalidUsageError("pycoll's rendezvous store does not count its keys (torch's TCPStore does)")


def init_process_group(backend: str = "pycoll", *, timeout: timedelta | None = None, **kwargs: Any) -> None:
    """``dist.init_process_group(backend, ...)`` with the ranks, world size and store of whichever
    launcher started this process (module docstring). ``timeout``: torch's default (30 minutes) when
    None; it also bounds the rendezvous."""
    info = detect_launch()
    if info is None:
        raise InvalidUsageError(
            "pycoll.torch.init_process_group() found no launcher environment: start the script with "
            "torchrun, `pycoll run -n N`, mpirun or srun (or call dist.init_process_group yourself)"
        )
    delta = timeout if timeout is not None else timedelta(minutes=30)
    args = dict(rank=info.rank, world_size=info.world_size, timeout=delta, **kwargs)
    if info.torch_agent_store or (info.launcher == "torchrun" and not launcher_hosts_store()):
        dist.init_process_group(backend, init_method="env://", **args)
        return
    settings = Settings.from_environ()
    store, server = rendezvous(
        info,
        timeout=delta.total_seconds(),
        store_hosted_externally=launcher_hosts_store(),
        secret=settings.secret,
    )
    _OWNED.extend([store] if server is None else [store, server])
    dist.init_process_group(backend, store=StoreForTorch(store, delta), **args)


#: Seconds a rank hosting the store waits at exit for the other ranks to let go of it.
DRAIN_S = 10.0


@atexit.register
def _close_owned() -> None:
    """Closes this rank's store client, then (rank 0) the server, once the other ranks are gone."""
    for obj in _OWNED:
        try:
            if hasattr(obj, "wait_for_clients_to_leave"):
                obj.close(drain_timeout=DRAIN_S)
            else:
                obj.close()
        except Exception:  # noqa: BLE001 - at exit nothing is left to report to
            pass
    _OWNED.clear()
