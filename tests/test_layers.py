"""The layers point one way: no import circles, nothing below imports what is above it (read from the source).

Every ``import`` counts, at module level, inside a function or under
``TYPE_CHECKING``: a circle hidden in a lazy import is still a circle for the
reader. The layers, bottom up: ``shared`` (torch-free, both sides) <
``workers.batch`` (the packed batch) < kernels, models, pooling, backends <
the worker's engine; the gateway and the worker never import each other's
internals, and ``shared`` imports neither. ``integrations`` (Ray Data) sits on top: it runs the
offline API and nothing below imports it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> dict[str, set[str]]:
    """module -> the poolgate modules it imports."""
    files = {}
    for top in ("gateway", "workers", "shared", "integrations"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(("poolgate",) + parts).removesuffix(".__init__")] = path
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("poolgate."):
                deps.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("poolgate."))
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


GRAPH = _graph()


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, deps = work[-1]
            w = next(deps, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def _arrows(lower: tuple[str, ...], upper: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted((m, d) for m, deps in GRAPH.items() if m.startswith(lower) for d in deps if d.startswith(upper))


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others():
    assert _circles(GRAPH) == []


def test_the_packed_batch_is_the_workers_bottom_layer():
    assert _arrows(("poolgate.workers.batch",), ("poolgate.workers",)) == []
    below_engine = tuple(f"poolgate.workers.{p}" for p in ("batch", "kernels", "models", "pooling", "backends"))
    assert _arrows(below_engine, ("poolgate.workers.engine",)) == []
    assert _arrows(("poolgate.workers.kernels",), ("poolgate.workers.backends", "poolgate.workers.models")) == []


def test_shared_imports_neither_side_and_the_worker_never_the_gateway():
    assert _arrows(("poolgate.shared",), ("poolgate.gateway", "poolgate.workers")) == []
    assert _arrows(("poolgate.workers",), ("poolgate.gateway",)) == []


def test_the_integrations_sit_on_top_and_use_the_offline_api_not_the_gateway():
    below = ("poolgate.shared", "poolgate.workers", "poolgate.gateway")
    assert _arrows(below, ("poolgate.integrations",)) == []
    assert _arrows(("poolgate.integrations",), ("poolgate.gateway",)) == []
    assert ("poolgate.integrations.ray", "poolgate.workers.offline") in _arrows(("poolgate.integrations",), below)
