"""A small LLM engine: requests in, tokens out, one scheduled forward pass per step.

    engine = LLMEngine(model, num_blocks=64)
    engine.add_request(prompt_ids, SamplingParams(temperature=0, max_tokens=32))
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

With ``enable_chunked_prefill=True`` (vLLM's setting of that name) a step computes at most
``max_num_batched_tokens`` tokens: the running decodes, then prompts in chunks that fill the
rest of the budget (``Scheduler(chunked=True)``); a prompt samples its first token in the step
of its last chunk. With ``attention="in_place"`` attention reads K/V block by block where they
lie (``paged_attention.InPlaceBatch``) instead of gathering each row's blocks into a copy.

A request with ``n > 1`` is prefilled once; its n samples are forked from it and share the
prompt's blocks. With ``static_reserve_tokens`` the engine runs static batching instead
(see ``scheduler.StaticScheduler``): same model, same pool, the baseline to compare with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..timing import clock
from .block_pool import BlockPool
from .config import EngineConfig
from .paged_attention import InPlaceBatch
from .paged_cache import PagedBatch, PagedKVCache
from .scheduler import Scheduler, StaticScheduler
from .sequence import SamplingParams, Sequence, Status


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    error: str | None = None  # why it was aborted, if it was

    @property
    def finished(self) -> bool:
        done = all(s.status is Status.FINISHED for s in self.seqs)
        return done and (self.error is not None or len(self.seqs) == self.params.n)

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
    num_scores: int = 0    # attention scores of a packed step: tokens x key slots (load.step_features)
    seconds: float = 0.0   # the step's own wall time, scheduling to sampling (no wait before it)

    @property
    def features(self) -> tuple[int, int, int]:
        """(tokens, sequences, attention scores): what ``load.StepCost`` prices a step by."""
        return self.num_tokens, self.batch_size, self.num_scores


def step_features(seqs, num_tokens, block_size: int) -> tuple[int, int, int]:
    """(tokens, sequences, attention scores) of one step. A packed step masks every token against
    every key slot of the step (paged_cache.PackedBatch), so its scores are tokens x key slots."""
    keys = sum(-(-(s.num_cached + n) // block_size) * block_size for s, n in zip(seqs, num_tokens))
    tokens = sum(num_tokens)
    return tokens, len(seqs), tokens * keys


class LLMEngine:
    """``LLMEngine(model, num_blocks, block_size, **settings)`` or ``LLMEngine(model,
    config=EngineConfig(...))``: the settings are ``config.EngineConfig``'s, checked there."""

    def __init__(self, model, num_blocks: int | None = None, block_size: int | None = None,
                 config: EngineConfig | None = None, **settings):
        if config is None:
            sizes = {k: v for k, v in (("num_blocks", num_blocks), ("block_size", block_size)) if v is not None}
            config = EngineConfig.of(**sizes, **settings)
        elif num_blocks is not None or block_size is not None or settings:
            raise ValueError("give the engine an EngineConfig or its settings, not both")
        if config.num_blocks is None:
            raise ValueError("the engine needs num_blocks: how many KV blocks its pool holds")
        self.config = c = config
        self.model, self.padded_prefill, self.packed = model, c.padded_prefill, c.packed
        self.view = InPlaceBatch if c.attention == "in_place" else PagedBatch
        self.cache = PagedKVCache.for_model(model, c.num_blocks, c.block_size)
        self.pool = BlockPool(c.num_blocks, c.block_size, c.enable_prefix_caching and not c.static)
        self.scheduler = (StaticScheduler(self.pool, c.static_reserve_tokens, c.max_num_seqs) if c.static else
                          Scheduler(self.pool, c.max_num_seqs, c.max_num_batched_tokens, watermark=c.watermark,
                                    mixed=c.packed, chunked=c.enable_chunked_prefill))
        self.requests: list[Request] = []
        self._to_fork: set[int] = set()  # ids of first sequences whose n - 1 siblings are still to fork
        self._request_of: dict[int, Request] = {}  # sequence id -> its request
        self.stats: list[StepStats] = []
        self.states: list[dict] | None = [] if c.record_states else None
        self.t0 = clock()

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def add_request(self, prompt_ids, params: SamplingParams | None = None) -> Request:
        """Queue one request. Everything is checked here, before anything changes."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        checked = params.request(prompt_ids, self.model.config)  # the one check
        if checked.ids.shape[0] != 1:
            raise ValueError(f"expected one prompt, got a batch of {checked.ids.shape[0]}")
        if params.n > 1 and self.config.static:
            raise ValueError("static batching here does not fork samples: use n=1")
        seq = Sequence(checked, params, self.block_size)
        self.scheduler.add(seq)  # raises if it could never fit
        seq.arrival_time = clock()
        req = Request(len(self.requests), seq.token_ids[:], params, [seq], seq.arrival_time)
        self.requests.append(req)
        self._request_of[seq.id] = req
        if params.n > 1:
            self._to_fork.add(seq.id)
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @torch.inference_mode()
    def step(self) -> list[tuple[Sequence, int]]:
        """One forward pass; returns the (sequence, new token) pairs it produced.

        All or nothing per request: an error while serving one (its forward, its sampling)
        aborts that request alone, with its blocks freed and the error on ``Request.error``;
        the others' steps go on as if it had never been there."""
        start = clock()  # no wait for the device first: the last step ended with one
        batch = self.scheduler.schedule()
        seqs = batch.seqs
        if not seqs:
            raise RuntimeError("nothing can run: every waiting request needs more free blocks "
                               f"than the {self.pool.num_free} left")
        self.cache.copy_blocks(batch.copies)
        new = batch.num_tokens
        scores = step_features(seqs, new, self.block_size)[2]
        rows, padded = self._run(seqs, new, batch.is_prefill)
        out, errors = [], {}
        for s, n, row in zip(seqs, new, rows):
            req = self._request_of[s.id]
            try:
                if isinstance(row, Exception):
                    raise row
                if n < s.num_new_tokens:  # a prompt chunk short of the prompt's end: nothing to sample
                    out.append((s, None, n))
                    continue
                group = [s] + self._fork(s, req)
                out += [(g, self._sample(g, row), n) for g in group]
            except Exception as e:
                errors.setdefault(req.id, (req, e))
        out = self._read_tokens(out, errors)
        now = clock(self.model.device)
        for req, e in errors.values():
            self._abort(req, e, now)
        out = [o for o in out if self._request_of[o[0].id].error is None]
        self.scheduler.postprocess([g for g, _, _ in out], [tok for _, tok, _ in out], now,
                                   record=lambda: self._record(batch, new, padded, scores), num_tokens=[n for *_, n in out])
        sampled = [(g, tok) for g, tok, _ in out if tok is not None]
        st = self.stats[-1]
        st.time, st.new_tokens, st.seconds = now - self.t0, len(sampled), now - start
        if self.states is not None:
            self.states.append(self.snapshot(batch))
        return sampled

    def abort(self, request: Request, reason: str = "aborted by the caller") -> None:
        """Stop a request now; its blocks go back to the pool."""
        self._abort(request, RuntimeError(reason), clock())

    def _abort(self, req: Request, error: Exception, now: float) -> None:
        req.error = f"{type(error).__name__}: {error}"
        for s in req.seqs:
            self._to_fork.discard(s.id)
            self.scheduler.abort(s)
            s.finish_time = now

    def _run(self, seqs: list[Sequence], counts: list[int], is_prefill: bool) -> tuple[list, int]:
        """Next-token logits [1, vocab] for each sequence (fed its next ``counts`` tokens), or the
        exception its forward raised.

        A forward over several sequences that fails is run again one sequence at a time, so
        that only the sequence that causes the error loses its step."""
        pairs = list(zip(seqs, counts))
        if self.packed:
            forward, groups = self._forward_packed, [pairs]
        else:
            forward = self._forward
            groups = [[p] for p in pairs] if is_prefill and not self.padded_prefill else [pairs]
        rows, padded = [], 0
        for group in groups:
            try:
                logits = forward(*zip(*group))
                rows += [logits[i:i + 1] for i in range(len(group))]
            except Exception as e:
                rows += [e] if len(group) == 1 else [self._alone(forward, *p) for p in group]
            new = [n for _, n in group]
            padded += sum(new) if self.packed else len(group) * max(new)
        return rows, padded

    @staticmethod
    def _alone(forward, seq: Sequence, n: int):
        try:
            return forward([seq], [n])
        except Exception as e:
            return e

    def _fork(self, seq: Sequence, req: Request) -> list[Sequence]:
        """At the first prefill of a request with n > 1: its other samples, sharing its blocks."""
        if seq.id not in self._to_fork:
            return []
        self._to_fork.remove(seq.id)
        children = self.scheduler.fork(seq, req.params.n)
        req.seqs.extend(children)
        self._request_of.update((c.id, req) for c in children)
        return children

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """The sequence's next token [1], left on the device (``_read_tokens`` reads the step's together)."""
        return seq.sampler(logits).reshape(1).to(self.model.device)

    def _read_tokens(self, out: list, errors: dict) -> list:
        """``out`` with every sampled token read back to the host in one transfer: on a GPU each
        read waits for the device, so the step waits once, not once per sequence. A token outside
        the vocabulary fails its own request (into ``errors``)."""
        at = [i for i, (_, tok, _) in enumerate(out) if tok is not None]
        if not at:
            return out
        out = list(out)
        vocab = self.model.config.vocab_size
        for i, token in zip(at, torch.cat([out[i][1] for i in at]).tolist()):
            seq, _, n = out[i]
            out[i] = (seq, token, n)
            if not 0 <= token < vocab:
                req = self._request_of[seq.id]
                errors.setdefault(req.id, (req, ValueError(f"sampled token {token} is outside [0, {vocab})")))
        return out

    def _forward(self, seqs, new) -> torch.Tensor:
        """Logits [B, vocab] after each row's last fed token (its next ``new`` tokens), for a
        ragged batch padded to its longest with each row's last token at its last position
        (see paged_cache)."""
        T = max(new)
        ids = [s.token_ids[s.num_cached:s.num_cached + n] + [s.token_ids[s.num_cached + n - 1]] * (T - n)
               for s, n in zip(seqs, new)]
        view = self.view(self.cache, [s.block_table for s in seqs], [s.num_cached for s in seqs], list(new))
        # No positions passed: the view knows where each row continues from.
        return self.model(torch.tensor(ids, device=self.model.device), cache=view, last_only=True)[:, -1].float()

    def _forward_packed(self, seqs, new) -> torch.Tensor:
        """Logits [B, vocab]: every row's fed tokens in one row, the LM head at each one's last."""
        ids = [t for s, n in zip(seqs, new) for t in s.token_ids[s.num_cached:s.num_cached + n]]
        view = self.cache.packed([s.block_table for s in seqs], [s.num_cached for s in seqs], list(new))
        return self.model(torch.tensor([ids], device=self.model.device), cache=view, logits_at=view.last)[0].float()

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
        reqs = []
        try:
            for p, sp in zip(prompts, params):
                reqs.append(self.add_request(p, sp))
        except Exception:  # all the prompts or none: those already queued leave again
            for r in reqs:
                self.abort(r, "another prompt of the same generate() call was rejected")
            raise
        self.run()
        failed = [r for r in reqs if r.error]
        if failed:
            raise RuntimeError(f"request {failed[0].id} failed: {failed[0].error}")
        return [r.outputs if r.params.n > 1 else r.outputs[0] for r in reqs]

    # --- what the notebook plots ---
    def _record(self, batch, new, padded, scores) -> None:
        sch = self.scheduler
        self.stats.append(StepStats(
            step=len(self.stats), time=0.0, kind=batch.kind,
            batch_size=len(batch.seqs), num_decode=batch.num_decode, num_tokens=sum(new), padded_tokens=padded,
            num_running=len(sch.running), num_waiting=len(sch.waiting), used_blocks=self.pool.num_used,
            filled_slots=self.pool.filled_slots(sch.sequences), preempted=len(batch.preempted), new_tokens=0,
            num_scores=scores))

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
