"""Our paged engine against transformers' own continuous batching (``generate_batch``): the same
greedy tokens per request in fp32, and the comparison's rules (a difference passes only at a near
tie of the plain forward; bad input is refused by name)."""
from types import SimpleNamespace

import pytest
import torch

from inference_course import hf_batching as hb


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return hb.text_prompts(tokenizer, [5, 19, 11])


def test_same_greedy_tokens_as_transformers_generate_batch(model, reference, prompts):
    ours, hf = hb.run_ours(model, prompts, 4), hb.run_hf(reference, prompts, 4)
    assert [len(t) for t in ours.tokens] == [len(t) for t in hf.tokens] == [4, 4, 4]
    c = hb.compare(ours.tokens, hf.tokens, prompts, reference)
    assert c.identical == [True, True, True] and c.ok, c.summary()
    for s in (ours, hf):  # timings are per request, in order, and positive
        assert len(s.ttft) == len(s.tpot) == 3 and all(t > 0 for t in s.ttft + s.tpot)
        assert 0 < max(s.ttft) <= s.seconds <= s.call_seconds and s.output_tokens == 12
    # the EOS-ignoring run starts as the one-prompt-at-a-time generate() does
    from inference_internals.generate import generate
    assert ours.tokens[1] == generate(model, prompts[1], 4, stop_ids=[])


def test_a_real_difference_fails(reference, prompts):
    ours = [[10, 20, 30], [40, 50, 60]]
    hf = [[10, 20, 30], [40, 0, 60]]  # token 0 is nowhere near the top two after this prompt
    c = hb.compare(ours, hf, prompts[:2], reference)
    assert c.identical == [True, False] and not c.ok
    (d,) = c.divergences
    assert (d.request, d.index, d.ours, d.hf) == (1, 1, 50, 0) and not d.near_tie
    assert "1 of 2 requests token-identical" in c.summary() and "token 1" in c.summary()


class _Stub:
    """A reference whose last-position logits are fixed: 5 best, then 7, then the rest."""
    device = torch.device("cpu")

    def __init__(self, gap):
        self.logits = torch.zeros(16)
        self.logits[5], self.logits[7] = 10.0, 10.0 - gap

    def __call__(self, ids):
        return SimpleNamespace(logits=self.logits.expand(1, ids.shape[1], -1))


@pytest.mark.parametrize("gap, hf_pick, ok", [(1e-5, 7, True),    # a near tie: summation order can flip it
                                               (0.5, 7, False),    # second best, but far behind
                                               (1e-5, 9, False)])  # not one of the two best at all
def test_only_a_near_tie_may_differ(gap, hf_pick, ok):
    c = hb.compare([[1, 5, 3]], [[1, hf_pick, 3]], [[2, 2]], _Stub(gap))
    assert c.ok is ok and c.divergences[0].index == 1
    assert c.divergences[0].margin == pytest.approx(gap, abs=1e-6)


@pytest.mark.parametrize("bad, err", [([], ValueError), ("some text", ValueError), ([[]], ValueError),
                                      (["text"], ValueError), ([[1, 2.0]], TypeError), ([[1, True]], TypeError),
                                      ([[-1]], ValueError), ([[49152]], ValueError)])
def test_bad_traces_are_refused(bad, err):
    with pytest.raises(err, match="prompt|token"):
        hb.check_trace(bad, 4, vocab_size=49152)


def test_bad_settings_are_refused(model, prompts):
    with pytest.raises(ValueError, match="max_tokens"):
        hb.run_ours(model, prompts, 0)
    with pytest.raises(ValueError, match="fp32"):
        hb.run_ours(torch.nn.Linear(2, 2).to(torch.bfloat16), prompts, 4)
    with pytest.raises(ValueError, match="one output per prompt"):
        hb.compare([[1]], [[1], [2]], [[3]], None)
    with pytest.raises(ValueError, match="same count"):
        hb.compare([[1, 2]], [[1]], [[3]], None)


def test_closest_call_finds_the_smallest_top_two_gap():
    c = hb.closest_call([[5, 5], [5]], [[2, 2], [3]], _Stub(0.25))
    assert c == {"margin": pytest.approx(0.25), "request": 0, "index": 0}
