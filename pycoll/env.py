"""The one place that reads pycoll's ``PYCOLL_*`` environment variables.

| variable               | meaning                                                        | default |
|------------------------|----------------------------------------------------------------|---------|
| PYCOLL_TIMEOUT         | deadline of every collective and of set-up, in seconds         | 300     |
| PYCOLL_DEBUG           | WARN, INFO or TRACE: log through the ``pycoll`` logger          | silent  |
| PYCOLL_SHM_SLOT_BYTES  | payload bytes of one shared-memory ring slot (multiple of 64); | auto    |
|                        | ``auto``: 128 KiB, less above 8 local ranks (8 MiB of rings    |         |
|                        | per rank at most)                                              |         |
| PYCOLL_SHM_SLOTS       | slots per shared-memory ring (per ordered pair of ranks)       | 8       |
| PYCOLL_TCP_FRAGMENT_BYTES | payload bytes of one TCP ring slot (a fragment on the wire; | auto    |
|                        | multiple of 64) of a communicator whose peers are all on other |         |
|                        | hosts; ``auto``: 512 KiB, less above 16 ranks (64 MiB of rings |         |
|                        | per rank at most). With peers on this host too, TCP takes the  |         |
|                        | shared-memory ring's shape                                     |         |
| PYCOLL_TCP_SLOTS       | slots per TCP ring (each way, per peer), the same way          | 4       |
| PYCOLL_SPIN_US         | microseconds a waiting rank polls before it sleeps; ``auto``:  | auto    |
|                        | 5000 when every local rank has a CPU of its own, else 0        |         |
| PYCOLL_YIELD_US        | microseconds a waiting rank yields its core before sleeping;   | auto    |
|                        | ``auto``: 0 over TCP only, 200 when ranks outnumber CPUs,      |         |
|                        | else 50                                                        |         |
| PYCOLL_STREAM_BYTES    | collectives with outputs at least this large write results     | off     |
|                        | with non-temporal stores; off by default, as they measured      |         |
|                        | slower than plain stores on the VMs pycoll was tuned on        |         |
| PYCOLL_TRANSPORT       | how ranks reach each other: ``auto`` (shared memory when every | auto    |
|                        | rank is on one host, else TCP), ``shm`` or ``tcp`` (TCP even on |         |
|                        | one host: to test or measure it)                               |         |
| PYCOLL_GPU_TRANSPORT   | how GPU collectives of ring/tree/direct move messages: ``nccl``| nccl    |
|                        | (send/recv), or ``shm`` (through host shared memory: ranks     |         |
|                        | that share one GPU, which NCCL refuses, or have no NCCL)       |         |
| PYCOLL_TOPOLOGY        | the GPU machine ``compression="auto"`` chooses for on GPU      | nvlink4,|
|                        | memory: ``intra=LINK,inter=LINK,nics=K,p2p=yes|no,gpu=NAME,`` | ib_ndr x|
|                        | ``links=FILE`` (any of them; link classes as ``pycoll model   | GPUs    |
|                        | --list`` shows them); nodes and GPUs per node come from the   |         |
|                        | hosts. Rank 0's is used by every rank                         |         |
| PYCOLL_HOST_ID         | names this rank's host; ranks with the same id are on one host | hostname|
|                        | (shared memory between them). Unset: hostname + kernel boot id | + boot  |
|                        | (containers on one machine share it). Set it per rank to tell  | id      |
|                        | apart hosts that look alike, or to test multi-host set-ups     |         |
| PYCOLL_SOCKET_IFNAME   | network interface (one name, e.g. ``eth0``) whose address      | unset   |
|                        | sockets that other hosts reach are bound to: ``pycoll run      |         |
|                        | --nnodes M`` binds node 0's rendezvous store there; unset:     |         |
|                        | every interface (0.0.0.0)                                      |         |
| PYCOLL_LAUNCHER_STORE  | set by ``pycoll run``: the launcher hosts the rendezvous store | unset   |
| PYCOLL_SECRET          | rendezvous secret: every connection to the rendezvous store    | unset   |
|                        | must prove it holds it (HMAC challenge, never sent itself);    |         |
|                        | set the same value on every rank and on the launcher           |         |
| PYCOLL_SKEW            | record who enters collectives late (``comm.skew()``); ``0``:   | auto    |
|                        | off on this rank (then no rank's report has its collectives);  |         |
|                        | auto: on up to 16 ranks (pycoll.auto.skew)                     |         |
| PYCOLL_SKEW_WINDOW     | collectives in the skew report's recent window                 | 1000    |
| PYCOLL_SKEW_REPORT     | file the skew report is written to (JSON) at finalize, by rank | unset   |
|                        | 0; ``{rank}`` in it: by every rank, each its own view          |         |
| PYCOLL_STRAGGLER_MS    | log a WARNING when one rank's mean lateness over the last 100  | unset   |
|                        | collectives passes this many milliseconds (on_straggler)       |         |
| PYCOLL_FAKE_CLOCK_OFFSET_S | for tests: shift this rank's clock by this many seconds    | 0       |
|                        | (the skew report must still find the right lateness)           |         |
| PYCOLL_TRACE           | the flight recorder (pycoll/flight/): every rank keeps its last| on      |
|                        | collectives with their call sites, and a timeout, lost peer or |         |
|                        | mismatch says where every rank is; ``0``: off                  |         |
| PYCOLL_TRACE_ENTRIES   | collectives the flight recorder keeps per process              | 2048    |
| PYCOLL_TRACE_DIR       | where errors and ``pycoll trace dump`` write the ranks' records| tmp dir |
|                        | (one JSON file per rank); default ``<tmp>/pycoll-trace``       |         |

Launch variables that are not pycoll's own (RANK, OMPI_COMM_WORLD_*, SLURM_*...) are parsed in
``pycoll.bootstrap.env``. The other variables pycoll reads are NVIDIA's and the system's, for finding
libraries (:func:`library_settings`: NCCL_LIBRARY, CUDA_HOME, CUDA_PATH) and for the doctor
(:func:`nccl_p2p_disable`; :func:`process_environ`: the whole environment, whose NCCL_* and PYCOLL_*
entries ``pycoll doctor`` lists).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from pycoll.errors import InvalidUsageError

DEFAULT_TIMEOUT_S = 300.0
# Silence after which the fault plane takes a rank for dead (it evicts it). A killed rank is found at
# once (its sockets close); this bounds a stopped or hung one. torchft's heartbeat timeout is 5 s too.
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0
MAX_SLOT_BYTES = 128 * 1024
MIN_SLOT_BYTES = 16 * 1024
RING_BYTES_PER_RANK = 8 << 20
DEFAULT_SLOTS = 8
# TCP's rings (pycoll.auto.ring_shape): larger fragments than shared memory's, fewer of them in flight.
TCP_FRAGMENT_BYTES = 512 * 1024
TCP_RING_BYTES_PER_RANK = 64 << 20
DEFAULT_TCP_SLOTS = 4
DEFAULT_SKEW_WINDOW = 1000
# The flight recorder keeps this many collectives per process (torch's NCCL flight recorder keeps 2,000 by
# default: TORCH_NCCL_TRACE_BUFFER_SIZE); about 100 bytes each.
DEFAULT_TRACE_ENTRIES = 2048
# PYCOLL_STRAGGLER_MS judges a rank's mean lateness over this many collectives.
STRAGGLER_WINDOW = 100
# A rank with a CPU of its own polls for up to 5 ms before it sleeps. On virtual machines a sleeping
# rank's vCPU halts, and the host can take a millisecond or more to run it again: on the development VM
# a 2-rank 4 MiB all-reduce took 3.4 ms in such periods with 50 or 500 us of polling, 0.2 ms with
# 5000 us (0.2 ms in quiet periods either way). MPI libraries poll without limit.
DEFAULT_SPIN_US = 5000
STREAM_OFF = 1 << 62
DEFAULT_YIELD_US = 200
DEBUG_LEVELS = ("WARN", "INFO", "TRACE")
GPU_TRANSPORTS = ("nccl", "shm")
TRANSPORTS = ("auto", "shm", "tcp")


def fitted_slot_bytes(largest: int, ring_bytes: int, slots_per_peer: int, world: int) -> int:
    """The slot size of a rank's rings: ``largest``, halved while ``slots_per_peer`` slots for each of its
    ``world - 1`` peers would take more than ``ring_bytes``, but never below MIN_SLOT_BYTES."""
    fit = ring_bytes // (slots_per_peer * max(1, world - 1))
    size = largest
    while size > fit and size > MIN_SLOT_BYTES:
        size //= 2
    return size


@dataclass(frozen=True)
class Settings:
    timeout_s: float = DEFAULT_TIMEOUT_S
    debug: str | None = None
    shm_slot_bytes: int | None = None  # None: slot_bytes_for(world size)
    shm_slots: int = DEFAULT_SLOTS
    tcp_fragment_bytes: int | None = None  # None: pycoll.auto.ring_shape decides
    tcp_slots: int = DEFAULT_TCP_SLOTS
    spin_us: int | None = None  # None: decide from the number of CPUs and local ranks
    stream_bytes: int = STREAM_OFF
    yield_us: int | None = None  # None: decide from the number of CPUs and local ranks
    gpu_transport: str = "nccl"
    #: PYCOLL_TOPOLOGY as key -> value (``TOPOLOGY_KEYS``); empty: pycoll.auto's default machine.
    gpu_topology: Mapping[str, str] = field(default_factory=dict)
    transport: str = "auto"
    host_id: str | None = None  # None: hostname + boot id (pycoll.comm.host_id)
    socket_ifname: str | None = None  # None: listen on every interface
    #: PYCOLL_FAULT_TOLERANCE: give communicators a fault plane (revoke / agree / shrink / grow, and a
    #: heartbeat that finds a stopped or hung rank); "0" leaves it out.
    fault_tolerance: bool = True
    #: PYCOLL_HEARTBEAT_TIMEOUT: seconds of silence after which a rank is taken for dead and evicted.
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    #: PYCOLL_SKEW, PYCOLL_SKEW_WINDOW, PYCOLL_SKEW_REPORT, PYCOLL_STRAGGLER_MS, PYCOLL_FAKE_CLOCK_OFFSET_S:
    #: skew recording (pycoll/skew/), its recent window, the JSON written at finalize, the logging notice,
    #: and a test shift of this rank's clock.
    skew: bool | None = None  # None: pycoll.auto.skew decides from the world size
    skew_window: int = DEFAULT_SKEW_WINDOW
    skew_report: str | None = None
    straggler_ms: float | None = None
    fake_clock_offset_s: float = 0.0
    #: PYCOLL_TRACE, PYCOLL_TRACE_ENTRIES, PYCOLL_TRACE_DIR: the flight recorder (pycoll/flight/), the
    #: collectives it keeps, and where the ranks' records are written (None: <tmp>/pycoll-trace).
    trace: bool = True
    trace_entries: int = DEFAULT_TRACE_ENTRIES
    trace_dir: str | None = None
    #: PYCOLL_SECRET as bytes (None: unset); kept out of repr so it is never printed or logged.
    secret: bytes | None = field(default=None, repr=False)

    def slot_bytes_for(self, world: int) -> int:
        """Ring slot size. Larger slots mean fewer hand-overs per byte, smaller ones shorter pipeline
        segments (half a ring): 128 KiB measured best with 2 and 4 ranks (4 ranks on 2 vCPUs, 64 MiB:
        6.2 GB/s busbw against 5.4 with 256 KiB and 3.5 with 64 KiB). Rings cost slots x slot bytes per
        peer, so above 8 local ranks slots shrink to keep each rank's rings near 8 MiB."""
        if self.shm_slot_bytes is not None:
            return self.shm_slot_bytes
        return fitted_slot_bytes(MAX_SLOT_BYTES, RING_BYTES_PER_RANK, self.shm_slots, world)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def number(name: str, default: float, kind: type, minimum: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise InvalidUsageError(f"{name} must be a {kind.__name__}, got {raw!r}") from None
            if value < minimum:
                raise InvalidUsageError(f"{name} must be >= {minimum}, got {raw!r}")
            return value

        debug = env.get("PYCOLL_DEBUG", "").strip().upper() or None
        if debug == "WARNING":
            debug = "WARN"
        if debug is not None and debug not in DEBUG_LEVELS:
            raise InvalidUsageError(f"PYCOLL_DEBUG must be one of {', '.join(DEBUG_LEVELS)}, got {debug!r}")

        def slot_size(name: str) -> int | None:
            raw = env.get(name, "auto").strip().lower()
            size = None if raw in ("", "auto") else int(number(name, 0, int, 4096))
            if size is not None and size % 64:
                raise InvalidUsageError(f"{name} must be a multiple of 64, got {size}")
            return size

        spin_raw = env.get("PYCOLL_SPIN_US", "auto").strip().lower()
        spin = None if spin_raw in ("", "auto") else int(number("PYCOLL_SPIN_US", 0, int, 0))
        yield_raw = env.get("PYCOLL_YIELD_US", "auto").strip().lower()
        yield_us = None if yield_raw in ("", "auto") else int(number("PYCOLL_YIELD_US", 0, int, 0))
        gpu_transport = env.get("PYCOLL_GPU_TRANSPORT", "nccl").strip().lower() or "nccl"
        if gpu_transport not in GPU_TRANSPORTS:
            raise InvalidUsageError(
                f"PYCOLL_GPU_TRANSPORT must be one of {', '.join(GPU_TRANSPORTS)}, got {gpu_transport!r}"
            )
        transport = env.get("PYCOLL_TRANSPORT", "auto").strip().lower() or "auto"
        if transport not in TRANSPORTS:
            raise InvalidUsageError(
                f"PYCOLL_TRANSPORT must be one of {', '.join(TRANSPORTS)}, got {transport!r}"
            )
        return cls(
            transport=transport,
            host_id=_host_id(env.get("PYCOLL_HOST_ID", "")),
            socket_ifname=_socket_ifname(env.get("PYCOLL_SOCKET_IFNAME", "")),
            gpu_transport=gpu_transport,
            gpu_topology=topology_setting(env.get("PYCOLL_TOPOLOGY", "")),
            timeout_s=float(number("PYCOLL_TIMEOUT", DEFAULT_TIMEOUT_S, float, 0.001)),
            debug=debug,
            shm_slot_bytes=slot_size("PYCOLL_SHM_SLOT_BYTES"),
            shm_slots=int(number("PYCOLL_SHM_SLOTS", DEFAULT_SLOTS, int, 2)),
            tcp_fragment_bytes=slot_size("PYCOLL_TCP_FRAGMENT_BYTES"),
            tcp_slots=int(number("PYCOLL_TCP_SLOTS", DEFAULT_TCP_SLOTS, int, 2)),
            spin_us=spin,
            yield_us=yield_us,
            stream_bytes=int(number("PYCOLL_STREAM_BYTES", STREAM_OFF, int, 0)),
            secret=rendezvous_secret(env),
            fault_tolerance=_flag(env, "PYCOLL_FAULT_TOLERANCE", True),
            heartbeat_timeout_s=float(
                number("PYCOLL_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S, float, 0.05)
            ),
            skew=_flag(env, "PYCOLL_SKEW", None),
            skew_window=int(number("PYCOLL_SKEW_WINDOW", DEFAULT_SKEW_WINDOW, int, 1)),
            skew_report=env.get("PYCOLL_SKEW_REPORT", "").strip() or None,
            straggler_ms=(
                float(number("PYCOLL_STRAGGLER_MS", 0, float, 1e-6))
                if env.get("PYCOLL_STRAGGLER_MS", "").strip()
                else None
            ),
            fake_clock_offset_s=float(number("PYCOLL_FAKE_CLOCK_OFFSET_S", 0.0, float, -1e9)),
            trace=_flag(env, "PYCOLL_TRACE", True),
            trace_entries=int(number("PYCOLL_TRACE_ENTRIES", DEFAULT_TRACE_ENTRIES, int, 1)),
            trace_dir=env.get("PYCOLL_TRACE_DIR", "").strip() or None,
        )


#: The keys of PYCOLL_TOPOLOGY (the Settings table); link and GPU names are checked where they are used.
TOPOLOGY_KEYS = ("intra", "inter", "nics", "p2p", "gpu", "links")


def topology_setting(raw: str) -> dict[str, str]:
    """PYCOLL_TOPOLOGY (``intra=nvlink3,inter=ib_hdr,nics=4``) as a dict; InvalidUsageError naming the
    part that is not ``key=value`` with a known key (once), a count of NICs or a yes / no. A ``links``
    file's path cannot hold a comma."""
    spec: dict[str, str] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        key, sep, value = (x.strip() for x in part.partition("="))
        key = key.lower()
        if key in spec:
            raise InvalidUsageError(f"PYCOLL_TOPOLOGY sets {key} twice ({raw!r})")
        if not sep or key not in TOPOLOGY_KEYS or not value:
            raise InvalidUsageError(
                f"PYCOLL_TOPOLOGY takes key=value pairs separated by commas, keys {', '.join(TOPOLOGY_KEYS)} "
                f"(e.g. intra=nvlink3,inter=ib_hdr,nics=4); got {part!r}"
            )
        if key == "nics" and not (value.isascii() and value.isdigit() and int(value) >= 1):
            raise InvalidUsageError(f"PYCOLL_TOPOLOGY: nics must be a count >= 1, got {value!r}")
        if key == "p2p" and value.lower() not in ("yes", "no"):
            raise InvalidUsageError(f"PYCOLL_TOPOLOGY: p2p must be yes or no, got {value!r}")
        spec[key] = value if key == "links" else value.lower()
    return spec


def _flag(env: Mapping[str, str], name: str, default: Any) -> Any:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise InvalidUsageError(f"{name} must be 0 or 1, got {raw!r}")


MAX_HOST_ID_CHARS = 255
_IFNAME_MAX = 15  # Linux IFNAMSIZ - 1


def _host_id(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if len(value) > MAX_HOST_ID_CHARS or not value.isprintable():
        raise InvalidUsageError(
            f"PYCOLL_HOST_ID must be at most {MAX_HOST_ID_CHARS} printable characters, got {raw!r}"
        )
    return value


def _socket_ifname(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if len(value) > _IFNAME_MAX or any(c in value for c in " \t/,^=") or not value.isprintable():
        raise InvalidUsageError(
            f"PYCOLL_SOCKET_IFNAME takes one network interface name (e.g. eth0; no NCCL-style lists, "
            f"prefixes or '^' exclusions), got {raw!r}"
        )
    return value


#: The rendezvous secret's variable (see the table above).
SECRET_VAR = "PYCOLL_SECRET"


def rendezvous_secret(environ: Mapping[str, str] | None = None) -> bytes | None:
    """PYCOLL_SECRET as UTF-8 bytes, or None when it is unset or empty.

    Read on its own (not only through ``Settings``) so that ``pycoll run`` can host its store with the
    secret without validating the ranks' other settings.
    """
    env = os.environ if environ is None else environ
    value = env.get(SECRET_VAR, "")
    return value.encode("utf-8") if value else None


#: Set to "1" by ``pycoll run``: the store at MASTER_ADDR:MASTER_PORT already exists (the launcher hosts
#: it), so rank 0 connects to it instead of hosting one.
LAUNCHER_STORE_VAR = "PYCOLL_LAUNCHER_STORE"


def launcher_hosts_store(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``pycoll run`` hosts the rendezvous store (rank 0 connects to it instead of hosting)."""
    env = os.environ if environ is None else environ
    return env.get(LAUNCHER_STORE_VAR, "0").strip() == "1"


def process_environ(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The process environment (or ``environ``, a stand-in for it: tests, the doctor's fixtures), for
    code that reports on it or hands it on whole. Settings are read through the functions of this module,
    not from this mapping."""
    return os.environ if environ is None else environ


#: The variable that chooses the NCCL library (pycoll.libraries.find_nccl).
NCCL_LIBRARY_VAR = "NCCL_LIBRARY"
#: The variables that name a CUDA toolkit, in the order pycoll.libraries.find_cudart consults them.
CUDA_HOME_VARS = ("CUDA_HOME", "CUDA_PATH")


@dataclass(frozen=True)
class LibrarySettings:
    """Where the environment says NVIDIA's libraries are (pycoll.libraries reads them from here)."""

    #: NCCL_LIBRARY, stripped ("" when unset): a file or a name for the dynamic loader.
    nccl_library: str = ""
    #: (variable, directory) of CUDA_HOME then CUDA_PATH, stripped, the unset and empty ones left out.
    cuda_homes: tuple[tuple[str, str], ...] = ()


def library_settings(environ: Mapping[str, str] | None = None) -> LibrarySettings:
    """NCCL_LIBRARY, CUDA_HOME and CUDA_PATH from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    homes = tuple((var, env.get(var, "").strip()) for var in CUDA_HOME_VARS)
    return LibrarySettings(
        nccl_library=env.get(NCCL_LIBRARY_VAR, "").strip(),
        cuda_homes=tuple((var, home) for var, home in homes if home),
    )


def nccl_p2p_disable(environ: Mapping[str, str] | None = None) -> str | None:
    """NCCL_P2P_DISABLE's value when it turns GPU peer-to-peer transfers off (set, and not 0), else None
    (``pycoll doctor`` warns about it)."""
    env = os.environ if environ is None else environ
    value = env.get("NCCL_P2P_DISABLE", "")
    return None if value.strip() in ("", "0") else value


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), the count ranks compare themselves with."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------------
# Read by the tools (the cost model's tuning file, the benchmark baselines): one block, kept here so
# that no other module reads the environment.

#: Where a calibration is saved and read ("none": ignore any calibration).
TUNING_FILE_VAR = "PYCOLL_TUNING_FILE"


def tuning_file_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """``PYCOLL_TUNING_FILE`` as set, or None when it is unset or empty."""
    env = os.environ if environ is None else environ
    return env.get(TUNING_FILE_VAR) or None


def cache_home(environ: Mapping[str, str] | None = None) -> str:
    """The user's cache directory: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    env = os.environ if environ is None else environ
    return env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def started_by_mpirun(environ: Mapping[str, str] | None = None) -> bool:
    """True in a rank that mpirun (Open MPI / PMIx) started: ``OMPI_COMM_WORLD_RANK`` or ``PMIX_RANK``."""
    env = os.environ if environ is None else environ
    return bool(env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK"))


def master_address(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(MASTER_ADDR, MASTER_PORT)`` as set by a launcher, each None when unset or empty."""
    env = os.environ if environ is None else environ
    return env.get("MASTER_ADDR") or None, env.get("MASTER_PORT") or None


def environ_with(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``extra`` added (the environment of ranks a tool starts)."""
    return {**os.environ, **extra}
