"""Speculative decoding as a mode of the engine's step: every running sequence proposes, one target pass
verifies all of them, each accepts by chapter 6's rule and rolls its cache back.

Checked against the exact invariants: greedy output equal to plain decoding (and to the chapters'
reference loops); sampled output distributed as the target's, over many samples of one request
(``n``), in batches; the pool's books balancing after every step, whatever is accepted or rejected.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals import LLM, SamplingParams
from inference_internals.cuda_graph import generate_graphed
from inference_internals.drafts import EarlyExitDraft, PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.sampling import Sampler
from inference_internals.speculative import Draft, Proposal, speculative_generate
from test_speculative import _exact_marginals, chi2_pvalue

TINY = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                   bos_token_id=0, eos_token_id=7)
DRAFTS = {"ngram": {"method": "ngram", "num_speculative_tokens": 3},
          "early_exit": {"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 3}}


@pytest.fixture(scope="module")
def tiny():
    # fp64: a verify pass of several tokens and one-token steps agree far below any gap between the
    # top two logits, so "token-identical" tests the algorithm, not rounding (as test_speculative)
    return random_model(TINY, seed=1, device="cpu", dtype=torch.float64)


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("packed", [False, True])
def test_greedy_batches_equal_plain_decoding_and_the_reference_loops(tiny, draft, packed):
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5], [6, 1, 6, 1, 6], [2]]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    llm = LLM(tiny, speculative_config=DRAFTS[draft], block_size=4, packed=packed)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs == [generate(tiny, p, 14, stop_ids=[]) for p in prompts]  # chapter 2's loop
    assert outs == [generate_graphed(tiny, p, 14, stop_ids=[], graph=False) for p in prompts]  # chapter 3's
    ref_draft = PromptLookupDraft(2) if draft == "ngram" else EarlyExitDraft(tiny, 1)
    assert outs == [speculative_generate(tiny, p, ref_draft, 14, gamma=3, stop_ids=[]).tokens for p in prompts]
    assert llm.spec.steps > 0 and 0 < llm.spec.accepted <= llm.spec.proposed  # it verified, and kept some
    assert llm.pool.num_free == llm.pool.num_blocks


@pytest.mark.parametrize("sampler,schedule", [(dict(temperature=1.0), "constant"),
                                              (dict(temperature=0.7, top_k=4), "constant"),
                                              (dict(temperature=1.0), "heuristic")],
                         ids=["T=1", "T=0.7,top-k=4", "T=1,heuristic-gamma"])
def test_sampled_tokens_follow_the_target_distribution_through_the_engine(tiny, sampler, schedule):
    """The first four tokens of 800 samples of one request (n = 800, run as batches of 64), drafted by
    the target's first layer (its own q: rejection sampling with a real residual) against the exact
    marginals: the second to fourth come from the engine's speculative step. Under the heuristic
    schedule each sample's γ follows its own past acceptances, and the output is still the target's."""
    prompt, n, runs = [1, 4, 2], 4, 800
    exact = _exact_marginals(tiny, prompt, n, Sampler(**sampler))
    llm = LLM(tiny, speculative_config={**DRAFTS["early_exit"], "num_speculative_tokens_schedule": schedule},
              block_size=4)
    out = llm.generate(prompt, SamplingParams(n=runs, seed=0, max_tokens=n, ignore_eos=True, **sampler))[0]
    assert len(out.outputs) == runs and all(len(o.token_ids) == n for o in out.outputs)
    assert 0 < llm.spec.accepted < llm.spec.proposed  # the draft is right sometimes and wrong sometimes
    for i in range(n):
        assert chi2_pvalue([o.token_ids[i] for o in out.outputs], exact[i]) > 1e-3, f"token {i}"


def test_a_wrong_acceptance_rule_is_caught_by_the_same_test(tiny, monkeypatch):
    """Planted: accept every guess (the target's distribution is then the draft's): the test above fails."""
    from inference_internals.engine import spec_decode

    monkeypatch.setattr(spec_decode, "rejection_accept", lambda drafted, q, p, g=None: (len(drafted), 0))
    prompt, n, runs = [1, 4, 2], 4, 800
    exact = _exact_marginals(tiny, prompt, n, Sampler(1.0))
    llm = LLM(tiny, speculative_config=DRAFTS["early_exit"], block_size=4)
    out = llm.generate(prompt, SamplingParams(n=runs, seed=0, max_tokens=n, ignore_eos=True))[0]
    assert min(chi2_pvalue([o.token_ids[i] for o in out.outputs], exact[i]) for i in range(1, n)) < 1e-3


@given(prompts=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=10), min_size=1, max_size=4),
       gamma=st.integers(1, 5), max_tokens=st.integers(1, 12), temperature=st.sampled_from([0.0, 1.0]),
       n=st.integers(1, 3), packed=st.booleans(), num_blocks=st.integers(6, 24), draft=st.sampled_from(sorted(DRAFTS)))
@settings(max_examples=40, deadline=None)
def test_the_pools_books_balance_after_every_speculative_step(tiny, prompts, gamma, max_tokens, temperature, n,
                                                              packed, num_blocks, draft):
    """Guesses take slots, rejections give them back, forks share, preemption frees: after every step
    every block is held exactly as often as tables name it, and at the end all are free."""
    if temperature == 0:
        n = 1  # (vLLM refuses n > 1 at greedy: the samples would be the same)
    llm = LLM(tiny, speculative_config={**DRAFTS[draft], "num_speculative_tokens": gamma}, block_size=2,
              num_blocks=num_blocks, packed=packed)
    params = SamplingParams(temperature=temperature, seed=3, n=n, max_tokens=max_tokens, ignore_eos=True)
    reqs = []
    for p in prompts:
        try:
            reqs.append(llm.add_request(p, params))
        except Exception:  # a request that can never fit is refused at the door; nothing changed
            llm.pool.check(llm.scheduler.sequences)
    while llm.has_unfinished():
        llm.step()
        llm.pool.check(llm.scheduler.sequences)
    assert llm.pool.num_free == num_blocks
    for r in reqs:
        assert [len(o) for o in r.outputs] == [max_tokens] * n


class _Scripted(Draft):
    """Guesses the plain greedy continuation (``right``), but a wrong first token at the calls in ``bad``
    (counted from 1); records the γ it is asked for each time."""

    def __init__(self, right: list[int], bad: set[int], asked: list[int]):
        self.right, self.bad, self.asked = right, bad, asked

    def propose(self, context, gamma, hidden=None, sampler=None, generator=None):
        self.asked.append(gamma)
        ahead = self.right[len(context):len(context) + gamma]
        if len(self.asked) in self.bad:
            ahead = [(ahead[0] + 1) % TINY.vocab_size] + ahead[1:]
        return Proposal(ahead)


@pytest.mark.parametrize("schedule,expect", [
    # all kept: 2 more (at most γ = 5); a miss: 1 fewer, down to 1
    ("heuristic", [5, 5, 5, 4, 3, 2, 1, 3, 5]),
    ("constant", [5] * 9)])
def test_the_heuristic_schedule_moves_gamma_by_hugging_faces_rule_and_keeps_greedy_output(tiny, schedule, expect):
    prompt, new = [1, 4, 2], 40
    right = prompt + generate(tiny, prompt, new, stop_ids=[])
    llm = LLM(tiny, speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                        "num_speculative_tokens_schedule": schedule}, block_size=4)
    asked = []
    llm.spec.template = _Scripted(right, bad={3, 4, 5, 6}, asked=asked)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=new, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == right[len(prompt):]
    assert asked[:len(expect)] == expect


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown num_speculative_tokens_schedule 'adaptive'"):
        LLM(random_model(TINY, seed=1, device="cpu"), speculative_config={"method": "ngram",
                                                                          "num_speculative_tokens_schedule": "adaptive"})
