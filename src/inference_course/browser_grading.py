"""Grading a code exercise on the website: Pyodide runs this module in a Web Worker
(book/_static/code_exercises_worker.js), with the export that ``CodeExercise.browser_export()``
wrote into the page when the chapter was built.

It holds no grading rule of its own. It defines the course's own code_exercises.py (shipped in
the export, with a stand-in for torch, which these exercises never touch) and calls the same
``CodeExercise.grade`` on the reader's function, with a reference that replays the library's
outcomes recorded at build time, case by case. So the verdicts, messages and hints are the
grader's by construction; tests/test_code_exercises_browser.py holds the two to the same answers.

Standard library only, and nothing here imports the course: this runs where torch does not.
"""
from __future__ import annotations

import ast
import json
import sys
import types


class _StandIn(types.ModuleType):
    """A module every attribute of which is a class of its own: ``isinstance(x, torch.Tensor)`` is
    False for every plain value, and ``torch.float32`` is a distinct key."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def install(modules: dict[str, str], stand_ins: list[str]) -> None:
    """Define each shipped module (dotted name -> source) once, parents as empty packages. The
    stand-ins exist only while the modules run their imports: a reader's ``import torch`` still
    fails as it should here."""
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update({name: _StandIn(name) for name in stand_ins})
    try:
        for name, source in modules.items():
            if name in sys.modules:
                continue
            parts = name.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent not in sys.modules:
                    package = types.ModuleType(parent)
                    package.__path__ = []
                    sys.modules[parent] = package
            module = types.ModuleType(name)
            module.__package__ = name.rpartition(".")[0]
            sys.modules[name] = module
            try:
                exec(compile(source, f"<{name}>", "exec"), module.__dict__)
            except BaseException:
                del sys.modules[name]
                raise
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _error(name: str, message: str) -> Exception:
    """An exception that prints as the library's did: its type's name and its message."""
    return type(name, (Exception,), {})(message)


def grade(export_json: str, source: str, progress=None) -> str:
    """Run the reader's ``source``, grade the function it defines; -> JSON {correct, message}.

    ``progress(i)`` is called as case i starts (the worker reports it, so the page can name the
    case that never returned when it stops a run that loops forever)."""
    export = json.loads(export_json)
    install(export["modules"], export["stand_ins"])
    from inference_course.code_exercises import Case, CodeExercise

    def verdict(correct: bool, message: str) -> str:
        return json.dumps({"correct": correct, "message": message})

    namespace = {"__name__": "__main__"}
    try:
        exec(compile(source, "<your code>", "exec"), namespace)
    except Exception as err:  # the reader's cell would stop here too, before any grading
        return verdict(False, f"Your code did not run: {type(err).__name__}: {err}")

    def maker(i: int, args: str):
        def make() -> tuple:
            if progress is not None:
                progress(i)
            return ast.literal_eval(args)
        return make

    outcomes = {c["args"]: c for c in export["cases"]}   # the same inputs, the same outcome
    replayed = []   # the library's outcome just replayed, which the next observation reports

    def reference(*args):
        want = outcomes[repr(args)]
        if export.get("observe") is not None:
            replayed.append(want)
        if want["error"] is not None:
            raise _error(*want["error"])
        return ast.literal_eval(want["observed"])

    observe = None
    if export.get("observe") is not None:   # the case compares the arguments' state too
        name, observe_source = export["observe"]
        defined = {}
        exec(compile(observe_source, f"<{name}>", "exec"), defined)

        def observe(args, result):
            # After the replayed reference: the state the library left, as recorded. After the
            # reader's function: the state it left, observed here.
            if replayed:
                return ast.literal_eval(replayed.pop()["observed"])
            return defined[name](args, result)

    cases = [Case(c["label"], maker(i, c["args"]), c["inputs"]) for i, c in enumerate(export["cases"])]
    exercise = CodeExercise(**export["exercise"], reference=reference, cases=lambda: cases, observe=observe)
    result = exercise.grade(namespace.get(exercise.name), rerun=export.get("rerun", "press Check again"))
    return verdict(result.correct, result.message)
