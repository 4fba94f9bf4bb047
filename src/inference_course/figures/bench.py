"""The Benchmarks pages' readers of the committed run (benchmarks/results/latest.json): the one table a
reader comes for (ours, llama.cpp and Hugging Face, decode and prefill, with each ratio's rounds), the
machine it ran on, and small helpers the pages' cells share. Every figure that divides by the memory
bandwidth is read at the run's median sample (``ch03.at_median_bandwidth``), as chapter 3 states its own.

The bandwidth helpers live in ``ch03`` (chapter 3 reads the same run); this module imports them, never
the reverse.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from inference_internals.timing import COULD_NOT_TELL, Spread, ratio_of_stats, says

from .ch03 import (NOT_MEASURED, at_median_bandwidth, bandwidth, bandwidth_words, best_compiled, find_results,
                   ridge_range)

LLAMA_CPP, HF32, HF16 = "llama.cpp (Q4_1 GGUF)", "Hugging Face generate() fp32", "Hugging Face generate() bf16"


def load(start: Path | str = ".") -> tuple[dict, Path]:
    """The committed run (or ``$BENCH_JSON``: a run to look at before it is committed) at its median
    bandwidth, and the results folder. A run from before the one model named its engines by file
    (fast.py's FastLlama, model.py): read under today's names, with ``r["before_one_model"]`` set."""
    found = find_results(start)
    if found is None:
        raise FileNotFoundError(f"no benchmarks/results/latest.json in {Path(start).resolve()} or above")
    path = Path(os.environ.get("BENCH_JSON") or found)
    text = path.read_text()
    before = '"ours (fast.py)"' in text
    if before:
        text = text.replace("model.py + generate.py", "plain model").replace("fast.py", "optimized").replace(
            "model.py", "plain")
    r = at_median_bandwidth(json.loads(text))
    r["before_one_model"] = before
    return r, found.parent


def md_table(header: list, rows: list[list]) -> str:
    """A Markdown table (the pages render Markdown outputs with MyST: tables included)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def spread_of(d: dict) -> Spread:
    """A ratio the run stored: its rounds where it kept them, else its min, median and max."""
    return Spread(tuple(d.get("rounds") or (d["min"], d["median"], d["max"])))


def _rate(e: dict, spec: str = ".1f") -> str:
    return f'{e["median"]:{spec}} <small>({e["min"]:{spec}}–{e["max"]:{spec}})</small>'


def _ratio(s: Spread | None) -> str:
    return "—" if s is None else f"{s.median:.2f}× <small>({s.lo:.2f}–{s.hi:.2f})</small>"


def _per_round(num: dict | None, den: dict | None) -> Spread | None:
    """num ÷ den round by round, both stored against the same reference in the same rounds."""
    if not (isinstance(num, dict) and isinstance(den, dict) and num.get("rounds") and den.get("rounds")):
        return None
    return Spread(tuple(a / b for a, b in zip(num["rounds"], den["rounds"])))


def against(engine: str, tables: dict[str, dict]) -> list[str]:
    """What ``engine``'s per-round ratios support against each reference (label -> the run's ratios to
    it): faster or slower in every round, or level within the rounds' spread."""
    said = []
    for label, table in tables.items():
        if engine in table:
            s = spread_of(table[engine])
            said.append(says(s, 1, f"faster than {label} in every round ({s.median:.2f}×)",
                             f"slower than {label} in every round ({s.median:.2f}×)",
                             f"level with {label} within the rounds' spread ({s.lo:.2f}–{s.hi:.2f}×)"))
    return said


def headline(r: dict) -> str:
    """The page's first table, as Markdown: batch-1 decode of our fastest engine and our fp32 one against
    llama.cpp and Hugging Face (tok/s, each ratio's median and the range of its rounds), then prefill,
    and the sentence each ratio's rounds support. "not measured in the committed run" for what it lacks."""
    q = r.get("quantized") if isinstance(r.get("quantized"), dict) else {}
    es = {k: e for k, e in q.get("engines", {}).items() if isinstance(e, dict) and "median" in e}
    best = best_compiled(q) if es else None
    out = []
    if best is None:
        out.append(f"Batch-1 decode against llama.cpp and Hugging Face: {NOT_MEASURED}.")
    else:
        vs_cpp, vs_hf = q.get("vs_llama_cpp") or {}, q.get("vs_hf") or {}
        fp32 = next((k for k in ("ours fp32 compiled", "ours fp32") if k in es), None)
        rows, ours = [], [k for k in (best, fp32) if k]
        for name in [*ours, LLAMA_CPP, HF32, HF16]:
            if name not in es:
                rows.append([name, NOT_MEASURED, "", ""])
                continue
            cpp = Spread((1.0,)) if name == LLAMA_CPP else spread_of(vs_cpp[name]) if name in vs_cpp else None
            hf = Spread((1.0,)) if name == HF32 else spread_of(vs_hf[name]) if name in vs_hf else None
            label = f"**{name}**" if name in ours else name
            rows.append([label, _rate(es[name]), "1" if name == LLAMA_CPP else _ratio(cpp),
                         "1" if name == HF32 else _ratio(hf)])
        out.append(md_table(["batch-1 decode", "tok/s", "÷ llama.cpp", "÷ HF fp32"], rows))
        said = against(best, {"llama.cpp on the same GGUF": vs_cpp, "Hugging Face at fp32": vs_hf})
        rounds, tokens = q.get("rounds", r.get("args", {}).get("reps")), q.get("new_tokens")
        out.append(f"Tok/s: the median and (range) of {rounds} rounds of one prompt and {tokens} new tokens, every engine "
                   "in turn in each round. A ratio is this row's tok/s over the column's in the same round, median "
                   "(range of rounds): a busy moment of the machine slows both sides of it. Our fastest "
                   f"engine, {best}, was " + (" and ".join(said) if said else f"compared with neither: {NOT_MEASURED}")
                   + ".")
    p = r.get("prefill") if isinstance(r.get("prefill"), dict) else {}
    pe = p.get("engines", {})
    hf = pe.get("Hugging Face forward")
    if pe:
        rows = [[k, _rate(e, ".0f"), "1" if k == "Hugging Face forward" else
                 _ratio(ratio_of_stats(e, hf)) if hf else "—"] for k, e in pe.items()]
        rows.append([LLAMA_CPP, NOT_MEASURED, ""])
        out.append(md_table([f'prefill, {p.get("prompt_tokens", "?")}-token prompt, {p.get("dtype", "?")}',
                             "tok/s", "÷ HF forward"], rows))
        ours = pe.get("ours (optimized)")
        if ours and hf:
            s = ratio_of_stats(ours, hf)
            out.append("Prefill is compute-bound, and every engine here runs the same BLAS matrix products: ours "
                       "(optimized) was " + says(s, 1, "faster than Hugging Face's forward", "slower than Hugging "
                       "Face's forward", f"level with Hugging Face's forward ({COULD_NOT_TELL} which is faster)")
                       + f", {s.median:.2f}× (range {s.lo:.2f}–{s.hi:.2f}, from the repetitions' ranges: this "
                       "section kept no rounds).")
    else:
        out.append(f"Prefill: {NOT_MEASURED}.")
    return "\n\n".join(out)


def run_caption(r: dict) -> str:
    """One line under the headline: where and when the committed run ran, and the bandwidth it divides by."""
    m = r.get("machine", {})
    return (f"Committed run of `make bench`: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch "
            f"{m.get('torch', '?')} with {m.get('torch_threads', '?')} threads, {m.get('date', '?')}, commit "
            f"`{m.get('commit', '?')}`. Memory bandwidth {bandwidth_words(bandwidth(r))}: every *% of the law* "
            "on these pages divides by that median.")


def machine_table(r: dict) -> str:
    """The machine and the run's two ceilings, as a Markdown table."""
    m = r.get("machine", {})
    bw, ridge = bandwidth(r), ridge_range(r)
    rows = [["CPU", m.get("cpu", "?")], ["cores", m.get("cores", "?")],
            ["vector ISA", ", ".join(m.get("isa", [])) or "n/a"],
            ["torch", f'{m.get("torch", "?")} ({m.get("torch_threads", "?")} threads)'], ["date", m.get("date", "?")],
            ["code measured (git commit)", m.get("commit", "not recorded")]]
    if m.get("load_avg_start") and m.get("load_avg_end"):
        rows.append(["load average (1 min) at start / end", f'{m["load_avg_start"][0]:.1f} / {m["load_avg_end"][0]:.1f}'])
    rows.append(["memory read bandwidth", bandwidth_words(bw)])
    if isinstance(r.get("matmul_fp32_GFLOP_s"), (int, float)):
        rows.append(["fp32 matmul", f'{r["matmul_fp32_GFLOP_s"]:.0f} GFLOP/s'])
    if ridge:
        rows.append(["ridge point, fp32 (FLOPs per byte)", f"{ridge[1]:.1f} at the median bandwidth, "
                     f"{ridge[0]:.1f} at the best"])
    if r.get("n_params"):
        rows.append(["parameters", f'{r["n_params"] / 1e6:.1f} M'])
    if "gpu" in m:
        rows.append(["GPU", f'{m["gpu"]["name"]}, {m["gpu"]["memory_GB"]:.0f} GB'])
    rows.append(["models ran on", m.get("device", "cpu")])
    return md_table(["the committed run", ""], rows)


def _unmeasured(res, needs: str, cut: int | None = None) -> str | None:
    """The page's line for a section this run lacks ``needs`` in, with why (its 'unmeasured' or 'error',
    cut to ``cut`` characters); None when the section is there."""
    if isinstance(res, dict) and needs in res:
        return None
    why = res.get("unmeasured") or res.get("error") if isinstance(res, dict) else None
    return f"*Not measured in this run{': ' + why[:cut] if why else ''}.*"


def _amx_note(res: dict, ours_took: str) -> str | None:
    """Where llama.cpp ran without its AMX kernels (built so on an AMX CPU: they crash there), a sentence
    saying so and what ours took from AMX; None where llama.cpp has them or its build is not recorded."""
    cpp = res.get("llama_cpp", {})
    if "system_info" not in cpp or "AMX" in cpp["system_info"]:
        return None
    return (f"On this CPU ours took {ours_took} from AMX's tile instructions; llama.cpp {cpp.get('version', '')} was "
            "built without its AMX kernels, which crash here (llama.cpp issue #20824), and ran on its AVX-512 ones.")


def llama_cpp_best(res: dict, isa: list[str] | tuple = ()) -> str:
    """The ``llama_cpp_best`` section (benchmarks/llama_cpp_best.py) as the page shows it: per context,
    each engine's decode and prefill tok/s with their rounds' range and its share of the bandwidth law,
    then what each of ours does against llama.cpp's Q4_0 per round, in sentences the rounds support
    (``isa``: the run's CPU flags, to say where only ours had AMX)."""
    if (gap := _unmeasured(res, "decode")) is not None:
        return gap
    ctxs = [str(c) for c in res["contexts"]]
    engines = list(res["decode"][ctxs[0]])
    ours = [e for e in engines if e.startswith("ours")]
    cpp_q4_0 = next(e for e in engines if "Q4_0" in e and not e.startswith("ours"))
    rows = []
    for c in ctxs:
        for e in engines:
            d, p = res["decode"][c][e], res["prefill"][c][e]
            vs = d.get(f"vs {cpp_q4_0}")
            rows.append([c, e, _rate(d), f'{d["pct_of_law"]:.0f}%', _ratio(spread_of(vs)) if vs else "—",
                         _rate(p, ".0f")])
    out = [md_table(["context (tokens)", "engine", "decode tok/s", "% of law", f"÷ {cpp_q4_0}, per round",
                     "prefill tok/s"], rows)]
    said = []
    for e in ours:
        dec = [says(spread_of(res["decode"][c][e][f"vs {cpp_q4_0}"]), 1, "ahead", "behind", "level") for c in ctxs]
        pre = spread_of(res["prefill"]["512"][e][f"vs {cpp_q4_0}"]) if "512" in ctxs else None
        words = {"ahead": "ahead in every round", "behind": "behind in every round",
                 "level": "level within the rounds' spread"}
        parts = [f"at {c} tokens {words[v]} ({spread_of(res['decode'][c][e][f'vs {cpp_q4_0}']).median:.2f}×)"
                 for c, v in zip(ctxs, dec)]
        line = f"- **{e}** decodes " + "; ".join(parts) + f" against {cpp_q4_0}"
        if pre is not None:
            line += (f"; it prefills 512 tokens at {pre.median:.2f}× its rate "
                     f"({says(pre, 1, 'faster in every round', 'slower in every round', 'level within the spread')})")
        said.append(line + ".")
    if "amx_int8" in isa and (note := _amx_note(res, "its prefills' integer sums (a decode step's one row stays on "
                                                    "AVX-512, as llama.cpp's)")):
        said.append("- " + note)
    out.append("\n".join(said))
    return "\n\n".join(out)


def door_batches(res: dict) -> str:
    """The ``door_batches`` section (benchmarks/door_batches.py): the door's fast engine with 1 to 64
    requests at once beside llama.cpp's batch API and transformers' ``generate_batch``, tok/s per batch
    with its rounds' range; then, in sentences the rounds support, what a batch buys ours over its own
    batch of one and how it stands against each peer, and whose tokens batching left alone."""
    if (gap := _unmeasured(res, "engines", 200)) is not None:
        return gap
    batches = [str(b) for b in res["batches"]]
    engines = list(res["engines"])
    ours = next(e for e in engines if e.startswith("ours"))
    rows = [[b] + [_rate(res["engines"][e][b]["tok_s"], ".0f") for e in engines] for b in batches]
    out = [md_table(["requests at once"] + [f"{e}, tok/s" for e in engines], rows)]
    said = []
    gains = [f"{b} requests {g.median:.1f}× <small>({g.lo:.1f}–{g.hi:.1f})</small>"
             for b in batches if b != "1" for g in [spread_of(res["over_batch_1"][ours][b])]]
    said.append(f"- **{ours}**: its batch of one's tok/s, times " + ", ".join(gains) + " (per round).")
    words = {"ahead": "ahead in every round", "behind": "behind in every round", "level": "level within the rounds' spread"}
    for peer, by_b in res.get("ours_over", {}).items():
        parts = [f"at {b} {words[says(r, 1, 'ahead', 'behind', 'level')]} ({r.median:.2f}×)"
                 for b in batches for r in [spread_of(by_b[b])]]
        said.append(f"- Against **{peer}**, ours is " + "; ".join(parts) + ".")
    toks = res.get("tokens", {})
    same = [f"{e} {sum(toks[e][b]['same_as_ours_alone'] for b in batches)} of {sum(toks[e][b]['of'] for b in batches)}"
            for e in engines if e != ours and e in toks]
    differ = [e for e in engines if e != ours and e in toks and any(t["same_as_ours_alone"] < t["of"] for t in toks[e].values())]
    why = {"llama.cpp": "llama.cpp rounds each activation to 8 bits (ours keeps 15) and runs a batch's rows through other "
                        "kernels than one row's", "Q4_0": "the Q4_0 file is another model",
           "Hugging Face": "Hugging Face multiplies in fp32"}
    reasons = [w for k, w in why.items() if any(k in e for e in differ)]
    ties = [(b, d) for b, ds in res.get("ours_near_ties", {}).get("changed", {}).items() for d in ds]
    mine = sum(toks[ours][b]["same_as_ours_alone"] for b in batches), sum(toks[ours][b]["of"] for b in batches)
    if not ties:
        first = (f"- Tokens: ours gave every request, in every batch and round, the {res['new_tokens']} greedy tokens it "
                 "gives that prompt alone.")
    else:
        first = (f"- Tokens: ours gave {mine[0]} of {mine[1]} requests (the last round's) the {res['new_tokens']} greedy "
                 "tokens it gives that prompt alone; over all rounds, " + "; ".join(
                     f"request {d['request']} of the batch of {b} (round {d['round'] + 1}) first differed at token "
                     f"{d['index']}, where our plain forward's top two logits are {d['margin']:.4f} apart" for b, d in ties)
                 + ": a tie that a batch's prefill, rounding otherwise than a lone prompt's, breaks the other way "
                 f"(a difference at any gap over {res['ours_near_ties']['tol']} fails the run).")
    said.append(first + " Requests whose tokens equal ours alone: " + "; ".join(same)
                + (f": where they differ, a greedy choice fell the other way ({'; '.join(reasons)})." if reasons else "."))
    if any("AMX off" in e for e in engines) and (note := _amx_note(res, "a batch's and a prefill's integer sums "
                                                                       "(the AMX-off column is ours without them)")):
        said.append("- " + note)
    out.append("\n".join(said))
    return "\n\n".join(out)


def spec_schedule(res: dict) -> str:
    """The ``spec_schedule`` section (benchmarks/spec_schedule.py): the door's fast engine decoding plain and
    speculatively, each draft with γ constant and under the heuristic schedule; tok/s per prompt set with its
    rounds' range, the speed-up over plain decoding and the guesses kept; then, in sentences the rounds
    support, whether each pays and what the schedule changed."""
    if (gap := _unmeasured(res, "engines", 200)) is not None:
        return gap
    kinds, engines = list(res["prompts"]), res["engines"]
    header = ["engine"]
    for k in kinds:
        header += [f"{k} prompts, tok/s", "× plain", "guesses kept"]
    rows = []
    for e, v in engines.items():
        row = [e]
        for k in kinds:
            over, g = v[k].get("over_plain"), v[k].get("guesses")
            # each verify pass writes the target's own token besides the guesses it kept
            row += [_rate(v[k]["tok_s"], ".0f"), _ratio(spread_of(over)) if over else "—",
                    f"{g['accepted']} of {g['proposed']}, "
                    f"{(g['accepted'] + g['verify_passes']) / max(1, g['verify_passes']):.2f} a pass" if g else "—"]
        rows.append(row)
    out = [md_table(header, rows)]
    said = []
    words = {"pays": "pays in every round", "loses": "loses in every round",
             "?": "is level with plain decoding within the rounds' spread"}
    drafts = sorted({e.rsplit(", ", 1)[0] for e in engines if e.endswith((", constant", ", heuristic"))})
    for d in drafts:
        const, heur = engines.get(f"{d}, constant"), engines.get(f"{d}, heuristic")
        if not (const and heur):
            continue
        parts = []
        for k in kinds:
            c, h = spread_of(const[k]["over_plain"]), spread_of(heur[k]["over_plain"])
            gain = Spread([a / b for a, b in zip(heur[k]["over_plain"]["rounds"], const[k]["over_plain"]["rounds"])])
            moved = says(gain, 1, "faster than constant γ in every round", "slower than constant γ in every round",
                         "level with constant γ within the rounds' spread")
            parts.append(f"on the {k} prompts constant γ {words[says(c, 1, 'pays', 'loses', '?')]} ({c.median:.2f}×), "
                         f"the heuristic {words[says(h, 1, 'pays', 'loses', '?')]} ({h.median:.2f}×), "
                         f"{moved} ({gain.median:.2f}×)")
        said.append(f"- **{d}**: " + "; ".join(parts) + ".")
    if (t := res.get("sampled_temperature")) is not None:  # sampled runs: plain and each draft at constant γ
        hot = [(e.split(", ")[0], v) for e, v in engines.items() if e.endswith(f", constant, T {t}")]
        said.append(f"- **Sampling at T {t}**, constant γ: " + "; ".join(
            f"{d} on the {k} prompts {words[says(c := spread_of(v[k]['over_plain']), 1, 'pays', 'loses', '?')]} "
            f"({c.median:.2f}×)" for d, v in hot for k in kinds) + ".")
    out.append("\n".join(said))
    return "\n\n".join(out)
