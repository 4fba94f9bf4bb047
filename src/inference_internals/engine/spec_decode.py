"""Speculative decoding as a mode of the engine's step (chapter 6, run for every sequence at once).

After each step, every running sequence's draft proposes up to γ tokens (``propose``); the next step
feeds them after the sequence's last token, so one target pass over the whole batch verifies every
sequence's guesses (the scheduler holds slots for them, the model runner returns logits at each);
``accept`` then keeps, per sequence, the longest prefix the target agrees with and one token of the
target's own, by chapter 6's rule (``speculative.greedy_accept`` at temperature 0, else
``speculative.rejection_accept``, which leaves the output distributed exactly as the target's). The
scheduler's post-processing judges the kept tokens by the stop rule and rolls the sequence's cache
back to what it kept (``BlockPool.trim``: the rejected guesses' slots are never read again, and their
blocks go back to the pool).

Each verified position is judged by the distribution plain decoding would have drawn from there: the
sequence's sampler applies its history (penalties, ``min_tokens``) as if the guesses before it had been
drawn (``process_rows``), and the log-probabilities it records are the target's, at the kept tokens.
"""
from __future__ import annotations

import copy

import torch

from ..config import SpeculativeConfig
from ..speculative import greedy_accept, rejection_accept
from .sequence import Sequence

CPU = torch.device("cpu")


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, model):
        self.gamma = config.num_speculative_tokens
        self.adapts = config.num_speculative_tokens_schedule == "heuristic"
        self.template = config.draft(model)  # each sequence gets a copy (start): its own state
        self.needs_hidden = self.template.needs_hidden
        self.proposed = self.accepted = self.steps = 0  # guesses verified and kept, verify passes

    def start(self, seq: Sequence) -> None:
        """``seq`` begins: its own draft, told the prompt and the most tokens it will reach."""
        seq.draft = copy.copy(self.template)
        seq.gamma = self.gamma
        seq.draft.start(list(seq.token_ids), len(seq) + seq.max_new_tokens + self.gamma + 1, seq.request.stop_ids)

    def propose(self, seq: Sequence) -> None:
        """Up to γ guesses for what follows ``seq``'s tokens (its own γ, under the heuristic schedule),
        each round leaving room for the target's own token."""
        gamma = min(seq.gamma, seq.max_new_tokens - seq.num_output_tokens - 1)
        hidden, seq.hidden = seq.hidden, None  # each state is read once
        if gamma <= 0:
            return
        sampling = seq.sampler.temperature > 0
        proposal = seq.draft.propose(list(seq.token_ids), gamma, hidden=hidden,
                                     sampler=seq.sampler if sampling else None,
                                     generator=seq.sampler.generator_on(CPU) if sampling else None)
        seq.spec_tokens = list(proposal.tokens[:gamma])
        seq.spec_q = None if proposal.q is None else proposal.q[:len(seq.spec_tokens)].float().cpu()

    def accept(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """The tokens ``seq`` keeps from its verified guesses (logits [γ + 1, V], the target's after the
        last token and after each guess): the accepted ones, then the target's own."""
        drafted = seq.spec_tokens
        rows = seq.sampler.process_rows(logits, drafted)
        if seq.sampler.temperature == 0:
            n, token = greedy_accept(drafted, rows.argmax(-1).tolist())
        else:
            p = seq.sampler.probs(rows).float().cpu()
            n, token = rejection_accept(drafted, seq.spec_q, p, seq.sampler.generator_on(CPU))
        kept = drafted[:n] + [token]
        if self.adapts and drafted:  # (a round with no guesses says nothing about them)
            # past acceptances only choose the next γ: each pass still keeps exactly what the target would have drawn
            seq.gamma = min(self.gamma, seq.gamma + 2) if n == len(drafted) else max(1, seq.gamma - 1)
        seq.sampler.observe(logits[:n + 1], torch.tensor(kept, device=logits.device))
        self.proposed, self.accepted, self.steps = self.proposed + len(drafted), self.accepted + n, self.steps + 1
        return kept
