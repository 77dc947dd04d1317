"""GPU probes: NVIDIA GPUs and the links between them through NVML (the ``pynvml`` module of the
``nvidia-ml-py`` wheel), and the CUDA runtime / NCCL versions (through :mod:`pycoll.libraries`).

NVML is passed in as a module-like object so that tests can hand in a fake; every call goes through
:func:`_call`, so one failing query (a GPU without NVLink answers "Not Supported") is recorded against
that GPU and the rest is still reported.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pycoll.doctor.report import Gpu, GpuPair, GpuReport, NvLink, RuntimeInfo
from pycoll.libraries import find_cudart, find_nccl

__all__ = ["TOPOLOGY_LABELS", "import_nvml", "link_label", "normalize_bus_id", "probe_gpus", "probe_runtime"]

#: nvmlDeviceGetTopologyCommonAncestor levels -> the labels of ``nvidia-smi topo -m``.
TOPOLOGY_LABELS = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# nvmlDeviceGetP2PStatus capability indexes and results (nvml.h). Spelled out rather than read from
# pynvml, whose NVML_P2P_CAPS_INDEX_READ is a one-element tuple by a stray comma.
_P2P_READ = 0
_P2P_NVLINK = 2
_P2P_STATUS = {
    0: "OK",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
_DEFAULT_MAX_LINKS = 18
_VERSION_LINE = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*(None|'[^'\n]*'|\"[^\"\n]*\")", re.M)


def import_nvml() -> tuple[Any, str | None]:
    """(pynvml module, None), or (None, why not)."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "pynvml"
        return None, "pynvml not installed (pip install nvidia-ml-py)" + ("" if missing else f": {exc}")
    return pynvml, None


def normalize_bus_id(bus_id: Any) -> str | None:
    """NVML's "00000000:3B:00.0" (bytes or str) -> the /sys spelling "0000:3b:00.0"."""
    if bus_id is None:
        return None
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else str(bus_id)
    text = text.strip().rstrip("\x00").lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        return text or None
    if rest.count(":") == 0:  # no domain given: "3b:00.0"
        return f"0000:{text}"
    return f"{int(domain, 16):04x}:{rest}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _call(errors: list[str], what: str, nvml: Any, function: str, *args: Any) -> Any:
    """``nvml.<function>(*args)``, or None with "what: why" appended to ``errors`` (an older binding
    without the function counts as a failed query)."""
    try:
        return getattr(nvml, function)(*args)
    except Exception as exc:  # noqa: BLE001 - NVMLError and whatever a broken binding raises
        errors.append(f"{what}: {exc}")
        return None


def link_label(pair: GpuPair | None) -> str:
    """The matrix cell of a GPU pair: NV<k> with k active NVLinks, else the PCI topology label."""
    if pair is None:
        return "?"
    if pair.nvlinks:
        return f"NV{pair.nvlinks}"
    return pair.topology or "?"


def _probe_gpu(nvml: Any, index: int, handle: Any, sys_root: Path, max_links: int) -> Gpu:
    gpu = Gpu(index=index)
    errs = gpu.errors
    name = _call(errs, "name", nvml, "nvmlDeviceGetName", handle)
    gpu.name = _text(name) if name is not None else None
    uuid = _call(errs, "uuid", nvml, "nvmlDeviceGetUUID", handle)
    gpu.uuid = _text(uuid) if uuid is not None else None
    memory = _call(errs, "memory", nvml, "nvmlDeviceGetMemoryInfo", handle)
    gpu.memory_total_bytes = int(memory.total) if memory is not None else None
    pci = _call(errs, "pci", nvml, "nvmlDeviceGetPciInfo", handle)
    gpu.bus_id = normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None
    if gpu.bus_id is not None:
        path = sys_root / "bus/pci/devices" / gpu.bus_id / "numa_node"
        try:
            gpu.numa_node = int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            errs.append(f"numa_node: {type(exc).__name__}: {exc}")
    gpu.pcie_gen_current = _call(errs, "pcie gen", nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle)
    gpu.pcie_gen_max = _call(errs, "pcie max gen", nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    gpu.pcie_width_current = _call(errs, "pcie width", nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle)
    gpu.pcie_width_max = _call(errs, "pcie max width", nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)
    # NVLink: links a GPU does not have answer with an error; those are skipped, not reported.
    for link in range(max_links):
        ignored: list[str] = []
        state = _call(ignored, "nvlink", nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            continue
        active = bool(state)
        version = _call(ignored, "nvlink version", nvml, "nvmlDeviceGetNvLinkVersion", handle, link)
        remote = _call(ignored, "nvlink remote", nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        gpu.nvlinks.append(
            NvLink(
                link=link,
                active=active,
                version=int(version) if version is not None else None,
                remote_bus_id=normalize_bus_id(getattr(remote, "busId", None))
                if remote is not None
                else None,
            )
        )
    return gpu


def _nvlinks_between(a: Gpu, b: Gpu, gpu_buses: set[str]) -> int:
    """Active NVLinks joining a and b: a's links to b, or (NVSwitch systems) links of both to the same
    switches, counted as the smaller of the two GPUs' switch links."""
    direct = sum(1 for link in a.nvlinks if link.active and link.remote_bus_id == b.bus_id)
    if direct:
        return direct
    a_switch = [x.remote_bus_id for x in a.nvlinks if x.active and x.remote_bus_id not in gpu_buses]
    b_switch = [x.remote_bus_id for x in b.nvlinks if x.active and x.remote_bus_id not in gpu_buses]
    if a_switch and b_switch and set(a_switch) & set(b_switch):
        return min(len(a_switch), len(b_switch))
    return 0


def probe_gpus(nvml: Any, sys_root: Path) -> GpuReport:
    """Everything NVML says about the GPUs and their pairs; ``nvml`` None: pynvml not installed."""
    report = GpuReport()
    if nvml is None:
        report.reason = "pynvml not installed (pip install nvidia-ml-py)"
        return report
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        report.reason = f"NVML could not initialise: {exc}"
        return report
    try:
        errors: list[str] = []
        driver = _call(errors, "driver", nvml, "nvmlSystemGetDriverVersion")
        report.driver_version = _text(driver) if driver is not None else None
        cuda = _call(errors, "cuda driver", nvml, "nvmlSystemGetCudaDriverVersion")
        if cuda is not None:
            report.cuda_driver_version = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        count = _call(errors, "device count", nvml, "nvmlDeviceGetCount")
        if not count:
            report.reason = "0 devices" + (f" ({'; '.join(errors)})" if errors else "")
            return report
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))
        handles: list[Any] = []
        for index in range(int(count)):
            handle_errors: list[str] = []
            handle = _call(handle_errors, "handle", nvml, "nvmlDeviceGetHandleByIndex", index)
            handles.append(handle)
            if handle is None:
                report.gpus.append(Gpu(index=index, errors=handle_errors))
            else:
                report.gpus.append(_probe_gpu(nvml, index, handle, sys_root, max_links))
        report.available = True
        buses = {g.bus_id for g in report.gpus if g.bus_id is not None}
        for i, a in enumerate(report.gpus):
            for j in range(i + 1, len(report.gpus)):
                b = report.gpus[j]
                pair = GpuPair(a=i, b=j, nvlinks=_nvlinks_between(a, b, buses))
                if handles[i] is not None and handles[j] is not None:
                    ignored: list[str] = []
                    level = _call(
                        ignored,
                        "topology",
                        nvml,
                        "nvmlDeviceGetTopologyCommonAncestor",
                        handles[i],
                        handles[j],
                    )
                    pair.topology = TOPOLOGY_LABELS.get(int(level), str(level)) if level is not None else None
                    pair.p2p_read = _p2p(nvml, handles[i], handles[j], _P2P_READ)
                    pair.p2p_nvlink = _p2p(nvml, handles[i], handles[j], _P2P_NVLINK)
                report.pairs.append(pair)
        return report
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass


def _p2p(nvml: Any, a: Any, b: Any, index: int) -> str:
    try:
        status = int(nvml.nvmlDeviceGetP2PStatus(a, b, index))
    except Exception as exc:  # noqa: BLE001
        return f"query failed: {exc}"
    return _P2P_STATUS.get(status, f"status {status}")


def _torch_cuda() -> tuple[str | None, str | None]:
    """(torch.version.cuda, "torch <version>") without importing torch when it is not imported yet:
    the ``cuda = ...`` line of torch/version.py is read as text (nothing of torch is run)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "version", None)
        return getattr(version, "cuda", None), f"torch {getattr(torch, '__version__', '?')}"
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text()
        except OSError:
            continue
        cuda = _VERSION_LINE.search(text)
        torch_version = re.search(r"^__version__\s*=\s*['\"]([^'\"]*)['\"]", text, re.M)
        found = cuda.group(1).strip("'\"") if cuda else None
        label = f"torch {torch_version.group(1) if torch_version else '?'}"
        return (None if found in (None, "None") else found), label
    return None, None


def probe_runtime(
    environ: Mapping[str, str], nvidia_paths: Sequence[str] | None, search_system: bool
) -> RuntimeInfo:
    info = RuntimeInfo(
        cudart=find_cudart(environ, nvidia_paths, search_system),
        nccl=find_nccl(environ, nvidia_paths, search_system),
    )
    if info.cudart is not None and info.cudart.version is not None:
        info.cuda_runtime = info.cudart.version
        info.cuda_runtime_source = "libcudart"
    elif search_system:
        cuda, source = _torch_cuda()
        if source is not None:
            info.cuda_runtime = cuda
            info.cuda_runtime_source = f"{source} (torch.version.cuda)" + (
                "" if cuda else ": built without CUDA"
            )
    return info
