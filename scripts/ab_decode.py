"""A/B of batch-1 decode: today's model (``Llama.optimize``) against the runner it replaced.

Until commit 4303cfb the fast path was a second implementation, ``fast.FastLlama``. Issue 19 asked
that the one model stay at least as fast, fp32 and bf16, measured in one interleaved run. This
script extracts the library as it was at ``--rev`` (``git archive``) under another package name,
so both versions load in one process, and alternates them round by round: a change in the
machine's load hits both sides alike.

    .venv/bin/python -m scripts.ab_decode [--rev d8ef801] [--reps 7] [--new-tokens 64] [--out PATH]

Writes the medians and the per-round ratios to ``--out`` (JSON) and prints a table.
"""
from __future__ import annotations

import argparse
import collections
import gc
import importlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common, when run as a file

from benchmarks.common import machine_info, stats  # noqa: E402
from benchmarks.decode import decode_rates  # noqa: E402
from inference_internals.timing import clock, dispatched_op_counts, timed  # noqa: E402


def old_package(rev: str, into: Path):
    """The library at ``rev``, importable as ``ii_old`` (its imports inside are relative)."""
    tar = subprocess.run(["git", "archive", rev, "src/inference_internals"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    (into / "src" / "inference_internals").rename(into / "ii_old")
    sys.path.insert(0, str(into))
    return importlib.import_module("ii_old")


def step_work(stream, prompt) -> dict:
    """What one decode step of ``stream`` costs the CPU, counted rather than timed (so the machine's
    load cannot move it): the Python bytecodes run and the aten ops dispatched between two tokens."""
    bytecodes = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            bytecodes[frame.f_code.co_filename.rsplit("/", 2)[-2]] += 1  # by package folder
        return trace

    steps = stream(prompt, 8)
    next(steps), next(steps)  # the prefill, then one decode step to warm up
    # A garbage collection inside the counted step would run other objects' clean-up code there
    # (an earlier stream's generator closing, say): counted as this step's, and only on some runs.
    gc.collect()
    gc.disable()
    sys.settrace(trace)
    try:
        next(steps)
    finally:
        sys.settrace(None)
        gc.enable()
    ops = dispatched_op_counts(lambda: next(steps))
    return {"python_bytecodes": sum(bytecodes.values()), "aten_ops": sum(ops.values()),
            "bytecodes_in_torch_nn": bytecodes["nn"] + bytecodes["modules"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="d8ef801", help="the commit whose fast.FastLlama is the baseline")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ab-decode.json")
    a = p.parse_args(argv)

    from inference_internals.bpe import BPETokenizer
    from inference_internals.generate import generate, generate_stream
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize

    device = torch.device("cpu")  # FastLlama's timings were CPU timings; compare like with like
    with tempfile.TemporaryDirectory() as tmp:
        old = old_package(a.rev, Path(tmp))
        from ii_old.fast import FastLlama
        from ii_old.model import Llama as OldLlama

        prompt = BPETokenizer.from_pretrained().encode("The history of the printing press begins")
        max_len = len(prompt) + a.new_tokens + 8
        result = {"machine": machine_info(device), "baseline": f"{a.rev} fast.FastLlama",
                  "new_tokens": a.new_tokens, "reps": a.reps, "dtypes": {}}
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            old_model = OldLlama.from_pretrained(dtype=dtype)
            fast = FastLlama(old_model, kernel="auto", max_len=max_len)
            now = optimize(Llama.from_pretrained(dtype=dtype), kernel="auto")
            # each runner streams the new tokens of (prompt, n), with no stop token
            streams = {"FastLlama (before)": lambda p, n, f=fast: f.generate_stream(p, n, stop_ids=[]),
                       "Llama.optimize() (now)": lambda p, n, m=now: generate_stream(m, p, n, stop_ids=[])}
            info = {}
            if not a.no_compile:
                def compile_before():  # the first one-token step compiles the graph: timed, not measured
                    f = FastLlama(old_model, kernel="auto", max_len=max_len, compile=True)
                    f.generate(prompt, 3, stop_ids=[])
                    return f

                def compile_now():
                    m = optimize(Llama.from_pretrained(dtype=dtype), kernel="auto", compile=True)
                    generate(m, prompt, 3, stop_ids=[])
                    return m

                fast_c, info["compile_s_before"] = timed(compile_before)
                new_c, info["compile_s_now"] = timed(compile_now)
                streams["FastLlama compiled (before)"] = lambda p, n, f=fast_c: f.generate_stream(p, n, stop_ids=[])
                streams["Llama.optimize(compile=True) (now)"] = (
                    lambda p, n, m=new_c: generate_stream(m, p, n, stop_ids=[]))
            work = {k: step_work(streams[k], prompt) for k in ("FastLlama (before)", "Llama.optimize() (now)")}
            # the same tokens, or the A/B compares different work
            ref = [int(t) for t in next(iter(streams.values()))(prompt, 16)]
            same = {k: [int(t) for t in s(prompt, 16)] == ref for k, s in streams.items()}
            rates = decode_rates({k: lambda p, n, s=s: [clock(device) for _ in s(p, n)] for k, s in streams.items()},
                                 prompt, a.new_tokens, a.reps)
            pairs = [("FastLlama (before)", "Llama.optimize() (now)")]
            if not a.no_compile:
                pairs.append(("FastLlama compiled (before)", "Llama.optimize(compile=True) (now)"))
            result["dtypes"][name] = info | {
                "same_16_tokens": same,
                "eager_step_work": work,
                "tok_s": {k: stats(v) for k, v in rates.items()},
                # per round, now ÷ before: both measured back to back
                "now_over_before": {f"{n} / {b}": statistics.median(x / y for x, y in zip(rates[n], rates[b]))
                                    for b, n in pairs}}
            del old_model, streams
        del old
    result["machine"]["load_avg_end"] = __import__("os").getloadavg()
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, d in result["dtypes"].items():
        for k, s in d["tok_s"].items():
            print(f"{name:9} {k:38} {s['median']:7.1f} tok/s  (min {s['min']:.1f}, max {s['max']:.1f})")
        for k, r in d["now_over_before"].items():
            print(f"{name:9} {k}: {r:.3f}x")
    print(f"load {result['machine']['load_avg_start'][0]:.1f} -> {result['machine']['load_avg_end'][0]:.1f}; "
          f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
