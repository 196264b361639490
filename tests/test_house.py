"""The shape of the house: no import cycle among the modules, no oversized module.

The import graph is read from the source with :mod:`ast`, without importing anything.
Its nodes are the modules under ``autosched/`` and ``bench/`` (imports of anything else
are not followed); there is an edge A -> B for every ``import B`` and ``from B import x``
anywhere in A, function and class bodies included, because an import inside a function
still ties A to B once it runs. Imports under ``if TYPE_CHECKING:`` are left out: that
block never executes (its ``else:`` branch counts). ``from pkg import name`` is an edge
to ``pkg.name`` when that is a module, else to ``pkg``; relative imports are resolved
against the importing module's package. Importing ``a.b.c`` also runs the ``__init__``
of ``a`` and ``a.b``, but those implicit edges to parent packages are not added: a
package that re-exports its children would otherwise close a cycle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autosched", "bench")
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: list[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in or under ``nodes``, skipping ``if TYPE_CHECKING:`` bodies."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse)
        else:
            yield from _imports(list(ast.iter_child_nodes(node)))


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (source at ``path``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports([tree]):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            child = f"{source}.{alias.name}"
            out.add(child if child in known else source)
    return out & known


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported_modules(name, path, known) for name, path in found.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the first module of ``component``, closed (first == last)."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not a cycle")


def test_the_graph_sees_known_edges():
    # Guards the parser itself: a graph with no edges would pass the cycle test vacuously.
    graph = import_graph()
    assert "autosched.errors" in graph["autosched.space.space"]
    assert "autosched.tuning.tune" in graph["autosched"]
    assert "bench.peers_sgemm" in graph["bench.peers_kt"]  # inside a function


def test_the_edges_follow_the_rules(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import p.a\n"
        "from . import b\n"
        "from .c import helper\n"
        "from .. import top\n"
        "from p import NAME\n"
        "if TYPE_CHECKING:\n"
        "    import p.hidden\n"
        "else:\n"
        "    import p.shown\n"
        "def f():\n"
        "    from p.d import thing\n"
    )
    known = {"p", "p.a", "p.b", "p.c", "p.d", "p.hidden", "p.shown", "p.sub", "top"}
    # As if the file were p/sub/mod.py: `.` is p.sub, `..` is p.
    assert imported_modules("p.sub.mod", source, known) == {"p.a", "p.sub", "p", "p.d", "p.shown"}
    assert imported_modules("p.mod", source, known) == {"p.a", "p.b", "p.c", "p", "p.d", "p.shown"}


def test_no_self_import():
    graph = import_graph()
    selfish = sorted(name for name, deps in graph.items() if name in deps)
    assert not selfish, f"modules that import themselves: {selfish}"


def test_no_import_cycle():
    graph = import_graph()
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles among the modules:\n" + "\n".join(
        f"  {' -> '.join(a_cycle(graph, c))}  (component: {', '.join(c)})" for c in cycles
    )


def test_no_module_over_the_line_limit():
    too_long = []
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                too_long.append(f"{rel}: {lines} lines")
    assert not too_long, f"modules over {MAX_LINES} lines:\n  " + "\n  ".join(too_long)
