"""What a request asks for, checked once at the door, and the one rule that ends it.

``check_request`` turns a prompt and its settings into one ``CheckedRequest`` (ids in range, the
budget clamped to the context window, stop ids resolved); every entry point (``generate``,
``speculative_generate``, ``LLMEngine``, ``LLM``) makes it once, so a bad request fails here with
one clear message, before anything has changed, and never halfway through a step. Every decode
loop then asks ``finish_reason`` whether an output is done. Numbers that count things (token
ids, ``max_new_tokens``, ``n``, ``seed``, γ) must be integers: a float is rejected, never truncated.

``SamplingParams`` names follow vLLM's (``n``, ``seed``, ``stop``, ``stop_token_ids``, ``ignore_eos``)
and Hugging Face's ``generate`` where they overlap (``max_new_tokens``, ``temperature``,
``top_k``, ``top_p``, ``min_p``).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .sampling import Sampler

DEFAULT_MAX_NEW_TOKENS = 64
SEED_LIMIT = 2 ** 63  # torch.Generator takes 64-bit seeds; sample i of a request uses seed + i


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
        rows = list(prompt)
        rows = [list(r) for r in rows] if rows and not isinstance(rows[0], numbers.Number) else [rows]
        for row in rows:
            for t in row:
                if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                    raise TypeError(f"token ids must be integers, got {t!r} ({type(t).__name__})")
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

    @property
    def prompt_token_ids(self) -> list[int]:
        if self.ids.shape[0] != 1:
            raise ValueError(f"expected one prompt, got a batch of {self.ids.shape[0]}")
        return self.ids[0].tolist()


def check_request(prompt, config=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, stop_token_ids=None,
                  ignore_eos: bool = False, stop: tuple[str, ...] = (), eos_token_id: int | None = None,
                  params: "SamplingParams | None" = None) -> CheckedRequest:
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
    return CheckedRequest(ids, budget, stops, tuple(stop or ()), params)


# --- the stop rule ---------------------------------------------------------------------------

def finish_reason(token: int, count: int, req: CheckedRequest, watch: "StopStrings | None" = None) -> str | None:
    """Why an output is done once ``token`` is its ``count``-th new token, in vLLM's words: "stop"
    (a stop id, or, with ``watch``, a stop string the token completes), "length" (the budget is
    spent), or None (it goes on). Every decode loop asks this, one token at a time."""
    if token in req.stop_ids or (watch is not None and watch.push(token)):
        return "stop"
    if count >= req.max_new_tokens:
        return "length"
    return None


def finish(tokens, req: CheckedRequest, before: int = 0, watch: "StopStrings | None" = None
           ) -> tuple[list[int], str | None]:
    """``tokens`` (new ones, after ``before`` earlier ones) up to where ``finish_reason`` first
    ends the output, and why; all of them and None if it never does."""
    for i, t in enumerate(tokens):
        why = finish_reason(t, before + i + 1, req, watch)
        if why is not None:
            return list(tokens[: i + 1]), why
    return list(tokens), None


class StopStrings:
    """vLLM's ``stop`` strings: the output ends where one of them first appears in its text.

    ``push`` each new token; it returns True once the text holds a stop string. ``text`` is then
    the output's text up to that string (vLLM leaves the string out), ``stop_reason`` the string,
    and ``num_tokens`` how many tokens it took (the one that completed the string included).
    ``decode(ids) -> str`` is the tokenizer's. The whole output is decoded at each token: a
    string can be completed by a token that also changes the bytes before it (a UTF-8 character
    split over two tokens), and outputs are short enough for that to cost little.
    """

    def __init__(self, stops, decode):
        self.stops, self.decode = tuple(stops), decode
        self.longest = max(map(len, self.stops), default=0)
        self.tokens: list[int] = []
        self.text, self.stop_reason, self.num_tokens = "", None, None
        self._searched = 0  # characters before which no stop string can begin

    def push(self, token: int) -> bool:
        if self.stop_reason is not None:
            return True
        self.tokens.append(int(token))
        text = self.decode(self.tokens)
        start = max(0, min(self._searched, len(text)) - self.longest + 1)
        hits = [(i, s) for s in self.stops if (i := text.find(s, start)) >= 0]
        self._searched = len(text)
        if not hits:
            self.text = text
            return False
        i, self.stop_reason = min(hits)
        self.text, self.num_tokens = text[:i], len(self.tokens)
        return True


# --- sampling settings -----------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token. ``temperature=0`` is greedy (Hugging Face's default,
    ``do_sample=False``); ``seed`` makes sampling repeatable whatever the batch is (sample i of
    a request draws from seed + i); ``n`` samples share the prompt's blocks in the engine."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    n: int = 1
    stop_token_ids: tuple[int, ...] | None = None   # None: the model's EOS
    ignore_eos: bool = False                        # run to max_new_tokens whatever is sampled
    stop: tuple[str, ...] | None = None             # strings that end the output (``LLM`` only: needs text)

    def __post_init__(self):
        check_int("max_new_tokens", self.max_new_tokens, 1)
        n = check_int("n", self.n, 1)
        if self.seed is not None:
            check_int("seed + n - 1", check_int("seed", self.seed, 0, SEED_LIMIT - 1) + n - 1, 0, SEED_LIMIT - 1)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.stop_token_ids is not None:
            if isinstance(self.stop_token_ids, (str, bytes, numbers.Number)):
                raise TypeError(f"stop_token_ids must be a sequence of token ids, got {self.stop_token_ids!r}")
            ids = tuple(check_int("a stop token id", t, 0) for t in self.stop_token_ids)
            object.__setattr__(self, "stop_token_ids", ids)
        if self.stop is not None:
            stop = (self.stop,) if isinstance(self.stop, str) else self.stop
            if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) and x for x in stop):
                raise TypeError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
            object.__setattr__(self, "stop", tuple(stop))
        Sampler(self.temperature, self.top_k, self.top_p, self.min_p)  # raises on bad values

    def sampler(self, index: int = 0) -> Sampler:
        """The one place a request's settings become a sampler: sample ``index`` gets its own
        seeded generator (seed + index)."""
        seed = None if self.seed is None else self.seed + index
        return Sampler(self.temperature, self.top_k, self.top_p, self.min_p, seed=seed)

    def request(self, prompt, config=None, eos_token_id: int | None = None) -> CheckedRequest:
        """``prompt`` under these settings, checked once (``check_request``) against ``config``."""
        return check_request(prompt, config, self.max_new_tokens, self.stop_token_ids, self.ignore_eos,
                             self.stop or (), eos_token_id, self)
