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
- elsewhere: rank 0 starts a torch TCPStore on a port the kernel picks, and hands its address to the
  other ranks through pycoll's rendezvous store (hosted by rank 0, or by ``pycoll run``; PYCOLL_SECRET
  authenticates it). Torch's store is torch's own, with everything torch and gloo ask of one; like
  torchrun's, it is not authenticated.

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
    dist.init_process_group(backend, store=_torch_store(info, delta), **args)


def _torch_store(info: Any, timeout: timedelta) -> dist.TCPStore:
    """A torch TCPStore that rank 0 hosts, its address passed on through pycoll's rendezvous store."""
    seconds = timeout.total_seconds()
    settings = Settings.from_environ()
    store, server = rendezvous(
        info, timeout=seconds, store_hosted_externally=launcher_hosts_store(), secret=settings.secret
    )
    _OWNED.extend([store] if server is None else [store, server])
    key = f"pycoll/torch/store/{info.restart_count}"
    if info.rank == 0:
        tcp = dist.TCPStore(
            info.master_addr, 0, info.world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        store.set(key, f"{info.master_addr}\n{tcp.port}".encode())
        return tcp
    host, port = store.get(key, seconds).decode().split("\n")
    return dist.TCPStore(host, int(port), info.world_size, is_master=False, timeout=timeout)


#: Seconds a rank hosting pycoll's rendezvous store waits at exit for the other ranks to let go of it.
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
