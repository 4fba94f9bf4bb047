"""The engine's shape: it imports no course code, and its modules import each other without a cycle.

Imports are read from the source (``ast``), lazy ones inside functions included: a cycle hidden
behind a function-level import is still a cycle a reader has to untangle."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ENGINE = "inference_internals"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import statement stands."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)  # `from . import quant` imports a module
    return found


def engine_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / ENGINE).rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files and i != m} for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None.
    A package's ``__init__`` re-exporting its own modules is not a cycle of theirs: packages are
    left out as targets of their own submodules."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if m.startswith(n + "."):
                continue  # a module importing its own package (`from . import x`) resolves to x
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_engine_imports_no_course_code():
    offenders = {module_name(p): sorted(i for i in imports_of(p) if i.split(".")[0] == "inference_course")
                 for p in (SRC / ENGINE).rglob("*.py")}
    assert not {m: i for m, i in offenders.items() if i}, "the engine must not import the course"


def test_the_engine_has_no_import_cycle():
    assert find_cycle(engine_graph()) is None, f"import cycle: {' -> '.join(find_cycle(engine_graph()))}"


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_course_imports_the_engine():
    course = [imports_of(p) for p in (SRC / "inference_course").rglob("*.py")]
    assert any(i.split(".")[0] == ENGINE for found in course for i in found)
