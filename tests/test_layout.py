"""The shape of the code under playground/ (issue 16): read from the source with ``ast``, no import.

* the import graph of ``playground`` has no cycle (every import counts, also those inside functions:
  a lazy import is still a dependency, only a later one);
* no file under ``playground/`` is over :data:`MAX_LINES` lines;
* no code under ``playground/`` mentions README (figures live in data files, not in prose);
* nothing outside ``playground/engine/`` imports an engine submodule: only ``from playground.engine
  import ...``, the engine's public API.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "playground"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under playground/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, module, imported name or None)`` for every import in the file, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(node.lineno, module, a.name) for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the playground modules it imports. ``from package import name`` points at the
    submodule ``package.name`` when there is one, else at ``package``."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for _, module, item in _imports(name, path):
            target = f"{module}.{item}" if item and f"{module}.{item}" in modules else module
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                cycle = visit(w)
                if cycle:
                    return cycle
        state[v] = 2
        path.pop()
        return None
    for v in sorted(graph):
        if v not in state:
            cycle = visit(v)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    """The checker itself: a two-module circle and a self-contained chain."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_file_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_no_code_mentions_readme():
    hits = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in PACKAGE.rglob("*.py")
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "readme" in line.lower()]
    assert not hits, "README cited at " + ", ".join(hits)


def test_only_the_engine_imports_engine_submodules():
    bad = []
    for name, path in _modules().items():
        if name == "playground.engine" or name.startswith("playground.engine."):
            continue
        for line, module, _ in _imports(name, path):
            if module.startswith("playground.engine."):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not bad, "\n".join(dict.fromkeys(bad))


def test_test_modules_have_unique_names():
    """pytest imports tests/ and tests/browser/ modules by their base names (no packages), so two
    modules with one name fail the whole run at collection (it happened twice)."""
    tests = Path(__file__).resolve().parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
