"""The parameters of the cost model: link classes and the devices at their ends.

A *link* is what carries a rank's messages: ``alpha_s`` (seconds one plan step costs however little it
moves: hand-over, wake-up, kernel launch, network round trip) and ``beta_Bps`` (bytes per second one
rank sends, and on a full-duplex link receives at the same time). A *device* is what does the work at
a rank: ``copy_Bps`` (bytes per second of memory traffic one rank's copies and reductions achieve in
cache), the codecs' throughput, ``workers`` (CPU cores; more ranks than cores time-share them) and, for
ranks sharing a host, its last-level cache and memory bandwidth (``cache_bytes``, ``memory_Bps``).

Shared memory has no wire: a rank's own core copies each message into its peer's slot and the peer's
core copies or reduces it out, so the whole cost is memory traffic on the devices (``beta_Bps`` is
``None``). Everything else is modelled as a full-duplex wire beside a device whose kernels stream
concurrently with it (the step costs the slower of the two).

Default figures (per direction, per GPU or per port, as a rank sees them):

    link     rate per direction                            alpha     source
    pcie3    x16, 8 GT/s, 128b/130b = 15.75 GB/s raw         3 us    PCI-SIG, PCIe 3.0 base specification
    pcie4    x16, 16 GT/s = 31.5 GB/s raw                    3 us    PCI-SIG, PCIe 4.0
    pcie5    x16, 32 GT/s = 63.0 GB/s raw                    3 us    PCI-SIG, PCIe 5.0
    nvlink3  A100: 12 links x 25 GB/s = 300 GB/s             2 us    NVIDIA A100 datasheet (600 GB/s total)
    nvlink4  H100 SXM: 18 links x 25 GB/s = 450 GB/s         2 us    NVIDIA H100 datasheet (900 GB/s total)
    ib_hdr   200 Gb/s = 25 GB/s                              5 us    InfiniBand HDR (ConnectX-6 product brief)
    ib_ndr   400 Gb/s = 50 GB/s                              5 us    InfiniBand NDR (ConnectX-7 product brief)
    eth10    10 Gb/s = 1.25 GB/s                            25 us    IEEE 802.3 rates; TCP through the kernel
    eth25    25 Gb/s = 3.125 GB/s                           25 us
    eth100   100 Gb/s = 12.5 GB/s                           20 us

``beta_Bps`` is the raw rate times ``efficiency``: 0.8 for PCIe (packet headers and flow control of
256-byte payloads; host-to-device copies typically reach 12-13 GB/s on Gen3 x16 and 24-26 GB/s on Gen4),
0.85 for NVLink (NCCL all-reduce bus bandwidth tops out near 230-240 GB/s on A100 and 360-380 GB/s on
H100 without NVLink SHARP), 0.9 for InfiniBand and 0.94 for TCP over Ethernet with a 1500-byte MTU
(1460 payload bytes per 1538 on the wire). The per-step latencies are of the order NCCL's own tuning
tables use for one hop of its Simple protocol (src/graph/tuning.cc in github.com/NVIDIA/nccl: a few us
over NVLink and PCIe, 10+ us over the network) and of a kernel TCP round trip within a rack.

GPU devices: HBM bandwidth from NVIDIA's datasheets (A100 80GB 2.0 TB/s, H100 SXM 3.35 TB/s), copies
and reductions at 0.8 of it, codecs at 0.7 (the GPU issue's kernel targets; not measured yet). The CPU
device's defaults were measured on the development VM (2 vCPUs, shared memory; see
``pycoll.tuning.calibrate`` and docs/tuning.md): ``pycoll bench --calibrate``
replaces them with this machine's figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["DEVICES", "LINKS", "DeviceProfile", "LinkProfile", "device_for", "link_named"]

GB = 1e9


@dataclass(frozen=True)
class LinkProfile:
    """One link class of the α-β model."""

    name: str
    description: str
    alpha_s: float
    #: Bytes per second one rank sends (and receives) at once; None: no wire (shared memory).
    beta_Bps: float | None
    #: The device at each end ("cpu" or a GPU name in DEVICES).
    device: str
    #: Per-algorithm factor on the bandwidth terms (1.0 when absent): how much of the link and the
    #: device an algorithm's access pattern achieves. Fitted by calibration; published links use 1.
    efficiency: dict[str, float] = field(default_factory=dict)
    source: str = ""
    #: Per-algorithm factor on the host memory bandwidth beyond the cache (ranks sharing a host): how
    #: well an algorithm's access pattern streams from memory. Fitted by calibration.
    memory_efficiency: dict[str, float] = field(default_factory=dict)
    #: Per-algorithm factor dividing the per-hop and per-message costs: how well an algorithm's
    #: hand-overs overlap. Fitted by calibration.
    latency_efficiency: dict[str, float] = field(default_factory=dict)
    #: Calibrated residuals: "allreduce/tree@2/none" -> [(log2 bytes, measured / modelled time), ...] at
    #: the sizes calibration measured. Predictions for that collective, algorithm, world and codec are
    #: multiplied by the factor interpolated in log2(bytes) (the end factors beyond the measured range),
    #: so what the model's structure does not capture on this machine (a size where one algorithm
    #: stalls) is still predicted. Empty for published links.
    corrections: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: All ranks on one host, sharing its cores and memory bandwidth (shared memory). Otherwise each
    #: rank has its own device (a GPU, or a host of its own behind a NIC).
    shared_host: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinkProfile:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["corrections"] = {
            k: [(float(x), float(f)) for x, f in v] for k, v in fields.get("corrections", {}).items()
        }
        return cls(**fields)

    def correction(self, key: str, nbytes: int) -> float:
        """The calibrated factor for ``key`` ("allreduce/tree@2/none") at ``nbytes`` (1 if none)."""
        points = self.corrections.get(key)
        if not points:
            return 1.0
        x = math.log2(max(nbytes, 1))
        xs, fs = zip(*points)
        return math.exp(float(np.interp(x, xs, np.log(fs))))


@dataclass(frozen=True)
class DeviceProfile:
    """What one rank's device does per second."""

    name: str
    #: Bytes of memory traffic per second one rank's copies and reductions achieve (in cache).
    copy_Bps: float
    #: Codec name -> (encode, decode-accumulate) throughput in float32 input bytes per second.
    codec_Bps: dict[str, tuple[float, float]]
    #: Ranks that can run at once (CPU cores); None: one device per rank.
    workers: int | None = None
    source: str = ""
    #: Fixed seconds a step that encodes or decodes costs on top (GPU: launching the codec kernels).
    codec_step_s: float = 0.0
    #: Core time a message taken in costs (the hand-over: polling, waking up), and on top of it, when
    #: ranks outnumber cores, ``switch_s`` scaled by the share of ranks without a core of their own
    #: (1 - cores / ranks): a waiting rank then sleeps and must be switched in again.
    message_s: float = 0.0
    switch_s: float = 0.0
    #: Memory bandwidth (bytes of traffic per second) of the whole host beyond its last-level cache,
    #: which the ranks running at once divide, and that cache's size; None where ranks do not share a
    #: host's memory (GPUs: ``copy_Bps`` is their own memory's).
    memory_Bps: float | None = None
    cache_bytes: int | None = None

    def codec_rates(self, name: str) -> tuple[float, float]:
        """(encode, decode) bytes per second for codec ``name``; a codec not listed (a user codec) is
        taken to cost what int8 costs."""
        rates = self.codec_Bps.get(name) or self.codec_Bps.get("int8")
        if rates is None:
            return (self.copy_Bps, self.copy_Bps)
        return rates

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["codec_Bps"] = {k: list(v) for k, v in self.codec_Bps.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceProfile:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["codec_Bps"] = {k: (float(v[0]), float(v[1])) for k, v in fields.get("codec_Bps", {}).items()}
        return cls(**fields)


def _gpu(name: str, hbm_Bps: float, source: str) -> DeviceProfile:
    codec = (0.7 * hbm_Bps, 0.7 * hbm_Bps)
    return DeviceProfile(
        name=name,
        copy_Bps=0.8 * hbm_Bps,
        codec_Bps={"fp16": codec, "bf16": codec, "int8": codec, "int4": codec},
        workers=None,
        source=source,
        codec_step_s=8e-6,  # an encode and a decode kernel launch, ~4 us each
    )


#: The CPU of the development VM (2 vCPUs), fitted by ``bench/validate_model.py`` on 2026-11-29 (2, 3
#: and 4 ranks, 4 KiB..64 MiB; docs/tuning.md). Codec rates: bench/codec_throughput.py's one-core
#: figures times the fitted 1.48 (data in cache inside a collective). ``pycoll bench --calibrate``
#: replaces all of this with the current machine's figures.
CPU_DEFAULT = DeviceProfile(
    name="cpu",
    copy_Bps=63.4 * GB,
    codec_Bps={
        "fp16": (19.3 * GB, 14.1 * GB),
        "bf16": (18.1 * GB, 15.3 * GB),
        "int8": (12.0 * GB, 11.7 * GB),
        "int4": (10.5 * GB, 10.8 * GB),
    },
    workers=2,
    source="fitted on the 2-vCPU development VM (bench/validate_model.py, pycoll bench --calibrate)",
    switch_s=12.8e-6,
    memory_Bps=51.9 * GB,
    cache_bytes=31_551_852,
)

DEVICES: dict[str, DeviceProfile] = {
    "cpu": CPU_DEFAULT,
    "a100": _gpu("a100", 2.0e12, "NVIDIA A100 80GB datasheet: HBM2e 2.0 TB/s"),
    "h100": _gpu("h100", 3.35e12, "NVIDIA H100 SXM datasheet: HBM3 3.35 TB/s"),
}


def _link(
    name: str,
    description: str,
    alpha_us: float,
    raw_GBps: float | None,
    efficiency: float,
    device: str,
    source: str,
) -> LinkProfile:
    beta = None if raw_GBps is None else raw_GBps * efficiency * GB
    return LinkProfile(name, description, alpha_us * 1e-6, beta, device, {}, source)


LINKS: dict[str, LinkProfile] = {
    "shm": LinkProfile(
        "shm",
        "shared memory between the processes of one host (pycoll's transport)",
        2.71e-6,
        None,
        "cpu",
        # Fitted with CPU_DEFAULT; the ring on 2 ranks is the reference (1), 4 ranks stand for more.
        efficiency={"direct@2": 1.09, "direct@3": 0.63, "direct@4": 1.14, "direct": 1.14, "ring@3": 0.53,
                    "ring@4": 0.92, "ring": 0.92, "tree@2": 0.84, "tree@3": 0.61, "tree@4": 1.15,
                    "tree": 1.15},
        source="fitted on the 2-vCPU development VM (bench/validate_model.py)",
        shared_host=True,
        memory_efficiency={"direct@2": 0.29, "direct@3": 1.54, "direct@4": 1.48, "direct": 1.48,
                           "ring@3": 1.33, "ring@4": 1.22, "ring": 1.22, "tree@2": 0.10, "tree@3": 0.98,
                           "tree@4": 1.78, "tree": 1.78},
        latency_efficiency={"direct@2": 1.05, "direct@3": 1.35, "direct@4": 3.77, "direct": 3.77,
                            "ring@3": 1.22, "ring@4": 3.81, "ring": 3.81, "tree@2": 1.06, "tree@3": 1.68,
                            "tree@4": 4.0, "tree": 4.0},
    ),
    "pcie3": _link("pcie3", "PCIe Gen3 x16, GPUs", 3.0, 15.75, 0.8, "a100", "PCI-SIG PCIe 3.0: 8 GT/s"),
    "pcie4": _link("pcie4", "PCIe Gen4 x16, GPUs", 3.0, 31.5, 0.8, "a100", "PCI-SIG PCIe 4.0: 16 GT/s"),
    "pcie5": _link("pcie5", "PCIe Gen5 x16, GPUs", 3.0, 63.0, 0.8, "h100", "PCI-SIG PCIe 5.0: 32 GT/s"),
    "nvlink3": _link(
        "nvlink3",
        "NVLink 3 (A100, 12 links)",
        2.0,
        300.0,
        0.85,
        "a100",
        "NVIDIA A100 datasheet: 600 GB/s NVLink",
    ),
    "nvlink4": _link(
        "nvlink4",
        "NVLink 4 (H100 SXM, 18 links)",
        2.0,
        450.0,
        0.85,
        "h100",
        "NVIDIA H100 datasheet: 900 GB/s NVLink",
    ),
    "ib_hdr": _link(
        "ib_hdr",
        "InfiniBand HDR, one 200 Gb/s port per rank",
        5.0,
        25.0,
        0.9,
        "a100",
        "InfiniBand HDR 200 Gb/s",
    ),
    "ib_ndr": _link(
        "ib_ndr",
        "InfiniBand NDR, one 400 Gb/s port per rank",
        5.0,
        50.0,
        0.9,
        "h100",
        "InfiniBand NDR 400 Gb/s",
    ),
    "eth10": _link("eth10", "10 GbE, TCP, a port per rank", 25.0, 1.25, 0.94, "cpu", "IEEE 802.3: 10 Gb/s"),
    "eth25": _link("eth25", "25 GbE, TCP, a port per rank", 25.0, 3.125, 0.94, "cpu", "IEEE 802.3: 25 Gb/s"),
    "eth100": _link(
        "eth100", "100 GbE, TCP, a port per rank", 20.0, 12.5, 0.94, "cpu", "IEEE 802.3: 100 Gb/s"
    ),
}


def link_named(name: str) -> LinkProfile:
    """The default profile of link class ``name`` (one of LINKS)."""
    try:
        return LINKS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; choose one of {', '.join(LINKS)}") from None


def device_for(link: LinkProfile, workers: int | None = None) -> DeviceProfile:
    """The default device at the ends of ``link``; for the CPU, ``workers`` overrides the core count."""
    device = DEVICES[link.device]
    if workers is not None and device.workers is not None:
        device = replace(device, workers=workers)
    return device
