"""The shape a reader can hold (CONVENTIONS.md): no module over 600 lines outside migrations, no function
over 60 lines, and no import circle inside an app, counting the imports made inside functions (a circle
hidden by a function-level import is still a circle)."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {".venv", "var", "node_modules", ".git"}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not SKIPPED & set(p.relative_to(ROOT).parts) and "migrations" not in p.parts
    )


SOURCES = _sources()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_module_is_over_the_line_limit():
    over = {
        str(p.relative_to(ROOT)): n for p in SOURCES if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    }
    assert over == {}


def test_no_function_is_over_the_line_limit():
    over = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert over == []


def _imported(path: Path, module: str, known: set[str]) -> set[str]:
    """The project modules a file imports, anywhere in it (module level or inside a function)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base]).strip(".")
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


@pytest.mark.parametrize(
    "app", sorted({_module_name(p).split(".")[0] for p in SOURCES if "." in _module_name(p)})
)
def test_no_import_circle_inside_an_app(app):
    modules = {_module_name(p): p for p in SOURCES if _module_name(p).split(".")[0] == app}
    known = set(modules)
    graph = defaultdict(set)
    for module, path in modules.items():
        # A package's face hands names on: it is not a room of its own in a circle.
        if path.name == "__init__.py":
            continue
        graph[module] = {m for m in _imported(path, module, known) if modules[m].name != "__init__.py"}
    assert _cycles(graph) == []
