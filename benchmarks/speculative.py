"""Speculative decoding per draft, on the plain and on the optimized model, against plain greedy
decoding of the same model; and what a target pass over 1..γ+1 tokens costs on each."""
from __future__ import annotations

import statistics

import torch

from inference_course.prompts import GROUNDED, OPEN_ENDED
from inference_internals.timing import clock

from .common import OPTIMIZED, load_engines, stats


def bench_speculative(args, device, tok) -> dict:
    """Speeds are decode speeds, first token to last, as in the batch-1 decode section: both sides
    run the same prefill, which speculative decoding does not change. The speed-up including the
    prefill is recorded next to it. The speed-up depends on the model: a verification pass over
    γ+1 tokens costs more decode steps when the one-token step is fast (optimized) than when it
    is slow (plain).
    """
    from inference_internals.drafts import MTPDraft, MTPHeads, PromptLookupDraft
    from inference_internals.generate import chat_prompt, generate_stream
    from inference_internals.speculative import speculative_generate

    engines = load_engines(device)
    drafts = {f"prompt lookup (γ={g}, n≥{n})": (PromptLookupDraft(max_ngram=3, min_ngram=n), g, GROUNDED)
              for g in args.gamma for n in args.min_ngram}
    res = {}
    try:
        heads = MTPHeads.load()
        drafts["MTP heads (γ=3)"] = ({k: MTPDraft(m, heads) for k, m in engines.items()}, 3, OPEN_ENDED)
    except FileNotFoundError as e:
        res["MTP heads"] = {"gap": str(e)}
    max_T = max(g for _, g, _ in drafts.values()) + 1
    seconds = {engine: pass_seconds(m, max_T) for engine, m in engines.items()}
    costs = {engine: [t / ts[1] for t in ts] for engine, ts in seconds.items()}
    for name, (draft_for, gamma, texts) in drafts.items():
        for engine, target in engines.items():
            draft = draft_for[engine] if isinstance(draft_for, dict) else draft_for  # MTP reads its target
            runs, same = {"plain": [], "spec": []}, True
            tokens = cost = rounds = 0
            for text in texts:
                ids = tok.encode(chat_prompt([{"role": "user", "content": text}]))
                list(generate_stream(target, ids, 8))  # warm-up
                for _ in range(max(1, args.reps // 2)):
                    t0 = clock(device)
                    ref, stamps = [], []
                    for t in generate_stream(target, ids, args.spec_tokens):
                        ref.append(int(t[0]))  # reads the token back: it is ready
                        stamps.append(clock(device))
                    runs["plain"].append((len(ref), stamps[-1] - t0, stamps[-1] - stamps[0]))
                    t0 = clock(device)
                    r = speculative_generate(target, ids, draft, args.spec_tokens, gamma=gamma)
                    t = clock(device) - t0
                    runs["spec"].append((len(r.tokens), t, t - r.prefill_seconds))
                    same &= r.tokens == ref
                    rounds += len(r.rounds)
                    tokens += sum(x.accepted + 1 for x in r.rounds)
                    cost += sum(costs[engine][len(x.drafted) + 1] for x in r.rounds)
            # seconds per token: end to end (prefill included), and decode (first token to last)
            per = {k: ([t / n for n, t, _ in v], [d / (n - 1) for n, _, d in v]) for k, v in runs.items()}
            n = getattr(draft, "min_ngram", None)
            res[f"{name} on {engine}"] = {
                "draft": draft.name, "settings": f"γ={gamma}" + (f", n≥{n}" if n else ""),
                "engine": engine, "gamma": gamma, "prompts": "input-grounded" if texts is GROUNDED else "open-ended",
                "min_ngram": n,
                "speedup": stats([p / s for p, s in zip(per["plain"][1], per["spec"][1])]),
                "speedup_end_to_end": stats([p / s for p, s in zip(per["plain"][0], per["spec"][0])]),
                "token_identical": same,
                "tokens_per_target_pass": tokens / rounds,
                "verify_pass_cost_in_steps": costs[engine][gamma + 1],
                # the decode speed-up if the draft cost nothing: tokens over what the rounds' actual
                # passes cost, in one-token steps (a round that drafted less ran a cheaper pass)
                "speedup_if_drafting_were_free": tokens / cost,
                "plain_tok_s": 1 / statistics.median(per["plain"][1]), "spec_tok_s": 1 / statistics.median(per["spec"][1]),
                "plain_tok_s_end_to_end": 1 / statistics.median(per["plain"][0]),
                "spec_tok_s_end_to_end": 1 / statistics.median(per["spec"][0])}
    res["pass_cost_in_steps"] = {engine: {str(T): c for T, c in enumerate(cs) if T} for engine, cs in costs.items()}
    res["pass_seconds"] = {engine: {str(T): t for T, t in enumerate(ts) if T} for engine, ts in seconds.items()}
    res["kernels"] = engines[OPTIMIZED].kernels
    return res


def pass_seconds(model, max_T: int, context: int = 128, reps: int = 5) -> list[float]:
    """``[_, t1, .., t_maxT]``: the best time of one target pass over T new tokens after ``context``
    cached ones.

    Speculative decoding assumes t_T ≈ t_1 (a step is bound by reading the weights, whatever T);
    where t_T / t_1 is larger, tokens per pass must exceed it before anything is gained.
    """
    from inference_internals.kv_cache import KVCache

    dev = model.device
    cache = KVCache.for_model(model, 1, context + max_T)
    best = {}
    with torch.inference_mode():
        model(torch.randint(3, 40000, (1, context), generator=torch.Generator().manual_seed(0)).to(dev), cache=cache)
        for _ in range(reps):  # sweep every T each rep, so drifting load hits all T alike
            for t in range(1, max_T + 1):
                ids = torch.randint(3, 40000, (1, t), generator=torch.Generator().manual_seed(t)).to(dev)
                cache.crop(context)
                t0 = clock(dev)
                model(ids, cache=cache)
                best[t] = min(best.get(t, float("inf")), clock(dev) - t0)
    return [float("nan")] + [best[t] for t in range(1, max_T + 1)]
