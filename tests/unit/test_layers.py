"""Layers that import one way (docs/building.md, "Where each idea lives"), checked from the source without
importing it.

Every ``pycoll/**/*.py`` is parsed with :mod:`ast`; its imports (absolute and relative, at module level,
inside functions and under ``if TYPE_CHECKING:``) make the module import graph. Type-only imports count:
they never run, but a module that names another's types depends on it as much as one that calls it, and
a circle that only they close is a circle of parts that cannot be built or tested one without the other.
The rules are data, one table (:data:`RULES`: layers, forbidden imports, the modules that
may read the environment, kernel and binding directories); each test checks one rule over the real tree,
and each rule has a self-test that builds a tiny tree breaking it in ``tmp_path`` and expects the checker
to catch it.

A module that does not exist (yet) simply has no edges: the rules may name it in advance.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------------
# The rules (one table)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    #: Module prefix -> layer; the longest prefix that matches a module decides.
    layers: dict[str, str]
    #: (importer, imported, why): an edge from a module matching the first to one matching the second
    #: fails. Each side is a layer name or a module prefix (``pycoll.x`` matches pycoll.x and pycoll.x.*).
    forbidden: list[tuple[str, str, str]]
    #: The only modules that may read environment variables.
    env_modules: frozenset[str]
    #: Directories (relative to the repository) whose files may include only standard headers and
    #: headers of these same directories.
    kernel_dirs: tuple[str, ...]
    #: Directories whose sources may include the headers ``binding_headers`` matches; nothing else may.
    binding_dirs: tuple[str, ...]
    binding_headers: re.Pattern[str]


_TRANSPORT = "algorithms produce plans and never import a transport"
RULES = Rules(
    # Every pycoll module not named below (the root modules, pycoll.algorithms, pycoll.compression,
    # pycoll.bootstrap, pycoll.tuning.model / links / persist, pycoll.codes, pycoll.auto, pycoll.env...)
    # is core.
    layers={
        "pycoll": "core",
        # tools: the CLI, benchmarking, calibration, the doctor (they sit on top and import the core)
        "pycoll.cli": "tools",
        "pycoll.run": "tools",  # ``python -m pycoll.run``: the launcher CLI
        "pycoll.bench": "tools",
        "pycoll.tuning.calibrate": "tools",
        "pycoll.doctor": "tools",
        "pycoll.testing": "tools",  # test helpers shipped with pycoll (the emulated CUDA kernels)
        # integrations: imported only by users who have what they integrate with
        "pycoll.torch": "integrations",
        "pycoll.elastic": "integrations",  # the elastic training loop, over the core's shrink / grow
    },
    forbidden=[
        (
            "core",
            "tools",
            "the core never imports the CLI, bench, calibration or the doctor (not even lazily)",
        ),
        ("core", "integrations", "the core never imports the torch layer (not even lazily)"),
        ("pycoll.algorithms", "pycoll.comm", _TRANSPORT),
        ("pycoll.algorithms", "pycoll.gpu", _TRANSPORT),
        ("pycoll.algorithms", "pycoll.nccl", _TRANSPORT),
        ("pycoll.algorithms", "pycoll._C", "algorithms are pure Python: no native transport or kernels"),
        ("pycoll.algorithms", "pycoll.bootstrap", "algorithms produce plans and never do I/O"),
        ("pycoll.algorithms", "pycoll.api", "algorithms sit below the API"),
    ],
    # pycoll.bootstrap.env parses the launchers' variables (RANK, OMPI_COMM_WORLD_*, SLURM_*...).
    # Passing os.environ whole to a child process is not a read.
    env_modules=frozenset({"pycoll.env", "pycoll.bootstrap.env"}),
    # Element code usable from host C++ and CUDA alike: no pybind11, torch, NCCL or CUDA runtime headers.
    kernel_dirs=("csrc/kernels",),
    # The bindings, nothing below them (csrc/engine builds as a library without pybind11).
    binding_dirs=("csrc/python",),
    binding_headers=re.compile(r"^(pybind11|torch|ATen|c10|Python\.h)"),
)

#: C and C++ standard library headers (what "standard" means for ``kernel_dirs``).
STANDARD_HEADERS: frozenset[str] = frozenset(
    """
    algorithm any array atomic bit bitset cassert cctype cerrno cfenv cfloat charconv chrono cinttypes
    climits clocale cmath compare complex concepts condition_variable cstdarg cstddef cstdint cstdio
    cstdlib cstring ctime cuchar cwchar cwctype deque exception execution filesystem forward_list fstream
    functional future initializer_list iomanip ios iosfwd iostream istream iterator limits list locale map
    memory memory_resource mutex new numbers numeric optional ostream queue random ranges ratio regex
    scoped_allocator set shared_mutex span sstream stack stdexcept streambuf string string_view system_error
    thread tuple type_traits typeindex typeinfo unordered_map unordered_set utility valarray variant vector
    version assert.h ctype.h errno.h float.h inttypes.h limits.h math.h stdarg.h stddef.h stdint.h stdio.h
    stdlib.h string.h time.h
    """.split()
)

# ---------------------------------------------------------------------------------------------------------
# The checkers (pure functions of a tree, so that the self-tests can run them on synthetic ones)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # "path:line"


@dataclass
class Tree:
    """The modules of a package tree and the import edges between them."""

    modules: dict[str, Path] = field(default_factory=dict)  # module name -> file
    edges: list[Edge] = field(default_factory=list)
    packages: set[str] = field(default_factory=set)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node, except the bodies of ``if TYPE_CHECKING:`` (their ``else:`` runs, so it counts)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def load_tree(root: Path, package: str = "pycoll", *, type_only: bool = True) -> Tree:
    """Parse every ``.py`` under ``root/package`` (``.pyi`` stubs and native modules count as modules
    without edges) and collect the import edges among the package's modules; ``type_only``: with the
    imports under ``if TYPE_CHECKING:`` (those that never run)."""
    tree = Tree()
    base = root / package
    for path in sorted(base.rglob("*")):
        if path.suffix in (".py", ".pyi") or (path.suffix == ".so" and path.name.count(".") >= 1):
            name = module_name(path.with_name(path.name.split(".")[0] + ".py"), root)
            if path.suffix == ".py" or name not in tree.modules:
                tree.modules[name] = path
            if path.name == "__init__.py":
                tree.packages.add(name)

    def resolve(name: str) -> str | None:
        """The pycoll module that ``import name`` runs last: the longest existing prefix."""
        while name:
            if name in tree.modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for name, path in tree.modules.items():
        if path.suffix != ".py":
            continue
        where = path.relative_to(root)
        syntax = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(syntax) if type_only else _runtime_nodes(syntax):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = name if name in tree.packages else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    source = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    source = node.module or ""
                # ``from a import b``: a.b when b is a module, else a itself.
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in tree.modules else source
                    for alias in node.names
                ]
            for target in targets:
                if target != package and not target.startswith(package + "."):
                    continue
                resolved = resolve(target)
                if resolved is not None and resolved != name:
                    tree.edges.append(Edge(name, resolved, f"{where}:{node.lineno}"))
    return tree


def layer_of(module: str, layers: dict[str, str]) -> str | None:
    best = None
    for prefix, layer in layers.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def _matches(module: str, side: str, layers: dict[str, str]) -> bool:
    if side in set(layers.values()):
        return layer_of(module, layers) == side
    return module == side or module.startswith(side + ".")


def find_cycles(tree: Tree) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a self-loop), as a path
    ``a -> b -> ... -> a`` of the modules involved."""
    graph: dict[str, set[str]] = {m: set() for m in tree.modules}
    for e in tree.edges:
        graph[e.importer].add(e.imported)
    # Tarjan's strongly connected components (iterative).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    cycles: list[list[str]] = []
    for component in components:
        members = set(component)
        for first in component:  # the shortest cycle through each member (each cycle reported once)
            cycle = _shortest_cycle(graph, members, first)
            rotations = {tuple(cycle[i:-1] + cycle[:i]) for i in range(len(cycle) - 1)}
            if not any(tuple(c[:-1]) in rotations for c in cycles):
                cycles.append(cycle)
    return cycles


def _shortest_cycle(graph: dict[str, set[str]], members: set[str], first: str) -> list[str]:
    """``first -> ... -> first`` through ``members`` only, found breadth first."""
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [first, *reversed(path[:-1]), first]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{first} is in a strongly connected component but on no cycle")


def edge_where(tree: Tree, a: str, b: str) -> str:
    return ", ".join(sorted({e.where for e in tree.edges if e.importer == a and e.imported == b}))


def forbidden_edges(tree: Tree, rules: Rules = RULES) -> list[str]:
    found = []
    for e in tree.edges:
        for importer, imported, why in rules.forbidden:
            if _matches(e.importer, importer, rules.layers) and _matches(e.imported, imported, rules.layers):
                found.append(f"{e.where}: {e.importer} imports {e.imported} ({why})")
    return sorted(set(found))


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` / ``os.environb`` (or a bare ``environ`` imported from os)."""
    if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb"):
        return isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in ("environ", "environb")


_READ_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__", "__contains__"})


def env_reads(path: Path, imports_from_os: bool | None = None) -> list[tuple[int, str]]:
    """Lines of ``path`` that read environment variables: ``os.environ.get(...)`` (and setdefault, pop),
    ``os.environ[...]`` (loads), ``... in os.environ``, ``os.getenv(...)``, and the same through names
    imported from os (``from os import environ, getenv``)."""
    syntax = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    from_os: set[str] = set()
    for node in ast.walk(syntax):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            from_os.update(alias.asname or alias.name for alias in node.names)

    def environ(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in from_os and node.id in ("environ", "environb")
        return _is_environ(node)

    reads = []
    for node in ast.walk(syntax):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _READ_METHODS and environ(func.value):
                reads.append((node.lineno, f"os.environ.{func.attr}(...)"))
            elif isinstance(func, ast.Attribute) and func.attr in ("getenv", "getenvb"):
                if isinstance(func.value, ast.Name) and func.value.id == "os":
                    reads.append((node.lineno, f"os.{func.attr}(...)"))
            elif isinstance(func, ast.Name) and func.id in ("getenv", "getenvb") and func.id in from_os:
                reads.append((node.lineno, f"{func.id}(...)"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and environ(node.value):
            reads.append((node.lineno, "os.environ[...]"))
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and environ(right):
                    reads.append((node.lineno, "... in os.environ"))
    return sorted(set(reads))


def env_violations(tree: Tree, root: Path, rules: Rules = RULES) -> list[str]:
    found = []
    for name, path in sorted(tree.modules.items()):
        if path.suffix != ".py" or name in rules.env_modules:
            continue
        for line, what in env_reads(path):
            found.append(f"{path.relative_to(root)}:{line}: {what} (settings are read in pycoll/env.py)")
    return found


_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
_SOURCES = (".h", ".hpp", ".cuh", ".cc", ".cpp", ".cu")


def include_violations(root: Path, rules: Rules = RULES) -> list[str]:
    """Kernel files that include anything but standard headers and kernel headers; files outside the
    bindings that include pybind11 / torch / Python headers."""
    kernel_dirs, binding_dirs = rules.kernel_dirs, rules.binding_dirs
    found = []
    csrc = root / "csrc"
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in _SOURCES):
        rel = path.relative_to(root).as_posix()
        in_kernels = any(rel.startswith(d + "/") for d in kernel_dirs)
        in_bindings = any(rel.startswith(d + "/") for d in binding_dirs)
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _INCLUDE.finditer(text):
            bracket, header = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            if not in_bindings and rules.binding_headers.match(header):
                found.append(f"{rel}:{line}: includes <{header}>: only {', '.join(binding_dirs)} may")
            if not in_kernels:
                continue
            if bracket == "<" and header in STANDARD_HEADERS:
                continue
            local = (path.parent / header, csrc / header, root / header)
            kernel_header = any(
                p.is_file() and any(p.resolve().is_relative_to((root / d).resolve()) for d in kernel_dirs)
                for p in local
            )
            if bracket == '"' and kernel_header:
                continue
            shown = f"<{header}>" if bracket == "<" else f'"{header}"'
            found.append(
                f"{rel}:{line}: includes {shown}: kernel files include only standard headers and other "
                "kernel headers"
            )
    return found


# ---------------------------------------------------------------------------------------------------------
# The rules over the real tree
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pycoll_tree() -> Tree:
    return load_tree(ROOT)


def test_the_graph_is_read(pycoll_tree: Tree) -> None:
    # A sanity check that the parser sees the package: a graph without edges would pass every rule.
    assert "pycoll.api" in pycoll_tree.modules and "pycoll.comm" in pycoll_tree.modules
    assert any(e.importer == "pycoll.api" and e.imported == "pycoll.comm" for e in pycoll_tree.edges)


def test_no_import_cycles(pycoll_tree: Tree) -> None:
    cycles = find_cycles(pycoll_tree)
    lines = []
    for cycle in cycles:
        steps = [f"{a} -> {b} ({edge_where(pycoll_tree, a, b)})" for a, b in zip(cycle, cycle[1:])]
        lines.append(" -> ".join(cycle) + "\n    " + "\n    ".join(steps))
    assert not cycles, "import cycles among pycoll modules:\n  " + "\n  ".join(lines)


def test_layers_import_one_way(pycoll_tree: Tree) -> None:
    found = forbidden_edges(pycoll_tree)
    assert not found, "imports against the layers:\n  " + "\n  ".join(found)


def test_environment_is_read_in_env_modules(pycoll_tree: Tree) -> None:
    found = env_violations(pycoll_tree, ROOT)
    assert not found, "environment reads outside pycoll/env.py:\n  " + "\n  ".join(found)


def test_kernel_and_binding_includes() -> None:
    found = include_violations(ROOT)
    assert not found, "includes against the layers:\n  " + "\n  ".join(found)


# ---------------------------------------------------------------------------------------------------------
# Self-tests: a tiny tree that breaks each rule is caught
# ---------------------------------------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_self_cycle_is_caught_with_its_path(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pycoll/__init__.py": "",
            "pycoll/a.py": "from pycoll.b import x\n",
            "pycoll/b.py": "def f():\n    from . import c\n",  # function-level, relative
            "pycoll/c.py": "import pycoll.a.inner\n",  # resolves to pycoll.a
            "pycoll/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pycoll.a\n",
        },
    )
    tree = load_tree(root)
    assert find_cycles(tree) == [["pycoll.a", "pycoll.b", "pycoll.c", "pycoll.a"]]
    # An import under TYPE_CHECKING is an edge (it is left out only when asked: type_only=False); its else
    # branch is one either way.
    assert any(e.importer == "pycoll.d" and e.imported == "pycoll.a" for e in tree.edges)
    assert not any(e.importer == "pycoll.d" for e in load_tree(root, type_only=False).edges)
    _write(root, {"pycoll/d.py": "if TYPE_CHECKING:\n    pass\nelse:\n    import pycoll.a\n"})
    assert any(
        e.importer == "pycoll.d" and e.imported == "pycoll.a" for e in load_tree(root, type_only=False).edges
    )


def test_self_a_cycle_closed_by_a_type_only_import_is_caught(tmp_path: Path) -> None:
    """comm imports dispatch, and dispatch names the Communicator's type only: still a circle."""
    root = _write(
        tmp_path,
        {
            "pycoll/__init__.py": "",
            "pycoll/comm.py": "from pycoll.dispatch import Dispatcher\n",
            "pycoll/dispatch.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pycoll.comm import Communicator\n"
            ),
        },
    )
    assert find_cycles(load_tree(root)) == [["pycoll.comm", "pycoll.dispatch", "pycoll.comm"]]
    assert find_cycles(load_tree(root, type_only=False)) == []


def test_self_relative_imports_resolve(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pycoll/__init__.py": "",
            "pycoll/x.py": "",
            "pycoll/sub/__init__.py": "from .mod import y\nfrom .. import x\n",
            "pycoll/sub/mod.py": "from ..x import z\nfrom . import other\n",
            "pycoll/sub/other.py": "",
        },
    )
    edges = {(e.importer, e.imported) for e in load_tree(root).edges}
    assert edges == {
        ("pycoll.sub", "pycoll.sub.mod"),
        ("pycoll.sub", "pycoll.x"),
        ("pycoll.sub.mod", "pycoll.x"),
        ("pycoll.sub.mod", "pycoll.sub.other"),
    }


@pytest.mark.parametrize(
    "importer, imported",
    [
        ("pycoll/comm.py", "pycoll.cli.bench"),  # core -> tools
        ("pycoll/algorithms/ring.py", "pycoll.tuning.calibrate"),  # core -> tools
        ("pycoll/tuning/persist.py", "pycoll.bench.timing"),  # core -> tools (modules to come)
        ("pycoll/api.py", "pycoll.doctor"),  # core -> tools
        ("pycoll/env.py", "pycoll.torch.hooks"),  # core -> integrations
        ("pycoll/algorithms/tree.py", "pycoll.comm"),  # algorithms -> transports
        ("pycoll/algorithms/tree.py", "pycoll._C"),
    ],
)
def test_self_forbidden_import_is_caught(tmp_path: Path, importer: str, imported: str) -> None:
    target = imported.replace(".", "/") + ".py"
    files = {importer: f"def lazy():\n    import {imported}\n", target: ""}
    for rel in list(files):
        parts = Path(rel).parts
        for i in range(1, len(parts)):
            files.setdefault("/".join(parts[:i]) + "/__init__.py", "")
    tree = load_tree(_write(tmp_path, files))
    found = forbidden_edges(tree)
    assert len(found) == 1 and imported in found[0], found


def test_self_allowed_imports_pass(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pycoll/__init__.py": "",
            "pycoll/comm.py": "import pycoll.algorithms\n",
            "pycoll/algorithms/__init__.py": "",
            "pycoll/cli/__init__.py": "import pycoll.comm\nimport pycoll.torch\n",
            "pycoll/torch/__init__.py": "import pycoll.comm\n",
        },
    )
    tree = load_tree(root)
    assert forbidden_edges(tree) == [] and find_cycles(tree) == []


def test_self_environment_read_is_caught(tmp_path: Path) -> None:
    reads = [
        "os.environ.get('PYCOLL_X')",
        "os.environ['PYCOLL_X']",
        "'PYCOLL_X' in os.environ",
        "os.getenv('PYCOLL_X')",
        "os.environ.setdefault('PYCOLL_X', '1')",
    ]
    files = {"pycoll/__init__.py": "", "pycoll/env.py": "import os\nX = os.environ.get('PYCOLL_X')\n"}
    files["pycoll/comm.py"] = "import os\n" + "".join(f"v{i} = {r}\n" for i, r in enumerate(reads))
    files["pycoll/bootstrap/__init__.py"] = ""
    files["pycoll/bootstrap/env.py"] = "import os\nRANK = os.environ['RANK']\n"
    files["pycoll/run.py"] = "from os import environ, getenv\nA = environ.get('X')\nB = getenv('Y')\n"
    # Passing the environment whole to a child, or writing to it, is no read.
    files["pycoll/spawn.py"] = "import os\nenv = {**os.environ, 'A': '1'}\nos.environ['B'] = '2'\n"
    root = _write(tmp_path, files)
    found = env_violations(load_tree(root), root)
    assert [f.split(":")[0:2] for f in found] == [["pycoll/comm.py", str(i)] for i in range(2, 7)] + [
        ["pycoll/run.py", "2"],
        ["pycoll/run.py", "3"],
    ], found


def test_self_kernel_includes_are_caught(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "csrc/kernels/ok.h": '#include <cstdint>\n#include "kernels/types.h"\n#include "types.h"\n',
            "csrc/kernels/types.h": "#include <cstddef>\n",
            "csrc/kernels/bad.h": (
                '#include <nccl.h>\n#include "transport/shm.h"\n#include <cuda_runtime.h>\n'
            ),
            "csrc/transport/shm.h": "#include <vector>\n",
            "csrc/engine/executor.cc": "#include <pybind11/pybind11.h>\n",
            "csrc/python/module.cc": "#include <pybind11/pybind11.h>\n#include <torch/extension.h>\n",
        },
    )
    found = include_violations(root)
    assert [f.split(":")[0:2] for f in found] == [
        ["csrc/engine/executor.cc", "1"],
        ["csrc/kernels/bad.h", "1"],
        ["csrc/kernels/bad.h", "2"],
        ["csrc/kernels/bad.h", "3"],
    ], found


# ---------------------------------------------------------------------------------------------------------
# The leaf of shared codes mirrors the native side
# ---------------------------------------------------------------------------------------------------------


def test_codes_is_a_leaf(pycoll_tree: Tree) -> None:
    assert [e for e in pycoll_tree.edges if e.importer == "pycoll.codes"] == []


def test_codes_match_the_native_module() -> None:
    from pycoll import _C, codes

    assert tuple(_C.COLLECTIVE_NAMES) == codes.COLLECTIVE_NAMES
    assert tuple(_C.ALGORITHM_NAMES) == codes.ALGORITHM_NAMES
    assert dict(_C.ERROR_KINDS) == codes.ERROR_KIND_CODES
