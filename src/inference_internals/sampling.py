"""Sampling: turn the logits of the last position into the next token id.

Greedy takes the argmax. Sampling draws from ``softmax(logits)`` after reshaping it:

temperature  divide the logits by T: T < 1 sharpens the distribution, T > 1 flattens it;
top-k        keep the k highest logits;
top-p        keep the smallest set of most likely tokens whose probability adds up to >= p;
min-p        keep tokens whose probability is at least p times the most likely token's.

Removed tokens get a logit of -inf, so softmax gives them probability 0. The filters run in
Hugging Face's order (temperature -> top-k -> top-p -> min-p) and use its arithmetic, so the
processed logits are bit-for-bit those of ``transformers``' logits warpers.

Before them, a request may change the logits according to what it has generated so far (vLLM's
settings, in vLLM's order; ``RequestSampler`` keeps that memory):

min_tokens          the stop tokens are banned (-inf) until that many tokens are out;
repetition_penalty  a token seen in the prompt or the output has its logit divided by the penalty
                    if positive, multiplied if negative (Keskar et al. 2019; HF's processor);
frequency_penalty   minus the penalty times the token's count in the output (OpenAI's definition);
presence_penalty    minus the penalty once, if the token is in the output at all.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .logprobs import LogprobRecorder

NEG_INF = float("-inf")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The highest-scoring token of each row: logits [B, V] -> ids [B] (the first, on a tie)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        # numpy's argmax is vectorised where torch's CPU one is not: 5 us instead of 50 over a row of
        # 49,152 logits (2-core Zen 4), about 1% of a compiled Q4_1 decode step. The same index.
        return torch.from_numpy(np.argmax(logits.detach().numpy(), axis=-1))
    return logits.argmax(dim=-1)


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point tensor")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary dimension, got shape {tuple(logits.shape)}")


def _check_keep(min_tokens_to_keep: int) -> None:
    if isinstance(min_tokens_to_keep, bool) or not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep must be a positive integer, got {min_tokens_to_keep!r}")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T. (T = 0 would be greedy: use ``greedy`` or ``Sampler(temperature=0)``.)"""
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return logits / float(temperature)


def top_k_filter(logits: torch.Tensor, k: int, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the ``k`` highest logits (and any tied with the k-th); the rest become -inf."""
    _check_logits(logits)
    _check_keep(min_tokens_to_keep)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be a positive integer, got {k!r}")
    k = min(max(k, min_tokens_to_keep), logits.shape[-1])
    kth = torch.topk(logits, k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Nucleus sampling: keep the most likely tokens until their probability reaches ``p``.

    Computed from the other end, as HF does: sort ascending and drop tokens while the mass of
    everything dropped so far stays <= 1 - p.
    """
    _check_logits(logits)
    _check_keep(min_tokens_to_keep)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"top_p must be in [0, 1], got {p!r}")
    sorted_logits, order = torch.sort(logits, descending=False)
    tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = tail_mass <= (1 - float(p))
    drop_sorted[..., -min_tokens_to_keep:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def min_p_filter(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep tokens with probability >= p * (probability of the most likely token)."""
    _check_logits(logits)
    _check_keep(min_tokens_to_keep)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {p!r}")
    probs = logits.softmax(dim=-1)
    drop = probs < p * probs.amax(dim=-1, keepdim=True)
    keep = torch.topk(probs, min(min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
    drop.scatter_(-1, keep, False)
    return logits.masked_fill(drop, NEG_INF)


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """temperature -> top-k -> top-p -> min-p; a stage at its neutral value (1, 0, 1, 0) is skipped."""
    if temperature != 1.0:
        logits = apply_temperature(logits, temperature)
    if top_k != 0:
        logits = top_k_filter(logits, top_k)
    if top_p != 1.0:
        logits = top_p_filter(logits, top_p)
    if min_p != 0.0:
        logits = min_p_filter(logits, min_p)
    return logits


class Sampler:
    """A ``sample=`` function for ``generate``: logits [B, V] -> ids [B].

    ``temperature=0`` is greedy. With ``seed`` the draws come from a private ``torch.Generator``,
    so two samplers with the same seed produce the same tokens; without one they use torch's
    global generator (as ``transformers``' ``generate`` does, so ``torch.manual_seed`` repeats both).
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 seed: int | None = None, generator: torch.Generator | None = None):
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        for name, v in (("top_p", top_p), ("min_p", min_p)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if seed is not None and generator is not None:
            raise ValueError("give a seed or a generator, not both")
        self.temperature, self.top_k, self.top_p, self.min_p = float(temperature), top_k, float(top_p), float(min_p)
        self.seed, self.generator = seed, generator

    def __repr__(self) -> str:
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"min_p={self.min_p}, seed={self.seed})")

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the sampler draws from (temperature 0: all mass on the argmax)."""
        if self.temperature == 0:
            return torch.nn.functional.one_hot(greedy(logits), logits.shape[-1]).to(logits.dtype)
        return self.process(logits).softmax(dim=-1)

    def generator_on(self, device: torch.device) -> torch.Generator | None:
        # A torch.Generator draws on one device only: a seeded sampler keeps one per device it
        # meets (each from the seed), so the same sampler serves a CPU and a CUDA model.
        if self.seed is not None:
            self._per_device = getattr(self, "_per_device", {})
            if device not in self._per_device:
                self._per_device[device] = torch.Generator(device=device).manual_seed(self.seed)
            return self._per_device[device]
        if self.generator is not None and torch.device(self.generator.device) != device:
            raise ValueError(f"the sampler's generator is on {self.generator.device} but the logits are on "
                             f"{device}: pass a generator made with torch.Generator(device={str(device)!r})")
        return self.generator

    # What a speculative step asks of any sampler (this one has no memory of the request; a
    # RequestSampler's are history-dependent): the logits each verified position is judged by, and
    # the tokens it kept.
    def process_rows(self, logits: torch.Tensor, drafted=()) -> torch.Tensor:
        """Logits [γ+1, V] of the positions after 0..γ drafted tokens, as this sample's history leaves them."""
        return logits

    def observe(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """``tokens`` [N] were chosen after the raw ``logits`` [N, V] (nothing to remember here)."""

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        _check_logits(logits)
        if self.temperature == 0:
            return greedy(logits)
        probs = self.process(logits).softmax(dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        ids = torch.multinomial(flat, 1, generator=self.generator_on(logits.device))
        return ids.reshape(probs.shape[:-1])


# --- what a request's history does to the logits --------------------------------------------

def check_penalties(presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0) -> None:
    """vLLM's ranges: presence and frequency in [-2, 2], repetition > 0 and finite."""
    for name, v in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2 <= v <= 2:
            raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
    if isinstance(repetition, bool) or not isinstance(repetition, (int, float)) or not (
            math.isfinite(repetition) and repetition > 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition!r}")


def apply_penalties(logits: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                    presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0) -> torch.Tensor:
    """The three penalties on logits [B, V]: ``prompt_mask`` [B, V] marks the prompt's tokens,
    ``output_counts`` [B, V] counts each token in the output so far."""
    _check_logits(logits)
    check_penalties(presence, frequency, repetition)
    in_output = output_counts > 0
    if repetition != 1.0:
        seen = prompt_mask | in_output
        logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    if frequency:
        logits = logits - frequency * output_counts.to(logits.dtype)
    if presence:
        logits = logits - presence * in_output.to(logits.dtype)
    return logits


def ban(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``token_ids`` can no longer be drawn (their logits become -inf): ``min_tokens``' rule."""
    _check_logits(logits)
    return logits.index_fill(-1, token_ids.to(logits.device), NEG_INF)


class RequestSampler:
    """One sample of one request: a ``Sampler`` with a memory of the tokens it drew.

    Before each draw: ``min_tokens`` (``stop_ids`` banned until that many tokens are out) and the
    penalties (against ``prompt_ids`` and the output so far). After it, with ``logprobs=k``, the
    raw logits' log-probabilities of the drawn token and the top k go to ``recorder``. The history
    lives on the logits' device as counts per token, so a step reads nothing back to the host.
    """

    def __init__(self, sampler: Sampler, prompt_ids=(), *, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, min_tokens: int = 0,
                 stop_ids=(), logprobs: int | None = None):
        check_penalties(presence_penalty, frequency_penalty, repetition_penalty)
        self.sampler, self.prompt_ids = sampler, list(prompt_ids)
        self.presence, self.frequency, self.repetition = presence_penalty, frequency_penalty, repetition_penalty
        self.min_tokens, self.stop_ids = min_tokens, torch.tensor(sorted(stop_ids), dtype=torch.long)
        self.recorder = None if logprobs is None else LogprobRecorder(logprobs)
        self.generated = 0
        self._counts = self._prompt_mask = None

    @property
    def penalized(self) -> bool:
        return (self.presence, self.frequency, self.repetition) != (0.0, 0.0, 1.0)

    @property
    def temperature(self) -> float:
        return self.sampler.temperature

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.sampler.probs(logits)

    def generator_on(self, device: torch.device) -> torch.Generator | None:
        return self.sampler.generator_on(device)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits this request's history leaves for the sampler to draw from."""
        return self.process_rows(logits)

    def process_rows(self, logits: torch.Tensor, drafted=()) -> torch.Tensor:
        """``logits`` [R, V] as the history leaves them; with ``drafted`` (R = γ + 1 rows, a speculative
        step's), row i as it would be had the first i drafted tokens been drawn already: each verified
        position is judged by the distribution plain decoding would have drawn it from."""
        drafted = list(drafted)
        if drafted and logits.shape[0] != len(drafted) + 1:
            raise ValueError(f"{len(drafted)} drafted tokens need {len(drafted) + 1} rows of logits, "
                             f"got {logits.shape[0]}")
        ahead = torch.arange(logits.shape[0], device=logits.device)[:, None]  # tokens drawn before row i
        if self.generated < self.min_tokens and len(self.stop_ids):
            self.stop_ids = self.stop_ids.to(logits.device)  # (moved once: a no-op after the first step)
            banned = ban(logits, self.stop_ids)
            logits = torch.where(self.generated + ahead < self.min_tokens, banned, logits) if drafted else banned
        if self.penalized:
            if self._counts is None:
                self._counts = torch.zeros((1, logits.shape[-1]), dtype=torch.long, device=logits.device)
                self._prompt_mask = torch.zeros((1, logits.shape[-1]), dtype=torch.bool, device=logits.device)
                self._prompt_mask[:, torch.tensor(self.prompt_ids, dtype=torch.long, device=logits.device)] = True
            counts = self._counts
            if drafted:  # row i also counts drafted[:i]
                seen = torch.zeros((len(drafted) + 1, logits.shape[-1]), dtype=torch.long, device=logits.device)
                seen[torch.arange(1, len(drafted) + 1), torch.tensor(drafted, device=logits.device)] = 1
                counts = counts + seen.cumsum(0)
            logits = apply_penalties(logits.float(), self._prompt_mask, counts,
                                     self.presence, self.frequency, self.repetition)
        return logits

    def observe(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """``tokens`` [N] were drawn after the raw ``logits`` [N, V]: they join the history (and, with
        ``logprobs``, the record of what the model thought of them)."""
        tokens = torch.as_tensor(tokens, device=logits.device).reshape(-1)
        if self.recorder is not None:
            self.recorder.add(logits.reshape(-1, logits.shape[-1]), tokens)
        if self._counts is not None:
            self._counts.scatter_add_(-1, tokens[None], torch.ones_like(tokens[None]))
        self.generated += len(tokens)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        _check_logits(logits)
        ids = self.sampler(self.process(logits))
        self.observe(logits, ids)
        return ids
