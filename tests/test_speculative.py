"""Speculative decoding: the acceptance rules on toy distributions, the loop on tiny random
models (exact distributions by enumeration) and on the real model (token-identical to greedy)."""
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from inference_internals.drafts import ModelDraft, PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.sampling import Sampler
from inference_internals.speculative import (Draft, Proposal, Round, SpecResult, best_gamma, draw,
                                             expected_speedup, expected_tokens_per_pass, greedy_accept,
                                             rejection_accept, residual, speculative_generate)

TINY = LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                   bos_token_id=0, eos_token_id=7)


@pytest.fixture(scope="module")
def tiny():
    # fp64: a multi-token verification pass and one-token decode steps then agree far below any
    # gap between the top two logits, so "token-identical" tests the algorithm, not rounding.
    return random_model(TINY, seed=1, device="cpu", dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny_draft():
    return random_model(TINY, seed=2, device="cpu", dtype=torch.float64)


def chi2_pvalue(samples: list[int], probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit; cells expected to hold < min_expected samples are pooled."""
    n = len(samples)
    counts = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    expected = probs.double() * n
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    keep = exp > 0
    assert (obs[~keep] == 0).all(), "a sample fell where the distribution has no mass"
    return float(chisquare(obs[keep].numpy(), exp[keep].numpy() * obs.sum().item() / exp[keep].sum().item()).pvalue)


def test_draw_samples_the_distribution():
    g = torch.Generator().manual_seed(0)
    p = TOY_P[0]
    samples = [draw(p, g) for _ in range(6000)]
    assert 5 not in samples  # probability 0: never drawn
    assert chi2_pvalue(samples, p) > 1e-3
    assert draw(torch.tensor([0.0, 0.0, 1.0]), g) == 2


# --- acceptance rules ------------------------------------------------------------------------

def test_greedy_accept_examples():
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == (3, 8)   # all accepted: bonus token
    assert greedy_accept([5, 6, 7], [5, 9, 7, 8]) == (1, 9)   # mismatch at 1: the target's token
    assert greedy_accept([5, 6, 7], [4, 6, 7, 8]) == (0, 4)
    assert greedy_accept([], [3]) == (0, 3)                   # nothing drafted: a plain step


@given(st.lists(st.integers(0, 3), max_size=8), st.data())
@settings(deadline=None)
def test_greedy_accept_is_longest_matching_prefix(drafted, data):
    target = data.draw(st.lists(st.integers(0, 3), min_size=len(drafted) + 1, max_size=len(drafted) + 1))
    n, tok = greedy_accept(drafted, target)
    assert drafted[:n] == target[:n] and tok == target[n]
    assert n == len(drafted) or drafted[n] != target[n]


def test_greedy_accept_rejects_wrong_lengths():
    with pytest.raises(ValueError, match="γ\\+1"):
        greedy_accept([1, 2], [1, 2])


probability_vectors = st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6).filter(lambda x: sum(x) > 0.1)


@given(probability_vectors, st.data())
@settings(deadline=None)
def test_accept_or_resample_reassembles_p(pv, data):
    """P(out = x) = q(x) min(1, p(x)/q(x)) + P(reject) residual(x) = p(x), exactly."""
    qv = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(pv), max_size=len(pv)).filter(lambda x: sum(x) > 0.1))
    p = torch.tensor(pv, dtype=torch.float64)
    q = torch.tensor(qv, dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    accepted = torch.minimum(p, q)                       # q(x) * min(1, p(x)/q(x))
    r = residual(p, q)
    assert (r >= 0).all() and torch.isclose(r.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(accepted + (1 - accepted.sum()) * r, p)


def toy_round_samples(p, q, runs, seed, accept=rejection_accept):
    """Many seeded rounds: the draft samples γ guesses from q, ``accept`` decides. Returns the
    first output token of each round, the second (when the round produced one), and acceptances."""
    g = torch.Generator().manual_seed(seed)
    first, second, accepted_first = [], [], 0
    for _ in range(runs):
        drafted = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(len(q))]
        n, tok = accept(drafted, q, p, g)
        out = drafted[:n] + [tok]
        first.append(out[0])
        if len(out) > 1:
            second.append(out[1])
        accepted_first += n >= 1
    return first, second, accepted_first


TOY_P = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05, 0.00],
                      [0.05, 0.05, 0.10, 0.20, 0.30, 0.30],
                      [0.10, 0.10, 0.20, 0.20, 0.20, 0.20]], dtype=torch.float64)
TOY_Q = torch.tensor([[0.10, 0.40, 0.10, 0.10, 0.10, 0.20],   # puts mass where p has none
                      [0.30, 0.30, 0.10, 0.10, 0.10, 0.10]], dtype=torch.float64)


def test_rejection_sampling_keeps_the_target_distribution():
    runs = 8000
    first, second, acc = toy_round_samples(TOY_P, TOY_Q, runs, seed=0)
    assert chi2_pvalue(first, TOY_P[0]) > 1e-3
    assert chi2_pvalue(second, TOY_P[1]) > 1e-3
    assert 5 not in first  # p(5) = 0: never emitted, though the draft proposes it 20% of the time
    # the first guess is accepted with probability sum_x min(p(x), q(x)) (Leviathan et al., Def. 3.1)
    beta = torch.minimum(TOY_P[0], TOY_Q[0]).sum().item()
    assert abs(acc / runs - beta) < 4 * (beta * (1 - beta) / runs) ** 0.5


def test_the_chi_square_test_catches_a_wrong_rule():
    """Negative control: resampling from p instead of the residual over-weights what q likes."""
    def wrong(drafted, q, p, g):
        for i, x in enumerate(drafted):
            if torch.rand((), generator=g, dtype=p.dtype) * q[i, x] >= p[i, x]:
                return i, int(torch.multinomial(p[i], 1, generator=g))
        return len(drafted), int(torch.multinomial(p[-1], 1, generator=g))

    first, _, _ = toy_round_samples(TOY_P, TOY_Q, 4000, seed=0, accept=wrong)
    assert chi2_pvalue(first, TOY_P[0]) < 1e-6


def test_deterministic_draft_is_one_hot_q():
    g = torch.Generator().manual_seed(1)
    outs = [rejection_accept([1], None, TOY_P[:2], g) for _ in range(8000)]
    assert chi2_pvalue([1 if n else t for n, t in outs], TOY_P[0]) > 1e-3
    acc = sum(n for n, _ in outs) / len(outs)
    assert abs(acc - TOY_P[0, 1].item()) < 0.02  # accepted with probability p(1)


def test_rejection_accept_rejects_bad_input():
    p = TOY_P[:2]
    with pytest.raises(ValueError, match="p must be"):
        rejection_accept([1, 2], TOY_Q, p)
    with pytest.raises(ValueError, match="q must be"):
        rejection_accept([1], TOY_Q, p)
    with pytest.raises(ValueError, match="token ids"):
        rejection_accept([9], TOY_Q[:1], p)
    with pytest.raises(ValueError, match="probability distribution"):
        rejection_accept([1], TOY_Q[:1] * 2, p)
    q0 = torch.tensor([[0.5, 0.0, 0.5, 0, 0, 0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="probability 0 under q"):
        rejection_accept([1], q0, p)


# --- expectations ---------------------------------------------------------------------------

def test_expected_tokens_per_pass():
    assert expected_tokens_per_pass(0.0, 5) == 1
    assert expected_tokens_per_pass(1.0, 5) == 6
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_pass(0.8, 4) == pytest.approx(sum(0.8 ** i for i in range(5)))


@given(st.floats(0.0, 0.99), st.integers(0, 10))
@settings(max_examples=50, deadline=None)
def test_expected_tokens_is_the_mean_of_a_truncated_geometric(alpha, gamma):
    # tokens = 1 + (accepted guesses); P(accepted >= i) = alpha^i for i <= gamma
    assert expected_tokens_per_pass(alpha, gamma) == pytest.approx(1 + sum(alpha ** i for i in range(1, gamma + 1)))


def test_simulated_rounds_match_the_formula():
    rng = random.Random(0)
    alpha, gamma, rounds = 0.7, 4, 20000
    tokens = 0
    for _ in range(rounds):
        n = 0
        while n < gamma and rng.random() < alpha:
            n += 1
        tokens += n + 1
    assert tokens / rounds == pytest.approx(expected_tokens_per_pass(alpha, gamma), rel=0.02)


def test_speedup_and_best_gamma():
    assert expected_speedup(0.8, 4, 0.0) == expected_tokens_per_pass(0.8, 4)
    assert expected_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)  # useless draft: pure cost
    for alpha, c in [(0.6, 0.05), (0.8, 0.1), (0.9, 0.02), (0.3, 0.5)]:
        g = best_gamma(alpha, c)
        assert all(expected_speedup(alpha, g, c) >= expected_speedup(alpha, k, c) for k in range(33))
    assert best_gamma(0.1, 1.0) == 0  # a draft as slow as the target never pays
    assert best_gamma(0.9, 0.01) > best_gamma(0.9, 0.2)  # cheaper drafts -> longer guesses


@pytest.mark.parametrize("alpha, gamma, c", [(-0.1, 2, 0.1), (1.1, 2, 0.1), (0.5, -1, 0.1), (0.5, 1.5, 0.1),
                                             (0.5, 2, -1)])
def test_expectations_reject_bad_input(alpha, gamma, c):
    with pytest.raises(ValueError):
        expected_speedup(alpha, gamma, c)


# --- the loop on a tiny random model --------------------------------------------------------

class NoisyOracle(Draft):
    """Proposes the target's true greedy continuation, each guess replaced by a random token with
    probability ``noise``: every acceptance length 0..γ happens."""
    name = "noisy oracle"

    def __init__(self, truth: list[int], prompt_len: int, noise: float, seed: int, vocab: int):
        self.truth, self.prompt_len, self.noise, self.vocab = truth, prompt_len, noise, vocab
        self.rng = random.Random(seed)

    def propose(self, context, gamma, hidden=None, sampler=None, generator=None):
        done = len(context) - self.prompt_len
        out = []
        for t in self.truth[done:done + gamma]:
            out.append(self.rng.randrange(self.vocab) if self.rng.random() < self.noise else t)
        return Proposal(out)


@given(prompt=st.lists(st.integers(0, 6), min_size=1, max_size=12), gamma=st.integers(0, 6),
       noise=st.sampled_from([0.0, 0.3, 0.7, 1.0]), seed=st.integers(0, 100))
@settings(max_examples=40, deadline=None)
def test_greedy_output_is_token_identical(tiny, prompt, gamma, noise, seed):
    plain = generate(tiny, prompt, 20, stop_ids=[])  # no EOS: a tiny random model emits it early
    draft = NoisyOracle(plain, len(prompt), noise, seed, TINY.vocab_size)
    out = speculative_generate(tiny, prompt, draft, 20, gamma=gamma, stop_ids=[])
    assert out.tokens == plain
    assert [out.tokens[0]] + [t for r in out.rounds for t in r.new_tokens] == out.tokens
    if noise == 0.0 and gamma > 0:
        assert all(r.bonus for r in out.rounds)  # a perfect draft is never rejected


@given(prompt=st.lists(st.integers(0, 6), min_size=1, max_size=12), gamma=st.integers(1, 5))
@settings(max_examples=15, deadline=None)
def test_greedy_identity_with_model_and_lookup_drafts(tiny, tiny_draft, prompt, gamma):
    plain = generate(tiny, prompt, 24, stop_ids=[])
    for draft in (ModelDraft(tiny_draft), PromptLookupDraft(3), ModelDraft(tiny)):
        out = speculative_generate(tiny, prompt, draft, 24, gamma=gamma, stop_ids=[])
        assert out.tokens == plain, draft.name
    assert out.acceptance_rate == 1.0  # the target drafting for itself agrees with itself


def test_eos_inside_a_draft_ends_the_output(tiny):
    prompt = [1, 2, 3]
    plain = generate(tiny, prompt, 30, stop_ids=[])  # no stop: the full greedy path
    stop = plain[5]
    expected = generate(tiny, prompt, 30, stop_ids=[stop])
    assert expected == plain[: plain.index(stop) + 1]
    draft = NoisyOracle(plain, len(prompt), 0.0, 0, TINY.vocab_size)  # drafts run through the stop token
    out = speculative_generate(tiny, prompt, draft, 30, gamma=8, stop_ids=[stop])
    assert out.tokens == expected
    for r in out.rounds:  # guesses after a stop token are never even verified
        assert stop not in r.drafted[:-1]


def test_cache_rolls_back_and_budget_is_exact(tiny, tiny_draft):
    prompt = [3, 1, 4, 1, 5]
    for n in range(0, 9):
        out = speculative_generate(tiny, prompt, ModelDraft(tiny_draft), n, gamma=4, stop_ids=[])
        assert len(out.tokens) == n
        assert out.tokens == generate(tiny, prompt, n, stop_ids=[])


def _exact_marginals(model, prompt, n, sampler):
    """P(token i = v) for i < n by enumerating every path (vocab 8: 8^(n-1) contexts)."""
    V = model.config.vocab_size
    paths, weights = torch.tensor([prompt]), torch.ones(1, dtype=torch.float64)
    marginals = []
    with torch.inference_mode():
        for _ in range(n):
            p = sampler.probs(model(paths)[:, -1].double())           # [paths, V]
            joint = weights[:, None] * p
            marginals.append(joint.sum(0))
            paths = torch.cat([paths.repeat_interleave(V, 0), torch.arange(V).repeat(len(paths))[:, None]], 1)
            weights = joint.flatten()
    return marginals


@pytest.mark.parametrize("sampler", [Sampler(temperature=1.0), Sampler(temperature=0.7, top_k=4)],
                         ids=["T=1", "T=0.7,top-k=4"])
def test_sampled_tokens_follow_the_target_distribution(tiny, tiny_draft, sampler):
    """The loop's first four tokens, over many seeded runs, against the exact marginals: the
    second to fourth come from one round with γ = 3 of an unrelated random draft."""
    prompt, n, runs = [1, 4, 2], 4, 1000
    exact = _exact_marginals(tiny, prompt, n, sampler)
    g = torch.Generator().manual_seed(0)
    samples = [[] for _ in range(n)]
    accepted = 0
    for _ in range(runs):
        out = speculative_generate(tiny, prompt, ModelDraft(tiny_draft), n, gamma=3, sampler=sampler,
                                   generator=g, stop_ids=[])
        for i, t in enumerate(out.tokens):
            samples[i].append(t)
        accepted += sum(r.accepted for r in out.rounds)
    assert 0 < accepted < runs * 3  # the draft is right sometimes and wrong sometimes
    for i in range(n):
        assert chi2_pvalue(samples[i], exact[i]) > 1e-3, f"token {i}"


def test_same_seed_same_output(tiny, tiny_draft):
    runs = [speculative_generate(tiny, [1, 2], ModelDraft(tiny_draft), 12, gamma=3,
                                 sampler=Sampler(temperature=1.0, seed=5)).tokens for _ in range(2)]
    assert runs[0] == runs[1]


def test_bad_input_is_refused(tiny):
    d = PromptLookupDraft()
    with pytest.raises(ValueError, match="batch size 1"):
        speculative_generate(tiny, [[1, 2], [3, 4]], d)
    with pytest.raises(ValueError, match="at least one token id"):
        speculative_generate(tiny, [], d)
    with pytest.raises(TypeError, match="integers"):  # never truncated to [1, 2]
        speculative_generate(tiny, [1.7, 2.2], d)
    with pytest.raises(TypeError, match="gamma must be an integer"):
        speculative_generate(tiny, [1], d, gamma=1.5)
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(tiny, [1], d, gamma=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(tiny, [1], d, max_new_tokens=-1)
    with pytest.raises(TypeError, match="Sampler"):
        speculative_generate(tiny, [1], d, sampler=0.7)
    with pytest.raises(ValueError, match="context window"):
        speculative_generate(tiny, [1] * 128, d)
    assert speculative_generate(tiny, [1], d, max_new_tokens=0).tokens == []


def test_result_bookkeeping():
    r = SpecResult([9, 1, 2, 3, 4, 5, 6], [Round([1, 2, 7], 2, 3), Round([4, 5], 2, 6)])
    assert r.target_passes == 3
    assert r.tokens_per_round == (3 + 3) / 2
    assert r.acceptance_rate == 4 / 5  # 4 accepted, 1 rejected; none unchecked
    assert not r.rounds[0].bonus and r.rounds[1].bonus


def test_prefill_time_is_the_first_of_the_target_passes(tiny, tiny_draft):
    r = speculative_generate(tiny, [1, 2, 3], ModelDraft(tiny_draft), 10, gamma=3)
    assert len(r.rounds) >= 1
    assert 0 < r.prefill_seconds < r.target_seconds  # the rounds' verification passes come on top


# --- the real model ---------------------------------------------------------------------------

REAL_PROMPTS = ["Write a haiku about autumn leaves.",
                "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox.",
                "List three prime numbers and explain why they are prime."]


def test_real_model_greedy_is_token_identical(model, tokenizer):
    from inference_internals.drafts import EarlyExitDraft, MTPDraft, MTPHeads

    drafts = [PromptLookupDraft(2), EarlyExitDraft(model, 4), MTPDraft(model, MTPHeads.load())]
    for text in REAL_PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        plain = generate(model, ids, 16)
        for draft in drafts:
            out = speculative_generate(model, ids, draft, 16, gamma=3)
            assert out.tokens == plain, (draft.name, text)
            assert out.target_passes <= len(plain)  # never more passes than plain decoding
