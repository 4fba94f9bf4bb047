"""Exercises: a prompt, a check, a hint and a solution.

    ex = Exercise(title, prompt, check=integer(answer), hint="...", solution="...")
    ex.show()      # in a notebook: the prompt, collapsed hint and solution, and a live checker
    ex("42")       # -> Verdict(correct, message); a wrong answer's message ends with the hint

The checks built here (number / integer / choice / sequence / word_set) are data: each is a
`Check` holding a JSON spec (kind, expected value, tolerances, options), and Python runs that
spec. In Jupyter the checker widget runs it in the kernel. On the website there is no kernel:
`show()` also embeds the spec in the page, and book/_static/exercises.js runs the
same spec in the browser, with the same parser and the same messages (tests/test_exercise_js.py
holds the two to the same answers). The widget is hidden there (book/_static/course.css).
A check that is a plain Python function cannot travel to the browser: its page says so.
Prompts, hints and solutions are Markdown with $math$.
"""
from __future__ import annotations

import html
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

CHECKER_CLASS = "exercise-checker"
# The element the website's script turns into an answer box; its data-check holds the spec.
WEB_CHECKER_CLASS = "exercise-answer"
NEEDS_JUPYTER_CLASS = "exercise-needs-jupyter"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.correct


# Everything below reads answers by explicit rules, not by Python's Unicode-wide defaults
# (`\d`, `str.strip`'s whitespace), so the JavaScript twin can follow the same rules exactly.
# Python's whitespace (what str.strip() and str.split() remove):
WHITESPACE = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_WS = "[" + re.escape(WHITESPACE) + "]"
# A number, optionally followed by % or by a unit: one word, or two ("12.3 GB", "3x", "40 tok/s",
# "8.03 billion parameters").
_UNIT = r"[A-Za-zµμ×/]+"
_NUMBER = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)" + _WS + r"*(%|"
                     + _UNIT + "(?:" + _WS + "+" + _UNIT + ")?)?")
_DIGIT_SPACE = re.compile(r"(?<=[0-9]) (?=[0-9])")
_WHOLE = re.compile(r"[+-]?[0-9]+")
_INT_ITEM = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")  # what int() reads, ASCII digits only
# What a unit's first word multiplies the number by ("8.03B" is 8.03e9, "5 ms" 0.005 s); any other
# unit ("tok/s", "x", "tokens") leaves it as it is. Case matters for the letters (M is mega, m is not
# here); the spelled-out words are read in any case. "GB/s" scales as "GB".
SCALES = {"%": 0.01, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "bn": 1e9, "G": 1e9, "T": 1e12,
          "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40,
          "ms": 1e-3, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ns": 1e-9}
SCALE_WORDS = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


def _scale(unit: str | None) -> float:
    """What the unit multiplies its number by (1 for none, or for a unit that is not a scale)."""
    if not unit:
        return 1.0
    word = unit.split()[0].split("/")[0]
    return SCALES.get(word, SCALE_WORDS.get(word.lower(), 1.0))


def _read(answer: Any) -> tuple[float, float]:
    """(the number as typed, its unit's scale): "8.03 billion" -> (8.03, 1e9), "12%" -> (12, 0.01)."""
    if isinstance(answer, bool):
        raise ValueError("expected a number, got a boolean")
    if not isinstance(answer, str) and hasattr(answer, "__float__"):  # int, float, numpy, 0-d tensor
        try:
            x = float(answer)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{answer!r} is not a number") from err
        scale = 1.0
    else:
        text = str(answer).strip().replace(",", "").replace("_", "").replace("\u2009", "")
        match = _NUMBER.fullmatch(_DIGIT_SPACE.sub("", text))
        if match is None:
            raise ValueError(f"{answer!r} is not a number")
        x, scale = float(match.group(1)), _scale(match.group(2))
    if not (math.isfinite(x) and math.isfinite(x * scale)):
        raise ValueError(f"{answer!r} is not a finite number")
    return x, scale


def parse_number(answer: Any) -> float:
    """Read 1234, "1234", "1,234", "1 234", "1.2e3", "12%" (-> 0.12), "8.03B" and "8.03 billion"
    (-> 8.03e9), "12.3 GB" (-> 12.3e9), "4 KiB" (-> 4096), "5 ms" (-> 0.005), "40 tok/s" (-> 40).

    Raises ValueError for anything else, including booleans, nan and infinities.
    """
    x, scale = _read(answer)
    return x * scale


def _readings(answer: Any, unit: str | None = None) -> list[float]:
    """The values a typed answer may mean: as typed with its unit read ("8.03B": 8.03e9), with its
    unit ignored ("12.3 GB" where the question counts in GB), and, where the question states its
    unit, converted to it ("12300 MB" for a question in GB: 12.3). A check judges the one nearest
    its expected value, in this order on a tie."""
    x, scale = _read(answer)
    values = [x * scale, x]
    if unit is not None:
        values.append(x * scale / _scale(unit))
    return values


def _nearest(values: list[float], expected: float) -> float:
    best = values[0]
    for v in values[1:]:
        if abs(v - expected) < abs(best - expected):
            best = v
    return best


class Check:
    """A check described by data: ``spec`` (JSON) says everything it does.

    Python runs the spec here; the website runs the same spec in JavaScript. Build one with
    number / integer / choice / sequence / word_set, or rebuild one from a page's spec with
    ``Check(spec)``.
    """

    def __init__(self, spec: dict):
        if spec.get("kind") not in _KINDS:
            raise ValueError(f"unknown check kind {spec.get('kind')!r}; known: {', '.join(_KINDS)}")
        self.spec = json.loads(json.dumps(spec, allow_nan=False))  # JSON or nothing: it must reach the page
        self._check = _KINDS[spec["kind"]](self.spec)

    def __call__(self, answer: Any) -> Verdict:
        return self._check(answer)

    def __repr__(self) -> str:
        return f"Check({self.spec!r})"


def number(expected: float, rel: float = 0.0, abs_tol: float = 0.0, unit: str | None = None) -> Check:
    """A check that the answer is the number ``expected`` within rel (relative) or abs_tol.

    An answer's unit is read ("8.03B" is 8.03e9, "12%" 0.12) or ignored ("12%" is 12 too),
    whichever is nearer the expected value; ``unit`` (e.g. "GB") says what the expected value
    counts in, so an answer in another unit of the table ("12300 MB") is converted to it.
    """
    expected = float(expected)
    if not math.isfinite(expected):
        raise ValueError(f"expected must be a finite number, got {expected}")
    if rel < 0 or abs_tol < 0:
        raise ValueError(f"tolerances must be >= 0, got rel={rel}, abs_tol={abs_tol}")
    if unit is not None and _scale(unit) == 1.0:
        raise ValueError(f"unit {unit!r} is not one the answers' parser scales: {', '.join(SCALES)}")
    return Check({"kind": "number", "expected": expected, "rel": float(rel), "abs": float(abs_tol),
                  "unit": unit})


def _number_check(spec: dict) -> Callable[[Any], Verdict]:
    expected, rel, abs_tol = spec["expected"], spec["rel"], spec["abs"]

    def check(answer: Any) -> Verdict:
        try:
            x = _nearest(_readings(answer, spec.get("unit")), expected)
        except (TypeError, ValueError):
            return Verdict(False, f"{answer!r} is not a number.")
        if math.isclose(x, expected, rel_tol=rel, abs_tol=abs_tol):
            return Verdict(True, "Correct.")
        return Verdict(False, "Too high." if x > expected else "Too low.")
    return check


class _NotWhole(ValueError):
    pass


def _as_int(answer: Any, expected: int = 0) -> int:
    """The whole number an answer means: digits exactly (even past float precision), else the
    reading of its number and unit nearest ``expected`` ("4 KiB": 4096 or 4)."""
    if isinstance(answer, bool):
        raise ValueError("expected a number, got a boolean")
    try:
        return operator.index(answer)  # int, numpy integer
    except TypeError:
        pass
    digits = re.sub(r"[,_ \u2009]", "", str(answer).strip())
    if _WHOLE.fullmatch(digits):
        return int(digits)  # exact, even past float precision
    x = _nearest(_readings(answer), expected)
    if x != int(x):
        raise _NotWhole(answer)
    return int(x)


def integer(expected: int) -> Check:
    """A check that the answer is exactly the whole number ``expected``."""
    if isinstance(expected, bool):
        raise TypeError("expected must be an int, got a boolean")
    expected = operator.index(expected)  # refuses floats: an integer check wants an integer
    # As a string: JSON numbers lose digits past 2**53 in JavaScript.
    return Check({"kind": "integer", "expected": str(expected)})


def _integer_check(spec: dict) -> Callable[[Any], Verdict]:
    expected = int(spec["expected"])

    def check(answer: Any) -> Verdict:
        try:
            n = _as_int(answer, expected)
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


def _no_spaces(s: Any) -> str:
    return "".join(str(s).split()).lower()


def choice(expected: str, options: list[str] | None = None, ignore_spaces: bool = False) -> Check:
    """A check that the answer is ``expected`` (case and extra spaces ignored; with
    ``ignore_spaces``, all spaces: "A+G" is "A + G").

    With ``options``, an answer outside them is told the options rather than just "wrong".
    """
    key = _no_spaces if ignore_spaces else _norm
    if options is not None and key(expected) not in {key(o) for o in options}:
        raise ValueError(f"expected {expected!r} is not one of the options {options}")
    return Check({"kind": "choice", "expected": str(expected),
                  "options": None if options is None else [str(o) for o in options],
                  "ignore_spaces": bool(ignore_spaces)})


def _choice_check(spec: dict) -> Callable[[Any], Verdict]:
    key = _no_spaces if spec["ignore_spaces"] else _norm
    options = spec["options"]

    def check(answer: Any) -> Verdict:
        if options is not None and key(answer) not in {key(o) for o in options}:
            return Verdict(False, f"Pick one of: {', '.join(options)}.")
        if key(answer) == key(spec["expected"]):
            return Verdict(True, "Correct.")
        return Verdict(False, "Not quite.")
    return check


def _int_item(text: str) -> int:
    """int() for one typed item, ASCII digits only (so the browser reads it the same way)."""
    if not _INT_ITEM.fullmatch(text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


# The item parsers a spec can name; any other parse makes a check that needs Jupyter.
_ITEM_PARSERS = {"int": _int_item, "str": str}


def sequence(expected: list, parse: Callable[[str], Any] = int) -> Check | Callable[[Any], Verdict]:
    """A check for a list answer, typed as "1, 2, 3" (or "[1, 2, 3]", "(1, 2, 3)") or given as a list.

    With parse=int or parse=str it is a `Check` the website runs too; any other parse
    function only runs in Python.
    """
    if isinstance(expected, (str, bytes)) or not hasattr(expected, "__iter__"):
        raise TypeError(f"expected must be a list, got {type(expected).__name__}")
    expected = list(expected)
    items = {int: "int", str: "str"}.get(parse)
    if items == "int" and all(isinstance(x, int) and not isinstance(x, bool) for x in expected):
        return Check({"kind": "sequence", "items": "int", "expected": [str(x) for x in expected]})
    if items == "str" and all(isinstance(x, str) for x in expected):
        return Check({"kind": "sequence", "items": "str", "expected": expected})
    return _sequence_check(expected, parse)


def _sequence_from_spec(spec: dict) -> Callable[[Any], Verdict]:
    parse = _ITEM_PARSERS[spec["items"]]
    return _sequence_check([parse(x) for x in spec["expected"]], parse)


def _unbracket(text: str) -> str:
    """A list's brackets or a tuple's parentheses taken off ("[1, 2]", "(2, 3, 7, 64)")."""
    if text.startswith(("[", "(")):
        text = text[1:]
    if text.endswith(("]", ")")):
        text = text[:-1]
    return text


def _sequence_check(expected: list, parse: Callable[[str], Any]) -> Callable[[Any], Verdict]:
    def check(answer: Any) -> Verdict:
        try:
            if isinstance(answer, (list, tuple)):
                items = [parse(x.strip()) if isinstance(x, str) else x for x in answer]
            else:
                text = _unbracket(str(answer).strip())
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


def word_set(expected: list[str], words: list[str], too_many: str = "Too many.",
             too_few: str = "Too few.") -> Check:
    """A check for a set of ``words`` in any order, typed separated by commas or semicolons
    (case ignored). A word outside ``words`` is told the words; a proper superset or subset of
    the answer gets ``too_many`` / ``too_few``."""
    if {w.lower() for w in expected} - {w.lower() for w in words}:
        raise ValueError(f"expected {expected} are not all among the words {words}")
    return Check({"kind": "word_set", "expected": list(expected), "words": list(words),
                  "too_many": too_many, "too_few": too_few})


def _word_set_check(spec: dict) -> Callable[[Any], Verdict]:
    want = {w.lower() for w in spec["expected"]}
    known = {w.lower() for w in spec["words"]}

    def check(answer: Any) -> Verdict:
        items = answer if isinstance(answer, (list, tuple)) else str(answer).replace(";", ",").split(",")
        got = {str(w).strip().lower() for w in items if str(w).strip()}
        if got == want:
            return Verdict(True, "Correct.")
        if got - known:
            return Verdict(False, f"Use the candidate words: {', '.join(spec['words'])}.")
        return Verdict(False, spec["too_many"] if got > want else spec["too_few"] if got < want else "Not quite.")
    return check


_KINDS = {"number": _number_check, "integer": _integer_check, "choice": _choice_check,
          "sequence": _sequence_from_spec, "word_set": _word_set_check}


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

    def web_spec(self) -> dict | None:
        """What the website's checker needs to give this exercise's verdicts: the check's spec,
        the hint it appends to a wrong answer, the placeholder. None for a plain-function check."""
        spec = getattr(self.check, "spec", None)
        if spec is None:
            return None
        return {"check": spec, "hint": self.hint, "placeholder": self.placeholder}

    def _checker_html(self) -> str:
        spec = self.web_spec()
        if spec is None:
            # `hidden`: Jupyter has the live checker; the website's stylesheet shows this note.
            return (f'<p class="{NEEDS_JUPYTER_CLASS}" hidden><em>Checking this answer runs Python: '
                    "open the chapter in Jupyter to check it, or compare with the solution.</em></p>")
        # Empty here, so Jupyter shows nothing; the website's script builds the answer box in it.
        return f'<div class="{WEB_CHECKER_CLASS}" data-check="{html.escape(json.dumps(spec))}"></div>'

    def _static_html(self) -> str:
        return (f'<div class="exercise">'
                f'<p class="exercise-title"><strong>Exercise: {html.escape(self.title)}</strong></p>'
                f"{_markdown(self.prompt)}"
                f"{self._checker_html()}"
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
