"""Batch-1 decode (ours plain, ours optimized, optimized and compiled, Hugging Face), prefill, and
batched decode on the optimized model."""
from __future__ import annotations

import statistics
import time

import torch

from inference_internals.device import synchronize
from inference_internals.timing import clock

from .common import OPTIMIZED, PLAIN, load_engines, stats


class _Stamps:
    """A Hugging Face streamer that only notes when each token arrives."""

    def __init__(self, device):
        self.t, self.device = [], device

    def put(self, value):
        self.t.append(clock(self.device))

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


def ours_stream(model):
    from inference_internals.generate import generate_stream

    def run(prompt, n):
        # a token is ready when its id is: the loop reads each one back before the next step
        return [clock(model.device) for _ in generate_stream(model, prompt, n, stop_ids=[])]
    return run


def hf_stream(hf, device):
    def run(prompt, n):
        s = _Stamps(device)
        ids = torch.tensor([prompt], device=device)
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False, streamer=s, pad_token_id=hf.config.eos_token_id)
        return s.t[1:]  # the first put is the prompt
    return run


def engine_name(kind: str) -> str:
    return {PLAIN: "ours (plain model)", OPTIMIZED: "ours (optimized)"}[kind]


def bench_decode(args, device, bw: float, tok, n_params: int) -> dict:
    from inference_internals.generate import generate
    from inference_internals.model import Llama, load_reference
    from inference_internals.optimize import optimize

    prompt = tok.encode("The history of the printing press begins")
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        hf = load_reference(device=device, dtype=dtype)
        t0 = time.perf_counter()
        engines = load_engines(device, dtype)
        extra = {"optimize_s": time.perf_counter() - t0, "kernels": engines[OPTIMIZED].kernels}
        ours = {engine_name(k): m for k, m in engines.items()}
        if not args.no_compile:
            try:  # the first one-token step compiles the graph: timed here, outside the measured runs
                t0 = time.perf_counter()
                compiled = optimize(Llama.from_pretrained(device=device, dtype=dtype),
                                    kernel=extra["kernels"], compile=True)
                generate(compiled, prompt, 3, stop_ids=[])
                ours["ours (optimized, compiled)"] = compiled
                extra["compile_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: report it, measure the rest
                extra["compile_error"] = f"{type(e).__name__}: {e}"[:500]
        with torch.inference_mode():
            hf_tokens = hf.generate(torch.tensor([prompt], device=device), max_new_tokens=16, min_new_tokens=16,
                                    do_sample=False, pad_token_id=2)[0, len(prompt):].tolist()
        runners = {k: ours_stream(m) for k, m in ours.items()} | {"Hugging Face generate()": hf_stream(hf, device)}
        rates = decode_rates(runners, prompt, args.new_tokens, args.reps)
        bound = bw / (n_params * dtype.itemsize)
        hf_rates = rates["Hugging Face generate()"]
        speedup = {k: statistics.median(a / b for a, b in zip(rates[k], hf_rates)) for k in ours}
        res[name] = extra | {
            "bound_tok_s": bound,
            "same_16_tokens_as_hf": {k: generate(m, prompt, 16, stop_ids=[]) == hf_tokens for k, m in ours.items()},
            "engines": {k: stats(v) | {"pct_of_bound": 100 * statistics.median(v) / bound,
                                       "vs_hf": statistics.median(v) / statistics.median(hf_rates)}
                        for k, v in rates.items()},
            # median over repetitions of (ours ÷ HF) in the same repetition, per engine of ours
            "speedup_vs_hf": speedup, "best": max(speedup, key=speedup.get)}
        del hf, engines, ours
    return res


def bench_prefill(args, device, tok) -> dict:
    from inference_internals.kv_cache import KVCache
    from inference_internals.model import load_reference

    engines, hf = load_engines(device), load_reference(device=device)
    ids = torch.randint(3, 40000, (1, args.prefill_len), generator=torch.Generator().manual_seed(0)).to(device)
    caches = {k: KVCache.for_model(m, 1, args.prefill_len) for k, m in engines.items()}

    def ours(kind):
        def run():
            caches[kind].reset()
            engines[kind](ids, cache=caches[kind], last_only=True)
        return run

    runners = {engine_name(k): ours(k) for k in engines} | {"Hugging Face forward": lambda: hf(ids, logits_to_keep=1)}
    out = {k: [] for k in runners}
    with torch.inference_mode():
        for _ in range(args.reps + 1):
            for k, fn in runners.items():
                t0 = clock(device)
                fn()
                out[k].append(args.prefill_len / (clock(device) - t0))
    return {"prompt_tokens": args.prefill_len, "dtype": "float32",
            "engines": {k: stats(v[1:]) for k, v in out.items()}}


def bench_batched(args, device, bw: float, n_params: int) -> dict:
    from inference_internals.generate import generate_stream

    model = load_engines(device)[OPTIMIZED]
    bound1 = bw / (n_params * 4)
    res = {}
    for B in args.batches:
        ids = torch.randint(3, 40000, (B, 16), generator=torch.Generator().manual_seed(B)).to(device)
        rates = []
        for _ in range(max(3, args.reps // 2) + 1):
            t = [clock(device) for _ in generate_stream(model, ids, args.new_tokens, stop_ids=[])]
            rates.append(B * (len(t) - 1) / (t[-1] - t[0]))
        s = stats(rates[1:])
        res[str(B)] = s | {"pct_of_bound": 100 * s["median"] / (B * bound1)}
    synchronize(device)
    return {"dtype": "float32", "engine": engine_name(OPTIMIZED), "aggregate_tok_s": res,
            "note": "bound for batch B: B x batch-1 bound (each weight read once per step, shared by B rows)"}


# --- quantized weights (optimize(weights=...)) and, when installed, llama.cpp on the same GGUF ----

QUANT_FORMATS = {  # engine name -> optimize() arguments; fp32/bf16: the same engine unquantized
    "ours fp32": {"dtype": torch.float32},
    "ours bf16": {"dtype": torch.bfloat16},
    "ours int8": {"dtype": torch.bfloat16, "weights": "int8"},
    "ours int4 g32": {"dtype": torch.bfloat16, "weights": "int4", "group": 32},
    "ours int4 g64": {"dtype": torch.bfloat16, "weights": "int4", "group": 64},
    "ours Q4_1 (the GGUF's blocks)": {"dtype": torch.bfloat16, "weights": "q4_1"},
}


def llama_cpp_stream(n_threads: int | None = None):
    """llama.cpp (``llama-cpp-python``) decoding the model's own GGUF, or None when not importable."""
    try:
        import llama_cpp
    except ImportError:
        return None
    from inference_internals.weights import gguf_path

    llm = llama_cpp.Llama(model_path=str(gguf_path()), n_ctx=512, n_threads=n_threads or torch.get_num_threads(),
                          verbose=False)

    def run(prompt, n):
        stamps = []
        llm.reset()
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == n:
                break
        return stamps
    return run


def bench_quantized(args, device, bw: float, tok) -> dict:
    """Batch-1 decode of the same engine at every weight format, interleaved with llama.cpp on the
    GGUF when it is installed; each against its own bandwidth bound (its bytes per token)."""
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize, weight_bytes_read

    prompt = tok.encode("The history of the printing press begins")
    models, res = {}, {"engines": {}}
    for name, kw in QUANT_FORMATS.items():
        t0 = time.perf_counter()
        models[name] = optimize(Llama.from_pretrained(device=device, dtype=torch.float32), **kw)
        m = models[name]
        res["engines"][name] = {"build_s": time.perf_counter() - t0, "weight_MB": weight_bytes_read(m) / 1e6,
                                "kernels": m.kernels or None, "quant_kernels": getattr(m, "quant_kernels", None) or None}
    runners = {k: ours_stream(m) for k, m in models.items()}
    cpp = llama_cpp_stream() if device.type == "cpu" else None
    if cpp is not None:
        runners["llama.cpp (Q4_1 GGUF)"] = cpp
    else:
        res["llama_cpp"] = "unmeasured: llama_cpp (llama-cpp-python) is not importable here" \
            if device.type == "cpu" else "unmeasured: llama.cpp is compared on a CPU only"
    rates = decode_rates(runners, prompt, args.new_tokens, args.reps)
    gguf_mb = None
    for k, v in rates.items():
        e = res["engines"].setdefault(k, {})
        if k.startswith("llama.cpp"):
            from inference_internals.weights import gguf_path
            gguf_mb = e["weight_MB"] = gguf_path().stat().st_size / 1e6  # it reads its file's blocks
        bound = bw / (e["weight_MB"] * 1e6)
        e.update(stats(v) | {"bound_tok_s": bound, "pct_of_bound": 100 * statistics.median(v) / bound})
    med = {k: statistics.median(v) for k, v in rates.items()}
    # ratios within each repetition, then their median (the robust figure on a shared machine)
    ratio = {f"{a} / {b}": statistics.median(x / y for x, y in zip(rates[a], rates[b]))
             for a, b in [("ours int8", "ours fp32"), ("ours int8", "ours bf16"), ("ours int4 g32", "ours fp32")]}
    best = max((k for k in med if k.startswith("ours") and k not in ("ours fp32", "ours bf16")), key=med.get)
    if cpp is not None:
        ratio[f"{best} / llama.cpp"] = statistics.median(
            x / y for x, y in zip(rates[best], rates["llama.cpp (Q4_1 GGUF)"]))
    res |= {"ratios": ratio, "best_quantized": best,
            "targets": {"int8 >= 1.6x fp32": ratio["ours int8 / ours fp32"] >= 1.6,
                        "int8 >= 1.2x bf16": ratio["ours int8 / ours bf16"] >= 1.2,
                        "best >= 0.6x llama.cpp": (ratio[f"{best} / llama.cpp"] >= 0.6) if cpp else "unmeasured"},
            "note": "weight_MB: bytes one step reads (codes packed, 16-bit scales, the 8-bit LM head)"
                    + (f"; llama.cpp: the GGUF's {gguf_mb:.0f} MB" if gguf_mb else "")}
    return res
