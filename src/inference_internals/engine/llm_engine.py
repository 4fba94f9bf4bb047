"""The engine: requests in, tokens out, one scheduled forward pass per step.

    engine = LLMEngine(num_blocks=64, quantization="q4_1")    # or LLMEngine(model) for a Llama you built
    outs = engine.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    outs[0].outputs[0].text

A step is three moves, as in nano-vllm (and a fourth in speculative mode):

    batch = scheduler.schedule()                 # what runs: admissions, decodes, preemptions
    outs = runner.run(batch)                     # how: the forward pass, in the layout this batch wants
    scheduler.postprocess(batch, tokens)         # what happened: tokens appended, the stop rule, blocks freed
    spec.propose(running)                        # speculative mode: each sequence's guesses for the next step

between ``run`` and ``postprocess``, each sequence's token is sampled from its logits (``Sequence.sampler``),
or, in speculative mode, its verified guesses are accepted (``spec_decode``). Every request, one prompt
or many, plain or speculative, goes through this loop: ``LLM`` is this class, with ``chat``.

Every prompt and setting is checked once (``params.check_request``), before anything changes. A
request that fails while running (its forward, its sampling) is aborted alone, its blocks freed and
the error on its output; the others' steps go on as if it had never been there.

A request with ``n > 1`` is prefilled once; its n samples are forked from it and share the
prompt's blocks. With ``static_reserve_tokens`` the engine runs static batching instead
(see ``scheduler.StaticScheduler``): same model, same pool, the baseline to compare with.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..logprobs import prompt_logprobs
from ..outputs import CompletionOutput, RequestMetrics, RequestOutput
from ..params import SamplingParams
from ..stop import StopStrings
from ..timing import clock
from .block_pool import BlockPool, WindowedBlockPool
from .model_runner import ModelRunner
from .scheduler import Scheduler, StaticScheduler
from .sequence import Sequence, Status
from .spec_decode import SpecDecoder


@dataclass
class Request:
    id: int
    prompt: str | None         # the text, when it came as text
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
    num_decode: int        # of which decode (the rest are prompts, new or recomputed)
    num_tokens: int        # tokens computed (without pads)
    padded_tokens: int     # tokens actually run, pads included
    num_running: int
    num_waiting: int
    used_blocks: int       # blocks held (reserved) by anyone
    filled_slots: int      # slots of held blocks that hold a real token's K/V
    preempted: int
    new_tokens: int        # tokens emitted this step (a speculative step's accepted guesses included)
    num_scores: int = 0    # attention scores of a packed step: tokens x key slots (load.step_features)
    seconds: float = 0.0   # the step's own wall time, scheduling to sampling (no wait before it)

    @property
    def features(self) -> tuple[int, int, int]:
        """(tokens, sequences, attention scores): what ``load.StepCost`` prices a step by."""
        return self.num_tokens, self.batch_size, self.num_scores


def step_features(seqs, num_tokens, block_size: int) -> tuple[int, int, int]:
    """(tokens, sequences, attention scores) of one step. A packed step masks every token against
    every key slot of the step (paged.PackedBatch), so its scores are tokens x key slots."""
    keys = sum(-(-(s.num_cached + n) // block_size) * block_size for s, n in zip(seqs, num_tokens))
    tokens = sum(num_tokens)
    return tokens, len(seqs), tokens * keys


class LLMEngine:
    """``LLMEngine(model=None, tokenizer=None, **settings)``: ``model`` and every setting are
    ``config.EngineConfig``'s, checked there before anything is loaded (or ``config=EngineConfig(...)``).
    ``tokenizer`` (anything with ``encode`` and ``decode``) turns text prompts into ids and ids into
    text; a model the engine loads itself brings its own (chapter 2's BPE)."""

    def __init__(self, model=None, tokenizer=None, config: EngineConfig | None = None, **settings):
        if config is None:
            config = EngineConfig.of(model=model, **settings)
        elif model is not None or settings:
            raise ValueError("give the engine an EngineConfig or its settings, not both")
        if tokenizer is not None and not all(callable(getattr(tokenizer, f, None)) for f in ("encode", "decode")):
            raise TypeError(f"tokenizer must have encode(text) and decode(ids), got {type(tokenizer).__name__}")
        self.config = c = config
        self.spec = None
        self.runner = ModelRunner(c)
        self.model = self.runner.model
        if c.speculative_config is not None:
            self.spec = SpecDecoder(c.speculative_config, self.model)
            self.runner.needs_hidden = self.spec.needs_hidden
        if tokenizer is None and c.loads_model:
            from ..spm import load_tokenizer_for  # Gemma's SentencePiece BPE, or chapter 2's byte-level one
            tokenizer = load_tokenizer_for(c.model)
        self.tokenizer = tokenizer
        self.pool = self.scheduler = None
        if c.num_blocks is not None:
            self._allocate(c.num_blocks)
        self.requests: list[Request] = []  # every request not forgotten (forget), in arrival order
        self._next_id = 0
        self._to_fork: set[int] = set()  # ids of first sequences whose n - 1 siblings are still to fork
        self._request_of: dict[int, Request] = {}  # sequence id -> its request
        self.stats: list[StepStats] = []
        self.states: list[dict] | None = [] if c.record_states else None
        self.t0 = clock()

    def _allocate(self, num_blocks: int, num_local_blocks: int | None = None) -> None:
        """The pool (its blocks' bookkeeping, and their K/V in the runner) and the scheduler over it. A model
        with sliding-window layers gets a second, local pool for them (``WindowedBlockPool``), whose blocks
        go back as they leave the window: ``num_local_blocks`` of them (default: as many as ``num_blocks``)."""
        c = self.config
        window = self.model.config.sliding_window if self.model.config.windowed_layers else None
        if window is None:
            self.runner.allocate(num_blocks)
            self.pool = BlockPool(num_blocks, c.block_size, c.enable_prefix_caching and not c.static)
        else:
            num_local_blocks = num_local_blocks or num_blocks
            self.runner.allocate(num_blocks, num_local_blocks)
            self.pool = WindowedBlockPool(num_blocks, c.block_size, window, num_local_blocks)
        self.scheduler = (StaticScheduler(self.pool, c.static_reserve_tokens, c.max_num_seqs) if c.static else
                          Scheduler(self.pool, c.max_num_seqs, c.max_num_batched_tokens, watermark=c.watermark,
                                    mixed=c.packed, chunked=c.enable_chunked_prefill))

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def cache(self):
        """The K/V pool (``kv_cache.PagedKVCache``)."""
        return self.runner.cache

    # --- requests in ---
    def add_request(self, prompt, params: SamplingParams | None = None) -> Request:
        """Queue one request (token ids, text, or ``{"prompt_token_ids": [...]}``). Everything is
        checked here, before anything changes."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: LLM(model, tokenizer=...), or use stop_token_ids")
        text = prompt if isinstance(prompt, str) else None
        checked = params.request(self._ids(prompt), self.model.config)  # the one check
        if checked.ids.shape[0] != 1:
            raise ValueError(f"expected one prompt, got a batch of {checked.ids.shape[0]}")
        if params.n > 1 and self.config.static:
            raise ValueError("static batching here does not fork samples: use n=1")
        if self.scheduler is None:
            raise ValueError("the engine needs num_blocks (how many KV blocks its pool holds), "
                             "or generate() to size the pool for its prompts")
        seq = self._sequence(checked, params, 0)
        self.scheduler.add(seq)  # raises if it could never fit
        seq.arrival_time = clock()
        req = Request(self._next_id, text, seq.token_ids[:], params, [seq], seq.arrival_time)
        self._next_id += 1
        self.requests.append(req)
        self._request_of[seq.id] = req
        if params.n > 1:
            self._to_fork.add(seq.id)
        return req

    def _ids(self, prompt):
        """A prompt's token ids, as given or from its text (checked by ``check_request`` after)."""
        if isinstance(prompt, dict):
            if set(prompt) != {"prompt_token_ids"}:
                raise ValueError(f"a dict prompt holds only 'prompt_token_ids', got keys {sorted(prompt)}")
            return prompt["prompt_token_ids"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: LLM(model, tokenizer=...), or pass token ids")
            return self.tokenizer.encode(prompt)
        return prompt

    def _sequence(self, checked, params: SamplingParams, index: int, parent: Sequence | None = None) -> Sequence:
        seq = parent.fork(index) if parent is not None else Sequence(checked, params, self.block_size)
        if params.stop:
            seq.watch = StopStrings(params.stop, lambda ids, skip=params.skip_special_tokens:
                                    self.tokenizer.decode(ids, skip_special_tokens=skip))
        if self.spec is not None:
            self.spec.start(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler is not None and self.scheduler.has_unfinished()

    # --- one step ---
    def step(self) -> list[tuple[Sequence, list[int]]]:
        """One forward pass; returns the (sequence, tokens it emitted) pairs it produced."""
        start = clock()  # no wait for the device first: the last step ended with one
        batch = self.scheduler.schedule()
        seqs, fed = batch.seqs, batch.num_tokens
        if not seqs:
            raise RuntimeError("nothing can run: every waiting request needs more free blocks "
                               f"than the {self.pool.num_free} left")
        self.cache.copy_blocks(batch.copies)
        if isinstance(self.pool, WindowedBlockPool):
            self.cache.copy_blocks(self.pool.pop_local_copies(), local=True)
        scores = step_features(seqs, fed, self.block_size)[2]
        results = self.runner.run(seqs, fed, batch.is_prefill)
        seqs, fed, emitted, errors = self._sample(seqs, fed, results)
        now = clock(self.model.device)
        if errors:
            for req, e in errors.values():
                self._abort(req, e, now)
            live = [i for i, s in enumerate(seqs) if self._request_of[s.id].error is None]
            seqs, fed, emitted = [seqs[i] for i in live], [fed[i] for i in live], [emitted[i] for i in live]
        padded = sum(fed) if self.config.packed or len(batch.seqs) == 1 else (
            sum(fed) if batch.is_prefill and not self.config.padded_prefill else len(batch.seqs) * max(batch.num_tokens))
        self.scheduler.postprocess(seqs, emitted, fed, now, record=lambda: self._record(batch, padded, scores))
        if self.spec is not None:
            for s in seqs:
                if s.status is Status.RUNNING and s.num_uncached == 1:
                    self.spec.propose(s)
        st = self.stats[-1]
        st.time, st.new_tokens, st.seconds = now - self.t0, sum(map(len, emitted)), now - start
        if self.states is not None:
            self.states.append(self.snapshot(batch))
        return [(s, out) for s, out in zip(seqs, emitted) if out]

    def _sample(self, seqs, fed, results):
        """Each sequence's emitted tokens: none for a prompt chunk short of its end; one sampled from its
        logits (and one for each sample forked from it at its first prefill); or its accepted guesses
        and the target's token (speculative). The sampled ones are read back to the host together, in
        one transfer: on a GPU each read waits for the device. A failure (a forward's exception, a
        sampler's, a token outside the vocabulary) fails its request alone, into ``errors``.
        Returns the sequences (forks included), what each was fed, what each emitted, and the errors."""
        out_seqs, out_fed, emitted, sampled, errors = [], [], [], [], {}
        for s, n, res in zip(seqs, fed, results):
            req = self._request_of[s.id]
            try:
                if isinstance(res, Exception):
                    raise res
                if n < s.num_new_tokens:  # a prompt chunk short of the prompt's end: nothing to sample
                    group = [(s, [])]
                elif s.spec_tokens:
                    group = [(s, self.spec.accept(s, res.logits))]
                else:
                    group = [(g, None) for g in [s] + self._fork(s, req)]
                    tokens = [g.sampler(res.logits[-1:]).reshape(1) for g, _ in group]  # left on the device
                    sampled += [(len(emitted) + i, token) for i, token in enumerate(tokens)]
                for g, out in group:
                    if res.hidden is not None:  # the states of the positions whose next token is now known
                        rows = res.hidden[:n - len(s.spec_tokens) - 1 + len(out) if out else n]
                        # added to those the draft has not read yet (a prompt in chunks); from position 0 anew
                        g.hidden = rows if g.hidden is None or s.num_cached == 0 else torch.cat([g.hidden, rows])
                    out_seqs.append(g), out_fed.append(n), emitted.append(out)
            except Exception as e:
                errors.setdefault(req.id, (req, e))
        if sampled:
            vocab = self.model.config.vocab_size
            tokens = sampled[0][1] if len(sampled) == 1 else torch.cat([t.to(self.model.device) for _, t in sampled])
            for (i, _), token in zip(sampled, tokens.tolist()):
                emitted[i] = [token]
                if not 0 <= token < vocab:
                    req = self._request_of[out_seqs[i].id]
                    errors.setdefault(req.id, (req, ValueError(f"sampled token {token} is outside [0, {vocab})")))
        return out_seqs, out_fed, emitted, errors

    def _fork(self, seq: Sequence, req: Request) -> list[Sequence]:
        """At the first prefill of a request with n > 1: its other samples, sharing its blocks."""
        if seq.id not in self._to_fork:
            return []
        self._to_fork.remove(seq.id)
        children = self.scheduler.fork(seq, req.params.n,
                                       make=lambda i: self._sequence(None, req.params, i, parent=seq))
        req.seqs.extend(children)
        self._request_of.update((c.id, req) for c in children)
        return children

    def abort(self, request: Request, reason: str = "aborted by the caller") -> None:
        """Stop a request now; its blocks go back to the pool."""
        self._abort(request, RuntimeError(reason), clock())

    def forget(self, req: Request) -> None:
        """Drop a finished request whose output the caller has taken: a server does, once it has
        answered, so an engine that serves for weeks holds only the requests in flight."""
        if not req.finished:
            raise ValueError(f"request {req.id} has not finished: abort it first")
        self.requests.remove(req)
        for s in req.seqs:
            self._request_of.pop(s.id, None)

    def _abort(self, req: Request, error: Exception, now: float) -> None:
        req.error = f"{type(error).__name__}: {error}"
        for s in req.seqs:
            self._to_fork.discard(s.id)
            self.scheduler.abort(s)
            s.finish_time = now

    def run(self) -> list[Request]:
        while self.has_unfinished():
            self.step()
        return self.requests

    # --- requests out ---
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """A ``RequestOutput`` for one prompt or each of a list: text (needs a tokenizer), token ids, or
        ``{"prompt_token_ids": [...]}``; one ``SamplingParams`` for all (vLLM's defaults: sampled at
        temperature 1, 16 tokens), or one per prompt. All the prompts are checked before any runs."""
        prompts = self._prompt_list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
        checked = [p.request(self._ids(prompt), self.model.config) for prompt, p in zip(prompts, params)]
        if self.config.num_blocks is None and not self.has_unfinished():
            self._size_pool(checked)
        reqs = []
        try:
            for prompt, c, p in zip(prompts, checked, params):
                reqs.append(self.add_request(prompt if isinstance(prompt, str) else c.prompt_token_ids, p))
        except Exception:  # all the prompts or none: those already queued leave again
            for r in reqs:
                self.abort(r, "another prompt of the same generate() call was rejected")
            raise
        self.run()
        return [self.output(r) for r in reqs]

    @staticmethod
    def _prompt_list(prompts) -> list:
        if prompts is None or isinstance(prompts, (numbers.Number, bytes)):
            raise TypeError(f"prompts must be text, token ids, {{'prompt_token_ids': [...]}} or a list of them, "
                            f"got {type(prompts).__name__}")
        if isinstance(prompts, torch.Tensor):
            single = prompts.dim() == 1
        else:
            single = isinstance(prompts, (str, dict)) or (len(prompts) > 0 and not isinstance(
                prompts[0], (str, dict, list, tuple, torch.Tensor)))
        prompts = [prompts] if single else list(prompts)
        if not prompts:
            raise ValueError("give at least one prompt")
        return prompts

    def _size_pool(self, checked) -> None:
        """Room for every request at once (``num_blocks=None``): each sample's prompt, budget and guesses."""
        bs, gamma = self.block_size, self.spec.gamma if self.spec else 0
        need = sum(r.params.n * -(-(r.ids.shape[1] + r.max_new_tokens + gamma) // bs) for r in checked)
        window = self.model.config.sliding_window if self.model.config.windowed_layers else None
        if window is None:
            if self.pool is None or self.pool.num_blocks < need:
                self._allocate(need)
            return
        # the local pool: each sample's prompt (prefilled whole, then freed down to the window), or its
        # window and a step's guesses, whichever is more, and a block the window straddles
        local = sum(r.params.n * (-(-min(r.ids.shape[1] + r.max_new_tokens + gamma,
                                         max(r.ids.shape[1], window + gamma + 1)) // bs) + 1) for r in checked)
        if self.pool is None or self.pool.num_blocks < need or self.pool.local.num_blocks < local:
            self._allocate(need, local)

    def output(self, req: Request) -> RequestOutput:
        """``req`` as vLLM returns it: each sample's tokens and text (without the stop token or string that
        ended it, unless ``include_stop_str_in_output``), why it ended, and its log-probabilities."""
        p = req.params
        out = RequestOutput(req.id, req.prompt, req.prompt_ids, error=req.error)
        firsts = [s.first_token_time for s in req.seqs if s.first_token_time is not None]
        out.metrics = RequestMetrics(req.arrival_time, min(firsts) if firsts else None,
                                     max((s.finish_time for s in req.seqs if s.finish_time is not None), default=None),
                                     sum(s.num_output_tokens for s in req.seqs))
        decode_one = self._decode_one(p)
        for s in req.seqs:
            o = CompletionOutput(s.sample_index, "", s.output_ids, s.finish_reason or "abort")
            o.text = self._text(s, o)
            last = o.token_ids[-1] if o.token_ids else None
            if o.finish_reason == "stop" and s.watch is not None and s.watch.stop_reason is not None:
                o.stop_reason = s.watch.stop_reason
            elif o.finish_reason == "stop" and last in (p.stop_token_ids or ()) and last != self.model.config.eos_token_id:
                o.stop_reason = last  # vLLM: the stop_token_ids id that ended it; None for EOS
            recorder = getattr(s.sampler, "recorder", None)
            if recorder is not None:
                recorder.truncate(len(o.token_ids))  # (a speculative step records its guesses; some were cut)
                o.logprobs, o.cumulative_logprob = recorder.positions(decode_one), recorder.cumulative()
            out.outputs.append(o)
        if p.prompt_logprobs is not None:
            out.prompt_logprobs = prompt_logprobs(self.model, req.prompt_ids, p.prompt_logprobs, decode_one)
        return out

    def _decode_one(self, p: SamplingParams):
        if self.tokenizer is None or not p.detokenize:
            return None
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)

    def _text(self, s: Sequence, o: CompletionOutput) -> str:
        """The output's text, as vLLM's detokenizer gives it."""
        p = s.params
        if self.tokenizer is None or not p.detokenize:
            return ""
        if s.watch is not None and s.watch.stop_reason is not None:  # ended by a stop string
            return s.watch.text + (s.watch.stop_reason if p.include_stop_str_in_output else "")
        ids = o.token_ids[:-1] if o.finish_reason == "stop" and not p.include_stop_str_in_output else o.token_ids
        return self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    # --- what the notebook plots ---
    def _record(self, batch, padded, scores) -> None:
        sch = self.scheduler
        self.stats.append(StepStats(
            step=len(self.stats), time=0.0, kind=batch.kind,
            batch_size=len(batch.seqs), num_decode=batch.num_decode, num_tokens=sum(batch.num_tokens),
            padded_tokens=padded, num_running=len(sch.running), num_waiting=len(sch.waiting),
            used_blocks=self.pool.num_used, filled_slots=self.pool.filled_slots(sch.sequences),
            preempted=len(batch.preempted), new_tokens=0, num_scores=scores))

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
