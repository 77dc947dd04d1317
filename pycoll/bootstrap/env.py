"""Which launcher started this process, and where its rendezvous is: parsing of launch environments.

Recognised, in this order (the first whose variables are present wins):

``torchrun`` (and ``pycoll run``)
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; job id TORCHELASTIC_RUN_ID;
    the node's index and the node count from GROUP_RANK and GROUP_WORLD_SIZE (``pycoll run`` also sets
    NODE_RANK; ROLE_RANK / ROLE_WORLD_SIZE equal RANK / WORLD_SIZE with the single role pycoll supports
    and are not read).
    When TORCHELASTIC_USE_AGENT_STORE is true, torchrun's agent already serves a torch TCPStore on
    MASTER_PORT (recent torch versions do this), so pycoll must join it through torch rather than
    listen there itself; TORCHELASTIC_RESTART_COUNT tells restarted attempts apart.
``openmpi`` (mpirun / mpiexec / prterun)
    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; job id OMPI_MCA_ess_base_jobid or
    PMIX_NAMESPACE. Checked before Slurm because mpirun inside a Slurm allocation inherits the
    allocation's SLURM_* variables, which then describe the batch script, not this rank. Open MPI gives
    no node index: OMPI_COMM_WORLD_NODE_RANK is the rank among the processes of *all* jobs on this node
    (a local rank), so it is not read, and node_rank / num_nodes stay None (the communicator finds the
    hosts itself, from the host ids the ranks exchange).
``slurm`` (srun)
    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, tasks on this node from SLURM_STEP_TASKS_PER_NODE,
    SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE (``"2(x3),1"`` form, indexed by SLURM_NODEID);
    node index SLURM_NODEID, node count SLURM_STEP_NUM_NODES (else the length of
    SLURM_STEP_TASKS_PER_NODE); job id ``SLURM_JOB_ID.SLURM_STEP_ID``. When the step spans several
    nodes and MASTER_ADDR is unset, the rendezvous address is the first host of SLURM_STEP_NODELIST
    (else SLURM_JOB_NODELIST / SLURM_NODELIST), expanded from Slurm's compressed form without calling
    scontrol: ``"gpu-node[07-10,12],cpu1"`` -> ``gpu-node07``. That is where rank 0 runs under srun's
    block and cyclic distributions; with an arbitrary distribution (SLURM_HOSTFILE) set MASTER_ADDR.

For every launcher MASTER_ADDR / MASTER_PORT, when set, give the rendezvous address. Without
MASTER_PORT, ranks on one host meet through a file named after the job id (see ``rendezvous``); ranks
on several hosts need MASTER_PORT.

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
    "slurm_first_host",
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
    #: This node's index among the job's nodes and their count, where the launcher gives them (torchrun's
    #: GROUP_RANK / GROUP_WORLD_SIZE, Slurm's SLURM_NODEID / SLURM_STEP_NUM_NODES); None otherwise.
    node_rank: int | None = None
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        _check_layout(self.rank, self.world_size, self.local_rank, self.local_world_size, self.launcher)
        _check_nodes(self.node_rank, self.num_nodes, self.world_size, self.local_world_size, self.launcher)
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


def _check_nodes(node_rank: int | None, nodes: int | None, world: int, local_world: int, source: str) -> None:
    if nodes is not None:
        if not 1 <= nodes <= world:
            raise InvalidUsageError(f"{source}: node count must be in 1..{world} (world size), got {nodes}")
        # Every other node has at least one rank.
        if local_world + nodes - 1 > world:
            raise InvalidUsageError(
                f"{source}: {local_world} ranks on this node and {nodes - 1} other node(s) need more than "
                f"the world size of {world}"
            )
    if node_rank is not None and not 0 <= node_rank < (world if nodes is None else nodes):
        limit = f"node count {nodes}" if nodes is not None else f"world size {world}"
        raise InvalidUsageError(f"{source}: node rank {node_rank} is out of range for the {limit}")


def explicit_launch(
    rank: int,
    world_size: int,
    master_addr: str = _DEFAULT_ADDR,
    master_port: int | None = None,
    *,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    job_id: str | None = None,
    node_rank: int | None = None,
    num_nodes: int | None = None,
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
        node_rank=node_rank,
        num_nodes=num_nodes,
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


def _master(env: Mapping[str, str], default_addr: str = _DEFAULT_ADDR) -> tuple[str, int | None]:
    addr = _get(env, "MASTER_ADDR") or default_addr
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


_RANGES = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")


def slurm_first_host(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a Slurm hostlist, expanded as ``scontrol show hostnames`` would (without it).

    ``"gpu-node[07-10,12],cpu1"`` -> ``"gpu-node07"`` (zero padding kept); several bracket groups in one
    name take the first value of each: ``"rack[2-3]-n[5-6]"`` -> ``"rack2-n5"``.
    """

    def bad(why: str) -> InvalidUsageError:
        return InvalidUsageError(
            f"environment variable {variable}={nodelist!r} is not a Slurm hostlist ({why})"
        )

    text = nodelist.strip()
    host: list[str] = []
    i = 0
    while i < len(text) and text[i] != ",":  # a comma outside brackets ends the first name
        c = text[i]
        if c == "[":
            end = text.find("]", i + 1)
            if end < 0:
                raise bad("'[' without ']'")
            ranges = text[i + 1 : end].replace(" ", "")
            if not _RANGES.match(ranges):
                raise bad(f"'[{text[i + 1:end]}]' is not a list of numbers and ranges such as [01-04,07]")
            host.append(ranges.split(",")[0].split("-")[0])
            i = end + 1
        elif c == "]":
            raise bad("']' without '['")
        elif c.isspace():
            raise bad("it contains white space")
        else:
            host.append(c)
            i += 1
    if not host:
        raise bad("its first host name is empty")
    return "".join(host)


def _local_layout(
    rank: int, world: int, local_rank: int | None, local_world: int | None
) -> tuple[int, int]:
    """Fills in what the launcher left out: without a local size the job is taken to run on one host."""
    if local_rank is None:
        local_rank = rank if local_world is None else rank % local_world
    if local_world is None:
        local_world = world
    return local_rank, local_world


def _node_layout(
    env: Mapping[str, str], rank_var: str, count_var: str, world: int, local_world: int
) -> tuple[int | None, int | None]:
    """(node rank, node count) from two variables, each optional; range errors name both variables."""
    node_rank = _int(env, rank_var)
    nodes = _int(env, count_var, minimum=1)
    _check_node_values(rank_var, node_rank, f"{count_var}={nodes}", nodes, world, local_world)
    return node_rank, nodes


def _check_node_values(
    rank_var: str, node_rank: int | None, count_label: str, nodes: int | None, world: int, local_world: int
) -> None:
    """``count_label`` is how the node count is named in errors ("GROUP_WORLD_SIZE=3")."""
    if nodes is not None:
        if nodes > world:
            raise InvalidUsageError(
                f"environment variable {count_label} is larger than the world size ({world}): every node "
                "runs at least one rank"
            )
        if local_world + nodes - 1 > world:
            raise InvalidUsageError(
                f"environment variable {count_label} does not fit the world size {world} with "
                f"{local_world} ranks on this node (every other node runs at least one rank)"
            )
        if node_rank is not None and node_rank >= nodes:
            raise InvalidUsageError(
                f"environment variable {rank_var}={node_rank} is out of range for {count_label} "
                f"(nodes are 0..{nodes - 1})"
            )
    if node_rank is not None and node_rank >= world:
        raise InvalidUsageError(
            f"environment variable {rank_var}={node_rank} is out of range for the world size {world}"
        )


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
    node_rank, nodes = _node_layout(env, "GROUP_RANK", "GROUP_WORLD_SIZE", world, local_world)
    if node_rank is None and _get(env, "NODE_RANK") is not None:
        node_rank, _ = _node_layout(env, "NODE_RANK", "GROUP_WORLD_SIZE", world, local_world)
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
        node_rank=node_rank,
        num_nodes=nodes,
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
    node = _int(env, "SLURM_NODEID")
    local_world: int | None = None
    local_world_var = "SLURM_TASKS_PER_NODE"
    step_counts: list[int] | None = None  # tasks on each node of this step, when Slurm says
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        raw = _get(env, var)
        if raw is None:
            continue
        counts = parse_slurm_tasks_per_node(raw, var)
        index = 0
        if len(counts) > 1:
            index = node or 0
            if index >= len(counts):
                raise InvalidUsageError(
                    f"environment variable SLURM_NODEID={index} is out of range for {var}={raw!r} "
                    f"({len(counts)} nodes)"
                )
        local_world, local_world_var = counts[index], var
        if local_world < 1:
            raise InvalidUsageError(
                f"environment variable {var}={raw!r} gives {local_world} tasks on this node"
            )
        if var == "SLURM_STEP_TASKS_PER_NODE":
            step_counts = counts
            if sum(counts) != world:
                raise InvalidUsageError(
                    f"environment variable {var}={raw!r} adds up to {sum(counts)} tasks but "
                    f"{world_var}={world}"
                )
        break
    if local_rank is None:
        if step_counts is not None and node is not None and node < len(step_counts):
            local_rank = rank - sum(step_counts[:node])  # block distribution, srun's default
        else:
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
    _, nodes = _node_layout(env, "SLURM_NODEID", "SLURM_STEP_NUM_NODES", world, local_world)
    if step_counts is not None:
        per_node = f"SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']!r}"
        if nodes is None:
            nodes = len(step_counts)
            _check_node_values("SLURM_NODEID", node, f"{per_node} ({nodes} nodes)", nodes, world, local_world)
        elif nodes != len(step_counts):
            raise InvalidUsageError(
                f"environment variable SLURM_STEP_NUM_NODES={nodes} does not match {per_node} "
                f"({len(step_counts)} nodes)"
            )
    default_addr = _DEFAULT_ADDR
    if local_world < world or (nodes is not None and nodes > 1):
        # Several nodes: rank 0 runs on the step's first host (block and cyclic distributions).
        for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            raw = _get(env, var)
            if raw is not None:
                default_addr = slurm_first_host(raw, var)
                break
    addr, port = _master(env, default_addr)
    job = _get(env, "SLURM_JOB_ID") or _get(env, "SLURM_JOBID")
    step = _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID")
    job_id = None if job is None else (job if step is None else f"{job}.{step}")
    return LaunchInfo(
        rank, world, local_rank, local_world, addr, port, "slurm", job_id, node_rank=node, num_nodes=nodes
    )


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
