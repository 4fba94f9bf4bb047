"""A live look at llama.cpp beside our engine, when ``llama-cpp-python`` is installed (``make bench-peers``).

Both decode the same prompt greedily at batch 1, in turns (ours, llama.cpp, ours, ...), so a busy
moment of the machine hits both; each round's rate is first token to last. llama.cpp reads the
model's own GGUF (``weights.gguf_path()``), the file our Q4_1 engine takes its blocks from.
"""
from __future__ import annotations

import subprocess
import sys
import time

import torch

from inference_internals import timing

# A prefill through every weight, in a child process: on some AMX CPUs llama.cpp 0.3.36 crashes in its
# AMX matrix multiply (llama.cpp issue #20824), which in this process would kill the notebook's kernel
_PROBE = "import sys, llama_cpp; m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=False); m.eval([1] * 32)"


def crashes_with_extra_buffers(model_path) -> bool:
    """Whether llama.cpp, with its default extra buffer types (AMX, repacking), dies of a signal on a prefill here."""
    try:
        probe = subprocess.run([sys.executable, "-c", _PROBE, str(model_path)], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode < 0


def llama_cpp_runner(n_threads: int | None = None, n_ctx: int = 512):
    """A call ``(prompt ids, n) -> token timestamps`` decoding with llama.cpp, or None when
    ``llama_cpp`` is not importable here. Where its extra buffer types crash (``crashes_with_extra_buffers``),
    it runs without them (``use_extra_bufts = False``: its AVX-512/AVX2 kernels), and ``run.note`` says so."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as low_level
    except ImportError:
        return None
    from inference_internals.weights import gguf_path

    note = ""
    defaults = low_level.llama_model_default_params
    if crashes_with_extra_buffers(gguf_path()):
        def without_extra_buffers():  # Llama() takes no such argument: its model parameters start from these
            params = defaults()
            params.use_extra_bufts = False
            return params
        low_level.llama_model_default_params = without_extra_buffers
        note = "llama.cpp ran without its AMX buffers, which crashed on this CPU (llama.cpp issue #20824)"
    try:
        llm = llama_cpp.Llama(model_path=str(gguf_path()), n_ctx=n_ctx, verbose=False,
                              n_threads=n_threads or torch.get_num_threads())
    finally:
        low_level.llama_model_default_params = defaults

    def run(prompt, n):
        stamps = []
        llm.reset()
        for _ in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == n:
                break
        return stamps
    run.note = note
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
