"""The one clock of the course: every chapter, benchmark and engine times with it.

A GPU runs asynchronously: a call returns once its kernels are queued, long before they finish,
so a wall clock read right after it measures the launch. Every reading here therefore waits for
the device first (``synchronize``), and a repeated measurement on CUDA uses CUDA events, the GPU's
own clock. The engine's timings (``time_prefill``, ``time_decode_step``) and the cost of launching
one op (``measure_op_overhead``) are built on the same two functions; ``op_counts`` and
``dispatched_op_counts`` count the ops a step launches instead of timing them.

A timing is only as good as the machine was quiet. Comparisons are therefore taken interleaved
(``interleaved``: A, B, A, B ...), so a busy moment hits both sides alike, and reported as a
``Spread``: the median of the rounds and the band they spread over. A ``Spread`` decides "A is
faster than B" only when the whole band is on one side (``above``, ``below``); otherwise it says
this run could not tell (``says``). ``Load`` measures how busy other programs kept the machine
while something ran, and ``rerun_if_off`` takes a measurement again when it disagrees with its
prediction by more than 3x.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .device import cpu_cores, cpu_times, get_device, others_busy, synchronize
from .kv_cache.contiguous import KVCache


def clock(device=None) -> float:
    """``time.perf_counter()`` once ``device`` has finished everything queued on it."""
    if device is not None:
        synchronize(device)
    return time.perf_counter()


def timed(fn, device=None, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds it took on device)``, queued work included."""
    t0 = clock(device)
    out = fn(*args, **kwargs)
    return out, clock(device) - t0


def ttft(arrival: float, first_token: float) -> float:
    """Time to first token (s): from a request's arrival to its first sampled token."""
    return first_token - arrival


def tpot(first_token: float, finish: float, num_tokens: int) -> float | None:
    """Time per output token after the first (s); None for fewer than two tokens (no gap to time)."""
    return (finish - first_token) / (num_tokens - 1) if num_tokens >= 2 else None


@contextmanager
def timer(device, out: list):
    """Append the elapsed seconds of the ``with`` block to ``out`` (synchronising the device)."""
    t0 = clock(device)
    yield
    out.append(clock(device) - t0)


def time_call(fn, device=None, budget_s: float = 0.5, min_reps: int = 2, max_reps: int = 100,
              warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn``, one per repetition, after ``warmup`` untimed calls.

    Repeats until ``budget_s`` is spent (at least ``min_reps`` times). CUDA calls are timed with
    CUDA events (the GPU's own clock, not the launch); other devices synchronise around a wall clock.
    Callers take the min (a ceiling: the best the machine did) or the median (typical).
    """
    if min_reps < 1 or max_reps < min_reps or warmup < 0 or budget_s < 0:
        raise ValueError("need 1 <= min_reps <= max_reps, warmup >= 0 and budget_s >= 0")
    device = torch.device(device) if device is not None else torch.device("cpu")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times, start = [], time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < budget_s):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            times.append(timed(fn, device)[1])
    return times


# --- honest comparisons ------------------------------------------------------------------------

COULD_NOT_TELL = "this run could not tell"


@dataclass(frozen=True)
class Spread:
    """One quantity measured in several rounds (a time, a ratio of two times, an exponent): its
    ``median`` and the band ``lo``..``hi`` the rounds spread over (all of them below 10 rounds, the
    10th to 90th percentile from 10 on, so one stalled round does not widen it for good)."""
    values: tuple

    def __post_init__(self):
        if not self.values:
            raise ValueError("a Spread needs at least one measured value")
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        v = sorted(self.values)
        return v[len(v) // 10] if len(v) >= 10 else v[0]

    @property
    def hi(self) -> float:
        v = sorted(self.values)
        return v[-1 - len(v) // 10] if len(v) >= 10 else v[-1]

    def above(self, x: float) -> bool | None:
        """True if the whole band is above ``x``, False if all of it is below, None if ``x`` lies
        inside it: the difference is no larger than the run's own spread (this run cannot tell)."""
        return True if self.lo > x else False if self.hi < x else None

    def below(self, x: float) -> bool | None:
        a = self.above(x)
        return None if a is None else not a

    def map(self, fn) -> "Spread":
        """The same rounds through ``fn`` (e.g. seconds -> tokens/s)."""
        return Spread(tuple(fn(v) for v in self.values))

    def __format__(self, spec: str) -> str:
        """``f"{s:.2f}"``: '1.30 (rounds 1.20–1.40)'; a trailing x marks ratios: ``f"{s:.2fx}"``:
        '1.30× (rounds 1.20–1.40×)'."""
        unit = "×" if spec.endswith("x") else ""
        spec = spec.removesuffix("x") or ".2f"
        return f"{self.median:{spec}}{unit} (rounds {self.lo:{spec}}–{self.hi:{spec}}{unit})"


def interleaved(runs: dict, rounds: int = 5, device=None, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each call in ``runs`` (name -> a call), ``rounds`` times, in turn: A, B, A, B ...
    A busy moment of the machine then lands on every candidate alike. One untimed call each first."""
    if rounds < 1 or warmup < 0 or not runs:
        raise ValueError("need at least one run, rounds >= 1 and warmup >= 0")
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(timed(fn, device)[1])
    return times


def ratio(a: list[float], b: list[float]) -> Spread:
    """``a ÷ b`` round by round, for two lists of interleaved timings (same length): the rounds'
    common slowdowns cancel in each ratio."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need two equally long, non-empty lists of rounds, got {len(a)} and {len(b)}")
    return Spread(tuple(x / y for x, y in zip(a, b)))


def ratio_of_stats(a: dict, b: dict) -> Spread:
    """``a ÷ b`` from two stored summaries of rounds (``{"median", "min", "max"}``, as the benchmarks
    keep them) when the rounds themselves are gone: the band runs from a's lowest over b's highest to
    the reverse, wider than the paired rounds' band, so a verdict it allows holds for those too."""
    return Spread((a["min"] / b["max"], a["median"] / b["median"], a["max"] / b["min"]))


def says(spread: Spread, threshold: float, above: str, below: str, unsure: str | None = None) -> str:
    """The sentence this run supports: ``above`` if the spread is clearly above ``threshold``,
    ``below`` if clearly below, otherwise ``unsure`` (default: that this run could not tell)."""
    verdict = spread.above(threshold)
    if verdict is None:
        return unsure if unsure is not None else f"{COULD_NOT_TELL} (the rounds spread over {spread.lo:.2f}–{spread.hi:.2f})"
    return above if verdict else below


class Load:
    """How busy other programs kept the CPU while the ``with`` block ran, in cores (``others``;
    None where the OS does not say). A measurement taken beside a busy program is slower and noisier
    than the same one on a quiet machine; a page says so next to it."""

    def __enter__(self):
        self._t0, self._start = time.perf_counter(), cpu_times()
        self.others = None
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        self.others = others_busy(self._start, cpu_times(), self.seconds)
        return False

    def __str__(self) -> str:
        if self.others is None:
            return "how busy the machine was is unknown here"
        return f"other programs kept {self.others:.1f} of {cpu_cores()} cores busy meanwhile"


def busy_during(runs: dict) -> str:
    """One phrase for how busy other programs kept the machine during several runs, a page's one
    statement of its noise: ``{"this run": load, "section 5's runs": [load, load]}`` ->
    'other programs kept 1.6 of 2 cores busy during this run and 1.7 during section 5's runs'. A list
    of ``Load`` s counts as one run, each weighted by its seconds."""
    if not runs:
        raise ValueError("need at least one run")
    said = []
    for name, loads in runs.items():
        loads = loads if isinstance(loads, (list, tuple)) else [loads]
        known = [(x.others, x.seconds) for x in loads if x.others is not None]
        if len(known) < len(loads) or not known:
            return "how busy other programs kept the machine is unknown here"
        seconds = sum(s for _, s in known)
        busy = sum(o * s for o, s in known) / seconds if seconds > 0 else known[0][0]
        said.append((name, busy))
    first, *rest = said
    return (f"other programs kept {first[1]:.1f} of {cpu_cores()} cores busy during {first[0]}"
            + "".join(f"{' and' if i == len(rest) - 1 else ','} {b:.1f} during {n}" for i, (n, b) in enumerate(rest)))


def rerun_if_off(measure, predicted: float, factor: float = 3.0, of=None, first=None):
    """``measure()``, and once more if its result is more than ``factor`` times off ``predicted``
    (either way): a measurement that far from its prediction is most often a noisy run (a stalled
    machine), not a wrong model. ``of`` picks the number to compare from what ``measure`` returns
    (default: the result itself); ``first`` is a result already measured, to check before measuring
    again. Returns ``(result, note)``: the result kept (the rerun's, if
    there was one) and a sentence for the page, empty when the first run agreed."""
    if not predicted > 0 or not factor > 1:
        raise ValueError(f"need predicted > 0 and factor > 1, got {predicted}, {factor}")
    of = of or (lambda r: r)

    def off(r):
        return not (predicted / factor <= of(r) <= predicted * factor)

    first = measure() if first is None else first
    if not off(first):
        return first, ""
    second = measure()
    note = (f"Noisy run: the first measurement came out at {of(first) / predicted:.2f}× its prediction, more "
            f"than {factor:g}× off, so it was taken again: {of(second) / predicted:.2f}×"
            + ("." if not off(second) else ", still off: read this figure as this machine's noise."))
    return second, note


# --- what a step costs in ops -----------------------------------------------------------------

def measure_op_overhead(device=None, ops: int = 200, budget_s: float = 0.3) -> float:
    """Seconds that one op costs when it has (almost) no data to move: Python, the dispatcher and,
    on a GPU, the kernel launch. A decode step of a small model is hundreds of such ops."""
    device = get_device(device)
    if ops < 1:
        raise ValueError(f"ops must be >= 1, got {ops}")
    x, out = torch.zeros(1, device=device), torch.zeros(1, device=device)

    def burst():
        for _ in range(ops):
            torch.add(x, 1, out=out)

    return min(time_call(burst, device, budget_s)) / ops


def op_counts(fn) -> dict[str, int]:
    """How many times ``fn()`` calls each top-level torch op (the ones Python calls; ops they call
    internally are not counted again), from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.cpu_parent is None and event.name.startswith("aten::"):
            counts[event.name] = counts.get(event.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def dispatched_op_counts(fn) -> dict[str, int]:
    """How many times ``fn()`` dispatches each aten op kernel, counting every op that runs: the
    ones other ops call inside (``matmul`` runs as ``mm`` or ``dot``) as well as the top-level ones
    ``op_counts`` sees. Exact and free of the profiler's own overhead, so it can count one step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict[str, int] = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = f"aten::{func.overloadpacket.__name__}"
            counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# --- timing the engine ------------------------------------------------------------------------

def prefill_fn(model, prompt_len: int, batch: int = 1):
    """A call that runs a ``prompt_len``-token prompt through ``model`` into a fresh KV cache (the
    time to first token, minus a negligible argmax), to time alone or in turns with others
    (``interleaved``). Random token ids: cost does not depend on them."""
    if prompt_len < 1 or batch < 1:
        raise ValueError(f"need prompt_len >= 1 and batch >= 1, got {prompt_len}, {batch}")
    cache = KVCache.for_model(model, batch, prompt_len)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=model.device)

    @torch.inference_mode()
    def run():
        cache.reset()
        model(ids, cache=cache, last_only=True)

    return run


def time_prefill(model, prompt_len: int, batch: int = 1, budget_s: float = 0.5, min_reps: int = 2,
                 warmup: int = 1) -> list[float]:
    """Seconds to run a ``prompt_len``-token prompt through ``model`` into a fresh KV cache
    (``prefill_fn``'s call)."""
    return time_call(prefill_fn(model, prompt_len, batch), model.device, budget_s, min_reps=min_reps, warmup=warmup)


def decode_step_fn(model, context: int, batch: int = 1, kv_dtype: torch.dtype | None = None):
    """A function that runs one decode step (one new token per sequence) with ``context`` tokens
    already in the cache (kept in ``kv_dtype``, default the model's), the same work at every call.

    The cache is filled with ``context`` tokens of zero keys and values instead of running a
    prefill: a step's cost depends on how many keys and values it reads, not on what they are,
    and appending them makes an 8k-token context cost a memory write instead of an 8k-token
    forward. Every call crops the cache back to ``context`` first.
    """
    if context < 0 or batch < 1:
        raise ValueError(f"need context >= 0 and batch >= 1, got {context}, {batch}")
    cache = KVCache.for_model(model, batch, context + 1, kv_dtype)
    cfg = model.config
    for start in range(0, context, 1024):  # in slices: one [layers, ..., context, ...] zero tensor doubles the memory
        n = min(1024, context - start)
        zeros = torch.zeros(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, n, cfg.head_dim,
                            dtype=cache.dtype, device=cache.device)
        cache.append(zeros, zeros)
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=model.device)

    @torch.inference_mode()
    def run():
        cache.crop(context)
        return model(ids, cache=cache, last_only=True)

    return run


def time_decode_step(model, context: int, batch: int = 1, budget_s: float = 0.5, min_reps: int = 3,
                     warmup: int = 1) -> list[float]:
    """Seconds per decode step (one new token per sequence) when the cache already holds
    ``context`` tokens (``decode_step_fn``'s step)."""
    return time_call(decode_step_fn(model, context, batch), model.device, budget_s, min_reps=min_reps, warmup=warmup)
