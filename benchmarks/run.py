"""The course's benchmark suite: our engines against Hugging Face, measured side by side.

    .venv/bin/python -m benchmarks.run [--quick] [--only SECTION ..] [--merge] [--notebooks] [--threads N] [--out PATH]

One module per section: decode.py (batch-1 decode, prefill, batched decode), batching.py
(continuous vs static batching), speculative.py (drafts against plain decoding), gemma.py (Gemma 3
270M's decode beside Hugging Face and llama.cpp on the same file), llama_cpp_best.py (the door against
llama.cpp's repacked Q4_0 path, 128 to 8K tokens of context), serving.py (the door's fast engine
behind the HTTP server, sixteen streams against one and against generate()); common.py
holds what they share. "Ours" is one model, ``model.Llama``, run as loaded ("plain") and after
``optimize(model)`` ("optimized"): every section that runs our engine runs both.

Every comparison is interleaved in one run (A, B, A, B, ...), and reported as the median of
the repetitions with their min-max, so a machine whose load drifts hurts both sides alike;
ratios are the robust figure. Every decode figure is also given as a % of the bandwidth
bound measured in the same run: tok/s <= bandwidth / bytes of weights read per token.
Prints a table and writes JSON to benchmarks/results/latest.json (read by book/benchmarks.ipynb).
With ``--only ... --merge`` the sections run replace theirs in the file that is there, which keeps
the rest and records each new section's run as ``<section>_run`` (date, commit, note), which the
pages name beside its figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from .common import ROOT, machine_info

RESULTS = ROOT / "benchmarks" / "results"


def bench_notebooks() -> dict:
    """Every chapter's wall time, executed as tests/test_notebooks.py and the book build execute it."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    out = {}
    for nb_path in sorted((ROOT / "chapters").glob("*.ipynb")):
        res = single_nb_execution(nbformat.read(nb_path, as_version=4), cwd=str(nb_path.parent), timeout=600,
                                  allow_errors=False)
        # a failing notebook is a result, not a crash
        ok = True if res.err is None else f"{type(res.err).__name__}: {str(res.err)[:200]}"
        out[nb_path.name] = {"seconds": res.time, "ok": ok}
    return out


def merged(path: Path, run: dict, sections: list[str]) -> dict:
    """The results in ``path`` with ``sections`` replaced by ``run``'s, each recorded as ``<section>_run``."""
    if not path.is_file():
        raise SystemExit(f"--merge: {path} does not exist; run the whole suite first")
    old = json.loads(path.read_text())
    facts = {"date": run["machine"]["date"], "commit": run["machine"]["commit"], "note": run["note"] or "the section alone",
             "cpu": run["machine"]["cpu"], "cores": run["machine"]["cores"]}
    return old | {s: run[s] for s in sections} | {f"{s}_run": facts for s in sections}


def table(r: dict) -> str:
    lines = []
    add = lines.append
    add(f"machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, torch {r['machine']['torch']}, "
        f"{r['machine']['date']}, load {r['machine']['load_avg_start'][0]:.1f} -> {r['machine'].get('load_avg_end', [0])[0]:.1f}")
    add(f"memory read bandwidth: {r['bandwidth_GB_s']:.1f} GB/s (best of the run); "
        f"fp32 matmul: {r['matmul_fp32_GFLOP_s']:.0f} GFLOP/s")
    for dt, d in r.get("decode", {}).items():
        if "error" in d:
            add(f"decode {dt}: ERROR {d['error']}")
            continue
        add(f"\nbatch-1 decode, {dt}: bound {d['bound_tok_s']:.1f} tok/s; kernels {d['kernels']}")
        add(f"  {'engine':32s} {'median':>8s} {'min-max':>15s} {'% bound':>8s} {'x HF':>6s}")
        for k, e in d["engines"].items():
            add(f"  {k:32s} {e['median']:8.1f} {e['min']:7.1f}-{e['max']:<7.1f} {e['pct_of_bound']:7.0f}% {e['vs_hf']:6.2f}")
    if "quantized" in r and "engines" in r["quantized"]:
        q = r["quantized"]
        load = q.get("load", {})
        add(f"\nbatch-1 decode per weight format, eager and compiled, beside HF and llama.cpp (one interleaved run, "
            f"{q.get('rounds', '?')} rounds; other programs kept {load.get('others_busy_cores') or 0:.1f} of "
            f"{load.get('cores', '?')} cores busy); llama.cpp: "
            + (f"llama-cpp-python {cpp['version']}, {cpp['threads']} threads" if isinstance(cpp := q.get("llama_cpp"), dict)
               else str(cpp)))
        add(f"  {'engine':40s} {'MB/tok':>6s} {'tok/s':>6s} {'min-max':>13s} {'% law':>6s} {'x llama.cpp (rounds)':>21s} {'x HF fp32 (rounds)':>19s}")

        def x(d):
            return f"{d['median']:.2f} ({d['min']:.2f}-{d['max']:.2f})" if d else "-"
        for k, e in q["engines"].items():
            if "median" in e:
                add(f"  {k:40s} {e['weight_MB']:6.0f} {e['median']:6.1f} {e['min']:6.1f}-{e['max']:<6.1f} "
                    f"{e['pct_of_bound']:5.0f}% {x(q.get('vs_llama_cpp', {}).get(k)):>21s} {x(q.get('vs_hf', {}).get(k)):>19s}")
        add(f"  best: {q.get('best')}; targets: {q.get('targets')}")
        if "llama_cpp_tokens" in q:
            t = q["llama_cpp_tokens"]
            add(f"  greedy tokens the same as llama.cpp's up to the first difference, of {t['n']}: "
                f"{t['same_prefix_as_llama_cpp']}; ours Q4_1 as ours fp32: {t.get('same_prefix_q4_1_as_fp32', '-')}")
    if "prefill" in r and "engines" in r["prefill"]:
        add(f"\nprefill, {r['prefill']['prompt_tokens']} tokens, fp32 (tok/s):")
        for k, e in r["prefill"]["engines"].items():
            add(f"  {k:32s} {e['median']:8.0f} ({e['min']:.0f}-{e['max']:.0f})")
    if "batched" in r and "aggregate_tok_s" in r["batched"]:
        add(f"\nbatched decode, fp32, {r['batched']['engine']} (aggregate tok/s):")
        for B, e in r["batched"]["aggregate_tok_s"].items():
            add(f"  B={B:>3s} {e['median']:8.1f} ({e['min']:.1f}-{e['max']:.1f})  {e['pct_of_bound']:5.0f}% of B x bound")
    cp = r.get("batching", {}).get("chunked_prefill")
    if cp:
        add(f"\nchunked prefill (budget {cp['setup']['budget']}) vs whole prompts, Poisson arrivals at "
            f"{cp['setup']['rate_req_s']:.2f} req/s: throughput {cp['chunked']['throughput']:.1f} vs "
            f"{cp['whole']['throughput']:.1f} tok/s, TPOT p99 {cp['chunked']['tpot_p99'] * 1e3:.0f} vs "
            f"{cp['whole']['tpot_p99'] * 1e3:.0f} ms, TTFT p50 {cp['chunked']['ttft_p50']:.2f} vs {cp['whole']['ttft_p50']:.2f} s")
    for key in ("batching", "speculative", "notebooks"):
        if key in r:
            add(f"\n{key}: {json.dumps(r[key], indent=1, default=str)[:1500]}")
    return "\n".join(lines)


def _rebase(r: dict, bw: float, n_params: int) -> None:
    """Express every decode figure against the best bandwidth seen in the whole run."""
    for dt, d in r.get("decode", {}).items():
        if "engines" in d:
            d["bound_tok_s"] = bw / (n_params * getattr(torch, dt).itemsize)
            for e in d["engines"].values():
                e["pct_of_bound"] = 100 * e["median"] / d["bound_tok_s"]
    for e in r.get("quantized", {}).get("engines", {}).values():
        if "median" in e:
            e["bound_tok_s"] = bw / (e["weight_MB"] * 1e6)
            e["pct_of_bound"] = 100 * e["median"] / e["bound_tok_s"]
    agg = r.get("batched", {}).get("aggregate_tok_s", {})
    for B, e in agg.items():
        e["pct_of_bound"] = 100 * e["median"] / (int(B) * bw / (n_params * 4))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer reps and tokens (a smoke test)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--prefill-len", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--kv-blocks", type=int, default=32)
    p.add_argument("--batching-reps", type=int, default=3)
    p.add_argument("--watermark", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2],
                   help="continuous batching: fractions of the KV pool kept free at admission")
    p.add_argument("--chunk-budget", type=int, default=64,
                   help="chunked prefill's max_num_batched_tokens in the batching section's load run")
    p.add_argument("--hf-batch-tokens", type=int, default=32, help="batching_hf: tokens per request (>= 2)")
    p.add_argument("--spec-tokens", type=int, default=48)
    p.add_argument("--gamma", type=int, nargs="+", default=[4, 8, 12],
                   help="guesses per round for prompt lookup (each one measured)")
    p.add_argument("--min-ngram", type=int, nargs="+", default=[1, 2],
                   help="prompt lookup's shortest match worth a guess (each one measured at every γ)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--no-compile", action="store_true", help="skip the optimized model's torch.compile'd decode step")
    p.add_argument("--formats", nargs="+", help="quantized section: only these formats (fp32 bf16 int8 q8_0 'int4 g32' "
                   "'int4 g64' q4_1 'q4_1 int4-head' 'q4_1 q8_0-head fp32-act' 'q4_1 q8_0-head vnni' 'int8_asym q8_0-head vnni'; default all, --quick: bf16 int8 q4_1); each eager and compiled")
    p.add_argument("--peers-python", help="the interpreter with llama-cpp-python that runs llama.cpp as a peer "
                   "(default: $PEERS_PYTHON, else .venv-peers/bin/python when `make bench-peers` built it)")
    p.add_argument("--device", help="cpu, cuda or mps (default: inference_internals.device's choice)")
    p.add_argument("--only", nargs="+", help="sections: decode quantized prefill batched batching batching_hf speculative "
                                             "breakdown step_parts quality gemma llama_cpp_best door_batches spec_schedule block_rows serving (not in the default run)")
    p.add_argument("--merge", action="store_true", help="with --only: replace those sections in --out's file, keep the "
                   "rest, and record their run as <section>_run")
    p.add_argument("--serving-rounds", type=int, default=4, help="serving: rounds of generate() and HTTP, alternating")
    p.add_argument("--notebooks", action="store_true", help="also time every chapter notebook (slow)")
    p.add_argument("--note", default="", help="free text stored in the JSON (e.g. 'under load')")
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    a = p.parse_args(argv)
    if a.merge and not a.only:
        p.error("--merge takes --only: the sections to replace")
    if a.quick:
        a.reps, a.new_tokens, a.prefill_len, a.batches, a.requests, a.spec_tokens, a.batching_reps = 2, 12, 64, [1, 4], 8, 24, 1
        a.hf_batch_tokens = 12
        a.formats = a.formats or ["bf16", "int8", "q4_1"]  # each one compiled costs about a minute
    if a.threads:
        torch.set_num_threads(a.threads)
    from inference_internals.device import get_device
    from inference_internals.analysis.roofline import measure_bandwidth, measure_matmul
    from inference_internals.model import Llama, count_parameters, load_tokenizer

    from .batching import bench_batching, bench_batching_hf
    from .block_rows import bench_block_rows
    from .breakdown import bench_breakdown, bench_quality, bench_step_parts
    from .decode import bench_batched, bench_decode, bench_prefill, bench_quantized
    from .door_batches import bench_door_batches
    from .gemma import bench_gemma
    from .llama_cpp_best import bench_llama_cpp_best
    from .serving import bench_serving
    from .spec_schedule import bench_spec_schedule
    from .speculative import bench_speculative

    device = get_device(a.device)
    r = {"machine": machine_info(device), "note": a.note, "args": {k: str(v) for k, v in vars(a).items()}}
    tok = load_tokenizer()
    n_params = count_parameters(Llama.from_pretrained(device="cpu"))
    r["n_params"] = n_params
    # the ceilings of the device the models run on
    bws = [measure_bandwidth(device, budget_s=1.0)["read"]]
    # fp32 matmul ceiling: with the bandwidth it places the critical batch, where a pass over
    # more tokens stops being free (the speculative section's verify passes)
    flops = [measure_matmul(device, torch.float32, budget_s=2.0)]
    sections = a.only or ["decode", "quantized", "prefill", "batched", "batching", "batching_hf", "speculative",
                          "breakdown", "step_parts", "quality", "gemma", "llama_cpp_best", "door_batches", "spec_schedule",
                          "block_rows"]
    jobs = {"decode": lambda: bench_decode(a, device, max(bws), tok, n_params),
            "quantized": lambda: bench_quantized(a, device, max(bws), tok),
            "prefill": lambda: bench_prefill(a, device, tok),
            "batched": lambda: bench_batched(a, device, max(bws), n_params),
            "batching": lambda: bench_batching(a, device),
            "batching_hf": lambda: bench_batching_hf(a, device),
            "speculative": lambda: bench_speculative(a, device, tok),
            "breakdown": lambda: bench_breakdown(a, device, max(bws)), "step_parts": lambda: bench_step_parts(a, device),
            "quality": lambda: bench_quality(a, device),
            "gemma": lambda: bench_gemma(a, device), "serving": lambda: bench_serving(a, device),
            "llama_cpp_best": lambda: bench_llama_cpp_best(a, device), "door_batches": lambda: bench_door_batches(a, device),
            "spec_schedule": lambda: bench_spec_schedule(a, device), "block_rows": lambda: bench_block_rows(a, device)}
    for s in sections:
        print(f"[{time.strftime('%H:%M:%S')}] {s} ...", file=sys.stderr, flush=True)
        try:
            r[s] = jobs[s]()
        except Exception as e:  # noqa: BLE001 - report the gap, run the rest
            r[s] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-1500:]}
        bws.append(measure_bandwidth(device, budget_s=0.5)["read"])  # the best of the run is the ceiling
    if a.notebooks:
        r["notebooks"] = bench_notebooks()
    r["bandwidth_GB_s"] = max(bws) / 1e9
    _rebase(r, max(bws), n_params)
    r["bandwidth_samples_GB_s"] = [b / 1e9 for b in bws]
    flops.append(measure_matmul(device, torch.float32, budget_s=2.0))
    r["matmul_fp32_GFLOP_s"] = max(flops) / 1e9
    r["machine"]["load_avg_end"] = os.getloadavg()
    print(table(r))
    if a.merge:
        r = merged(a.out, r, sections)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(r, indent=1, default=str))
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
