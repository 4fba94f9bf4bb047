"""The exercise framework: answer parsing, the check builders, the Exercise object, its widget."""
import html
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_course.exercises import (CHECKER_CLASS, Check, Exercise, Verdict, choice, integer, number,
                                           parse_number, sequence, word_set)


# --- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("1234", 1234.0), (" 1234 ", 1234.0), ("1,234", 1234.0), ("1_234", 1234.0), ("1 234 567", 1234567.0),
    ("-3.5", -3.5), ("+2", 2.0), (".5", 0.5), ("1.2e3", 1200.0), ("3E-2", 0.03),
    ("12%", 0.12), ("12 %", 0.12), ("12.3 GB", 12.3e9), ("3x", 3.0), ("40 tok/s", 40.0),
    ("8.03B", 8.03e9), ("8.03 billion", 8.03e9), ("8.03 Billion parameters", 8.03e9), ("135M", 135e6),
    ("1.5k", 1500.0), ("2 thousand", 2000.0), ("4 KiB", 4096.0), ("2 MiB", 2.0**21), ("30 GB/s", 30e9),
    ("5 ms", 0.005), ("5 µs", 5e-6), ("1.2 M tokens", 1.2e6),
    (7, 7.0), (2.5, 2.5), (np.float32(0.5), 0.5), (np.int64(9), 9.0),
])
def test_parse_number_reads(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "1e+", "e5", "12 34 GB x y", "8 billion 5", "nan", "inf", "-inf", True, False,
                                 None, [1], float("nan"), float("inf"), np.ones(2)])
def test_parse_number_refuses(bad):
    with pytest.raises(ValueError):
        parse_number(bad)


def test_parse_number_takes_scalar_tensors():
    torch = pytest.importorskip("torch")
    assert parse_number(torch.tensor(3.0)) == 3.0
    with pytest.raises(ValueError):
        parse_number(torch.ones(2))


# --- number ----------------------------------------------------------------------------------

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).filter(lambda x: abs(x) > 1e-6)


@given(finite)
def test_number_accepts_its_value_in_any_spelling(x):
    check = number(x, rel=1e-9)
    assert check(x).correct
    assert check(repr(x)).correct
    assert check(f"{x:,.12g}").correct


@given(finite, st.floats(min_value=0.02, max_value=10))
def test_number_refuses_outside_tolerance_and_says_which_way(x, factor):
    check = number(x, rel=0.01)
    high, low = x + abs(x) * factor, x - abs(x) * factor
    assert check(high) == Verdict(False, "Too high.")
    assert check(low) == Verdict(False, "Too low.")


def test_number_tolerances():
    assert number(100, rel=0.05)("104").correct
    assert not number(100, rel=0.05)("106").correct
    assert number(0.0, abs_tol=1e-3)("0.0005").correct
    assert not number(0.0)("0.0005").correct
    assert not number(188.74)("188.7").correct  # rel=0 means exact


def test_number_reads_percent_either_way():
    assert number(0.12)("12%").correct
    assert number(12)("12%").correct
    assert number(0.13)("12%") == Verdict(False, "Too low.")
    assert number(12)("13%") == Verdict(False, "Too high.")
    assert number(0.12)("11%") == Verdict(False, "Too low.")


def test_number_reads_unit_words():
    """"8.03B" and "8.03 billion" are 8.03e9, not 8.03 (which was "Too low")."""
    params = number(8_030_261_248, rel=1e-3)
    for answer in ["8.03B", "8.03 billion", "8.03 Billion parameters", "8030M", "8,030 million", "8.03e9"]:
        assert params(answer).correct, answer
    assert params("7.9B") == Verdict(False, "Too low.") and params("8.2 billion") == Verdict(False, "Too high.")
    assert not params("8.03").correct   # no unit: the number as typed
    gb = number(12.3, rel=0.01, unit="GB")   # a question that counts in GB
    for answer in ["12.3", "12.3 GB", "12.3e9 bytes", "12300 MB", "0.0123 TB", "11.46 GiB"]:
        assert gb(answer).correct, answer
    assert gb("13000 MB") == Verdict(False, "Too high.")
    assert number(0.005, rel=0.01)("5 ms").correct and number(5, rel=0.01)("5 ms").correct
    assert integer(4096)("4 KiB").correct and integer(1200)("1.2K").correct
    assert integer(4096)("4.5 KiB") == Verdict(False, "Too high.")
    with pytest.raises(ValueError, match="unit"):
        number(1.0, unit="tok/s")


def test_sequence_reads_a_tuple():
    shape = sequence([2, 3, 7, 64])
    for answer in ["(2, 3, 7, 64)", "[2, 3, 7, 64]", "2, 3, 7, 64", (2, 3, 7, 64)]:
        assert shape(answer).correct, answer
    assert shape("(2, 7, 3, 64)") == Verdict(False, "Not quite: item 2 differs.")


def test_number_says_what_is_not_a_number():
    verdict = number(3)("three")
    assert not verdict.correct and "not a number" in verdict.message


@pytest.mark.parametrize("bad", [dict(expected=math.nan), dict(expected=math.inf),
                                 dict(expected=1, rel=-0.1), dict(expected=1, abs_tol=-1)])
def test_number_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        number(**bad)


# --- integer ---------------------------------------------------------------------------------

@given(st.integers(min_value=-10**30, max_value=10**30))
def test_integer_is_exact_even_past_float_precision(n):
    check = integer(n)
    assert check(n).correct and check(str(n)).correct and check(f"{n:,}").correct
    assert check(n + 1) == Verdict(False, "Too high.")
    assert check(str(n - 1)) == Verdict(False, "Too low.")


def test_integer_answers():
    check = integer(1200)
    assert check("1.2e3").correct and check(1200.0).correct and check(np.int32(1200)).correct
    assert check("1200.5") == Verdict(False, "Expected a whole number.")
    assert not check(True).correct
    assert "not a number" in check("twelve hundred").message


@pytest.mark.parametrize("bad, error", [(1.5, TypeError), (True, TypeError), ("7", TypeError)])
def test_integer_refuses_non_integers(bad, error):
    with pytest.raises(error):
        integer(bad)


# --- choice ----------------------------------------------------------------------------------

def test_choice_ignores_case_and_spacing():
    check = choice("Bandwidth-bound", ["compute-bound", "bandwidth-bound"])
    assert check("  bandwidth-BOUND ").correct
    assert check("compute-bound") == Verdict(False, "Not quite.")
    assert check("memory") == Verdict(False, "Pick one of: compute-bound, bandwidth-bound.")
    assert choice("the  KV cache")("The KV   cache").correct


def test_choice_refuses_an_answer_missing_from_its_options():
    with pytest.raises(ValueError, match="not one of the options"):
        choice("c", ["a", "b"])


# --- sequence --------------------------------------------------------------------------------

@given(st.lists(st.integers(min_value=-10**6, max_value=10**6), min_size=1, max_size=20))
def test_sequence_reads_lists_typed_or_given(items):
    check = sequence(items)
    assert check(items).correct and check(tuple(items)).correct
    assert check(", ".join(map(str, items))).correct
    assert check(str(items)).correct  # "[1, 2, 3]"
    wrong = items[:-1] + [items[-1] + 1]
    assert check(wrong) == Verdict(False, f"Not quite: item {len(items)} differs.")
    assert check(items + [0]) == Verdict(False, f"Expected {len(items)} items, got {len(items) + 1}.")


def test_sequence_of_strings_and_unreadable_answers():
    assert sequence(["the", "cat"], parse=str)(" the, cat ").correct
    assert sequence(["the", "cat"], parse=str)(["the ", "cat"]).correct
    assert "Could not read" in sequence([1, 2])("1, two").message
    with pytest.raises(TypeError):
        sequence("123")


# --- Exercise --------------------------------------------------------------------------------

def make(**kw):
    args = dict(title="Squares <b>", prompt="What is $3^2$?\n\n$$\\sum_i x_i < 1$$",
                check=integer(9), hint="Multiply 3 by itself.", solution="**9**:\n\n```python\n3 * 3\n```")
    return Exercise(**{**args, **kw})


def test_exercise_call_gives_hint_only_when_wrong():
    ex = make()
    assert ex("9") == Verdict(True, "Correct.")
    wrong = ex("8")
    assert not wrong and wrong.message == "Too low. Hint: Multiply 3 by itself."
    assert "Hint: Multiply 3 by itself." in ex("nine").message


def test_exercise_accepts_a_plain_predicate():
    ex = make(check=lambda a: str(a).strip() == "yes")
    assert ex("yes").correct
    assert ex("no") == Verdict(False, "Not quite. Hint: Multiply 3 by itself.")


@pytest.mark.parametrize("bad, error", [(dict(check=9), TypeError), (dict(title=""), ValueError),
                                        (dict(hint="  "), ValueError), (dict(solution=None), ValueError)])
def test_exercise_refuses_bad_fields(bad, error):
    with pytest.raises(error):
        make(**bad)


def test_exercise_keyword_api_is_stable():
    # Chapters build exercises with these keywords; keep them working.
    ex = Exercise(title="t", prompt="p", check=number(1.5, rel=0.01), hint="h", solution="s", placeholder="GB")
    assert ex("1.5 GB").correct


def test_static_html_collapses_hint_and_solution_and_marks_math():
    page = make()._static_html()
    assert "Squares &lt;b&gt;" in page  # the title is escaped
    assert re.search(r"<details class=\"exercise-hint\"><summary>Hint</summary>.*Multiply", page)
    assert re.search(r"<details class=\"exercise-solution\"><summary>Solution</summary>.*<strong>9</strong>", page, re.S)
    assert "open" not in re.findall(r"<details[^>]*>", page)[0]  # collapsed
    assert r'class="math inline">\(3^2\)' in page
    assert r"\[\sum_i x_i &lt; 1\]" in page
    assert '<code class="language-python">3 * 3' in page
    assert make()._repr_html_() == page


# --- the widget, headless --------------------------------------------------------------------

def test_widget_checks_on_click_and_on_enter():
    ex = make()
    checker = ex.widget()
    box, button, feedback = checker.children
    assert CHECKER_CLASS in checker._dom_classes
    assert box.placeholder == "your answer" and button.description == "Check"
    box.value = "9"  # Enter (continuous_update=False) sets the value
    assert "✓" in feedback.value and "Correct." in feedback.value
    box.value = "10"
    assert "✗" in feedback.value and "Too high." in feedback.value and "Multiply 3" in feedback.value
    feedback.value = ""
    button.click()
    assert "Too high." in feedback.value
    box.value = "  "
    assert feedback.value == ""


def test_widget_feedback_is_escaped():
    ex = make(check=lambda a: Verdict(False, "<script>x</script>"))
    assert "<script>" not in ex.feedback_html("1")


def test_show_displays_without_a_kernel(capsys):
    make().show()  # outside IPython, display() prints the objects' text form
    out = capsys.readouterr().out
    assert "HTML object" in out and "HBox" in out


# --- checks as data (what the website runs) --------------------------------------------------

@pytest.mark.parametrize("check", [number(0.12, rel=0.01), integer(10**30), choice("A + G", ["A + G", "R + A"], True),
                                   sequence([1, 2]), sequence(["a"], parse=str),
                                   word_set(["x"], ["x", "y"], too_many="many", too_few="few")])
def test_a_check_rebuilt_from_its_json_spec_judges_the_same(check):
    again = Check(json.loads(json.dumps(check.spec)))
    for answer in ["12%", "0.13", str(10**30), "a+g", "R + A", "1, 2", "[1]", "a", "x", "x, y", "", "zzz"]:
        assert again(answer) == check(answer)


def test_choice_can_ignore_every_space():
    check = choice("A + G", ["ĠR + A", "A + G"], ignore_spaces=True)
    assert check("A+G").correct and check(" a +g").correct
    assert check("ĠR+A") == Verdict(False, "Not quite.")
    assert check("AG+") == Verdict(False, "Pick one of: ĠR + A, A + G.")


def test_word_set_ignores_order_and_case():
    check = word_set(["Paris", "Rome"], ["Paris", "Rome", "Oslo"], too_many="Too many.", too_few="Too few.")
    assert check("rome; PARIS").correct and check(["Paris", "Rome"]).correct
    assert check("Paris, Rome, Oslo") == Verdict(False, "Too many.")
    assert check("Paris") == Verdict(False, "Too few.")
    assert check("Paris, Oslo") == Verdict(False, "Not quite.")
    assert check("Madrid") == Verdict(False, "Use the candidate words: Paris, Rome, Oslo.")
    with pytest.raises(ValueError):
        word_set(["Madrid"], ["Paris"])


def test_digits_are_ascii_so_the_browser_reads_the_same():
    assert not number(12)("١٢").correct and not integer(12)("١٢").correct
    assert "Could not read" in sequence([12])("١٢").message


def test_a_custom_parse_or_unknown_kind_is_not_data():
    assert not hasattr(sequence([1.5], parse=float), "spec")
    with pytest.raises(ValueError, match="unknown check kind"):
        Check({"kind": "regex"})


def test_static_html_carries_the_spec_and_the_hint():
    page = make()._static_html()
    box = re.search(r'<div class="exercise-answer" data-check="([^"]*)"></div>', page)
    spec = json.loads(html.unescape(box.group(1)))
    assert spec == {"check": {"kind": "integer", "expected": "9"}, "hint": "Multiply 3 by itself.",
                    "placeholder": "your answer"}
    assert page.index("exercise-answer") < page.index("exercise-hint")  # the box sits under the prompt
