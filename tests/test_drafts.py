"""The three drafts: prompt lookup against Hugging Face's, the early-exit model against the
target's own hidden states, the draft cache against fresh decoding, and the MTP heads."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.drafts import (HEADS_PATH, EarlyExitDraft, ModelDraft, MTPDraft, MTPHeads,
                                        PromptLookupDraft, truncated_model)
from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.sampling import Sampler
from inference_internals.speculative import speculative_generate
from inference_course.train_mtp import generate_examples, make_dataset, train, training_prompts

TINY = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                   bos_token_id=0, eos_token_id=15)


@pytest.fixture(scope="module")
def tiny():
    return random_model(TINY, seed=3, device="cpu", dtype=torch.float64)


# --- prompt lookup ----------------------------------------------------------------------------

def test_prompt_lookup_examples():
    d = PromptLookupDraft(max_ngram=2)
    assert d.propose([1, 2, 3, 9, 9, 1, 2], 3).tokens == [3, 9, 9]
    assert d.propose([1, 2, 3, 1, 2, 4, 1, 2], 2).tokens == [3, 1]      # earliest match wins
    assert d.propose([7, 2, 5, 1, 2, 8, 7, 2], 2).tokens == [5, 1]      # the 2-gram [7, 2], not a later [2]
    assert d.propose([5, 1, 6, 3, 1], 4).tokens == [6, 3, 1]            # only a 1-gram matches; runs to the end
    assert d.propose([1, 2, 3, 4], 3).tokens == []                      # nothing repeats
    assert d.propose([1, 2, 1, 2], 0).tokens == []
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookupDraft(0)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDraft(2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDraft(2, min_ngram=0)


def test_prompt_lookup_min_ngram_skips_short_matches():
    d = PromptLookupDraft(max_ngram=3, min_ngram=2)
    assert d.propose([5, 1, 6, 3, 1], 4).tokens == []                   # only a 1-gram matches
    assert d.propose([7, 2, 5, 1, 2, 8, 7, 2], 2).tokens == [5, 1]      # a 2-gram still does
    assert d.propose([1, 2, 3, 4, 1, 2, 3], 2).tokens == [4, 1]         # the 3-gram, as before


@given(st.lists(st.integers(0, 3), min_size=2, max_size=30), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3))
@settings(max_examples=150, deadline=None)
def test_prompt_lookup_min_ngram_guesses_as_the_full_rule_or_not_at_all(context, gamma, lo, hi):
    # raising the floor only removes the guesses that came from a match shorter than it
    lo, hi = min(lo, hi), max(lo, hi)
    full = PromptLookupDraft(hi).propose(context, gamma).tokens
    floored = PromptLookupDraft(hi, min_ngram=lo).propose(context, gamma).tokens
    longest = max((n for n in range(1, min(hi, len(context) - 1) + 1)
                   if any(context[s:s + n] == context[-n:] for s in range(len(context) - n))), default=0)
    assert floored == (full if longest >= lo else [])


@given(st.lists(st.integers(0, 4), min_size=2, max_size=40), st.integers(1, 6), st.integers(1, 3))
@settings(max_examples=150, deadline=None)
def test_prompt_lookup_equals_hugging_face(context, gamma, ngram):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    hf = PromptLookupCandidateGenerator(eos_token_id=None, num_output_tokens=gamma,
                                        max_matching_ngram_size=ngram, max_length=1000)
    ids = torch.tensor([context])
    candidates, _ = hf.get_candidates(ids)
    assert PromptLookupDraft(ngram).propose(context, gamma).tokens == candidates[0, len(context):].tolist()


# --- early exit and model drafts ---------------------------------------------------------------

def test_truncated_model_is_the_first_layers_of_the_target(model):
    ids = torch.tensor([[1, 504, 3290, 314, 3365, 30, 2]])
    with torch.inference_mode():
        _, hidden = model(ids, output_hidden_states=True)
        for k in (1, 12, 29):
            shallow = truncated_model(model, k)
            torch.testing.assert_close(shallow(ids), model.lm_head(model.norm(hidden[k])), rtol=1e-5, atol=1e-5)
    assert shallow.embed_tokens.weight.data_ptr() == model.embed_tokens.weight.data_ptr()  # shared, not copied
    assert shallow.layers[0] is model.layers[0] and len(shallow.layers) == 29
    with pytest.raises(ValueError, match="n_layers"):
        truncated_model(model, 0)
    with pytest.raises(ValueError, match="n_layers"):
        truncated_model(model, 31)


@given(st.lists(st.integers(0, 14), min_size=1, max_size=10), st.lists(st.integers(0, 14), min_size=1, max_size=10),
       st.integers(0, 10), st.integers(1, 5))
@settings(max_examples=30, deadline=None)
def test_model_draft_cache_gives_fresh_decoding(tiny, a, b, cut, gamma):
    """Whatever the context did between rounds (grew, was partly rejected), the draft's cropped
    and topped-up cache proposes exactly what decoding the context from scratch would."""
    shallow = truncated_model(tiny, 2)
    draft = ModelDraft(shallow)
    draft.start(a, 64, stop_ids=set())
    for context in (a, a + b, (a + b)[: max(1, cut)], (a + b)[: max(1, cut)] + b):
        assert draft.propose(context, gamma).tokens == generate(shallow, context, gamma, stop_ids=[])


def test_model_draft_stops_at_eos_and_needs_start(tiny):
    draft = ModelDraft(tiny)
    with pytest.raises(RuntimeError, match="start"):
        draft.propose([1, 2], 3)
    plain = generate(tiny, [1, 2], 40, stop_ids=[])
    stop = plain[3]
    draft.start([1, 2], 64, stop_ids={stop})
    assert draft.propose([1, 2], 40).tokens == plain[:plain.index(stop) + 1]  # no guesses past a stop token


def test_full_depth_early_exit_is_the_target(tiny):
    out = speculative_generate(tiny, [3, 1, 4], EarlyExitDraft(tiny, TINY.num_hidden_layers), 20, gamma=4)
    assert out.acceptance_rate == 1.0 and out.tokens == generate(tiny, [3, 1, 4], 20)
    assert EarlyExitDraft(tiny, 2).name == "early exit (2 layers)"


def test_model_draft_sampling_returns_its_distributions(tiny):
    draft = ModelDraft(tiny)
    draft.start([1], 32, set())
    g = torch.Generator().manual_seed(0)
    prop = draft.propose([1, 2, 3], 4, sampler=Sampler(temperature=1.0), generator=g)
    assert prop.q.shape == (len(prop.tokens), TINY.vocab_size)
    torch.testing.assert_close(prop.q.sum(-1), torch.ones(len(prop.tokens), dtype=prop.q.dtype))
    assert all(prop.q[i, t] > 0 for i, t in enumerate(prop.tokens))


# --- MTP heads --------------------------------------------------------------------------------

def test_untrained_heads_are_the_lm_head():
    """Zero-initialised `up`: every head returns h, so it guesses what the LM head guesses."""
    vocab = torch.tensor([0, 3, 5, 8, 9])
    heads = MTPHeads(32, n_heads=3, rank=4, vocab=vocab)
    h, e = torch.randn(6, 32), torch.randn(6, 32)
    z = heads(h, e)
    assert z.shape == (6, 3, 32)
    torch.testing.assert_close(z, h[:, None].expand(-1, 3, -1))
    with pytest.raises(ValueError, match="n_heads"):
        MTPHeads(32, 0, 4, vocab)


def test_heads_save_and_load(tmp_path):
    heads = MTPHeads(32, 2, 4, torch.tensor([1, 2, 3]))
    with torch.no_grad():
        heads.up.normal_()
    path = tmp_path / "h.pt"
    heads.save(path, {"note": "x"})
    back = MTPHeads.load(path)
    assert back.meta == {"note": "x"} and back.vocab.tolist() == [1, 2, 3]
    for name, p in heads.named_parameters():
        torch.testing.assert_close(getattr(back, name), p.detach().half().float())
    with pytest.raises(FileNotFoundError, match="train_mtp"):
        MTPHeads.load(tmp_path / "missing.pt")


def test_mtp_draft_checks_its_inputs(tiny):
    with pytest.raises(ValueError, match="hidden size"):
        MTPDraft(tiny, MTPHeads(16, 2, 4, torch.tensor([1, 2])))
    draft = MTPDraft(tiny, MTPHeads(32, 2, 4, torch.tensor([1, 2, 5])))
    with pytest.raises(ValueError, match="hidden state"):
        draft.propose([1, 2], 2)
    h = torch.randn(32, dtype=torch.float64)
    assert len(draft.propose([1, 2], 5, hidden=h).tokens) == 2  # at most one guess per head
    prop = draft.propose([1, 2], 2, hidden=h, sampler=Sampler(temperature=1.0), generator=torch.Generator())
    assert set(prop.tokens) <= {1, 2, 5}
    assert prop.q[:, [0, 3, 4]].abs().sum() == 0  # no mass outside the heads' vocabulary
    torch.testing.assert_close(prop.q.sum(-1), torch.ones(2))


def test_mtp_draft_reads_a_quantized_targets_lm_head():
    """optimize(weights=...) replaces the LM head by its codes: the draft scores with the rows they stand for."""
    from inference_internals.optimize import optimize

    target = optimize(random_model(TINY, seed=3, device="cpu", dtype=torch.float32), dtype=torch.bfloat16,
                      weights="int8")
    vocab = torch.tensor([1, 2, 5])
    draft = MTPDraft(target, MTPHeads(32, 2, 4, vocab))
    torch.testing.assert_close(draft.lm_rows, target.lm_head.qw.dequantize()[vocab].to(torch.bfloat16))
    assert set(draft.propose([1, 2], 2, hidden=torch.randn(32, dtype=torch.bfloat16)).tokens) <= {1, 2, 5}


@pytest.fixture(scope="module")
def committed_heads():
    return MTPHeads.load()


def test_committed_heads_file(committed_heads):
    assert HEADS_PATH.exists() and HEADS_PATH.stat().st_size < 5 * 2 ** 20
    meta = committed_heads.meta
    assert meta["seed"] == 0 and len(meta["held_out_accuracy"]) == committed_heads.n_heads
    # head 1 (token t+2) beats chance by far on held-out prompts; later heads are harder
    assert meta["held_out_accuracy"][0] > 0.3
    assert meta["held_out_accuracy"][0] >= meta["held_out_accuracy"][-1]


def test_trained_heads_draft_for_the_real_model(model, tokenizer, committed_heads):
    text = "Describe a rainy afternoon in a small seaside town."
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]
    plain = generate(model, ids, 32)
    out = speculative_generate(model, ids, MTPDraft(model, committed_heads), 32, gamma=3)
    assert out.tokens == plain
    assert out.acceptance_rate > 0.2  # untrained (zero) heads would guess token t+1 again: ~never right


# --- training ---------------------------------------------------------------------------------

def test_make_dataset_shifts_targets():
    h = torch.arange(5, dtype=torch.float32)[:, None].expand(5, 4)
    H, X, Y = make_dataset([(h, torch.tensor([10, 11, 12, 13, 2]))], n_heads=2)
    assert X.tolist() == [10, 11, 12, 13]          # the last token has nothing after it
    assert Y.tolist() == [[11, 12], [12, 13], [13, 2], [2, -1]]
    assert H[:, 0].tolist() == [0, 1, 2, 3]        # h_s stays with token s


def test_training_prompts_are_seeded_and_mixed():
    a, b = training_prompts(40, 0), training_prompts(40, 0)
    assert a == b and len(set(a)) == 40 and a != training_prompts(40, 1)
    assert sum("\n\n" in p for p in a) == 40 // 3  # a third are tasks on a given passage


def test_training_is_reproducible(reference, tokenizer, tmp_path):
    kw = dict(n_prompts=4, max_new_tokens=5, batch_size=4, n_heads=2, rank=4, epochs=1, train_batch=4,
              progress=False, reference=reference, tokenizer=tokenizer)
    m1 = train(out=tmp_path / "a.pt", **kw)
    m2 = train(out=tmp_path / "b.pt", **kw)
    a, b = MTPHeads.load(tmp_path / "a.pt"), MTPHeads.load(tmp_path / "b.pt")
    assert m1["train_examples"] == m2["train_examples"] > 0
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.up, torch.zeros_like(a.up))  # it did train


def test_the_draft_vocabulary_is_the_tokens_written_most(reference, tokenizer, tmp_path):
    kw = dict(n_prompts=4, max_new_tokens=8, batch_size=4, n_heads=2, rank=4, epochs=1, train_batch=4,
              progress=False, reference=reference, tokenizer=tokenizer)
    meta = train(out=tmp_path / "v.pt", vocab_size=5, **kw)
    vocab = set(MTPHeads.load(tmp_path / "v.pt").vocab.tolist())
    # the heads' training examples: every prompt's generation but the held-out first
    examples = generate_examples(reference, tokenizer, training_prompts(4, 0)[1:], 8, 4, progress=False)
    _, _, Y = make_dataset(examples, n_heads=2)
    counts = torch.bincount(Y[Y >= 0])
    written = set(counts.nonzero().flatten().tolist())
    assert len(vocab) == 5 and vocab < written and meta["written_tokens"] == len(written)
    assert min(counts[t] for t in vocab) >= max(counts[t] for t in written - vocab)
    assert meta["vocab_coverage"] == pytest.approx(float(sum(counts[t] for t in vocab) / counts.sum()))
