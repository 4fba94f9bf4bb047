"""Our door engine against llama.cpp at its best: the shipped Q4_1 file and the same model requantized to
Q4_0 (the format llama.cpp's x86 backend repacks into its interleaved layout), decode after 128 to 8K
tokens of context, and the prefill of each prompt, interleaved round by round in one run.

    make bench-peers BENCH_ARGS="--only llama_cpp_best --out benchmarks/results/llama_cpp_best.json"

The Q4_0 file is made once by llama.cpp's own ``llama_model_quantize`` in the peers' venv (embedding kept
Q8_0, as in the shipped file) into ``cache_root()/gguf/``; ours reads the same file through the door,
``LLM(model=that_file, quantization="q4_1", compile=True)``: Q4_0 is Q4_1 without the minimum, the
same block kernels; its KV cache in fp32 (the model's dtype) and in f16, as llama.cpp keeps its own. llama.cpp's flash-attention setting is the faster of on and off at the longest
context, measured first. Each step's bytes: the weights as read (ours: ``weight_bytes_read``; llama.cpp:
the file's size) plus the KV cache of the context (in the dtype each engine keeps it); the
law divides them by the median of the run's bandwidth samples. What requantizing costs: top-1
agreement and KL against fp32 over the Zen of Python, both files through the same kernels.
"""
from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import torch

from .common import stats
from .decode import round_ratios

CONTEXTS = (128, 512, 1024, 4096, 8128)  # 8128 + 64 new tokens = SmolLM2's 8192 positions
QUICK_CONTEXTS = (128, 512)  # --quick: a smoke test of the section
NEW_TOKENS = 64
OURS_Q4_1 = "ours Q4_1 (the door, compiled)"
OURS_Q4_1_F16, OURS_Q4_0_F16 = "ours Q4_1, f16 KV cache", "ours Q4_0, f16 KV cache"
# ours: (name, which file, the KV cache's dtype: the model's fp32, or f16 as llama.cpp keeps it)
OURS = ((OURS_Q4_1, "Q4_1", torch.float32), (OURS_Q4_1_F16, "Q4_1", torch.float16),
        (OURS_Q4_0_F16, "Q4_0", torch.float16))
CPP_Q4_1, CPP_Q4_0 = "llama.cpp Q4_1", "llama.cpp Q4_0 (repacked)"
Q4_0_FILE = "SmolLM2-135M-Instruct.Q4_0.gguf"
KERNELS = {"dtype": torch.float32, "weights": "q4_1", "head": "q8_0", "quant_kernel": {"int4": "vnni", "q8_0": "vnni"}}


def q4_0_file(python: str) -> Path:
    """The shipped file requantized to Q4_0 by the peer's llama.cpp, made once (written aside, then renamed)."""
    from inference_internals.weights import cache_root, gguf_path

    from . import peer_llama_cpp

    out = cache_root() / "gguf" / Q4_0_FILE
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        subprocess.run([python, peer_llama_cpp.__file__, "--quantize", str(gguf_path()), str(tmp)], check=True,
                       capture_output=True)
        tmp.rename(out)
    return out


def _ours(model, kv_dtype):
    from inference_internals.generate import generate_stream
    from inference_internals.kv_cache import KVCache

    def run(prompt, n):
        # the cache made before the clock starts, as llama.cpp's context is made with the peer
        cache = KVCache.for_model(model, 1, len(prompt) + n, kv_dtype)
        t0 = time.perf_counter()
        return t0, [time.perf_counter() for _ in generate_stream(model, prompt, n, stop_ids=[], cache=cache)]
    return run


def _theirs(peer):
    def run(prompt, n):
        stamps = peer.decode(prompt, n)
        return peer.last_t0, stamps
    return run


def bench_llama_cpp_best(args, device) -> dict:
    from inference_course.prompts import zen_of_python
    from inference_internals import LLM
    from inference_internals.analysis.roofline import measure_bandwidth
    from inference_internals.bpe import BPETokenizer
    from inference_internals.kv_cache import kv_cache_bytes
    from inference_internals.optimize import weight_bytes_read
    from inference_internals.timing import Load
    from inference_internals.weights import gguf_path

    from .breakdown import bench_quality
    from .peer_llama_cpp import LlamaCppPeer, peers_python

    python = peers_python(args.peers_python)
    if device.type != "cpu" or python is None:
        return {"unmeasured": "llama.cpp is compared on a CPU, with its venv (`make bench-peers`)"}
    threads = torch.get_num_threads()
    q4_0 = q4_0_file(python)
    files = {"Q4_1": gguf_path(), "Q4_0": q4_0}
    contexts = QUICK_CONTEXTS if args.quick else CONTEXTS
    res = {"files": {k: {"name": p.name, "MB": p.stat().st_size / 1e6} for k, p in files.items()},
           "contexts": list(contexts), "new_tokens": NEW_TOKENS, "rounds": args.reps, "threads": threads}
    tok = BPETokenizer.from_pretrained()
    text = tok.encode(zen_of_python())
    prompts = {c: (text * (c // len(text) + 1))[:c] for c in contexts}
    n_ctx = max(contexts) + NEW_TOKENS

    # llama.cpp's flash attention: the faster setting at the longest context, on the Q4_0 file
    probe = {}
    for fa in (False, True):
        with LlamaCppPeer(python, q4_0, threads, n_ctx=n_ctx, flash_attn=fa) as peer:
            peer.decode(prompts[contexts[0]], 8)
            stamps = peer.decode(prompts[max(contexts)], 16)
            probe["on" if fa else "off"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    flash = probe["on"] >= probe["off"]
    res["flash_attn_probe_tok_s"] = probe | {"chosen": "on" if flash else "off"}

    engines, peers = {}, []
    try:
        for name, path in ((CPP_Q4_1, files["Q4_1"]), (CPP_Q4_0, q4_0)):
            peer = LlamaCppPeer(python, path, threads, n_ctx=n_ctx, flash_attn=flash)
            peers.append(peer)
            engines[name] = _theirs(peer)
            res.setdefault("llama_cpp", {k: peer.info.get(k) for k in ("version", "system_info", "extra_bufts",
                                                                        "fallback") if k in peer.info})
        models, loaded, kv_dtype = {}, {}, {}
        for name, file, dtype in OURS:
            t0 = time.perf_counter()
            if file not in loaded:
                model_arg = None if file == "Q4_1" else str(q4_0)
                loaded[file] = LLM(model=model_arg, device="cpu", quantization="q4_1", compile=True).model
            models[name], kv_dtype[name] = loaded[file], dtype
            engines[name] = _ours(loaded[file], dtype)
            # compiles the decode step, outside the rounds: its graph up to 4,096 stored tokens and the one past
            engines[name](prompts[contexts[0]], 4)
            if max(contexts) > 4096:
                engines[name](prompts[max(contexts)], 2)
            res.setdefault("build_s", {})[name] = time.perf_counter() - t0
        cfg = models[OURS_Q4_1].config
        step_bytes = {}
        for name in engines:
            weights = weight_bytes_read(models[name]) if name in models else files[
                "Q4_0" if name == CPP_Q4_0 else "Q4_1"].stat().st_size
            itemsize = kv_dtype[name].itemsize if name in models else 2  # llama.cpp's cache: f16
            step_bytes[name] = {c: weights + kv_cache_bytes(cfg, c, 1, itemsize) for c in contexts}  # chapter 4's
        for e in engines.values():  # a warm round, each engine once, at the shortest context
            e(prompts[contexts[0]], NEW_TOKENS)
        decode = {c: {k: [] for k in engines} for c in contexts}
        prefill = {c: {k: [] for k in engines} for c in contexts}
        tokens = {}
        bws = [measure_bandwidth(device, budget_s=0.5)["read"]]
        with Load() as load:
            for c in contexts:
                for _ in range(args.reps):
                    for name, run in engines.items():  # interleaved: A, B, C, D, A, B, ...
                        t0, stamps = run(prompts[c], NEW_TOKENS)
                        decode[c][name].append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
                        prefill[c][name].append(c / (stamps[0] - t0))
                bws.append(measure_bandwidth(device, budget_s=0.5)["read"])
        for name, p in zip((CPP_Q4_1, CPP_Q4_0), peers):
            tokens[name] = p.last_tokens
    finally:
        for p in peers:
            p.close()
    bw = statistics.median(bws)
    res["bandwidth_GB_s"] = {"median": bw / 1e9, "samples": [b / 1e9 for b in bws]}
    res["load"] = {"others_busy_cores": load.others, "seconds": load.seconds,
                   "note": "others_busy_cores counts the llama.cpp workers too: they are among the candidates"}
    res["decode"], res["prefill"] = {}, {}
    for c in contexts:
        res["decode"][c] = {k: stats(v) | {"law_tok_s": bw / step_bytes[k][c], "step_MB": step_bytes[k][c] / 1e6,
                                           "pct_of_law": 100 * statistics.median(v) * step_bytes[k][c] / bw}
                            for k, v in decode[c].items()}
        res["prefill"][c] = {k: stats(v) for k, v in prefill[c].items()}
        for ours in models:
            for theirs in (CPP_Q4_1, CPP_Q4_0):
                res["decode"][c][ours][f"vs {theirs}"] = round_ratios(decode[c][ours], decode[c][theirs])
                res["prefill"][c][ours][f"vs {theirs}"] = round_ratios(prefill[c][ours], prefill[c][theirs])
    # the last round's tokens at the longest context: ours against llama.cpp on the same file
    from .decode import common_prefix
    from inference_internals.generate import generate_stream
    from inference_internals.kv_cache import KVCache

    longest = prompts[max(contexts)]
    mine = {k: [int(t[0]) for t in generate_stream(m, longest, NEW_TOKENS, stop_ids=[], cache=KVCache.for_model(
        m, 1, len(longest) + NEW_TOKENS, kv_dtype[k]))] for k, m in models.items()}
    res["same_prefix_tokens"] = {k: common_prefix(mine[k], tokens[CPP_Q4_1 if file == "Q4_1" else CPP_Q4_0])
                                 for k, file, _ in OURS} | {"of": NEW_TOKENS}
    del models, engines, loaded
    res["quality"] = bench_quality(args, device, {"Q4_1 (shipped)": KERNELS, "Q4_0 (requantized)": KERNELS | {"gguf": q4_0}})
    return res
