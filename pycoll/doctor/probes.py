"""Probes of the host (CPU, NUMA, /dev/shm, InfiniBand, NICs, PCI ACS, IOMMU): each reads files under a
root directory given by the caller (``/sys``, ``/proc``, ``/dev/shm`` on a real machine, a fixture tree in
tests), returns its part of the report, and records a failure instead of raising.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pycoll.doctor.report import (
    AcsBridge,
    CpuInfo,
    IbDevice,
    IbPort,
    IommuInfo,
    Nic,
    NumaNode,
    ShmInfo,
    ShmSegment,
)

__all__ = [
    "ACS_CAP_ID",
    "ACS_CTRL_COMPLETION_REDIRECT",
    "ACS_CTRL_REQUEST_REDIRECT",
    "CPU_FLAGS",
    "extended_capabilities",
    "format_cpulist",
    "parse_cpulist",
    "probe_acs",
    "probe_cpu",
    "probe_environment",
    "probe_infiniband",
    "probe_iommu",
    "probe_nics",
    "probe_numa",
    "probe_shm",
]

#: CPU flags pycoll's native loops test for (csrc/cpu/isa.h: the AVX2 loops need both).
CPU_FLAGS = ("avx2", "f16c")

#: PCIe extended capability ID of Access Control Services, and the two ACS Control bits that send
#: peer-to-peer traffic up to the root complex instead of across a switch (PCIe spec, ACS Control
#: Register at capability + 6). NCCL's troubleshooting guide explains why this hurts GPU Direct:
#: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
ACS_CAP_ID = 0x000D
ACS_CTRL_REQUEST_REDIRECT = 1 << 2
ACS_CTRL_COMPLETION_REDIRECT = 1 << 3
_EXT_CAP_START = 0x100
_CONVENTIONAL_CONFIG = 64  # bytes of config space an unprivileged reader gets

_NET_TYPES = {1: "ether", 32: "infiniband", 772: "loopback"}


def _read(path: Path) -> str:
    return path.read_text(errors="replace").strip()


def _read_opt(path: Path) -> str | None:
    try:
        return _read(path)
    except OSError:
        return None


def _int_opt(path: Path) -> int | None:
    text = _read_opt(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist syntax ("0-3,8,10-11", maybe empty) -> sorted CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpulist`: [0, 1, 2, 5] -> "0-2,5"."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


# ---------------------------------------------------------------------------------------------------
# CPU and NUMA


def _native_isa(native: Any) -> tuple[str | None, str | None, str | None]:
    """(reduce ISA, codec ISA, error) from pycoll's native module; ``native`` None means not importable."""
    if native is None:
        return None, None, "pycoll's native module pycoll._C is not importable"
    try:
        return str(native.reduce_isa()), str(native.codec_isa()), None
    except Exception as exc:  # noqa: BLE001 - report whatever the module raised
        return None, None, _why(exc)


def probe_cpu(sys_root: Path, proc_root: Path, affinity: Iterable[int], native: Any) -> CpuInfo:
    info = CpuInfo(affinity=sorted(affinity))
    info.reduce_isa, info.codec_isa, info.native_error = _native_isa(native)
    problems: list[str] = []
    try:
        flags: set[str] = set()
        for line in (proc_root / "cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "model name" and info.model is None:
                info.model = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = set(value.split())
        info.flags = {name: name in flags for name in CPU_FLAGS}
    except OSError as exc:
        problems.append(f"cpuinfo: {_why(exc)}")
    cpu_dir = sys_root / "devices/system/cpu"
    try:
        info.online = parse_cpulist(_read(cpu_dir / "online"))
    except (OSError, ValueError) as exc:
        problems.append(f"online: {_why(exc)}")
    cores: set[tuple[int, int]] = set()
    packages: set[int] = set()
    threads = 0
    for cpu in info.online:
        topo = cpu_dir / f"cpu{cpu}/topology"
        package, core = _int_opt(topo / "physical_package_id"), _int_opt(topo / "core_id")
        if package is None or core is None:
            continue
        packages.add(package)
        cores.add((package, core))
        siblings = _read_opt(topo / "thread_siblings_list")
        if siblings is not None:
            threads = max(threads, len(parse_cpulist(siblings)))
    if cores:
        info.sockets, info.cores, info.threads_per_core = len(packages), len(cores), threads or None
    elif info.online:
        problems.append("topology: no readable cpu*/topology")
    info.smt = _read_opt(cpu_dir / "smt/control")
    if info.smt is None and info.threads_per_core is not None:
        info.smt = "on" if info.threads_per_core > 1 else "off"
    info.error = "; ".join(problems) or None
    return info


_MEMINFO = re.compile(r"Node\s+\d+\s+(\w+):\s+(\d+)\s*kB")


def probe_numa(sys_root: Path) -> tuple[list[NumaNode], str | None]:
    base = sys_root / "devices/system/node"
    try:
        names = sorted(
            (p.name for p in base.iterdir() if re.fullmatch(r"node\d+", p.name)), key=lambda n: int(n[4:])
        )
    except OSError as exc:
        return [], f"{base}: {_why(exc)}"
    nodes: list[NumaNode] = []
    for name in names:
        node = NumaNode(node=int(name[4:]))
        cpulist = _read_opt(base / name / "cpulist")
        if cpulist is not None:
            node.cpus = parse_cpulist(cpulist)
        meminfo = _read_opt(base / name / "meminfo") or ""
        for key, kb in _MEMINFO.findall(meminfo):
            if key == "MemTotal":
                node.mem_total_bytes = int(kb) * 1024
            elif key == "MemFree":
                node.mem_free_bytes = int(kb) * 1024
        nodes.append(node)
    return nodes, None


# ---------------------------------------------------------------------------------------------------
# Shared memory


def probe_shm(dev_shm: Path) -> ShmInfo:
    info = ShmInfo(path=str(dev_shm))
    try:
        st = os.statvfs(dev_shm)
        info.total_bytes = st.f_blocks * st.f_frsize
        info.free_bytes = st.f_bavail * st.f_frsize
        for entry in sorted(os.scandir(dev_shm), key=lambda e: e.name):
            if "pycoll" in entry.name:
                try:
                    size: int | None = entry.stat(follow_symlinks=False).st_size
                except OSError:
                    size = None
                info.pycoll_segments.append(ShmSegment(name=entry.name, size_bytes=size))
    except OSError as exc:
        info.error = _why(exc)
    return info


# ---------------------------------------------------------------------------------------------------
# InfiniBand and NICs


def probe_infiniband(sys_root: Path) -> tuple[list[IbDevice], str | None]:
    base = sys_root / "class/infiniband"
    if not base.exists():
        return [], None
    devices: list[IbDevice] = []
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError as exc:
        return [], _why(exc)
    for name in names:
        dev = base / name
        device = IbDevice(
            name=name,
            node_type=_read_opt(dev / "node_type"),
            fw_ver=_read_opt(dev / "fw_ver"),
            board_id=_read_opt(dev / "board_id"),
        )
        try:
            ports = sorted(
                (p for p in (dev / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
            )
        except OSError:
            ports = []
        for port in ports:
            device.ports.append(
                IbPort(
                    port=int(port.name),
                    state=_read_opt(port / "state"),
                    phys_state=_read_opt(port / "phys_state"),
                    rate=_read_opt(port / "rate"),
                    link_layer=_read_opt(port / "link_layer"),
                )
            )
        devices.append(device)
    return devices, None


def probe_nics(sys_root: Path) -> tuple[list[Nic], str | None]:
    base = sys_root / "class/net"
    try:
        names = sorted(p.name for p in base.iterdir() if p.name != "lo")
    except OSError as exc:
        return [], f"{base}: {_why(exc)}"
    nics: list[Nic] = []
    for name in names:
        dev = base / name
        nic = Nic(
            name=name,
            operstate=_read_opt(dev / "operstate"),
            mtu=_int_opt(dev / "mtu"),
            type=_int_opt(dev / "type"),
            address=_read_opt(dev / "address"),
        )
        if nic.type == 772:  # a loopback under another name
            continue
        try:
            speed = int(_read(dev / "speed"))
            if speed < 0:
                nic.speed_note = f"not reported ({speed})"
            else:
                nic.speed_mbps = speed
        except OSError as exc:
            nic.speed_note = f"unreadable ({exc.strerror or type(exc).__name__})"
        except ValueError:
            nic.speed_note = "unparsable"
        nics.append(nic)
    return nics, None


def net_type_name(kind: int | None) -> str:
    return _NET_TYPES.get(kind, str(kind)) if kind is not None else "?"


# ---------------------------------------------------------------------------------------------------
# PCI ACS and IOMMU


def extended_capabilities(config: bytes) -> list[tuple[int, int]]:
    """Walk the PCIe extended capability list of a config-space image: [(capability id, offset)...].

    Each entry starts with a 32-bit little-endian header: bits 0-15 the capability ID, 16-19 its
    version, 20-31 the offset of the next entry (0 ends the list). The list starts at 0x100; a header
    of 0 or all ones there means no extended capabilities. Loops and out-of-range offsets end the walk.
    """
    found: list[tuple[int, int]] = []
    offset, seen = _EXT_CAP_START, set()
    while _EXT_CAP_START <= offset <= len(config) - 4 and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            break
        found.append((header & 0xFFFF, offset))
        offset = (header >> 20) & 0xFFC
    return found


def acs_control(config: bytes) -> int | None:
    """The 16-bit ACS Control register of a config-space image, None without an ACS capability."""
    for cap, offset in extended_capabilities(config):
        if cap == ACS_CAP_ID and offset + 8 <= len(config):
            return int(struct.unpack_from("<H", config, offset + 6)[0])
    return None


def probe_acs(sys_root: Path, is_root: bool) -> tuple[list[AcsBridge], str | None]:
    """ACS state of every PCI-to-PCI bridge (class 0x0604: root ports and switch ports)."""
    base = sys_root / "bus/pci/devices"
    try:
        devices = sorted(p.name for p in base.iterdir())
    except OSError as exc:
        return [], f"{base}: {_why(exc)}"
    bridges: list[AcsBridge] = []
    for bdf in devices:
        klass = _read_opt(base / bdf / "class")
        try:
            if klass is None or (int(klass, 16) >> 8) != 0x0604:
                continue
        except ValueError:
            continue
        try:
            config = (base / bdf / "config").read_bytes()
        except OSError as exc:
            bridges.append(AcsBridge(bus_id=bdf, status="error", error=_why(exc)))
            continue
        if len(config) < _EXT_CAP_START + 4:
            status = (
                "not-root" if len(config) <= _CONVENTIONAL_CONFIG and not is_root else "no-extended-config"
            )
            bridges.append(AcsBridge(bus_id=bdf, status=status))
            continue
        ctrl = acs_control(config)
        if ctrl is None:
            bridges.append(AcsBridge(bus_id=bdf, status="no-acs"))
        else:
            redirect = ctrl & (ACS_CTRL_REQUEST_REDIRECT | ACS_CTRL_COMPLETION_REDIRECT)
            bridges.append(
                AcsBridge(bus_id=bdf, status="redirect" if redirect else "clear", acs_control=ctrl)
            )
    return bridges, None


def probe_iommu(sys_root: Path, proc_root: Path) -> IommuInfo:
    info = IommuInfo()
    base = sys_root / "class/iommu"
    try:
        info.units = sorted(p.name for p in base.iterdir()) if base.exists() else []
    except OSError as exc:
        info.error = _why(exc)
    info.cmdline = _read_opt(proc_root / "cmdline")
    tokens = (info.cmdline or "").split()
    info.passthrough = "iommu=pt" in tokens or "iommu.passthrough=1" in tokens
    return info


# ---------------------------------------------------------------------------------------------------
# Environment


# Variables whose values the report never shows (the doctor's output is meant to be pasted into issues).
_HIDDEN_VALUES = frozenset({"PYCOLL_SECRET"})


def probe_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_* and PYCOLL_* variables that are set (names only matched here; pycoll.env remains the
    one module that interprets PYCOLL_* values). Secrets show as ``(set, hidden)``."""
    return {
        k: "(set, hidden)" if k in _HIDDEN_VALUES else environ[k]
        for k in sorted(environ)
        if k.startswith(("NCCL_", "PYCOLL_"))
    }
