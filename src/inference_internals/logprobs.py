"""Log-probabilities: what the model thought of each token, in vLLM's shape.

For a position whose logits are ``z`` [V], the log-probability of token t is
``log_softmax(z)[t] = z[t] - logsumexp(z)``. Like vLLM (its default ``logprobs_mode``,
"raw_logprobs"), they are taken from the model's own logits, before temperature, penalties or
top-k/top-p reshape them: they say what the model predicts, not what the sampler drew from.

vLLM returns one dict per position, token id -> ``Logprob(logprob, rank, decoded_token)``: the
chosen token (rank = how many tokens have a log-probability at least as high, so 1 is the argmax)
and the k most likely ones (ranks 1..k); so a dict holds k or k + 1 entries. ``prompt_logprobs``
are the same for each prompt token given the ones before it; the first has no context and is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


def check_k(name: str, k) -> int | None:
    """vLLM's ``logprobs``/``prompt_logprobs`` value: None (off), an int >= 0, or -1 (the whole vocabulary)."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < -1:
        raise ValueError(f"{name} must be None, an integer >= 0, or -1 (all tokens), got {k!r}")
    return k


class LogprobRecorder:
    """Collects, position by position, the chosen token's log-probability and rank and the top k.

    ``add`` keeps small tensors where the logits are (no read back to the host during a decode
    step); ``positions`` turns them into vLLM's dicts at the end.
    """

    def __init__(self, k: int):
        self.k = check_k("logprobs", k)
        self._parts: list[tuple[torch.Tensor, ...]] = []

    def add(self, logits: torch.Tensor, token_ids: torch.Tensor) -> None:
        """``logits`` [N, V] (raw), ``token_ids`` [N]: the tokens chosen after those N positions."""
        lp = logits.float().log_softmax(-1)
        ids = torch.as_tensor(token_ids, device=lp.device).reshape(-1, 1)
        chosen = lp.gather(-1, ids)
        rank = (lp >= chosen).sum(-1)
        k = lp.shape[-1] if self.k == -1 else min(self.k, lp.shape[-1])
        top, top_ids = lp.topk(k, dim=-1)
        self._parts.append((ids[:, 0], chosen[:, 0], rank, top, top_ids))

    def __len__(self) -> int:
        return sum(len(p[0]) for p in self._parts)

    def positions(self, decode: Callable[[list[int]], str] | None = None) -> list[PositionLogprobs]:
        """One dict per position, in order; ``decode`` (ids -> text) fills ``decoded_token``."""
        out = []
        for part in self._parts:
            ids, chosen, rank, top, top_ids = (t.tolist() for t in part)
            for i in range(len(ids)):
                entries = [(ids[i], chosen[i], rank[i])]
                entries += [(t, v, r + 1) for r, (t, v) in enumerate(zip(top_ids[i], top[i]))]
                out.append({t: Logprob(v, r, decode([t]) if decode else None) for t, v, r in entries})
        return out

    def cumulative(self) -> float:
        """The sum of the chosen tokens' log-probabilities: log p(output | prompt)."""
        return float(sum(p[1].double().sum() for p in self._parts)) if self._parts else 0.0

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions (an output cut short at a stop string)."""
        kept, left = [], n
        for part in self._parts:
            if left <= 0:
                break
            kept.append(tuple(t[:left] for t in part))
            left -= len(part[0])
        self._parts = kept


@torch.inference_mode()
def prompt_logprobs(model, prompt_ids: list[int], k: int,
                    decode: Callable[[list[int]], str] | None = None) -> list[PositionLogprobs | None]:
    """vLLM's ``prompt_logprobs``: None for the first token, then each token's log-probability given
    those before it, with the top ``k``. One forward over the prompt with logits at every position."""
    ids = torch.tensor([prompt_ids], device=model.device)
    rec = LogprobRecorder(k)
    if len(prompt_ids) > 1:
        rec.add(model(ids)[0, :-1], ids[0, 1:])
    return [None] + rec.positions(decode)
