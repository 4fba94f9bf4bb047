"""Chapter 1's exercises: expected answers checked against independent arithmetic or the model,
the right answer passes, wrong ones fail with the hint."""
import pytest
import torch

from inference_internals.kv_cache.base import Gathering

from inference_course.chapter_exercises import ch01
from inference_internals.model import LlamaConfig, random_model

from exercise_checks import assert_grades


def test_there_are_at_least_three():
    assert len(ch01.EXERCISES) >= 3


def test_llama3_8b_total_by_hand():
    d, L, kv, inter, V = 4096, 32, 8 * 128, 14336, 128256
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * inter + 2 * d
    assert ch01.llama3_total == L * per_layer + 2 * V * d + d == 8_030_261_248


def test_moe_fraction_by_hand():
    assert ch01.moe_fraction == pytest.approx(1 / 3 + 2 / 3 * 2 / 8) == pytest.approx(0.5)


@pytest.mark.parametrize("E, k", [(8, 2), (8, 1), (16, 4), (64, 6)])
def test_gate_routing_spends_a_third_of_the_saving(E, k):
    # The solution's claim: of the 1 - k/E that free routing would save, the gates spend a third.
    from inference_internals.analysis.moe import predicted_flop_fraction

    spent = predicted_flop_fraction(E, k, "gate") - k / E
    assert spent / (1 - k / E) == pytest.approx(1 / 3)
    assert "a third" in ch01.moe_exercise.solution and "half" not in ch01.moe_exercise.solution


class RecordingCache(Gathering):
    """Records the keys the model hands the cache: they are `k` right after apply_rope."""

    def __init__(self, cfg):
        self.cfg, self.shapes, self.length = cfg, [], 0   # the model reads its config (windows) from the cache

    def positions(self, B, T):
        return torch.arange(T).expand(B, -1)

    def begin(self, positions):
        pass

    def update(self, layer, k, v):
        self.shapes.append(list(k.shape))
        return k, v

    def commit(self, n):
        self.length += n


@pytest.mark.parametrize("batch,tokens", [(2, 7), (1, 3)])
def test_key_shape_is_what_the_model_makes(batch, tokens):
    cfg = LlamaConfig(vocab_size=50, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=4)
    cache = RecordingCache(cfg)
    with torch.no_grad():
        random_model(cfg, device="cpu")(torch.zeros(batch, tokens, dtype=torch.long), cache=cache)
    assert cache.shapes == [ch01.key_shape(cfg, batch, tokens)] * 2
    assert ch01.key_shape(LlamaConfig(), 2, 7) == [2, 3, 7, 64]


def _lens(tops, vocab=6):
    return torch.nn.functional.one_hot(torch.tensor(tops)[:, None], vocab).float()


def test_lens_exercise_answer_is_the_first_matching_layer():
    ex = ch01.lens_exercise(_lens([0, 1, 4, 2, 4, 4]), "A B C", " D")
    assert ex("2").correct and ex(2).correct
    for wrong in ["4", "5", "0", "two"]:
        verdict = ex(wrong)
        assert not verdict.correct and ex.hint in verdict.message
    with pytest.raises(ValueError):
        ch01.lens_exercise(torch.zeros(3, 2, 6), "x", "y")


def test_lens_exercise_on_the_real_model(model, tokenizer):
    from inference_internals.analysis.logit_lens import logit_lens

    ids = tokenizer("A B C D E F", return_tensors="pt").input_ids
    lens = logit_lens(model, ids)
    top = lens.argmax(-1)[:, 0].tolist()
    first = top.index(top[-1])
    assert ch01.lens_exercise(lens, "A B C D E F", " G")(first).correct


@pytest.mark.parametrize("exercise, right, wrong", [
    (ch01.params_exercise, "8,030,261,248", ["7.5e9", "8.6e9", "7504924672", "eight"]),
    (ch01.params_exercise, "8.03e9", ["8.1e9"]),
    (ch01.params_exercise, "8.03B", ["8.1B", "8.03", "8.03M"]),
    (ch01.params_exercise, "8.03 billion", ["7.5 billion"]),
    (ch01.EXERCISES[1], "2, 3, 7, 64", ["2, 9, 7, 64", "2, 7, 3, 64", "2, 7, 192", "[2, 3, 64, 7]"]),
    (ch01.EXERCISES[1], "[2, 3, 7, 64]", ["2 3 7 64"]),
    (ch01.EXERCISES[1], "(2, 3, 7, 64)", ["(2, 7, 3, 64)"]),
    (ch01.moe_exercise, "0.5", ["0.25", "0.333", "0.75", "1"]),
    (ch01.moe_exercise, "50%", ["25%"]),
])
def test_checks(exercise, right, wrong):
    assert_grades(exercise, right, wrong)
