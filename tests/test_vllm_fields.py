"""Every field of vLLM's SamplingParams, RequestOutput and CompletionOutput, as recorded from vLLM
(src/inference_internals/data/vllm_fields.json): supported with vLLM's meaning (a behavioural check
each), or refused with a NotImplementedError that names it and says why. Then log-probabilities in
every mode, against Hugging Face on the same weights."""
import ast
import dataclasses
import json
from importlib.resources import files

import pytest
import torch

from inference_internals import LLM, CompletionOutput, RequestOutput, SamplingParams
from inference_internals.bpe import BPETokenizer
from inference_internals.generate import chat_prompt, generate
from inference_internals.outputs import NOT_RETURNED
from inference_internals.model import Llama, load_reference
from inference_internals.params import REFUSED
from inference_internals.sampling import RequestSampler, Sampler

VLLM = json.loads(files("inference_internals").joinpath("data/vllm_fields.json").read_text())
EOS = 2
FP32 = dict(atol=5e-4, rtol=1e-4)  # our forward and HF's agree to ~1e-4 on logits (test_model)


@pytest.fixture(scope="module")
def model():
    return Llama.from_pretrained(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.from_pretrained()


@pytest.fixture(scope="module")
def llm(model, tok):
    return LLM(model, tokenizer=tok)


def chat(tok, text):
    return tok.encode(chat_prompt([{"role": "user", "content": text}]))


def one(llm, prompt, **kw):
    return llm.generate({"prompt_token_ids": prompt}, SamplingParams(**kw))[0].outputs[0]


# --- the behaviour of each supported field -----------------------------------------------------
# (a France question: greedy, SmolLM2 answers in 8 tokens ending with EOS; "Name three colours."
# runs past 16)
CHECKS = {}


def check(name):
    def register(fn):
        CHECKS[name] = fn
        return fn
    return register


def sampler_path(model, ids, n, sampler):
    return generate(model, ids, n, sample=sampler)


@check("n")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    outs = llm.generate({"prompt_token_ids": ids}, SamplingParams(n=3, seed=0, max_tokens=6))[0].outputs
    assert [o.index for o in outs] == [0, 1, 2] and all(len(o.token_ids) == 6 for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) > 1  # three samples, not one thrice


def penalty_check(name, value):
    def run(llm, model, tok):
        ids = chat(tok, "Name three colours.")
        ours = one(llm, ids, temperature=0, max_tokens=24, **{name: value})
        want = sampler_path(model, ids, 24, RequestSampler(Sampler(0), ids, **{name: value}, stop_ids=[EOS]))
        assert ours.token_ids == want  # (the sampler itself is checked against HF in test_logprobs)
        assert ours.token_ids != one(llm, ids, temperature=0, max_tokens=24).token_ids
    return run


CHECKS["presence_penalty"] = penalty_check("presence_penalty", 1.5)
CHECKS["frequency_penalty"] = penalty_check("frequency_penalty", 1.0)
CHECKS["repetition_penalty"] = penalty_check("repetition_penalty", 1.5)


def sampling_check(**kw):
    def run(llm, model, tok):
        ids = chat(tok, "Name three colours.")
        settings = {"temperature": 1.0, **kw}
        ours = one(llm, ids, seed=5, **settings)
        assert ours.token_ids == sampler_path(model, ids, 16, Sampler(**settings, seed=5))[:len(ours.token_ids)]
        assert len(ours.token_ids) == 16  # vLLM's default max_tokens
    return run


@check("temperature")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    assert one(llm, ids, temperature=0).token_ids == generate(model, ids, 16)  # 0: greedy
    sampling_check()(llm, model, tok)  # the default, 1.0: sampled from the softmax
    assert SamplingParams().temperature == 1.0


CHECKS["top_p"] = sampling_check(top_p=0.8)
CHECKS["top_k"] = sampling_check(top_k=20)
CHECKS["min_p"] = sampling_check(min_p=0.1)


@check("seed")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    a, b, c = (one(llm, ids, seed=s).token_ids for s in (7, 7, 8))
    assert a == b != c
    assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed"


@check("stop")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    free = one(llm, ids, temperature=0)
    o = one(llm, ids, temperature=0, stop=["France"])
    assert o.finish_reason == "stop" and o.stop_reason == "France"
    assert o.text == free.text[:free.text.index("France")] and len(o.token_ids) < len(free.token_ids)


@check("stop_token_ids")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    free = one(llm, ids, temperature=0).token_ids
    o = one(llm, ids, temperature=0, stop_token_ids=[free[2]])
    assert o.token_ids == free[:3] and o.finish_reason == "stop" and o.stop_reason == free[2]
    assert o.text == tok.decode(free[:2])  # the stop token is not in the text
    assert one(llm, ids, temperature=0, stop_token_ids=[12345]).token_ids == free  # EOS still stops


@check("ignore_eos")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    free = one(llm, ids, temperature=0)
    assert free.token_ids[-1] == EOS and free.finish_reason == "stop" and free.stop_reason is None
    o = one(llm, ids, temperature=0, ignore_eos=True, max_tokens=len(free.token_ids) + 4)
    assert o.token_ids[:len(free.token_ids)] == free.token_ids and len(o.token_ids) == len(free.token_ids) + 4
    assert o.finish_reason == "length"


@check("max_tokens")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    assert len(one(llm, ids, temperature=0).token_ids) == 16  # vLLM's default
    assert len(one(llm, ids, temperature=0, max_tokens=5).token_ids) == 5
    assert one(llm, ids, temperature=0, max_new_tokens=5).token_ids == generate(model, ids, 5)  # HF's name
    france = chat(tok, "What is the capital of France?")
    assert one(llm, france, temperature=0, max_tokens=None).token_ids == generate(model, france, 100)


@check("min_tokens")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    o = one(llm, ids, temperature=0, min_tokens=12, max_tokens=20)
    assert EOS not in o.token_ids[:12] and len(o.token_ids) >= 12
    assert o.token_ids == generate(model, ids, 20, sample=RequestSampler(Sampler(0), ids, min_tokens=12,
                                                                         stop_ids=[EOS]))
    # no stop string ends an output before min_tokens either (vLLM's check_stop): it is let pass
    word = one(llm, ids, temperature=0).text.split()[1]
    early = one(llm, ids, temperature=0, stop=[word])
    late = one(llm, ids, temperature=0, stop=[word], min_tokens=len(early.token_ids) + 1, max_tokens=20)
    assert early.finish_reason == "stop" and early.stop_reason == word
    assert len(late.token_ids) > len(early.token_ids) and late.token_ids[:len(early.token_ids)] == early.token_ids


@check("logprobs")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    o = one(llm, ids, temperature=0, logprobs=2, max_tokens=6)
    assert len(o.logprobs) == len(o.token_ids) == 6
    for t, pos in zip(o.token_ids, o.logprobs):
        assert list(pos)[0] == t and pos[t].rank == 1 and len(pos) == 2  # greedy: the chosen is the top 1
        assert pos[t].decoded_token == tok.decode([t], skip_special_tokens=False)
    assert o.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(o.token_ids, o.logprobs)))
    none = one(llm, ids, temperature=0, max_tokens=6)
    assert none.logprobs is None and none.cumulative_logprob is None


@check("prompt_logprobs")
def _(llm, model, tok):
    ids = chat(tok, "Name three colours.")
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=2))[0]
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    assert all(ids[i] in out.prompt_logprobs[i] and 1 <= len(out.prompt_logprobs[i]) <= 2 for i in range(1, len(ids)))


@check("detokenize")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    o = one(llm, ids, temperature=0, detokenize=False, logprobs=0)
    assert o.text == "" and o.token_ids == one(llm, ids, temperature=0).token_ids
    assert all(p.decoded_token is None for pos in o.logprobs for p in pos.values())
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop="x", detokenize=False)


@check("skip_special_tokens")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    shown = one(llm, ids, temperature=0, skip_special_tokens=False, include_stop_str_in_output=True)
    hidden = one(llm, ids, temperature=0, include_stop_str_in_output=True)
    assert shown.text == hidden.text + "<|im_end|>" == tok.decode(shown.token_ids, skip_special_tokens=False)


@check("spaces_between_special_tokens")
def _(llm, model, tok):
    # With a byte-level BPE (SmolLM2's), no spaces are added between special tokens either way: vLLM's fast
    # detokenizer decodes both settings to the tokenizer's own text, and so does this one.
    ids = chat(tok, "What is the capital of France?")
    texts = {one(llm, ids, temperature=0, skip_special_tokens=False, include_stop_str_in_output=True,
                 spaces_between_special_tokens=v).text for v in (True, False)}
    assert len(texts) == 1 and texts.pop().endswith(".<|im_end|>")


@check("include_stop_str_in_output")
def _(llm, model, tok):
    ids = chat(tok, "What is the capital of France?")
    cut = one(llm, ids, temperature=0, stop=["France"])
    kept = one(llm, ids, temperature=0, stop=["France"], include_stop_str_in_output=True)
    assert kept.text == cut.text + "France" and kept.token_ids == cut.token_ids


# --- the lists -------------------------------------------------------------------------------

def test_every_vllm_sampling_field_is_supported_or_refused():
    recorded = set(VLLM["SamplingParams"]["fields"])
    assert set(CHECKS) | set(REFUSED) == recorded and not set(CHECKS) & set(REFUSED)
    ours = {f.name for f in dataclasses.fields(SamplingParams)} - {"max_new_tokens"}
    assert ours == recorded


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_supported_field_has_vllms_default(name):
    assert getattr(SamplingParams(), name) == ast.literal_eval(VLLM["SamplingParams"]["fields"][name])


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_supported_field_has_vllms_meaning(name, llm, model, tok):
    CHECKS[name](llm, model, tok)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_field_says_which_and_why(name):
    default, why = REFUSED[name]
    assert SamplingParams(**{name: default})  # vLLM's default is accepted
    with pytest.raises(NotImplementedError, match=f"SamplingParams.{name} .*{why[:20]}"):
        SamplingParams(**{name: object()})
    if name != "output_kind":  # (vLLM's default is an enum member of its own)
        assert ast.literal_eval(VLLM["SamplingParams"]["fields"][name]) == default


def test_max_tokens_and_its_hf_alias():
    assert SamplingParams(max_new_tokens=8).max_tokens == 8
    assert SamplingParams(max_tokens=8, max_new_tokens=8).max_tokens == 8
    for kw in (dict(max_tokens=8, max_new_tokens=9), dict(max_tokens=16, max_new_tokens=9)):
        with pytest.raises(ValueError, match="max_tokens=.* and max_new_tokens=.* are the same setting"):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="n must be 1 when sampling greedily"):
        SamplingParams(temperature=0, n=2)


@pytest.mark.parametrize("cls", [RequestOutput, CompletionOutput])
def test_every_vllm_output_field_is_returned_or_said_absent(cls, llm, tok):
    recorded = set(VLLM[cls.__name__]["fields"])
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=2))[0]
    obj = out if cls is RequestOutput else out.outputs[0]
    present = {f for f in recorded if hasattr(obj, f)}
    assert present | set(NOT_RETURNED[cls.__name__]) == recorded and not present & set(NOT_RETURNED[cls.__name__])


# --- log-probabilities in every mode, against HF on the same weights -----------------------------

@pytest.fixture(scope="module")
def ref():
    return load_reference()


def hf_logprobs(ref, prompt, output):
    """HF's log_softmax at each output position, teacher-forced on prompt + output: [len(output), V]."""
    with torch.no_grad():
        logits = ref(torch.tensor([prompt + output])).logits[0].float()
    return logits.log_softmax(-1)[len(prompt) - 1:len(prompt) - 1 + len(output)]


MODES = {"padded": dict(block_size=4), "packed": dict(block_size=4, packed=True),
         "speculative": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3})}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_equal_hf_in_every_mode(mode, temperature, model, tok, ref):
    """Sampled or greedy, plain, paged or speculative: the target model's raw log-probabilities."""
    llm = LLM(model, tokenizer=tok, **MODES[mode])
    prompts = [chat(tok, "Name three colours."), chat(tok, "What is the capital of France?")]
    params = SamplingParams(temperature=temperature, seed=1, max_tokens=10, logprobs=3, prompt_logprobs=2)
    for prompt, out in zip(prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params)):
        o = out.outputs[0]
        lp = hf_logprobs(ref, prompt, o.token_ids)
        torch.testing.assert_close(torch.tensor([p[t].logprob for t, p in zip(o.token_ids, o.logprobs)]),
                                   lp.gather(-1, torch.tensor(o.token_ids)[:, None])[:, 0], **FP32)
        for i, (t, p) in enumerate(zip(o.token_ids, o.logprobs)):
            top = lp[i].topk(3)
            assert set(top.indices.tolist()) <= set(p) and len(p) in (3, 4)
            torch.testing.assert_close(torch.tensor([p[j].logprob for j in top.indices.tolist()]), top.values, **FP32)
        with torch.no_grad():
            plp = ref(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        ours = torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
        torch.testing.assert_close(ours, plp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])], **FP32)


def test_penalties_min_tokens_and_logprobs_agree_in_every_layout_and_mode(model, tok):
    """One prompt at a time, a batch (padded, packed), speculative decoding (each verified position judged
    by the history plain decoding would have had there): the same tokens, text and log-probabilities."""
    prompts = [{"prompt_token_ids": chat(tok, q)} for q in ("Name three colours.", "What is 2+2?")]
    params = SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3, presence_penalty=0.5,
                            frequency_penalty=0.2, min_tokens=3, logprobs=1)
    alone = [LLM(model, tokenizer=tok).generate(p, params)[0].outputs[0] for p in prompts]
    for settings in MODES.values():
        together = [o.outputs[0] for o in LLM(model, tokenizer=tok, **settings).generate(prompts, params)]
        for a, b in zip(alone, together):
            assert a.token_ids == b.token_ids and a.text == b.text
            torch.testing.assert_close(torch.tensor([p[t].logprob for t, p in zip(a.token_ids, a.logprobs)]),
                                       torch.tensor([p[t].logprob for t, p in zip(b.token_ids, b.logprobs)]), **FP32)
