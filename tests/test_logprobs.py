"""Log-probabilities, min_tokens and the three penalties, against Hugging Face on the same weights."""
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor,
                                                    RepetitionPenaltyLogitsProcessor)

from inference_internals.bpe import BPETokenizer
from inference_internals.generate import chat_prompt, generate
from inference_internals.logprobs import Logprob, LogprobRecorder, prompt_logprobs
from inference_internals.model import Llama, load_reference
from inference_internals.sampling import RequestSampler, Sampler, apply_penalties, ban
from inference_internals.weights import model_dir

EOS = 2
# Our forward and HF's agree to ~1e-4 on logits of ~10-20 (test_model); a log-softmax inherits that.
FP32 = dict(atol=5e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def model():
    return Llama.from_pretrained(model_dir(), device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def ref():
    return load_reference(model_dir())


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.from_pretrained(model_dir())


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.encode(chat_prompt([{"role": "user", "content": "Name three colours."}]))


def hf_generate(ref, ids, n, **kw):
    out = ref.generate(torch.tensor([ids]), max_new_tokens=n, return_dict_in_generate=True, output_logits=True,
                       pad_token_id=EOS, **kw)
    return out.sequences[0, len(ids):].tolist(), out


# --- the processors alone ---------------------------------------------------------------------

def history(logits, prompt_ids, output_ids):
    V = logits.shape[-1]
    mask = torch.zeros(1, V, dtype=torch.bool)
    mask[0, prompt_ids] = True
    counts = torch.zeros(1, V, dtype=torch.long)
    for t in output_ids:
        counts[0, t] += 1
    return mask, counts


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_hf(penalty):
    logits = torch.randn(1, 500, generator=torch.Generator().manual_seed(0)) * 3
    prompt_ids, output_ids = [3, 7, 7, 100], [7, 42, 42, 499]
    ours = apply_penalties(logits, *history(logits, prompt_ids, output_ids), repetition=penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt_ids + output_ids]), logits.clone())
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, logits)


def test_frequency_and_presence_are_openai_definitions():
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(1))
    prompt_ids, output_ids = [5, 6], [5, 9, 9, 9, 17]
    ours = apply_penalties(logits, *history(logits, prompt_ids, output_ids), presence=0.5, frequency=0.25)
    expected = logits.clone()
    for t, c in Counter(output_ids).items():  # the prompt's tokens are not penalised by these two
        expected[0, t] -= 0.25 * c + 0.5
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    assert ours[0, 6] == logits[0, 6]


def test_min_tokens_equals_hf():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(2))
    stops = torch.tensor([2, 50])
    theirs = MinNewTokensLengthLogitsProcessor(3, 2, [2, 50])(torch.tensor([[1, 4, 5, 8]]), logits.clone())
    assert torch.equal(ban(logits, stops), theirs)
    assert ban(logits, stops)[0, [2, 50]].isinf().all()


@pytest.mark.parametrize("bad", [dict(presence=3), dict(frequency=-2.5), dict(repetition=0),
                                 dict(repetition=float("inf"))])
def test_penalty_ranges(bad):
    with pytest.raises(ValueError):
        apply_penalties(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 4), **bad)


# --- the recorder: vLLM's shape ----------------------------------------------------------------

def test_recorder_is_log_softmax_with_ranks():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, -1.0]])
    rec = LogprobRecorder(2)
    rec.add(logits, torch.tensor([2]))
    (pos,) = rec.positions(lambda ids: f"<{ids[0]}>")
    lp = logits.log_softmax(-1)[0]
    assert list(pos) == [2, 1, 3]  # the chosen token first, then the top 2 (ties: lowest id first)
    assert pos[2] == Logprob(pytest.approx(lp[2].item()), 3, "<2>")  # two tokens score higher
    assert pos[1].rank == 1 and pos[3].rank == 2
    assert rec.cumulative() == pytest.approx(lp[2].item())
    everything = LogprobRecorder(-1)
    everything.add(logits, torch.tensor([1]))
    assert len(everything.positions()[0]) == 5
    with pytest.raises(ValueError, match="logprobs"):
        LogprobRecorder(-2)


# --- in a generation, against HF's generate on the same weights ---------------------------------

def test_greedy_logprobs_equal_hf(model, ref, prompt, tok):
    s = RequestSampler(Sampler(0), prompt, logprobs=5)
    ours = generate(model, prompt, 12, sample=s)
    theirs, out = hf_generate(ref, prompt, 12, do_sample=False)
    assert ours == theirs[:len(ours)]
    hf_lp = torch.cat(out.logits).float().log_softmax(-1)  # [steps, V]
    scores = ref.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)[0]
    positions = s.recorder.positions(lambda ids: tok.decode(ids))
    assert len(positions) == len(ours)
    chosen = torch.tensor([pos[t].logprob for t, pos in zip(ours, positions)])
    torch.testing.assert_close(chosen, scores[:len(ours)], **FP32)
    for i, (t, pos) in enumerate(zip(ours, positions)):
        assert pos[t].rank == 1  # greedy picks the argmax
        top = hf_lp[i].topk(5)
        assert list(pos)[0] == t and set(pos) == set(top.indices.tolist())
        torch.testing.assert_close(torch.tensor([pos[j].logprob for j in top.indices.tolist()]), top.values, **FP32)
        assert pos[t].decoded_token == tok.decode([t])
    assert s.recorder.cumulative() == pytest.approx(scores[:len(ours)].sum().item(), abs=len(ours) * 1e-3)


def test_prompt_logprobs_equal_hf(model, ref, prompt, tok):
    ours = prompt_logprobs(model, prompt, 3, tok.decode)
    assert len(ours) == len(prompt) and ours[0] is None
    with torch.no_grad():
        lp = ref(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    idx = torch.arange(1, len(prompt))
    torch.testing.assert_close(torch.tensor([ours[i][prompt[i]].logprob for i in idx.tolist()]),
                               lp[idx - 1, torch.tensor(prompt)[idx]], **FP32)
    for i in range(1, len(prompt)):
        entry = ours[i][prompt[i]]
        assert entry.rank == int((lp[i - 1] >= lp[i - 1, prompt[i]]).sum())
        assert set(lp[i - 1].topk(3).indices.tolist()) <= set(ours[i])


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_in_generation_equals_hf(model, ref, penalty):
    ids = [504, 3458, 282, 4649, 314, 504, 3458, 282]  # a prompt that invites repeating itself
    ours = generate(model, ids, 16, sample=RequestSampler(Sampler(0), ids, repetition_penalty=penalty))
    theirs, _ = hf_generate(ref, ids, 16, do_sample=False, repetition_penalty=penalty)
    assert ours == theirs[:len(ours)]
    assert ours != generate(model, ids, 16)  # the penalty changed what was generated


def test_penalised_sampling_equals_hf_with_the_same_seed(model, ref, prompt):
    cfg = dict(temperature=0.7, top_k=50)
    torch.manual_seed(3)
    ours = generate(model, prompt, 10, sample=RequestSampler(Sampler(**cfg), prompt, repetition_penalty=1.2))
    torch.manual_seed(3)
    theirs, _ = hf_generate(ref, prompt, 10, do_sample=True, repetition_penalty=1.2, **cfg)
    assert ours == theirs[:len(ours)]


def test_min_tokens_in_generation_equals_hf(model, ref, tok):
    ids = tok.encode(chat_prompt([{"role": "user", "content": "What is the capital of France?"}]))
    free = generate(model, ids, 30)
    assert free[-1] == EOS and len(free) < 20  # a short reply ending at EOS...
    n = len(free) + 5
    ours = generate(model, ids, 30, sample=RequestSampler(Sampler(0), ids, min_tokens=n, stop_ids=[EOS]))
    theirs, _ = hf_generate(ref, ids, 30, do_sample=False, min_new_tokens=n)
    assert ours == theirs[:len(ours)]
    assert EOS not in ours[:n]  # ... held open for min_tokens


def test_presence_and_frequency_change_the_output(model, prompt):
    base = generate(model, prompt, 24)
    s = RequestSampler(Sampler(0), prompt, presence_penalty=1.5, frequency_penalty=1.0)
    ours = generate(model, prompt, 24, sample=s)
    assert ours != base
    assert max(Counter(ours).values()) <= max(Counter(base).values())
