"""Exercises: a prompt, a check, a hint and a solution.

    ex = Exercise(title, prompt, check=integer(answer), hint="...", solution="...")
    ex.show()      # in a notebook: the prompt, collapsed hint and solution, and a live checker
    ex("42")       # -> Verdict(correct, message); a wrong answer's message ends with the hint

In Jupyter the checker (answer box, Check button, feedback) runs the check in the kernel.
On the website there is no kernel, so the checker is hidden (book/_static/course.css hides
`.exercise-checker`) and the reader opens the collapsed solution instead.
Prompts, hints and solutions are Markdown with $math$; checks are plain functions of the
reader's answer, built by number / integer / choice / sequence, so they are unit-tested.
"""
from __future__ import annotations

import html
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

CHECKER_CLASS = "exercise-checker"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.correct


# A number, optionally followed by % or by a unit word that is ignored ("12.3 GB", "3x", "40 tok/s").
_NUMBER = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(%|[a-zµ×/]+)?$", re.IGNORECASE)


def parse_number(answer: Any) -> float:
    """Read 1234, "1234", "1,234", "1 234", "1.2e3", "12.3 GB" (-> 12.3), "12%" (-> 0.12).

    Raises ValueError for anything else, including booleans, nan and infinities.
    """
    if isinstance(answer, bool):
        raise ValueError("expected a number, got a boolean")
    if not isinstance(answer, str) and hasattr(answer, "__float__"):  # int, float, numpy, 0-d tensor
        try:
            x = float(answer)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{answer!r} is not a number") from err
    else:
        text = str(answer).strip().replace(",", "").replace("_", "").replace("\u2009", "")
        text = re.sub(r"(?<=\d) (?=\d)", "", text)
        match = _NUMBER.match(text)
        if match is None:
            raise ValueError(f"{answer!r} is not a number")
        x = float(match.group(1)) * (0.01 if match.group(2) == "%" else 1.0)
    if not math.isfinite(x):
        raise ValueError(f"{answer!r} is not a finite number")
    return x


def _is_percent(answer: Any) -> bool:
    return isinstance(answer, str) and answer.strip().endswith("%")


def number(expected: float, rel: float = 0.0, abs_tol: float = 0.0) -> Callable[[Any], Verdict]:
    """A check that the answer is the number ``expected`` within rel (relative) or abs_tol.

    "12%" counts as 0.12 or as 12, whichever the expected value is on.
    """
    expected = float(expected)
    if not math.isfinite(expected):
        raise ValueError(f"expected must be a finite number, got {expected}")
    if rel < 0 or abs_tol < 0:
        raise ValueError(f"tolerances must be >= 0, got rel={rel}, abs_tol={abs_tol}")

    def check(answer: Any) -> Verdict:
        try:
            x = parse_number(answer)
        except (TypeError, ValueError):
            return Verdict(False, f"{answer!r} is not a number.")
        # "12%" may mean 0.12 or 12: judge it on the scale nearer the expected value.
        x = min([x, x * 100] if _is_percent(answer) else [x], key=lambda c: abs(c - expected))
        if math.isclose(x, expected, rel_tol=rel, abs_tol=abs_tol):
            return Verdict(True, "Correct.")
        return Verdict(False, "Too high." if x > expected else "Too low.")
    return check


class _NotWhole(ValueError):
    pass


def _as_int(answer: Any) -> int:
    if isinstance(answer, bool):
        raise ValueError("expected a number, got a boolean")
    try:
        return operator.index(answer)  # int, numpy integer
    except TypeError:
        pass
    digits = re.sub(r"[,_ \u2009]", "", str(answer).strip())
    if re.fullmatch(r"[+-]?\d+", digits):
        return int(digits)  # exact, even past float precision
    x = parse_number(answer)
    if x != int(x):
        raise _NotWhole(answer)
    return int(x)


def integer(expected: int) -> Callable[[Any], Verdict]:
    """A check that the answer is exactly the whole number ``expected``."""
    if isinstance(expected, bool):
        raise TypeError("expected must be an int, got a boolean")
    expected = operator.index(expected)  # refuses floats: an integer check wants an integer

    def check(answer: Any) -> Verdict:
        try:
            n = _as_int(answer)
        except _NotWhole:
            return Verdict(False, "Expected a whole number.")
        except (TypeError, ValueError):
            return Verdict(False, f"{answer!r} is not a number.")
        if n == expected:
            return Verdict(True, "Correct.")
        return Verdict(False, "Too high." if n > expected else "Too low.")
    return check


def _norm(s: Any) -> str:
    return " ".join(str(s).strip().lower().split())


def choice(expected: str, options: list[str] | None = None) -> Callable[[Any], Verdict]:
    """A check that the answer is ``expected`` (case and extra spaces ignored).

    With ``options``, an answer outside them is told the options rather than just "wrong".
    """
    if options is not None and _norm(expected) not in {_norm(o) for o in options}:
        raise ValueError(f"expected {expected!r} is not one of the options {options}")

    def check(answer: Any) -> Verdict:
        if options is not None and _norm(answer) not in {_norm(o) for o in options}:
            return Verdict(False, f"Pick one of: {', '.join(map(str, options))}.")
        if _norm(answer) == _norm(expected):
            return Verdict(True, "Correct.")
        return Verdict(False, "Not quite.")
    return check


def sequence(expected: list, parse: Callable[[str], Any] = int) -> Callable[[Any], Verdict]:
    """A check for a list answer, typed as "1, 2, 3" (or "[1, 2, 3]") or given as a list."""
    if isinstance(expected, (str, bytes)) or not hasattr(expected, "__iter__"):
        raise TypeError(f"expected must be a list, got {type(expected).__name__}")
    expected = list(expected)

    def check(answer: Any) -> Verdict:
        try:
            if isinstance(answer, (list, tuple)):
                items = [parse(x.strip()) if isinstance(x, str) else x for x in answer]
            else:
                text = str(answer).strip().removeprefix("[").removesuffix("]")
                items = [parse(s.strip()) for s in text.split(",") if s.strip()]
        except (TypeError, ValueError):
            return Verdict(False, f"Could not read {answer!r} as a comma-separated list.")
        if items == expected:
            return Verdict(True, "Correct.")
        if len(items) != len(expected):
            return Verdict(False, f"Expected {len(expected)} items, got {len(items)}.")
        first = next(i for i, (a, b) in enumerate(zip(items, expected)) if a != b)
        return Verdict(False, f"Not quite: item {first + 1} differs.")
    return check


def _markdown(text: str) -> str:
    """Markdown with $inline$ and $$display$$ math, as HTML that MathJax typesets.

    Math comes out as \\( \\) or \\[ \\] inside an element of class `math`: the website's
    MathJax processes that class, and JupyterLab typesets HTML outputs itself.
    """
    try:
        from markdown_it import MarkdownIt
        from mdit_py_plugins.dollarmath import dollarmath_plugin
    except ImportError:  # without them, plain paragraphs are still readable
        return "".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n\n"))

    def render_math(content: str, opts: dict) -> str:
        left, right = ("\\[", "\\]") if opts.get("display_mode") else ("\\(", "\\)")
        return left + html.escape(content, quote=False) + right

    md = MarkdownIt("commonmark").enable("table")
    md.use(dollarmath_plugin, double_inline=True, renderer=render_math)
    return md.render(text)


@dataclass
class Exercise:
    title: str
    prompt: str           # Markdown shown to the reader
    check: Callable[[Any], Verdict]
    hint: str
    solution: str         # Markdown, may include code
    placeholder: str = "your answer"

    def __post_init__(self):
        if not callable(self.check):
            raise TypeError(f"check must be a function of the answer, got {type(self.check).__name__}")
        for name in ("title", "prompt", "hint", "solution"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"Exercise {name} must be a non-empty string")

    def __call__(self, answer: Any) -> Verdict:
        """Check an answer; a wrong one comes back with the hint."""
        verdict = self.check(answer)
        if not isinstance(verdict, Verdict):  # a plain predicate is fine too
            verdict = Verdict(bool(verdict), "Correct." if verdict else "Not quite.")
        if not verdict.correct:
            return Verdict(False, f"{verdict.message} Hint: {self.hint}".strip())
        return verdict

    def _static_html(self) -> str:
        return (f'<div class="exercise">'
                f'<p class="exercise-title"><strong>Exercise: {html.escape(self.title)}</strong></p>'
                f"{_markdown(self.prompt)}"
                f'<details class="exercise-hint"><summary>Hint</summary>{_markdown(self.hint)}</details>'
                f'<details class="exercise-solution"><summary>Solution</summary>{_markdown(self.solution)}'
                f"</details></div>")

    def _repr_html_(self) -> str:
        return self._static_html()

    def feedback_html(self, answer: Any) -> str:
        """What the checker shows for an answer: a tick or a cross, and the verdict."""
        verdict = self(answer)
        colour, mark = ("#1a7f37", "✓") if verdict.correct else ("#b00020", "✗")
        return f'<span style="color:{colour}">{mark} {html.escape(verdict.message)}</span>'

    def widget(self):
        """The live checker: an answer box, a Check button and a feedback line.

        Enter in the box checks too. Returned, not displayed, so it can be tested headless.
        """
        import ipywidgets as w

        box = w.Text(placeholder=self.placeholder, description="Answer:", continuous_update=False,
                     layout=w.Layout(width="auto", min_width="12em", flex="1 1 12em"))
        button = w.Button(description="Check", button_style="primary",
                          layout=w.Layout(width="auto", flex="0 0 auto"))
        feedback = w.HTML(layout=w.Layout(flex="1 1 100%"))

        def on_check(_=None):
            feedback.value = self.feedback_html(box.value) if box.value.strip() else ""

        button.on_click(on_check)
        box.observe(on_check, names="value")  # continuous_update=False: fires on Enter or leaving the box
        checker = w.HBox([box, button, feedback], layout=w.Layout(flex_flow="row wrap", align_items="center"))
        checker.add_class(CHECKER_CLASS)
        return checker

    def show(self):
        """Display the exercise: prompt and collapsed hint/solution, plus a live checker."""
        from IPython.display import HTML, display

        display(HTML(self._static_html()))
        display(self.widget())
