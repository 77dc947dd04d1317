"""Which launcher started this process, and where its rendezvous is: parsing of launch environments.

Recognised, in this order (the first whose variables are present wins):

``torchrun`` (and ``pycoll run``)
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; job id TORCHELASTIC_RUN_ID.
    When TORCHELASTIC_USE_AGENT_STORE is true, torchrun's agent already serves a torch TCPStore on
    MASTER_PORT (recent torch versions do this), so pycoll must join it through torch rather than
    listen there itself; TORCHELASTIC_RESTART_COUNT tells restarted attempts apart.
``openmpi`` (mpirun / mpiexec / prterun)
    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; job id OMPI_MCA_ess_base_jobid or
    PMIX_NAMESPACE. Checked before Slurm because mpirun inside a Slurm allocation inherits the
    allocation's SLURM_* variables, which then describe the batch script, not this rank.
``slurm`` (srun)
    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, tasks on this node from SLURM_STEP_TASKS_PER_NODE,
    SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE (``"2(x3),1"`` form, indexed by SLURM_NODEID);
    job id ``SLURM_JOB_ID.SLURM_STEP_ID``.

For every launcher MASTER_ADDR / MASTER_PORT, when set, give the rendezvous address. Without
MASTER_PORT, ranks on one host meet through a file named after the job id (see ``rendezvous``).

Only launch variables are read here; pycoll's own ``PYCOLL_*`` settings live in ``pycoll/env.py``
(including ``launcher_hosts_store``, re-exported here as part of ``pycoll run``'s launch protocol).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pycoll.env import LAUNCHER_STORE_VAR, launcher_hosts_store
from pycoll.errors import InvalidUsageError

__all__ = [
    "LAUNCHER_STORE_VAR",
    "LaunchInfo",
    "Launcher",
    "detect_launch",
    "explicit_launch",
    "launcher_hosts_store",
    "parse_slurm_tasks_per_node",
]

Launcher = Literal["torchrun", "openmpi", "slurm", "explicit"]


_DEFAULT_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job and how to reach the rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int | None
    launcher: Launcher
    job_id: str | None = None
    #: torchrun's agent already hosts a *torch* TCPStore at master_addr:master_port
    #: (TORCHELASTIC_USE_AGENT_STORE): every rank, rank 0 included, connects to it through torch.
    torch_agent_store: bool = False
    #: torchrun's TORCHELASTIC_RESTART_COUNT: keys of an earlier attempt in a reused store are not read.
    restart_count: int = 0

    def __post_init__(self) -> None:
        _check_layout(self.rank, self.world_size, self.local_rank, self.local_world_size, self.launcher)
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise InvalidUsageError(f"master_port must be in 1..65535, got {self.master_port}")
        if not self.master_addr:
            raise InvalidUsageError("master_addr must not be empty")

    @property
    def single_host(self) -> bool:
        """True when every rank of the job runs on this host."""
        return self.local_world_size == self.world_size


def _check_layout(rank: int, world: int, local_rank: int, local_world: int, source: str) -> None:
    if world < 1:
        raise InvalidUsageError(f"{source}: world size must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise InvalidUsageError(f"{source}: rank must be in 0..{world - 1} (world size {world}), got {rank}")
    if not 1 <= local_world <= world:
        raise InvalidUsageError(
            f"{source}: local world size must be in 1..{world} (world size), got {local_world}"
        )
    if not 0 <= local_rank < local_world:
        raise InvalidUsageError(
            f"{source}: local rank must be in 0..{local_world - 1} (local world size {local_world}), "
            f"got {local_rank}"
        )


def explicit_launch(
    rank: int,
    world_size: int,
    master_addr: str = _DEFAULT_ADDR,
    master_port: int | None = None,
    *,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    job_id: str | None = None,
) -> LaunchInfo:
    """A LaunchInfo from explicit arguments (``pycoll.init(rank=, world_size=, ...)``).

    Without local_rank/local_world_size the job is taken to run on one host.
    """
    return LaunchInfo(
        rank=int(rank),
        world_size=int(world_size),
        local_rank=int(rank if local_rank is None else local_rank),
        local_world_size=int(world_size if local_world_size is None else local_world_size),
        master_addr=master_addr,
        master_port=None if master_port is None else int(master_port),
        launcher="explicit",
        job_id=job_id,
    )


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise InvalidUsageError(f"environment variable {name}={env[name]!r} is not an integer") from None
    if value < minimum:
        raise InvalidUsageError(f"environment variable {name}={env[name]!r} must be >= {minimum}")
    return value


def _require(env: Mapping[str, str], name: str, because: str, *, minimum: int = 0) -> int:
    value = _int(env, name, minimum=minimum)
    if value is None:
        raise InvalidUsageError(f"{because} is set but {name} is not; set both or neither")
    return value


def _validated(
    env: Mapping[str, str],
    names: tuple[str, str, str, str],
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
) -> None:
    """Range checks that name the offending variable and its value."""
    rank_var, world_var, local_rank_var, local_world_var = names
    if not rank < world:
        raise InvalidUsageError(
            f"environment variable {rank_var}={rank} is out of range for {world_var}={world} "
            f"(ranks are 0..{world - 1})"
        )
    if local_world > world:
        raise InvalidUsageError(
            f"environment variable {local_world_var}={local_world} is larger than {world_var}={world}"
        )
    if not local_rank < local_world:
        raise InvalidUsageError(
            f"environment variable {local_rank_var}={local_rank} is out of range for "
            f"{local_world_var}={local_world} (local ranks are 0..{local_world - 1})"
        )


def _master(env: Mapping[str, str]) -> tuple[str, int | None]:
    addr = _get(env, "MASTER_ADDR") or _DEFAULT_ADDR
    port = _int(env, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise InvalidUsageError(f"environment variable MASTER_PORT={env['MASTER_PORT']!r} is not in 1..65535")
    return addr, port


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_slurm_tasks_per_node(value: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed per-node task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in value.strip().split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise InvalidUsageError(
                f"environment variable {variable}={value!r} is not in Slurm's 'N' / 'N(xM)' list form"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _local_layout(
    rank: int, world: int, local_rank: int | None, local_world: int | None
) -> tuple[int, int]:
    """Fills in what the launcher left out: without a local size the job is taken to run on one host."""
    if local_rank is None:
        local_rank = rank if local_world is None else rank % local_world
    if local_world is None:
        local_world = world
    return local_rank, local_world


def _torchrun(env: Mapping[str, str]) -> LaunchInfo:
    rank = _require(env, "RANK", "WORLD_SIZE")
    world = _require(env, "WORLD_SIZE", "RANK", minimum=1)
    # Set by hand (no torchrun): without LOCAL_* the job is taken to run on this host alone.
    local_rank, local_world = _local_layout(
        rank, world, _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    )
    _validated(
        env, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"), rank, world, local_rank, local_world
    )
    addr, port = _master(env)
    agent_store = (_get(env, "TORCHELASTIC_USE_AGENT_STORE") or "").lower() in ("true", "1", "yes")
    if agent_store and port is None:
        raise InvalidUsageError("TORCHELASTIC_USE_AGENT_STORE is set but MASTER_PORT is not")
    return LaunchInfo(
        rank,
        world,
        local_rank,
        local_world,
        addr,
        port,
        "torchrun",
        _get(env, "TORCHELASTIC_RUN_ID"),
        torch_agent_store=agent_store,
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT") or 0,
    )


def _openmpi(env: Mapping[str, str]) -> LaunchInfo:
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    assert rank is not None
    world = _require(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", minimum=1)
    local_rank, local_world = _local_layout(
        rank,
        world,
        _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1),
    )
    _validated(
        env,
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        rank,
        world,
        local_rank,
        local_world,
    )
    addr, port = _master(env)
    job_id = _get(env, "OMPI_MCA_ess_base_jobid") or _get(env, "PMIX_NAMESPACE")
    return LaunchInfo(rank, world, local_rank, local_world, addr, port, "openmpi", job_id)


def _slurm(env: Mapping[str, str]) -> LaunchInfo:
    rank = _int(env, "SLURM_PROCID")
    assert rank is not None
    world_var = "SLURM_NTASKS" if _get(env, "SLURM_NTASKS") is not None else "SLURM_NPROCS"
    world = _require(env, world_var, "SLURM_PROCID", minimum=1)
    local_rank = _int(env, "SLURM_LOCALID")
    local_world: int | None = None
    local_world_var = "SLURM_TASKS_PER_NODE"
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        raw = _get(env, var)
        if raw is None:
            continue
        counts = parse_slurm_tasks_per_node(raw, var)
        node = 0
        if len(counts) > 1:
            node = _int(env, "SLURM_NODEID") or 0
            if node >= len(counts):
                raise InvalidUsageError(
                    f"environment variable SLURM_NODEID={node} is out of range for {var}={raw!r}"
                )
        local_world, local_world_var = counts[node], var
        if local_world < 1:
            raise InvalidUsageError(
                f"environment variable {var}={raw!r} gives {local_world} tasks on this node"
            )
        break
    if local_rank is None:
        local_rank = rank if local_world is None else rank % local_world
    if local_world is None:
        local_world = world
    _validated(
        env,
        ("SLURM_PROCID", world_var, "SLURM_LOCALID", local_world_var),
        rank,
        world,
        local_rank,
        local_world,
    )
    addr, port = _master(env)
    job = _get(env, "SLURM_JOB_ID") or _get(env, "SLURM_JOBID")
    step = _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID")
    job_id = None if job is None else (job if step is None else f"{job}.{step}")
    return LaunchInfo(rank, world, local_rank, local_world, addr, port, "slurm", job_id)


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """The launch this process is part of, from ``environ`` (default ``os.environ``), or None when no
    launcher's variables are present. Malformed or inconsistent values raise InvalidUsageError naming
    the variable and its value."""
    env = os.environ if environ is None else environ
    if _get(env, "RANK") is not None or _get(env, "WORLD_SIZE") is not None:
        return _torchrun(env)
    if _get(env, "OMPI_COMM_WORLD_RANK") is not None:
        return _openmpi(env)
    if _get(env, "SLURM_PROCID") is not None and (
        _get(env, "SLURM_NTASKS") is not None or _get(env, "SLURM_NPROCS") is not None
    ):
        return _slurm(env)
    return None
