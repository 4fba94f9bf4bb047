"""Chapter 2's exercises: expected answers agree with hand arithmetic, the right answer passes,
wrong ones fail with the hint."""
import math

import pytest

from inference_internals.bpe import BPETokenizer
from inference_course.chapter_exercises import ch02
from inference_internals.weights import model_dir

from exercise_checks import assert_grades


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.from_pretrained(model_dir())


@pytest.fixture(scope="module")
def rag(tok):
    return ch02.rag_exercise(tok)


def test_expected_answers_by_hand():
    assert ch02.toy_tokens == ["ban", "an", "a"]
    e = {w: math.exp(v) for w, v in ch02.CANDIDATES.items()}
    total = sum(e.values())
    # 0.701 + 0.156 = 0.857 < 0.9 <= 0.857 + 0.095
    assert ch02.top_p_survivors == ["Paris", "London", "Rome"]
    assert (e["Paris"] + e["London"]) / total < 0.9 <= (e["Paris"] + e["London"] + e["Rome"]) / total
    e2 = {w: math.exp(v / 0.5) for w, v in ch02.CANDIDATES.items()}
    assert ch02.p_london == pytest.approx(e2["London"] / sum(e2.values()), rel=1e-6)


def test_there_are_at_least_three(tok):
    assert len(ch02.exercises(tok)) >= 3


@pytest.mark.parametrize("name, right, wrong", [
    ("merges", "ban, an, a", ["b, an, an, a", "ban, ana", "banana", "ban an a", ""]),
    ("rag", "A + G", ["ĠR + A", "R + A", "nonsense", "G + A"]),
    ("rag", "A+G", ["ĠR+A"]),
    ("top_p", "Paris, London, Rome", ["Paris, London", "Paris", "Paris, London, Rome, Berlin", "Madrid"]),
    ("top_p", "rome; paris ,london", ["London, Rome"]),
    ("temperature", f"{ch02.p_london:.4f}", ["0.156", "0.5", "1", "high"]),
])
def test_checks(rag, name, right, wrong):
    exercise = {"merges": ch02.merges_exercise, "rag": rag, "top_p": ch02.top_p_exercise,
                "temperature": ch02.temperature_exercise}[name]
    assert_grades(exercise, right, wrong)


def test_rag_exercise_uses_the_model_ranks(tok, rag):
    assert "6,549" in rag.prompt and "16,713" in rag.prompt  # (A, G) and (ĠR, A) in SmolLM2's merges
    assert tok.ranks[("A", "G")] < tok.ranks[("ĠR", "A")]
    assert tok.tokens(tok.encode(" RAG")) == ["ĠR", "AG"]
