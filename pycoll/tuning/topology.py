"""Topologies of GPU machines for the cost model: nodes of GPUs, the links inside a node and between nodes.

The parts, named as the code names them:

    node         ``gpus_per_node`` GPUs joined by the ``intra`` link class (an ``nvlink`` or ``pcie`` class
                 of pycoll.tuning.links); ranks are numbered node by node, one per GPU.
    p2p          whether a node's GPUs reach each other's memory directly (peer-to-peer). Without it (PCIe
                 only: consumer cards, virtual machines, GPUs under different CPU sockets) every message
                 is staged through host memory: written there over the sender's PCIe link and read back
                 over the receiver's, at ``STAGED_SHARE`` of the P2P rate, and with a hop more.
    NIC          ``nics_per_node`` ports of the ``inter`` class (``ib``, ``roce`` or ``tcp``) per node. A
                 node's ports are shared by its GPUs: ``nic_Bps`` is what a node sends (and receives) at once,
                 ``nic_Bps / gpus_per_node`` a GPU's share when all of them use the network at the same time
                 (as hierarchical and direct do; for pycoll's flat ring and tree, where one GPU of a node
                 sends across at a time, the share is pessimistic).
    gpu          the device at each end (pycoll.tuning.links.DEVICES): its memory bandwidth prices the
                 copies, reductions and codecs. By default the one the intra class names.

``Topology.model`` is pycoll's model on it: the cost model (pycoll.tuning.model) runs pycoll's plans with
``PairLinks`` — a pair of GPUs in one node talks over the intra class, a pair in different nodes over a
GPU's share of its node's NICs, and a rank's NVLink/PCIe and NIC traffic flow at the same time (two
ports) — with GPU messages as large as pycoll's GPU path sends them (``GPU_SEGMENT_BYTES``, whole: a
step of the GPU path is an NCCL group and a kernel, which do not overlap within a message).
``pycoll.tuning.nccl`` predicts NCCL's own all-reduce on the same topology, the baseline; ``TopologyModel``
puts the two side by side and chooses.

A user describes link classes not listed in a small JSON (or, with Python 3.11+, TOML) file
(``load_links``)::

    {"links": [{"name": "eth50", "kind": "roce", "rate_gbps": 50, "latency_us": 6,
                "description": "50 GbE RoCE", "source": "our switch's datasheet"}]}

``rate_gbps`` (Gbit/s) or ``rate_GBps`` (GB/s) is the raw rate per direction of one port or one GPU's
link; ``efficiency`` (default: the family's, pycoll.tuning.links.EFFICIENCY) the share a bulk transfer
attains; ``gpu`` (default h100) the device at its ends.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pycoll.tuning.links import (
    DEVICES,
    EFFICIENCY,
    GPU_SEGMENT_BYTES,
    KINDS,
    LINKS,
    DeviceProfile,
    LinkProfile,
    gpu_named,
    link_named,
)
from pycoll.tuning.model import AUTO_CODECS, Model, PairLinks, Prediction
from pycoll.tuning.nccl import nccl_algorithms, nccl_allreduce

__all__ = [
    "INTRA_KINDS",
    "INTER_KINDS",
    "STAGED_SHARE",
    "Topology",
    "TopologyModel",
    "link_from_entry",
    "load_links",
]

INTRA_KINDS = ("nvlink", "pcie")
INTER_KINDS = ("ib", "roce", "tcp")
#: Share of the P2P rate a PCIe GPU attains when its messages are staged through host memory (no P2P):
#: every byte crosses PCIe twice and host memory twice, written by one GPU and read by another. Set by
#: one published figure, 8 RTX 4090s on PCIe Gen4 without P2P: 14.85 GB/s busbw at 64 MiB against
#: 25.2 with P2P in this model (blog.chlc.cc/p/rtx4090-gpudirect-p2p-unlocked; docs/tuning.md,
#: "Validation against published NCCL figures").
STAGED_SHARE = 0.59


@dataclass(frozen=True)
class Topology:
    """A machine: ``nodes`` nodes of ``gpus_per_node`` GPUs (see the module docstring)."""

    nodes: int
    gpus_per_node: int
    intra: LinkProfile
    inter: LinkProfile | None = None
    nics_per_node: int = 1
    p2p: bool = True
    gpu: DeviceProfile = field(default_factory=lambda: DEVICES["h100"])

    @classmethod
    def describe(
        cls,
        nodes: int = 1,
        gpus_per_node: int = 8,
        intra: str = "nvlink4",
        inter: str | None = None,
        nics_per_node: int | None = None,
        p2p: bool = True,
        gpu: str | None = None,
        links: dict[str, LinkProfile] | None = None,
    ) -> Topology:
        """The topology named by link-class names (LINKS, or ``links``: a user's, ``load_links``); NICs:
        one per GPU unless given. Raises ValueError naming what is wrong."""
        nics_per_node = gpus_per_node if nics_per_node is None else nics_per_node
        if nodes < 1 or gpus_per_node < 1 or nics_per_node < 1:
            raise ValueError(
                "need nodes, GPUs per node and NICs per node >= 1, "
                f"got {nodes}, {gpus_per_node}, {nics_per_node}"
            )
        intra_link = _of_kind(intra, INTRA_KINDS, "the link inside a node joins GPUs", links)
        if not p2p and intra_link.kind != "pcie":
            raise ValueError(f"NVLink is peer-to-peer; p2p=no applies to PCIe classes only, not {intra!r}")
        inter_link = None
        if nodes > 1:
            if inter is None:
                names = ", ".join(_names(INTER_KINDS, links))
                raise ValueError(f"{nodes} nodes need the link between them (inter: {names})")
            inter_link = _of_kind(inter, INTER_KINDS, "the link between nodes is a NIC", links)
        device = gpu_named(gpu or intra_link.device)
        return cls(nodes, gpus_per_node, intra_link, inter_link, nics_per_node, p2p, device)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def label(self) -> str:
        """``2x8 nvlink3 + 4x ib_hdr``, ``1x8 pcie4 no-p2p``."""
        text = f"{self.nodes}x{self.gpus_per_node} {self.intra.name}{'' if self.p2p else ' no-p2p'}"
        if self.inter is not None:
            text += f" + {self.nics_per_node}x {self.inter.name}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "intra": self.intra.name,
            "inter": None if self.inter is None else self.inter.name,
            "nics_per_node": self.nics_per_node,
            "p2p": self.p2p,
            "gpu": self.gpu.name,
        }

    # ---- rates ---------------------------------------------------------------------------------------
    @property
    def intra_Bps(self) -> float:
        """Bytes per second a GPU sends to the others of its node (and receives at once)."""
        beta = float(self.intra.beta_Bps or 0.0)
        return beta if self.p2p else beta * STAGED_SHARE

    @property
    def intra_alpha_s(self) -> float:
        """One hop inside a node; staged through host memory it is two."""
        return self.intra.alpha_s * (1 if self.p2p else 2)

    @property
    def nic_Bps(self) -> float:
        """Bytes per second a node sends to the others (and receives at once), all its NICs together."""
        if self.inter is None:
            return math.inf
        return self.nics_per_node * float(self.inter.beta_Bps or 0.0)

    @property
    def inter_alpha_s(self) -> float:
        return math.inf if self.inter is None else self.inter.alpha_s

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def pairs(self) -> PairLinks:
        """The links between every pair of ranks (GPUs numbered node by node) for pycoll's plans."""
        nodes = np.arange(self.world) // self.gpus_per_node
        same = nodes[:, None] == nodes[None, :]
        share = self.nic_Bps / self.gpus_per_node if self.inter is not None else 1.0
        wire = np.where(same, 1.0 / max(self.intra_Bps, 1e-300), 1.0 / share)
        alpha = np.where(same, self.intra_alpha_s, self.inter_alpha_s if self.inter is not None else 0.0)
        port = np.where(same, 0, 1).astype(np.int64)
        return PairLinks(alpha, wire, port)

    def model(self) -> Model:
        """pycoll's cost model on this topology (module docstring)."""
        return Model(
            self.intra,
            self.gpu,
            segment_bytes=GPU_SEGMENT_BYTES,
            fragment_bytes=GPU_SEGMENT_BYTES,
            origin=f"topology {self.label}",
            local_size=self.gpus_per_node,
            pairs=self.pairs(),
        )


def _of_kind(
    name: str, kinds: tuple[str, ...], what: str, extra: dict[str, LinkProfile] | None
) -> LinkProfile:
    """Link class ``name``, which must be of one of ``kinds``."""
    link = link_named(name, extra)
    if link.kind not in kinds:
        raise ValueError(
            f"{what}: an {' or '.join(kinds)} class ({', '.join(_names(kinds, extra))}), "
            f"not {name!r} ({link.kind or 'no kind'})"
        )
    return link


def _names(kinds: tuple[str, ...], extra: dict[str, LinkProfile] | None) -> list[str]:
    links = {**LINKS, **(extra or {})}
    return [name for name, link in links.items() if link.kind in kinds]


class TopologyModel:
    """pycoll's plans and NCCL's all-reduce on one topology, side by side; ``choose_compression`` is what
    ``compression="auto"`` runs on GPUs (never predicted slower than NCCL: NCCL is a candidate)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.model = topology.model()
        self._choices: dict[tuple, tuple[str, str]] = {}

    def algorithms(self) -> tuple[str, ...]:
        """Every all-reduce this topology's predictions compare: NCCL's, then pycoll's."""
        return nccl_algorithms(self.topology) + self.model.candidates("allreduce", self.topology.world)

    def codec_algorithms(self) -> tuple[str, ...]:
        return self.model.codec_algorithms(self.topology.world)

    def predict(self, algorithm: str, nbytes: int, codec: object = None) -> Prediction:
        """The all-reduce of ``nbytes`` of float32 by ``algorithm`` (``nccl-ring``, ``nccl-tree`` or one
        of pycoll's) with ``codec`` (pycoll's only)."""
        if algorithm.startswith("nccl"):
            if codec not in (None, "none"):
                raise ValueError(f"{algorithm} does not compress")
            return nccl_allreduce(self.topology, algorithm, nbytes)
        if codec not in (None, "none") and algorithm not in self.codec_algorithms():
            raise ValueError(
                f"compressed all-reduce runs {', '.join(self.codec_algorithms())}, not {algorithm}"
            )
        return self.model.predict("allreduce", algorithm, self.topology.world, nbytes, codec=codec)

    def nccl(self, nbytes: int) -> Prediction:
        """NCCL's all-reduce as NCCL would run it: its fastest algorithm (its tuner picks by a model of
        the same kind)."""
        return min((self.predict(a, nbytes) for a in nccl_algorithms(self.topology)), key=lambda p: p.time_s)

    def best_compressed(self, nbytes: int, codec: str) -> Prediction:
        """pycoll's fastest algorithm for ``codec``."""
        return min((self.predict(a, nbytes, codec) for a in self.codec_algorithms()), key=lambda p: p.time_s)

    def choose_compression(
        self, nbytes: int, *, error_budget: float, codecs: tuple[str, ...] = AUTO_CODECS
    ) -> tuple[str, str]:
        """(codec or "none", algorithm: "nccl" for NCCL's own) predicted fastest for an all-reduce of
        ``nbytes`` of float32, among NCCL's own, pycoll's uncompressed ones and pycoll's compressed ones
        whose expected error fits ``error_budget``. Anything but NCCL must be predicted faster than NCCL
        to be chosen, and a codec faster than every uncompressed all-reduce."""
        key = (nbytes, error_budget, tuple(codecs))
        choice = self._choices.get(key)
        if choice is None:
            # pycoll's best (its own choice among the exact and compressed all-reduces), against NCCL's
            world = self.topology.world
            codec, algorithm = self.model.choose_compression(
                world, nbytes, error_budget=error_budget, codecs=codecs
            )
            ours = self.predict(algorithm, nbytes, None if codec == "none" else codec)
            choice = (codec, algorithm) if ours.time_s < self.nccl(nbytes).time_s else ("none", "nccl")
            if len(self._choices) > 4096:
                self._choices.clear()
            self._choices[key] = choice
        return choice


def load_links(path: str | Path) -> dict[str, LinkProfile]:
    """A user's link classes from a JSON (or TOML, Python 3.11+) file (module docstring); ValueError
    naming the file and the entry when one is malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the link file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the link file {path} is not UTF-8 text") from None
    try:
        if path.suffix.lower() == ".toml":
            try:
                import tomllib
            except ImportError:
                raise ValueError(f"{path}: TOML link files need Python 3.11+; write it as JSON") from None
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'JSON'}: {exc}") from None
    entries = data.get("links") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a list of link classes under 'links'")
    links: dict[str, LinkProfile] = {}
    for i, entry in enumerate(entries):
        name, link = link_from_entry(entry, f"{path}: links[{i}]")
        if name in links or name in LINKS:
            what = "a built-in class" if name in LINKS else "an earlier entry"
            raise ValueError(f"{path}: links[{i}] is named {name!r}, as {what} is; give it a name of its own")
        links[name] = link
    return links


_LINK_KEYS = {
    "name",
    "kind",
    "rate_gbps",
    "rate_GBps",
    "latency_us",
    "efficiency",
    "gpu",
    "description",
    "source",
}


def link_from_entry(entry: Any, where: str) -> tuple[str, LinkProfile]:
    """(name, profile) of one user link class (a table of the module docstring's keys); ValueError
    starting with ``where`` when it is malformed."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table of name, kind, rate_gbps, latency_us")
    unknown = set(entry) - _LINK_KEYS
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_LINK_KEYS))})"
        )
    name = str(entry.get("name", "")).strip().lower()
    kind = str(entry.get("kind", "")).strip().lower()
    if not name:
        raise ValueError(f"{where} needs a name")
    if kind not in KINDS or kind == "shm":
        raise ValueError(f"{where} ({name}): kind must be one of {', '.join(k for k in KINDS if k != 'shm')}")
    if ("rate_gbps" in entry) == ("rate_GBps" in entry):
        raise ValueError(f"{where} ({name}) needs one of rate_gbps (Gbit/s) or rate_GBps (GB/s)")
    numbers = [entry.get(k) for k in ("rate_gbps", "rate_GBps", "latency_us", "efficiency") if k in entry]
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in numbers):
        raise ValueError(f"{where} ({name}): rate, latency_us and efficiency must be numbers")
    raw = float(entry["rate_gbps"]) / 8 if "rate_gbps" in entry else float(entry["rate_GBps"])
    latency = float(entry.get("latency_us", 5.0))
    efficiency = float(entry.get("efficiency", EFFICIENCY[kind]))
    if not all(math.isfinite(x) for x in (raw, latency)) or not (
        raw > 0 and latency >= 0 and 0 < efficiency <= 1
    ):
        raise ValueError(f"{where} ({name}): need rate > 0, latency_us >= 0 and 0 < efficiency <= 1")
    gpu = str(entry.get("gpu", "h100")).lower()
    try:
        gpu_named(gpu)
    except ValueError as exc:
        raise ValueError(f"{where} ({name}): {exc}") from None
    link = LinkProfile(
        name,
        str(entry.get("description", f"{name} ({kind}, user-defined)")),
        latency * 1e-6,
        raw * efficiency * 1e9,
        gpu,
        {},
        str(entry.get("source", f"user-defined ({where})")),
        kind=kind,
    )
    return name, link
