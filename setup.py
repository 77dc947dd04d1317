"""Builds the native module pycoll._C with CMake (see CMakeLists.txt).

PYCOLL_CUDA=auto|on|off decides whether CUDA sources are compiled (auto: when nvcc is found).
PYCOLL_BUILD_TYPE=Release|Debug|RelWithDebInfo (default Release).
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_temp = Path(self.build_temp).resolve() / ext.name
        build_temp.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("PYCOLL_BUILD_TYPE", "Release")
        cuda = os.environ.get("PYCOLL_CUDA", "auto").lower()
        if cuda not in ("auto", "on", "off"):
            raise SystemExit(f"PYCOLL_CUDA must be auto, on or off, got {cuda!r}")
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
        try:
            import ninja  # noqa: F401

            args.append("-GNinja")
        except ImportError:
            pass
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_temp, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", ".", "--config", cfg, "-j", jobs], cwd=build_temp, check=True)


setup(ext_modules=[CMakeExtension("pycoll._C")], cmdclass={"build_ext": CMakeBuild})
