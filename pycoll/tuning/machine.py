"""GPU machines as the cost model sees them (``Topology``): nodes of GPUs, the links inside a node and
between nodes. pycoll's model on one (``Topology.model``) and NCCL's (pycoll/tuning/nccl.py) both read
it; pycoll/tuning/topology.py puts them side by side.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pycoll.tuning.links import (
    DEVICES,
    GPU_SEGMENT_BYTES,
    LINKS,
    DeviceProfile,
    LinkProfile,
    gpu_named,
    link_named,
)
from pycoll.tuning.model import Model, PairLinks

__all__ = ["INTER_KINDS", "INTRA_KINDS", "STAGED_SHARE", "Topology"]

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
