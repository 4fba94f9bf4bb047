"""Chapter 7's reader of the committed Gemma run (benchmarks/results/gemma.json, written by
``make bench-peers BENCH_ARGS="--only gemma --out benchmarks/results/gemma.json"``): our engine at each
format beside Hugging Face and llama.cpp on the same file, and the sentences those rounds support."""
from __future__ import annotations

import json
from pathlib import Path

from .bench import _rate, _ratio, against, md_table, run_caption, spread_of
from .ch03 import NOT_MEASURED, bandwidth, find_results

LLAMA_CPP, HF32 = "llama.cpp (Q4_K_M GGUF)", "Hugging Face generate() fp32"


def find_gemma_run(start: Path | str = ".") -> Path | None:
    """``gemma.json`` beside the committed run that ``ch03.find_results`` finds from ``start``, or None."""
    latest = find_results(start)
    found = latest.parent / "gemma.json" if latest else None
    return found if found and found.is_file() else None


def gemma_comparison(r: dict) -> tuple[str, str]:
    """The table (engine, MB read per token, tok/s, % of the bandwidth law at the run's median sample,
    ÷ llama.cpp and ÷ Hugging Face per round) and the sentence under it, from a run's JSON."""
    g = r.get("gemma") if isinstance(r.get("gemma"), dict) else {}
    es = {k: e for k, e in g.get("engines", {}).items() if isinstance(e, dict) and "median" in e}
    if not es:
        return "", f"Gemma 3 beside Hugging Face and llama.cpp: {NOT_MEASURED}."
    bw = bandwidth(r)
    vs_cpp, vs_hf = g.get("vs_llama_cpp") or {}, g.get("vs_hf") or {}

    def ratio(table, name, ref):
        return "1" if name == ref else _ratio(spread_of(table[name]) if name in table else None)
    rows = []
    for name, e in es.items():
        law = f"{100 * e['median'] * e['weight_MB'] * 1e6 / (bw['median'] * 1e9):.0f}%" if bw else "—"
        rows.append([name, f"{e['weight_MB']:.0f}", _rate(e), law, ratio(vs_cpp, name, LLAMA_CPP), ratio(vs_hf, name, HF32)])
    table = md_table(["engine", "MB read / token", "tok/s", "% of law", "÷ llama.cpp", "÷ HF fp32"], rows)
    # the 4-bit head is shown apart: it moves the logits further than the rest of the format does
    ours = {k: e for k, e in es.items() if k.startswith("ours") and "4-bit head" not in k}
    best = max(ours, key=lambda k: ours[k]["median"]) if ours else None
    said = against(best, {"llama.cpp on the same file": vs_cpp, "Hugging Face at fp32": vs_hf})
    tokens = g.get("tokens", {})
    same, n = tokens.get("same_prefix_as_fp32", {}), tokens.get("n")
    cpp = g.get("llama_cpp")
    text = [f"{run_caption(r)} Medians and ranges of {g.get('rounds', '?')} rounds of {g.get('new_tokens', '?')} "
            f"greedy tokens after a {g.get('prompt_tokens', '?')}-token prompt, every engine in turn in each round."]
    if said:
        text.append(f"Our fastest format with an 8-bit LM head, {best}, was " + " and ".join(said) + ".")
    if "hf_equals_ours_fp32" in tokens:
        text.append("Hugging Face's greedy tokens equal ours at fp32 (the same weights)." if tokens["hf_equals_ours_fp32"]
                    else "Hugging Face's greedy tokens differ from ours at fp32.")
    if LLAMA_CPP in same and best in same:
        text.append(f"Against our fp32 tokens, llama.cpp (the file's 4- and 6-bit super-blocks times 8-bit "
                    f"activations) agreed for the first {same[LLAMA_CPP]} of {n}, and {best} for its first "
                    f"{same[best]}: each rounding sends the text elsewhere sooner or later.")
    if LLAMA_CPP not in es:
        text.append(f"llama.cpp: {cpp if isinstance(cpp, str) else NOT_MEASURED}.")
    elif isinstance(cpp, dict) and cpp.get("fallback"):
        text.append("llama.cpp ran with its extra buffer types off (no repacked or AMX layouts): with them it "
                    "crashed at its first prefill on this CPU, as llama.cpp issue #20824 reports, so this is not "
                    "its best path.")
    text.append("We have no Q4_K kernel: our int4 rows requantize the same weights in groups of 32.")
    text = " ".join(text)
    return table, text


def load_gemma_run(start: Path | str = ".") -> dict:
    """The committed Gemma run, {} when there is none."""
    found = find_gemma_run(start)
    return json.loads(found.read_text()) if found else {}

