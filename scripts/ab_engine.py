"""A/B of the door before and after "one engine, one runtime": the same requests through ``LLM`` at
``--rev`` (one door over three runtimes) and through today's ``LLM`` (one engine), in one process,
rounds alternating, so a change in the machine's load hits both sides alike.

    .venv/bin/python -m scripts.ab_engine [--rev 762c1d2] [--rounds 8] [--new-tokens 128] [--out PATH]

Two comparisons, each with the tokens checked equal before anything is timed:
- batch-1 decode on the fast path, ``LLM(quantization="q4_1", compile=True)``: one greedy request of
  ``--new-tokens`` tokens; decode tok/s from its own metrics (1 / TPOT), and the whole call's wall time;
- continuous batching, ``LLM()`` (optimized fp32, eager): ``--batch`` greedy requests at once,
  generated tokens over the call's wall time.
Writes medians, ranges and per-round ratios (now / before) to ``--out`` (JSON) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.common, scripts.ab_decode, when run as a file

from benchmarks.common import machine_info, stats  # noqa: E402
from scripts.ab_decode import old_package  # noqa: E402

PROMPT = "The history of the printing press begins"
BATCH_PROMPTS = ["Why is the sky blue?", "Name three prime numbers.", "What is a KV cache?",
                 "Write a haiku about tea.", "How do magnets work?", "What is 12 times 12?",
                 "Describe a cat in one sentence.", "What is the capital of Peru?"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="762c1d2", help="the commit whose LLM is the baseline")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batch-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ab-engine.json")
    a = p.parse_args(argv)

    import torch

    from inference_internals import LLM, SamplingParams
    from inference_internals.optimize import blockdot

    result = {"machine": machine_info(torch.device("cpu")), "baseline": a.rev, "rounds": a.rounds}
    with tempfile.TemporaryDirectory() as tmp:
        old = old_package(a.rev, Path(tmp))
        old_blockdot = sys.modules.get("ii_old.blockdot") or __import__("ii_old.blockdot", fromlist=["_load"])
        old_blockdot._load = blockdot._load  # one build of the same kernels: their ops register once
        doors = {}
        t0 = time.perf_counter()
        doors["before"] = old.LLM(quantization="q4_1", compile=True)
        doors["now"] = LLM(quantization="q4_1", compile=True)
        greedy = SamplingParams(temperature=0, max_tokens=a.new_tokens, ignore_eos=True)
        old_greedy = old.SamplingParams(temperature=0, max_tokens=a.new_tokens, ignore_eos=True)
        params = {"before": old_greedy, "now": greedy}
        tokens = {k: d.generate(PROMPT, params[k])[0].outputs[0].token_ids for k, d in doors.items()}  # compiles
        result["compile_and_warm_s"] = time.perf_counter() - t0
        result["decode_tokens_identical"] = tokens["before"] == tokens["now"]
        if not result["decode_tokens_identical"]:
            raise SystemExit(f"the two doors' tokens differ: {tokens}")
        decode = {k: [] for k in doors}
        wall = {k: [] for k in doors}
        for r in range(a.rounds):
            for k in (("before", "now") if r % 2 == 0 else ("now", "before")):
                t = time.perf_counter()
                out = doors[k].generate(PROMPT, params[k])[0]
                wall[k].append(time.perf_counter() - t)
                decode[k].append(1 / out.metrics.tpot)
        result["decode"] = {"tok_s": {k: stats(v) for k, v in decode.items()},
                            "wall_s": {k: stats(v) for k, v in wall.items()},
                            "now_over_before_per_round": [n / b for n, b in zip(decode["now"], decode["before"])]}
        del doors

        prompts = (BATCH_PROMPTS * (a.batch // len(BATCH_PROMPTS) + 1))[:a.batch]
        doors = {"before": old.LLM(), "now": LLM()}
        bp = {"now": SamplingParams(temperature=0, max_tokens=a.batch_tokens, ignore_eos=True),
              "before": old.SamplingParams(temperature=0, max_tokens=a.batch_tokens, ignore_eos=True)}
        outs = {k: [o.outputs[0].token_ids for o in d.generate(prompts, bp[k])] for k, d in doors.items()}
        result["batch_tokens_identical"] = outs["before"] == outs["now"]
        if not result["batch_tokens_identical"]:
            raise SystemExit("the two doors' batched tokens differ")
        rate = {k: [] for k in doors}
        for r in range(a.rounds):
            for k in (("before", "now") if r % 2 == 0 else ("now", "before")):
                t = time.perf_counter()
                outs = doors[k].generate(prompts, bp[k])
                rate[k].append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t))
        result["batching"] = {"requests": a.batch, "tokens_each": a.batch_tokens,
                              "tok_s": {k: stats(v) for k, v in rate.items()},
                              "now_over_before_per_round": [n / b for n, b in zip(rate["now"], rate["before"])]}
        del old
    for part in ("decode", "batching"):
        r = result[part]["now_over_before_per_round"]
        result[part]["now_over_before"] = {"median": statistics.median(r), "min": min(r), "max": max(r),
                                           "faster_rounds": sum(x > 1 for x in r), "rounds": len(r)}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    for part in ("decode", "batching"):
        s, ratio = result[part]["tok_s"], result[part]["now_over_before"]
        print(f"{part:9} before {s['before']['median']:7.1f} tok/s ({s['before']['min']:.1f}-{s['before']['max']:.1f})"
              f"  now {s['now']['median']:7.1f} ({s['now']['min']:.1f}-{s['now']['max']:.1f})"
              f"  now/before {ratio['median']:.3f}x ({ratio['min']:.2f}-{ratio['max']:.2f}, "
              f"faster in {ratio['faster_rounds']} of {ratio['rounds']})")
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
