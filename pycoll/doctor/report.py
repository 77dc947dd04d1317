"""The typed result of ``pycoll doctor``: what each probe saw, and the findings drawn from it.

Every probe fills its own part; a probe that could not look records why in that part's ``error`` (or
``reason``) field instead of raising. ``Report.to_dict()`` is plain JSON (str keys, lists, numbers,
strings, booleans, None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pycoll.libraries import LibraryInfo

__all__ = [
    "LEVELS",
    "AcsBridge",
    "CpuInfo",
    "Finding",
    "Gpu",
    "GpuPair",
    "GpuReport",
    "IbDevice",
    "IbPort",
    "IommuInfo",
    "Nic",
    "NumaNode",
    "Report",
    "RuntimeInfo",
    "ShmInfo",
    "ShmSegment",
    "NvLink",
]

#: Finding levels, mildest first.
LEVELS = ("ok", "warn", "error")


@dataclass
class Finding:
    """One checked hazard: ``level`` is "ok", "warn" or "error"; ``check`` a short name of the check;
    ``device`` what it is about (a PCI address, "mlx5_0 port 2", "GPU1-GPU2") when it is about one."""

    level: str
    check: str
    message: str
    fix: str = ""
    device: str | None = None


@dataclass
class CpuInfo:
    model: str | None = None
    #: Logical CPUs the kernel has online (/sys/devices/system/cpu/online).
    online: list[int] = field(default_factory=list)
    #: Logical CPUs this process may run on (os.sched_getaffinity).
    affinity: list[int] = field(default_factory=list)
    sockets: int | None = None
    cores: int | None = None
    threads_per_core: int | None = None
    #: /sys/devices/system/cpu/smt/control ("on", "off", "notsupported"...), else derived from siblings.
    smt: str | None = None
    #: The CPU flags pycoll's native loops depend on: {"avx2": True, "f16c": True}.
    flags: dict[str, bool] = field(default_factory=dict)
    #: Instruction sets pycoll's native module picked at run time (None: module not loaded).
    reduce_isa: str | None = None
    codec_isa: str | None = None
    native_error: str | None = None
    error: str | None = None


@dataclass
class NumaNode:
    node: int
    cpus: list[int] = field(default_factory=list)
    mem_total_bytes: int | None = None
    mem_free_bytes: int | None = None


@dataclass
class ShmSegment:
    name: str
    size_bytes: int | None = None


@dataclass
class ShmInfo:
    path: str = "/dev/shm"
    total_bytes: int | None = None
    free_bytes: int | None = None
    #: Files in the directory whose names contain "pycoll" (left over by a crashed job).
    pycoll_segments: list[ShmSegment] = field(default_factory=list)
    error: str | None = None


@dataclass
class NvLink:
    link: int
    active: bool
    #: NVML's NVLink version number of the link (its generation), when reported.
    version: int | None = None
    #: PCI address at the other end (a GPU or an NVSwitch), normalised as in /sys ("0000:3b:00.0").
    remote_bus_id: str | None = None


@dataclass
class Gpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    #: PCI address, normalised as in /sys: "0000:3b:00.0".
    bus_id: str | None = None
    #: NUMA node of the device (/sys/bus/pci/devices/<bus_id>/numa_node; -1: none reported).
    numa_node: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    nvlinks: list[NvLink] = field(default_factory=list)
    #: Queries that failed for this GPU: "name: Not Supported".
    errors: list[str] = field(default_factory=list)


@dataclass
class GpuPair:
    a: int
    b: int
    #: Common PCI ancestor as nvidia-smi names it: PIX, PXB, PHB, NODE, SYS (INT: same board); None: unknown.
    topology: str | None = None
    #: Active NVLinks joining a and b (directly, or through the same NVSwitch).
    nvlinks: int = 0
    #: nvmlDeviceGetP2PStatus for reads and over NVLink: "OK" or why not.
    p2p_read: str | None = None
    p2p_nvlink: str | None = None


@dataclass
class GpuReport:
    available: bool = False
    #: Why no GPU is reported ("pynvml not installed", "NVML could not initialise: ...", "0 devices").
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    pairs: list[GpuPair] = field(default_factory=list)

    def pair(self, a: int, b: int) -> GpuPair | None:
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if (p.a, p.b) == (lo, hi)), None)


@dataclass
class RuntimeInfo:
    #: CUDA runtime version ("12.4") and where it was read (the libcudart found, or torch.version.cuda).
    cuda_runtime: str | None = None
    cuda_runtime_source: str | None = None
    cudart: LibraryInfo | None = None
    nccl: LibraryInfo | None = None


@dataclass
class IbPort:
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate: str | None = None
    link_layer: str | None = None


@dataclass
class IbDevice:
    name: str
    node_type: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    ports: list[IbPort] = field(default_factory=list)


@dataclass
class Nic:
    name: str
    operstate: str | None = None
    #: Mb/s; None when the kernel does not report it (virtual NICs report -1 or fail the read).
    speed_mbps: int | None = None
    speed_note: str | None = None
    mtu: int | None = None
    #: ARPHRD type number (1 Ethernet, 32 InfiniBand).
    type: int | None = None
    address: str | None = None


@dataclass
class AcsBridge:
    """The ACS state of one PCI bridge: ``status`` is "redirect" (P2P Request or Completion Redirect
    set), "clear" (ACS present, no redirect), "no-acs", "not-root" (config space beyond 64 bytes is not
    readable), "no-extended-config" or "error"."""

    bus_id: str
    status: str
    acs_control: int | None = None
    error: str | None = None


@dataclass
class IommuInfo:
    #: Entries of /sys/class/iommu (one per IOMMU unit); empty: no IOMMU in use.
    units: list[str] = field(default_factory=list)
    passthrough: bool = False
    cmdline: str | None = None
    error: str | None = None


@dataclass
class Report:
    cpu: CpuInfo = field(default_factory=CpuInfo)
    numa: list[NumaNode] = field(default_factory=list)
    shm: ShmInfo = field(default_factory=ShmInfo)
    gpu: GpuReport = field(default_factory=GpuReport)
    runtime: RuntimeInfo = field(default_factory=RuntimeInfo)
    infiniband: list[IbDevice] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    acs: list[AcsBridge] = field(default_factory=list)
    iommu: IommuInfo = field(default_factory=IommuInfo)
    #: RLIMIT_MEMLOCK (soft, hard); -1 means unlimited.
    memlock: list[int] = field(default_factory=list)
    #: NCCL_* and PYCOLL_* variables set in the environment, with their values.
    environment: dict[str, str] = field(default_factory=dict)
    #: Probes that could not look at all, by section ("numa", "infiniband", "network", "acs"...): why.
    probe_errors: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warn"]

    def exit_code(self) -> int:
        """``pycoll doctor``'s exit status: 1 when any finding is an error, else 0."""
        return 1 if self.errors else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
