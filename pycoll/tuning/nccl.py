"""NCCL's own all-reduce on a topology: the baseline pycoll's predictions stand beside.

NCCL picks an algorithm (ring, tree, NVLS) and a protocol (LL, LL128, Simple) per call from a model of
the same α-β kind, in its source (src/graph/tuning.cc of github.com/NVIDIA/nccl; the constants used
here are those of v2.30.7-1, the tables ``baseLat`` / ``hwLat`` and the protocol factors, cited where
used; arXiv 2507.04786, "Demystifying NCCL", describes the same). This module restates that model for
pycoll's topologies, with the link rates of pycoll.tuning.links:

    bus rate     what one GPU's busiest link carries per second: inside a node the GPU's intra rate
                 (``Topology.intra_Bps``), across nodes all of a node's NICs (``Topology.nic_Bps``;
                 NCCL runs as many rings / trees as the node has NICs, and every byte a node sends
                 leaves by one of them), the smaller of the two. Times the protocol's share:
    protocol     Simple sends whole buffers (share 1); LL128 puts 120 payload bytes in every 128-byte
                 line (NCCL enables it on NVLink machines, across nodes too where RDMA NICs sit by the
                 GPUs, as on DGX / HGX; its model takes 0.92 of the ring's rate, 120/128 of the tree's
                 across nodes, 7/9 inside one); LL interleaves a flag with every 4 bytes and polls
                 (NCCL's model: 1/2 of the ring's rate, 1/3.8 of the tree's), capped at NCCL's
                 ``llMaxBws``: per GPU generation on one node, per CPU (its Intel row) across nodes.
    ring         2(n-1) steps over all n GPUs; algbw = bus rate x n / (2(n-1)), so that nccl-tests'
                 busbw = the bus rate. Latency: a base per protocol plus a hop per step, the 2(nodes-1)
                 steps that leave a node at the network's hop, the others at the intra link's.
    tree         a chain inside each node and a double binary tree across nodes (two trees, each with
                 half the buffer; a node is inside one and a leaf of the other). A GPU of the chain, and
                 a node inside a tree, send the buffer twice (up, then down): algbw = bus rate / 2, times
                 NCCL's 0.92. Latency: a base plus 2 x ((GPUs per node - 1) intra hops + log2(nodes) NIC
                 hops). On 2 nodes the real tree sends less (each node is the other's only child), which
                 NCCL's model, and so its choice, ignores: the prediction is of what NCCL picks.
    nvls         NVLink SHARP (NVSwitch systems of NVLink 4 and 5, one node): the switch adds the GPUs'
                 data. A GPU sends its buffer once and receives its share's sum, then sends that share
                 once and receives every share: buffer x (1 + 1/n) each way, so algbw = intra rate x
                 n / (n+1) x NCCL's ``nvlsEfficiency`` (0.85 on Hopper, 0.74 on Blackwell), busbw =
                 intra rate x 2(n-1)/(n+1) x that (this count of the traffic is pycoll's; NCCL's own
                 model converts with a fixed ratio). Latency: NCCL's 25 us NVLS hop.

A call's time is the latency plus bytes / algbw, the smallest over the protocols the topology allows.
Not modelled: NCCL's NVLSTree and CollNet (in-network reduction across nodes), its per-size corrections
of the tree, and the channel count at mid sizes (docs/tuning.md says where the predictions miss).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pycoll.tuning.model import Prediction

if TYPE_CHECKING:
    from pycoll.tuning.machine import Topology

__all__ = ["nccl_algorithms", "nccl_allreduce", "nccl_time", "nvls_time"]

PROTOCOLS = ("LL", "LL128", "Simple")

#: Base latency of one call (us), per algorithm and protocol: NCCL's ``baseLat`` (tuning.cc, v2.30.7-1).
BASE_US = {
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
}
#: Latency of one hop (us) per link family, algorithm and protocol: NCCL's ``hwLat`` (NVLink, PCI, NET).
HOP_US = {
    "nvlink": {
        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
        "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
    },
    "pcie": {
        "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
        "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
    },
    "net": {
        "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
        "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
    },
}
#: Share of the bus rate per algorithm and protocol (module docstring); the tree's LL128 share inside
#: one node is ``TREE_LL128_ONE_NODE``.
SHARE = {
    "ring": {"LL": 1 / 2, "LL128": 0.92, "Simple": 1.0},
    "tree": {"LL": 1 / 3.8, "LL128": 120 / 128, "Simple": 1.0},
}
TREE_LL128_ONE_NODE = 7 / 9
#: NCCL's model's factor on the tree's bus rate (all protocols).
TREE_FACTOR = 0.92
#: The most LL moves per second (GB/s) on one node, per GPU generation, and on 2 and more nodes, where
#: NCCL indexes its ``llMaxBws`` by the CPU (its Intel row).
LL_MAX_ONE_NODE_GBPS = {"a100": 87.7, "h100": 141.0, "h200": 141.0, "b200": 282.0}
LL_MAX_NODES_GBPS = (39.0, 20.4)
#: NVLS: NCCL's ``nvlsEfficiency`` per link class with NVLink SHARP, and its hop (us).
NVLS_EFFICIENCY = {"nvlink4": 0.85, "nvlink5": 0.74}
NVLS_HOP_US = 25.0


def _hop_family(kind: str) -> str:
    return kind if kind in ("nvlink", "pcie") else "net"


def _protocols(topology: Topology) -> tuple[str, ...]:
    """LL128 on NVLink machines, alone or across RDMA NICs (NCCL's default; over PCIe and TCP it is off)."""
    rdma = topology.inter is not None and topology.inter.kind in ("ib", "roce")
    inter_ok = topology.nodes == 1 or rdma
    return PROTOCOLS if topology.intra.kind == "nvlink" and inter_ok else ("LL", "Simple")


def _ll_max_Bps(topology: Topology) -> float:
    if topology.nodes == 1:
        return LL_MAX_ONE_NODE_GBPS.get(topology.gpu.name, LL_MAX_ONE_NODE_GBPS["a100"]) * 1e9
    return LL_MAX_NODES_GBPS[0 if topology.nodes == 2 else 1] * 1e9


def _bus_Bps(topology: Topology) -> float:
    rate = topology.intra_Bps if topology.gpus_per_node > 1 else math.inf
    if topology.nodes > 1:
        rate = min(rate, topology.nic_Bps)
    return rate


def nccl_time(topology: Topology, algorithm: str, protocol: str, nbytes: int) -> float:
    """Seconds of NCCL's all-reduce of ``nbytes`` by ``algorithm`` ("ring", "tree") and ``protocol``."""
    n = topology.world
    if n <= 1:
        return 0.0
    share = SHARE[algorithm][protocol]
    if algorithm == "tree" and protocol == "LL128" and topology.nodes == 1:
        share = TREE_LL128_ONE_NODE
    if algorithm == "ring":
        bus = _bus_Bps(topology) * share
    else:
        bus = _bus_Bps(topology) * share * TREE_FACTOR
    if protocol == "LL":
        bus = min(bus, _ll_max_Bps(topology))
    intra_hop = HOP_US[_hop_family(topology.intra.kind)][algorithm][protocol] * (1 if topology.p2p else 2)
    net_hop = HOP_US["net"][algorithm][protocol]
    if algorithm == "ring":
        algbw = bus * n / (2 * (n - 1))
        net_steps = 2 * (topology.nodes - 1)
        hops_us = (2 * (n - 1) - net_steps) * intra_hop + net_steps * net_hop
    else:
        algbw = bus / 2
        levels = topology.nodes.bit_length() - 1  # NCCL's log2i: floor(log2(nodes))
        hops_us = 2 * ((topology.gpus_per_node - 1) * intra_hop + levels * net_hop)
    return (BASE_US[algorithm][protocol] + hops_us) * 1e-6 + nbytes / algbw


def has_nvls(topology: Topology) -> bool:
    """Whether NCCL runs NVLS there: one node of more than 2 GPUs on NVSwitch with NVLink SHARP."""
    return topology.nodes == 1 and topology.gpus_per_node > 2 and topology.intra.name in NVLS_EFFICIENCY


def nvls_time(topology: Topology, nbytes: int) -> float:
    """Seconds of NCCL's NVLS all-reduce of ``nbytes`` (module docstring)."""
    n = topology.world
    algbw = topology.intra_Bps * n / (n + 1) * NVLS_EFFICIENCY[topology.intra.name]
    return NVLS_HOP_US * 1e-6 + nbytes / algbw


def nccl_algorithms(topology: Topology) -> tuple[str, ...]:
    """NCCL's all-reduce algorithms on ``topology``, as pycoll names them."""
    return ("nccl-ring", "nccl-tree", "nccl-nvls") if has_nvls(topology) else ("nccl-ring", "nccl-tree")


def nccl_allreduce(topology: Topology, algorithm: str, nbytes: int) -> Prediction:
    """NCCL's all-reduce (one of ``nccl_algorithms``) of ``nbytes``, at its fastest protocol."""
    if algorithm not in nccl_algorithms(topology):
        raise ValueError(
            f"NCCL's all-reduce algorithms on {topology.label} are {', '.join(nccl_algorithms(topology))}, "
            f"not {algorithm!r}"
        )
    name = algorithm.removeprefix("nccl-")
    n = topology.world
    if name == "nvls":
        return Prediction("allreduce", algorithm, "none", n, nbytes, nvls_time(topology, nbytes), 2)
    time_s = min(nccl_time(topology, name, p, nbytes) for p in _protocols(topology))
    levels = topology.nodes.bit_length() - 1
    steps = 2 * (n - 1) if name == "ring" else 2 * (topology.gpus_per_node - 1 + levels)
    return Prediction("allreduce", algorithm, "none", n, nbytes, time_s, steps)
