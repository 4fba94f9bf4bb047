"""Continuous vs static batching through the paged engine, at equal KV memory, on the plain and on
the optimized model."""
from __future__ import annotations

import statistics

import torch

from inference_internals.timing import clock

from .common import PLAIN, load_engines


def bench_batching(args, device) -> dict:
    """Every engine packs each step into one row (``LLMEngine(packed=True)``): static batching
    prefills its batch in one forward, continuous batching also mixes new prompts into the
    decode step. Continuous runs at each ``--watermark`` (blocks kept free at admission, so
    running sequences can grow without preempting); the unpacked engine (one forward per
    prompt, prefill and decode in separate steps) is measured too, to show what packing buys.
    Each model (plain, optimized) gets the same trace; ``models`` holds one result per model.
    """
    from inference_internals.paged.trace import make_trace

    engines = load_engines(device)
    trace = make_trace(args.requests, prompt_range=(8, 48), output_range=(4, 64), seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40000, (r.prompt_len,), generator=g).tolist() for r in trace]
    out = {"models": {k: _batching(args, device, m, trace, prompts) for k, m in engines.items()}}
    out["token_identical_across_models"] = len({str(r.pop("outputs")) for r in out["models"].values()}) == 1
    out["chunked_prefill"] = _chunked_under_load(args, device, engines[PLAIN])
    return out


def _chunked_under_load(args, device, model) -> dict:
    """Chunked against whole-prompt prefill (both continuous, packed) on Poisson arrivals at one
    rate, 60% of what the unchunked engine serves when every request waits at once: throughput
    and TPOT p99 (and TTFT, which chunking trades for it), on the real model in real time."""
    from inference_internals.paged import load
    from inference_internals.paged.engine import LLMEngine
    from inference_internals.paged.sequence import SamplingParams
    from inference_internals.paged.trace import make_trace

    n, budget, seqs = args.requests, args.chunk_budget, 16
    trace = make_trace(n, prompt_range=(16, 256), output_range=(8, 48), seed=1)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 40000, (r.prompt_len,), generator=g).tolist() for r in trace]
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in trace]

    def engine(chunked):
        kw = {"enable_chunked_prefill": True, "max_num_batched_tokens": budget} if chunked else {}
        return LLMEngine(model, num_blocks=seqs * 20 + 16, block_size=16, max_num_seqs=seqs, packed=True,
                         enable_prefix_caching=False, **kw)

    engine(False).generate(prompts[:2], params[:2])  # warm-up
    t0 = clock(device)
    whole = engine(False).generate(prompts, params)
    capacity = n / (clock(device) - t0)
    assert engine(True).generate(prompts, params) == whole  # chunks change no token (greedy)
    rate = 0.6 * capacity
    arrivals = load.poisson_arrivals(n, rate, seed=0)
    out = {"setup": {"requests": n, "rate_req_s": rate, "offline_capacity_req_s": capacity, "budget": budget,
                     "max_num_seqs": seqs, "prompt_range": [16, 256], "output_range": [8, 48]},
           "token_identical": True}
    for name, chunked in (("whole", False), ("chunked", True)):
        out[name] = load.summarize(load.serve(engine(chunked), prompts, trace, arrivals))
    out["tpot_p99_chunked_over_whole"] = out["chunked"]["tpot_p99"] / out["whole"]["tpot_p99"]
    out["throughput_chunked_over_whole"] = out["chunked"]["throughput"] / out["whole"]["throughput"]
    return out


def _batching(args, device, model, trace, prompts) -> dict:
    from inference_internals.paged.engine import LLMEngine
    from inference_internals.paged.sequence import SamplingParams

    cap = trace[0].max_new_tokens
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in trace]
    block, num_blocks = 16, args.kv_blocks
    configs = {"static": {"static_reserve_tokens": 48 + cap, "packed": True},
               "continuous, unpacked, watermark 0.01": {"watermark": 0.01}}
    configs |= {f"continuous, watermark {w:g}": {"packed": True, "watermark": w} for w in args.watermark}
    runs = {k: [] for k in configs}
    LLMEngine(model, num_blocks=num_blocks, block_size=block).generate(prompts[:4], params[:4])  # warm-up
    reference = None
    for rep in range(args.batching_reps):  # alternate the order: drift in load hits every config alike
        for kind in (list(configs) if rep % 2 == 0 else list(configs)[::-1]):
            eng = LLMEngine(model, num_blocks=num_blocks, block_size=block, **configs[kind])
            t0 = clock(device)
            outs = eng.generate(prompts, params)
            dt = clock(device) - t0
            reference = reference or outs
            n = sum(len(o) for o in outs)
            runs[kind].append({
                "seconds": dt, "output_tokens": n, "tok_s": n / dt, "steps": len(eng.stats),
                "token_identical": outs == reference, "preemptions": eng.scheduler.num_preemptions,
                "prefill_tokens": sum(s.num_tokens - s.num_decode for s in eng.stats),
                "mean_batch": statistics.mean(s.batch_size for s in eng.stats if s.kind != "prefill"),
                "steps_by_kind": {k: sum(s.kind == k for s in eng.stats) for k in ("prefill", "decode", "mixed")}})
    out = {"configs": {}}
    static = runs.pop("static")
    for kind, rs in runs.items():
        best = sorted(rs, key=lambda x: x["tok_s"])[len(rs) // 2]  # the median run
        ratios = [c["tok_s"] / s["tok_s"] for c, s in zip(rs, static)]
        # what one of its steps costs against a static one, per rep: the spread the page compares with
        step_cost = [(c["seconds"] / c["steps"]) / (s["seconds"] / s["steps"]) for c, s in zip(rs, static)]
        out["configs"][kind] = best | {"tok_s_all": [x["tok_s"] for x in rs], "ratio_per_rep": ratios,
                                       "ratio_over_static": statistics.median(ratios),
                                       "step_cost_over_static_per_rep": step_cost}
    out["static"] = sorted(static, key=lambda x: x["tok_s"])[len(static) // 2] | {
        "tok_s_all": [x["tok_s"] for x in static]}
    out["best"] = max(out["configs"], key=lambda k: out["configs"][k]["ratio_over_static"])
    out["continuous"] = out["configs"][out["best"]]
    out["ratio_continuous_over_static"] = out["continuous"]["ratio_over_static"]
    out["token_identical"] = all(x["token_identical"] for rs in [static, *runs.values()] for x in rs)
    out["setup"] = {"requests": args.requests, "kv_blocks": num_blocks, "block_size": block,
                    "static_reserve_tokens": 48 + cap, "prompt_range": [8, 48], "output_range": [4, 64],
                    "watermarks": args.watermark, "reps": args.batching_reps}
    out["outputs"] = reference
    return out
