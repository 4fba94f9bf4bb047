"""Chapter 7's exercises: the answers follow Gemma 3's config and the cache the library builds."""
import pytest
import torch

from inference_course.chapter_exercises import ch07
from inference_internals.kv_cache import RingKVCache


def test_answers_follow_the_config_and_the_cache():
    assert len(ch07.EXERCISES) >= 3
    ring = RingKVCache(ch07.CFG, 1, ch07.CONTEXT, dtype=torch.bfloat16, slack=0)
    assert ch07.windowed_mb == pytest.approx(ring.nbytes / 1e6)
    assert ch07.head_mb == pytest.approx(262_144 * 640 * 2 / 1e6)
    assert ch07.kept == 512


@pytest.mark.parametrize("ex", ch07.EXERCISES, ids=lambda ex: ex.title)
def test_right_answer_passes_and_a_wrong_one_fails(ex):
    right = ex.check.spec.get("expected") if hasattr(ex.check, "spec") else None
    assert right is not None
    assert ex.check(str(right))
    assert not ex.check(str(right * 3))
