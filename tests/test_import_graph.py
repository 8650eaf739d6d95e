"""The import graph of servers/: no circle among the launch modules, and the layers import only downwards.

Read with ast, never by importing: every `import` and `from ... import` statement counts, at module level and
inside functions alike (a lazy import is a dependency all the same; making an import lazy does not undo a
circle), except those under `if TYPE_CHECKING:`, which never run and exist only for annotations. A reference
written as a "module:attr" string (the engines' registry resolves those when asked) is not an import.

The layers, lowest first: servers/core (imports no other servers package), servers/engines and servers/runs
(each servers.core only, besides the standard library and third-party packages), then the servers (launch,
diagnostics, scaling, overlap, loop), which reach one another only through servers/engines, servers/runs or
servers/core. The top (servers/cli.py, servers/suite.py, servers/docs.py) assembles the servers and may import any
of them.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ROOT / "servers"
SERVER_PACKAGES = ("launch", "diagnostics", "scaling", "overlap", "loop")
# A server's imports of another server's modules, each with the reason it stands. Exactly these: an entry that no
# longer exists fails the test too, so that the list stays true.
CROSS_SERVER_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("servers.diagnostics.bandwidth", "servers.overlap.collectives"): "the bandwidth check on this machine runs the "
    "overlap server's collective benchmark (the same buffers, exact check and timing), not a second copy of it",
    ("servers.diagnostics.bandwidth", "servers.overlap.limits"): "the same benchmark's machine probe and its bounds",
    ("servers.diagnostics.bandwidth_probe", "servers.overlap.collectives"): "each probe rank times the collectives "
    "with the overlap server's code (collective_rank, plan_size, the table), so both servers measure alike",
    ("servers.diagnostics.bandwidth_probe", "servers.overlap.distributed"): "the probe ranks read their rank and "
    "world the way the overlap benchmarks' ranks do (RankInfo)",
    ("servers.diagnostics.server", "servers.launch.metrics"): "detect_stragglers on a training job reads the job's "
    "metrics.jsonl with the reader of the server that wrote it",
}
# Circles outside servers/launch that exist today, each with its reason; exactly these (launch has none at all).
KNOWN_CIRCLES: dict[tuple[str, ...], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of `tree`, at any depth, but those under `if TYPE_CHECKING:` (not their `else`)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(source: str, name: str, known: set[str], *, package: bool = False) -> set[str]:
    """The modules of `known` that module `name` (its text `source`) imports; "from pkg import mod" names the
    module mod, and "import a.b.c" the nearest known module that holds a.b.c."""
    parent = name if package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = parent.split(".")[: len(parent.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known] or [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in SERVERS.rglob("*.py") if "__pycache__" not in p.parts}
    known = set(files)
    return {
        name: imports_of(path.read_text(), name, known, package=path.name == "__init__.py")
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself), each sorted:
    every circle of the graph lies inside one of them (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def layer_of(module: str) -> str:
    """The layer of a module: "core", "engines", a server's package name, "top" (servers/cli.py, suite.py, docs.py,
    and a package's __main__, which only hands `python -m servers.X` to the command line) or "root" (servers' own
    __init__: the version, which every layer may read)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[-1] == "__main__":
        return "top"
    return parts[1] if len(parts) > 2 or (SERVERS / parts[1]).is_dir() else "top"


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if there == "root":
                continue
            if here == "core" and there != "core":
                problems.append(f"{module} imports {target}: servers/core imports no other servers package")
            elif here in ("engines", "runs") and there not in ("core", here):
                problems.append(f"{module} imports {target}: servers/{here} imports servers/core only")
            elif (
                here in SERVER_PACKAGES
                and there not in (here, "core", "engines", "runs")
                and (module, target) not in CROSS_SERVER_EXCEPTIONS
            ):
                problems.append(
                    f"{module} imports {target}: a server reaches another only through servers/engines or "
                    "servers/core (or add the pair to CROSS_SERVER_EXCEPTIONS with its reason)"
                )
    return problems


# ---- the checker on toy graphs ---------------------------------------------------------------------------------------
def test_cycles_finds_every_circle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}, "g": {"h"}, "h": {"g"}}
    assert cycles(graph) == [["a", "b", "c"], ["e"], ["g", "h"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_of_counts_lazy_and_from_imports_but_not_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import servers.core.errors\n"
        "from servers.launch import training\n"
        "from servers.launch.local import LocalBackend as L\n"
        "if TYPE_CHECKING:\n"
        "    from servers.launch.slurm import SlurmBackend\n"
        "def f():\n"
        "    from servers.launch.ray_backend import RayBackend\n"
        "    class C:\n"
        "        def g(self):\n"
        "            import servers.launch.kubernetes.client\n"
        "x = 'servers.launch.skypilot:SkyPilotBackend'\n"
    )
    known = {
        "servers.core.errors",
        "servers.launch",
        "servers.launch.training",
        "servers.launch.local",
        "servers.launch.slurm",
        "servers.launch.ray_backend",
        "servers.launch.kubernetes",
        "servers.launch.skypilot",
        "servers.launch.toy",
    }
    found = imports_of(source, "servers.launch.toy", known)
    assert found == {
        "servers.core.errors",
        "servers.launch.training",
        "servers.launch.local",
        "servers.launch.ray_backend",
        "servers.launch.kubernetes",
    }


def test_layering_rules_on_a_toy_graph() -> None:
    graph = {
        "servers.core.jobs": {"servers.launch.local"},
        "servers.engines.registry": {"servers.core.jobs", "servers.launch.slurm"},
        "servers.diagnostics.bandwidth": {"servers.launch.slurm", "servers.engines.registry"},
        "servers.launch.local": {"servers.core.jobs", "servers.engines.registry"},
        "servers.cli": {"servers.launch.local", "servers.diagnostics.bandwidth"},
        "servers.scaling.__main__": {"servers.cli"},  # an entry point, not a library module
        "servers.overlap.server": {"servers", "servers.core.jobs"},  # the version, from servers/__init__
    }
    problems = layering_violations(graph)
    assert [p.split(":")[0] for p in problems] == [
        "servers.core.jobs imports servers.launch.local",
        "servers.diagnostics.bandwidth imports servers.launch.slurm",
        "servers.engines.registry imports servers.launch.slurm",
    ]


# ---- the real graph ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_circle_among_the_launch_modules(graph: dict[str, set[str]]) -> None:
    launch = {
        m: {t for t in ts if t.startswith("servers.launch")}
        for m, ts in graph.items()
        if m.startswith("servers.launch")
    }
    assert "servers.launch.local" in launch and "servers.launch.slurm" in launch  # the graph was read
    assert cycles(launch) == []


def test_the_circles_elsewhere_are_the_known_ones(graph: dict[str, set[str]]) -> None:
    assert {tuple(c) for c in cycles(graph)} == set(KNOWN_CIRCLES)


def test_the_layers_import_only_downwards(graph: dict[str, set[str]]) -> None:
    assert layering_violations(graph) == []


def test_every_listed_exception_still_exists(graph: dict[str, set[str]]) -> None:
    stale = [pair for pair in CROSS_SERVER_EXCEPTIONS if pair[1] not in graph.get(pair[0], set())]
    assert stale == []
