"""Speculative decoding: a cheap draft guesses γ tokens, the target checks all of them in one pass.

One round, when the context's newest token ``x`` is not yet in the target's KV cache:

    draft    d1..dγ = draft.propose(context)                         γ cheap guesses
    verify   target([x, d1, .., dγ]) -> γ+1 next-token distributions  one target pass
    accept   keep the longest prefix the target agrees with, then one token from the target
    roll back  crop the target's KV cache past the rejected guesses

A round yields between 1 and γ+1 tokens for one target pass, and the output is the target's
own: token-identical at greedy, identically distributed when sampling (rejection sampling,
Leviathan, Kalman, Matias 2023, https://arxiv.org/abs/2211.17192, and Chen et al. 2023,
https://arxiv.org/abs/2302.01318).

The acceptance rules are small pure functions of the draft's and the target's distributions,
so they can be tested on toy distributions; ``speculative_generate`` is the loop around them.
Batch size is 1: rows of a batch would accept different numbers of tokens per round.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

from .kv_cache.contiguous import KVCache
from .logprobs import LogprobRecorder
from .params import DEFAULT_MAX_NEW_TOKENS, check_int, check_request
from .stop import finish, finish_reason
from .sampling import Sampler
from .timing import timed


def is_greedy(sampler: Sampler | None) -> bool:
    return sampler is None or sampler.temperature == 0


# --- acceptance: pure functions -------------------------------------------------------------

def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token from the distribution ``probs`` [V], by inverting its CDF with one uniform draw.

    Exact, and far cheaper than ``torch.multinomial`` over a 49k-token vocabulary. ``right=True``
    skips tokens of probability 0 even when the uniform draw is exactly 0.
    """
    cdf = probs.cumsum(-1)
    u = torch.rand((), generator=generator, dtype=cdf.dtype, device=cdf.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u[None], right=True)), len(probs) - 1)


def greedy_accept(drafted: list[int], target_choice: list[int]) -> tuple[int, int]:
    """Longest prefix of ``drafted`` equal to the target's own argmax tokens.

    ``target_choice[i]`` is the target's argmax after the context plus ``drafted[:i]``, for
    i = 0..γ. Returns (number accepted n, the target's token after them): the correction at
    the first mismatch, or the bonus token ``target_choice[γ]`` when every guess matched.
    """
    if len(target_choice) != len(drafted) + 1:
        raise ValueError(f"need γ+1 = {len(drafted) + 1} target tokens for γ = {len(drafted)} "
                         f"drafted ones, got {len(target_choice)}")
    n = 0
    while n < len(drafted) and drafted[n] == target_choice[n]:
        n += 1
    return n, int(target_choice[n])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where the target wants more mass than the draft gave.

    After a rejection the next token is drawn from here, which adds back exactly the mass the
    acceptance test removed, so the total is p again.
    """
    r = (p - q).clamp_min(0)
    total = r.sum()
    # A rejection implies p(x) < q(x) for some x, hence total > 0; the guard is for rounding.
    return r / total if total > 0 else p


def _check_distributions(drafted: list[int], q: torch.Tensor | None, p: torch.Tensor) -> None:
    gamma = len(drafted)
    if p.dim() != 2 or p.shape[0] != gamma + 1:
        raise ValueError(f"p must be [γ+1, vocab] = [{gamma + 1}, V] for γ = {gamma}, got {tuple(p.shape)}")
    if q is not None and (q.dim() != 2 or tuple(q.shape) != (gamma, p.shape[1])):
        raise ValueError(f"q must be [γ, vocab] = [{gamma}, {p.shape[1]}], got {tuple(q.shape)}")
    if any(not 0 <= t < p.shape[1] for t in drafted):
        raise ValueError(f"drafted token ids must be in [0, {p.shape[1]}), got {drafted}")
    for name, d in (("p", p), ("q", q)):
        if d is not None and ((d < 0).any() or not torch.allclose(d.sum(-1), torch.ones_like(d[:, 0]), atol=1e-3)):
            raise ValueError(f"every row of {name} must be a probability distribution (>= 0, sums to 1)")
    if q is not None and any(q[i, t] <= 0 for i, t in enumerate(drafted)):
        raise ValueError("a drafted token has probability 0 under q: it cannot have been drawn from q")


def rejection_accept(drafted: list[int], q: torch.Tensor | None, p: torch.Tensor,
                     generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling: accept guess i with probability min(1, p_i(d_i) / q_i(d_i)).

    ``q`` [γ, V]: the draft's distributions the guesses were drawn from (None: a deterministic
    draft, i.e. one-hot q). ``p`` [γ+1, V]: the target's distributions at the same positions.
    At the first rejection the token is resampled from ``residual(p_i, q_i)``; if all γ are
    accepted a bonus token is drawn from p_γ. Returns (number accepted, the next token).
    """
    _check_distributions(drafted, q, p)
    for i, x in enumerate(drafted):
        qi = q[i] if q is not None else torch.nn.functional.one_hot(
            torch.tensor(x), p.shape[1]).to(p.dtype)
        u = torch.rand((), generator=generator, dtype=p.dtype)
        # u < p/q, written without the division (q(x) > 0 since x was drawn from q)
        if u * qi[x] < p[i, x]:
            continue
        return i, draw(residual(p[i], qi), generator)
    return len(drafted), draw(p[-1], generator)


# --- what to expect: Leviathan et al. 2023, section 3 -----------------------------------------

def _check_alpha_gamma(alpha: float, gamma: int) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha is a probability, must be in [0, 1], got {alpha}")
    if gamma < 0 or int(gamma) != gamma:
        raise ValueError(f"gamma must be a whole number >= 0, got {gamma}")


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """(1 - α^(γ+1)) / (1 - α): tokens per target pass when each guess is accepted
    independently with probability α (γ+1 at α = 1)."""
    _check_alpha_gamma(alpha, gamma)
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Wall-clock improvement over plain decoding: tokens per round / cost of a round,
    a round costing γ draft steps (c each, in target passes) plus one target pass."""
    if cost_ratio < 0:
        raise ValueError(f"the draft's cost ratio c must be >= 0, got {cost_ratio}")
    return expected_tokens_per_pass(alpha, gamma) / (gamma * cost_ratio + 1)


def best_gamma(alpha: float, cost_ratio: float, max_gamma: int = 32) -> int:
    """The γ in 0..max_gamma with the highest expected speedup (0 = do not speculate)."""
    return max(range(max_gamma + 1), key=lambda g: expected_speedup(alpha, g, cost_ratio))


# --- drafts: the interface the loop talks to -----------------------------------------------

@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None = None  # [len(tokens), V] the distributions they were drawn from; None = deterministic


class Draft:
    """Anything that guesses the next tokens. ``drafts.py`` holds four."""
    name = "draft"
    needs_hidden = False  # whether ``propose`` reads the target's hidden states

    def start(self, prompt: list[int], max_len: int, stop_ids: set[int]) -> None:
        """A new sequence begins (``max_len``: the most tokens it will reach)."""

    def propose(self, context: list[int], gamma: int, hidden: torch.Tensor | None = None,
                sampler: Sampler | None = None, generator: torch.Generator | None = None) -> Proposal:
        """Up to ``gamma`` guesses for the tokens after ``context``. ``hidden`` [k, D] holds the target's
        final hidden states at the k positions before ``context[-1]``, each the one that chose the token
        after it: those computed since the last call (the prompt's, then each round's kept). With a sampling
        ``sampler`` the guesses are drawn (with ``generator``) and their distributions returned."""
        raise NotImplementedError


# --- the loop ------------------------------------------------------------------------------

@dataclass
class Round:
    drafted: list[int]   # the draft's guesses
    accepted: int        # how many of them the target kept
    token: int           # the target's own token after them: a correction, or the bonus

    @property
    def bonus(self) -> bool:
        return self.accepted == len(self.drafted)

    @property
    def new_tokens(self) -> list[int]:
        return self.drafted[: self.accepted] + [self.token]


@dataclass
class SpecResult:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0  # prefill and every verification pass
    prefill_seconds: float = 0.0  # the first pass alone: the prompt, up to the first token

    @property
    def target_passes(self) -> int:
        return len(self.rounds) + 1  # + the prefill

    @property
    def acceptance_rate(self) -> float:
        """α: accepted / checked guesses. A round checks its guesses up to the first rejection;
        those after it were never tried, so they count neither way."""
        accepted = sum(r.accepted for r in self.rounds)
        rejected = sum(not r.bonus for r in self.rounds)
        return accepted / (accepted + rejected) if accepted + rejected else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens per verification pass (the prefill's one token excluded)."""
        return sum(r.accepted + 1 for r in self.rounds) / len(self.rounds) if self.rounds else float("nan")


@torch.inference_mode()
def speculative_generate(target, prompt, draft: Draft, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, gamma: int = 4,
                         sampler: Sampler | None = None, generator: torch.Generator | None = None,
                         stop_ids: Iterable[int] | None = None, recorder: LogprobRecorder | None = None) -> SpecResult:
    """Generate up to ``max_new_tokens`` for one prompt (a list of ids), ``gamma`` guesses a round.

    Without a ``sampler`` (or at temperature 0) this is greedy, and the output equals
    ``generate(target, prompt)`` token for token. With one, the tokens are distributed exactly as
    ``generate(target, prompt, sample=sampler)`` would draw them, whatever the draft.
    Random draws use ``generator`` (on the CPU), else one seeded with ``sampler.seed``, else
    torch's global generator. A ``recorder`` gets the target's log-probabilities of every token
    kept, from the target's own logits: the row each token was chosen from.
    """
    req = check_request(prompt, target.config, max_new_tokens, stop_ids)  # the one check
    if req.ids.shape[0] != 1:
        raise ValueError(f"speculative decoding takes one prompt (batch size 1), got {req.ids.shape[0]}")
    ids = req.ids[0]
    gamma = check_int("gamma", gamma, 0)
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a sampling.Sampler or None (greedy), got {type(sampler).__name__}")
    greedy = is_greedy(sampler)
    if generator is None and not greedy and sampler.seed is not None:
        generator = torch.Generator().manual_seed(sampler.seed)
    context = ids.tolist()
    max_new_tokens = req.max_new_tokens
    result = SpecResult([])
    if max_new_tokens == 0:
        return result
    device = target.device

    def choose(logits):  # [T, V] -> the target's token at each position, and p when sampling
        if greedy:
            return logits.argmax(-1).tolist(), None
        return None, sampler.probs(logits.float()).cpu()

    # The cache holds everything but the newest token, which the next pass feeds first.
    cache = KVCache.for_model(target, 1, len(context) + max_new_tokens)
    draft.start(list(context), len(context) + max_new_tokens + gamma + 1, req.stop_ids)
    (logits, hidden), dt = timed(target, device, ids[None].to(device), cache=cache,
                                 output_hidden_states=True, last_only=True)
    result.target_seconds += dt
    result.prefill_seconds = dt
    greedy_tok, p = choose(logits[0])
    first = greedy_tok[0] if p is None else draw(p[0], generator)
    if recorder is not None:
        recorder.add(logits[0, -1:], torch.tensor([first]))
    result.tokens.append(first)
    context.append(first)
    h = hidden[-1][0]  # every prompt position's
    done = finish_reason(first, 1, req) is not None
    while not done:
        room = max_new_tokens - len(result.tokens) - 1  # the round's own token always comes on top
        proposal, dt = timed(draft.propose, device, list(context), min(gamma, room), hidden=h,
                             sampler=None if greedy else sampler, generator=generator)
        result.draft_seconds += dt
        drafted, q = list(proposal.tokens[: min(gamma, room)]), proposal.q
        drafted, _ = finish(drafted, req, len(result.tokens))  # guesses after a stop id are meaningless
        if q is not None:
            q = q[: len(drafted)].float().cpu()
        # verify: all γ+1 positions in one pass over the cache
        start = cache.length
        x = torch.tensor([[context[-1]] + drafted], device=device)
        (logits, hidden), dt = timed(target, device, x, cache=cache, output_hidden_states=True)
        result.target_seconds += dt
        greedy_tok, p = choose(logits[0])
        if p is None:
            n, token = greedy_accept(drafted, greedy_tok)
        else:
            n, token = rejection_accept(drafted, q if drafted else None, p, generator)
        cache.crop(start + 1 + n)  # keep x and the accepted guesses; forget the rejected ones
        h = hidden[-1][0, :n + 1]  # the positions kept: the last token's, then each accepted guess's
        r = Round(drafted, n, token)
        result.rounds.append(r)
        new, why = finish(r.new_tokens, req, len(result.tokens))
        if recorder is not None:  # row i chose new[i]: the accepted guesses, then the target's token
            recorder.add(logits[0, :len(new)], torch.tensor(new))
        done = why is not None
        result.tokens += new
        context += new
    return result
