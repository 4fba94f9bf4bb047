"""γ that follows acceptance, on the fast path: the door's ``LLM(quantization="q4_1", compile=True)``
decoding plain, and speculatively with prompt lookup (γ 4), the MTP heads and the EAGLE layer (γ 3; in fp32 and
in bf16), each with γ kept
constant and under Hugging Face's heuristic schedule (``num_speculative_tokens_schedule``: 2 more
after a pass that kept every guess, 1 fewer after one that did not), interleaved round by round; then
sampling at T 0.7 (each request seeded), plain and each draft at constant γ, in the same rounds.

    make bench BENCH_ARGS="--only spec_schedule --merge"

One compiled model serves every engine (a model given to ``LLM`` is used as it is), so each graph
compiles once. Requests go one at a time (batch 1, where speculative decoding is meant to pay), on the
course's open-ended and input-grounded prompts (chat template), ``NEW_TOKENS`` greedy tokens each, EOS
ignored; tok/s is the prompt set's new tokens over its calls' time, prefill included (speculation does not
change it). Every greedy speculative run's tokens must equal plain decoding's, else the run fails; a
sampled one must write as many (EOS ignored), from the target's distribution (tests/test_engine_speculative.py).
"""
from __future__ import annotations

import time

from .common import stats

NEW_TOKENS = 64
PLAIN = "plain decoding"
DRAFTS = {"prompt lookup, γ 4": {"method": "ngram", "num_speculative_tokens": 4},
          "MTP heads, γ 3": {"method": "mtp", "num_speculative_tokens": 3},
          "EAGLE, γ 3": {"method": "eagle", "num_speculative_tokens": 3},
          # the same layer computing in bf16: half the bytes a guess reads (speculative_config's dtype)
          "EAGLE in bf16, γ 3": {"method": "eagle", "num_speculative_tokens": 3, "dtype": "bfloat16"}}
SCHEDULES = ("constant", "heuristic")
SAMPLED = 0.7  # the temperature of the sampled runs


def bench_spec_schedule(args, device) -> dict:
    from inference_course.prompts import GROUNDED, OPEN_ENDED
    from inference_internals import LLM, SamplingParams
    from inference_internals.generate import chat_prompt

    door = LLM(device=str(device), quantization="q4_1", compile=True)
    model, tok = door.model, door.tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    sampled = SamplingParams(temperature=SAMPLED, max_tokens=NEW_TOKENS, ignore_eos=True, seed=0)
    hot = f", T {SAMPLED}"
    engines = {PLAIN: (door, greedy), PLAIN + hot: (door, sampled)}  # name: (engine, its requests' params)
    for name, cfg in DRAFTS.items():
        for schedule in SCHEDULES:
            engines[f"{name}, {schedule}"] = (LLM(model, tokenizer=tok, speculative_config={
                **cfg, "num_speculative_tokens_schedule": schedule}), greedy)
        engines[f"{name}, constant{hot}"] = (engines[f"{name}, constant"][0], sampled)
    sets = {kind: [tok.encode(chat_prompt([{"role": "user", "content": t}])) for t in texts]
            for kind, texts in (("open-ended", OPEN_ENDED), ("input-grounded", GROUNDED))}

    def run(e, prompts):
        llm, params = engines[e]
        t0 = time.perf_counter()
        outs = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]  # one request at a time
        return outs, time.perf_counter() - t0

    def plain_of(e):
        return PLAIN + hot if e.endswith(hot) else PLAIN

    for e in engines:  # compiles every graph: the one-token step, and the verify passes'
        for prompts in sets.values():
            run(e, prompts[:1])
    guesses = {e: {k: [0, 0, 0] for k in sets} for e in engines}  # proposed, accepted, verify passes
    rounds = 1 if args.quick else 3
    rates = {e: {k: [] for k in sets} for e in engines}
    for r in range(rounds):
        order = list(engines)[r % len(engines):] + list(engines)[:r % len(engines)]  # each engine first once
        for kind, prompts in sets.items():
            for e in order:
                spec = engines[e][0].spec
                before = (spec.proposed, spec.accepted, spec.steps) if spec else (0, 0, 0)
                outs, seconds = run(e, prompts)
                if spec:
                    for i, now in enumerate((spec.proposed, spec.accepted, spec.steps)):
                        guesses[e][kind][i] += now - before[i]
                rates[e][kind].append((outs, sum(len(o) for o in outs) / seconds))
            for e in engines:  # greedy: speculation keeps plain decoding's tokens, exactly
                mine, plain = rates[e][kind][-1][0], rates[plain_of(e)][kind][-1][0]
                if (mine != plain) if engines[e][1] is greedy else (list(map(len, mine)) != list(map(len, plain))):
                    raise AssertionError(f"{e} on the {kind} prompts gave other tokens than plain decoding")
    res = {"new_tokens": NEW_TOKENS, "rounds": rounds, "prompts": {k: len(v) for k, v in sets.items()},
           "engine": "LLM(quantization='q4_1', compile=True)", "sampled_temperature": SAMPLED, "engines": {}}
    for e in engines:
        entry = {}
        for kind in sets:
            tok_s = [x for _, x in rates[e][kind]]
            entry[kind] = {"tok_s": stats(tok_s), "tok_s_per_round": tok_s}
            if e != plain_of(e):
                over = [x / p for x, (_, p) in zip(tok_s, rates[plain_of(e)][kind])]
                entry[kind]["over_plain"] = stats(over) | {"rounds": over}
                entry[kind]["guesses"] = dict(zip(("proposed", "accepted", "verify_passes"), guesses[e][kind]))
        res["engines"][e] = entry
    return res
