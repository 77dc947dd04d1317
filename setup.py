"""Builds the native module pycoll._C with CMake (see CMakeLists.txt).

PYCOLL_CUDA=auto|on|off decides whether CUDA sources are compiled (auto: when nvcc is found).
PYCOLL_BUILD_TYPE=Release|Debug|RelWithDebInfo (default Release).

Builds are repeatable: ``pip install .`` twice, ``pip install -e .`` then ``pip install .``, or
PYCOLL_CUDA=off then on, all in one checkout. CMake's cache (build/temp.*/pycoll._C/CMakeCache.txt)
records the tools that configured it, and pip builds in an isolated environment that it deletes
afterwards: a later build would find a cache naming a ninja, a cmake and a pybind11 that no longer
exist. So the build directory records the environment it was configured in (``_STAMP``), and a build
in another one starts from an empty directory. Builds in the same environment (``pip install
--no-build-isolation``, ``python setup.py build_ext``) stay incremental.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
#: The file in the build directory naming the build environment its CMake cache was made in.
_STAMP = "pycoll-build-environment.json"
#: The modules the CMake build makes besides pycoll._C where it can (CMakeLists.txt): the emulated CUDA
#: kernels need the CUDA toolkit's headers. setuptools installs, and for ``pip install -e`` copies into the
#: source tree, only the extensions it was told of: each is declared, and dropped where the build made none.
_OPTIONAL_MODULES = ("pycoll._emulated_kernels",)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def _build_environment(cmake: str, ninja: str | None, pybind11_dir: str) -> dict[str, str | None]:
    """What a CMake cache depends on and pip's isolated build environments change: the tools' paths."""
    return {
        "python": sys.executable,
        "cmake": cmake,
        "generator": "Ninja" if ninja else None,
        "make_program": ninja,
        "pybind11_dir": pybind11_dir,
        **{name: os.environ.get(name) for name in ("CC", "CXX", "CUDACXX", "CUDA_HOME")},
    }


def _prepare_build_dir(build_temp: Path, environment: dict[str, str | None]) -> None:
    """Empty ``build_temp`` unless its CMake cache was made in ``environment`` (module docstring)."""
    stamp = build_temp / _STAMP
    try:
        previous = json.loads(stamp.read_text())
    except (OSError, ValueError):
        previous = None
    if previous != environment and build_temp.exists():
        shutil.rmtree(build_temp)
    build_temp.mkdir(parents=True, exist_ok=True)


class CMakeBuild(build_ext):
    def build_extensions(self) -> None:
        optional = {name: Path(self.get_ext_fullpath(name)) for name in _OPTIONAL_MODULES}
        for path in optional.values():  # not an earlier build's: a stale module would be installed too
            path.unlink(missing_ok=True)
        super().build_extensions()
        self.extensions = [
            ext for ext in self.extensions if ext.name not in optional or optional[ext.name].exists()
        ]

    def build_extension(self, ext: Extension) -> None:
        if ext.name in _OPTIONAL_MODULES:
            return  # made by pycoll._C's CMake build, where it can be
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_temp = Path(self.build_temp).resolve() / ext.name
        cfg = os.environ.get("PYCOLL_BUILD_TYPE", "Release")
        cuda = os.environ.get("PYCOLL_CUDA", "auto").lower()
        if cuda not in ("auto", "on", "off"):
            raise SystemExit(f"PYCOLL_CUDA must be auto, on or off, got {cuda!r}")
        cmake = shutil.which("cmake")
        if cmake is None:
            raise SystemExit("building pycoll needs cmake >= 3.18 (pip puts it in the build environment)")
        cmake = os.path.realpath(cmake)
        ninja = shutil.which("ninja")
        ninja = os.path.realpath(ninja) if ninja else None
        environment = _build_environment(cmake, ninja, pybind11.get_cmake_dir())
        _prepare_build_dir(build_temp, environment)
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPYCOLL_CUDA={cuda.upper()}",
        ]
        if os.environ.get("PYCOLL_CUDA_ARCHS"):
            archs = os.environ["PYCOLL_CUDA_ARCHS"].replace(",", ";")
            args.append(f"-DPYCOLL_CUDA_ARCHS={archs}")
        else:  # back to CMakeLists.txt's default, not the cached value of an earlier PYCOLL_CUDA_ARCHS build
            args.append("-UPYCOLL_CUDA_ARCHS")
        if ninja:
            args += ["-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        subprocess.run([cmake, str(ROOT), *args], cwd=build_temp, check=True)
        (build_temp / _STAMP).write_text(json.dumps(environment, indent=1) + "\n")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run([cmake, "--build", ".", "--config", cfg, "-j", jobs], cwd=build_temp, check=True)


setup(
    ext_modules=[CMakeExtension(name) for name in ("pycoll._C", *_OPTIONAL_MODULES)],
    cmdclass={"build_ext": CMakeBuild},
)
