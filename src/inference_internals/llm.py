"""The front door: one model, one call, and the engine underneath chosen for the request.

    from inference_internals import LLM, SamplingParams
    llm = LLM()                                    # SmolLM2-135M-Instruct, on the best device
    outs = llm.generate(["The capital of France is", "1, 2, 3,"], SamplingParams(temperature=0, max_tokens=16))
    outs[0].outputs[0].text, outs[0].metrics.ttft

Names, defaults and meanings follow vLLM (``LLM``, ``SamplingParams``, ``RequestOutput``,
``CompletionOutput``, ``speculative_config``'s keys): a script written for vLLM's offline
``LLM`` runs here with its import line changed. How a call runs (``mode``):

plain        ``generate``: one prompt at a time, contiguous KV cache
paged        ``paged.LLMEngine``: continuous batching on the paged cache, prefix caching,
             the n samples of a prompt sharing its blocks
speculative  ``speculative_generate`` with the draft that ``speculative=`` describes
auto         speculative if ``speculative`` is set, else paged for several prompts or n > 1,
             else plain

Every prompt and setting is checked (``params``) before anything runs. A request that fails
while running (paged mode) comes back with ``error`` set and the others untouched.

Stop strings (``SamplingParams(stop=...)``) need text, so they are ``LLM``'s: plain decoding stops
at the token that completes one; the paged engine and speculative decoding stop on token ids
only, and their outputs are cut at the string afterwards (the same tokens and text, some work
wasted past it).

``logprobs``/``prompt_logprobs`` come back in vLLM's shape (``logprobs.Logprob``) in every mode,
computed from the target model's raw logits (speculative decoding: the target's, never the
draft's). The penalties and ``min_tokens`` run in plain and paged mode; speculative decoding
refuses them (its verify pass would need each drafted position's own history).
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field, replace

import torch

from .device import get_device, parse_dtype
from .generate import chat_prompt, generate_stream
from .logprobs import Logprob, prompt_logprobs  # noqa: F401  (Logprob: the type of the logprobs' values)
from .paged.config import EngineConfig
from .params import CheckedRequest, SamplingParams, StopStrings, check_int, finish
from .timing import clock, tpot, ttft

MODES = ("auto", "plain", "paged", "speculative")
HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # LLM(model=HF_NAME), as a vLLM script names it: the offline cache
DRAFTS = ("ngram", "early_exit", "mtp")


# vLLM's output fields these outputs leave out, and why (tests/test_vllm_fields.py walks vLLM's list).
NOT_RETURNED = {
    "RequestOutput": {
        "lora_request": "no LoRA adapters", "encoder_prompt": "decoder-only models only",
        "encoder_prompt_token_ids": "decoder-only models only",
        "num_cached_tokens": "prefix-cache hits are counted per engine (LLMEngine.stats), not per request",
        "num_cache_creation_tokens": "prefix-cache writes are not counted per request",
        "prompt_token_id_logprobs": "prompt logprobs come as the top k only",
        "kv_transfer_params": "no disaggregated prefill", "ec_transfer_params": "no encoder cache transfer"},
    "CompletionOutput": {
        "routed_experts": "a dense model: no experts", "lora_request": "no LoRA adapters",
        "sampling_mask": "the sampler's kept set is not returned",
        "spec_decode_metrics": "speculative statistics are SpecResult's (speculative_generate), not an output's",
        "weight_versions": "the weights never change while serving"},
}


@dataclass
class CompletionOutput:
    index: int                 # which of the request's n samples
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (a stop id or string), "length" (max_tokens), "abort"
    stop_reason: int | str | None = None  # the stop string or stop_token_ids id that ended it (None: EOS)
    cumulative_logprob: float | None = None  # with logprobs: log p(output | prompt)
    logprobs: list[dict[int, Logprob]] | None = None  # with logprobs=k: one dict per token


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_tokens: int = 0        # generated, over all samples

    @property
    def ttft(self) -> float | None:
        """Time to first token (s): arrival to the first sampled token (``timing.ttft``)."""
        return None if self.first_token_time is None else ttft(self.arrival_time, self.first_token_time)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (s), over the request's samples (``timing.tpot``)."""
        if self.finish_time is None or self.first_token_time is None:
            return None
        return tpot(self.first_token_time, self.finish_time, self.num_tokens)


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    error: str | None = None   # why the request was aborted, if it was
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with prompt_logprobs=k; first None

    @property
    def finished(self) -> bool:
        return self.error is not None or all(o.finish_reason for o in self.outputs)


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: which draft, and γ guesses per round."""
    method: str = "ngram"
    num_speculative_tokens: int = 4      # γ
    prompt_lookup_max: int = 2           # ngram: longest n-gram matched
    prompt_lookup_min: int = 1           # ngram: shortest n-gram worth a guess
    num_layers: int = 4                  # early_exit: target layers the draft runs

    def __post_init__(self):
        if self.method not in DRAFTS:
            raise ValueError(f"unknown speculative method {self.method!r}: expected one of {DRAFTS}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "num_layers"):
            check_int(name, getattr(self, name), 1)  # γ = 0 would be plain decoding with extra steps

    def draft(self, model):
        from .drafts import EarlyExitDraft, MTPDraft, MTPHeads, PromptLookupDraft
        if self.method == "ngram":
            return PromptLookupDraft(self.prompt_lookup_max, self.prompt_lookup_min)
        if self.method == "early_exit":
            if self.num_layers >= model.config.num_hidden_layers:
                raise ValueError(f"num_layers must be below the model's {model.config.num_hidden_layers}, "
                                 f"got {self.num_layers}")
            return EarlyExitDraft(model, self.num_layers)
        return MTPDraft(model, MTPHeads.load().to(model.device))


def quantization_args(quantization: str | None, device) -> dict:
    """The ``optimize`` arguments of ``LLM(quantization=...)`` beside ``weights``. 'q4_1' is the file's
    own formats: its Q4_1 layers and a Q8_0 LM head (the GGUF's format for the tied embedding; its
    scales rounded up to bf16 numbers, so the head's values are near the file's, not all equal).
    'q4_1' and 'int8_asym' (whose grid holds the file's Q4_1 blocks) go through the block kernels
    (blockdot.py) on a CPU that runs them: their activations rounded to two int8 codes, which keeps
    the model's next token where bf16 activations move it; elsewhere, and for the other formats,
    the fastest of torch's kernels per kind of weight (``quant_kernel='auto'``). ``make bench``
    measures the choice: decode tok/s beside llama.cpp (its quantized section), and top-1
    agreement with fp32 (its quality section)."""
    from . import blockdot

    if quantization not in ("q4_1", "int8_asym"):
        return {}
    kernels = "auto"
    if torch.device(device).type == "cpu" and blockdot.available() is None:
        kernels = {"int4" if quantization == "q4_1" else "int8_asym": "vnni", "q8_0": "vnni"}
    return {"head": "q8_0", "quant_kernel": kernels}


class LLM:
    """``model``: None (SmolLM2-135M-Instruct from the offline cache), a checkpoint folder, or
    a ``model.Llama`` already built. ``device``/``dtype`` ('cpu', 'cuda', 'bf16', ...) choose
    where a loaded model goes. ``speculative``: a ``SpeculativeConfig`` or its dict.
    ``engine`` settings (``num_blocks``, ``block_size``, ``packed``, ...) are ``EngineConfig``'s.
    A model that ``LLM`` loads itself is made fast first (``optimize.optimize``: fused projections,
    the fastest kernel per weight here) unless ``optimize=False``; ``quantization`` ('int8',
    'q8_0', 'int4', 'int8_asym' or 'q4_1', vLLM's word; None keeps the exact weights) quantizes its
    projections ('q4_1': the GGUF's own formats, Q4_1 layers and its Q8_0 LM head, the bytes llama.cpp
    reads; it and 'int8_asym' multiplied by the block kernels where the CPU has AVX-512 VNNI:
    ``quantization_args``), and
    ``compile=True`` compiles its batch-1 decode step (a minute or more on the first step). A
    ``Llama`` passed in is used as it is. Every setting is checked before the model is loaded."""

    def __init__(self, model=None, tokenizer=None, device=None, dtype=None, speculative=None,
                 mode: str = "auto", optimize: bool = True, quantization: str | None = None,
                 compile: bool = False, **engine):
        from .model import Llama
        from .optimize import FORMATS, optimize as optimize_model
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: expected one of {MODES}")
        if isinstance(speculative, dict):
            speculative = SpeculativeConfig(**speculative)
        if speculative is not None and not isinstance(speculative, SpeculativeConfig):
            raise TypeError(f"speculative must be a SpeculativeConfig or a dict, got {type(speculative).__name__}")
        if mode == "speculative" and speculative is None:
            raise ValueError("mode='speculative' needs speculative={'method': ..., 'num_speculative_tokens': γ}")
        if speculative is not None and mode in ("plain", "paged"):
            raise ValueError(f"speculative decoding runs in its own mode, not {mode!r}")
        self.engine_config = EngineConfig.of(**engine)
        if tokenizer is not None and not all(callable(getattr(tokenizer, f, None)) for f in ("encode", "decode")):
            raise TypeError(f"tokenizer must have encode(text) and decode(ids), got {type(tokenizer).__name__}")
        if quantization is not None and quantization not in FORMATS:
            raise ValueError(f"quantization must be None or one of {FORMATS}, got {quantization!r}")
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be a bool, got {compile!r}")
        fast = {"weights": quantization, "compile": compile}
        if (quantization or compile) and (isinstance(model, Llama) or not optimize):
            raise ValueError("quantization and compile apply to a model LLM loads and optimizes itself: pass a "
                             "path (or None), or call optimize(model, weights=..., compile=...) on your Llama")
        if isinstance(model, Llama):
            if device is not None and torch.device(get_device(device)) != model.device:
                raise ValueError(f"the model is on {model.device}, not {device}: move it, or pass a path")
            if dtype is not None and parse_dtype(dtype) != model.dtype:
                raise ValueError(f"the model is in {model.dtype}, not {dtype}")
            self.model = model
        elif model is None or isinstance(model, (str, os.PathLike)):
            from .bpe import BPETokenizer
            model = None if model == HF_NAME else model
            dev = get_device(device)
            self.model = Llama.from_pretrained(model, device=dev, dtype=parse_dtype(dtype, dev))
            if optimize:
                optimize_model(self.model, **fast, **quantization_args(quantization, dev))
            tokenizer = tokenizer or BPETokenizer.from_pretrained(model)
        else:
            raise TypeError(f"model must be None, a path or a Llama, got {type(model).__name__}")
        self.tokenizer, self.speculative, self.mode = tokenizer, speculative, mode
        self._draft = speculative.draft(self.model) if speculative else None
        self._next_id = 0

    @property
    def config(self):
        return self.model.config

    # --- the door ---
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Outputs for one prompt or a list: text (needs a tokenizer), token ids, or
        ``{"prompt_token_ids": [...]}``. One ``SamplingParams`` for all, or one per prompt."""
        if prompts is None or isinstance(prompts, (numbers.Number, bytes)):
            raise TypeError(f"prompts must be text, token ids, {{'prompt_token_ids': [...]}} or a list of them, "
                            f"got {type(prompts).__name__}")
        if isinstance(prompts, torch.Tensor):
            single = prompts.dim() == 1
        else:
            single = isinstance(prompts, (str, dict)) or (len(prompts) > 0 and not isinstance(
                prompts[0], (str, dict, list, tuple, torch.Tensor)))
        prompts = [prompts] if single else list(prompts)
        if not prompts:
            raise ValueError("give at least one prompt")
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            if p.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer: LLM(model, tokenizer=...), or use stop_token_ids")
        mode = self._mode(len(prompts), params)
        if mode == "speculative":
            for p in params:
                if p.min_tokens or (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) != (0, 0, 1):
                    raise NotImplementedError("min_tokens and the penalties are not implemented with speculative "
                                              "decoding: each verified position would need its own history")
        # every prompt checked, once, before anything runs
        checked = [p.request(self._ids(prompt), self.config) for prompt, p in zip(prompts, params)]
        outs = [self._output(prompt, c) for prompt, c in zip(prompts, checked)]  # (a batch is refused here)
        run = {"plain": self._run_plain, "paged": self._run_paged, "speculative": self._run_speculative}[mode]
        samplers = run(outs, checked)
        for out, c, s in zip(outs, checked, samplers):
            self._finish(out, c, s)
        return outs

    def _finish(self, out: RequestOutput, req: CheckedRequest, samplers: list) -> None:
        """Text, stop reasons and log-probabilities of a request that has run, as vLLM gives them
        (``samplers``: its samples' samplers, which hold the logprobs they recorded)."""
        p = req.params
        for o, sampler in zip(out.outputs, samplers):
            if not (req.stop and self._cut_at_stop_string(o, req)):
                o.text = self._text(o.token_ids, o.finish_reason, p)
            last = o.token_ids[-1] if o.token_ids else None
            if o.finish_reason == "stop" and o.stop_reason is None and last in (p.stop_token_ids or ()) \
                    and last != self.config.eos_token_id:
                o.stop_reason = last  # vLLM: the stop_token_ids id that ended it; None for EOS
            recorder = getattr(sampler, "recorder", None)
            if recorder is not None:
                recorder.truncate(len(o.token_ids))  # (an output cut at a stop string after it ran)
                o.logprobs, o.cumulative_logprob = recorder.positions(self._decode_one(p)), recorder.cumulative()
        if p.prompt_logprobs is not None:
            out.prompt_logprobs = prompt_logprobs(self.model, out.prompt_token_ids, p.prompt_logprobs,
                                                  self._decode_one(p))

    def _decode_one(self, p: SamplingParams):
        if self.tokenizer is None or not p.detokenize:
            return None
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)

    def chat(self, messages, sampling_params: SamplingParams | None = None) -> list[RequestOutput]:
        """``generate`` on one conversation ([{"role", "content"}, ...]) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self.generate([chat_prompt(m) for m in convs], sampling_params)

    def _mode(self, num_prompts: int, params: list[SamplingParams]) -> str:
        if self.mode != "auto":
            return self.mode
        if self.speculative is not None:
            return "speculative"
        return "paged" if num_prompts > 1 or any(p.n > 1 for p in params) else "plain"

    def _ids(self, prompt):
        """A prompt's token ids, as given or from its text."""
        if isinstance(prompt, dict):
            if set(prompt) != {"prompt_token_ids"}:
                raise ValueError(f"a dict prompt holds only 'prompt_token_ids', got keys {sorted(prompt)}")
            return prompt["prompt_token_ids"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer: LLM(model, tokenizer=...), or pass token ids")
            return self.tokenizer.encode(prompt)
        return prompt

    def _output(self, prompt, req: CheckedRequest) -> RequestOutput:
        out = RequestOutput(self._next_id, prompt if isinstance(prompt, str) else None, req.prompt_token_ids)
        self._next_id += 1
        return out

    def _text(self, ids: list[int], reason: str | None, p: SamplingParams) -> str:
        """The output's text, as vLLM's detokenizer gives it: without the stop token that ended
        it (unless include_stop_str_in_output), special tokens skipped or not as asked."""
        if self.tokenizer is None or not p.detokenize:
            return ""
        if reason == "stop" and not p.include_stop_str_in_output:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    def _stop_strings(self, stop, skip_special_tokens: bool = True) -> StopStrings:
        return StopStrings(stop, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def _cut_at_stop_string(self, o: CompletionOutput, req: CheckedRequest) -> bool:
        """End ``o`` (its tokens and text) at the token that completes its first stop string, if
        any does; whether one did."""
        watch = self._stop_strings(req.stop, req.params.skip_special_tokens)
        kept, _ = finish(o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids, req, watch=watch)
        if watch.stop_reason is None:
            return False
        text = watch.text + watch.stop_reason if req.params.include_stop_str_in_output else watch.text
        o.token_ids, o.text, o.finish_reason, o.stop_reason = kept, text, "stop", watch.stop_reason
        return True

    # --- the three ways to run ---
    def _timed_samples(self, out: RequestOutput, req: CheckedRequest, one) -> list:
        """Run ``one(sampler, metrics) -> token ids`` for each of the n samples; their samplers."""
        out.metrics = metrics = RequestMetrics(clock())
        samplers = [req.params.sampler(i, req) for i in range(req.params.n)]
        for i, sampler in enumerate(samplers):
            tokens, why = finish(one(sampler, metrics), req)
            metrics.num_tokens += len(tokens)
            out.outputs.append(CompletionOutput(i, "", tokens, why or "length"))
        metrics.finish_time = clock(self.model.device)
        return samplers

    # Each runner fills ``outs`` and returns, per request, its samples' samplers.
    def _run_plain(self, outs, checked) -> list[list]:
        samplers = []
        for out, req in zip(outs, checked):
            def sample(sampler, metrics, req=req):
                tokens, watch = [], self._stop_strings(req.stop, req.params.skip_special_tokens) if req.stop else None
                # the watch ends the loop at a stop string: no step is spent past it
                for nxt in generate_stream(self.model, req, sample=sampler, watch=watch):
                    tokens.append(int(nxt[0]))
                    if metrics.first_token_time is None:
                        metrics.first_token_time = clock(self.model.device)
                return tokens
            samplers.append(self._timed_samples(out, req, sample))
        return samplers

    def _run_speculative(self, outs, checked) -> list[list]:
        from .speculative import speculative_generate

        samplers = []
        for out, req in zip(outs, checked):
            def sample(sampler, metrics, req=req):
                # a RequestSampler here only records logprobs (the rest is refused at the door)
                recorder, sampler = getattr(sampler, "recorder", None), getattr(sampler, "sampler", sampler)
                t0 = clock(self.model.device)
                res = speculative_generate(self.model, req, self._draft,
                                           gamma=self.speculative.num_speculative_tokens,
                                           sampler=sampler if req.params.temperature > 0 else None, recorder=recorder)
                if metrics.first_token_time is None:
                    metrics.first_token_time = t0 + res.prefill_seconds
                return res.tokens
            samplers.append(self._timed_samples(out, req, sample))
        return samplers

    def _run_paged(self, outs, checked) -> list[list]:
        from .paged import LLMEngine
        config = self.engine_config
        if config.num_blocks is None:  # room for every request at once
            bs = config.block_size
            need = sum(r.params.n * -(-(r.ids.shape[1] + r.max_new_tokens) // bs) for r in checked)
            config = replace(config, num_blocks=need)
        engine = LLMEngine(self.model, config=config)
        reqs = [engine.add_request(r, r.params) for r in checked]
        engine.run()
        for out, req in zip(outs, reqs):
            seqs = req.seqs
            firsts = [s.first_token_time for s in seqs if s.first_token_time is not None]
            out.metrics = RequestMetrics(req.arrival_time, min(firsts) if firsts else None,
                                         max(s.finish_time for s in seqs), sum(len(s.output_ids) for s in seqs))
            out.error = req.error
            out.outputs = [CompletionOutput(s.sample_index, "", s.output_ids, s.finish_reason) for s in seqs]
        return [[s.sampler for s in req.seqs] for req in reqs]
