"""Where pycoll finds NVIDIA's shared libraries: libnccl and libcudart. The one home of that search.

``pycoll doctor`` reports what this module finds, and code that loads NCCL is meant to load it from
exactly the path :func:`find_nccl` returns, so what the doctor says is what a job gets.

Search order for NCCL (the first place that has a candidate wins; later places are not consulted):

1. ``NCCL_LIBRARY``: a file (or a name for the dynamic loader) the user chose. When it is set but cannot
   be loaded, that is reported as the error: pycoll does not quietly fall back to another NCCL.
2. The ``nvidia-nccl-cu13`` / ``nvidia-nccl-cu12`` wheels: ``nvidia/<...>/lib/libnccl.so*`` under every
   directory of the ``nvidia`` namespace package (found with :func:`importlib.util.find_spec`, so any
   site-packages, virtual environment or ``PYTHONPATH`` entry counts, not one hard-coded path).
3. The system: :func:`ctypes.util.find_library` (which asks ``ldconfig``).

libcudart: the ``nvidia-cuda-runtime`` wheels (``nvidia/cuda_runtime/lib``, ``nvidia/cu13/lib``...),
then ``$CUDA_HOME/lib64`` / ``$CUDA_PATH/lib64``, then the system.

Nothing here raises for a missing or broken library: the answer is a :class:`LibraryInfo` with the path
(or None), where it came from, the version reported by the library itself when it could be loaded, and
the error text otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pycoll.env import NCCL_LIBRARY_VAR, library_settings

__all__ = [
    "CUDART_WHEELS",
    "NCCL_ENV",
    "NCCL_WHEELS",
    "LibraryInfo",
    "cudart_version",
    "decode_cuda_version",
    "decode_nccl_version",
    "find_cudart",
    "find_nccl",
    "nccl_version",
    "nvidia_package_dirs",
]

#: Environment variable naming the libnccl to use.
NCCL_ENV = NCCL_LIBRARY_VAR
#: Wheels that ship libnccl, in order of preference (newest CUDA first).
NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
#: Wheels that ship libcudart, in order of preference.
CUDART_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")

# Sub-directories of the ``nvidia`` namespace package searched, in this order, before any other one:
# the per-library layout of the cu12 wheels, then the per-CUDA-version layout of the cu13 wheels.
_NCCL_SUBDIRS = ("nccl", "cu13", "cu12")
_CUDART_SUBDIRS = ("cuda_runtime", "cu13", "cu12")


@dataclass
class LibraryInfo:
    """The outcome of one library search."""

    #: "nccl" or "cudart".
    name: str
    #: The file chosen (or a bare soname handed to the dynamic loader, for the system); None: none found.
    path: str | None = None
    #: Where it came from: "NCCL_LIBRARY", "wheel", "CUDA_HOME", "CUDA_PATH", "system", or "not found".
    source: str = "not found"
    #: The wheel that installed ``path`` ("nvidia-nccl-cu12 2.21.5"), when one did.
    package: str | None = None
    #: The version the library reports about itself ("2.21.5"), when it was loaded and asked.
    version: str | None = None
    #: Why the library is unusable, or was not found.
    error: str | None = None
    #: Every place looked at, in order, for the report.
    searched: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.path is not None

    @property
    def usable(self) -> bool:
        return self.path is not None and self.error is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_nccl_version(code: int) -> str:
    """``ncclGetVersion``'s integer as "major.minor.patch": 22105 -> "2.21.5" (NCCL >= 2.9 encodes
    major*10000 + minor*100 + patch; older releases major*1000 + minor*100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def decode_cuda_version(code: int) -> str:
    """A CUDA version integer (runtime, driver) as "major.minor": 12040 -> "12.4"."""
    return f"{code // 1000}.{code % 1000 // 10}"


def nvidia_package_dirs() -> list[str]:
    """Every directory of the ``nvidia`` namespace package (where NVIDIA's pip wheels put their
    libraries), without importing anything; empty when no such wheel is installed."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = spec.submodule_search_locations
    return [str(p) for p in locations] if locations is not None else []


def _wheel_candidates(dirs: Sequence[str], subdirs: Sequence[str], stem: str) -> list[Path]:
    """Files ``<dir>/<subdir>/lib/<stem>.so*``, preferred sub-directories first, then any other one;
    within one directory the versioned name (``.so.2``) before the bare ``.so``."""
    found: list[Path] = []
    for base in dirs:
        root = Path(base)
        try:
            others = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in subdirs)
        except OSError:
            continue
        for sub in [*subdirs, *others]:
            lib = root / sub / "lib"
            try:
                names = sorted((p for p in lib.glob(f"{stem}.so*") if p.is_file()), key=_so_rank)
            except OSError:
                continue
            found.extend(names)
    return found


def _so_rank(path: Path) -> tuple[int, str]:
    # "libnccl.so.2" (the soname the loader wants) before "libnccl.so.2.21.5" before "libnccl.so".
    suffix = path.name.split(".so", 1)[1]
    return (0 if suffix.count(".") == 1 else 1 if suffix else 2, path.name)


def _owning_wheel(path: Path, wheels: Sequence[str]) -> str | None:
    """ "name version" of the installed wheel (among ``wheels``) whose file list holds ``path``."""
    try:
        target = path.resolve()
    except OSError:
        return None
    for name in wheels:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for entry in dist.files or []:
            if entry.name == path.name and Path(str(dist.locate_file(entry))).resolve() == target:
                return f"{name} {dist.version}"
    return None


def _load(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


def _call_version(path: str, symbol: str, error_kind: str) -> int:
    """Load the library at ``path`` and call its ``int symbol(int*)`` version query. Raises OSError
    (cannot load), AttributeError (no such symbol) or RuntimeError (the call failed)."""
    fn = getattr(_load(path), symbol)
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    code = ctypes.c_int(0)
    rc = fn(ctypes.byref(code))
    if rc != 0:
        raise RuntimeError(f"{symbol} returned {error_kind} {rc}")
    return code.value


def nccl_version(path: str) -> str:
    """Load the libnccl at ``path`` and ask it its version (``ncclGetVersion``); raises like
    ``_call_version``."""
    return decode_nccl_version(_call_version(path, "ncclGetVersion", "ncclResult"))


def cudart_version(path: str) -> str:
    """Load the libcudart at ``path`` and ask it its version (``cudaRuntimeGetVersion``); raises like
    ``_call_version``."""
    return decode_cuda_version(_call_version(path, "cudaRuntimeGetVersion", "cudaError"))


def _ask_version(info: LibraryInfo, ask: Any) -> LibraryInfo:
    assert info.path is not None
    try:
        info.version = ask(info.path)
    except (OSError, AttributeError, RuntimeError) as exc:
        info.error = f"cannot use {info.path}: {type(exc).__name__}: {exc}"
    return info


def find_nccl(
    environ: Mapping[str, str] | None = None,
    nvidia_paths: Sequence[str] | None = None,
    search_system: bool = True,
    load: bool = True,
) -> LibraryInfo:
    """Find libnccl (order in the module docstring) and, with ``load``, load it and record its version
    (or why it cannot be loaded). ``nvidia_paths`` replaces the ``nvidia`` namespace package's
    directories (tests); ``search_system=False`` skips the dynamic loader's search."""
    info = LibraryInfo(name="nccl")
    chosen = library_settings(environ).nccl_library
    if chosen:
        info.searched.append(f"{NCCL_ENV}={chosen}")
        info.path, info.source = chosen, NCCL_ENV
        if "/" in chosen and not Path(chosen).exists():
            info.error = f"{NCCL_ENV}={chosen}: no such file"
            return info
        return _ask_version(info, nccl_version) if load else info
    dirs = nvidia_package_dirs() if nvidia_paths is None else list(nvidia_paths)
    info.searched.append("wheels: " + (", ".join(f"{d}/*/lib" for d in dirs) or "no nvidia package"))
    candidates = _wheel_candidates(dirs, _NCCL_SUBDIRS, "libnccl")
    if candidates:
        info.path, info.source = str(candidates[0]), "wheel"
        info.package = _owning_wheel(candidates[0], NCCL_WHEELS)
        return _ask_version(info, nccl_version) if load else info
    if search_system:
        info.searched.append("system: ctypes.util.find_library('nccl')")
        name = ctypes.util.find_library("nccl")
        if name:
            info.path, info.source = name, "system"
            return _ask_version(info, nccl_version) if load else info
    info.error = "libnccl not found (pip install nvidia-nccl-cu12, or set NCCL_LIBRARY)"
    return info


def find_cudart(
    environ: Mapping[str, str] | None = None,
    nvidia_paths: Sequence[str] | None = None,
    search_system: bool = True,
    load: bool = True,
) -> LibraryInfo:
    """Find libcudart (wheels, then ``$CUDA_HOME``/``$CUDA_PATH``, then the system) and, with ``load``,
    record the CUDA runtime version it reports."""
    info = LibraryInfo(name="cudart")
    dirs = nvidia_package_dirs() if nvidia_paths is None else list(nvidia_paths)
    info.searched.append("wheels: " + (", ".join(f"{d}/*/lib" for d in dirs) or "no nvidia package"))
    candidates = _wheel_candidates(dirs, _CUDART_SUBDIRS, "libcudart")
    if candidates:
        info.path, info.source = str(candidates[0]), "wheel"
        info.package = _owning_wheel(candidates[0], CUDART_WHEELS)
        return _ask_version(info, cudart_version) if load else info
    if search_system:
        for var, home in library_settings(environ).cuda_homes:
            info.searched.append(f"{var}: {home}/lib64")
            files = sorted(
                (p for p in Path(home, "lib64").glob("libcudart.so*") if p.is_file()), key=_so_rank
            )
            if files:
                info.path, info.source = str(files[0]), var
                return _ask_version(info, cudart_version) if load else info
        info.searched.append("system: ctypes.util.find_library('cudart')")
        name = ctypes.util.find_library("cudart")
        if name:
            info.path, info.source = name, "system"
            return _ask_version(info, cudart_version) if load else info
    info.error = "libcudart not found (pip install nvidia-cuda-runtime-cu12, or install the CUDA toolkit)"
    return info
