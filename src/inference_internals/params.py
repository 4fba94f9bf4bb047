"""What a request asks for, checked once at the door, and the one rule that ends it.

``check_request`` turns a prompt and its settings into one ``CheckedRequest`` (ids in range, the
budget clamped to the context window, stop ids resolved); every entry point (``LLM`` and
``LLMEngine``, and the chapters' reference loops ``generate``, ``speculative_generate``) makes it once,
so a bad request fails here with one clear message, before anything has changed, and never halfway
through a step. What ends it is ``stop.finish_reason``'s to judge. Numbers that count things (token
ids, ``max_new_tokens``, ``n``, ``seed``, γ) must be integers: a float is rejected, never truncated.

``SamplingParams`` is vLLM's: its names, its defaults and their meaning, with Hugging Face's
``max_new_tokens`` accepted for ``max_tokens``. Lower-level functions (``generate``,
``speculative_generate``) keep Hugging Face's ``max_new_tokens`` and greedy default.
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

import torch

from .logprobs import check_k
from .sampling import RequestSampler, Sampler, check_penalties

DEFAULT_MAX_NEW_TOKENS = 64
SEED_LIMIT = 2 ** 63  # torch.Generator takes 64-bit seeds; sample i of a request uses seed + i
NO_LIMIT = 2 ** 62  # max_tokens=None: a budget that check_request clamps to the context window


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; bools, floats and strings are rejected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {span}, got {value}")
    return value


def check_token_ids(prompt, vocab_size: int | None = None, context: int | None = None) -> torch.Tensor:
    """One prompt (a list of ids) or a batch ([B, T]) as a [B, T] long CPU tensor.

    Ids must be integers in [0, vocab_size) (>= 0 without one): floats and bools are rejected, not cast.
    With ``context`` the prompt must leave room for at least one new token.
    """
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype == torch.bool or prompt.is_floating_point() or prompt.is_complex():
            raise TypeError(f"token ids must be integers, got a {prompt.dtype} tensor")
        ids = prompt.detach().to("cpu", torch.long)
    else:
        if isinstance(prompt, (str, bytes)):
            raise TypeError("token ids must be a list of integers, got a string: encode it with the tokenizer first")
        if not isinstance(prompt, Iterable) or isinstance(prompt, dict):
            raise TypeError(f"token ids must be a list of integers, got {type(prompt).__name__}")
        rows = list(prompt)
        rows = [list(r) for r in rows] if rows and not isinstance(rows[0], numbers.Number) else [rows]
        for row in rows:
            for t in row:
                if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                    raise TypeError(f"token ids must be integers, got {t!r} ({type(t).__name__})")
                if not 0 <= t < (vocab_size if vocab_size is not None else 1 << 62):  # before int64 could wrap
                    raise ValueError(f"token ids must be in [0, {vocab_size if vocab_size is not None else 'inf'}), "
                                     f"got {t}")
        if len({len(r) for r in rows}) > 1:
            raise ValueError(f"the prompts of a batch must have one length, got {sorted({len(r) for r in rows})}")
        ids = torch.tensor(rows, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"the prompt must hold at least one token id, got shape {tuple(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= (vocab_size if vocab_size is not None else 1 << 62))]
    if bad.numel():
        raise ValueError(f"token ids must be in [0, {vocab_size if vocab_size is not None else 'inf'}), "
                         f"got {bad[:5].tolist()}")
    if context is not None and ids.shape[1] >= context:
        raise ValueError(f"prompt of {ids.shape[1]} tokens leaves no room in the {context}-token context window")
    return ids


@dataclass(frozen=True)
class CheckedRequest:
    """A prompt and its settings after the one check (``check_request``): everything a decode
    loop needs to run it, and everything the stop rule needs to end it."""
    ids: torch.Tensor              # [B, T] long, on the CPU: B prompts of one length in lockstep (usually 1)
    max_new_tokens: int            # what was asked for, clamped to the room the context window leaves
    stop_ids: frozenset            # token ids that end an output: stop_token_ids, else EOS; none with ignore_eos
    stop: tuple[str, ...] = ()     # stop strings: the caller that holds a tokenizer watches for them
    params: "SamplingParams | None" = None  # the settings it came from, when it came from some
    min_tokens: int = 0            # nothing but the budget ends an output shorter than this

    @property
    def prompt_token_ids(self) -> list[int]:
        if self.ids.shape[0] != 1:
            raise ValueError(f"expected one prompt, got a batch of {self.ids.shape[0]}")
        return self.ids[0].tolist()


def check_request(prompt, config=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, stop_token_ids=None,
                  ignore_eos: bool = False, stop: tuple[str, ...] = (), eos_token_id: int | None = None,
                  params: "SamplingParams | None" = None, min_tokens: int = 0) -> CheckedRequest:
    """The one check a request gets, at whichever door it enters: token ids integers in
    ``config``'s vocabulary, room left in its context window, the budget clamped to that room,
    stop ids resolved (EOS is ``config``'s unless ``eos_token_id`` says) and inside the vocabulary.
    A request that is already a ``CheckedRequest`` passes through unchanged."""
    if isinstance(prompt, CheckedRequest):
        return prompt
    vocab = config.vocab_size if config is not None else None
    context = config.max_position_embeddings if config is not None else None
    ids = check_token_ids(prompt, vocab, context)
    budget = check_int("max_new_tokens", max_new_tokens, 0)
    if context is not None:
        budget = min(budget, context - ids.shape[1])
    if eos_token_id is None and config is not None:
        eos_token_id = config.eos_token_id
    if ignore_eos:
        stops = frozenset()
    elif stop_token_ids is None:
        stops = frozenset() if eos_token_id is None else frozenset([int(eos_token_id)])
    else:
        if isinstance(stop_token_ids, (str, bytes, numbers.Number)):
            raise TypeError(f"stop_token_ids must be a sequence of token ids, got {stop_token_ids!r}")
        stops = frozenset(check_int("a stop token id", t, 0) for t in stop_token_ids)
        bad = sorted(t for t in stops if vocab is not None and t >= vocab)
        if bad:
            raise ValueError(f"stop_token_ids must be in [0, {vocab}), got {bad}")
    return CheckedRequest(ids, budget, stops, tuple(stop or ()), params, check_int("min_tokens", min_tokens, 0))


# --- sampling settings -----------------------------------------------------------------------

DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams().max_tokens


class _Default(int):
    """vLLM's default ``max_tokens``, told apart from a 16 the caller passed: only a
    ``max_tokens`` left at its default may be set through the ``max_new_tokens`` alias."""


# vLLM's SamplingParams fields this engine does not implement, with their vLLM defaults (a field
# left at its default is accepted) and why not. Setting one raises NotImplementedError.
REFUSED = {
    "logit_bias": (None, "the sampler here adds no per-token bias"),
    "allowed_token_ids": (None, "the sampler here does not restrict the vocabulary"),
    "bad_words": (None, "banning multi-token words needs matching against the output, not implemented"),
    "structured_outputs": (None, "no grammar-constrained decoding (vLLM uses xgrammar or guidance)"),
    "output_kind": (None, "LLM.generate returns finished outputs only: no streaming of partial outputs"),
    "stream_interval": (None, "LLM.generate returns finished outputs only: no streaming of partial outputs"),
    "flat_logprobs": (False, "logprobs come in vLLM's default form only, a list of dicts"),
    "logprob_token_ids": (None, "logprobs come as the top k only, not for chosen token ids"),
    "prompt_logprob_token_ids": (None, "prompt logprobs come as the top k only, not for chosen token ids"),
    "prompt_logprob_start": (None, "prompt logprobs cover the whole prompt"),
    "extra_args": (None, "no custom sampling plugins read extra arguments here"),
    "skip_clone": (False, "an internal flag of vLLM's: these SamplingParams are frozen and never copied"),
    "skip_reading_prefix_cache": (None, "the paged engine's prefix cache is the engine's setting, not a request's"),
    "thinking_token_budget": (None, "no reasoning-model support"),
    "repetition_detection": (None, "no early stop on repeated n-grams"),
    "routed_experts_prompt_start": (0, "returns no MoE routing data: the model here is dense"),
    "trace_decode_token_ids": (None, "no forcing of predetermined tokens"),
    "watermarking": (None, "no watermarking"),
}


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token: vLLM's ``SamplingParams``, its names and defaults (sampled at
    temperature 1.0, 16 tokens), each field with vLLM's meaning; ``REFUSED`` lists the fields this
    engine does not implement, and setting one says why. ``temperature=0`` is greedy; ``seed``
    makes sampling repeatable whatever the batch is (sample i of a request draws from seed + i);
    ``n`` samples share the prompt's blocks in the engine. ``max_new_tokens`` is Hugging Face's
    name for ``max_tokens``, accepted as an alias. The field list is checked against vLLM's
    (``data/vllm_fields.json``) by tests/test_vllm_fields.py."""
    n: int = 1
    presence_penalty: float = 0.0      # minus this once for a token in the output so far
    frequency_penalty: float = 0.0     # minus this times the token's count in the output so far
    repetition_penalty: float = 1.0    # tokens in the prompt or output: logit / this if > 0, * this if < 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 (or -1) = all tokens
    min_p: float = 0.0
    seed: int | None = None            # -1 = None
    stop: tuple[str, ...] | None = None             # strings that end the output (``LLM`` only: needs text)
    stop_token_ids: tuple[int, ...] | None = None   # ids that end it, besides the model's EOS
    ignore_eos: bool = False                        # EOS does not end it (stop_token_ids still do)
    max_tokens: int | None = _Default(DEFAULT_MAX_TOKENS)  # None: up to the context window
    min_tokens: int = 0                # the stop ids cannot be drawn before this many tokens
    logprobs: int | None = None        # per generated token: its logprob and the top k (-1: all)
    prompt_logprobs: int | None = None  # the same for each prompt token
    detokenize: bool = True            # False: no text, token ids only
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    max_new_tokens: int | None = field(default=None, repr=False)  # HF's name for max_tokens: read max_tokens
    # vLLM's fields that REFUSED lists: accepted at vLLM's default only
    logit_bias: object = field(default=None, repr=False)
    allowed_token_ids: object = field(default=None, repr=False)
    bad_words: object = field(default=None, repr=False)
    structured_outputs: object = field(default=None, repr=False)
    output_kind: object = field(default=None, repr=False)
    stream_interval: object = field(default=None, repr=False)
    flat_logprobs: object = field(default=False, repr=False)
    logprob_token_ids: object = field(default=None, repr=False)
    prompt_logprob_token_ids: object = field(default=None, repr=False)
    prompt_logprob_start: object = field(default=None, repr=False)
    extra_args: object = field(default=None, repr=False)
    skip_clone: object = field(default=False, repr=False)
    skip_reading_prefix_cache: object = field(default=None, repr=False)
    thinking_token_budget: object = field(default=None, repr=False)
    repetition_detection: object = field(default=None, repr=False)
    routed_experts_prompt_start: object = field(default=0, repr=False)
    trace_decode_token_ids: object = field(default=None, repr=False)
    watermarking: object = field(default=None, repr=False)

    def __post_init__(self):
        for name, (default, why) in REFUSED.items():
            if getattr(self, name) != default:
                raise NotImplementedError(f"SamplingParams.{name} is vLLM's, but this engine does not implement "
                                          f"it: {why}")
        set_ = partial(object.__setattr__, self)
        max_tokens = self.max_tokens
        if self.max_new_tokens is not None:  # the alias: consumed here, max_tokens is the field to read
            alias = check_int("max_new_tokens", self.max_new_tokens, 1)
            if not isinstance(max_tokens, _Default) and max_tokens != alias:
                raise ValueError(f"max_tokens={max_tokens} and max_new_tokens={alias} are the same setting "
                                 f"(vLLM's name and Hugging Face's): give one")
            max_tokens = alias
            set_("max_new_tokens", None)
        if max_tokens is not None:
            max_tokens = int(check_int("max_tokens", max_tokens, 1))  # (a plain int from here on)
        set_("max_tokens", max_tokens)
        n = check_int("n", self.n, 1)
        if self.seed is not None and not isinstance(self.seed, bool) and self.seed == -1:
            set_("seed", None)  # vLLM's spelling of "no seed"
        if self.seed is not None:
            check_int("seed + n - 1", check_int("seed", self.seed, 0, SEED_LIMIT - 1) + n - 1, 0, SEED_LIMIT - 1)
        if not isinstance(self.top_k, bool) and self.top_k == -1:
            set_("top_k", 0)  # vLLM's other spelling of "all tokens"
        for name in ("ignore_eos", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stop_token_ids is not None:
            if isinstance(self.stop_token_ids, (str, bytes, numbers.Number)):
                raise TypeError(f"stop_token_ids must be a sequence of token ids, got {self.stop_token_ids!r}")
            set_("stop_token_ids", tuple(check_int("a stop token id", t, 0) for t in self.stop_token_ids))
        if self.stop is not None:
            stop = (self.stop,) if isinstance(self.stop, str) else self.stop
            if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) and x for x in stop):
                raise TypeError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
            set_("stop", tuple(stop))
            if not self.detokenize:
                raise ValueError("stop strings need text: they are only supported with detokenize=True")
        check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        check_k("logprobs", self.logprobs)
        check_k("prompt_logprobs", self.prompt_logprobs)
        check_penalties(self.presence_penalty, self.frequency_penalty, self.repetition_penalty)
        Sampler(self.temperature, self.top_k, self.top_p, self.min_p)  # raises on bad values
        if n > 1 and self.temperature == 0:
            raise ValueError(f"n must be 1 when sampling greedily (temperature=0): the {n} samples would be "
                             "the same (vLLM refuses it too)")

    @property
    def needs_history(self) -> bool:
        """Whether a sample's sampler must remember its tokens (min_tokens, penalties, logprobs)."""
        return bool(self.min_tokens) or self.logprobs is not None or (
            self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0.0, 0.0, 1.0)

    def sampler(self, index: int = 0, request: CheckedRequest | None = None) -> Sampler | RequestSampler:
        """The one place a request's settings become a sampler: sample ``index`` gets its own
        seeded generator (seed + index). With ``request`` (its prompt and stop ids) and settings
        that need the sample's history, a ``RequestSampler`` around it."""
        seed = None if self.seed is None else self.seed + index
        sampler = Sampler(self.temperature, self.top_k, self.top_p, self.min_p, seed=seed)
        if request is None or not self.needs_history:
            return sampler
        return RequestSampler(sampler, request.prompt_token_ids, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                              min_tokens=self.min_tokens, stop_ids=request.stop_ids, logprobs=self.logprobs)

    def request(self, prompt, config=None, eos_token_id: int | None = None) -> CheckedRequest:
        """``prompt`` under these settings, checked once (``check_request``) against ``config``.
        The stop ids are vLLM's: the model's EOS (unless ``ignore_eos``) and ``stop_token_ids``."""
        budget = self.max_tokens if self.max_tokens is not None else NO_LIMIT
        if eos_token_id is None and config is not None:
            eos_token_id = config.eos_token_id
        eos = () if self.ignore_eos or eos_token_id is None else (eos_token_id,)
        return check_request(prompt, config, budget, eos + tuple(self.stop_token_ids or ()), False,
                             self.stop or (), eos_token_id, self, self.min_tokens)
