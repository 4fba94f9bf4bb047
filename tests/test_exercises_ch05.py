"""Chapter 5's exercises: the right answer passes, wrong ones fail with the hint."""
import pytest

from inference_course.chapter_exercises import ch05

from exercise_checks import assert_grades


def test_there_are_at_least_three():
    assert len(ch05.EXERCISES) >= 3


def test_expected_answers_by_hand():
    assert ch05.blocks_answer == 2 + 2 + 3 + 7 + 1 == 15
    assert ch05.empty_slots == 15 * 16 - 187
    assert ch05.waste_answer == pytest.approx(1 - 500 / 2048)
    assert ch05.victim_answer == "D"              # the most recently admitted
    assert (ch05.fork_blocks, ch05.cow_answer) == (3, 6)  # 40 tokens: 2 full + 1 partial; 3 copies
    assert ch05.prefix_answer == 60 - 48          # three full blocks of system prompt reused
    assert ch05.packed_kept == [10, 5, 1 + 2 + 3]  # position + 1 keys for each token
    assert (ch05.packed_tokens, ch05.packed_keys) == (5, 4 * (3 + 2 + 1))


@pytest.mark.parametrize("exercise, right, wrong", [
    (ch05.blocks_exercise, "15", ["14", "12", "11.7", "many"]),
    (ch05.waste_exercise, "75.6%", ["24.4%", "0.5", "1", "x"]),
    (ch05.preemption_exercise, "D", ["A", "B", "C", "E"]),
    (ch05.cow_exercise, "6", ["3", "12", "4", "7"]),
    (ch05.prefix_exercise, "12", ["60", "10", "0", "28"]),
    (ch05.packed_exercise, "21", ["120", "24", "5", "16"]),
])
def test_checks(exercise, right, wrong):
    assert_grades(exercise, right, wrong)


def test_waste_accepts_a_fraction_too():
    assert ch05.waste_exercise(f"{ch05.waste_answer:.3f}").correct
