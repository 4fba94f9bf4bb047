"""Chapter 4's exercises: the right answer passes, wrong ones fail with the hint."""
import pytest

from inference_course.chapter_exercises import ch04
from inference_internals.analysis.kv_memory import GB

from exercise_checks import assert_grades


def test_there_are_at_least_three():
    assert len(ch04.EXERCISES) >= 3


def test_expected_answers_by_hand():
    # Llama-3-8B: 128 KiB per token in bf16, 4 GiB per 32k sequence, 16.06 GB of weights.
    assert ch04.batch_answer == int((80e9 - 8_030_261_248 * 2) // (2 * 32 * 8 * 128 * 32768 * 2)) == 14
    assert ch04.saved_gb == pytest.approx(2 * 80 * (64 - 8) * 128 * 8192 * 2 / GB)
    assert ch04.qwen_bytes == 2 * 28 * 4 * 128 * 2 == 57344
    assert ch04.mla_ratio == pytest.approx(2 * 128 * 128 / 576)
    assert 100 < ch04.flops_ratio < 200


@pytest.mark.parametrize("exercise, right, wrong", [
    (ch04.max_batch_exercise, "14", ["18", "15", "13.5", "many"]),
    (ch04.gqa_saving_exercise, f"{ch04.saved_gb:.2f}", ["21.47", "2.68", "8"]),
    (ch04.bytes_per_token_exercise, "57,344", ["401408", "28672", "57344.5"]),
    (ch04.mla_exercise, f"{ch04.mla_ratio:.1f}", ["28.4", "1", "x"]),
    (ch04.flops_ratio_exercise, f"{ch04.flops_ratio:.0f}", ["256", "1", "2"]),
])
def test_checks(exercise, right, wrong):
    assert_grades(exercise, right, wrong)
