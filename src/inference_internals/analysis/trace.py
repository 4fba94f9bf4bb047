"""Seeded request traces, and replaying one through a scheduler without the model.

The scheduler and the block pool never look at the model's numbers: what they do depends
only on how many tokens each request has and when it stops. So a trace's memory behaviour
can be measured in milliseconds by replaying it with stand-in tokens: each request emits
exactly its trace's ``output_len`` tokens, then stops, as if it had sampled EOS.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..engine.scheduler import Scheduler
from ..engine.sequence import Sequence
from ..params import SamplingParams

STAND_IN_EOS = 2  # the last stand-in token of each request: the stop rule ends it there


@dataclass(frozen=True)
class TraceRequest:
    prompt_len: int
    output_len: int       # tokens it actually generates (it stops there, like at EOS)
    max_new_tokens: int   # the cap the client asked for: what a reservation must cover


def make_trace(n: int, prompt_range=(8, 64), output_range=(8, 32), max_new_tokens: int | None = None,
               seed: int = 0) -> list[TraceRequest]:
    """n requests with prompt and output lengths drawn uniformly from the (inclusive) ranges."""
    if n < 1 or prompt_range[0] < 1 or output_range[0] < 1:
        raise ValueError("need n >= 1 and lengths >= 1")
    cap = max_new_tokens or output_range[1]
    if cap < output_range[1]:
        raise ValueError(f"max_new_tokens {cap} is below the longest output {output_range[1]}")
    rng = random.Random(seed)
    return [TraceRequest(rng.randint(*prompt_range), rng.randint(*output_range), cap) for _ in range(n)]


def replay(scheduler: Scheduler, trace: list[TraceRequest], seed: int = 0) -> list[dict]:
    """Run ``trace`` (all requests arriving at once) through ``scheduler`` with stand-in tokens.

    Returns one record per step, taken while it runs (as ``LLMEngine.stats``): slots
    reserved, slots holding a token, running and waiting counts, preemptions. Tokens are random, so
    the prefix cache finds nothing to share. The step is the engine's: ``Scheduler.postprocess``.
    """
    rng = random.Random(seed)
    pool = scheduler.pool
    targets = {}
    vocab = range(3, 50000)
    for r in trace:
        seq = Sequence(rng.choices(vocab, k=r.prompt_len),
                       SamplingParams(temperature=0, max_tokens=r.max_new_tokens,
                                      stop_token_ids=(STAND_IN_EOS,), ignore_eos=True),
                       pool.block_size)
        targets[seq.id] = r.output_len
        scheduler.add(seq)
    records = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        if not batch.seqs:
            raise RuntimeError("nothing can run: a waiting request needs more blocks than are free")
        tokens = stand_in_tokens(batch, targets, rng)
        scheduler.postprocess(batch.seqs, tokens, batch.num_tokens, record=lambda: records.append(dict(
            step=len(records), prefill=batch.is_prefill, reserved=pool.num_used * pool.block_size,
            filled=pool.filled_slots(scheduler.sequences), running=len(scheduler.running),
            waiting=len(scheduler.waiting), preempted=len(batch.preempted), tokens=sum(batch.num_tokens))))
    return records


def stand_in_tokens(batch, targets: dict[int, int], rng: random.Random) -> list[list[int]]:
    """What the forward pass would emit for each of ``batch.seqs``: a random token, the stand-in EOS
    at a request's trace length, nothing for a prompt chunk that stops short of the prompt's end."""
    out = []
    for s, n in zip(batch.seqs, batch.num_tokens):
        t = rng.randrange(3, 50000)  # drawn for every row, so a chunked replay keeps the same stream per row
        out.append([] if n < s.num_new_tokens else [STAND_IN_EOS if len(s.output_ids) + 1 >= targets[s.id] else t])
    return out
