"""The text form of a doctor report (what ``pycoll doctor`` prints), and the GPU matrices."""

from __future__ import annotations

from pycoll.doctor.gpu import link_label
from pycoll.doctor.probes import format_cpulist, net_type_name
from pycoll.doctor.report import GpuReport, Report
from pycoll.libraries import LibraryInfo

__all__ = ["LINK_LEGEND", "link_matrix", "p2p_matrix", "render"]

LINK_LEGEND = (
    "X = self, NV<k> = k NVLinks, PIX = one PCIe switch, PXB = several PCIe switches, INT = same board,\n"
    "PHB = a PCIe host bridge, NODE = host bridges of one NUMA node, SYS = across NUMA nodes (SMP link)"
)


#: /sys/devices/system/cpu/smt/control's words, as a person would write them.
_SMT_WORDS = {"notsupported": "not supported", "notimplemented": "not implemented", "forceoff": "forced off"}

def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def link_matrix(gpu: GpuReport) -> str:
    """The GPU-to-GPU matrix of ``nvidia-smi topo -m``: NV<k> or the PCI path, plus each GPU's NUMA node."""
    n = len(gpu.gpus)
    names = [f"GPU{g.index}" for g in gpu.gpus]
    rows = []
    for i in range(n):
        cells = ["X" if i == j else link_label(gpu.pair(i, j)) for j in range(n)]
        numa = gpu.gpus[i].numa_node
        rows.append([names[i], *cells, "?" if numa is None or numa < 0 else str(numa)])
    return "\n".join(_table(["", *names, "NUMA"], rows))


def p2p_matrix(gpu: GpuReport) -> str:
    """Peer-to-peer read status per pair, as ``nvidia-smi topo -p2p r``: OK, or NS (not supported)."""
    n = len(gpu.gpus)
    names = [f"GPU{g.index}" for g in gpu.gpus]
    rows = []
    for i in range(n):
        cells = []
        for j in range(n):
            pair = gpu.pair(i, j)
            status = None if pair is None else pair.p2p_read
            cells.append("X" if i == j else "?" if status is None else "OK" if status == "OK" else "NS")
        rows.append([names[i], *cells])
    return "\n".join(_table(["", *names], rows))


def _why(report: Report, section: str) -> str:
    error = report.probe_errors.get(section)
    return f" ({error})" if error else ""


def _library(lib: LibraryInfo | None) -> str:
    if lib is None:
        return "not checked"
    if lib.path is None:
        return lib.error or "not found"
    text = f"{lib.version or 'version unknown'} from {lib.path} ({lib.source}"
    text += f", {lib.package})" if lib.package else ")"
    return text + (f"; ERROR {lib.error}" if lib.error else "")


def render(report: Report) -> str:
    """The readable report: one section per probe, then the findings (worst first within the summary)."""
    out: list[str] = []
    add = out.append
    cpu = report.cpu

    add("CPU")
    add(f"  model          {cpu.model or '?'}")
    add(
        f"  logical CPUs   {len(cpu.online)} online ({format_cpulist(cpu.online)}), "
        f"{len(cpu.affinity)} in this process's affinity ({format_cpulist(cpu.affinity)})"
    )
    if cpu.cores is not None:
        add(
            f"  topology       {cpu.sockets} socket(s), {cpu.cores} core(s), "
            f"{cpu.threads_per_core} thread(s) per core, SMT {_SMT_WORDS.get(cpu.smt or '', cpu.smt or '?')}"
        )
    add("  flags          " + (", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in cpu.flags.items()) or "?"))
    if cpu.native_error:
        add(f"  pycoll loops   unavailable: {cpu.native_error}")
    else:
        add(f"  pycoll loops   reduce {cpu.reduce_isa}, codec {cpu.codec_isa}")
    if cpu.error:
        add(f"  (incomplete: {cpu.error})")

    add("")
    add("NUMA")
    for node in report.numa:
        add(
            f"  node{node.node}  cpus {format_cpulist(node.cpus) or '-'}  "
            f"memory {_size(node.mem_total_bytes)} ({_size(node.mem_free_bytes)} free)"
        )
    if not report.numa:
        add(f"  no NUMA information ({report.probe_errors.get('numa', 'no nodes listed')})")

    add("")
    shm = report.shm
    add(f"Shared memory ({shm.path})")
    if shm.error:
        add(f"  unusable: {shm.error}")
    else:
        add(f"  size {_size(shm.total_bytes)}, free {_size(shm.free_bytes)}")
        segments = ", ".join(f"{s.name} ({_size(s.size_bytes)})" for s in shm.pycoll_segments) or "none"
        add(f"  pycoll segments: {segments}")

    add("")
    gpu = report.gpu
    add("GPUs")
    if not gpu.available:
        add(f"  no NVIDIA GPU found: {gpu.reason}")
    else:
        add(f"  driver {gpu.driver_version or '?'}, CUDA driver API {gpu.cuda_driver_version or '?'}")
        for g in gpu.gpus:
            add(
                f"  GPU{g.index}  {g.name or '?'}  {_size(g.memory_total_bytes)}  {g.bus_id or '?'}  "
                f"NUMA {g.numa_node if g.numa_node is not None else '?'}  "
                f"PCIe gen {g.pcie_gen_current or '?'}/{g.pcie_gen_max or '?'} "
                f"x{g.pcie_width_current or '?'}/x{g.pcie_width_max or '?'}"
            )
            add(f"        {g.uuid or '?'}")
            active = [x for x in g.nvlinks if x.active]
            if g.nvlinks:
                peers: dict[str, int] = {}
                for x in active:
                    peers[x.remote_bus_id or "?"] = peers.get(x.remote_bus_id or "?", 0) + 1
                versions = sorted({x.version for x in active if x.version is not None})
                detail = ", ".join(f"{k} x{v}" for k, v in peers.items()) or "-"
                add(
                    f"        NVLink: {len(active)}/{len(g.nvlinks)} links active"
                    + (f" (version {'/'.join(map(str, versions))})" if versions else "")
                    + f" to {detail}"
                )
            for err in g.errors:
                add(f"        (query failed: {err})")
    runtime = report.runtime
    if runtime.cuda_runtime or runtime.cuda_runtime_source:
        add(f"  CUDA runtime   {runtime.cuda_runtime or 'none'} (from {runtime.cuda_runtime_source})")
    else:
        add("  CUDA runtime   not found")
    add(f"  libcudart      {_library(runtime.cudart)}")
    add(f"  NCCL           {_library(runtime.nccl)}")

    add("")
    add("GPU links")
    if gpu.available and len(gpu.gpus) > 1:
        out.extend("  " + line for line in link_matrix(gpu).splitlines())
        out.extend("  " + line for line in LINK_LEGEND.splitlines())
        add("  peer-to-peer reads (OK / NS = not supported):")
        out.extend("  " + line for line in p2p_matrix(gpu).splitlines())
    else:
        add("  (fewer than two GPUs)")

    add("")
    add("InfiniBand")
    for dev in report.infiniband:
        extra = ", ".join(
            f"{k} {v}" for k, v in (("type", dev.node_type), ("fw", dev.fw_ver), ("board", dev.board_id)) if v
        )
        add(f"  {dev.name}" + (f"  ({extra})" if extra else ""))
        for port in dev.ports:
            add(
                f"    port {port.port}: {port.state or '?'}, {port.phys_state or '?'}, {port.rate or '?'}, "
                f"{port.link_layer or '?'}"
            )
    if not report.infiniband:
        add("  none" + _why(report, "infiniband"))

    add("")
    add("Network")
    rows = [
        [
            nic.name,
            nic.operstate or "?",
            f"{nic.speed_mbps} Mb/s" if nic.speed_mbps is not None else nic.speed_note or "?",
            str(nic.mtu) if nic.mtu is not None else "?",
            net_type_name(nic.type),
            nic.address or "",
        ]
        for nic in report.nics
    ]
    if rows:
        out.extend("  " + line for line in _table(["name", "state", "speed", "mtu", "type", "address"], rows))
        if any(nic.speed_mbps is None for nic in report.nics):
            add("  (no speed: the driver reports none, as virtual NICs and links that are down do)")
    else:
        add("  no interfaces besides lo" + _why(report, "network"))

    add("")
    add("PCI and IOMMU")
    counts: dict[str, int] = {}
    for bridge in report.acs:
        counts[bridge.status] = counts.get(bridge.status, 0) + 1
    add(
        f"  PCI bridges: {len(report.acs)}"
        + (" (" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")" if counts else "")
    )
    iommu = report.iommu
    add(
        f"  IOMMU: {len(iommu.units)} unit(s)"
        + (", passthrough (iommu=pt)" if iommu.units and iommu.passthrough else "")
        + (f" ({iommu.error})" if iommu.error else "")
    )
    if report.memlock:
        add(
            "  locked-memory limit (ulimit -l): "
            + ("unlimited" if report.memlock[0] < 0 else _size(report.memlock[0]))
        )

    add("")
    add("Environment")
    if report.environment:
        out.extend(f"  {k}={v}" for k, v in report.environment.items())
    else:
        add("  no NCCL_* or PYCOLL_* variables set")
    for section, error in report.probe_errors.items():
        if section not in ("numa", "infiniband", "network"):
            add(f"  ({section} probe: {error})")

    add("")
    add("Summary")
    for finding in report.findings:
        device = f" [{finding.device}]" if finding.device else ""
        add(f"  {finding.level:<5}  {finding.check:<12} {finding.message}{device}")
        if finding.level != "ok" and finding.fix:
            add(f"  {'':<5}  {'':<12} fix: {finding.fix}")
    add(f"  {len(report.errors)} error(s), {len(report.warnings)} warning(s)")
    return "\n".join(out) + "\n"
