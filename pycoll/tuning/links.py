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

Default figures (per direction, per GPU or per port, as a rank sees them). ``kind`` says what a link is
(``KINDS``); a topology (pycoll.tuning.topology) joins the GPUs of a node by an ``nvlink`` or ``pcie``
class and the nodes by an ``ib``, ``roce`` or ``tcp`` class:

    link     kind    rate per direction (raw)                  alpha  source
    pcie3    pcie    x16, 8 GT/s, 128b/130b = 15.75 GB/s         3 us  PCI-SIG, PCIe 3.0 base specification
    pcie4    pcie    x16, 16 GT/s = 31.5 GB/s                    3 us  PCI-SIG, PCIe 4.0
    pcie5    pcie    x16, 32 GT/s = 63.0 GB/s                    3 us  PCI-SIG, PCIe 5.0
    nvlink3  nvlink  A100: 12 links x 25 GB/s = 300 GB/s         2 us  NVIDIA A100 datasheet (600 GB/s total)
    nvlink4  nvlink  H100 SXM: 18 links x 25 GB/s = 450 GB/s     2 us  NVIDIA H100 datasheet (900 GB/s total)
    nvlink5  nvlink  B200: 18 links x 50 GB/s = 900 GB/s         2 us  NVIDIA DGX B200 datasheet (1.8 TB/s)
    ib_hdr   ib      200 Gb/s = 25 GB/s                          5 us  InfiniBand HDR (ConnectX-6 brief)
    ib_ndr   ib      400 Gb/s = 50 GB/s                          5 us  InfiniBand NDR (ConnectX-7 brief)
    ib_xdr   ib      800 Gb/s = 100 GB/s                         5 us  InfiniBand XDR (ConnectX-8 brief)
    roceN    roce    N = 25, 100, 200, 400 Gb/s, RDMA            6 us  IEEE 802.3 rates; RoCE v2 (IBTA A17)
    ethN     tcp     N = 10, 25, 100, 200, 400 Gb/s, kernel   20-25 us  IEEE 802.3 rates

``beta_Bps`` is the raw rate times ``efficiency`` (``EFFICIENCY``), the share a bulk transfer attains:
0.8 for PCIe (packet headers and flow control of 256-byte payloads; host-to-device copies typically
reach 12-13 GB/s on Gen3 x16 and 24-26 GB/s on Gen4); 0.8 for NVLink (NCCL's maintainers: a 25 GB/s
link carries ~20 GB/s of 128-byte payloads from the SMs, github.com/NVIDIA/nccl-tests/issues/149); 0.96
for InfiniBand and RoCE (the same: ~24 GB/s per 200 Gb/s NIC, 12 per 100 Gb/s, 48 per 400 Gb/s; nccl-tests
issues 119, 29, 267); 0.94 for TCP over Ethernet with a 1500-byte MTU (1460 payload bytes per 1538 on
the wire). docs/tuning.md, "Validation against published NCCL figures", checks them against measured
all-reduces. The per-step latencies are of the order NCCL's own tuning tables use for one hop of its
Simple protocol (src/graph/tuning.cc in github.com/NVIDIA/nccl: a few us over NVLink and PCIe, 10+ us
over the network) and of a kernel TCP round trip within a rack.

GPU devices: HBM bandwidth from NVIDIA's datasheets (A100 80GB 2.0 TB/s, H100 SXM 3.35 TB/s, H200 4.8
TB/s, B200 8 TB/s); copies and reductions at 0.8 of it; codecs at 0.7 of it, counting the bytes they
touch (an encode reads 4 bytes and writes the encoded ones per element, a decode-accumulate reads both
and writes 4): an assumption until the GPU kernels' throughput is measured. Every message a GPU takes
in costs ``message_s`` = 5 us (an NCCL send/receive group and a reduction kernel launched from the
host). The CPU device's defaults were measured on the development VM (2 vCPUs, shared memory; see
``pycoll.tuning.calibrate`` and docs/tuning.md): ``pycoll bench --calibrate`` replaces them with this
machine's figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

__all__ = [
    "DEVICES",
    "KINDS",
    "LINKS",
    "DeviceProfile",
    "LinkProfile",
    "device_for",
    "gpu_named",
    "link_named",
]

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
    #: The family (``KINDS``): what a topology may use it for (inside a node or between nodes) and which
    #: of NCCL's per-hop latencies applies (pycoll.tuning.nccl).
    kind: str = ""

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


#: Largest message of a plan on GPUs (pycoll/gpu.py cuts plans so; the model prices them so, whole: a
#: step of the GPU path is an NCCL group and a kernel, which do not overlap within a message). NCCL moves
#: messages of any size; smaller ones only help where a fused op can forward a piece while the next
#: arrives (tree), at the cost of a kernel launch each.
GPU_SEGMENT_BYTES = 16 << 20
#: Bytes of an encoded element per float32 element, for the codecs' memory traffic on GPUs.
_WIRE_BYTES = {"fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
#: Share of HBM bandwidth the GPU's copies / codec kernels attain (stated assumptions, not measured).
GPU_COPY_EFFICIENCY = 0.8
GPU_CODEC_EFFICIENCY = 0.7


def _gpu(name: str, hbm_Bps: float, source: str) -> DeviceProfile:
    codec_Bps = {}
    for codec, wire in _WIRE_BYTES.items():
        r = wire / 4.0  # encoded bytes per float32 byte
        rate = GPU_CODEC_EFFICIENCY * hbm_Bps
        # encode: read 4 B, write the encoded ones; decode-accumulate: read both and the sum, write 4 B
        codec_Bps[codec] = (rate / (1.0 + r), rate / (2.0 + r))
    return DeviceProfile(
        name=name,
        copy_Bps=GPU_COPY_EFFICIENCY * hbm_Bps,
        codec_Bps=codec_Bps,
        workers=None,
        source=source,
        codec_step_s=8e-6,  # an encode and a decode kernel launch, ~4 us each
        message_s=5e-6,  # an NCCL send/receive group and a reduction kernel, launched from the host
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
    "h200": _gpu("h200", 4.8e12, "NVIDIA H200 datasheet: HBM3e 4.8 TB/s"),
    "b200": _gpu("b200", 8.0e12, "NVIDIA DGX B200 datasheet: HBM3e 8 TB/s per GPU"),
}

#: Link families: ``nvlink`` and ``pcie`` join the GPUs of a node; ``ib``, ``roce`` and ``tcp`` join
#: nodes; ``shm`` is pycoll's shared memory between the processes of one host.
KINDS = ("shm", "nvlink", "pcie", "ib", "roce", "tcp")
#: The share of the raw rate a bulk transfer attains, per family (see the module docstring).
EFFICIENCY = {"pcie": 0.8, "nvlink": 0.8, "ib": 0.96, "roce": 0.96, "tcp": 0.94}


def _link(
    name: str, kind: str, description: str, alpha_us: float, raw_GBps: float, device: str, source: str
) -> LinkProfile:
    beta = raw_GBps * EFFICIENCY[kind] * GB
    return LinkProfile(name, description, alpha_us * 1e-6, beta, device, {}, source, kind=kind)


def _ethernet(gbit: int, alpha_us: float, roce: bool = True) -> list[LinkProfile]:
    """The kernel-TCP class of a ``gbit`` Ethernet port, and its RoCE class unless ``roce`` is False."""
    rate = gbit / 8
    tcp = _link(f"eth{gbit}", "tcp", f"{gbit} GbE, kernel TCP, a port per rank", alpha_us, rate, "cpu",
                f"IEEE 802.3: {gbit} Gb/s")
    if not roce:
        return [tcp]
    return [tcp, _link(f"roce{gbit}", "roce", f"{gbit} GbE with RDMA (RoCE v2), a port", 6.0, rate, "h100",
                       f"IEEE 802.3: {gbit} Gb/s; RoCE v2, IBTA annex A17")]


_ALL = [
    LinkProfile(
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
        kind="shm",
    ),
    _link("pcie3", "pcie", "PCIe Gen3 x16, GPUs", 3.0, 15.75, "a100", "PCI-SIG PCIe 3.0: 8 GT/s"),
    _link("pcie4", "pcie", "PCIe Gen4 x16, GPUs", 3.0, 31.5, "a100", "PCI-SIG PCIe 4.0: 16 GT/s"),
    _link("pcie5", "pcie", "PCIe Gen5 x16, GPUs", 3.0, 63.0, "h100", "PCI-SIG PCIe 5.0: 32 GT/s"),
    _link("nvlink3", "nvlink", "NVLink 3 (A100, 12 links)", 2.0, 300.0, "a100",
          "NVIDIA A100 datasheet: 600 GB/s NVLink"),
    _link("nvlink4", "nvlink", "NVLink 4 (H100 SXM, 18 links)", 2.0, 450.0, "h100",
          "NVIDIA H100 datasheet: 900 GB/s NVLink"),
    _link("nvlink5", "nvlink", "NVLink 5 (B200, 18 links)", 2.0, 900.0, "b200",
          "NVIDIA DGX B200 datasheet: 1.8 TB/s NVLink per GPU"),
    _link("ib_hdr", "ib", "InfiniBand HDR, one 200 Gb/s port", 5.0, 25.0, "a100", "InfiniBand HDR 200 Gb/s"),
    _link("ib_ndr", "ib", "InfiniBand NDR, one 400 Gb/s port", 5.0, 50.0, "h100", "InfiniBand NDR 400 Gb/s"),
    _link("ib_xdr", "ib", "InfiniBand XDR, one 800 Gb/s port", 5.0, 100.0, "b200", "InfiniBand XDR 800 Gb/s"),
    *_ethernet(10, 25.0, roce=False),
    *_ethernet(25, 25.0),
    *_ethernet(100, 20.0),
    *_ethernet(200, 20.0),
    *_ethernet(400, 20.0),
]
LINKS: dict[str, LinkProfile] = {link.name: link for link in _ALL}


def link_named(name: str, extra: dict[str, LinkProfile] | None = None) -> LinkProfile:
    """The profile of link class ``name``: one of ``extra`` (a user's classes) or of LINKS."""
    key = name.lower()
    if extra and key in extra:
        return extra[key]
    try:
        return LINKS[key]
    except KeyError:
        known = [*LINKS, *(extra or {})]
        raise ValueError(f"unknown link {name!r}; choose one of {', '.join(known)}") from None


def gpu_named(name: str) -> DeviceProfile:
    """The GPU device ``name`` (one of DEVICES that is not a CPU)."""
    device = DEVICES.get(name.lower())
    if device is None or device.workers is not None:
        gpus = [n for n, d in DEVICES.items() if d.workers is None]
        raise ValueError(f"unknown GPU {name!r}; choose one of {', '.join(gpus)}")
    return device


def device_for(link: LinkProfile, workers: int | None = None) -> DeviceProfile:
    """The default device at the ends of ``link``; for the CPU, ``workers`` overrides the core count."""
    device = DEVICES[link.device]
    if workers is not None and device.workers is not None:
        device = replace(device, workers=workers)
    return device
