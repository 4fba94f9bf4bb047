"""The engine's shape: it imports no course code; its runtime never imports the measuring and teaching
modules (``analysis``); the course uses the engine's public names only; no package has an import cycle;
the stop rule is asked from one place in the runtime.

Imports are read from the source (``ast``), lazy ones inside functions included: a cycle hidden
behind a function-level import is still a cycle a reader has to untangle."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ENGINE = "inference_internals"
COURSE = "inference_course"
ANALYSIS = f"{ENGINE}.analysis"  # the measuring and teaching modules


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


def package_graph(package: str = ENGINE) -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / package).rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files and i != m} for m, p in files.items()}


engine_graph = package_graph


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


@pytest.mark.parametrize("package", [ENGINE, COURSE])
def test_no_package_has_an_import_cycle(package):
    cycle = find_cycle(package_graph(package))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_course_imports_the_engine():
    course = [imports_of(p) for p in (SRC / "inference_course").rglob("*.py")]
    assert any(i.split(".")[0] == ENGINE for found in course for i in found)


def runtime_modules() -> dict[str, Path]:
    """Every engine module but the measuring and teaching ones."""
    return {module_name(p): p for p in (SRC / ENGINE).rglob("*.py")
            if not module_name(p).startswith(ANALYSIS)}


def test_the_runtime_never_imports_the_measuring_modules():
    offenders = {m: sorted(i for i in imports_of(p) if i == ANALYSIS or i.startswith(ANALYSIS + "."))
                 for m, p in runtime_modules().items()}
    assert not {m: i for m, i in offenders.items() if i}, "the runtime imports analysis/"


def private_uses(source: str) -> list[str]:
    """Private names a module reaches into: ``from inference_internals... import _x``, and ``obj._x``
    on anything but ``self``/``cls`` (dunder names are Python's, ``_repr_html_`` and its kind IPython's
    display protocol: neither is private)."""
    def private(name):
        return name.startswith("_") and not name.startswith("__") and not (
            name.startswith(("_repr_", "_ipython_")) and name.endswith("_"))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ENGINE):
            found += [a.name for a in node.names if private(a.name)]
        elif isinstance(node, ast.Attribute) and private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(node.attr)
    return found


def test_the_course_uses_the_engines_public_names_only():
    offenders = {module_name(p): private_uses(p.read_text()) for p in (SRC / COURSE).rglob("*.py")}
    assert not {m: u for m, u in offenders.items() if u}, "the course reaches into private names"


def test_the_private_use_finder_finds_a_planted_one():
    assert sorted(private_uses("pool._take()\nfrom inference_internals.params import _Default")) == ["_Default", "_take"]
    assert private_uses("self._x = 1\nx.__class__\nfrom inference_internals import LLM") == []


STOP_RULE = {"finish_reason", "finish"}  # stop.py's rule, and its loop over several tokens


def stop_rule_calls(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))  # (Scheduler.finish is another thing)
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) in STOP_RULE
                                                or getattr(node.func, "attr", None) == "finish_reason")]


def test_the_stop_rule_is_asked_from_one_place_in_the_runtime():
    """The engine judges every emitted token in its scheduler's post-processing, and nowhere else; the
    chapters' reference loops (generate, speculative_generate, cuda_graph) ask the same rule themselves."""
    reference_loops = {f"{ENGINE}.generate", f"{ENGINE}.speculative", f"{ENGINE}.cuda_graph", f"{ENGINE}.stop"}
    sites = {m: stop_rule_calls(p) for m, p in runtime_modules().items() if m not in reference_loops}
    assert {m: s for m, s in sites.items() if s} == {f"{ENGINE}.engine.scheduler": sites[f"{ENGINE}.engine.scheduler"]}
    assert len(sites[f"{ENGINE}.engine.scheduler"]) == 1
