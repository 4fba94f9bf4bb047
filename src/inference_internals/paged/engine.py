"""A small LLM engine: requests in, tokens out, one scheduled forward pass per step.

    engine = LLMEngine(model, num_blocks=64)
    engine.add_request(prompt_ids, SamplingParams(max_new_tokens=32))
    while engine.has_unfinished():
        engine.step()

Each step asks the scheduler what to run, makes its copy-on-write copies, runs the model
through the paged cache, and samples one token per sequence. Decode is one forward over
[B, 1]: one token per running sequence, each at its own position.

Prefill runs each newly admitted prompt on its own ([1, prompt length]) by default: a
prompt is already a large matrix multiply, and nothing is computed for padding. With
``padded_prefill=True`` the prompts go in one padded batch [B, longest new prompt]
instead: one forward, but B x longest tokens computed (``stats`` counts both). With
``packed=True`` a step is run as vLLM runs it: every token of the step, prompts and decode
tokens alike, end to end in one row [1, N] (``paged_cache.PackedBatch``), so nothing is
padded and each weight is read once per step. Continuous batching then mixes the two:
prompts admitted in a step join that step's decode (``Scheduler(mixed=True)``).

A request with ``n > 1`` is prefilled once; its n samples are forked from it and share the
prompt's blocks. With ``static_reserve_tokens`` the engine runs static batching instead
(see ``scheduler.StaticScheduler``): same model, same pool, the baseline to compare with.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ..device import synchronize
from .block_pool import BlockPool
from .paged_cache import PagedKVCache
from .scheduler import Scheduler, StaticScheduler
from .sequence import SamplingParams, Sequence, Status


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.status is Status.FINISHED for s in self.seqs)

    @property
    def outputs(self) -> list[list[int]]:
        return [s.output_ids for s in self.seqs]

    @property
    def finish_time(self) -> float | None:
        return max(s.finish_time for s in self.seqs) if self.finished else None

    @property
    def latency(self) -> float | None:
        """Seconds from arrival until the last sample's last token."""
        return None if not self.finished else self.finish_time - self.arrival_time


@dataclass
class StepStats:
    """One step, as it was while its forward pass ran (before finished sequences left)."""
    step: int
    time: float            # seconds since the engine was made, at the end of the step
    kind: str              # "prefill", "decode", or "mixed" (both in one packed pass)
    batch_size: int        # sequences in the forward pass
    num_decode: int        # of which decode one token (the rest are prompts, new or recomputed)
    num_tokens: int        # tokens computed (without pads)
    padded_tokens: int     # tokens actually run, pads included
    num_running: int
    num_waiting: int
    used_blocks: int       # blocks held (reserved) by anyone
    filled_slots: int      # slots of held blocks that hold a real token's K/V
    preempted: int
    new_tokens: int        # tokens sampled this step


class LLMEngine:
    def __init__(self, model, num_blocks: int, block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True, watermark: float = 0.01,
                 static_reserve_tokens: int | None = None, padded_prefill: bool = False,
                 packed: bool = False, record_states: bool = False):
        if packed and padded_prefill:
            raise ValueError("choose one layout: packed or padded_prefill")
        self.model, self.padded_prefill, self.packed = model, padded_prefill, packed
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        static = static_reserve_tokens is not None
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching and not static)
        self.scheduler = (StaticScheduler(self.pool, static_reserve_tokens, max_num_seqs) if static else
                          Scheduler(self.pool, max_num_seqs, max_num_batched_tokens, watermark=watermark,
                                    mixed=packed))
        self.requests: list[Request] = []
        self._to_fork: dict[int, Request] = {}  # parent seq id -> request still to fork
        self.stats: list[StepStats] = []
        self.states: list[dict] | None = [] if record_states else None
        self.t0 = time.perf_counter()

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def add_request(self, prompt_ids, params: SamplingParams | None = None) -> Request:
        params = params or SamplingParams()
        ctx = self.model.config.max_position_embeddings
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("the prompt must hold at least one token id")
        if len(prompt_ids) >= ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in the "
                             f"{ctx}-token context window")
        bad = [t for t in prompt_ids if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise ValueError(f"token ids must be in [0, {self.model.config.vocab_size}), got {bad[:5]}")
        if params.n > 1 and isinstance(self.scheduler, StaticScheduler):
            raise ValueError("static batching here does not fork samples: use n=1")
        params = replace(params, max_new_tokens=min(params.max_new_tokens, ctx - len(prompt_ids)))
        seq = Sequence(prompt_ids, params, self.block_size)
        self.scheduler.add(seq)  # raises if it could never fit
        seq.arrival_time = time.perf_counter()
        req = Request(len(self.requests), prompt_ids, params, [seq], seq.arrival_time)
        self.requests.append(req)
        if params.n > 1:
            self._to_fork[seq.id] = req
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @torch.inference_mode()
    def step(self) -> list[tuple[Sequence, int]]:
        """One forward pass; returns the (sequence, new token) pairs it produced."""
        batch = self.scheduler.schedule()
        seqs = batch.seqs
        if not seqs:
            raise RuntimeError("nothing can run: every waiting request needs more free blocks "
                               f"than the {self.pool.num_free} left")
        self.cache.copy_blocks(batch.copies)
        new = [s.num_new_tokens for s in seqs]
        if self.packed:
            logits, padded = self._forward_packed(seqs), sum(new)
        else:
            per_seq = batch.is_prefill and not self.padded_prefill
            groups = [[s] for s in seqs] if per_seq else [seqs]
            logits = torch.cat([self._forward(g) for g in groups])
            padded = sum(len(g) * max(s.num_new_tokens for s in g) for g in groups)
        for s, n in zip(seqs, new):
            s.num_cached += n
            self.pool.register(s)
        self._record(batch, new, padded)  # the state while this forward ran, before anyone leaves
        out = []
        for i, s in enumerate(seqs):
            group = [s]
            req = self._to_fork.pop(s.id, None)
            if req is not None:  # first prefill of a parallel-sampling request
                children = self.scheduler.fork(s, req.params.n)
                req.seqs.extend(children)
                group += children
            for g in group:
                out.append((g, int(g.sampler(logits[i:i + 1])[0])))
        synchronize(self.model.device)
        now = time.perf_counter()
        for seq, tok in out:
            self._append(seq, tok, now)
        self.stats[-1].time, self.stats[-1].new_tokens = now - self.t0, len(out)
        if self.states is not None:
            self.states.append(self.snapshot(batch))
        return out

    def _forward(self, seqs: list[Sequence]) -> torch.Tensor:
        """Next-token logits [B, vocab] for a ragged batch, padded to its longest new part
        with each row's last token at its last position (see paged_cache)."""
        new = [s.num_new_tokens for s in seqs]
        T = max(new)
        ids = [s.token_ids[s.num_cached:] + [s.token_ids[-1]] * (T - n) for s, n in zip(seqs, new)]
        pos = [list(range(s.num_cached, len(s))) + [len(s) - 1] * (T - n) for s, n in zip(seqs, new)]
        dev = self.model.device
        view = self.cache.batch([s.block_table for s in seqs], [s.num_cached for s in seqs], new)
        return self.model(torch.tensor(ids, device=dev), positions=torch.tensor(pos, device=dev),
                          cache=view, last_only=True)[:, -1].float()

    def _forward_packed(self, seqs: list[Sequence]) -> torch.Tensor:
        """Next-token logits [B, vocab]: all new tokens in one row, the LM head at each one's last."""
        ids = [t for s in seqs for t in s.token_ids[s.num_cached:]]
        view = self.cache.packed([s.block_table for s in seqs], [s.num_cached for s in seqs],
                                 [s.num_new_tokens for s in seqs])
        # view.want: each token's position, each sequence continuing from what it has cached
        return self.model(torch.tensor([ids], device=self.model.device), positions=view.want[None],
                          cache=view, logits_at=view.last)[0].float()

    def _append(self, seq: Sequence, tok: int, now: float) -> None:
        seq.token_ids.append(tok)
        if seq.first_token_time is None:
            seq.first_token_time = now
        p = seq.params
        stops = p.stop_ids if p.stop_ids is not None else (self.model.config.eos_token_id,)
        if p.ignore_eos:
            stops = ()
        if tok in stops or len(seq.output_ids) >= p.max_new_tokens:
            seq.finish_time = now
            self.scheduler.finish(seq)

    def run(self) -> list[Request]:
        while self.has_unfinished():
            self.step()
        return self.requests

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None):
        """New token ids for each prompt (a list of n lists per prompt when n > 1)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        self.run()
        return [r.outputs if r.params.n > 1 else r.outputs[0] for r in reqs]

    # --- what the notebook plots ---
    def _record(self, batch, new, padded) -> None:
        sch = self.scheduler
        self.stats.append(StepStats(
            step=len(self.stats), time=0.0, kind=batch.kind,
            batch_size=len(batch.seqs), num_decode=batch.num_decode, num_tokens=sum(new), padded_tokens=padded,
            num_running=len(sch.running), num_waiting=len(sch.waiting), used_blocks=self.pool.num_used,
            filled_slots=self.pool.filled_slots(sch.sequences), preempted=len(batch.preempted), new_tokens=0))

    def snapshot(self, batch=None) -> dict:
        """The pool and every live sequence's block table, as plain data (for the widget)."""
        bs = self.block_size
        owners = [[] for _ in range(self.pool.num_blocks)]
        fill = [0] * self.pool.num_blocks
        seqs = {}
        for s in self.scheduler.sequences:
            seqs[s.id] = dict(status=s.status.name, table=list(s.block_table), tokens=len(s),
                              cached=s.num_cached, preemptions=s.num_preemptions)
            for i, bid in enumerate(s.block_table):
                owners[bid].append(s.id)
                fill[bid] = max(fill[bid], min(bs, max(0, s.num_cached - i * bs)))
        return dict(step=len(self.stats) - 1, kind="prefill" if batch is None else batch.kind,
                    owners=owners, fill=fill, cached=[b.hash is not None for b in self.pool.blocks],
                    seqs=seqs, running=[s.id for s in self.scheduler.running],
                    waiting=[s.id for s in self.scheduler.waiting],
                    preempted=[s.id for s in (batch.preempted if batch else [])])
