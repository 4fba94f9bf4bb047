"""Chapter 3's exercises: the expected answers match hand arithmetic on the datasheets, the right
answer passes, wrong ones fail with the hint."""
import pytest

from inference_course.chapter_exercises import ch03

from exercise_checks import assert_grades


def test_there_are_at_least_three():
    assert len(ch03.EXERCISES) >= 3


def test_expected_answers_by_hand():
    assert ch03.h100_tok_s == pytest.approx(3.35e12 / (ch03.LLAMA70.params * 2))
    assert 23 < ch03.h100_tok_s < 25                      # ~70.6e9 parameters
    assert ch03.h200_crit == pytest.approx(989 / 4.8)      # ~206 sequences
    assert ch03.rtx_int4 == pytest.approx(1008e9 / (ch03.LLAMA8.params * 0.5))
    # A100: compute-bound above 312 / 2.039 = 153 tokens per pass; 64 is below, 512 above.
    assert ch03.workload_answer == "B"
    assert ch03.compute_bound(ch03.A100, 8e9, 154) and not ch03.compute_bound(ch03.A100, 8e9, 152)


@pytest.mark.parametrize("exercise, right, wrong", [
    (ch03.h100_exercise, f"{ch03.h100_tok_s:.1f}", ["47.5", "11.9", "1000", "fast"]),
    (ch03.workload_exercise, "B", ["A", "both", "neither"]),
    (ch03.critical_batch_exercise, f"{ch03.h200_crit:.0f}", ["1", "103", "412", "4.8"]),
    (ch03.int4_exercise, f"{ch03.rtx_int4:.0f}", ["63", "125", "502"]),
    (ch03.q4_1_exercise, f"{ch03.q4_1_tok_s:.1f}", ["14.9", "7.5", "3.7"]),   # 4 bits, 8 bits, bf16
    (ch03.memory_exercise, f"{ch03.saved_gb:.0f}", ["106", "141", "37"]),      # pure 4 bits, bf16 size, int4 size
])
def test_checks(exercise, right, wrong):
    assert_grades(exercise, right, wrong)


def test_quantized_formats_by_hand():
    from inference_internals.analysis import roofline

    assert ch03.q4_1_tok_s == pytest.approx(60e9 / (ch03.LLAMA8.params * 5 / 8))
    assert ch03.saved_gb == pytest.approx(ch03.LLAMA70.params * (16 - 4.25) / 8 / 1e9)
    # the law for any bits per weight agrees with the one for whole-byte formats
    for fmt, bits in (("int8", 8), ("int4", 4), ("bf16", 16)):
        assert roofline.predict_decode_tok_s(ch03.H100, 8e9, bits) == \
            pytest.approx(roofline.predict_decode_tok_s(ch03.H100, 8e9, fmt))
    with pytest.raises(ValueError, match="positive"):
        roofline.predict_decode_tok_s(ch03.H100, 8e9, 0)


def test_workload_choice_rejects_other_words():
    verdict = ch03.workload_exercise("prefill")
    assert not verdict.correct and "Pick one of" in verdict.message
    assert ch03.workload_exercise(" b ").correct  # case and spaces do not matter
