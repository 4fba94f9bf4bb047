"""Who runs in the next forward pass: decided again at every step.

Continuous batching (``Scheduler``): a waiting request is admitted as soon as the pool has
free blocks for its prompt (keeping a small ``watermark`` free for the running ones to grow
into), and a finished one leaves at once, so the batch changes every step. Each step is
either a prefill (the newly admitted sequences) or a decode (every running sequence, one
token each). Prefill goes first: admitting work early keeps the decode batch large.

Blocks for the output are taken one at a time while decoding. When one is needed and none
is free, the most recently admitted sequence is preempted: its blocks are freed and it goes
back to the front of the queue, to be recomputed from its tokens when blocks free up
(vLLM's "recompute" preemption: prefill is fast, so recomputing beats swapping to CPU).
The oldest requests keep running, so every request eventually finishes.

A contiguous cache cannot grow in place, so it must reserve a request's whole possible
length when admitting it. ``reserve`` reproduces that on the same pool: each admitted
sequence takes blocks for ``reserve(seq)`` tokens at once, and never needs more.
With ``mixed=True`` (vLLM v1, for an engine that packs a step into one row) a step is not
either/or: every running sequence decodes, and prompts admitted with the blocks left over
join the same forward pass, so admitting never stalls the decoders for a step. A step that
had to preempt admits nobody: the victim would come straight back and be preempted again.

Chunked prefill (``chunked=True``, vLLM's ``enable_chunked_prefill``): a step computes at most
``max_num_batched_tokens`` tokens. The running decodes go first (one token each), then
prompts fill what is left of the budget in chunks: first those already part-way through
(each chunk continues where the last one stopped), then newly admitted ones. A long prompt
thus takes several steps, but no step grows past the budget, so the decodes running beside
it never wait for a whole prompt. An admitted prompt holds blocks for all its tokens from
the start (its K/V fill them chunk by chunk, prefix-cache hits skipped); it samples its first
token in the step that computes its last chunk.

Speculative decoding adds nothing to the policy: a decoding sequence that carries its draft's γ
guesses (``Sequence.spec_tokens``) feeds 1 + γ tokens and holds slots for all of them; when the pool
cannot give it those, the guesses are dropped (a plain decode step) before anyone is preempted.

``postprocess`` is where a step's results enter the sequences, and where the stop rule
(``stop.finish_reason``) is asked: once for every token a sequence emits, in every mode.

Static batching (``StaticScheduler``), the baseline: a fixed batch reserves the maximum
length for each member and runs until its longest member is done; only then is the next
batch admitted.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..stop import finish_reason
from .block_pool import BlockPool, OutOfBlocksError
from .sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]          # decoding sequences first, then newly admitted ones
    num_decode: int = 0           # how many of ``seqs`` decode (one token, or a speculative step's 1 + γ)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)  # tokens each of ``seqs`` computes this step

    @property
    def is_prefill(self) -> bool:
        return self.num_decode == 0

    @property
    def kind(self) -> str:
        return "prefill" if self.num_decode == 0 else "decode" if self.num_decode == len(self.seqs) else "mixed"


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 reserve: Callable[[Sequence], int] | None = None, watermark: float = 0.01,
                 mixed: bool = False, chunked: bool = False):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if chunked and max_num_batched_tokens < max_num_seqs:
            # Every running sequence's decode token must fit in one step (vLLM checks the same).
            raise ValueError(f"with chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) "
                             f"must be >= max_num_seqs ({max_num_seqs})")
        self.chunked = chunked
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark is a fraction of the pool in [0, 1), got {watermark}")
        self.pool, self.reserve, self.mixed = pool, reserve, mixed
        # Admission leaves this many blocks free for running sequences to grow into (vLLM: 1%).
        self.watermark_blocks = int(watermark * pool.num_blocks)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()  # oldest admitted first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        # Checked here so that running out of blocks later is always solved by preemption.
        longest = seq.num_prompt_tokens + seq.max_new_tokens
        if self.reserve is not None and self.reserve(seq) < longest:
            raise ValueError(f"sequence {seq.id} may grow to {longest} tokens, past its "
                             f"reservation of {self.reserve(seq)}")
        most = self.pool.blocks_needed(max(longest, self.reserve(seq) if self.reserve else 0))
        if most > self.pool.num_blocks:
            raise OutOfBlocksError(f"a sequence of up to {seq.num_prompt_tokens} + "
                                   f"{seq.max_new_tokens} tokens needs {most} blocks; "
                                   f"the pool has {self.pool.num_blocks}")
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        if self.chunked:
            return self._chunked()
        if self.mixed:
            batch = self._decode()
            if not batch.preempted:
                batch.seqs += self._admit(tokens=sum(s.num_new_tokens for s in batch.seqs)).seqs
        else:
            batch = self._admit()
            if not batch.seqs:
                batch = self._decode()
        batch.num_tokens = [s.num_new_tokens for s in batch.seqs]
        return batch

    def _chunked(self) -> ScheduledBatch:
        """Decodes first, then prompt chunks (part-way ones, then new ones) up to the token budget."""
        batch = self._decode()
        batch.num_tokens = [s.num_new_tokens for s in batch.seqs]
        left = max(0, self.max_num_batched_tokens - sum(batch.num_tokens))
        for seq in self.running:  # oldest first: a prompt already started finishes first
            if left == 0:
                break
            if seq.num_uncached > 1:
                n = min(seq.num_new_tokens, left)
                batch.seqs.append(seq), batch.num_tokens.append(n)
                left -= n
        while not batch.preempted and left > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            headroom = self.watermark_blocks if self.running else 0
            if self.pool.blocks_to_allocate(seq) > self.pool.num_free - headroom:
                break
            self.pool.allocate(seq)  # blocks for the whole prompt; prefix hits already count as computed
            seq.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_new_tokens, left)
            batch.seqs.append(seq), batch.num_tokens.append(n)
            left -= n
        return batch

    def _admit(self, tokens: int = 0) -> ScheduledBatch:
        """Admit waiting sequences while blocks and the token budget (``tokens`` already used) allow."""
        seqs = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # Always admit one if blocks allow, even a prompt over the token budget.
            if seqs and tokens + len(seq) > self.max_num_batched_tokens:
                break
            reserve = self.reserve(seq) if self.reserve else 0
            # An idle engine admits without headroom: nobody else needs room to grow.
            headroom = self.watermark_blocks if self.running else 0
            if self.pool.blocks_to_allocate(seq, reserve) > self.pool.num_free - headroom:
                break
            self.pool.allocate(seq, reserve)
            tokens += seq.num_new_tokens
            seq.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            seqs.append(seq)
        return ScheduledBatch(seqs)

    def _decode(self) -> ScheduledBatch:
        batch = ScheduledBatch([])
        kept, decoding = [], []
        while self.running:
            seq = self.running.popleft()
            if seq.num_uncached > 1:  # part-way through its prompt (chunked): it holds its blocks already
                kept.append(seq)
                continue
            if seq.spec_tokens and not self.pool.can_append(seq, seq.num_new_tokens):
                seq.spec_tokens, seq.spec_q = [], None  # no room for the guesses: a plain step, no preemption
            while not self.pool.can_append(seq, seq.num_new_tokens):
                victim = self.running.pop() if self.running else seq
                self.preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                copy = self.pool.append_slot(seq, seq.num_new_tokens)
                if copy:
                    batch.copies.append(copy)
                kept.append(seq)
                decoding.append(seq)
        self.running.extend(kept)
        batch.seqs, batch.num_decode = decoding, len(decoding)
        return batch

    def preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it first in line, to recompute later."""
        self.pool.free_seq(seq)
        seq.status = Status.WAITING
        seq.spec_tokens, seq.spec_q = [], None
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def fork(self, parent: Sequence, n: int, make: Callable[[int], Sequence] | None = None) -> list[Sequence]:
        """n - 1 siblings of a just-prefilled ``parent``, sharing its blocks (``make(sample_index)``
        makes each, ``parent.fork`` by default)."""
        children = []
        for i in range(1, n):
            child = (make or parent.fork)(parent.sample_index + i)
            self.pool.fork(parent, child)
            child.status = Status.RUNNING
            self.running.append(child)
            children.append(child)
        return children

    def postprocess(self, seqs: list[Sequence], outputs: list[list[int]], num_fed: list[int],
                    now: float | None = None, record: Callable[[], None] | None = None) -> list[Sequence]:
        """After a forward pass over ``seqs`` (and any samples forked from them), which fed them
        ``num_fed`` tokens each and made them emit ``outputs`` (one sampled token; a speculative
        step's accepted guesses and then the target's own token; nothing for a prompt chunk that
        stops short of the prompt's end): the one place a step's results enter the sequences
        (nano-vllm's ``Scheduler.postprocess``).

        Each emitted token is appended and judged by the stop rule, one at a time; the first that
        ends a sequence ends it there (a speculative step's later tokens are dropped). What the
        sequence has stored then catches up (``num_cached``: every fed token whose K/V still holds,
        a rejected guess's not), blocks past it go back (``BlockPool.trim``) and full blocks join the
        prefix cache; ``record()`` sees the step's state before anyone leaves. The sequences the
        stop rule ended are finished (blocks freed) and returned."""
        if not len(outputs) == len(num_fed) == len(seqs):
            raise ValueError(f"{len(seqs)} sequences, {len(outputs)} outputs, {len(num_fed)} fed counts")
        for seq, out, fed in zip(seqs, outputs, num_fed):
            if not out and not 0 < fed < seq.num_uncached:
                raise ValueError(f"sequence {seq.id}: no token is only for a chunk that stops short of "
                                 f"its {seq.num_uncached} uncomputed tokens")
        done = []
        for seq, out, fed in zip(seqs, outputs, num_fed):
            if not out:
                seq.num_cached += fed
                self.pool.register(seq)
                continue
            for token in out:
                seq.token_ids.append(token)
                reason = finish_reason(token, seq.num_output_tokens, seq.request, seq.watch)  # the stop rule
                if reason:
                    seq.finish_reason, seq.finish_time = reason, now
                    done.append(seq)
                    break
            seq.num_cached = len(seq) - 1  # the newest token is fed next; the fed ones before it are stored
            if seq.spec_tokens:  # a speculative step held slots for every guess: those past what it kept go back
                seq.spec_tokens, seq.spec_q = [], None
                self.pool.trim(seq)
            self.pool.register(seq)
            if seq.first_token_time is None:
                seq.first_token_time = now
        if record is not None:
            record()
        for seq in done:
            self.finish(seq)
        return done

    def finish(self, seq: Sequence) -> None:
        self.pool.free_seq(seq)
        seq.status = Status.FINISHED
        self.running.remove(seq)

    def abort(self, seq: Sequence) -> None:
        """End ``seq`` now, running or waiting: its blocks go back, it is FINISHED ("abort")."""
        if seq.status is Status.RUNNING:
            self.finish(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = Status.FINISHED, "abort"

    @property
    def sequences(self) -> list[Sequence]:
        return list(self.running) + list(self.waiting)


class StaticScheduler(Scheduler):
    """Fixed batches: each member reserves ``reserve_tokens`` slots (a contiguous cache's
    max-length reservation), and nobody joins until the whole batch has finished."""

    def __init__(self, pool: BlockPool, reserve_tokens: int, max_num_seqs: int = 64):
        super().__init__(pool, max_num_seqs, 1 << 30, reserve=lambda seq: reserve_tokens, watermark=0)
        self.reserve_blocks = pool.blocks_needed(reserve_tokens)
        if self.reserve_blocks > pool.num_blocks:
            raise OutOfBlocksError(f"one reservation of {reserve_tokens} tokens needs "
                                   f"{self.reserve_blocks} blocks; the pool has {pool.num_blocks}")
        self.batch: list[Sequence] = []  # the current batch, finished members included

    @property
    def batch_size(self) -> int:
        """How many max-length reservations fit in the pool."""
        return min(self.max_num_seqs, self.pool.num_blocks // self.reserve_blocks)

    def _admit(self) -> ScheduledBatch:
        if self.running:
            return ScheduledBatch([])
        batch = super()._admit()  # fills the empty pool with reservations
        self.batch = list(batch.seqs)
        return batch

    def finish(self, seq: Sequence) -> None:
        # Leaves the compute batch, but its reservation stays until the batch ends.
        seq.status = Status.FINISHED
        self.running.remove(seq)
        if not self.running:
            for s in self.batch:
                self.pool.free_seq(s)
            self.batch = []

    @property
    def sequences(self) -> list[Sequence]:
        return list({id(s): s for s in self.batch + list(self.running) + list(self.waiting)}.values())
