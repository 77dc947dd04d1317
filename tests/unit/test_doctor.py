"""``pycoll doctor`` (pycoll/doctor/, pycoll/cli/doctor.py) and the library search (pycoll/libraries.py).

The probes run against fixture /sys and /proc trees built in tmp_path (a 2-socket NUMA box with SMT, NICs,
an InfiniBand HCA, PCI bridges with and without ACS redirect, an IOMMU) and a fake NVML module with four
GPUs; one test runs the real probes on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pycoll import libraries
from pycoll.cli.main import main as cli_main
from pycoll.doctor import collect, link_matrix, p2p_matrix, render
from pycoll.doctor import probes as doctor_probes
from pycoll.doctor.gpu import normalize_bus_id, probe_gpus
from pycoll.doctor.hazards import judge
from pycoll.doctor.probes import (
    ACS_CAP_ID,
    acs_control,
    extended_capabilities,
    format_cpulist,
    parse_cpulist,
    probe_acs,
    probe_cpu,
    probe_infiniband,
    probe_nics,
    probe_numa,
)
from pycoll.doctor.report import GpuPair, Report, ShmInfo, ShmSegment

GIB = 1 << 30
MIB = 1 << 20

# ---------------------------------------------------------------------------------------------------
# Fixture trees


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _ext_header(cap: int, next_offset: int, version: int = 1) -> int:
    return cap | (version << 16) | (next_offset << 20)


def _config(chain: list[tuple[int, int, int]], acs_ctrl: int | None = None) -> bytes:
    """A 4 KiB config space whose extended capability list is ``chain`` [(offset, cap id, next)...];
    the ACS capability (if any) gets control register ``acs_ctrl``."""
    data = bytearray(4096)
    data[0:4] = struct.pack("<HH", 0x10B5, 0x8747)  # a PCIe switch port
    for offset, cap, nxt in chain:
        struct.pack_into("<I", data, offset, _ext_header(cap, nxt))
        if cap == ACS_CAP_ID and acs_ctrl is not None:
            struct.pack_into("<H", data, offset + 4, 0x005F)  # capability register
            struct.pack_into("<H", data, offset + 6, acs_ctrl)
    return bytes(data)


#: Bridges of the fixture: redirect bits set / ACS present but clear / no ACS / unreadable (not root).
BRIDGE_REDIRECT = "0000:00:01.0"
BRIDGE_CLEAR = "0000:00:02.0"
BRIDGE_NO_ACS = "0000:00:03.0"
BRIDGE_SHORT = "0000:00:04.0"
GPU_BUSES = ["0000:1b:00.0", "0000:1c:00.0", "0000:8b:00.0", "0000:8c:00.0"]
GPU_NUMA = [0, 0, 1, 1]


def build_sys(root: Path, iommu: bool = True) -> Path:
    """A 2-socket box: 2 cores per socket, 2 threads per core (cpus 0-7; siblings n and n+4)."""
    cpu = root / "devices/system/cpu"
    _write(cpu / "online", "0-7\n")
    _write(cpu / "smt/control", "on\n")
    for n in range(8):
        package = 0 if n % 4 < 2 else 1
        core = n % 2
        first = n % 4
        _write(cpu / f"cpu{n}/topology/physical_package_id", f"{package}\n")
        _write(cpu / f"cpu{n}/topology/core_id", f"{core}\n")
        _write(cpu / f"cpu{n}/topology/thread_siblings_list", f"{first},{first + 4}\n")
    node = root / "devices/system/node"
    _write(node / "online", "0-1\n")
    _write(node / "has_cpu", "0-1\n")
    for n, cpus in ((0, "0-1,4-5"), (1, "2-3,6-7")):
        _write(node / f"node{n}/cpulist", cpus + "\n")
        _write(
            node / f"node{n}/meminfo",
            f"Node {n} MemTotal:       {65536000 + n} kB\nNode {n} MemFree:        {32768000 + n} kB\n"
            f"Node {n} MemUsed:        {32768000} kB\n",
        )
    net = root / "class/net"
    for name, values in {
        "lo": {
            "operstate": "unknown",
            "speed": "0",
            "mtu": "65536",
            "type": "772",
            "address": "00:00:00:00:00:00",
        },
        "eth0": {
            "operstate": "up",
            "speed": "25000",
            "mtu": "9000",
            "type": "1",
            "address": "b8:ce:f6:00:00:01",
        },
        "veth0": {
            "operstate": "up",
            "speed": "-1",
            "mtu": "1500",
            "type": "1",
            "address": "02:42:ac:11:00:02",
        },
        "ib0": {"operstate": "down", "mtu": "2044", "type": "32", "address": "00:00:10:29:fe:80"},
    }.items():
        for key, value in values.items():
            _write(net / name / key, value + "\n")
    (net / "ib0/speed").mkdir()  # reading it fails, as EINVAL does for a down or virtual NIC
    hca = root / "class/infiniband/mlx5_0"
    _write(hca / "node_type", "1: CA\n")
    _write(hca / "fw_ver", "28.39.1002\n")
    _write(hca / "board_id", "MT_0000000838\n")
    for port, state, phys, rate in (
        (1, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"),
        (2, "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)"),
    ):
        _write(hca / f"ports/{port}/state", state + "\n")
        _write(hca / f"ports/{port}/phys_state", phys + "\n")
        _write(hca / f"ports/{port}/rate", rate + "\n")
        _write(hca / f"ports/{port}/link_layer", "InfiniBand\n")
    pci = root / "bus/pci/devices"
    # AER at 0x100 -> vendor-specific at 0x148 -> ACS at 0x220 (end): a chain to walk.
    bridges = {
        BRIDGE_REDIRECT: _config(
            [(0x100, 0x0001, 0x148), (0x148, 0x000B, 0x220), (0x220, ACS_CAP_ID, 0)], 0x001D
        ),
        BRIDGE_CLEAR: _config([(0x100, ACS_CAP_ID, 0x150), (0x150, 0x0001, 0)], 0x0001),
        BRIDGE_NO_ACS: _config([(0x100, 0x0001, 0x140), (0x140, 0x0019, 0)]),
        BRIDGE_SHORT: bytes(64),
    }
    for bdf, config in bridges.items():
        _write(pci / bdf / "class", "0x060400\n")
        _write(pci / bdf / "config", config)
        _write(pci / bdf / "numa_node", "-1\n")
    for bdf, numa in zip(GPU_BUSES, GPU_NUMA):
        _write(pci / bdf / "class", "0x030200\n")
        _write(pci / bdf / "config", _config([(0x100, ACS_CAP_ID, 0)], 0x001D))  # not a bridge: ignored
        _write(pci / bdf / "numa_node", f"{numa}\n")
    if iommu:
        (root / "class/iommu/dmar0").mkdir(parents=True)
        (root / "class/iommu/dmar1").mkdir(parents=True)
    else:
        (root / "class/iommu").mkdir(parents=True)
    return root


CPUINFO_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 bmi2 avx512f"


def build_proc(root: Path, cmdline: str = "BOOT_IMAGE=/vmlinuz-6.8 root=/dev/sda1 ro quiet") -> Path:
    blocks = [
        f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Fake 8480\n"
        f"flags\t\t: {CPUINFO_FLAGS}\n"
        for n in range(8)
    ]
    _write(root / "cpuinfo", "\n".join(blocks))
    _write(root / "cmdline", cmdline + "\n")
    return root


def build_shm(root: Path) -> Path:
    _write(root / "pycoll-4242-ring", b"\0" * 4096)
    _write(root / "nccl-abc123", b"\0" * 100)
    return root


# ---------------------------------------------------------------------------------------------------
# A fake NVML: four GPUs, NVLink 0-1 (4 links) and 2-3 (2 links), PCIe otherwise; GPU1-GPU2 without P2P.


class FakeNVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class FakeNvml:
    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 6
    # nvmlDeviceGetTopologyCommonAncestor levels per pair
    TOPOLOGY = {(0, 1): 10, (2, 3): 10, (0, 2): 50, (0, 3): 50, (1, 2): 40, (1, 3): 50}
    NVLINKS = {0: (1, 4), 1: (0, 4), 2: (3, 2), 3: (2, 2)}  # gpu: (peer, active links)

    def __init__(self) -> None:
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return b"NVIDIA H100 80GB HBM3" if handle[1] == 0 else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-00000000-0000-0000-0000-00000000000{handle[1]}"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=80 * GIB, free=79 * GIB, used=GIB)

    def _bus(self, index: int) -> Any:
        # NVML's spelling: 8-digit domain, upper case; bytes from older bindings.
        domain, rest = GPU_BUSES[index].split(":", 1)
        text = f"0000{domain}:{rest.upper()}"
        return text.encode() if index == 0 else text

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=self._bus(handle[1]))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return 4

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return 16

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        if link >= 5:
            raise FakeNVMLError(3, "Not Supported")
        return int(link < self.NVLINKS[handle[1]][1])

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:
        return 4

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        return SimpleNamespace(busId=self._bus(self.NVLINKS[handle[1]][0]))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        return self.TOPOLOGY[(min(a[1], b[1]), max(a[1], b[1]))]

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
        pair = (min(a[1], b[1]), max(a[1], b[1]))
        if index == 2:  # over NVLink
            return 0 if pair in ((0, 1), (2, 3)) else 5
        return 3 if pair == (1, 2) else 0


class BrokenNvml(FakeNvml):
    def nvmlInit(self) -> None:
        raise FakeNVMLError(9, "Driver Not Loaded")


NATIVE = SimpleNamespace(reduce_isa=lambda: "avx2", codec_isa=lambda: "avx2")


@pytest.fixture
def roots(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        sys=build_sys(tmp_path / "sys"), proc=build_proc(tmp_path / "proc"), shm=build_shm(tmp_path / "shm")
    )


@pytest.fixture
def small_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    """statvfs of any /dev/shm: 64 MiB (Docker's default), 32 MiB free."""
    fake = SimpleNamespace(f_frsize=4096, f_blocks=64 * MIB // 4096, f_bavail=32 * MIB // 4096)
    monkeypatch.setattr(doctor_probes.os, "statvfs", lambda path: fake)


def fixture_report(roots: SimpleNamespace, **overrides: Any) -> Report:
    kwargs: dict[str, Any] = dict(
        sys_root=roots.sys,
        proc_root=roots.proc,
        dev_shm=roots.shm,
        nvml=FakeNvml(),
        native=NATIVE,
        environ={"NCCL_DEBUG": "INFO"},
        affinity=[0, 1, 2, 3],
        memlock=[64 * 1024, 64 * 1024],
        is_root=False,
        nvidia_paths=[],
        search_system=False,
    )
    kwargs.update(overrides)
    return collect(**kwargs)


def summary(report: Report) -> list[tuple[str, str, str | None]]:
    return [(f.level, f.check, f.device) for f in report.findings]


# ---------------------------------------------------------------------------------------------------
# Parsers


def test_cpulist_round_trip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpulist([]) == ""


def test_extended_capability_walk() -> None:
    config = _config([(0x100, 0x0001, 0x148), (0x148, 0x000B, 0x220), (0x220, ACS_CAP_ID, 0)], 0x000C)
    assert extended_capabilities(config) == [(0x0001, 0x100), (0x000B, 0x148), (ACS_CAP_ID, 0x220)]
    assert acs_control(config) == 0x000C
    # a list pointing back at itself ends; an empty or absent list has no entries
    loop = _config([(0x100, 0x0001, 0x140), (0x140, 0x0002, 0x100)])
    assert extended_capabilities(loop) == [(0x0001, 0x100), (0x0002, 0x140)]
    assert extended_capabilities(bytes(4096)) == []
    assert extended_capabilities(b"\xff" * 4096) == []
    assert extended_capabilities(bytes(256)) == []
    assert acs_control(_config([(0x100, 0x0001, 0)])) is None


def test_normalize_bus_id() -> None:
    assert normalize_bus_id(b"00000000:3B:00.0\x00") == "0000:3b:00.0"
    assert normalize_bus_id("00000001:8C:00.0") == "0001:8c:00.0"
    assert normalize_bus_id("3b:00.0") == "0000:3b:00.0"
    assert normalize_bus_id(None) is None


# ---------------------------------------------------------------------------------------------------
# Probes on the fixture trees


def test_cpu_probe(roots: SimpleNamespace) -> None:
    cpu = probe_cpu(roots.sys, roots.proc, [3, 1, 0, 2], NATIVE)
    assert cpu.model == "Intel(R) Xeon(R) Fake 8480"
    assert cpu.online == list(range(8))
    assert cpu.affinity == [0, 1, 2, 3]
    assert (cpu.sockets, cpu.cores, cpu.threads_per_core, cpu.smt) == (2, 4, 2, "on")
    assert cpu.flags == {"avx2": True, "f16c": True}
    assert (cpu.reduce_isa, cpu.codec_isa, cpu.native_error, cpu.error) == ("avx2", "avx2", None, None)
    missing = probe_cpu(roots.sys, roots.proc, [0], None)
    assert missing.reduce_isa is None and "not importable" in (missing.native_error or "")


def test_numa_probe(roots: SimpleNamespace) -> None:
    nodes, error = probe_numa(roots.sys)
    assert error is None
    assert [(n.node, n.cpus) for n in nodes] == [(0, [0, 1, 4, 5]), (1, [2, 3, 6, 7])]
    assert nodes[0].mem_total_bytes == 65536000 * 1024 and nodes[0].mem_free_bytes == 32768000 * 1024
    assert nodes[1].mem_total_bytes == 65536001 * 1024 and nodes[1].mem_free_bytes == 32768001 * 1024


def test_nic_probe(roots: SimpleNamespace) -> None:
    nics, error = probe_nics(roots.sys)
    assert error is None
    by_name = {n.name: n for n in nics}
    assert sorted(by_name) == ["eth0", "ib0", "veth0"]  # lo skipped
    eth0 = by_name["eth0"]
    assert (eth0.operstate, eth0.speed_mbps, eth0.mtu, eth0.type, eth0.address) == (
        "up",
        25000,
        9000,
        1,
        "b8:ce:f6:00:00:01",
    )
    assert by_name["veth0"].speed_mbps is None and by_name["veth0"].speed_note == "not reported (-1)"
    ib0 = by_name["ib0"]
    assert ib0.speed_mbps is None and (ib0.speed_note or "").startswith("unreadable (")
    assert (ib0.type, ib0.mtu, ib0.operstate) == (32, 2044, "down")


def test_infiniband_probe(roots: SimpleNamespace) -> None:
    devices, error = probe_infiniband(roots.sys)
    assert error is None and len(devices) == 1
    hca = devices[0]
    assert (hca.name, hca.node_type, hca.fw_ver, hca.board_id) == (
        "mlx5_0",
        "1: CA",
        "28.39.1002",
        "MT_0000000838",
    )
    assert [(p.port, p.state, p.phys_state, p.rate, p.link_layer) for p in hca.ports] == [
        (1, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "InfiniBand"),
        (2, "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)", "InfiniBand"),
    ]
    assert probe_infiniband(roots.sys / "nowhere") == ([], None)


def test_acs_probe(roots: SimpleNamespace) -> None:
    bridges, error = probe_acs(roots.sys, is_root=False)
    assert error is None
    assert [(b.bus_id, b.status, b.acs_control) for b in bridges] == [
        (BRIDGE_REDIRECT, "redirect", 0x001D),
        (BRIDGE_CLEAR, "clear", 0x0001),
        (BRIDGE_NO_ACS, "no-acs", None),
        (BRIDGE_SHORT, "not-root", None),
    ]  # the GPUs (class 0x0302) are not bridges, whatever their config says
    as_root, _ = probe_acs(roots.sys, is_root=True)
    assert as_root[-1].status == "no-extended-config"


def test_gpu_probe(roots: SimpleNamespace) -> None:
    nvml = FakeNvml()
    gpu = probe_gpus(nvml, roots.sys)
    assert nvml.calls == ["init", "shutdown"]
    assert gpu.available and gpu.reason is None
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("550.54.15", "12.4")
    assert [g.bus_id for g in gpu.gpus] == GPU_BUSES
    assert [g.numa_node for g in gpu.gpus] == GPU_NUMA
    g0 = gpu.gpus[0]
    assert (g0.name, g0.uuid, g0.memory_total_bytes) == (
        "NVIDIA H100 80GB HBM3",
        "GPU-00000000-0000-0000-0000-000000000000",
        80 * GIB,
    )
    assert (g0.pcie_gen_current, g0.pcie_gen_max, g0.pcie_width_current, g0.pcie_width_max) == (4, 5, 16, 16)
    # links 0-4 answer (5 raises Not Supported: not a link of this GPU), 0-3 active, towards GPU1
    assert [(x.link, x.active, x.version, x.remote_bus_id) for x in g0.nvlinks] == [
        (0, True, 4, GPU_BUSES[1]),
        (1, True, 4, GPU_BUSES[1]),
        (2, True, 4, GPU_BUSES[1]),
        (3, True, 4, GPU_BUSES[1]),
        (4, False, 4, GPU_BUSES[1]),
    ]
    assert g0.errors == []
    assert [(p.a, p.b, p.topology, p.nvlinks, p.p2p_read, p.p2p_nvlink) for p in gpu.pairs] == [
        (0, 1, "PIX", 4, "OK", "OK"),
        (0, 2, "SYS", 0, "OK", "not supported"),
        (0, 3, "SYS", 0, "OK", "not supported"),
        (1, 2, "NODE", 0, "IOH topology not supported", "not supported"),
        (1, 3, "SYS", 0, "OK", "not supported"),
        (2, 3, "PIX", 2, "OK", "OK"),
    ]


def test_gpu_link_matrix(roots: SimpleNamespace) -> None:
    gpu = probe_gpus(FakeNvml(), roots.sys)
    assert link_matrix(gpu) == (
        "      GPU0  GPU1  GPU2  GPU3  NUMA\n"
        "GPU0  X     NV4   SYS   SYS   0\n"
        "GPU1  NV4   X     NODE  SYS   0\n"
        "GPU2  SYS   NODE  X     NV2   1\n"
        "GPU3  SYS   SYS   NV2   X     1"
    )
    assert p2p_matrix(gpu) == (
        "      GPU0  GPU1  GPU2  GPU3\n"
        "GPU0  X     OK    OK    OK\n"
        "GPU1  OK    X     NS    OK\n"
        "GPU2  OK    NS    X     OK\n"
        "GPU3  OK    OK    OK    X"
    )


def test_nvswitch_links_count_as_nvlink(roots: SimpleNamespace) -> None:
    class SwitchNvml(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            return 2

        def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
            if link >= 4:
                raise FakeNVMLError(2, "Invalid Argument")
            return 1

        def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
            return SimpleNamespace(busId=f"00000000:0{link % 2 + 5}:00.0")  # two NVSwitches

    gpu = probe_gpus(SwitchNvml(), roots.sys)
    assert gpu.pair(0, 1) == GpuPair(a=0, b=1, topology="PIX", nvlinks=4, p2p_read="OK", p2p_nvlink="OK")


def test_gpu_absent_reasons(roots: SimpleNamespace) -> None:
    assert (probe_gpus(None, roots.sys).reason or "").startswith("pynvml not installed")
    broken = probe_gpus(BrokenNvml(), roots.sys)
    assert not broken.available and broken.reason == "NVML could not initialise: Driver Not Loaded"

    class NoDevices(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            return 0

    nvml = NoDevices()
    assert probe_gpus(nvml, roots.sys).reason == "0 devices" and nvml.calls == ["init", "shutdown"]


# ---------------------------------------------------------------------------------------------------
# The whole report and its findings


def test_findings_on_fixture_box(roots: SimpleNamespace, small_shm: None) -> None:
    report = fixture_report(roots)
    assert summary(report) == [
        ("ok", "native", None),
        ("ok", "settings", None),
        ("warn", "shm", None),  # 64 MiB
        ("warn", "shm", None),  # the leftover pycoll segment
        ("warn", "acs", BRIDGE_REDIRECT),
        ("warn", "acs", None),  # one bridge not checkable without root
        ("warn", "iommu", None),
        ("warn", "p2p", "GPU1-GPU2"),
        ("warn", "ib-port", "mlx5_0 port 2"),
        ("warn", "memlock", None),
        ("ok", "env", None),
    ]
    by_check = {(f.check, f.device): f for f in report.findings}
    small, leftover = [f for f in report.findings if f.check == "shm"]
    assert small.message.startswith("/dev/shm is only 64.0 MiB".replace("/dev/shm", str(roots.shm)))
    assert "--shm-size" in small.fix
    assert leftover.message == f"1 leftover pycoll segment(s) in {roots.shm}: pycoll-4242-ring"
    assert report.shm.pycoll_segments == [ShmSegment(name="pycoll-4242-ring", size_bytes=4096)]
    assert (report.shm.total_bytes, report.shm.free_bytes) == (64 * MIB, 32 * MIB)
    assert "0x001d" in by_check[("acs", BRIDGE_REDIRECT)].message
    assert "not root" in by_check[("acs", None)].message
    assert "IOH topology not supported" in by_check[("p2p", "GPU1-GPU2")].message
    assert "64.0 KiB" in by_check[("memlock", None)].message
    assert "NCCL_DEBUG=INFO" in by_check[("env", None)].message
    assert report.environment == {"NCCL_DEBUG": "INFO"}
    assert report.errors == [] and report.exit_code() == 0


def test_findings_when_all_is_well(roots: SimpleNamespace, tmp_path: Path) -> None:
    """iommu=pt, ACS cleared by root, big memlock, no variables, all GPU pairs P2P-capable."""

    class GoodNvml(FakeNvml):
        def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
            return 0

    for bdf in (BRIDGE_REDIRECT, BRIDGE_SHORT):
        shutil.rmtree(roots.sys / "bus/pci/devices" / bdf)
    (roots.sys / "class/infiniband/mlx5_0/ports/2/state").write_text("4: ACTIVE\n")
    (roots.shm / "pycoll-4242-ring").unlink()
    report = fixture_report(
        roots,
        proc_root=build_proc(tmp_path / "proc-pt", "ro quiet intel_iommu=on iommu=pt"),
        nvml=GoodNvml(),
        environ={},
        memlock=[-1, -1],
        is_root=True,
    )
    checks = [(level, check) for level, check, _ in summary(report)]
    shm_levels = [level for level, check in checks if check == "shm"]  # depends on this host's tmp space
    assert [c for c in checks if c[1] != "shm"] == [
        ("ok", "native"),
        ("ok", "settings"),
        ("ok", "acs"),
        ("ok", "iommu"),
        ("ok", "p2p"),
        ("ok", "ib-port"),
        ("ok", "memlock"),
        ("ok", "env"),
    ]
    assert len(shm_levels) == 1
    assert report.iommu.passthrough and report.iommu.units == ["dmar0", "dmar1"]


def test_errors_set_the_exit_code(roots: SimpleNamespace) -> None:
    bad_env = fixture_report(roots, environ={"PYCOLL_TIMEOUT": "soon"})
    assert [(f.level, f.check) for f in bad_env.errors] == [("error", "settings")]
    assert "PYCOLL_TIMEOUT" in bad_env.errors[0].message and bad_env.exit_code() == 1
    no_native = fixture_report(roots, native=None, environ={})
    assert [(f.level, f.check) for f in no_native.errors] == [("error", "native")]
    assert no_native.exit_code() == 1


def test_p2p_disabled_by_environment(roots: SimpleNamespace) -> None:
    report = fixture_report(roots, nvml=None, environ={"NCCL_P2P_DISABLE": "1"})
    p2p = [f for f in report.findings if f.check == "p2p"]
    assert [(f.level, f.device) for f in p2p] == [("warn", None)]
    assert "NCCL_P2P_DISABLE=1" in p2p[0].message


def test_memlock_only_matters_with_infiniband(roots: SimpleNamespace) -> None:
    shutil.rmtree(roots.sys / "class/infiniband")
    report = fixture_report(roots)
    assert not [f for f in report.findings if f.check in ("memlock", "ib-port")]


def test_small_shm_and_missing_shm(tmp_path: Path) -> None:
    report = Report(shm=ShmInfo(path="/dev/shm", total_bytes=64 * MIB, free_bytes=64 * MIB))
    shm = [f for f in judge(report, {}) if f.check == "shm"]
    assert [(f.level, f.message.split(" (")[0]) for f in shm] == [("warn", "/dev/shm is only 64.0 MiB")]
    report = Report(shm=ShmInfo(path="/nowhere", error="FileNotFoundError: ..."))
    assert [f.level for f in judge(report, {}) if f.check == "shm"] == ["warn"]


def test_without_gpus_the_rest_is_reported(roots: SimpleNamespace) -> None:
    for nvml, reason in ((None, "pynvml not installed"), (BrokenNvml(), "NVML could not initialise: Driver")):
        report = fixture_report(roots, nvml=nvml)
        assert not report.gpu.available and (report.gpu.reason or "").startswith(reason)
        assert report.cpu.cores == 4 and len(report.numa) == 2 and len(report.nics) == 3
        text = render(report)
        assert f"no NVIDIA GPU found: {reason}" in text
        assert "(fewer than two GPUs)" in text


def test_probes_never_raise(tmp_path: Path) -> None:
    report = collect(
        sys_root=tmp_path / "no-sys",
        proc_root=tmp_path / "no-proc",
        dev_shm=tmp_path / "no-shm",
        nvml=None,
        native=None,
        environ={},
        affinity=[0],
        memlock=[-1, -1],
        nvidia_paths=[],
        search_system=False,
    )
    assert report.cpu.error is not None and report.shm.error is not None
    assert set(report.probe_errors) == {"numa", "network", "acs"}
    assert report.infiniband == [] and report.iommu.units == []
    render(report)  # renders whatever is missing


def test_render_sections_in_order(roots: SimpleNamespace, small_shm: None) -> None:
    text = render(fixture_report(roots))
    heads = ["CPU", "NUMA", "Shared memory", "GPUs", "GPU links", "InfiniBand", "Network", "PCI and IOMMU"]
    heads += ["Environment", "Summary"]
    positions = [text.index("\n" + h) if i else text.index(h) for i, h in enumerate(heads)]
    assert positions == sorted(positions)
    assert "  node0  cpus 0-1,4-5  memory 62.5 GiB (31.2 GiB free)" in text
    assert "  topology       2 socket(s), 4 core(s), 2 thread(s) per core, SMT on" in text
    assert "GPU1  NV4   X     NODE  SYS   0" in text
    assert "    port 2: 1: DOWN, 3: Disabled, 10 Gb/sec (4X SDR), InfiniBand" in text
    assert "  warn   ib-port      InfiniBand mlx5_0 port 2 is 1: DOWN (3: Disabled) [mlx5_0 port 2]" in text
    assert "  size 64.0 MiB, free 32.0 MiB" in text
    assert text.endswith("  0 error(s), 8 warning(s)\n")


def test_json_round_trip(roots: SimpleNamespace) -> None:
    report = fixture_report(roots)
    data = report.to_dict()
    again = json.loads(json.dumps(data))
    assert again == data
    assert again["gpu"]["gpus"][0]["bus_id"] == GPU_BUSES[0]
    assert again["gpu"]["pairs"][3]["p2p_read"] == "IOH topology not supported"
    assert again["acs"][0] == {
        "bus_id": BRIDGE_REDIRECT,
        "status": "redirect",
        "acs_control": 0x1D,
        "error": None,
    }
    assert again["runtime"]["nccl"]["source"] == "not found"
    assert {f["check"] for f in again["findings"]} >= {"acs", "iommu", "p2p", "ib-port", "env"}


# ---------------------------------------------------------------------------------------------------
# The command line


def _cli_args(roots: SimpleNamespace) -> list[str]:
    return [
        "doctor",
        "--sys-root",
        str(roots.sys),
        "--proc-root",
        str(roots.proc),
        "--dev-shm",
        str(roots.shm),
    ]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(("NCCL_", "PYCOLL_")):
            monkeypatch.delenv(name)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    return monkeypatch


def test_cli_text_and_json(
    roots: SimpleNamespace, clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "report.json"
    assert cli_main([*_cli_args(roots), "--json", str(out)]) == 0  # warnings only
    text = capsys.readouterr().out
    assert text.startswith("pycoll doctor: pycoll ")
    assert "GPU0  X     NV4   SYS   SYS   0" in text and "warn   p2p" in text
    data = json.loads(out.read_text())
    assert data["cpu"]["cores"] == 4 and len(data["gpu"]["gpus"]) == 4


def test_cli_exit_code_on_error(roots: SimpleNamespace, clean_env: pytest.MonkeyPatch, capsys: Any) -> None:
    clean_env.setenv("PYCOLL_TIMEOUT", "soon")
    assert cli_main([*_cli_args(roots), "--json", "-"]) == 1
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert [f["check"] for f in data["findings"] if f["level"] == "error"] == ["settings"]
    clean_env.setitem(sys.modules, "pynvml", None)  # not installed
    assert cli_main(_cli_args(roots)) == 1
    assert "no NVIDIA GPU found: pynvml not installed" in capsys.readouterr().out


def test_cli_help_hides_roots(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        cli_main(["doctor", "--help"])
    text = capsys.readouterr().out
    assert "--json" in text and "--sys-root" not in text and "exit status" in text.lower()


def test_real_machine() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver; the test is for the GPU-less development VM")
    report = collect()
    assert not report.gpu.available
    assert "no NVIDIA GPU found" in render(report)
    assert len(report.cpu.online) == os.cpu_count()
    assert report.cpu.affinity and set(report.cpu.affinity) <= set(report.cpu.online)
    assert report.numa and report.shm.total_bytes
    json.dumps(report.to_dict())


# ---------------------------------------------------------------------------------------------------
# pycoll.libraries


def test_version_decoding() -> None:
    assert libraries.decode_nccl_version(22105) == "2.21.5"
    assert libraries.decode_nccl_version(2708) == "2.7.8"
    assert libraries.decode_cuda_version(12040) == "12.4"
    assert libraries.decode_cuda_version(13000) == "13.0"


def _fake_wheel(site: Path, sub: str, name: str) -> Path:
    path = site / "nvidia" / sub / "lib" / name
    _write(path, "not an ELF file\n")
    return path


def test_nccl_search_order(tmp_path: Path) -> None:
    site1, site2 = tmp_path / "site1", tmp_path / "site2"
    (site1 / "nvidia/cublas/lib").mkdir(parents=True)  # another NVIDIA wheel, no NCCL
    wheel = _fake_wheel(site2, "nccl", "libnccl.so.2")
    _fake_wheel(site2, "nccl", "libnccl.so")
    paths = [str(site1 / "nvidia"), str(site2 / "nvidia")]
    # 1. NCCL_LIBRARY wins over the wheel
    chosen = tmp_path / "mine/libnccl.so.2"
    _write(chosen, "fake")
    info = libraries.find_nccl({"NCCL_LIBRARY": str(chosen)}, paths, search_system=False)
    assert (info.source, info.path, info.version) == ("NCCL_LIBRARY", str(chosen), None)
    assert (
        info.error is not None and info.error.startswith(f"cannot use {chosen}: OSError") and not info.usable
    )
    # ... even when it does not exist: reported, no fallback
    info = libraries.find_nccl({"NCCL_LIBRARY": str(tmp_path / "gone.so")}, paths, search_system=False)
    assert (info.source, info.error) == ("NCCL_LIBRARY", f"NCCL_LIBRARY={tmp_path / 'gone.so'}: no such file")
    # 2. the wheel, through the namespace package's directories; the soname before the bare .so
    info = libraries.find_nccl({}, paths, search_system=False, load=False)
    assert (info.source, info.path, info.error, info.package) == ("wheel", str(wheel), None, None)
    info = libraries.find_nccl({}, paths, search_system=False)
    assert info.path == str(wheel) and "OSError" in (info.error or "")  # a fake cannot be dlopened
    # 3. nothing anywhere
    info = libraries.find_nccl({}, [str(site1 / "nvidia")], search_system=False)
    assert (info.path, info.source, info.found) == (None, "not found", False)
    assert "libnccl not found" in (info.error or "") and len(info.searched) == 1


def test_cudart_search_order(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _fake_wheel(site, "cu12", "libcudart.so.12")
    cu13 = _fake_wheel(site, "cu13", "libcudart.so.13")
    info = libraries.find_cudart({}, [str(site / "nvidia")], search_system=False, load=False)
    assert (info.path, info.source) == (str(cu13), "wheel")
    runtime = _fake_wheel(site, "cuda_runtime", "libcudart.so.12")
    info = libraries.find_cudart({}, [str(site / "nvidia")], search_system=False, load=False)
    assert info.path == str(runtime)
    home = tmp_path / "cuda"
    _write(home / "lib64/libcudart.so.12", "fake")
    info = libraries.find_cudart({"CUDA_HOME": str(home)}, [], search_system=True, load=False)
    assert (info.path, info.source) == (str(home / "lib64/libcudart.so.12"), "CUDA_HOME")


def _compile(tmp_path: Path, name: str, source: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in library")
    src, lib = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_versions_from_loaded_libraries(tmp_path: Path) -> None:
    nccl = _compile(tmp_path, "libnccl.so.2", "int ncclGetVersion(int* v) { *v = 22105; return 0; }\n")
    info = libraries.find_nccl({"NCCL_LIBRARY": str(nccl)}, [], search_system=False)
    assert (info.version, info.error, info.usable) == ("2.21.5", None, True)
    site = tmp_path / "site/nvidia/cuda_runtime/lib"
    site.mkdir(parents=True)
    cudart = _compile(
        site, "libcudart.so.12", "int cudaRuntimeGetVersion(int* v) { *v = 12040; return 0; }\n"
    )
    info = libraries.find_cudart({}, [str(tmp_path / "site/nvidia")], search_system=False)
    assert (info.path, info.version, info.error) == (str(cudart), "12.4", None)
    # the runtime section takes the CUDA runtime version from that library
    report = collect(
        sys_root=tmp_path,
        proc_root=tmp_path,
        dev_shm=tmp_path,
        nvml=None,
        native=NATIVE,
        environ={"NCCL_LIBRARY": str(nccl)},
        affinity=[0],
        memlock=[-1, -1],
        nvidia_paths=[str(tmp_path / "site/nvidia")],
        search_system=False,
    )
    assert (report.runtime.cuda_runtime, report.runtime.cuda_runtime_source) == ("12.4", "libcudart")
    assert [(f.level, f.check) for f in report.findings if f.check == "nccl-library"] == [
        ("ok", "nccl-library")
    ]


def test_broken_nccl_library_is_an_error(roots: SimpleNamespace, tmp_path: Path) -> None:
    fake = tmp_path / "libnccl.so.2"
    fake.write_text("fake")
    report = fixture_report(roots, environ={"NCCL_LIBRARY": str(fake)})
    assert [(f.level, f.check) for f in report.errors] == [("error", "nccl-library")]
    assert report.exit_code() == 1


def test_nvidia_package_dirs_is_a_list() -> None:
    dirs = libraries.nvidia_package_dirs()
    assert isinstance(dirs, list) and all(isinstance(d, str) for d in dirs)


def test_older_nvml_binding_without_a_function(roots: SimpleNamespace) -> None:
    class OldNvml(FakeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlSystemGetCudaDriverVersion":  # added to pynvml later
                raise AttributeError(name)
            return super().__getattribute__(name)

    gpu = probe_gpus(OldNvml(), roots.sys)
    assert gpu.available and gpu.cuda_driver_version is None and gpu.driver_version == "550.54.15"
    assert len(gpu.gpus) == 4 and gpu.pair(0, 1) is not None
