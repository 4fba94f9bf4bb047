"""Gemma 3 270M, batch-1 decode: our engine at each weight format beside Hugging Face's
``Gemma3ForCausalLM`` and llama.cpp on the same Q4_K_M file, interleaved round by round in one run.

    .venv-peers/bin/python: make bench-peers BENCH_ARGS="--only gemma --out benchmarks/results/gemma.json"

Chapter 7 shows the committed run (benchmarks/results/gemma.json). Each engine is described by the
bytes one decode step reads: ours as stored (``weight_bytes_read``), Hugging Face's fp32 parameters
(the tied head counted once), llama.cpp's the GGUF file's size (its K-quant tensors as stored, the
tied 262k x 640 embedding read whole as the LM head, and a few MB of metadata). We have no Q4_K kernel: our 4-bit
rows are the same weights requantized to int4 in groups of 32 (bf16 scales), the closest format our
kernels run; llama.cpp reads the file's own super-blocks.
"""
from __future__ import annotations

import copy
import time

import torch

from .common import stats
from .decode import common_prefix, decode_rates, hf_stream, ours_stream, round_ratios

MODEL = "gemma-3-270m"
PROMPT = "The history of the printing press begins"
LLAMA_CPP = "llama.cpp (Q4_K_M GGUF)"
HF = "Hugging Face generate() fp32"
# name: optimize() arguments (None: the model as loaded, fp32)
FORMATS = {"ours fp32": None,
           "ours bf16": {"dtype": torch.bfloat16},
           "ours int8": {"dtype": torch.bfloat16, "weights": "int8"},
           "ours int4 g32": {"dtype": torch.bfloat16, "weights": "int4", "group": 32},
           "ours int4 g32, 4-bit head": {"dtype": torch.bfloat16, "weights": "int4", "group": 32, "head": "int4"}}


def bench_gemma(args, device) -> dict:
    from inference_internals.device import cpu_cores
    from inference_internals.generate import generate
    from inference_internals.model import Llama, load_reference
    from inference_internals.optimize import optimize, weight_bytes_read
    from inference_internals.spm import SentencePieceBPE
    from inference_internals.timing import Load
    from inference_internals.weights import gguf_path

    from .peer_llama_cpp import LlamaCppPeer, peers_python

    tok = SentencePieceBPE.from_pretrained(MODEL)
    prompt = [tok.bos_id] + tok.encode(PROMPT)
    base = Llama.from_pretrained(MODEL, device=device, dtype="fp32")
    models, res = {}, {"engines": {}}
    for name, kw in FORMATS.items():
        m = base if kw is None else optimize(copy.deepcopy(base), **kw)
        models[name] = m
        res["engines"][name] = {"weight_MB": weight_bytes_read(m) / 1e6, "format": name.removeprefix("ours ")}
    runners = {k: ours_stream(m) for k, m in models.items()}
    hf = load_reference(MODEL, device=device, dtype=torch.float32)
    runners[HF] = hf_stream(hf, device)
    seen = {p.data_ptr(): p for p in hf.parameters()}  # the tied head is the embedding: once
    res["engines"][HF] = {"weight_MB": sum(p.numel() * p.element_size() for p in seen.values()) / 1e6, "format": "fp32"}
    python, peer = peers_python(args.peers_python), None
    if python is None:
        res["llama_cpp"] = ("unmeasured: no llama.cpp peer here (`make bench-peers` builds .venv-peers with "
                            "llama-cpp-python)")
    else:
        try:
            peer = LlamaCppPeer(python, gguf_path(MODEL), torch.get_num_threads())
            runners[LLAMA_CPP] = peer.decode
            res["llama_cpp"] = {k: peer.info[k] for k in ("version", "threads", "system_info", "extra_bufts", "fallback")
                                if k in peer.info}
            res["engines"][LLAMA_CPP] = {"weight_MB": gguf_path(MODEL).stat().st_size / 1e6, "format": "Q4_K_M"}
        except (OSError, RuntimeError) as err:
            res["llama_cpp"] = f"unmeasured: the llama.cpp peer did not start: {err}"[:1000]
    try:
        peer_cpu = peer.cpu_seconds() if peer else None
        with Load() as load:
            rates = decode_rates(runners, prompt, args.new_tokens, args.reps)
        cpp_tokens = peer.last_tokens if peer else None
        if peer and load.others is not None and None not in (peer_cpu, spent := peer.cpu_seconds()):
            load.others = max(0.0, load.others - (spent - peer_cpu) / load.seconds)  # the peer is a candidate
    finally:
        if peer:
            peer.close()
    res["load"] = {"others_busy_cores": load.others, "cores": cpu_cores(), "seconds": load.seconds}
    for k, v in rates.items():  # the page divides by the run's median bandwidth sample (run.py keeps them)
        res["engines"][k].update(stats(v))
    res["vs_hf"] = {k: round_ratios(rates[k], rates[HF]) for k in rates if k != HF}
    res["vs_llama_cpp"] = {k: round_ratios(rates[k], rates[LLAMA_CPP]) for k in rates if k != LLAMA_CPP} \
        if LLAMA_CPP in rates else {}
    # The tokens: ours fp32 against Hugging Face fp32 (the same weights: equal), each format against
    # ours fp32, and llama.cpp (its own K-quant arithmetic, 8-bit activations) against ours fp32.
    n = args.new_tokens
    ours = {k: generate(m, prompt, n, stop_ids=[]) for k, m in models.items()}
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=device)
        hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=hf.config.eos_token_id)[0, len(prompt):].tolist()
    res["tokens"] = {"n": n, "hf_equals_ours_fp32": hf_tokens == ours["ours fp32"],
                     "same_prefix_as_fp32": {k: common_prefix(t, ours["ours fp32"]) for k, t in ours.items()}}
    if cpp_tokens is not None:
        res["tokens"]["same_prefix_as_fp32"][LLAMA_CPP] = common_prefix(cpp_tokens, ours["ours fp32"])
    res |= {"rounds": args.reps, "new_tokens": n, "prompt_tokens": len(prompt), "order": list(runners),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return res
