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


# --- every weight format, eager and compiled, beside Hugging Face and llama.cpp, in one run -----

QUANT_FORMATS = {  # engine name -> optimize() arguments; fp32/bf16: the same engine unquantized
    "ours fp32": {"dtype": torch.float32},
    "ours bf16": {"dtype": torch.bfloat16},
    "ours int8": {"dtype": torch.bfloat16, "weights": "int8"},
    "ours q8_0": {"dtype": torch.bfloat16, "weights": "q8_0"},
    "ours int4 g32": {"dtype": torch.bfloat16, "weights": "int4", "group": 32},
    "ours int4 g64": {"dtype": torch.bfloat16, "weights": "int4", "group": 64},
    "ours Q4_1 (the GGUF's blocks)": {"dtype": torch.bfloat16, "weights": "q4_1"},
    # a lever, not the default: the tied LM head (a fifth of the weights) in int4 too; it changes tokens
    # (the quality section gives its top-1 agreement and KL against fp32)
    "ours Q4_1, int4 LM head": {"dtype": torch.bfloat16, "weights": "q4_1", "head": "int4"},
    # the file's own formats (Q4_1 layers, its Q8_0 head: the bytes llama.cpp reads) with fp32 activations, the
    # kernels' fp32 form: the quality section's closest engine to fp32
    "ours Q4_1, Q8_0 head, fp32 activations": {"dtype": torch.float32, "weights": "q4_1", "head": "q8_0",
                                               "quant_kernel": {"int4": "int4_mm_fp32", "q8_0": "int4x2_mm_fp32"}},
    # the file's own formats through the block kernels (blockdot.py, a CPU with AVX-512 VNNI): integer dot
    # products as llama.cpp takes them, each activation two int8 codes per 32; where they cannot build, the row says why
    "ours Q4_1, Q8_0 head, VNNI kernels": {"dtype": torch.float32, "weights": "q4_1", "head": "q8_0",
                                           "quant_kernel": {"int4": "vnni", "q8_0": "vnni"}},
    # int8 that keeps the model: 8-bit codes with a scale and a minimum per 32, whose grid holds the file's Q4_1
    # blocks, through the block kernels (= LLM(quantization="int8_asym") where they build)
    "ours int8_asym, Q8_0 head, VNNI kernels": {"dtype": torch.float32, "weights": "int8_asym", "head": "q8_0",
                                                "quant_kernel": {"int8_asym": "vnni", "q8_0": "vnni"}},
}
# The format rows run torch's kernels: 'auto' would also time the block kernels (blockdot.py) where the
# CPU has them, and those have rows of their own (quant_kernel 'vnni'). On a GPU, 'auto' has only torch's.
TORCH_KERNELS = {"int8": "int8_mm", "q8_0": "int4x2_mm", "int4": "int4_mm", "int8_asym": "int4x2_mm"}


def optimize_args(kw: dict, device) -> dict:
    """``kw`` as ``optimize`` takes it here: a quantized format without a kernel named gets torch's
    (on a CPU; 'auto' elsewhere)."""
    if kw.get("weights") and "quant_kernel" not in kw and torch.device(device).type == "cpu":
        return kw | {"quant_kernel": TORCH_KERNELS}
    return kw


HF_GENERATE = {"Hugging Face generate() fp32": torch.float32, "Hugging Face generate() bf16": torch.bfloat16}
LLAMA_CPP = "llama.cpp (Q4_1 GGUF)"
COMPILED = " compiled"  # suffix of a compiled engine's name


def quant_format(kw: dict) -> str:
    """The short name of a format (``--formats`` takes these): fp32, bf16, int8, int4 g32, q4_1 ..."""
    if kw.get("weights") is None:
        return {torch.float32: "fp32", torch.bfloat16: "bf16"}[kw["dtype"]]
    name = kw["weights"] if kw["weights"] == "q4_1" or "group" not in kw else f'{kw["weights"]} g{kw["group"]}'
    return (name + (f' {kw["head"]}-head' if kw.get("head") else "")
            + (" fp32-act" if "_fp32" in str(kw.get("quant_kernel", "")) else "")
            + (" vnni" if "vnni" in str(kw.get("quant_kernel", "")) else ""))


def build_format(device, kw: dict, compile_like=None):
    """A fresh model optimized to ``kw``; with ``compile_like`` (an eager model of the same format),
    compiled, with that model's kernel choices (no second timing of the candidates)."""
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize

    model = Llama.from_pretrained(device=device, dtype=torch.float32)
    if compile_like is None:
        return optimize(model, **optimize_args(kw, device))
    kw = {k: v for k, v in kw.items() if k != "quant_kernel"}  # the eager model's choices stand for it
    return optimize(model, **kw, kernel=compile_like.kernels or "auto",
                    quant_kernel=compile_like.quant_kernels or "auto", compile=True)


def round_ratios(a: list[float], b: list[float]) -> dict:
    """``a ÷ b`` round by round (two engines' rates from the same rounds), as stats and the rounds."""
    from inference_internals.timing import ratio

    s = ratio(a, b)
    return {"median": s.median, "min": min(s.values), "max": max(s.values), "rounds": list(s.values)}


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def bench_quantized(args, device, bw: float, tok) -> dict:
    """Batch-1 decode of the same engine at every weight format, eager and compiled, of Hugging Face
    ``generate()`` at fp32 and bf16, and of llama.cpp on the model's own GGUF (a worker process run by
    another venv's interpreter, ``peer_llama_cpp.py``), all interleaved round by round in one run;
    each against its own bandwidth bound (its bytes per token), and as per-round ratios to llama.cpp
    and to Hugging Face fp32."""
    from inference_internals.device import cpu_cores
    from inference_internals.generate import generate
    from inference_internals.model import load_reference
    from inference_internals.optimize import weight_bytes_read
    from inference_internals.timing import Load, Spread, says
    from inference_internals.weights import gguf_path

    from .peer_llama_cpp import LlamaCppPeer, peers_python

    prompt = tok.encode("The history of the printing press begins")
    formats = {k: kw for k, kw in QUANT_FORMATS.items() if not args.formats or quant_format(kw) in args.formats}
    models, res = {}, {"engines": {}}
    for name, kw in formats.items():
        t0 = time.perf_counter()
        m = models[name] = build_format(device, kw)
        e = res["engines"][name] = {"build_s": time.perf_counter() - t0, "weight_MB": weight_bytes_read(m) / 1e6,
                                    "format": quant_format(kw), "compiled": False, "kernels": m.kernels or None,
                                    "quant_kernels": getattr(m, "quant_kernels", None) or None}
        if args.no_compile:
            continue
        try:  # the first one-token step compiles the graph: timed here, outside the measured rounds
            t0 = time.perf_counter()
            c = build_format(device, kw, compile_like=m)
            generate(c, prompt, 3, stop_ids=[])
            models[name + COMPILED] = c
            res["engines"][name + COMPILED] = e | {"compiled": True, "compile_s": time.perf_counter() - t0}
        except Exception as err:  # noqa: BLE001 - e.g. no C++ compiler: report it, measure the rest
            e["compile_error"] = f"{type(err).__name__}: {err}"[:500]
    runners = {k: ours_stream(m) for k, m in models.items()}
    for name, dtype in HF_GENERATE.items():
        hf = load_reference(device=device, dtype=dtype)
        runners[name] = hf_stream(hf, device)
        res["engines"][name] = {"weight_MB": sum(p.numel() * p.element_size() for p in hf.parameters()) / 1e6,
                                "format": quant_format({"dtype": dtype}), "compiled": False}
    python, peer = peers_python(args.peers_python), None
    if device.type != "cpu":
        res["llama_cpp"] = "unmeasured: llama.cpp is compared on a CPU only"
    elif python is None:
        res["llama_cpp"] = ("unmeasured: no llama.cpp peer here (`make bench-peers` builds .venv-peers with "
                            "llama-cpp-python; --peers-python or PEERS_PYTHON names another interpreter that has it)")
    else:
        try:
            peer = LlamaCppPeer(python, gguf_path(), torch.get_num_threads())  # the same threads as ours
            runners[LLAMA_CPP] = peer.decode
            res["llama_cpp"] = {k: peer.info[k] for k in ("version", "threads", "system_info", "extra_bufts", "fallback")
                                if k in peer.info} | {"python": python}
            res["engines"][LLAMA_CPP] = {"weight_MB": gguf_path().stat().st_size / 1e6, "format": "llama.cpp",
                                         "compiled": False}  # it reads its file's blocks
        except (OSError, RuntimeError, ValueError) as err:
            res["llama_cpp"] = f"unmeasured: the llama.cpp peer did not start: {err}"[:1000]
    try:
        peer_cpu = peer.cpu_seconds() if peer else None
        with Load() as load:
            rates = decode_rates(runners, prompt, args.new_tokens, args.reps)
        if peer:
            cpp_tokens = peer.last_tokens
            spent = peer.cpu_seconds()
            if load.others is not None and None not in (peer_cpu, spent):
                # the peer is one of the candidates, not another program
                load.others = max(0.0, load.others - (spent - peer_cpu) / load.seconds)
    finally:
        if peer:
            peer.close()
    res["load"] = {"others_busy_cores": load.others, "cores": cpu_cores(), "seconds": load.seconds}
    for k, v in rates.items():
        e = res["engines"][k]
        bound = bw / (e["weight_MB"] * 1e6)
        e.update(stats(v) | {"bound_tok_s": bound, "pct_of_bound": 100 * statistics.median(v) / bound})
    ours = [k for k in rates if k.startswith("ours")]
    hf32 = next(iter(HF_GENERATE))
    res["vs_hf"] = {k: round_ratios(rates[k], rates[hf32]) for k in rates if k != hf32}
    res["vs_llama_cpp"] = {k: round_ratios(rates[k], rates[LLAMA_CPP]) for k in rates if k != LLAMA_CPP} \
        if LLAMA_CPP in rates else {}
    res["compiled_vs_eager"] = {k: round_ratios(rates[k + COMPILED], rates[k]) for k in ours if k + COMPILED in rates}
    # the headline never takes a lever that changes the tokens: the LM head requantized to int4 (top-1 90.6%
    # against fp32); the file's own Q8_0 head ("q8_0-head") is what llama.cpp reads
    res["best"] = max((k for k in ours if "int4-head" not in res["engines"][k]["format"]),
                      key=lambda k: res["engines"][k]["median"])
    # the course's own targets for the quantized engine, each a per-round ratio
    goals = {"int8 >= 1.6x fp32": ("ours int8", "ours fp32", 1.6), "int8 >= 1.2x bf16": ("ours int8", "ours bf16", 1.2),
             "best >= 0.6x llama.cpp": (res["best"], LLAMA_CPP, 0.6)}
    res["ratios"], res["targets"] = {}, {}
    for goal, (a, b, want) in goals.items():
        if a in rates and b in rates:
            r = res["ratios"][f"{a} / {b}"] = round_ratios(rates[a], rates[b])
            res["targets"][goal] = says(Spread(r["rounds"]), want, "met", "missed", "could not tell")
        else:
            res["targets"][goal] = "unmeasured"
    q4 = next((k for k in ours if res["engines"][k]["format"] == "q4_1" and not res["engines"][k]["compiled"]), None)
    if LLAMA_CPP in rates:  # the same Q4_1 blocks, but llama.cpp also rounds each activation to 8 bits
        # (its Q4_1 x Q8_1 dot products) and keeps the LM head as the GGUF's Q8_0 blocks: agreement, not equality
        theirs = {k: generate(models[k], prompt, len(cpp_tokens), stop_ids=[]) for k in (q4, "ours fp32") if k in models}
        # how many tokens agree before the first difference (after it, the two continue different texts)
        res["llama_cpp_tokens"] = {"n": len(cpp_tokens), "tokens": cpp_tokens,
                                   "same_prefix_as_llama_cpp": {k: common_prefix(cpp_tokens, t) for k, t in theirs.items()}}
        if len(theirs) == 2:
            res["llama_cpp_tokens"]["same_prefix_q4_1_as_fp32"] = common_prefix(*theirs.values())
    res |= {"rounds": args.reps, "new_tokens": args.new_tokens, "prompt_tokens": len(prompt), "order": list(runners),
            "note": "weight_MB: bytes one step reads (codes packed, 16-bit scales, the 8-bit LM head)"
                    + (f"; llama.cpp: the GGUF's {res['engines'][LLAMA_CPP]['weight_MB']:.0f} MB" if LLAMA_CPP in rates else "")}
    return res
