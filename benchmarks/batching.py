"""Continuous vs static batching through the paged engine, at equal KV memory, on the plain and on
the optimized model; and the paged engine against transformers' own continuous batching."""
from __future__ import annotations

import os
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
    from inference_internals.analysis.trace import make_trace

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
    from inference_internals.analysis import load
    from inference_internals.engine.llm_engine import LLMEngine
    from inference_internals.params import SamplingParams
    from inference_internals.analysis.trace import make_trace

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
    whole = [o.outputs[0].token_ids for o in engine(False).generate(prompts, params)]
    capacity = n / (clock(device) - t0)
    assert [o.outputs[0].token_ids for o in engine(True).generate(prompts, params)] == whole  # chunks change no token (greedy)
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
    from inference_internals.engine.llm_engine import LLMEngine
    from inference_internals.params import SamplingParams

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
            outs = [o.outputs[0].token_ids for o in eng.generate(prompts, params)]
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


HF_BATCH = "Hugging Face generate_batch"


def bench_batching_hf(args, device) -> dict:
    """Our paged engine against transformers' own continuous-batching engine (``generate_batch``) on
    one trace: real-text prompts of mixed lengths, greedy, fp32, every request exactly
    ``--hf-batch-tokens`` tokens (EOS ignored on both sides), the same pool of 16-token blocks and the
    same per-step token budget. Rounds are interleaved (the order reversed every other round); each
    round gives output tok/s (first submission to last token) and the median request's TTFT and
    TPOT, and per-round ratios ours / HF. Tokens are compared request by request
    (``inference_course.hf_batching.compare``)."""
    import transformers

    from inference_course import hf_batching as hb
    from inference_internals.model import load_reference, load_tokenizer
    from inference_internals.analysis.trace import make_trace
    from inference_internals.timing import Load

    from .common import stats

    n, new = args.requests, args.hf_batch_tokens
    trace = make_trace(n, prompt_range=(8, 48), output_range=(4, 64), seed=0)
    prompts = hb.text_prompts(load_tokenizer(), [r.prompt_len for r in trace])
    ours = {f"ours ({k} model)": m for k, m in load_engines(device).items()}
    hf = load_reference(device=device)
    block, budget = 16, 2048
    blocks = hb.blocks_needed(prompts, new, block)
    runs = {k: (lambda m=m: hb.run_ours(m, prompts, new, block, blocks, budget)) for k, m in ours.items()}
    runs[HF_BATCH] = lambda: hb.run_hf(hf, prompts, new, block, blocks, budget)
    for fn in runs.values():  # warm-up: first-call costs (allocations, lazy imports) out of the rounds
        fn()
    rounds = {k: [] for k in runs}
    with Load() as load:
        for rep in range(args.batching_reps):
            for k in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
                rounds[k].append(runs[k]())
    def med(xs):  # the median request's; a one-token request has no TPOT
        return statistics.median(x for x in xs if x is not None)

    out = {"engines": {}, "vs_hf": {}, "tokens": {}}
    for k, rs in rounds.items():
        out["engines"][k] = {"tok_s": stats([r.tok_s for r in rs]),
                             "ttft_s": stats([med(r.ttft) for r in rs]),
                             "tpot_s": stats([med(r.tpot) for r in rs]),
                             "call_seconds": stats([r.call_seconds for r in rs]),
                             "tok_s_per_round": [r.tok_s for r in rs]}
    h = rounds.pop(HF_BATCH)
    for k, rs in rounds.items():
        out["vs_hf"][k] = {"tok_s_per_round": [a.tok_s / b.tok_s for a, b in zip(rs, h)],
                           "ttft_per_round": [med(a.ttft) / med(b.ttft) for a, b in zip(rs, h)],
                           "tpot_per_round": [med(a.tpot) / med(b.tpot) for a, b in zip(rs, h)]}
        # every round of both, against HF's first: a run that changes its own output shows too
        for a, b in zip(rs, h):
            if a.tokens != rs[0].tokens or b.tokens != h[0].tokens:
                raise AssertionError(f"{k} or {HF_BATCH} changed its greedy tokens between rounds")
        c = hb.compare(rs[0].tokens, h[0].tokens, prompts, hf)
        out["tokens"][k] = {"identical": sum(c.identical), "requests": n, "ok": c.ok, "tol": c.tol,
                            "summary": c.summary(),
                            "divergences": [{"request": d.request, "index": d.index, "ours": d.ours, "hf": d.hf,
                                             "margin": d.margin, "near_tie": d.near_tie} for d in c.divergences]}
    # how near this trace came to a greedy tie: a margin far above the tolerance makes identity expected
    out["closest_call"] = hb.closest_call(h[0].tokens, prompts, hf)
    out["setup"] = {"requests": n, "max_tokens": new, "prompt_lengths": [len(p) for p in prompts],
                    "prompts": "slices of the Zen of Python", "block_size": block, "num_blocks": blocks,
                    "max_batch_tokens": budget, "rounds": args.batching_reps, "dtype": "float32",
                    "ours": "engine.LLMEngine(packed=True), prefix caching on",
                    "hf": {"api": "model.generate_batch", "transformers": transformers.__version__,
                           "attn_implementation": hf.config._attn_implementation,
                           "config": f"ContinuousBatchingConfig(page_size={block}, num_blocks={blocks}, "
                                     f"max_batch_tokens={budget}, max_requests_per_batch={n}), block sharing on"}}
    out["load"] = {"others_busy_cores": load.others, "load_avg_end": os.getloadavg()}
    return out
