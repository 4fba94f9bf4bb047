"""Chapter 6's exercises: the right answer passes, wrong ones fail with the hint."""
import pytest

from inference_course.chapter_exercises import ch06

from exercise_checks import assert_grades


def test_there_are_at_least_three():
    assert len(ch06.EXERCISES) >= 3


def test_expected_answers_by_hand():
    assert ch06.tokens_answer == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)  # 3.3616
    # (1 - 0.8^(g+1)) / (0.2 (0.1 g + 1)) for g = 1..8: 1.636, 2.033, 2.271, 2.401, 2.460, 2.470, 2.448, 2.405
    assert ch06.gamma_answer == 6
    assert ch06.acceptance_answer == pytest.approx(0.2 + 0.3 + 0.2)
    assert ch06.residual_answer == pytest.approx((0.5 - 0.2) / 0.3)  # = 1: all missing mass is A's


@pytest.mark.parametrize("exercise, right, wrong", [
    (ch06.tokens_per_pass_exercise, "3.36", ["5", "4", "3.2", "0.8^5", "lots"]),
    (ch06.best_gamma_exercise, "6", ["5", "7", "1", "32", "6.5"]),
    (ch06.acceptance_exercise, "0.7", ["0.5", "1", "0.3", "30%"]),
    (ch06.residual_exercise, "1", ["0.5", "0.3", "0", "0.75"]),
])
def test_checks(exercise, right, wrong):
    assert_grades(exercise, right, wrong)


def test_percent_answers():
    assert ch06.acceptance_exercise("70%").correct
