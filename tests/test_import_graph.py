"""No import circle anywhere, and imports run one way: engram <- relay <- cli <- bench.

The graph is read from the source (ast), not from a running interpreter, so it holds
every import a module may run: at module level, inside functions (a lazy import that
closes a loop is still a circle: it only moves the failure to the first call that takes
that path) and under `if TYPE_CHECKING:` (a type that must be named from both sides is a
design circle even when it does not fail at run time). `from pkg import name` counts as
an import of `pkg.name` when that is a module of the project, else of `pkg`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("engram", "relay", "cli", "bench")  # each may import only the ones before it


def module_files(root: Path = ROOT, packages: Iterable[str] = LAYERS) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its `__init__.py`)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """`name` or its nearest enclosing module of the project (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, source: str, modules: Mapping[str, Path]) -> set[str]:
    """The project modules that module `name` imports anywhere in `source`."""
    is_package = modules[name].name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):  # every level: functions, TYPE_CHECKING
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(_known(alias.name, modules) or "")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its own package, `level - 1` levels up
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else _known(base, modules) or "")
    out.discard("")
    out.discard(name)
    return out


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), modules)
        for name, path in modules.items()
    }


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative),
    each sorted; those are the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(component: list[str], graph: Mapping[str, Iterable[str]]) -> str:
    """One circle as its modules and the imports between them."""
    inside = set(component)
    edges = [f"  {m} -> {', '.join(sorted(set(graph[m]) & inside))}" for m in component]
    return f"import circle of {len(component)} modules:\n" + "\n".join(edges)


def test_no_import_circle() -> None:
    modules = module_files()
    assert {"engram", "relay.config", "cli.commands.main", "bench.__main__"} <= modules.keys()
    graph = import_graph(modules)
    found = circles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_imports_run_one_way() -> None:
    """engram imports none of relay/cli/bench; relay no cli/bench; cli no bench."""
    graph = import_graph(module_files())
    rank = {package: i for i, package in enumerate(LAYERS)}
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if rank[target.split(".")[0]] > rank[module.split(".")[0]]
    )
    assert not wrong, "\n".join(wrong)


# --- controls: the detector sees what it must ---------------------------------------------


def test_control_circles_found_in_a_synthetic_graph() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"},
        "e": set(),
        "f": {"f"},  # a module naming itself is not a circle of modules
        "g": {"h"},
        "h": {"g", "outside"},  # g <-> h; an edge out of the graph is ignored
    }
    assert sorted(circles(graph)) == [["a", "b", "c"], ["g", "h"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_control_lazy_relative_and_type_only_imports_are_edges(tmp_path: Path) -> None:
    """A circle closed only by an import inside a function, under TYPE_CHECKING, or
    through `from pkg import module` is found, and named with its edges."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def later():\n    from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n"
    )
    (pkg / "d.py").write_text("from pkg.a import something\nimport os\n")
    modules = module_files(tmp_path, ["pkg"])
    graph = import_graph(modules)
    assert graph["pkg.sub.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.a"}
    found = circles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert "pkg.b -> pkg.sub.c" in describe(found[0], graph)
