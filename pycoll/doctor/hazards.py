"""Known hazards, judged from what the probes saw: each check adds findings of level ok, warn or error.

"error" is kept for what makes pycoll fail outright (its native module does not load, a ``PYCOLL_*``
variable has a value ``pycoll.init`` rejects, ``NCCL_LIBRARY`` names a library that cannot be loaded);
"warn" for what makes collectives slow, or may make them fail under load.

Sources for the GPU-side hazards, NCCL's troubleshooting guide:
- ACS and IOMMU redirecting peer-to-peer PCI traffic through the root complex:
  https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
- shared memory and locked-memory limits in containers (``--shm-size=1g --ulimit memlock=-1``):
  https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html#shared-memory
"""

from __future__ import annotations

from collections.abc import Mapping

from pycoll.doctor.report import Finding, Report
from pycoll.env import nccl_p2p_disable

__all__ = ["MEMLOCK_SMALL", "SHM_SMALL", "judge"]

#: /dev/shm smaller than this is worth a warning (Docker's default is 64 MiB).
SHM_SMALL = 1 << 30
#: A locked-memory limit below this (and not unlimited) is too small for RDMA buffer registration.
MEMLOCK_SMALL = 1 << 30

NCCL_TROUBLESHOOTING = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _native(report: Report) -> list[Finding]:
    cpu = report.cpu
    if cpu.native_error is not None:
        return [
            Finding(
                "error",
                "native",
                f"pycoll's native module cannot be used: {cpu.native_error}",
                "reinstall pycoll (pip install -e . builds pycoll._C; needs a C++17 compiler and cmake)",
            )
        ]
    has_avx2 = cpu.flags.get("avx2", False) and cpu.flags.get("f16c", False)
    if has_avx2 and (cpu.reduce_isa != "avx2" or cpu.codec_isa != "avx2"):
        return [
            Finding(
                "warn",
                "native",
                f"the CPU has AVX2 and F16C but pycoll's loops run {cpu.reduce_isa} (reduce) / "
                f"{cpu.codec_isa} (codec)",
                "rebuild pycoll on this machine with a compiler that supports -mavx2 -mf16c",
            )
        ]
    if not has_avx2 and cpu.flags:
        return [
            Finding(
                "warn",
                "native",
                "the CPU lacks AVX2/F16C: pycoll's reduce and codec loops run the slower baseline code",
                "run on an x86-64-v3 CPU (AVX2 + F16C) for full speed",
            )
        ]
    return [Finding("ok", "native", f"native module loaded (reduce {cpu.reduce_isa}, codec {cpu.codec_isa})")]


def _settings(environ: Mapping[str, str]) -> list[Finding]:
    from pycoll.env import Settings  # the one module that interprets PYCOLL_* values
    from pycoll.errors import InvalidUsageError

    try:
        Settings.from_environ(environ)
    except (InvalidUsageError, ValueError) as exc:
        return [
            Finding(
                "error", "settings", f"pycoll.init() will refuse the environment: {exc}", "fix or unset it"
            )
        ]
    return [Finding("ok", "settings", "PYCOLL_* settings are valid")]


def _shm(report: Report) -> list[Finding]:
    shm = report.shm
    if shm.error is not None or shm.total_bytes is None:
        return [
            Finding(
                "warn",
                "shm",
                f"{shm.path} is not usable ({shm.error}); NCCL keeps its shared-memory segments there",
                "mount a tmpfs on /dev/shm (containers: docker run --shm-size=1g, or --ipc=host)",
            )
        ]
    found: list[Finding] = []
    if shm.total_bytes < SHM_SMALL:
        found.append(
            Finding(
                "warn",
                "shm",
                f"{shm.path} is only {_size(shm.total_bytes)} (Docker's default is 64 MiB); NCCL fails to "
                "initialise when it cannot grow its segments there",
                "docker run --shm-size=1g (or --ipc=host); Kubernetes: mount an emptyDir (medium: Memory)",
            )
        )
    elif shm.free_bytes is not None and shm.free_bytes < SHM_SMALL:
        found.append(
            Finding(
                "warn",
                "shm",
                f"{shm.path} has only {_size(shm.free_bytes)} free of {_size(shm.total_bytes)}",
                f"remove stale files from {shm.path} or enlarge it",
            )
        )
    if shm.pycoll_segments:
        names = ", ".join(s.name for s in shm.pycoll_segments[:5])
        more = f" and {len(shm.pycoll_segments) - 5} more" if len(shm.pycoll_segments) > 5 else ""
        found.append(
            Finding(
                "warn",
                "shm",
                f"{len(shm.pycoll_segments)} leftover pycoll segment(s) in {shm.path}: {names}{more}",
                f"when no pycoll job is running: rm {shm.path}/*pycoll*",
            )
        )
    if not found:
        found.append(
            Finding("ok", "shm", f"{shm.path}: {_size(shm.total_bytes)}, {_size(shm.free_bytes or 0)} free")
        )
    return found


def _acs(report: Report) -> list[Finding]:
    found = [
        Finding(
            "warn",
            "acs",
            f"PCIe ACS redirects peer-to-peer traffic at bridge {b.bus_id} (ACSCtl {b.acs_control:#06x}): "
            "GPU-to-GPU and GPU-to-NIC transfers detour through the CPU root complex",
            f"disable ACS (BIOS: IO virtualization / VT-d off, or setpci -s {b.bus_id} ECAP_ACS+0x6.w=0000 "
            f"after each boot); see {NCCL_TROUBLESHOOTING}#pci-access-control-services-acs",
            b.bus_id,
        )
        for b in report.acs
        if b.status == "redirect"
    ]
    unchecked = [b for b in report.acs if b.status in ("not-root", "error")]
    if unchecked:
        why = "not root" if all(b.status == "not-root" for b in unchecked) else "config space unreadable"
        found.append(
            Finding(
                "warn",
                "acs",
                f"could not check ACS on {len(unchecked)} PCI bridge(s) ({why})",
                "run pycoll doctor as root to read the bridges' extended config space",
            )
        )
    if not found:
        checked = sum(1 for b in report.acs if b.status in ("clear", "no-acs", "no-extended-config"))
        found.append(
            Finding(
                "ok", "acs", f"no PCI bridge redirects peer-to-peer traffic ({checked} bridge(s) checked)"
            )
        )
    return found


def _iommu(report: Report) -> list[Finding]:
    iommu = report.iommu
    if not iommu.units:
        return [Finding("ok", "iommu", "no IOMMU in use")]
    if iommu.passthrough:
        return [Finding("ok", "iommu", f"IOMMU in passthrough mode ({len(iommu.units)} unit(s))")]
    return [
        Finding(
            "warn",
            "iommu",
            f"IOMMU enabled ({len(iommu.units)} unit(s)) without iommu=pt: DMA between devices is translated "
            "and may be redirected through the root complex",
            "boot with iommu=pt (or disable VT-d / AMD-Vi in the BIOS) unless you pass devices to VMs",
        )
    ]


def _p2p(report: Report, environ: Mapping[str, str]) -> list[Finding]:
    found: list[Finding] = []
    p2p_disable = nccl_p2p_disable(environ)
    if p2p_disable is not None:
        found.append(
            Finding(
                "warn",
                "p2p",
                f"NCCL_P2P_DISABLE={p2p_disable} turns off GPU peer-to-peer transfers",
                "unset NCCL_P2P_DISABLE unless it works around a known fault",
            )
        )
    for pair in report.gpu.pairs:
        if pair.p2p_read is not None and pair.p2p_read != "OK":
            found.append(
                Finding(
                    "warn",
                    "p2p",
                    f"GPU{pair.a} and GPU{pair.b} cannot read each other's memory ({pair.p2p_read}); "
                    "traffic between them goes through host memory",
                    "check ACS/IOMMU (above) and `nvidia-smi topo -p2p r`; or pair ranks on linked GPUs",
                    f"GPU{pair.a}-GPU{pair.b}",
                )
            )
    if not found and report.gpu.pairs:
        found.append(
            Finding("ok", "p2p", f"peer-to-peer reads work between all {len(report.gpu.pairs)} GPU pair(s)")
        )
    return found


def _infiniband(report: Report) -> list[Finding]:
    if not report.infiniband:
        return []
    found: list[Finding] = []
    for dev in report.infiniband:
        for port in dev.ports:
            if "ACTIVE" not in (port.state or "").upper():
                found.append(
                    Finding(
                        "warn",
                        "ib-port",
                        f"InfiniBand {dev.name} port {port.port} is {port.state or 'in an unknown state'} "
                        f"({port.phys_state or 'physical state unknown'})",
                        "check the cable and the subnet manager (ibstat; opensm / the switch's SM); "
                        "or keep NCCL off it with NCCL_IB_HCA",
                        f"{dev.name} port {port.port}",
                    )
                )
    if not found:
        ports = sum(len(d.ports) for d in report.infiniband)
        found.append(Finding("ok", "ib-port", f"all {ports} InfiniBand port(s) ACTIVE"))
    if report.memlock:
        soft = report.memlock[0]
        if 0 <= soft < MEMLOCK_SMALL:
            found.append(
                Finding(
                    "warn",
                    "memlock",
                    f"locked-memory limit is {_size(soft)} (ulimit -l) with InfiniBand present: registering "
                    "large RDMA buffers will fail",
                    "raise it: ulimit -l unlimited (limits.conf memlock, or docker run --ulimit memlock=-1)",
                )
            )
        else:
            limit = "unlimited" if soft < 0 else _size(soft)
            found.append(Finding("ok", "memlock", f"locked-memory limit is {limit}"))
    return found


def _environment(report: Report) -> list[Finding]:
    if not report.environment:
        return [Finding("ok", "env", "no NCCL_* or PYCOLL_* variables set")]
    # Listed, not warned about: clusters set NCCL_SOCKET_IFNAME and the like on purpose; the settings
    # that are hazards (NCCL_P2P_DISABLE, invalid PYCOLL_* values) have findings of their own.
    names = ", ".join(f"{k}={v}" for k, v in report.environment.items())
    return [
        Finding(
            "ok",
            "env",
            f"variables that change NCCL/pycoll behaviour are set: {names}",
            "make sure each is meant (compare with a run without them)",
        )
    ]


def _libraries(report: Report) -> list[Finding]:
    nccl = report.runtime.nccl
    if nccl is None or nccl.path is None:
        return []
    if nccl.error is not None:
        level = "error" if nccl.source == "NCCL_LIBRARY" else "warn"
        return [
            Finding(
                level, "nccl-library", nccl.error, "point NCCL_LIBRARY at a working libnccl.so.2, or unset it"
            )
        ]
    return [Finding("ok", "nccl-library", f"NCCL {nccl.version} loads from {nccl.path} ({nccl.source})")]


def judge(report: Report, environ: Mapping[str, str]) -> list[Finding]:
    """All findings for ``report``, in the order the summary prints them."""
    return [
        *_native(report),
        *_settings(environ),
        *_shm(report),
        *_acs(report),
        *_iommu(report),
        *_p2p(report, environ),
        *_infiniband(report),
        *_libraries(report),
        *_environment(report),
    ]
