"""The course's benchmark suite: our engines against Hugging Face, measured side by side.

    .venv/bin/python benchmarks/run.py [--quick] [--notebooks] [--threads N] [--out PATH]

Every comparison is interleaved in one run (A, B, A, B, ...), and reported as the median of
the repetitions with their min-max, so a machine whose load drifts hurts both sides alike;
ratios are the robust figure. Every decode figure is also given as a % of the bandwidth
bound measured in the same run: tok/s <= bandwidth / bytes of weights read per token.
Prints a table and writes JSON to benchmarks/results/latest.json (read by book/benchmarks.ipynb).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Input-grounded prompts: the answer copies spans of the prompt (where prompt lookup shines).
GROUNDED = [
    "Add a docstring to this function and return the whole function:\n\ndef total_price(items, tax_rate):\n"
    "    subtotal = sum(item.price * item.quantity for item in items)\n    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n",
    "Translate this Python function to use a for loop instead of sum, keeping the names:\n\n"
    "def total_price(items, tax_rate):\n    subtotal = sum(item.price * item.quantity for item in items)\n"
    "    return subtotal * (1 + tax_rate)\n",
    "Here is a paragraph:\n\"The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 "
    "metres tall and was the tallest man-made structure in the world for 41 years.\"\n"
    "Quote the first sentence of the paragraph.",
    "Rewrite the following text in the same words but as a bulleted list:\nThe museum opens at nine in the "
    "morning, closes at six in the evening, is free on Sundays, and offers guided tours every hour.",
]
OPEN_ENDED = ["Write a short story about a robot who learns to paint.",
              "What are three tips for staying productive when working from home?",
              "Explain why the sky is blue."]


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
        isa = sorted({f for f in flags.split() if f.startswith(("avx512", "amx", "avx2"))})
    except (OSError, StopIteration):
        isa = []
    return {"cpu": cpu or platform.processor(), "isa": isa, "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_avg_start": os.getloadavg(), "commit": _commit()}


def _commit() -> str:
    """The git commit measured, with '+changes' when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


class _Stamps:
    """A Hugging Face streamer that only notes when each token arrives."""

    def __init__(self):
        self.t = []

    def put(self, value):
        self.t.append(time.perf_counter())

    def end(self):
        pass


def decode_rates(runners: dict, prompt: list[int], n_new: int, reps: int) -> dict[str, list[float]]:
    """Decode tok/s (first token to last, prefill excluded) of each runner, interleaved."""
    out = {k: [] for k in runners}
    for _ in range(reps + 1):  # the first round warms up
        for name, fn in runners.items():
            stamps = fn(prompt, n_new)  # times at which each new token was ready
            out[name].append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return {k: v[1:] for k, v in out.items()}


def ours_stream(gen_stream):
    def run(prompt, n):
        t = []
        for _ in gen_stream(prompt, n, stop_ids=[]):
            t.append(time.perf_counter())
        return t
    return run


def hf_stream(hf):
    def run(prompt, n):
        s = _Stamps()
        ids = torch.tensor([prompt])
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False, streamer=s, pad_token_id=hf.config.eos_token_id)
        return s.t[1:]  # the first put is the prompt
    return run


def bench_decode(args, bw: float, tok, n_params: int) -> dict:
    from inference_internals.fast import FastLlama
    from inference_internals.generate import generate_stream
    from inference_internals.model import Llama, load_reference

    prompt = tok.encode("The history of the printing press begins")
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        model = Llama.from_pretrained(dtype=dtype)
        hf = load_reference(dtype=dtype)
        max_len = len(prompt) + args.new_tokens + 8
        t0 = time.perf_counter()
        fast = FastLlama(model, kernel="auto", max_len=max_len)
        build_s = time.perf_counter() - t0
        ours = {"ours (fast.py)": fast}
        extra = {"fast_build_s": build_s, "kernels": fast.kernels}
        if not args.no_compile:
            try:  # the first one-token step compiles the graph: timed here, outside the measured runs
                t0 = time.perf_counter()
                compiled = FastLlama(model, kernel="auto", max_len=max_len, compile=True)
                compiled.generate(prompt, 3, stop_ids=[])
                ours["ours (fast.py, compiled)"] = compiled
                extra["compile_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: report it, measure the rest
                extra["compile_error"] = f"{type(e).__name__}: {e}"[:500]
        hf_tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                pad_token_id=2)[0, len(prompt):].tolist()
        runners = {k: ours_stream(f.generate_stream) for k, f in ours.items()}
        runners |= {"ours (model.py + generate.py)": ours_stream(lambda p, n, stop_ids: generate_stream(model, p, n, stop_ids=stop_ids)),
                    "Hugging Face generate()": hf_stream(hf)}
        rates = decode_rates(runners, prompt, args.new_tokens, args.reps)
        bound = bw / (n_params * dtype.itemsize)
        hf_med = statistics.median(rates["Hugging Face generate()"])
        speedup = {k: statistics.median(a / b for a, b in zip(rates[k], rates["Hugging Face generate()"])) for k in ours}
        res[name] = extra | {
            "bound_tok_s": bound,
            "same_16_tokens_as_hf": {k: f.generate(prompt, 16, stop_ids=[]) == hf_tokens for k, f in ours.items()},
            "engines": {k: stats(v) | {"pct_of_bound": 100 * statistics.median(v) / bound,
                                       "vs_hf": statistics.median(v) / hf_med}
                        for k, v in rates.items()},
            # median over repetitions of (ours ÷ HF) in the same repetition, per engine of ours
            "speedup_vs_hf": speedup, "best": max(speedup, key=speedup.get)}
        del model, hf, fast, ours
    return res


def bench_prefill(args, tok) -> dict:
    from inference_internals.fast import FastLlama
    from inference_internals.model import Llama, load_reference

    model, hf = Llama.from_pretrained(), load_reference()
    fast = FastLlama(model, kernel="auto", max_len=args.prefill_len + 8)
    ids = torch.randint(3, 40000, (1, args.prefill_len), generator=torch.Generator().manual_seed(0))

    def f_fast():
        fast.reset(1)
        fast(ids)

    runners = {"ours (fast.py)": f_fast, "ours (model.py)": lambda: model(ids, last_only=True),
               "Hugging Face forward": lambda: hf(ids, logits_to_keep=1)}
    out = {k: [] for k in runners}
    with torch.inference_mode():
        for _ in range(args.reps + 1):
            for k, fn in runners.items():
                t0 = time.perf_counter()
                fn()
                out[k].append(args.prefill_len / (time.perf_counter() - t0))
    return {"prompt_tokens": args.prefill_len, "dtype": "float32",
            "engines": {k: stats(v[1:]) for k, v in out.items()}}


def bench_batched(args, bw: float, n_params: int) -> dict:
    from inference_internals.fast import FastLlama
    from inference_internals.model import Llama

    model = Llama.from_pretrained()
    fast = FastLlama(model, kernel="auto", max_len=16 + args.new_tokens + 8)
    bound1 = bw / (n_params * 4)
    res = {}
    for B in args.batches:
        ids = torch.randint(3, 40000, (B, 16), generator=torch.Generator().manual_seed(B))
        rates = []
        for _ in range(max(3, args.reps // 2) + 1):
            t = [time.perf_counter() for _ in fast.generate_stream(ids, args.new_tokens, stop_ids=[])]
            rates.append(B * (len(t) - 1) / (t[-1] - t[0]))
        s = stats(rates[1:])
        res[str(B)] = s | {"pct_of_bound": 100 * s["median"] / (B * bound1)}
    return {"dtype": "float32", "engine": "ours (fast.py)", "aggregate_tok_s": res,
            "note": "bound for batch B: B x batch-1 bound (each weight read once per step, shared by B rows)"}


def bench_batching(args) -> dict:
    """Continuous vs static batching through the paged engine, at equal KV memory.

    Every engine packs each step into one row (``LLMEngine(packed=True)``): static batching
    prefills its batch in one forward, continuous batching also mixes new prompts into the
    decode step. Continuous runs at each ``--watermark`` (blocks kept free at admission, so
    running sequences can grow without preempting); the unpacked engine (one forward per
    prompt, prefill and decode in separate steps) is measured too, to show what packing buys.
    """
    from inference_internals.model import Llama
    from inference_internals.paged.engine import LLMEngine
    from inference_internals.paged.sequence import SamplingParams
    from inference_internals.paged.trace import make_trace

    model = Llama.from_pretrained()
    trace = make_trace(args.requests, prompt_range=(8, 48), output_range=(4, 64), seed=0)
    cap = trace[0].max_new_tokens
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40000, (r.prompt_len,), generator=g).tolist() for r in trace]
    params = [SamplingParams(max_new_tokens=r.output_len, ignore_eos=True) for r in trace]
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
            t0 = time.perf_counter()
            outs = eng.generate(prompts, params)
            dt = time.perf_counter() - t0
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
        out["configs"][kind] = best | {"tok_s_all": [x["tok_s"] for x in rs], "ratio_per_rep": ratios,
                                       "ratio_over_static": statistics.median(ratios)}
    out["static"] = sorted(static, key=lambda x: x["tok_s"])[len(static) // 2] | {
        "tok_s_all": [x["tok_s"] for x in static]}
    out["best"] = max(out["configs"], key=lambda k: out["configs"][k]["ratio_over_static"])
    out["continuous"] = out["configs"][out["best"]]
    out["ratio_continuous_over_static"] = out["continuous"]["ratio_over_static"]
    out["token_identical"] = all(x["token_identical"] for rs in [static, *runs.values()] for x in rs)
    out["setup"] = {"requests": args.requests, "kv_blocks": num_blocks, "block_size": block,
                    "static_reserve_tokens": 48 + cap, "prompt_range": [8, 48], "output_range": [4, 64],
                    "watermarks": args.watermark, "reps": args.batching_reps}
    return out


class FastTarget:
    """fast.py's runner behind the call ``speculative_generate`` makes of a target:
    ``target(ids, cache=..., output_hidden_states=True, last_only=...) -> (logits, [hidden])``.

    The ``KVCache`` it is handed only keeps count (``length``, ``crop``); the K/V live in the
    runner's own preallocated cache, which a crop rolls back by moving the runner's length.
    """

    def __init__(self, runner):
        self.runner, self.config, self.device, self.dtype = runner, runner.config, runner.device, runner.dtype

    def __call__(self, ids, cache, output_hidden_states=False, last_only=False):
        if cache.length == 0:
            self.runner.reset(ids.shape[0])
        self.runner.length = cache.length
        logits, h = self.runner(ids, last_only=last_only, return_hidden=True)
        cache.commit(ids.shape[1])
        return (logits, [h]) if output_hidden_states else logits


def bench_speculative(args, tok) -> dict:
    """Each draft against plain greedy decoding of the same engine, for model.py and fast.py.

    Speeds are decode speeds, first token to last, as in the batch-1 decode section: both sides
    run the same prefill, which speculative decoding does not change. The speed-up including the
    prefill is recorded next to it. The speed-up depends on the engine: a verification pass over
    γ+1 tokens costs more decode steps when the one-token step is fast (fast.py) than when it is
    slow (model.py).
    """
    from inference_internals.drafts import MTPDraft, MTPHeads, PromptLookupDraft
    from inference_internals.fast import FastLlama
    from inference_internals.generate import chat_prompt, generate_stream
    from inference_internals.model import Llama
    from inference_internals.speculative import speculative_generate

    model = Llama.from_pretrained()
    runner = FastLlama(model, kernel="auto", max_len=1024)
    engines = {"model.py": (model, lambda ids, n: generate_stream(model, ids, n)),
               "fast.py": (FastTarget(runner), lambda ids, n: runner.generate_stream(ids, n))}
    drafts = {f"prompt lookup (γ={g}, n≥{n})": (PromptLookupDraft(max_ngram=3, min_ngram=n), g, GROUNDED)
              for g in args.gamma for n in args.min_ngram}
    res = {}
    try:
        drafts["MTP heads (γ=3)"] = (MTPDraft(model, MTPHeads.load()), 3, OPEN_ENDED)
    except FileNotFoundError as e:
        res["MTP heads"] = {"gap": str(e)}
    max_T = max(g for _, g, _ in drafts.values()) + 1
    seconds = {engine: pass_seconds(target, max_T) for engine, (target, _) in engines.items()}
    costs = {engine: [t / ts[1] for t in ts] for engine, ts in seconds.items()}
    for name, (draft, gamma, texts) in drafts.items():
        for engine, (target, plain) in engines.items():
            runs, same = {"plain": [], "spec": []}, True
            tokens = cost = rounds = 0
            for text in texts:
                ids = tok.encode(chat_prompt([{"role": "user", "content": text}]))
                list(plain(ids, 8))  # warm-up
                for _ in range(max(1, args.reps // 2)):
                    t0 = time.perf_counter()
                    ref, stamps = [], []
                    for t in plain(ids, args.spec_tokens):
                        stamps.append(time.perf_counter())
                        ref.append(int(t[0]))
                    runs["plain"].append((len(ref), stamps[-1] - t0, stamps[-1] - stamps[0]))
                    t0 = time.perf_counter()
                    r = speculative_generate(target, ids, draft, args.spec_tokens, gamma=gamma)
                    t = time.perf_counter() - t0
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
    return res


def pass_seconds(model, max_T: int, context: int = 128, reps: int = 5) -> list[float]:
    """``[_, t1, .., t_maxT]``: the best time of one target pass over T new tokens after ``context``
    cached ones (``model``: a model.py ``Llama`` or a ``FastTarget``).

    Speculative decoding assumes t_T ≈ t_1 (a step is bound by reading the weights, whatever T);
    where t_T / t_1 is larger, tokens per pass must exceed it before anything is gained.
    """
    from inference_internals.kv_cache import KVCache

    cache = KVCache.for_model(model, 1, context + max_T)
    best = {}
    with torch.inference_mode():
        model(torch.randint(3, 40000, (1, context), generator=torch.Generator().manual_seed(0)), cache=cache)
        for _ in range(reps):  # sweep every T each rep, so drifting load hits all T alike
            for t in range(1, max_T + 1):
                ids = torch.randint(3, 40000, (1, t), generator=torch.Generator().manual_seed(t))
                cache.crop(context)
                t0 = time.perf_counter()
                model(ids, cache=cache)
                best[t] = min(best.get(t, float("inf")), time.perf_counter() - t0)
    return [float("nan")] + [best[t] for t in range(1, max_T + 1)]


def bench_notebooks() -> dict:
    import nbformat
    from nbclient import NotebookClient

    out = {}
    for nb_path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        t0 = time.perf_counter()
        try:
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(nb_path.parent)}}).execute()
            ok = True
        except Exception as e:  # noqa: BLE001 - a failing notebook is a result, not a crash
            ok = f"{type(e).__name__}: {str(e)[:200]}"
        out[nb_path.name] = {"seconds": time.perf_counter() - t0, "ok": ok}
    return out


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
    if "prefill" in r and "engines" in r["prefill"]:
        add(f"\nprefill, {r['prefill']['prompt_tokens']} tokens, fp32 (tok/s):")
        for k, e in r["prefill"]["engines"].items():
            add(f"  {k:32s} {e['median']:8.0f} ({e['min']:.0f}-{e['max']:.0f})")
    if "batched" in r and "aggregate_tok_s" in r["batched"]:
        add("\nbatched decode, fp32, fast.py (aggregate tok/s):")
        for B, e in r["batched"]["aggregate_tok_s"].items():
            add(f"  B={B:>3s} {e['median']:8.1f} ({e['min']:.1f}-{e['max']:.1f})  {e['pct_of_bound']:5.0f}% of B x bound")
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
    p.add_argument("--spec-tokens", type=int, default=48)
    p.add_argument("--gamma", type=int, nargs="+", default=[4, 8, 12],
                   help="guesses per round for prompt lookup (each one measured)")
    p.add_argument("--min-ngram", type=int, nargs="+", default=[1, 2],
                   help="prompt lookup's shortest match worth a guess (each one measured at every γ)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--no-compile", action="store_true", help="skip fast.py's torch.compile'd decode step")
    p.add_argument("--only", nargs="+", help="sections: decode prefill batched batching speculative")
    p.add_argument("--notebooks", action="store_true", help="also time every chapter notebook (slow)")
    p.add_argument("--note", default="", help="free text stored in the JSON (e.g. 'under load')")
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    a = p.parse_args(argv)
    if a.quick:
        a.reps, a.new_tokens, a.prefill_len, a.batches, a.requests, a.spec_tokens, a.batching_reps = 2, 12, 64, [1, 4], 8, 24, 1
    if a.threads:
        torch.set_num_threads(a.threads)
    from inference_internals.hardware import measure_bandwidth, measure_matmul
    from inference_internals.model import Llama, count_parameters, load_tokenizer

    r = {"machine": machine_info(), "note": a.note, "args": {k: str(v) for k, v in vars(a).items()}}
    tok = load_tokenizer()
    n_params = count_parameters(Llama.from_pretrained())
    r["n_params"] = n_params
    bws = [measure_bandwidth("cpu", budget_s=1.0)["read"]]
    # fp32 matmul ceiling: with the bandwidth it places the critical batch, where a pass over
    # more tokens stops being free (the speculative section's verify passes)
    flops = [measure_matmul("cpu", torch.float32, budget_s=2.0)]
    sections = a.only or ["decode", "prefill", "batched", "batching", "speculative"]
    jobs = {"decode": lambda: bench_decode(a, max(bws), tok, n_params),
            "prefill": lambda: bench_prefill(a, tok),
            "batched": lambda: bench_batched(a, max(bws), n_params),
            "batching": lambda: bench_batching(a),
            "speculative": lambda: bench_speculative(a, tok)}
    for s in sections:
        print(f"[{time.strftime('%H:%M:%S')}] {s} ...", file=sys.stderr, flush=True)
        try:
            r[s] = jobs[s]()
        except Exception as e:  # noqa: BLE001 - report the gap, run the rest
            r[s] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-1500:]}
        bws.append(measure_bandwidth("cpu", budget_s=0.5)["read"])  # the best of the run is the ceiling
    if a.notebooks:
        r["notebooks"] = bench_notebooks()
    r["bandwidth_GB_s"] = max(bws) / 1e9
    _rebase(r, max(bws), n_params)
    r["bandwidth_samples_GB_s"] = [b / 1e9 for b in bws]
    flops.append(measure_matmul("cpu", torch.float32, budget_s=2.0))
    r["matmul_fp32_GFLOP_s"] = max(flops) / 1e9
    r["machine"]["load_avg_end"] = os.getloadavg()
    print(table(r))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(r, indent=1, default=str))
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
