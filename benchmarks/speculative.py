"""Speculative decoding per draft, on the plain model, the optimized one and the fast path (the engine
``LLM(quantization='q4_1')`` builds, compiled), against plain greedy decoding of the same model; and
what a target pass over 1..γ+1 tokens costs on each."""
from __future__ import annotations

import statistics

import torch

from inference_course.prompts import GROUNDED, OPEN_ENDED
from inference_internals.timing import Spread, clock, says

from .common import OPTIMIZED, load_engines, stats

# the fastest target this machine has (the quantized section measures it): the front door's q4_1 engine, the
# file's own formats, through the block kernels where the CPU runs them (engine.model_runner.quantization_args)
FAST_PATH = "LLM(quantization='q4_1'), compiled"


def bench_speculative(args, device, tok) -> dict:
    """Speeds are decode speeds, first token to last, as in the batch-1 decode section: both sides
    run the same prefill, which speculative decoding does not change. The speed-up including the
    prefill is recorded next to it. The speed-up depends on the model: a verification pass over
    γ+1 tokens costs more decode steps when the one-token step is fast (optimized) than when it
    is slow (plain). On the fast path (weights a quarter of bf16's) both are compiled: the one-token
    step, and the verify pass over γ + 1 tokens with the hidden state the MTP heads read
    (``optimize(compile=True)``: one graph for one token, one for passes of several).
    """
    from inference_internals.device import default_dtype
    from inference_internals.drafts import MTPDraft, MTPHeads, PromptLookupDraft
    from inference_internals.generate import chat_prompt, generate, generate_stream
    from inference_internals.engine.model_runner import quantization_args
    from inference_internals.speculative import speculative_generate

    from .decode import build_format, common_prefix

    engines = load_engines(device)
    res = {}
    if not args.no_compile:
        try:
            kw = {"dtype": default_dtype(device), "weights": "q4_1", **quantization_args("q4_1", device)}  # as LLM builds it
            fast = build_format(device, kw, compile_like=build_format(device, kw))
            generate(fast, tok.encode("compile the one-token step now"), 3, stop_ids=[])  # compiles
            engines[FAST_PATH] = fast
        except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: the other targets still run
            res[FAST_PATH] = {"gap": f"not compiled: {type(e).__name__}: {e}"[:500]}
    drafts = {f"prompt lookup (γ={g}, n≥{n})": (PromptLookupDraft(max_ngram=3, min_ngram=n), g, GROUNDED)
              for g in args.gamma for n in args.min_ngram}
    try:
        # heads of their own per target: MTPDraft moves them to its target's dtype, in place
        drafts["MTP heads (γ=3)"] = ({k: MTPDraft(m, MTPHeads.load()) for k, m in engines.items()}, 3, OPEN_ENDED)
    except FileNotFoundError as e:
        res["MTP heads"] = {"gap": str(e)}
    max_T = max(g for _, g, _ in drafts.values()) + 1
    seconds = pass_seconds(engines, max_T)
    # a pass over T tokens in one-token steps: per round of the sweep (both timed in it), and from
    # the best time of each (the figure the ceiling below uses)
    cost_rounds = {e: {T: [t / t1 for t, t1 in zip(ts[T], ts[1])] for T in ts} for e, ts in seconds.items()}
    costs = {e: {T: min(ts[T]) / min(ts[1]) for T in ts} for e, ts in seconds.items()}
    for name, (draft_for, gamma, texts) in drafts.items():
        for engine, target in engines.items():
            draft = draft_for[engine] if isinstance(draft_for, dict) else draft_for  # MTP reads its target
            runs, same, agree = {"plain": [], "spec": []}, True, args.spec_tokens
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
                    agree = min(agree, common_prefix(r.tokens, ref))
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
                "speedup": stats(speedups := [p / s for p, s in zip(per["plain"][1], per["spec"][1])])
                | {"rounds": speedups},
                # whether it pays on this target: only where every round agrees (timing.says)
                "pays": says(Spread(speedups), 1, "pays", "does not pay", "could not tell"),
                "speedup_end_to_end": stats([p / s for p, s in zip(per["plain"][0], per["spec"][0])]),
                # exact at fp32; in bf16 a one-token step and a pass over γ + 1 rows round differently (eager
                # Q4_1 alone flipped a near-tie at token 46 of 48), so how far the two outputs agree is counted
                "token_identical": same, "same_tokens_before_first_difference": agree,
                "tokens_per_target_pass": tokens / rounds,
                "verify_pass_cost_in_steps": costs[engine][gamma + 1],
                # the decode speed-up if the draft cost nothing: tokens over what the rounds' actual
                # passes cost, in one-token steps (a round that drafted less ran a cheaper pass)
                "speedup_if_drafting_were_free": tokens / cost,
                "plain_tok_s": 1 / statistics.median(per["plain"][1]), "spec_tok_s": 1 / statistics.median(per["spec"][1]),
                "plain_tok_s_end_to_end": 1 / statistics.median(per["plain"][0]),
                "spec_tok_s_end_to_end": 1 / statistics.median(per["spec"][0])}
    res["pass_cost_in_steps"] = {e: {str(T): c for T, c in cs.items()} for e, cs in costs.items()}
    res["pass_cost_rounds"] = {e: {str(T): c for T, c in cs.items()} for e, cs in cost_rounds.items()}
    res["pass_seconds"] = {e: {str(T): min(t) for T, t in ts.items()} for e, ts in seconds.items()}
    res["kernels"] = engines[OPTIMIZED].kernels
    if FAST_PATH in engines:  # the question of issue 34: does speculation still pay once a step is cheap?
        res["fast_path"] = {"target": FAST_PATH, "pays": {
            k.removesuffix(f" on {FAST_PATH}"): v["pays"] for k, v in res.items() if k.endswith(f" on {FAST_PATH}")},
            "note": "plain decoding of this target runs its compiled one-token step, and every speculative "
                    "pass (γ + 1 tokens, with the hidden state the MTP heads read) its compiled graph for passes "
                    "of several tokens"}
    return res


def pass_seconds(models: dict, max_T: int, context: int = 128, reps: int = 5) -> dict[str, dict[int, list[float]]]:
    """``{model name: {T: [seconds of one pass over T new tokens after context cached ones, per round]}}``.

    One round sweeps every T on every model in turn, so a drift in the machine's load hits all of
    them alike and the ratios within a round (t_T / t_1, one model's against another's) are fair.
    Speculative decoding assumes t_T ≈ t_1 (a step is bound by reading the weights, whatever T);
    where t_T / t_1 is larger, tokens per pass must exceed it before anything is gained. On a
    compiled model, each is its compiled graph, with the hidden states, as speculative decoding runs
    them (the first round, a warm-up, compiles them).
    """
    from inference_internals.kv_cache import KVCache

    caches, out = {}, {k: {t: [] for t in range(1, max_T + 1)} for k in models}
    with torch.inference_mode():
        for k, model in models.items():
            caches[k] = KVCache.for_model(model, 1, context + max_T)
            model(torch.randint(3, 40000, (1, context), generator=torch.Generator().manual_seed(0)).to(model.device),
                  cache=caches[k])
        for rep in range(reps + 1):  # the first round warms up (a compiled step's first call of a shape)
            for k, model in models.items():
                for t in range(1, max_T + 1):
                    ids = torch.randint(3, 40000, (1, t), generator=torch.Generator().manual_seed(t)).to(model.device)
                    caches[k].crop(context)
                    t0 = clock(model.device)
                    model(ids, cache=caches[k], output_hidden_states=True)
                    if rep:
                        out[k][t].append(clock(model.device) - t0)
    return out
