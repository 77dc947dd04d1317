"""The newcomer's path: pycoll's own ranks import the pycoll that started them, never a ``pycoll/`` in
the current directory; a source tree without its native module says so; one version everywhere.

CI also walks the path itself (``.ci/run newcomer``: a fresh clone, a fresh venv, ``pip install .``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pycoll
from pycoll import _missing_native
from pycoll.bootstrap.spawn import module_command

PACKAGE_DIR = Path(pycoll.__file__).resolve().parent
DECOY = 'raise SystemExit("the decoy pycoll in the current directory was imported")\n'


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def decoy_dir(tmp_path: Path) -> Path:
    """A directory whose ``pycoll/`` shadows the real one for anything started there with ``-m``."""
    (tmp_path / "pycoll").mkdir()
    (tmp_path / "pycoll" / "__init__.py").write_text(DECOY)
    return tmp_path


def test_module_command_imports_the_launchers_pycoll_not_the_current_directorys(decoy_dir: Path) -> None:
    plain = _run([sys.executable, "-m", "pycoll.cli.main", "--version"], decoy_dir)
    assert plain.returncode != 0 and "decoy" in plain.stderr  # what `python -m` does there
    proc = _run(module_command("pycoll.cli.main", ["--version"]), decoy_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pycoll {pycoll.__version__}"


PROBE = """import os, sys
import pycoll
print(__name__, pycoll.__file__, sys.argv[1:], os.path.basename(sys.argv[0]))
print(any(os.path.realpath(p or ".").endswith(os.path.join("pycoll", "bootstrap")) for p in sys.path))
"""


def test_module_command_runs_the_module_of_its_own_package_as_main(tmp_path: Path, decoy_dir: Path) -> None:
    """spawn.py copied into another pycoll tree: the module it runs comes from that tree, as __main__,
    with the arguments after the module's name, and pycoll/bootstrap/ is not left on sys.path."""
    tree = tmp_path / "other-tree" / "pycoll"
    (tree / "bootstrap").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "probe.py").write_text(PROBE)
    (tree / "bootstrap" / "spawn.py").write_bytes((PACKAGE_DIR / "bootstrap" / "spawn.py").read_bytes())
    (tree / "bootstrap" / "json.py").write_text("raise SystemExit('bootstrap/ was on sys.path')\n")
    proc = _run([sys.executable, str(tree / "bootstrap" / "spawn.py"), "pycoll.probe", "-x", "y"], decoy_dir)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == f"__main__ {tree / '__init__.py'} ['-x', 'y'] probe.py"
    assert second == "False"
    with pytest.raises(ValueError, match="pycoll's own modules"):
        module_command("json.tool")


def test_pycoll_bench_in_a_directory_holding_another_pycoll(decoy_dir: Path) -> None:
    """``pycoll bench`` started in a clone's root (here: a directory with a decoy ``pycoll/``)."""
    cmd = module_command("pycoll.cli.main", ["bench", "--ranks", "2", "-b", "4K", "-e", "8K", "-c", "1"])
    proc = _run(cmd, decoy_dir)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == [4096, 8192]
    assert all(row[-1] == "0" for row in rows)  # #wrong


def test_pycoll_run_keeps_python_path_rules_for_the_users_program(tmp_path: Path) -> None:
    """A user's module in the current directory stays importable under ``pycoll run -m``, as with
    ``python -m``."""
    # Each rank writes a file of its own: two ranks printing to one pipe may interleave their bytes.
    (tmp_path / "users_job.py").write_text(
        "import os, pathlib\npathlib.Path(f\"ran{os.environ['RANK']}\").write_text(os.getcwd())\n"
    )
    proc = _run(module_command("pycoll.run", ["-n", "2", "-m", "users_job"]), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.glob("ran*")) == ["ran0", "ran1"]
    assert all((tmp_path / f"ran{r}").read_text() == str(tmp_path) for r in range(2))


# ---- a pycoll without its native module --------------------------------------------------------------


def _copy_package(dest: Path) -> Path:
    """pycoll's Python files (no native module) under ``dest/pycoll``."""
    for source in PACKAGE_DIR.rglob("*.py"):
        target = dest / "pycoll" / source.relative_to(PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    return dest / "pycoll"


def _import_native(root: Path, statement: str) -> subprocess.CompletedProcess[str]:
    # -S: no site, so no editable install's finder can supply the native module. numpy's directory goes
    # last on the path: an installed pycoll there loses to the copy under ``root``, which comes first.
    import numpy

    numpy_dir = str(Path(numpy.__file__).resolve().parent.parent)
    path = f"sys.path.insert(0, {str(root)!r}); sys.path.append({numpy_dir!r})"
    code = f"import sys; {path}; import pycoll; {statement}"
    return _run([sys.executable, "-S", "-c", code], root)


@pytest.mark.parametrize("statement", ["import pycoll._C", "from pycoll import _C", "import pycoll.arrays"])
def test_a_source_tree_without_its_native_module_says_what_to_do(tmp_path: Path, statement: str) -> None:
    _copy_package(tmp_path)
    for marker in ("setup.py", "CMakeLists.txt"):
        (tmp_path / marker).write_text("")
    (tmp_path / "csrc").mkdir()
    proc = _import_native(tmp_path, statement)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: you are importing pycoll from its source tree at ")
    assert str(tmp_path) in last and "(the current directory, which Python searches first)" in last
    assert "pip install -e ." in last and "run Python from another directory" in last


def test_an_installed_pycoll_without_its_native_module_says_reinstall(tmp_path: Path) -> None:
    package = _copy_package(tmp_path)
    (package / "_C.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")  # a build for another Python
    proc = _import_native(tmp_path, "import pycoll.comm")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0
    assert last.startswith(f"ImportError: pycoll's native module pycoll._C is missing from {package}")
    assert "_C.cpython-39-x86_64-linux-gnu.so, built for another Python" in last
    assert "pip install --force-reinstall" in last


def test_the_finder_answers_only_for_the_native_module() -> None:
    kinds = [type(f) for f in sys.meta_path]
    ours = kinds.index(_missing_native._MissingNativeFinder)
    finder = sys.meta_path[ours]
    assert kinds.count(_missing_native._MissingNativeFinder) == 1
    # After the path finder, so after whatever the installed or source-tree pycoll provides.
    assert ours > sys.meta_path.index(importlib.machinery.PathFinder)
    assert finder.find_spec("pycoll.api") is None and finder.find_spec("numpy") is None
    assert not _missing_native.is_source_tree(str(PACKAGE_DIR))


# ---- one version --------------------------------------------------------------------------------------


def test_one_version_for_the_package_the_metadata_and_the_command(tmp_path: Path) -> None:
    from pycoll._version import __version__

    assert pycoll.__version__ == __version__
    assert importlib.metadata.version("pycoll") == __version__
    proc = _run(module_command("pycoll.cli.main", ["--version"]), tmp_path)
    assert proc.stdout.strip() == f"pycoll {__version__}"


def test_the_suite_ignores_the_shells_settings_and_this_machines_calibration() -> None:
    """tests/conftest.py: no PYCOLL_* setting of the developer's shell, no calibration file of the
    machine (which would steer algorithm="auto") reaches the tests or the ranks they start."""
    kept = {"PYCOLL_DEBUG", "PYCOLL_CUDA", "PYCOLL_CUDA_ARCHS", "PYCOLL_BUILD_TYPE", "PYCOLL_TUNING_FILE"}
    assert os.environ.get("PYCOLL_TUNING_FILE") == "none"
    assert {n for n in os.environ if n.startswith("PYCOLL_")} <= kept
