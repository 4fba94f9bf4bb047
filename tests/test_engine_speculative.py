"""Speculative decoding as a mode of the engine's step: every running sequence proposes, one target pass
verifies all of them, each accepts by chapter 6's rule and rolls its cache back.

Checked against the exact invariants: greedy output equal to plain decoding (and to the chapters'
reference loops); sampled output distributed as the target's, over many samples of one request
(``n``), in batches; the pool's books balancing after every step, whatever is accepted or rejected.
"""
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals import LLM, SamplingParams
from inference_internals.cuda_graph import generate_graphed
from inference_internals.drafts import Eagle, EagleDraft, EarlyExitDraft, PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.sampling import Sampler
from inference_internals.speculative import Draft, Proposal, speculative_generate
from test_speculative import _exact_marginals, chi2_pvalue

TINY = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                   bos_token_id=0, eos_token_id=7)
EAGLE_FILE = Path(tempfile.mkdtemp()) / "eagle.pt"  # an untrained EAGLE layer for TINY, written by `tiny`
DRAFTS = {"ngram": {"method": "ngram", "num_speculative_tokens": 3},
          "early_exit": {"method": "early_exit", "num_layers": 1, "num_speculative_tokens": 3},
          "eagle": {"method": "eagle", "model": str(EAGLE_FILE), "num_speculative_tokens": 3}}


@pytest.fixture(scope="module")
def tiny():
    # fp64: a verify pass of several tokens and one-token steps agree far below any gap between the
    # top two logits, so "token-identical" tests the algorithm, not rounding (as test_speculative)
    torch.manual_seed(2)
    Eagle(TINY, torch.arange(TINY.vocab_size - 1)).save(EAGLE_FILE)  # every token but one: a draft vocabulary
    return random_model(TINY, seed=1, device="cpu", dtype=torch.float64)


def reference_draft(tiny, draft):
    """The same draft for chapter 6's loop (speculative_generate)."""
    return {"ngram": lambda: PromptLookupDraft(2), "early_exit": lambda: EarlyExitDraft(tiny, 1),
            "eagle": lambda: EagleDraft(tiny, Eagle.load(TINY, EAGLE_FILE))}[draft]()


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("packed", [False, True])
def test_greedy_batches_equal_plain_decoding_and_the_reference_loops(tiny, draft, packed):
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5], [6, 1, 6, 1, 6], [2]]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    llm = LLM(tiny, speculative_config=DRAFTS[draft], block_size=4, packed=packed)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs == [generate(tiny, p, 14, stop_ids=[]) for p in prompts]  # chapter 2's loop
    assert outs == [generate_graphed(tiny, p, 14, stop_ids=[], graph=False) for p in prompts]  # chapter 3's
    assert outs == [speculative_generate(tiny, p, reference_draft(tiny, draft), 14, gamma=3, stop_ids=[]).tokens
                    for p in prompts]
    assert llm.spec.steps > 0 and 0 < llm.spec.accepted <= llm.spec.proposed  # it verified, and kept some
    assert llm.pool.num_free == llm.pool.num_blocks


@pytest.mark.parametrize("sampler,schedule,draft", [(dict(temperature=1.0), "constant", "early_exit"),
                                                    (dict(temperature=0.7, top_k=4), "constant", "early_exit"),
                                                    (dict(temperature=1.0), "heuristic", "early_exit"),
                                                    (dict(temperature=1.0), "constant", "eagle")],
                         ids=["T=1", "T=0.7,top-k=4", "T=1,heuristic-gamma", "T=1,eagle"])
def test_sampled_tokens_follow_the_target_distribution_through_the_engine(tiny, sampler, schedule, draft):
    """The first four tokens of 800 samples of one request (n = 800, run as batches of 64), drafted by
    the target's first layer or an EAGLE layer (their own q: rejection sampling with a real residual;
    the EAGLE layer's q is zero on the token outside its vocabulary) against the exact marginals: the
    second to fourth come from the engine's speculative step. Under the heuristic schedule each
    sample's γ follows its own past acceptances, and the output is still the target's."""
    prompt, n, runs = [1, 4, 2], 4, 800
    exact = _exact_marginals(tiny, prompt, n, Sampler(**sampler))
    llm = LLM(tiny, speculative_config={**DRAFTS[draft], "num_speculative_tokens_schedule": schedule},
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


class _Reader(Draft):
    """Records the target's states the engine hands it (``hidden``) with the context they came with, and
    guesses the greedy continuation, wrong at every third call: kept and rejected guesses both happen."""
    needs_hidden = True

    def __init__(self, right: dict, seen: list):
        self.right, self.seen, self.calls = right, seen, 0

    def propose(self, context, gamma, hidden=None, sampler=None, generator=None):
        self.calls += 1
        self.seen.append((list(context), hidden.clone()))
        ahead = list(self.right.get(tuple(context[:3]), [])[len(context):len(context) + gamma])
        if ahead and self.calls % 3 == 0:
            ahead[0] = (ahead[0] + 1) % TINY.vocab_size
        return Proposal(ahead)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("budget", [64, 5], ids=["whole-prompts", "prompts-in-chunks-of-5"])
def test_a_draft_reads_the_targets_states_at_every_position_since_its_last_round(tiny, packed, budget):
    """What EAGLE's layer is fed: at each round the states of exactly the positions before the newest
    token that it has not read (the whole prompt at the first round, even one fed in chunks; then the
    last token's and each kept guess's), equal to a whole forward's over the same tokens."""
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 1, 6, 1, 6], [2, 6, 3]]
    right = {tuple(p[:3]): p + generate(tiny, p, 12, stop_ids=[]) for p in prompts}
    llm = LLM(tiny, speculative_config=DRAFTS["eagle"], block_size=4, packed=packed, max_num_seqs=3,
              max_num_batched_tokens=budget, enable_prefix_caching=False)
    seen = []
    llm.spec.template = _Reader(right, seen)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [right[tuple(p[:3])][len(p):] for p in prompts]
    read = dict.fromkeys(right, 0)  # per sequence, how many positions' states it has been handed
    for context, hidden in seen:
        start = len(context) - 1 - len(hidden)
        key = tuple(context[:3])
        assert start == read[key], (context, len(hidden))  # no gap, nothing twice: from 0 at the first round
        read[key] = len(context) - 1
        with torch.no_grad():
            whole = tiny(torch.tensor([context]), output_hidden_states=True)[1][-1][0]
        torch.testing.assert_close(hidden, whole[start:len(context) - 1], atol=1e-9, rtol=0)
    assert any(len(h) > 1 for c, h in seen[len(prompts):])  # a round that kept guesses handed several


def test_the_eagle_draft_file_is_checked_before_anything_runs(tiny, tmp_path):
    with pytest.raises(ValueError, match="speculative model is the eagle draft's file"):
        LLM(tiny, speculative_config={"method": "ngram", "model": str(EAGLE_FILE)})
    with pytest.raises(FileNotFoundError, match="train_eagle"):
        LLM(tiny, speculative_config={"method": "eagle", "model": str(tmp_path / "none.pt")})
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(EAGLE_FILE.read_bytes()[:1000])
    with pytest.raises(ValueError, match="is not an EAGLE draft file"):
        LLM(tiny, speculative_config={"method": "eagle", "model": str(damaged)})
    other = LlamaConfig(**{**TINY.__dict__, "hidden_size": 32, "head_dim": 8})
    Eagle(other, torch.arange(4)).save(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="trained for a target with"):
        LLM(tiny, speculative_config={"method": "eagle", "model": str(tmp_path / "other.pt")})


def test_the_eagle_layer_computes_in_the_dtype_asked_and_the_output_is_unchanged(tiny):
    prompts = [[1, 2, 3, 1, 2], [4, 5]]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = LLM(tiny, speculative_config={**DRAFTS["eagle"], "dtype": "bfloat16"}, block_size=4)
    assert llm.spec.template.eagle.dtype == llm.spec.template.lm_rows.dtype == torch.bfloat16
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == [generate(tiny, p, 10, stop_ids=[])
                                                                            for p in prompts]
    assert llm.spec.proposed > 0
    auto = LLM(tiny, speculative_config=DRAFTS["eagle"], block_size=4).spec.template
    assert auto.eagle.dtype == auto.lm_rows.dtype == tiny.dtype  # 'auto': the target's
    for bad in ({**DRAFTS["ngram"], "dtype": "bfloat16"}, {**DRAFTS["eagle"], "dtype": "fp8"}):
        with pytest.raises(ValueError, match="speculative dtype is one of"):
            LLM(tiny, speculative_config=bad)
