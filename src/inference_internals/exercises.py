"""Exercises: a prompt, a check, a hint and a solution.

In Jupyter, ``exercise.show()`` draws an answer box and a Check button that runs the check;
on the website (no kernel) the same cell shows the prompt and a collapsed solution.
Checks are plain Python functions of the reader's answer, so they are unit-tested.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.correct


def parse_number(answer: Any) -> float:
    """Accept 1234, "1234", "1,234", "1.2e3", "12%" (-> 0.12)."""
    if isinstance(answer, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(answer, (int, float)):
        return float(answer)
    text = str(answer).strip().replace(",", "").replace("_", "")
    scale = 1.0
    if text.endswith("%"):
        text, scale = text[:-1], 0.01
    return float(text) * scale


def number(expected: float, rel: float = 0.0, abs_tol: float = 0.0) -> Callable[[Any], Verdict]:
    """A check that the answer is the number ``expected`` (within rel/abs tolerance)."""
    def check(answer: Any) -> Verdict:
        try:
            x = parse_number(answer)
        except (TypeError, ValueError):
            return Verdict(False, f"{answer!r} is not a number")
        if math.isclose(x, expected, rel_tol=rel, abs_tol=abs_tol):
            return Verdict(True, "Correct.")
        return Verdict(False, "Too high." if x > expected else "Too low.")
    return check


def integer(expected: int) -> Callable[[Any], Verdict]:
    def check(answer: Any) -> Verdict:
        try:
            x = parse_number(answer)
        except (TypeError, ValueError):
            return Verdict(False, f"{answer!r} is not a number")
        if x != int(x):
            return Verdict(False, "Expected a whole number.")
        if int(x) == expected:
            return Verdict(True, "Correct.")
        return Verdict(False, "Too high." if x > expected else "Too low.")
    return check


def choice(expected: str, options: list[str] | None = None) -> Callable[[Any], Verdict]:
    """A check that the answer is ``expected`` (case and surrounding space ignored)."""
    def norm(s: Any) -> str:
        return " ".join(str(s).strip().lower().split())

    def check(answer: Any) -> Verdict:
        if options is not None and norm(answer) not in {norm(o) for o in options}:
            return Verdict(False, f"Pick one of: {', '.join(options)}.")
        return Verdict(norm(answer) == norm(expected), "Correct." if norm(answer) == norm(expected) else "Not quite.")
    return check


def sequence(expected: list, parse: Callable[[str], Any] = int) -> Callable[[Any], Verdict]:
    """A check for a list answer, typed as "1, 2, 3" or given as a list."""
    def check(answer: Any) -> Verdict:
        try:
            items = answer if isinstance(answer, (list, tuple)) else \
                [parse(s) for s in str(answer).replace("[", "").replace("]", "").split(",") if s.strip()]
            items = [parse(x) if isinstance(x, str) else x for x in items]
        except (TypeError, ValueError):
            return Verdict(False, f"could not read {answer!r} as a comma-separated list")
        if list(items) == list(expected):
            return Verdict(True, "Correct.")
        if len(items) != len(expected):
            return Verdict(False, f"Expected {len(expected)} items, got {len(items)}.")
        return Verdict(False, "Not quite.")
    return check


@dataclass
class Exercise:
    title: str
    prompt: str           # markdown shown to the reader
    check: Callable[[Any], Verdict]
    hint: str
    solution: str         # markdown, may include code
    placeholder: str = "your answer"

    def __call__(self, answer: Any) -> Verdict:
        """Check an answer; a wrong one comes back with the hint."""
        verdict = self.check(answer)
        if not verdict.correct:
            return Verdict(False, f"{verdict.message} Hint: {self.hint}".strip())
        return verdict

    def _static_html(self) -> str:
        from markdown_it import MarkdownIt

        md = MarkdownIt("commonmark")
        return (f'<div class="exercise"><p><strong>Exercise: {html.escape(self.title)}</strong></p>'
                f"{md.render(self.prompt)}"
                f"<details><summary>Hint</summary>{md.render(self.hint)}</details>"
                f"<details><summary>Solution</summary>{md.render(self.solution)}</details></div>")

    def show(self):
        """Display the exercise: prompt and collapsed hint/solution, plus a live checker."""
        import ipywidgets as w
        from IPython.display import HTML, display

        display(HTML(self._static_html()))
        box = w.Text(placeholder=self.placeholder, description="Answer:")
        button = w.Button(description="Check", button_style="primary")
        feedback = w.HTML()

        def on_click(_):
            verdict = self(box.value)
            colour = "green" if verdict.correct else "#b00"
            mark = "✓" if verdict.correct else "✗"
            feedback.value = f'<span style="color:{colour}">{mark} {html.escape(verdict.message)}</span>'

        button.on_click(on_click)
        display(w.HBox([box, button, feedback]))
