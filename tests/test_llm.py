"""The front door (LLM) and the checks every entry point makes at it (params).

Each bad request must fail with a clear message and change nothing: not the engine's
queues, not its block pool, not the other requests. The real-model check is the last test.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inference_internals import LLM, RequestOutput, SamplingParams
from inference_internals.device import parse_dtype
from inference_internals.drafts import PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import LLMEngine, OutOfBlocksError
from inference_internals.params import check_request, check_token_ids
from inference_internals.stop import StopStrings, finish, finish_reason
from inference_internals.sampling import Sampler
from inference_internals.speculative import speculative_generate

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=48,
                  eos_token_id=2)
MODEL = random_model(CFG, seed=0, device="cpu")
PROMPT = [5, 6, 7, 8]
BAD_IDS = [  # (prompt, error type, message)
    ([1.7, 2.2], TypeError, "integers"), ([True, 3], TypeError, "integers"), (["a"], TypeError, "integers"),
    ("hello", TypeError, "string"), ([3, 64], ValueError, r"in \[0, 64\)"), ([-1], ValueError, r"in \[0, 64\)"),
    ([], ValueError, "at least one"), ([3] * 48, ValueError, "no room"),
    (torch.tensor([1.0, 2.0]), TypeError, "float32 tensor"), (torch.tensor([True]), TypeError, "bool tensor"),
]
BAD_PARAMS = [  # (kwargs, error type, message)
    (dict(n=2.5), TypeError, "n must be an integer"), (dict(n=0), ValueError, "n must be >= 1"),
    (dict(seed=1.5), TypeError, "seed must be an integer"), (dict(seed=2 ** 64), ValueError, "seed must be in"),
    (dict(seed=-2), ValueError, "seed must be in"), (dict(seed=2 ** 63 - 1, n=2), ValueError, "seed \\+ n - 1"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an integer"),
    (dict(temperature=-1.0), ValueError, "temperature"), (dict(top_k=1.5), ValueError, "top_k"),
    (dict(top_p=1.5), ValueError, "top_p"), (dict(min_p=-0.1), ValueError, "min_p"),
    (dict(stop_token_ids=3), TypeError, "stop_token_ids"), (dict(stop_token_ids=[2.0]), TypeError, "stop token"),
    (dict(ignore_eos=1), TypeError, "ignore_eos"),
    (dict(stop=3), TypeError, "stop must be"), (dict(stop=[""]), TypeError, "stop must be"),
    (dict(stop=b"x"), TypeError, "stop must be"), (dict(stop=["ok", None]), TypeError, "stop must be"),
]


@pytest.mark.parametrize("kw,err,msg", BAD_PARAMS)
def test_bad_sampling_params_are_refused_when_made(kw, err, msg):
    with pytest.raises(err, match=msg):
        SamplingParams(**kw)


def test_sampler_refuses_a_bad_seed():
    for seed in (1.5, 2 ** 64, -1, True):
        with pytest.raises(ValueError, match="seed"):
            Sampler(temperature=1.0, seed=seed)


@pytest.mark.parametrize("prompt,err,msg", BAD_IDS)
def test_bad_token_ids_are_refused_everywhere(prompt, err, msg):
    """generate, speculative decoding, the engine and LLM refuse them alike, never truncating."""
    with pytest.raises(err, match=msg):
        check_token_ids(prompt, CFG.vocab_size, CFG.max_position_embeddings)
    with pytest.raises(err, match=msg):
        generate(MODEL, prompt, 3)
    with pytest.raises(err, match=msg):
        speculative_generate(MODEL, prompt, PromptLookupDraft(), 3)
    with pytest.raises(err, match=msg):
        LLM(MODEL).generate({"prompt_token_ids": prompt})


@pytest.mark.parametrize("prompt,err,msg", BAD_IDS)
def test_the_engine_refuses_a_bad_request_and_nothing_changes(prompt, err, msg):
    if isinstance(prompt, str):  # text is a prompt at the engine: it needs a tokenizer, which this one lacks
        err, msg = ValueError, "needs a tokenizer"
    engine = LLMEngine(MODEL, num_blocks=16, block_size=4)
    other = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    state = (engine.pool.num_free, list(engine.scheduler.running), list(engine.scheduler.waiting),
             len(engine.requests), list(other.seqs[0].token_ids))
    with pytest.raises(err, match=msg):
        engine.add_request(prompt)
    assert state == (engine.pool.num_free, list(engine.scheduler.running), list(engine.scheduler.waiting),
                     len(engine.requests), list(other.seqs[0].token_ids))
    engine.run()
    assert other.outputs[0] == generate(MODEL, PROMPT, 4)


def test_other_bad_requests_at_the_engine():
    engine = LLMEngine(MODEL, num_blocks=4, block_size=4)
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.add_request(PROMPT, {"max_new_tokens": 3})
    with pytest.raises(ValueError, match="stop_token_ids must be in"):
        engine.add_request(PROMPT, SamplingParams(temperature=0, stop_token_ids=(64,)))
    with pytest.raises(OutOfBlocksError, match="needs 5 blocks"):
        engine.add_request(PROMPT * 4, SamplingParams(temperature=0, max_tokens=4))
    assert engine.pool.num_free == 4 and not engine.has_unfinished() and not engine.requests


def test_engine_generate_takes_all_prompts_or_none():
    engine = LLMEngine(MODEL, num_blocks=16, block_size=4)
    with pytest.raises(TypeError, match="integers"):
        engine.generate([PROMPT, [1.5]], SamplingParams(temperature=0, max_tokens=2))
    assert not engine.has_unfinished() and engine.pool.num_free == 16
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=3))
    assert [o.outputs[0].token_ids for o in out] == [generate(MODEL, PROMPT, 3)]


def test_max_new_tokens_and_gamma_must_be_integers():
    with pytest.raises(TypeError, match="max_new_tokens must be an integer"):
        generate(MODEL, PROMPT, 2.5)
    with pytest.raises(TypeError, match="gamma must be an integer"):
        speculative_generate(MODEL, PROMPT, PromptLookupDraft(), 4, gamma=1.5)
    with pytest.raises(TypeError, match="num_speculative_tokens must be an integer"):
        LLM(MODEL, speculative_config={"method": "ngram", "num_speculative_tokens": 2.5})
    with pytest.raises(ValueError, match="unknown speculative method"):
        LLM(MODEL, speculative_config={"method": "medusa"})
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        LLM(MODEL, speculative_config={"method": "ngram", "num_speculative_tokens": 0})


def test_max_new_tokens_is_exact_for_one_prompt_or_several():
    for prompts in (PROMPT, [PROMPT, [9, 10]]):
        outs = LLM(MODEL).generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        assert all(len(o.outputs[0].token_ids) == 3 for o in outs)


@pytest.mark.parametrize("dtype,msg", [("int8", "unknown dtype"), ("bf-16", "unknown dtype"),
                                       (torch.int64, "floating-point"), (3, "floating-point")])
def test_dtype_strings_are_parsed_once_with_a_clear_error(dtype, msg):
    with pytest.raises(ValueError, match=msg):
        parse_dtype(dtype)


def test_dtype_names():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float32") is torch.float32
    assert parse_dtype(torch.float16) is torch.float16 and parse_dtype(None, "cpu") is torch.float32


def test_llm_refuses_a_device_or_dtype_its_model_is_not_in():
    with pytest.raises(ValueError, match="float32"):
        LLM(MODEL, dtype="bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        LLM(MODEL, dtype="bf-16")
    with pytest.raises(ValueError, match="unknown device"):
        LLM(MODEL, device="gpu")
    with pytest.raises(TypeError, match=r"unknown engine setting \['mode'\]"):
        LLM(MODEL, mode="fast")  # one runtime: no modes to choose


def test_stop_rule():
    req = check_request([7], MODEL.config, 5, stop_token_ids=[2])
    assert finish([4, 2, 5], req) == ([4, 2], "stop")
    assert finish([4, 5], req) == ([4, 5], None)
    assert finish([4, 5, 6], req, before=3) == ([4, 5], "length")  # the 5th new token spends the budget
    assert finish_reason(2, 1, req) == "stop" and finish_reason(5, 5, req) == "length"
    assert finish_reason(4, 1, req) is None


def test_one_request_check_resolves_the_budget_and_the_stops():
    ctx = MODEL.config.max_position_embeddings
    req = check_request(list(range(3, 10)), MODEL.config, 10 ** 6)
    assert req.max_new_tokens == ctx - 7 and req.stop_ids == {MODEL.config.eos_token_id}
    assert check_request([3], MODEL.config, 4, ignore_eos=True).stop_ids == frozenset()
    assert check_request(req, None) is req  # checked once: a checked request passes through
    with pytest.raises(ValueError, match="stop_token_ids must be in"):
        check_request([3], MODEL.config, 4, stop_token_ids=[MODEL.config.vocab_size])
    with pytest.raises(TypeError, match="integer"):
        check_request([3], MODEL.config, 2.0)


class Letters:
    """A toy tokenizer for the toy model: id i is the letter 'a' + i % 26, and ids 0..2 are special
    (no text), so a stop string can fall anywhere in an output."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids if not (skip_special_tokens and i < 3))

    def encode(self, text):
        return [ord(c) - 97 + 26 for c in text]


@given(st.lists(st.integers(0, 30), max_size=30), st.lists(st.text("abcd", min_size=1, max_size=3), min_size=1, max_size=3))
def test_stop_strings_cut_at_the_first_token_whose_text_holds_one(tokens, stops):
    text = Letters().decode
    watch = StopStrings(stops, lambda ids: text(ids, True))
    kept, _ = finish(tokens, check_request([3], None, len(tokens) + 1, ignore_eos=True), watch=watch)
    # the shortest prefix whose text contains a stop string, by brute force
    first = next((n for n in range(1, len(tokens) + 1) if any(s in text(tokens[:n], True) for s in stops)), None)
    if first is None:
        assert kept == tokens and watch.stop_reason is None
    else:
        full = text(tokens[:first], True)
        i = min(full.find(s) for s in stops if s in full)
        assert kept == tokens[:first] and watch.text == full[:i] and watch.num_tokens == first
        assert full.startswith(watch.text + watch.stop_reason) and watch.push(5)  # stays stopped


def test_stop_strings_in_every_layout_and_mode():
    """The same tokens and text in every layout and mode; none runs past the string."""
    prompts, tok = [PROMPT, [9, 10, 11, 9, 10]], Letters()
    free = [generate(MODEL, p, 12, stop_ids=[]) for p in prompts]
    texts = [tok.decode(f, True) for f in free]
    stop = texts[0][3:5]  # a string that appears in the first output
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop, "zzzz"])
    runs = [LLM(MODEL, tokenizer=tok), LLM(MODEL, tokenizer=tok, block_size=4, packed=True),
            LLM(MODEL, tokenizer=tok, speculative_config={"method": "ngram", "num_speculative_tokens": 3})]
    results = []
    for llm in runs:
        outs = llm.generate(prompts, params)
        results.append([(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].stop_reason) for o in outs])
        first = outs[0].outputs[0]
        assert first.finish_reason == "stop" and first.stop_reason == stop
        assert first.text == texts[0][: texts[0].find(stop)] and first.token_ids == free[0][: len(first.token_ids)]
        assert outs[0].metrics.num_tokens == len(first.token_ids)  # stopped there, not cut afterwards
    assert results[0] == results[1] == results[2]
    with pytest.raises(ValueError, match="needs? a tokenizer"):
        LLM(MODEL).generate(PROMPT, SamplingParams(temperature=0, stop="ab"))


def test_every_layout_and_mode_gives_the_same_greedy_tokens():
    """The padded and packed layouts, plain and speculative steps: one engine, one answer."""
    prompts = [PROMPT, [9, 10, 11, 9, 10], [3]]
    params = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(2, 17))
    expected = [generate(MODEL, p, 8, stop_ids=[2, 17]) for p in prompts]
    runs = [LLM(MODEL), LLM(MODEL, block_size=4, packed=True),
            LLM(MODEL, speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
            LLM(MODEL, speculative_config={"method": "early_exit", "num_layers": 1})]
    for llm in runs:
        outs = llm.generate(prompts, params)
        assert [o.outputs[0].token_ids for o in outs] == expected
        for o, e in zip(outs, expected):
            assert isinstance(o, RequestOutput) and o.error is None and o.finished
            assert o.outputs[0].finish_reason == ("stop" if e[-1] in (2, 17) else "length")
            m = o.metrics
            assert m.num_tokens == len(e) and 0 <= m.ttft <= m.finish_time - m.arrival_time
            assert m.tpot is None if len(e) < 2 else m.tpot >= 0


def test_one_prompt_or_many_and_n_samples():
    llm = LLM(MODEL)
    one = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4))
    assert len(one) == 1 and one[0].prompt_token_ids == PROMPT
    assert llm.generate(torch.tensor(PROMPT), SamplingParams(temperature=0, max_tokens=4))[0].outputs == one[0].outputs
    many = llm.generate([PROMPT, PROMPT], SamplingParams(max_tokens=4, temperature=1.0, seed=3, n=3))
    assert [len(o.outputs) for o in many] == [3, 3] and [c.index for c in many[0].outputs] == [0, 1, 2]
    # sample i of a request draws from seed + i, whatever else is in the batch
    alone = [LLM(MODEL).generate(PROMPT, SamplingParams(max_tokens=4, temperature=1.0, seed=3 + i))
             for i in range(3)]
    assert [c.token_ids for c in many[1].outputs] == [a[0].outputs[0].token_ids for a in alone]
    with pytest.raises(ValueError, match="2 prompts but 1"):
        llm.generate([PROMPT, PROMPT], [SamplingParams()])
    with pytest.raises(ValueError, match="needs? a tokenizer"):
        llm.generate("hello")


def test_a_request_that_fails_while_running_comes_back_with_its_error():
    class Broken(SamplingParams):
        def sampler(self, index=0, request=None):
            def boom(logits):
                raise RuntimeError("boom")
            return boom
    outs = LLM(MODEL).generate([PROMPT, [9, 10]], [SamplingParams(temperature=0, max_tokens=3), Broken()])
    assert outs[0].error is None and outs[0].outputs[0].token_ids == generate(MODEL, PROMPT, 3)
    assert "boom" in outs[1].error and outs[1].outputs[0].finish_reason == "abort"


def test_real_model_text_in_text_out(tokenizer=None):
    """The door with its defaults: SmolLM2-135M-Instruct from the offline cache, greedy, on the CPU."""
    from inference_internals.bpe import BPETokenizer
    from inference_internals.model import Llama
    model = Llama.from_pretrained(device="cpu", dtype=torch.float32)
    tok = BPETokenizer.from_pretrained()
    llm = LLM(model, tokenizer=tok)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=12))[0]
    ids = tok.encode(out.prompt)
    assert out.outputs[0].token_ids == generate(model, ids, 12)
    assert "Paris" in out.outputs[0].text


@pytest.mark.parametrize("make, err, msg", [
    (lambda: LLM(MODEL, foo=1), TypeError, r"unknown engine setting \['foo'\]"),
    (lambda: LLM(MODEL, block_size=0), ValueError, "block_size must be >= 1"),
    (lambda: LLM(MODEL, max_num_seqs=2.5), TypeError, "max_num_seqs must be an integer"),
    (lambda: LLM(MODEL, packed=True, padded_prefill=True), ValueError, "one layout"),
    (lambda: LLM(MODEL, tokenizer=object()), TypeError, "tokenizer must have encode"),
    (lambda: LLM(MODEL).generate(None), TypeError, "prompts must be text"),
    (lambda: LLM(MODEL).generate(5), TypeError, "prompts must be text"),
    (lambda: LLM(MODEL).generate([2 ** 63]), ValueError, r"token ids must be in \[0, 64\)"),
    (lambda: LLM(MODEL).generate([[5, 6], [2 ** 64]]), ValueError, r"token ids must be in \[0, 64\)"),
])
def test_the_door_refuses_bad_settings_and_prompts_by_name(make, err, msg):
    with pytest.raises(err, match=msg):
        make()


@pytest.mark.parametrize("kw, err, msg", [
    (dict(quantization="fp8"), ValueError, "quantization must be None or one of"),
    (dict(compile="yes"), TypeError, "compile must be a bool"),
    (dict(quantization="int8", optimize=False), ValueError, "a model the engine loads and optimizes itself"),
])
def test_speed_settings_are_checked_before_anything_loads(kw, err, msg):
    with pytest.raises(err, match=msg):
        LLM("/nonexistent/folder", **kw)  # refused before the (missing) model is looked for
    with pytest.raises(err, match=msg):
        LLM(MODEL, **kw)


def test_a_built_model_is_not_quantized_behind_the_callers_back():
    with pytest.raises(ValueError, match="call optimize"):
        LLM(MODEL, quantization="int8")


def test_the_door_quantizes_through_optimize():
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize
    from inference_internals.weights import ModelNotFoundError

    try:
        llm = LLM(quantization="int4", dtype="fp32")
    except ModelNotFoundError:
        pytest.skip("the real model is not prepared here")
    assert llm.model.weight_format == "int4"
    # the door's kernels ('auto': timed, so another run may choose another of near-equal speed)
    by_hand = optimize(Llama.from_pretrained(dtype="fp32"), weights="int4", quant_kernel=llm.model.quant_kernels)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompt = "The capital of France is"
    assert llm.generate(prompt, params)[0].outputs[0].token_ids == \
        LLM(by_hand, tokenizer=llm.tokenizer).generate(prompt, params)[0].outputs[0].token_ids


@pytest.mark.parametrize("quantization, layers", [("q4_1", "int4"), ("int8_asym", "int8_asym")])
def test_q4_1_and_int8_asym_at_the_door_take_the_block_kernels(quantization, layers):
    """'q4_1' is the file's own formats (its Q8_0 head too); it and 'int8_asym' go through the block
    kernels wherever they run."""
    from inference_internals.optimize import blockdot
    from inference_internals.model import Llama
    from inference_internals.optimize import QuantProjection, optimize
    from inference_internals.weights import ModelNotFoundError

    try:
        llm = LLM(quantization=quantization, dtype="fp32")
    except ModelNotFoundError:
        pytest.skip("the real model is not prepared here")
    head = llm.model.lm_head
    assert isinstance(head, QuantProjection) and head.fmt == "q8_0"  # the GGUF's own head, not int8
    assert llm.model.layers[0].mlp.down_proj.fmt == layers
    if blockdot.available() is None:  # the block kernels wherever they run
        assert llm.model.quant_kernels == {layers: "vnni", "q8_0": "vnni"}
    by_hand = optimize(Llama.from_pretrained(dtype="fp32"), weights=quantization, head="q8_0",
                       quant_kernel=llm.model.quant_kernels)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompts = ["The capital of France is", "def fibonacci(n):"]  # two rows: a batched step too
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == \
        [o.outputs[0].token_ids for o in LLM(by_hand, tokenizer=llm.tokenizer).generate(prompts, params)]


def test_forget_drops_only_a_finished_request_and_ids_stay_unique():
    """What a server does with an answered request: it leaves the engine, the others run on."""
    engine = LLMEngine(MODEL, num_blocks=16, block_size=4)
    short = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=1))
    long = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=6))
    with pytest.raises(ValueError, match="has not finished"):
        engine.forget(long)
    while not short.finished:
        engine.step()
    engine.forget(short)
    assert engine.requests == [long] and not long.finished
    third = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=2))
    assert len({short.id, long.id, third.id}) == 3  # an id is never reused
    engine.run()
    assert long.outputs[0] == generate(MODEL, PROMPT, 6) and third.outputs[0] == generate(MODEL, PROMPT, 2)
    engine.pool.check(engine.scheduler.sequences)
    assert engine.pool.num_used == 0


def test_the_kv_cache_dtype_is_what_the_pool_stores():
    """kv_cache_dtype (vLLM's setting): the pool holds half the bytes in bf16 or fp16; every layout and the
    speculative step read the same rounded K/V back into the model's dtype (the same greedy tokens as each
    other), and a step's log-probabilities stay within the rounding of the fp32 pool's; a name vLLM uses
    that is not built here is refused at the door."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    fp32 = LLM(MODEL).generate(PROMPT, greedy)[0].outputs[0]
    for dtype in ("bfloat16", "float16"):
        tokens = set()
        for kw in ({}, dict(attention="in_place"), dict(packed=True),
                   dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3})):
            llm = LLM(MODEL, kv_cache_dtype=dtype, **kw)
            out = llm.generate(PROMPT, greedy)[0].outputs[0]
            tokens.add(tuple(out.token_ids))
            pool = llm.runner.cache
            assert pool.k.dtype == pool.v.dtype == parse_dtype(dtype)
            assert pool.nbytes == 2 * CFG.num_hidden_layers * pool.num_blocks * CFG.num_key_value_heads \
                * pool.block_size * CFG.head_dim * 2  # K and V, 2 bytes each
        assert len(tokens) == 1, (dtype, tokens)
        first = {t: lp.logprob for t, lp in out.logprobs[0].items()}   # after the prompt alone
        for t, lp in fp32.logprobs[0].items():
            if t in first:
                assert abs(first[t] - lp.logprob) < 0.05, (dtype, t)
    with pytest.raises(ValueError, match="fp8 is not supported here"):
        LLM(MODEL, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype is one of"):
        LLM(MODEL, kv_cache_dtype="bf16")
