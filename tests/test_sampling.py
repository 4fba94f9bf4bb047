"""Our sampling filters against Hugging Face's logits warpers, and the sampler's statistics."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from inference_internals.model import Llama
from inference_internals.sampling import (Sampler, apply_temperature, greedy, min_p_filter,
                                          process_logits, top_k_filter, top_p_filter)
from inference_internals.weights import model_dir


def hf_process(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The warpers transformers' generate() builds for these settings, in its order."""
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(float(temperature)))
    if top_k != 0:
        procs.append(TopKLogitsWarper(top_k))
    if top_p != 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p != 0.0:
        procs.append(MinPLogitsWarper(min_p))
    return procs(None, logits.clone())


@pytest.fixture(scope="module")
def real_logits():
    """Next-token logits of the real model after a few prompts, [4, 49152]."""
    model = Llama.from_pretrained(model_dir(), device="cpu", dtype=torch.float32)
    prompts = [[1, 9690, 198], [1780, 314, 428, 6801, 47], [504, 3458, 282], [33, 34, 35]]
    with torch.inference_mode():
        return torch.cat([model(torch.tensor([p]), last_only=True)[:, -1] for p in prompts])


SETTINGS = [dict(temperature=0.7), dict(top_k=50), dict(top_p=0.9), dict(min_p=0.05),
            dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05), dict(temperature=1.5, top_p=0.95),
            dict(temperature=0.3, top_k=1), dict(top_p=0.0), dict(top_p=1e-9), dict(min_p=1.0),
            dict(temperature=2.0, top_k=49152, top_p=0.5), dict(top_k=100000)]


@pytest.mark.parametrize("cfg", SETTINGS, ids=str)
def test_real_logits_equal_hf_exactly(real_logits, cfg):
    ours, theirs = process_logits(real_logits, **cfg), hf_process(real_logits, **cfg)
    assert torch.equal(ours, theirs)  # bit-for-bit, -inf positions included
    assert torch.isfinite(ours).sum(-1).min() >= 1


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), batch=st.integers(1, 3), vocab=st.integers(1, 200),
       ties=st.booleans(), neg_inf=st.booleans(),
       temperature=st.sampled_from([1.0, 0.1, 0.5, 0.9, 1.7, 3.0]), top_k=st.integers(0, 210),
       top_p=st.one_of(st.just(1.0), st.floats(0, 1)), min_p=st.one_of(st.just(0.0), st.floats(0, 1)))
def test_random_logits_equal_hf_exactly(seed, batch, vocab, ties, neg_inf, temperature, top_k, top_p, min_p):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g) * 4
    if ties:  # coarse values make many exact ties at the cut-off
        logits = logits.round()
    if neg_inf:  # already-filtered logits, as after an earlier warper
        logits[torch.rand(batch, vocab, generator=g) < 0.3] = float("-inf")
        logits[:, 0] = 1.0
    cfg = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert torch.equal(process_logits(logits, **cfg), hf_process(logits, **cfg))


def test_each_filter_equals_its_warper(real_logits):
    x = real_logits
    assert torch.equal(apply_temperature(x, 0.6), TemperatureLogitsWarper(0.6)(None, x))
    assert torch.equal(top_k_filter(x, 40), TopKLogitsWarper(40)(None, x))
    assert torch.equal(top_k_filter(x, 1, min_tokens_to_keep=3), TopKLogitsWarper(1, min_tokens_to_keep=3)(None, x))
    assert torch.equal(top_p_filter(x, 0.8), TopPLogitsWarper(0.8)(None, x))
    assert torch.equal(top_p_filter(x, 0.1, 5), TopPLogitsWarper(0.1, min_tokens_to_keep=5)(None, x))
    assert torch.equal(min_p_filter(x, 0.1), MinPLogitsWarper(0.1)(None, x))
    assert torch.equal(min_p_filter(x, 1.0, 4), MinPLogitsWarper(1.0, min_tokens_to_keep=4)(None, x))


def test_filters_keep_what_they_promise(real_logits):
    x = real_logits[0]
    assert torch.isfinite(top_k_filter(x, 7)).sum() == 7  # real logits have no ties at the top
    kept = torch.isfinite(top_p_filter(x, 0.9))
    probs = x.double().softmax(-1)  # float32 cumsum over 49k entries is only good to ~1e-5
    assert probs[kept].sum() >= 0.9 - 1e-5
    assert probs[kept].min() >= probs[~kept].max()  # a head of the distribution
    drop_one = probs[kept].sum() - probs[kept].min()
    assert drop_one < 0.9 + 1e-5  # and the smallest such head
    kept = torch.isfinite(min_p_filter(x, 0.1))
    probs = x.softmax(-1)
    assert torch.equal(kept, probs >= 0.1 * probs.max())
    full = dict(temperature=0.8, top_k=30, top_p=0.9, min_p=0.02)
    assert torch.equal(process_logits(x, **full), process_logits(real_logits[:1], **full)[0])  # 1-D works
    assert torch.equal(x, real_logits[0])


def test_sampler_matches_processed_softmax(real_logits):
    """Chi-square goodness of fit of 20,000 draws to the processed distribution."""
    # the real row's 500 best tokens: a batch of 20,000 full-vocabulary rows would take gigabytes
    row = real_logits[1].topk(500).values[None]
    sampler = Sampler(temperature=1.3, top_k=40, top_p=0.95, seed=0)
    probs = sampler.probs(row)[0]
    n = 20_000
    draws = sampler(row.expand(n, -1))
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0  # never a filtered token
    exp = probs[support].double()
    p_value = stats.chisquare(counts[support], exp / exp.sum() * n).pvalue
    assert p_value > 1e-3
    # the test has power: the same draws reject the untempered distribution on the same support
    raw = row[0].double().softmax(-1)[support]
    assert stats.chisquare(counts[support], raw / raw.sum() * n).pvalue < 1e-6


def test_seeded_sampler_is_reproducible(real_logits):
    a = [Sampler(temperature=1.0, seed=7)(real_logits) for _ in range(2)]
    b, c = Sampler(temperature=1.0, seed=7), Sampler(temperature=1.0, seed=8)
    assert torch.equal(a[0], a[1])
    seq_b = torch.stack([b(real_logits) for _ in range(20)])
    seq_c = torch.stack([c(real_logits) for _ in range(20)])
    assert not torch.equal(seq_b, seq_c)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(Sampler(generator=g1)(real_logits), Sampler(generator=g2)(real_logits))


def test_temperature_zero_is_greedy(real_logits):
    assert torch.equal(Sampler(temperature=0)(real_logits), greedy(real_logits))
    assert torch.equal(Sampler(temperature=0).probs(real_logits).argmax(-1), greedy(real_logits))
    assert torch.equal(Sampler(top_k=1, seed=0)(real_logits), greedy(real_logits))


def test_temperature_sharpens_and_flattens(real_logits):
    def entropy(t):
        p = apply_temperature(real_logits[0], t).softmax(-1)
        return -(p * p.clamp_min(1e-30).log()).sum()

    assert entropy(0.5) < entropy(1.0) < entropy(2.0)


@pytest.mark.parametrize("call,match", [
    (lambda x: apply_temperature(x, 0), "temperature"),
    (lambda x: apply_temperature(x, -1.0), "temperature"),
    (lambda x: top_k_filter(x, 0), "top_k"),
    (lambda x: top_k_filter(x, 2.5), "top_k"),
    (lambda x: top_p_filter(x, 1.5), "top_p"),
    (lambda x: min_p_filter(x, -0.1), "min_p"),
    (lambda x: top_p_filter(x, 0.5, min_tokens_to_keep=0), "min_tokens_to_keep"),
    (lambda x: Sampler(temperature=-1), "temperature"),
    (lambda x: Sampler(top_k=-3), "top_k"),
    (lambda x: Sampler(top_p=2), "top_p"),
    (lambda x: Sampler(min_p=float("nan")), "min_p"),
    (lambda x: Sampler(seed=1, generator=torch.Generator()), "seed or a generator"),
    (lambda x: Sampler()(x.long()), "floating"),
    (lambda x: Sampler()(x[:, :0]), "non-empty"),
])
def test_bad_input_raises(real_logits, call, match):
    before = real_logits.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        call(real_logits)
    assert torch.equal(before, real_logits)
