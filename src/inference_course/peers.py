"""A live look at llama.cpp beside our engine, when ``llama-cpp-python`` is installed (``make bench-peers``).

Both decode the same prompt greedily at batch 1, in turns (ours, llama.cpp, ours, ...), so a busy
moment of the machine hits both; each round's rate is first token to last. llama.cpp reads the
model's own GGUF (``weights.gguf_path()``), the file our Q4_1 engine takes its blocks from.
"""
from __future__ import annotations

import time

import torch

from inference_internals import timing


def llama_cpp_runner(n_threads: int | None = None, n_ctx: int = 512):
    """A call ``(prompt ids, n) -> token timestamps`` decoding with llama.cpp, or None when
    ``llama_cpp`` is not importable here."""
    try:
        import llama_cpp
    except ImportError:
        return None
    from inference_internals.weights import gguf_path

    llm = llama_cpp.Llama(model_path=str(gguf_path()), n_ctx=n_ctx, verbose=False,
                          n_threads=n_threads or torch.get_num_threads())

    def run(prompt, n):
        stamps = []
        llm.reset()
        for _ in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == n:
                break
        return stamps
    return run


def ours_runner(model):
    """The same call for one of our models: ``generate_stream``, each id read back as it comes."""
    from inference_internals.generate import generate_stream

    def run(prompt, n):
        return [timing.clock(model.device) for _ in generate_stream(model, prompt, n, stop_ids=[])]
    return run


def rates(runners: dict, prompt: list[int], n: int = 16, rounds: int = 3) -> dict[str, list[float]]:
    """Tokens/s of each runner per round (first token to last), the runners taken in turns; one
    untimed run each first."""
    if n < 2 or rounds < 1:
        raise ValueError(f"need n >= 2 tokens and rounds >= 1, got {n}, {rounds}")
    for run in runners.values():
        run(prompt, 2)
    out = {k: [] for k in runners}
    for _ in range(rounds):
        for k, run in runners.items():
            s = run(prompt, n)
            if len(s) < n:
                raise RuntimeError(f"{k} stopped after {len(s)} of {n} tokens")
            out[k].append((n - 1) / (s[-1] - s[0]))
    return out
