"""The one module that decides what "auto" means: one function per question.

| question                                                 | function                     | asked by     |
|----------------------------------------------------------|------------------------------|--------------|
| how do the ranks reach each other (PYCOLL_TRANSPORT)?    | ``transport``                | formation    |
| how long does a waiting rank spin / yield (``auto``)?    | ``wait_policy``              | formation    |
| how large are the transport's ring slots, how many?      | ``ring_shape``               | formation    |
| are the ranks on equal hosts, numbered host by host?     | ``ranks_per_host``,          | formation    |
|                                                          | ``spans_equal_hosts``        |              |
| which cost model do ``auto`` choices use?                | ``uses_calibration``,        | formation    |
|                                                          | ``default_model``            |              |
| which algorithm runs ``algorithm="auto"``?               | ``algorithm``                | pycoll.api   |
| ... and with a fixed codec?                              | ``auto_compressed_algorithm``| pycoll.api,  |
|                                                          | ``compressed_algorithm``     | pycoll.bench |
| ... of an all-to-all?                                    | ``all_to_all_algorithm``     | pycoll.api   |
| which codec and algorithm run ``compression="auto"``?    | ``compression``              | pycoll.api   |
| ... and on GPU memory: which machine is it?              | ``gpu_topology``,            | formation    |
|                                                          | ``gpu_topology_setting``     |              |
| does every rank record every rank's lateness (skew)?     | ``skew``                     | formation    |

The cost model (:class:`pycoll.tuning.model.Model`) only predicts: it answers "which of these is
predicted fastest" (``choose_algorithm``, ``choose_compression``, remembered per model); this module
decides when to ask it and what overrides it (GPU memory, hosts of equal size, data compression does not
support). Every rank asks with the same facts (the host list, rank 0's model), so every rank decides
alike. The per-call questions take those facts as ``Facts`` (what a communicator, or its Context, has),
so that this module never needs the communicator's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from pycoll.algorithms import ALGORITHMS
from pycoll.algorithms.compressed import COMPRESSED_DIRECT_ALGORITHM, DEFAULT_COMPRESSED_ALGORITHM
from pycoll.call import compression_refusal
from pycoll.compression import Codec, get_codec
from pycoll.env import (
    DEFAULT_SPIN_US,
    DEFAULT_YIELD_US,
    TCP_FRAGMENT_BYTES,
    TCP_RING_BYTES_PER_RANK,
    Settings,
    fitted_slot_bytes,
)
from pycoll.errors import InvalidUsageError
from pycoll.tuning.links import LinkProfile
from pycoll.tuning.model import Model
from pycoll.tuning.topology import Topology, TopologyModel, load_links

if TYPE_CHECKING:
    from pycoll.arrays import Buffer

__all__ = [
    "DEFAULT_ERROR_BUDGET",
    "algorithm",
    "auto_compressed_algorithm",
    "compression",
    "default_model",
    "gpu_topology",
    "gpu_topology_setting",
    "ranks_per_host",
    "ring_shape",
    "skew",
    "spans_equal_hosts",
    "transport",
    "uses_calibration",
    "wait_policy",
]

#: Collectives with a hierarchical plan, which ``auto`` runs on several hosts of equal size (more than one
#: rank each): each host's sum is formed over shared memory and only the hosts' sums cross the network.
HIERARCHICAL_COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")

class Facts(Protocol):
    """What the per-call questions ask of a communicator (or of its Context, pycoll/context.py)."""

    @property
    def world_size(self) -> int: ...
    @property
    def model(self) -> Model: ...
    @property
    def spans_equal_hosts(self) -> bool: ...
    @property
    def gpu_model(self) -> TopologyModel | None: ...


#: Above this many ranks ``algorithm="auto"`` leaves out the plans that touch every peer (``direct``) for
#: the collectives that have others: each rank would send n - 1 messages per segment where a ring sends
#: one, and hold a link to every other rank (a mapping, or a TCP connection with its rings), every one of
#: them made at the first such call. A compressed all-reduce keeps direct (two-shot: each element quantized
#: at most twice, where a ring quantizes its partial sums at every hop).
DIRECT_MAX_RANKS = 16

#: ``compression="auto"``'s error budget when the caller gives none: the relative L2 error the codec may
#: add (pycoll.tuning.model.expected_error). 1e-3 admits fp16 only; int8 needs error_budget=1e-2.
DEFAULT_ERROR_BUDGET = 1e-3


# ---- the communicator's set-up -----------------------------------------------------------------------
def transport(setting: str, num_nodes: int, world_size: int) -> str:
    """How this rank's messages travel, from PYCOLL_TRANSPORT (``setting``) and the host count:
    ``auto`` is "shm" on one host, "tcp" with one rank per host, else "mixed" (shared memory to the
    ranks of this host, TCP to the others). An explicit ``shm`` or ``tcp`` is kept as it is."""
    if setting != "auto":
        return setting
    if num_nodes == 1:
        return "shm"
    return "tcp" if num_nodes == world_size else "mixed"


def wait_policy(settings: Settings, local_world_size: int, transport: str, cpus: int) -> tuple[int, int]:
    """(spin, yield) microseconds of a waiting rank; ``auto`` (None in ``settings``) decides from the
    number of CPUs and of ranks on this host. Every rank on a core of its own: poll briefly, then yield
    briefly (in case the scheduler put a peer on this very core), then sleep. More ranks than cores:
    never spin (it steals the core the peer needs) but yield for a while before sleeping. Over TCP only
    (every peer on another host) neither spin nor yield: the network is slow to answer and what a rank
    waits for arrives through its own I/O thread, which wakes it; polling or yielding meanwhile only takes
    CPU from that thread and from the kernel's network stack (with 4 hosts sharing 2 vCPUs in netns,
    yielding for 50 us cost 5-20% of the ring's busbw at 64 MiB, docs/performance.md)."""
    oversubscribed = local_world_size > cpus
    spin = settings.spin_us
    if spin is None:
        spin = 0 if oversubscribed else DEFAULT_SPIN_US
    yield_us = settings.yield_us
    if yield_us is None:
        yield_us = 0 if transport == "tcp" else DEFAULT_YIELD_US if oversubscribed else DEFAULT_YIELD_US // 4
    if transport == "tcp":
        spin = 0
    return spin, yield_us


def ring_shape(settings: Settings, transport: str, world: int) -> tuple[int, int]:
    """(slot bytes, slots) of every ring of a communicator over ``transport`` ("shm", "tcp" or "mixed");
    a slot holds one fragment, the unit the plans cut messages into. TCP alone has rings of its own
    (PYCOLL_TCP_FRAGMENT_BYTES, PYCOLL_TCP_SLOTS): 512 KiB x 4 took 1.23-1.46x Gloo's busbw at 64 MiB
    between 2 hosts (unshaped veth, 2 vCPUs) where shared memory's 128 KiB x 8 took 0.76-1.03x: a fragment
    costs the same thread hand-overs and wake-ups whatever its size, and over TCP those, not copies, bound
    the rate (docs/performance.md). Each peer holds 2 rings (send, receive), so above 16 ranks fragments
    shrink to keep a rank's rings near 64 MiB. With peers on this host too ("mixed") both transports take
    the shared-memory shape (Settings.slot_bytes_for): plans cut messages one way for every link."""
    if transport != "tcp":
        return settings.slot_bytes_for(world), settings.shm_slots
    if settings.tcp_fragment_bytes is not None:
        return settings.tcp_fragment_bytes, settings.tcp_slots
    slots = settings.tcp_slots
    # 2 * slots: a send and a receive ring per peer
    return fitted_slot_bytes(TCP_FRAGMENT_BYTES, TCP_RING_BYTES_PER_RANK, 2 * slots, world), slots


def ranks_per_host(hosts: Sequence[str]) -> int | None:
    """Ranks per host when every host holds equally many ranks, numbered host by host (as torchrun,
    mpirun's default mapping, srun's block distribution and ``pycoll run`` number them), else None.
    From the host list alone, which every rank has: every rank reaches the same answer."""
    hosts = list(hosts)
    size = hosts.count(hosts[0])
    world = len(hosts)
    expected = [hosts[(r // size) * size] for r in range(world)]
    if world % size or hosts != expected or len(set(expected)) != world // size:
        return None
    return size


def spans_equal_hosts(hosts: Sequence[str]) -> bool:
    """Whether the ranks sit on several hosts with the same number (more than one) of ranks each,
    numbered host by host: where ``algorithm="auto"`` all-reduces with ``hierarchical``."""
    if len(set(hosts)) < 2:
        return False
    size = ranks_per_host(hosts)
    return size is not None and size > 1


#: Up to this many ranks every rank records every rank's lateness by default (PYCOLL_SKEW unset): each
#: rank's entry stamp reaches every rank with every collective (in its shared-memory segment, which every
#: rank then maps; over TCP in a frame to every rank, which makes a link to each). Above it that costs every
#: rank O(world) per collective and a link to every peer, where the plans need two (a ring) or a few (a
#: tree), so it is off unless PYCOLL_SKEW=1 asks for it.
SKEW_MAX_RANKS = 16


def skew(setting: bool | None, world: int) -> bool:
    """Whether this rank records who enters collectives late (PYCOLL_SKEW: ``setting``, None when unset)."""
    if setting is not None:
        return setting
    return world <= SKEW_MAX_RANKS


def uses_calibration(transport: str) -> bool:
    """Whether a calibration of this host applies: calibrations are of this host's shared memory."""
    return transport == "shm"


def default_model(transport: str, *, workers: int, segment_bytes: int, fragment_bytes: int) -> Model:
    """The cost model when no calibration applies: the defaults of the link the transport implies.
    Over TCP the link is unknown until calibrated: assume 10 GbE, the common slow case ("mixed": the slow
    links decide)."""
    link = "shm" if transport == "shm" else "eth10"
    model = Model.for_link(link, workers=workers, segment_bytes=segment_bytes)
    return replace(model, fragment_bytes=fragment_bytes)


#: The GPU machine ``compression="auto"`` assumes where PYCOLL_TOPOLOGY does not say: NVLink 4 inside a
#: node and, across nodes, one 400 Gb/s InfiniBand NIC per GPU (a DGX / HGX H100). It is the fastest
#: common machine, where a codec pays least: a slower one described in PYCOLL_TOPOLOGY compresses more.
DEFAULT_GPU_TOPOLOGY = {"intra": "nvlink4", "inter": "ib_ndr"}


def gpu_topology_setting(setting: Mapping[str, str]) -> dict[str, Any]:
    """What rank 0 hands every rank for ``gpu_topology``: PYCOLL_TOPOLOGY (``setting``) with the link
    classes of its ``links=`` file already read, so that no rank reads a file of its own (one that is
    missing or differs on another host), or the error reading it, which every rank then raises alike."""
    spec = dict(setting)
    if "links" not in spec:
        return {"spec": spec}
    try:
        links = load_links(spec.pop("links"))
    except ValueError as exc:
        return {"error": f"PYCOLL_TOPOLOGY: {exc}"}
    return {"spec": spec, "links": {name: link.to_dict() for name, link in links.items()}}


def gpu_topology(setting: Mapping[str, Any], hosts: Sequence[str]) -> TopologyModel | None:
    """The cost model of the GPU machine the ranks run on, for ``compression="auto"`` on GPU memory:
    nodes and GPUs per node from the host list (ranks numbered host by host, one per GPU), the links from
    PYCOLL_TOPOLOGY as rank 0 read it (``setting``: ``gpu_topology_setting``) over DEFAULT_GPU_TOPOLOGY
    (NICs: one per GPU). None where the hosts hold unequal numbers of ranks: no codec is chosen there
    (NCCL's own all-reduce runs)."""
    if "error" in setting:
        raise InvalidUsageError(setting["error"])
    per_host = ranks_per_host(hosts)
    if per_host is None:
        return None
    nodes = len(hosts) // per_host
    spec = {**DEFAULT_GPU_TOPOLOGY, **setting.get("spec", {})}
    links = {name: LinkProfile.from_dict(data) for name, data in setting.get("links", {}).items()}
    try:
        topology = Topology.describe(
            nodes=nodes,
            gpus_per_node=per_host,
            intra=spec["intra"],
            inter=spec["inter"] if nodes > 1 else None,
            nics_per_node=int(spec.get("nics", per_host)),
            p2p=spec.get("p2p", "yes") == "yes",
            gpu=spec.get("gpu"),
            links=links,
        )
    except ValueError as exc:
        raise InvalidUsageError(f"PYCOLL_TOPOLOGY: {exc}") from None
    return TopologyModel(topology)


# ---- each call ------------------------------------------------------------------------------------------
def algorithm(
    comm: Facts, collective: str, algorithm: str, nbytes: int, itemsize: int, gpu: bool = False
) -> str:
    """``algorithm``, validated; ``auto``: the one the communicator's cost model predicts fastest, and on
    GPU memory NCCL's own collective."""
    valid = ALGORITHMS[collective]
    if gpu:
        if algorithm == "auto":
            return "nccl"
        valid = ("nccl", *valid)
    elif algorithm == "nccl":
        raise InvalidUsageError(
            "algorithm='nccl' runs on GPU memory (torch CUDA tensors, CuPy, numba); "
            "these arrays are in host memory"
        )
    if algorithm == "auto":
        if collective in HIERARCHICAL_COLLECTIVES and comm.spans_equal_hosts:
            return "hierarchical"  # the cost model knows shared memory only; see auto_compressed_algorithm
        exclude = ("direct",) if comm.world_size > DIRECT_MAX_RANKS else ()
        world = comm.world_size
        return comm.model.choose_algorithm(collective, world, nbytes, itemsize=itemsize, exclude=exclude)
    if algorithm not in valid:
        raise InvalidUsageError(
            f"algorithm for {collective} must be one of auto, {', '.join(valid)}; got {algorithm!r}"
        )
    return algorithm


def auto_compressed_algorithm(comm: Facts) -> str:
    """The all-reduce plan ``algorithm="auto"`` runs with a fixed codec: ``hierarchical`` on several hosts
    of equal size (more than one rank each: the codec only on the links between hosts, each host's sum
    exact, every rank's link used), else direct (two-shot: each element quantized at most twice)."""
    return "hierarchical" if comm.spans_equal_hosts else DEFAULT_COMPRESSED_ALGORITHM


def all_to_all_algorithm(algorithm: str) -> str:
    """The plan of an all-to-all, compressed or not, on host or GPU memory: its one plan, direct (every
    part one message); ``algorithm`` must be it or auto."""
    if algorithm not in ("auto", *ALGORITHMS["all_to_all"]):
        raise InvalidUsageError(f"algorithm for all_to_all must be auto or direct, got {algorithm!r}")
    return ALGORITHMS["all_to_all"][0]


def compressed_algorithm(collective: str, algorithm: str, comm: Facts | None = None) -> str:
    """The plan of a reduce-scatter or all-gather with a codec: direct, which quantizes each element once
    (a ring would re-encode a reduce-scatter's partial sums at every hop); ``algorithm`` must be it or
    auto. Either may be hierarchical too (each element quantized once, its bytes crossing between hosts
    once), what auto means on several hosts of equal size (``comm``'s; as for the all-reduce)."""
    allowed = (COMPRESSED_DIRECT_ALGORITHM, "hierarchical") if collective in HIERARCHICAL_COLLECTIVES else (
        COMPRESSED_DIRECT_ALGORITHM,
    )
    if algorithm not in ("auto", *allowed):
        raise InvalidUsageError(
            f"a compressed {collective} runs algorithm={' or '.join(map(repr, allowed))} (each element "
            f"quantized once), got {algorithm!r}"
        )
    if algorithm == "auto":
        spans = comm is not None and comm.spans_equal_hosts and collective in HIERARCHICAL_COLLECTIVES
        return "hierarchical" if spans else COMPRESSED_DIRECT_ALGORITHM
    return algorithm


def compression(
    comm: Facts,
    residual: Any,
    buf: Buffer,
    op: str,
    error_budget: float | None,
    gpu: bool = False,
    collective: str = "allreduce",
) -> tuple[Codec | None, str | None]:
    """``compression="auto"``: the codec (or None) and algorithm the cost model predicts fastest within
    the error budget; no codec for data or operators compression does not support. The algorithm is None
    where ``algorithm="auto"`` decides (no codec, on host memory). On GPU memory the model is the GPU
    machine's (``gpu_topology``) and NCCL's own all-reduce ("nccl") a candidate: pycoll's all-reduce,
    compressed or not, runs only where it is predicted faster than NCCL. A reduce-scatter or all-gather
    (``collective``; ``buf`` its largest buffer) compares its uncompressed plans with the direct one of
    each codec; on GPU memory, where the GPU model prices all-reduces only, it is not compressed."""
    budget = DEFAULT_ERROR_BUDGET if error_budget is None else error_budget
    if not budget >= 0:
        raise InvalidUsageError(f"error_budget must be a relative error >= 0, got {error_budget}")
    if residual is not None:
        raise InvalidUsageError(
            'residual= (error feedback) needs a fixed codec; compression="auto" may pick none for some sizes'
        )
    if compression_refusal(collective, buf.dtype, op) is not None:
        return None, None
    f32_bytes = buf.count * 4  # compressed collectives run on float32
    if collective != "allreduce":
        if gpu:
            return None, None
        name, chosen = comm.model.choose_compression(
            comm.world_size, f32_bytes, error_budget=budget, collective=collective
        )
        return (None, None) if name == "none" else (get_codec(name), chosen)
    if gpu:
        machine = comm.gpu_model
        if machine is None:
            return None, None
        name, chosen = machine.choose_compression(f32_bytes, error_budget=budget)
        if name == "none":
            return None, chosen
    else:
        name, chosen = comm.model.choose_compression(comm.world_size, f32_bytes, error_budget=budget)
    if name == "none":
        return None, None
    return get_codec(name), chosen
