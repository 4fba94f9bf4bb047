"""Code exercises: the reader writes one function of the chapter's mechanism; a grader runs it.

    ex = CodeExercise(title, prompt, name="rms_norm", stub=..., solution=..., hint=...,
                      reference=library_function, cases=make_cases)
    ex.show()         # the prompt, a note for the website, collapsed hint and solution
    ex.check(fn)      # in the reader's cell, after their def: a Check button and the verdict
    ex.grade(fn)      # -> Verdict, headless

The grader runs the reader's function and the library's ``reference`` on the same cases
(seeded random ones and edge cases, each built fresh for each call, so a function that
writes into its inputs spoils nothing) and stops at the first that differs: the message
names the case, shows its inputs, the expected and the returned value (or the exception),
and ends with the hint. A stub that raises NotImplementedError is "not implemented yet",
never an error, so a notebook runs whole with every stub unfilled.

A case compares what ``observe(args, result)`` returns, by default the result itself: an
exercise whose function changes its arguments (a block pool, a cache buffer) observes their
state too. Where the reference raises, the reader's function must raise as well (any
exception), and the observed state must still match: bad input corrupts nothing.

A call of the reader's function that has not returned after ``TIME_LIMIT_S`` seconds (each case is
tiny: the library answers in milliseconds) is stopped, and the verdict names the case and the line
it was running: a loop that never ends fails its case instead of freezing the kernel. The stop is a
``SIGALRM`` timer that raises into the function's Python code (Linux and macOS, in the main thread,
where Jupyter runs cells and widget callbacks); a single call into C that never returns is not
interrupted, and where there is no such timer (Windows, another thread) the call runs unlimited.
On the website, the page stops the Web Worker that runs the reader's code (``BROWSER_TIME_LIMIT_S``).

On the website there is no kernel. Where the function is plain Python (its cases and the
library's answers are numbers, strings and lists, and it imports only the standard library and
plain functions of the library), ``browser_export()`` records every case and the library's
outcome for it when the page is built, and the page grades the reader's code in the browser:
Pyodide runs ``browser_grading.py``, which calls this module's own ``grade`` (same verdicts,
messages and hints; "press Check again" where Jupyter says "run its cell again"). An exercise
that compares its arguments' state (a list filled in place) travels too when its ``observe`` is a
plain function. The others show, on the website, the stub, the hint and the solution, and say
that they are graded in Jupyter (`make lab`). The notebook's stub cells are tagged `remove-cell`:
the website has the editor or the note instead, and the page's "write it in the cell below" is
Jupyter's only (``JUPYTER_ONLY_CLASS``, hidden by the website's stylesheet).
"""
from __future__ import annotations

import ast
import html
import inspect
import json
import linecache
import math
import signal
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import exercises
from .exercises import CHECKER_CLASS, NEEDS_JUPYTER_CLASS, Verdict, _markdown

CODE_EXERCISE_CLASS = "code-exercise"
NOT_IMPLEMENTED = "Not implemented yet"
# How a reader grades again, which ends the verdict on an unfilled stub: Jupyter's and the website's.
JUPYTER_RERUN = "run its cell again"
BROWSER_RERUN = "press Check again"
# Text that only Jupyter shows (the website's stylesheet hides it): the notebook's own cell and Check.
JUPYTER_ONLY_CLASS = "exercise-jupyter-only"
TIME_LIMIT_S = 10.0  # per case, for the reader's function: a case takes the library milliseconds
# Per dtype, the (rtol, atol) two correct implementations stay within: one rounding of the type.
# The atol covers a sum of two rounded products that cancel (RoPE's x·cos + rotate(x)·sin).
TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-5, 1e-5),
              torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
# The website's editor, Check button and verdict (book/_static/code_exercises.js); data-export
# holds browser_export().
BROWSER_CLASS = "code-exercise-browser"
# How long the website lets one case run before it stops the reader's code (a loop that never
# ends must not freeze the page): a case takes the library milliseconds, Pyodide a few times more.
BROWSER_TIME_LIMIT_S = 10


def runner_source() -> str:
    """The grading module Pyodide runs, as text. Looked up when the site is built, not at import:
    this module is itself shipped to the browser, where it has no file."""
    return Path(__file__).with_name("browser_grading.py").read_text()


def timed_out_message(label: str, seconds: float, inputs: str, hint: str, where: str = "") -> str:
    """The verdict on a case stopped after ``seconds`` (``where``: the line it was running, if known)."""
    return (f"Case “{label}” did not finish within {seconds:g} s and was stopped{where}. Inputs: {inputs}. "
            f"A loop that never ends? Check that each pass moves towards its exit. Hint: {hint}")


@dataclass(frozen=True)
class Case:
    """One input of the grader: ``make()`` builds fresh arguments (a tuple) for one call."""
    label: str
    make: Callable[[], tuple]
    inputs: str | None = None   # how the message shows the inputs, when repr would not do


@dataclass(frozen=True)
class _Outcome:
    observed: Any
    error: BaseException | None = None


class _OverTime(BaseException):
    """Raised into the reader's function when its time is up. A BaseException, so the
    function's own ``except Exception`` does not swallow it."""


class _TimedOut(Exception):
    def __init__(self, where: str):
        self.where = where


def call_with_limit(fn: Callable, args: tuple, seconds: float):
    """``fn(*args)``, stopped with ``_TimedOut`` (saying where it was) after ``seconds``.

    A one-shot ``SIGALRM`` timer: the handler raises into whatever Python code runs then. One shot,
    so at most one signal arrives whatever the timing; the previous handler and any outer timer
    (pytest-timeout's, say) are put back as they were. Without the timer it calls ``fn`` unlimited.
    """
    # In the browser (Pyodide: emscripten) the page's Web Worker is what stops a run that loops
    if (sys.platform == "emscripten" or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        return fn(*args)

    def stop(signum, frame):
        raise _OverTime

    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _OverTime as over:
        raise _TimedOut(_where(fn, over.__traceback__)) from None
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer_left:  # the outer timer keeps its deadline (due now if it passed meanwhile)
            left = max(outer_left - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def _where(fn: Callable, tb) -> str:
    """Where the reader's code was when stopped: the innermost frame from the file (or notebook
    cell) that defined ``fn``, e.g. " in merge_word(), line 6: `while i < len(word):`"."""
    source = getattr(getattr(fn, "__code__", None), "co_filename", None)
    frame = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == source:
            frame = tb
        tb = tb.tb_next
    if frame is None:
        return ""
    text = linecache.getline(source, frame.tb_lineno).strip()
    return f" in {frame.tb_frame.f_code.co_name}(), line {frame.tb_lineno}" + (f": `{text}`" if text else "")


def show_value(x: Any, limit: int = 24) -> str:
    """A value as a reader can read it in a message: small tensors in full, big ones by shape."""
    if isinstance(x, torch.Tensor):
        head = f"tensor(shape={list(x.shape)}, dtype={str(x.dtype).removeprefix('torch.')}"
        if x.numel() > limit:
            return head + ")"
        values = x.detach().cpu().double() if x.is_floating_point() else x.detach().cpu()
        return head + f", values={_round(values.tolist())})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {show_value(v, limit)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(show_value(v, limit) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, float):
        return f"{x:.6g}"
    return repr(x)


def _round(v):
    if isinstance(v, list):
        return [_round(u) for u in v]
    return float(f"{v:.4g}") if isinstance(v, float) and math.isfinite(v) else v


def differ(expected: Any, got: Any, where: str = "") -> str | None:
    """None when ``got`` matches ``expected``, else what differs, e.g. "item 1: expected 3, got 4".

    Tensors must match in shape and dtype, and in value to one rounding of their dtype (inf
    and nan included); lists and tuples item by item, dicts key by key (an observed state);
    numbers to 1e-9 relative; the rest by ==.
    """
    at = f" at {where}" if where else ""
    if isinstance(expected, dict) and isinstance(got, dict) and expected.keys() == got.keys():
        for key in expected:
            problem = differ(expected[key], got[key], f"{where}.{key}" if where else str(key))
            if problem:
                return problem
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor{at}, got {type(got).__name__} {show_value(got)}"
        if got.shape != expected.shape:
            return f"expected shape {list(expected.shape)}{at}, got {list(got.shape)}"
        if got.dtype != expected.dtype:
            return f"expected dtype {expected.dtype}{at}, got {got.dtype}"
        e, g = expected.detach().cpu(), got.detach().cpu()
        if e.is_floating_point():
            rtol, atol = TOLERANCES.get(e.dtype, (1e-5, 1e-6))
            bad = ~torch.isclose(g.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True)
        else:
            bad = g != e
        if bad.any():
            first = [int(i) for i in bad.nonzero()[0]]
            index = "[" + ", ".join(map(str, first)) + "]"
            return (f"{int(bad.sum())} of {bad.numel()} values differ{at}; the first at {index}: "
                    f"expected {show_value(e[tuple(first)].item())}, got {show_value(g[tuple(first)].item())}")
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"expected a {type(expected).__name__}{at}, got {type(got).__name__} {show_value(got)}"
        if len(got) != len(expected):
            return f"expected {len(expected)} items{at}, got {len(got)}: {show_value(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = differ(e, g, f"{where}[{i}]" if where else f"item {i}")
            if problem:
                return problem
        return None
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            return None
    elif type(got) is type(expected) or (isinstance(expected, int) and isinstance(got, int)
                                         and not isinstance(got, bool)):
        if got == expected:
            return None
    return f"expected {show_value(expected)}{at}, got {show_value(got)}"


# --- the website's export ------------------------------------------------------------------------

def _plain(x: Any) -> bool:
    """A value that repr writes and ast.literal_eval reads back as the same value and type."""
    if type(x) in (list, tuple):
        return all(map(_plain, x))
    if type(x) is dict:
        return all(_plain(k) and _plain(v) for k, v in x.items())
    if type(x) is float:
        return math.isfinite(x)
    return x is None or type(x) in (bool, int, str)


def _top(module: str) -> str:
    return module.partition(".")[0]


def _imports(source: str, top_level: bool = False) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each import statement, or each one the module runs
    as it loads (``top_level``); names empty for `import m`."""
    found = []
    tree = ast.parse(source)
    for node in tree.body if top_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _function_source(fn: Any) -> str | None:
    """A library function as source the browser can define: its imports, then its def. None when
    it needs more than the standard library (or is not a plain function)."""
    if not inspect.isfunction(fn) or fn.__closure__:
        return None
    lines = []
    for name, value in inspect.getclosurevars(fn).globals.items():
        if inspect.ismodule(value) and _top(value.__name__) in sys.stdlib_module_names:
            lines.append(f"import {value.__name__} as {name}")
        elif _top(getattr(value, "__module__", None) or "-") in sys.stdlib_module_names:
            lines.append(f"from {value.__module__} import {value.__qualname__} as {name}")
        else:
            return None
    return "\n".join(lines + ["", textwrap.dedent(inspect.getsource(fn))])


def _library_modules(*sources: str) -> dict[str, str] | None:
    """What the reader's code imports beyond the standard library, as {module: source}: only
    plain functions of this project's packages travel. None when anything else is imported."""
    ours = {_top(__name__), "inference_internals"}
    modules: dict[str, dict[str, str]] = {}
    for module, names in (found for source in sources for found in _imports(source)):
        if _top(module) in sys.stdlib_module_names:
            continue
        if _top(module) not in ours or not names:
            return None
        for name in names:
            code = _function_source(getattr(__import__(module, fromlist=[name]), name, None))
            if code is None:
                return None
            modules.setdefault(module, {})[name] = code
    return {module: "\n\n".join(codes.values()) for module, codes in modules.items()}


def _grader_modules() -> tuple[dict[str, str], list[str]]:
    """This module and the one it imports from, as {name: source}, and the non-standard modules
    they import at the top (torch), for which the browser defines empty stand-ins."""
    modules = {m.__name__: inspect.getsource(m) for m in (exercises, sys.modules[__name__])}
    stand_ins = sorted({_top(module) for source in modules.values() for module, _ in _imports(source, True)
                        if _top(module) not in sys.stdlib_module_names} - {_top(__name__)})
    return modules, stand_ins


@dataclass
class CodeExercise:
    title: str
    prompt: str             # Markdown: what to write
    name: str               # the function the reader defines
    stub: str               # the reader's starting cell: the def, raising NotImplementedError
    solution: str           # Python source defining ``name``
    hint: str
    reference: Callable     # the library's version, same arguments
    cases: Callable[[], list[Case]]
    observe: Callable[[tuple, Any], Any] | None = None   # (args after the call, result) -> compared
    time_limit: float = TIME_LIMIT_S                     # seconds per case for the reader's function

    def __post_init__(self):
        for field in ("title", "prompt", "name", "stub", "solution", "hint"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field).strip():
                raise ValueError(f"CodeExercise {field} must be a non-empty string")
        if not callable(self.reference) or not callable(self.cases):
            raise TypeError("reference and cases must be functions")
        if not (isinstance(self.time_limit, (int, float)) and 0 < self.time_limit < math.inf):
            raise ValueError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")
        if f"def {self.name}(" not in self.stub or f"def {self.name}(" not in self.solution:
            raise ValueError(f"the stub and the solution must both define {self.name}()")

    # --- grading -------------------------------------------------------------------------------
    def _run(self, fn: Callable, args: tuple, limit: float | None = None) -> _Outcome:
        try:
            result = fn(*args) if limit is None else call_with_limit(fn, args, limit)
        except (NotImplementedError, _TimedOut):
            raise
        except Exception as err:  # the reader's bug, reported as the case's outcome
            return _Outcome(self._observe(args, None), err)
        return _Outcome(self._observe(args, result))

    def _observe(self, args: tuple, result: Any) -> Any:
        return result if self.observe is None else self.observe(args, result)

    def grade(self, fn: Callable, rerun: str = JUPYTER_RERUN) -> Verdict:
        """Run ``fn`` on every case; the first that differs from the reference fails it.
        ``rerun`` ends the "not implemented yet" verdict: how the reader grades again."""
        if not callable(fn):
            return Verdict(False, f"Expected a function {self.name}, got {type(fn).__name__}.")
        cases = self.cases()
        for case in cases:
            want = self._run(self.reference, case.make())
            args = case.make()
            inputs = self._shown_inputs(case, args)
            try:
                got = self._run(fn, args, self.time_limit)
            except NotImplementedError:
                return Verdict(False, f"{NOT_IMPLEMENTED}: fill in {self.name}() and {rerun}.")
            except _TimedOut as stopped:
                return Verdict(False, timed_out_message(case.label, self.time_limit, inputs, self.hint,
                                                        stopped.where))
            problem = self._compare(want, got)
            if problem:
                return Verdict(False, f"Case “{case.label}” failed. Inputs: {inputs}. {problem} "
                                      f"Hint: {self.hint}")
        return Verdict(True, f"Correct: all {len(cases)} cases match the library.")

    def _shown_inputs(self, case: Case, args: tuple) -> str:
        return case.inputs or ", ".join(f"{n}={show_value(a)}" for n, a in zip(self._parameters(), args))

    def _parameters(self) -> list[str]:
        return list(inspect.signature(self.stub_function()).parameters)

    @staticmethod
    def _compare(want: _Outcome, got: _Outcome) -> str | None:
        error = f"{type(got.error).__name__}: {got.error}" if got.error is not None else ""
        if want.error is None and got.error is not None:
            return f"Expected {show_value(want.observed)}; it raised {error}."
        if want.error is not None and got.error is None:
            return (f"Expected an error (the library raises {type(want.error).__name__}: {want.error}); "
                    f"it returned without one.")
        problem = differ(want.observed, got.observed)
        if problem is None:
            return None
        if want.error is not None:
            return f"Expected an error with the inputs left as they were; it raised, but changed them: {problem}."
        if not isinstance(want.observed, (list, tuple, dict, torch.Tensor)):
            return problem[0].upper() + problem[1:] + "."  # "expected 3, got 4" says it all
        return f"Expected {show_value(want.observed)}; {problem}."

    def solution_function(self) -> Callable:
        """The solution's function, defined as a reader's cell would define it."""
        return self._define(self.solution, "solution")

    def stub_function(self) -> Callable:
        return self._define(self.stub, "stub")

    def _define(self, source: str, what: str) -> Callable:
        namespace: dict = {}
        exec(compile(source, f"<{what} of {self.name}>", "exec"), namespace)
        return namespace[self.name]

    # --- the website ---------------------------------------------------------------------------
    def browser_export(self) -> dict | None:
        """What the website needs to grade this exercise without a kernel, or None when it cannot.

        Every case's arguments and the library's outcome for them (its result, or the type and
        message of what it raised), recorded now; the exercise's text; the sources Pyodide
        defines before grading (this module, browser_grading.py, any plain library function the
        stub imports). Only plain values travel: an exercise that works on tensors or on the engine's
        objects (a pool, a sequence) returns None. One that observes its arguments (a list it fills
        in place) travels when ``observe`` is a plain function of the standard library.
        """
        observe = None
        if self.observe is not None:   # it travels as source: a plain function of the standard library
            observe = _function_source(self.observe)
            if observe is None:
                return None
        library = _library_modules(self.stub, self.solution)
        if library is None:
            return None
        cases = []
        for case in self.cases():
            args = case.make()
            want = self._run(self.reference, case.make())
            if not (_plain(args) and _plain(want.observed)):
                return None
            error = None if want.error is None else [type(want.error).__name__, str(want.error)]
            cases.append({"label": case.label, "args": repr(args), "inputs": case.inputs,
                          "shown": self._shown_inputs(case, args), "observed": repr(want.observed),
                          "error": error})
        grader, stand_ins = _grader_modules()
        return {"exercise": {f: getattr(self, f) for f in ("title", "prompt", "name", "stub", "solution", "hint")},
                "cases": cases, "modules": {**grader, **library}, "stand_ins": stand_ins,
                # what a case compares, when it is more than the result: (its name, its source)
                "observe": None if observe is None else [self.observe.__name__, observe],
                "rerun": BROWSER_RERUN,
                # what runs them there, read as text: it imports this module (in the browser), and
                # this module does not import it (no import circle)
                "runner": runner_source(), "time_limit_s": BROWSER_TIME_LIMIT_S,
                # the page fills in {label} and {inputs} (the case's "shown") of the case it stopped
                "timeout": timed_out_message("{label}", BROWSER_TIME_LIMIT_S, "{inputs}", self.hint),
                "no_case": (f"Your code did not finish within {BROWSER_TIME_LIMIT_S:g} s before the first "
                            "case and was stopped: does something at its top level loop forever?")}

    def _checker_html(self) -> str:
        export = self.browser_export()
        if export is None:
            # `hidden`: Jupyter runs the grader; the website's stylesheet shows this note.
            return (f'<p class="{NEEDS_JUPYTER_CLASS}" hidden><em>This one is graded in Jupyter (its grader '
                    "runs PyTorch or the engine itself, which this website cannot): in a checkout of the "
                    "course's repository, <code>make lab</code> opens this chapter's notebook; fill in the "
                    "stub there and run its cell.</em></p>")
        # `hidden` in Jupyter, which grades the notebook's cell; the website's script shows it.
        return (f'<div class="{BROWSER_CLASS}" hidden data-export="{html.escape(json.dumps(export))}">'
                f"<p>Write <code>{html.escape(self.name)}</code> in the box below and press <strong>Check"
                "</strong> (or Shift+Enter): it runs in your browser (Pyodide), on the library's cases.</p>"
                f'<textarea spellcheck="false" autocapitalize="off" aria-label="Your {html.escape(self.name)}">'
                f"{html.escape(self.stub)}</textarea>"
                '<button type="button">Check</button><output aria-live="polite"></output></div>')

    def _stub_html(self) -> str:
        """The stub, folded beside the hint, for the website's exercises graded in Jupyter (`hidden`:
        in Jupyter the stub is the cell below; the website's stylesheet shows it)."""
        if self.browser_export() is not None:
            return ""   # the editor holds it
        return (f'<details class="exercise-stub" hidden><summary>Stub</summary>'
                f"<pre><code>{html.escape(self.stub)}</code></pre></details>")

    # --- the page ------------------------------------------------------------------------------
    def _static_html(self) -> str:
        solution = f"```python\n{self.solution.strip()}\n```"
        return (f'<div class="exercise {CODE_EXERCISE_CLASS}">'
                f'<p class="exercise-title"><strong>Code exercise: {html.escape(self.title)}</strong></p>'
                f"{_markdown(self.prompt)}"
                # Jupyter's way to answer; the website hides it and shows its own in the checker below.
                f'<p class="{JUPYTER_ONLY_CLASS}">Write <code>{html.escape(self.name)}</code> in the cell '
                "below and run it (or press <strong>Check</strong>): the grader runs it against the "
                "library on random and edge-case inputs.</p>"
                f"{self._checker_html()}{self._stub_html()}"
                f'<details class="exercise-hint"><summary>Hint</summary>{_markdown(self.hint)}</details>'
                f'<details class="exercise-solution"><summary>Solution</summary>{_markdown(solution)}'
                f"</details></div>")

    def _repr_html_(self) -> str:
        return self._static_html()

    def show(self):
        from IPython.display import HTML, display

        display(HTML(self._static_html()))

    def feedback_html(self, fn: Callable) -> str:
        verdict = self.grade(fn)
        if verdict.message.startswith(NOT_IMPLEMENTED):
            colour, mark = "#6a737d", "…"
        else:
            colour, mark = ("#1a7f37", "✓") if verdict.correct else ("#b00020", "✗")
        return (f'<span style="color:{colour}; white-space:pre-wrap">{mark} '
                f"{html.escape(verdict.message)}</span>")

    def widget(self, fn: Callable):
        """A Check button and the verdict, graded now. The button grades the function's current
        definition: the name looked up again in the namespace that defined it."""
        import ipywidgets as w

        button = w.Button(description="Check", button_style="primary", layout=w.Layout(width="auto"))
        feedback = w.HTML(layout=w.Layout(flex="1 1 20em"))
        namespace = getattr(fn, "__globals__", {})

        def on_check(_=None):
            feedback.value = self.feedback_html(namespace.get(self.name, fn))

        button.on_click(on_check)
        on_check()
        checker = w.HBox([button, feedback], layout=w.Layout(flex_flow="row wrap", align_items="center"))
        checker.add_class(CHECKER_CLASS)
        return checker

    def check(self, fn: Callable) -> None:
        """Grade ``fn`` and show the verdict with a Check button (for the reader's cell)."""
        from IPython.display import display

        display(self.widget(fn))
