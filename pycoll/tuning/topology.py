"""Topologies of GPU machines for the cost model: nodes of GPUs, the links inside a node and between nodes.

The machine (nodes, GPUs, links, P2P, NICs) is a ``Topology`` (pycoll/tuning/machine.py, re-exported
here).

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
from pathlib import Path
from typing import Any

from pycoll.tuning.links import (
    EFFICIENCY,
    KINDS,
    LINKS,
    LinkProfile,
    gpu_named,
)
from pycoll.tuning.machine import INTER_KINDS, INTRA_KINDS, STAGED_SHARE, Topology
from pycoll.tuning.model import AUTO_CODECS, Prediction
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
