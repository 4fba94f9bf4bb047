"""Serving under load: Poisson arrivals, a step-cost model, and latency percentiles.

A server is judged by what each request sees at a given arrival rate: the time to its first
token (TTFT), the time per output token after that (TPOT), and its end-to-end latency per
output token (the vLLM paper's "normalized latency"), at the median and at the 99th percentile.

Measuring that on the model at every rate costs minutes per rate. But the schedule depends only
on token counts and arrival times (trace.py), and the time of a step depends, to a good
approximation, only on what it computes. So:

- ``StepCost`` is a linear model of a step's wall time in what the step computes: its tokens,
  its sequences (each gets an LM-head row and a sample), and its attention scores (each token
  against the key slots it is masked over). ``StepCost.fit`` calibrates it by least squares on
  steps measured on the model (``LLMEngine.stats``).
- ``simulate`` runs a trace with arrival times through a scheduler on a virtual clock that
  advances by the cost model at each step, with stand-in tokens (trace.replay's).
- ``serve`` runs the same trace on the real engine in real time, to check the simulator.
- ``summarize`` turns per-request times into the percentiles and the throughput.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from .. import timing
from ..engine.llm_engine import step_features
from ..engine.scheduler import Scheduler
from ..engine.sequence import Sequence
from ..params import SamplingParams
from .trace import STAND_IN_EOS, TraceRequest, stand_in_tokens


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times (seconds) of a Poisson process of ``rate`` requests per second."""
    if n < 1 or not rate > 0:
        raise ValueError(f"need n >= 1 and rate > 0, got {n}, {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)  # exponential gaps: memoryless, independent clients
        out.append(t)
    return out


@dataclass(frozen=True)
class StepCost:
    """Seconds per step = base + per_token * tokens + per_seq * sequences + per_score * scores."""
    base: float
    per_token: float
    per_seq: float
    per_score: float

    def __call__(self, tokens: int, seqs: int, scores: int) -> float:
        return self.base + self.per_token * tokens + self.per_seq * seqs + self.per_score * scores

    @classmethod
    def fit(cls, features, seconds) -> "StepCost":
        """Least squares over measured steps, in relative error (a 20 ms step missed by 10 ms
        delays its requests as much, in proportion, as a 200 ms step missed by 100 ms), each
        coefficient kept >= 0 (a cost cannot be negative; a coefficient the data cannot pin down
        is left at 0 rather than made up)."""
        X = np.column_stack([np.ones(len(features)), np.asarray(features, dtype=float)])
        y = np.asarray(seconds, dtype=float)
        if len(y) < 4 or X.shape[1] != 4:
            raise ValueError(f"need >= 4 steps of (tokens, seqs, scores), got {X.shape}")
        if not (y > 0).all():
            raise ValueError("every measured step must take a positive time")
        X, y = X / y[:, None], np.ones_like(y)  # each row's residual relative to its own time
        keep = list(range(4))
        while True:  # drop a negative coefficient and refit: a small active-set nonnegative LSQ
            coef = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
            if (coef >= 0).all():
                break
            keep.pop(int(np.argmin(coef)))
        full = np.zeros(4)
        full[keep] = coef
        return cls(*map(float, full))


@dataclass
class Timed:
    """One request's times (seconds on the run's clock) and output length."""
    arrival: float
    first_token: float
    finish: float
    output_tokens: int

    @property
    def ttft(self) -> float:
        return timing.ttft(self.arrival, self.first_token)

    @property
    def tpot(self) -> float:
        return timing.tpot(self.first_token, self.finish, self.output_tokens) or 0.0  # one token: no gap

    @property
    def normalized(self) -> float:
        return (self.finish - self.arrival) / self.output_tokens


def simulate(scheduler: Scheduler, trace: list[TraceRequest], arrivals: list[float], cost: StepCost,
             seed: int = 0) -> list[Timed]:
    """Run ``trace`` (request i arriving at ``arrivals[i]``) through ``scheduler`` on a virtual
    clock: each step takes ``cost(step_features(...))`` seconds. Stand-in tokens (trace.py)."""
    if len(arrivals) != len(trace) or any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError("need one arrival time per request, in order")
    rng = random.Random(seed)
    bs = scheduler.pool.block_size
    seqs = [Sequence(rng.choices(range(3, 50000), k=r.prompt_len),
                     SamplingParams(temperature=0, max_tokens=r.max_new_tokens, stop_token_ids=(STAND_IN_EOS,),
                                    ignore_eos=True), bs)
            for r in trace]
    targets = {s.id: r.output_len for s, r in zip(seqs, trace)}
    clock, nxt = 0.0, 0
    while nxt < len(seqs) or scheduler.has_unfinished():
        while nxt < len(seqs) and arrivals[nxt] <= clock:
            seqs[nxt].arrival_time = arrivals[nxt]
            scheduler.add(seqs[nxt])
            nxt += 1
        if not scheduler.has_unfinished():
            clock = arrivals[nxt]  # idle until the next request
            continue
        batch = scheduler.schedule()
        if not batch.seqs:
            raise RuntimeError("nothing can run: a waiting request needs more blocks than are free")
        clock += cost(*step_features(batch.seqs, batch.num_tokens, bs))
        scheduler.postprocess(batch.seqs, stand_in_tokens(batch, targets, rng), batch.num_tokens, now=clock)
    return [Timed(s.arrival_time, s.first_token_time, s.finish_time, len(s.output_ids)) for s in seqs]


def serve(engine, prompts, trace: list[TraceRequest], arrivals: list[float]) -> list[Timed]:
    """The same on the real engine, in real time: request i is added at the first step boundary
    after ``arrivals[i]`` seconds (its clock starts at its arrival, not when it was added)."""
    if not len(prompts) == len(trace) == len(arrivals):
        raise ValueError("need one prompt and one arrival time per request")
    t0 = engine.t0 = timing.clock()
    reqs, nxt = [], 0
    while nxt < len(prompts) or engine.has_unfinished():
        now = timing.clock() - t0
        while nxt < len(prompts) and arrivals[nxt] <= now:
            r = trace[nxt]
            params = SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)
            req = engine.add_request(prompts[nxt], params)
            req.arrival_time = req.seqs[0].arrival_time = t0 + arrivals[nxt]
            reqs.append(req)
            nxt += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, arrivals[nxt] - now))
            continue
        engine.step()
    if any(r.error for r in reqs):
        raise RuntimeError(f"a request failed: {next(r.error for r in reqs if r.error)}")
    return [Timed(r.arrival_time - t0, r.seqs[0].first_token_time - t0, r.finish_time - t0,
                  len(r.outputs[0])) for r in reqs]


def summarize(timed: list[Timed]) -> dict:
    """p50 and p99 of TTFT, TPOT and normalized latency (seconds), and output tokens per second
    from the first arrival to the last finish."""
    out = {}
    for name in ("ttft", "tpot", "normalized"):
        xs = np.array([getattr(t, name) for t in timed])
        out[f"{name}_p50"], out[f"{name}_p99"] = float(np.percentile(xs, 50)), float(np.percentile(xs, 99))
    span = max(t.finish for t in timed) - min(t.arrival for t in timed)
    out["throughput"] = sum(t.output_tokens for t in timed) / span
    return out
