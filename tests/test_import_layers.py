"""The package imports only downward: no two alignctl modules import each other, directly or
through others, counting the imports inside functions (a lazy import hides a cycle from Python
but not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import alignctl

PACKAGE_DIR = Path(alignctl.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the alignctl modules it imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}

    def owner(target: str) -> str:
        while target and target not in files:
            target = target.rpartition(".")[0]
        return target

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(root.name):
                deps.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else owner(node.module)
                            for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(owner(a.name) for a in node.names if a.name.startswith(root.name))
        graph[name] = deps - {name, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_cycle_finder_sees_a_lazy_import_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "alignctl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from alignctl.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("def thing():\n    from alignctl.sub import a\n")
    (pkg / "c.py").write_text("import alignctl.sub.a\n")
    assert cycles(import_graph(pkg)) == [["alignctl.sub.a", "alignctl.sub.b"]]


def test_alignctl_has_no_import_cycles() -> None:
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 100 and "alignctl.trainers.rl_trainer" in graph["alignctl.trainers.dapo"]
    assert cycles(graph) == []
