"""The one clock of the course: every chapter, benchmark and engine times with it.

A GPU runs asynchronously: a call returns once its kernels are queued, long before they finish,
so a wall clock read right after it measures the launch. Every reading here therefore waits for
the device first (``synchronize``), and a repeated measurement on CUDA uses CUDA events, the GPU's
own clock. The engine's timings (``time_prefill``, ``time_decode_step``) and the cost of launching
one op (``measure_op_overhead``) are built on the same two functions; ``op_counts`` and
``dispatched_op_counts`` count the ops a step launches instead of timing them.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from .device import get_device, synchronize
from .kv_cache import KVCache


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

def time_prefill(model, prompt_len: int, batch: int = 1, budget_s: float = 0.5, min_reps: int = 2,
                 warmup: int = 1) -> list[float]:
    """Seconds to run a ``prompt_len``-token prompt through ``model`` into a fresh KV cache (the
    time to first token, minus a negligible argmax). Random token ids: cost does not depend on them."""
    if prompt_len < 1 or batch < 1:
        raise ValueError(f"need prompt_len >= 1 and batch >= 1, got {prompt_len}, {batch}")
    cache = KVCache.for_model(model, batch, prompt_len)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=model.device)

    @torch.inference_mode()
    def run():
        cache.reset()
        model(ids, cache=cache, last_only=True)

    return time_call(run, model.device, budget_s, min_reps=min_reps, warmup=warmup)


def decode_step_fn(model, context: int, batch: int = 1):
    """A function that runs one decode step (one new token per sequence) with ``context`` tokens
    already in the cache, the same work at every call.

    The cache is filled with ``context`` tokens of zero keys and values instead of running a
    prefill: a step's cost depends on how many keys and values it reads, not on what they are,
    and appending them makes an 8k-token context cost a memory write instead of an 8k-token
    forward. Every call crops the cache back to ``context`` first.
    """
    if context < 0 or batch < 1:
        raise ValueError(f"need context >= 0 and batch >= 1, got {context}, {batch}")
    cache = KVCache.for_model(model, batch, context + 1)
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
