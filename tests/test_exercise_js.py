"""The website's exercise checker (book/_static/exercises.js) gives the verdict and message
Python gives (inference_course.exercises), for the same specs and the same typed answers.

Each runtime gets one table: every check below against every answer below, plus seeded random
strings built from the characters the parsers care about. Node runs in the unit tests; Chromium,
where the reader runs it, in the browser tests.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from inference_course.exercises import Exercise, choice, integer, number, sequence, word_set

JS = Path(__file__).resolve().parent.parent / "book" / "_static" / "exercises.js"

CHECKS = [
    number(0.12, rel=0.01), number(12, rel=0.05), number(1234), number(12.3, rel=0.01),
    number(-3.5, abs_tol=0.1), number(0.0, abs_tol=1e-3), number(1e-7, rel=1e-9), number(8_030_261_248, rel=1e-3),
    number(8.03e9, rel=1e-3), number(12.3, rel=0.01, unit="GB"), number(0.005, rel=0.01),
    integer(1200), integer(0), integer(-7), integer(10**30 + 1), integer(5), integer(4096),
    choice("Bandwidth-bound", ["compute-bound", "bandwidth-bound"]), choice("the KV cache"),
    choice("A + G", ["ĠR + A", "A + G"], ignore_spaces=True), choice("B", list("ABCD")),
    sequence([1, 2, 3]), sequence([10**20, -5, 0]), sequence(["ban", "an", "a"], parse=str),
    word_set(["Paris", "London", "Rome"], ["Paris", "London", "Rome", "Berlin", "the"],
             too_many="Too many tokens kept.", too_few="Too few tokens kept."),
]

ANSWERS = [
    # numbers as readers type them
    "1234", "1,234", "1 234", "1_234", "1.2e3", "1.2E3", "12.3 GB", "12.3GB", "12.3\u00a0GB", "12%", "12 %",
    "0.12", ".12", "+.5", "-3.5", "-3.45", "-0", "007", "5", "1200", "1200.0", "1200.5", "1.2e3 tokens",
    "3x", "40 tok/s", "5 µs", "5 μs", "12×", "8,030,261,248", "8.03e9", "8.1e9", "1e-7", "1.0000000001e-7",
    "1000000000000000000000000000001", "1,000,000,000,000,000,000,000,000,001", "1e30", "0.0005", "0.002",
    # numbers with scale words, as readers type them (8.03B is 8.03e9; 12300 MB is 12.3 GB)
    "8.03B", "8.03 B", "8.03 billion", "8.03 Billion params", "8030M", "8.03e9 parameters", "8.03 bn",
    "12300 MB", "12.3GB", "0.0123 TB", "11.46 GiB", "4 KiB", "4KB", "4 k", "1.2K", "1.2 thousand",
    "5 ms", "5000 µs", "5000 μs", "5e6 ns", "30 GB/s", "1 MiB", "2 trillion", "1e300 T",
    # not numbers
    "True", "False", "true", "none", "None", "nan", "inf", "-inf", "1e999", "abc", "twelve", "1.2.3", "1e+",
    "e5", "12 34 GB x", "١٢", "\ufeff12", "\x1c12\x1c", "12\u2009345", "1__0", "%", "GB", "",
    # choices, lists and sets
    "bandwidth-BOUND", "  compute-bound ", "memory", "The  KV   cache", "the kv-cache", "A+G", "a + g", "ĠR+A",
    "ĠR + A", "G + A", "b", " B ", "E", "[1, 2, 3]", "(1, 2, 3)", "(1, 2, 3", "(1, 2, 3]", "1, 2, 3", "1,2,3", "1, 2", "1, 2, 4", "3, 2, 1", "[1, 2, 3",
    "1, two", "+1, 2, 3", "1_0, 2", "100000000000000000000, -5, 0", "ban, an, a", "ban,an,a", "Ban, an, a",
    "b, an, an, a", "banana", "[ban, an, a]", "Paris, London, Rome", "rome; paris ,london", "Paris", "Madrid",
    "Paris, London, Rome, Berlin", "London, Rome", "Paris, Berlin",
    # quoting and odd characters in the messages (Python's repr)
    "it's", 'say "hi"', "both ' and \"", "back\\slash", "tab\there", "line\nbreak", "\x00", "\u200b", "İ", "ΑΣ",
    "🙂", "é", "\x7f",
]


def fuzz(n: int = 400, seed: int = 20) -> list[str]:
    alphabet = list("0123456789012345.,,_  eE+-%GBkKMTmsix/µμ×[]();aA\u2009\u00a0'\"")
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def exercise(check) -> Exercise:
    return Exercise(title="t", prompt="p", check=check, hint="Mind the units.", solution="s")


def table() -> tuple[list[dict], list[str], list[list[list]]]:
    """The specs, the answers, and Python's [correct, message] for each (spec, answer)."""
    exercises = [exercise(c) for c in CHECKS]
    answers = ANSWERS + fuzz()
    python = [[[v.correct, v.message] for v in map(ex, answers)] for ex in exercises]
    return [ex.web_spec() for ex in exercises], answers, python


def assert_same(specs, answers, python, js):
    mismatches = [(spec["check"], a, p, j) for spec, prow, jrow in zip(specs, python, js)
                  for a, p, j in zip(answers, prow, jrow) if p != j]
    assert not mismatches, f"{len(mismatches)} answers judged differently, e.g.:\n" + "\n".join(
        f"  {spec} {a!r}: python {p}, js {j}" for spec, a, p, j in mismatches[:10])


JUDGE_ALL = "(specs, answers) => specs.map(s => answers.map(a => { const v = J.judge(s, a); return [v.correct, v.message]; }))"


def test_table_covers_every_kind_and_verdict():
    specs, answers, python = table()
    assert {s["check"]["kind"] for s in specs} == {"number", "integer", "choice", "sequence", "word_set"}
    messages = {m.split(" Hint:")[0] for row in python for _, m in row}
    for m in ["Correct.", "Too high.", "Too low.", "Expected a whole number.", "Not quite.",
              "Expected 3 items, got 2.", "Not quite: item 3 differs.", "Too many tokens kept.", "Too few tokens kept."]:
        assert m in messages
    for prefix in ["Pick one of:", "Could not read", "Use the candidate words:"]:
        assert any(m.startswith(prefix) for m in messages)
    assert any(m.endswith("is not a number.") for m in messages)
    assert sum(ok for row in python for ok, _ in row) > 50  # plenty of right answers, not only wrong ones


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_gives_pythons_verdicts():
    specs, answers, python = table()
    script = (f"const J = require({json.dumps(str(JS))}); const [s, a] = JSON.parse(require('fs').readFileSync(0));"
              f"process.stdout.write(JSON.stringify(({JUDGE_ALL})(s, a)));")
    out = subprocess.run(["node", "-e", script], input=json.dumps([specs, answers]), capture_output=True,
                         text=True, check=True, timeout=60)
    assert_same(specs, answers, python, json.loads(out.stdout))


@pytest.mark.browser
def test_chromium_gives_pythons_verdicts(browser):
    specs, answers, python = table()
    page = browser.new_page()
    try:
        page.add_script_tag(path=str(JS))
        js = page.evaluate(f"([s, a]) => {{ const J = window.exerciseChecker; return ({JUDGE_ALL})(s, a); }}",
                           [specs, answers])
    finally:
        page.close()
    assert_same(specs, answers, python, js)


def test_a_plain_function_check_stays_in_python():
    ex = exercise(lambda a: a == "yes")
    assert ex.web_spec() is None
    page = ex._static_html()
    assert "exercise-needs-jupyter" in page and "data-check" not in page


def test_every_chapter_exercise_is_checked_on_the_website():
    import torch

    from inference_internals.bpe import BPETokenizer
    from inference_course.chapter_exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07
    from inference_internals.weights import model_dir

    lens = torch.nn.functional.one_hot(torch.tensor([0, 1, 4, 2])[:, None], 6).float()
    every = (ch01.EXERCISES + [ch01.lens_exercise(lens, "A B C", " D")]
             + ch02.exercises(BPETokenizer.from_pretrained(model_dir()))
             + ch03.EXERCISES + ch04.EXERCISES + ch05.EXERCISES + ch06.EXERCISES + ch07.EXERCISES)
    assert [ex.title for ex in every if ex.web_spec() is None] == []
