"""``pycoll doctor``: what to check on a machine before blaming the library.

    from pycoll.doctor import collect, render
    report = collect()                 # never raises, never prints
    print(render(report))
    report.exit_code()                 # 1 when a finding is an error, else 0

:func:`collect` reads everything from roots it is given (``/sys``, ``/proc``, ``/dev/shm``, an NVML
module, an environment), so that each probe can be run against a fixture tree. Sections: CPU and NUMA
layout, /dev/shm, GPUs and the links between them (NVML), CUDA runtime and NCCL (pycoll.libraries),
InfiniBand, NICs, PCI ACS and IOMMU, environment; then the hazards found (pycoll/doctor/hazards.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, TypeVar, Union

from pycoll.doctor.gpu import import_nvml, probe_gpus, probe_runtime
from pycoll.doctor.hazards import judge
from pycoll.doctor.probes import (
    probe_acs,
    probe_cpu,
    probe_environment,
    probe_infiniband,
    probe_iommu,
    probe_nics,
    probe_numa,
    probe_shm,
)
from pycoll.doctor.render import link_matrix, p2p_matrix, render
from pycoll.doctor.report import CpuInfo, Finding, GpuReport, IommuInfo, Report, RuntimeInfo, ShmInfo
from pycoll.env import process_environ

__all__ = ["AUTO", "Finding", "Report", "collect", "link_matrix", "p2p_matrix", "render"]

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")


class _Auto:
    """Default of an injectable dependency: find the real one."""

    def __repr__(self) -> str:
        return "AUTO"


#: "Use the real thing": ``nvml=AUTO`` imports pynvml, ``native=AUTO`` imports pycoll._C.
AUTO: Any = _Auto()


def _import_native() -> Any:
    try:
        from pycoll import _C
    except ImportError:
        return None
    return _C


def _memlock() -> list[int]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return [-1 if v == resource.RLIM_INFINITY else int(v) for v in (soft, hard)]


def collect(
    *,
    sys_root: PathLike = "/sys",
    proc_root: PathLike = "/proc",
    dev_shm: PathLike = "/dev/shm",
    nvml: Any = AUTO,
    native: Any = AUTO,
    environ: Mapping[str, str] | None = None,
    affinity: Iterable[int] | None = None,
    memlock: Sequence[int] | None = None,
    is_root: bool | None = None,
    nvidia_paths: Sequence[str] | None = None,
    search_system: bool = True,
) -> Report:
    """Probe the machine and judge the hazards. Never raises for what it finds, never prints.

    ``nvml``: a pynvml-like module, None for "not installed", AUTO to import pynvml. ``native``: pycoll's
    native module, None for "not importable", AUTO to import it. ``environ`` (default os.environ),
    ``affinity`` (default os.sched_getaffinity(0)), ``memlock`` ((soft, hard), -1 unlimited; default
    RLIMIT_MEMLOCK) and ``is_root`` (default euid 0) stand in for the process's own state.
    ``nvidia_paths``/``search_system`` steer the library search (pycoll.libraries).
    """
    sys_path, proc_path = Path(sys_root), Path(proc_root)
    env = process_environ(environ)
    report = Report()
    errors = report.probe_errors

    def guard(section: str, probe: Callable[[], T], fallback: T) -> T:
        # The probes record what they could not read; this catches what nobody foresaw.
        try:
            return probe()
        except Exception as exc:  # noqa: BLE001
            errors[section] = f"probe failed: {type(exc).__name__}: {exc}"
            return fallback

    def with_error(section: str, result: tuple[T, str | None]) -> T:
        value, error = result
        if error:
            errors[section] = error
        return value

    if affinity is None:
        affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = list(affinity)
    native_module = _import_native() if native is AUTO else native
    report.cpu = guard("cpu", lambda: probe_cpu(sys_path, proc_path, cpus, native_module), CpuInfo())
    report.numa = guard("numa", lambda: with_error("numa", probe_numa(sys_path)), [])
    report.shm = guard("shm", lambda: probe_shm(Path(dev_shm)), ShmInfo(path=str(dev_shm)))
    nvml_error: str | None = None
    if nvml is AUTO:
        nvml, nvml_error = import_nvml()
    report.gpu = guard("gpu", lambda: probe_gpus(nvml, sys_path), GpuReport())
    if nvml_error is not None and not report.gpu.available:
        report.gpu.reason = nvml_error
    report.runtime = guard("runtime", lambda: probe_runtime(env, nvidia_paths, search_system), RuntimeInfo())
    report.infiniband = guard("infiniband", lambda: with_error("infiniband", probe_infiniband(sys_path)), [])
    report.nics = guard("network", lambda: with_error("network", probe_nics(sys_path)), [])
    root = os.geteuid() == 0 if is_root is None else is_root
    report.acs = guard("acs", lambda: with_error("acs", probe_acs(sys_path, root)), [])
    report.iommu = guard("iommu", lambda: probe_iommu(sys_path, proc_path), IommuInfo())
    report.memlock = list(memlock) if memlock is not None else guard("memlock", _memlock, [])
    report.environment = probe_environment(env)
    try:
        report.findings = judge(report, env)
    except Exception as exc:  # noqa: BLE001 - a bug in a check must not hide the rest of the report
        report.findings = [
            Finding("error", "doctor", f"judging the report failed: {type(exc).__name__}: {exc}")
        ]
    return report
