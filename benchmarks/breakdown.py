"""Where a batch-1 decode step goes, per weight format (eager and compiled), and what each format
costs in quality.

- ``breakdown``: ``inference_internals.step_time.breakdown`` on the same model optimized to each
  format: the step (median and band of interleaved rounds), the law's time (bytes ÷ the run's
  bandwidth), the kernels of every role (qkv, o, gate_up, down, lm_head) over all layers, and
  what is left outside them. Each format eager, then compiled (``optimize(..., compile=True)``)
- ``step_parts``: the same breakdown of the door's fast engine (``LLM(quantization="q4_1", compile=True,
  kv_cache_dtype="float16")``) after 128 and 8,128 tokens of context, with the bytes each part reads:
  where the step goes when the weights are most of the bytes, and when the cache is
- ``quality``: each format's next-token distributions against fp32's over the course's quality
  text (the Zen of Python, as chapter 3 scores it): top-1 agreement and mean KL (nats). Twice: as
  the engine runs it (the quantized kernels take bf16 activations and return bf16), and with the
  same quantized weights in fp32 arithmetic ("<format>, fp32 arithmetic"), which isolates what the
  format's grid costs from what bf16 activations cost (bf16 alone is the "bf16" row)
"""
from __future__ import annotations

import copy
import statistics
import time

import torch

from .decode import QUANT_FORMATS, optimize_args

# name -> optimize() arguments (every quantized one through torch's kernels, which take bf16 activations)
FORMATS = {
    "fp32": {"dtype": torch.float32},
    "bf16": {"dtype": torch.bfloat16},
    "int8": {"dtype": torch.bfloat16, "weights": "int8"},
    "q8_0": {"dtype": torch.bfloat16, "weights": "q8_0"},
    "int4 g32": {"dtype": torch.bfloat16, "weights": "int4", "group": 32},
    "int8_asym": {"dtype": torch.bfloat16, "weights": "int8_asym"},
    "q4_1": {"dtype": torch.bfloat16, "weights": "q4_1"},
}
# the breakdown also times the fastest engine: the file's bytes through the block kernels (blockdot.py)
VNNI = {"q4_1 vnni": QUANT_FORMATS["ours Q4_1, Q8_0 head, VNNI kernels"]}
# the LM head at another format than the default (a lever on bytes: the tied head is 28 M weights)
HEAD_VARIANTS = {
    "q8_0, q8_0 head": {"dtype": torch.bfloat16, "weights": "q8_0", "head": "q8_0"},
    "q8_0, int8 head": {"dtype": torch.bfloat16, "weights": "q8_0", "head": "int8"},
    "q4_1, q8_0 head": {"dtype": torch.bfloat16, "weights": "q4_1", "head": "q8_0"},
    "q4_1, int4 head": {"dtype": torch.bfloat16, "weights": "q4_1", "head": "int4"},
}
# the kernels' fp32 form (``int4x2_mm_fp32``, ``int4_mm_fp32``): the format with fp32 activations, as run
FP32_ACTIVATIONS = {
    "q8_0, fp32 activations": {"dtype": torch.float32, "weights": "q8_0", "quant_kernel": "int4x2_mm_fp32"},
    # the file's own formats (Q4_1 layers, a Q8_0 head), in fp32 arithmetic
    "q4_1, q8_0 head, fp32 activations": QUANT_FORMATS["ours Q4_1, Q8_0 head, fp32 activations"],
    # the same bytes through the block kernels: integer dot products, two int8 codes per activation
    "q4_1, q8_0 head, vnni": VNNI["q4_1 vnni"],
    # int8 with a scale and a minimum per 32 (its grid holds the file's Q4_1 blocks), as LLM(quantization="int8_asym")
    # runs it where the block kernels build
    "int8_asym, q8_0 head, vnni": QUANT_FORMATS["ours int8_asym, Q8_0 head, VNNI kernels"],
}


def bench_breakdown(args, device, bw: float, formats: dict | None = None) -> dict:
    """``{format [+ ' compiled']: breakdown}``: each format eager, then compiled (unless
    ``args.no_compile``), all timed in the same rounds (``step_time.breakdown`` of them all: a slow
    spell of the machine lands on every format, not on the one timed then); a model that fails to
    build or compile is reported in place of its figures."""
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize
    from inference_internals.analysis.step_time import breakdown
    from inference_internals.timing import decode_step_fn

    base = Llama.from_pretrained(device=device, dtype=torch.float32)
    context = getattr(args, "context", 256)
    models, out = {}, {}
    for name, kw in (formats or FORMATS | VNNI).items():
        for compiled in (False, True):
            if compiled and args.no_compile:
                continue
            label = f"{name} compiled" if compiled else name
            try:
                t0 = time.perf_counter()
                m = optimize(copy.deepcopy(base), compile=compiled, **optimize_args(kw, device))
                decode_step_fn(m, context)()  # a compiled model compiles its graph here
                out[label] = {"build_s": time.perf_counter() - t0, "format": name,  # what the first token pays
                              "quant_kernels": dict(getattr(m, "quant_kernels", {}) or {}) or None}
                models[label] = m
            except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: report it, measure the rest
                out[label] = {"error": f"{type(e).__name__}: {e}"[:500], "compiled": compiled}
    if models:
        for label, r in breakdown(models, context=context, rounds=max(3, args.reps), bandwidth=bw).items():
            out[label] |= r
    return out


# the contexts of the step's breakdown on the door's engine: a short chat, and llama_cpp_best's longest
STEP_PARTS_CONTEXTS = (128, 8128)
DOOR = {"quantization": "q4_1", "compile": True, "kv_cache_dtype": "float16"}


def bench_step_parts(args, device) -> dict:
    """``{"engine", "contexts": {context: breakdown}, "bandwidth_GB_s", "bandwidth_samples_GB_s"}``: one
    decode step of the door's fast engine broken down after each of ``STEP_PARTS_CONTEXTS`` tokens, its
    cache in f16 (as llama_cpp_best runs it beside llama.cpp). The law divides by the median of the
    bandwidth samples taken around the rounds (the best one is a quiet moment of the bus)."""
    from inference_internals import LLM
    from inference_internals.analysis.roofline import measure_bandwidth
    from inference_internals.analysis.step_time import breakdown
    from inference_internals.timing import decode_step_fn

    model = LLM(device=str(device), **DOOR).model
    kv_dtype = torch.float16
    samples = [measure_bandwidth(device, budget_s=0.5)["read"] for _ in range(3)]
    for context in STEP_PARTS_CONTEXTS:  # each side of 4,096 stored tokens compiles its own graph: not in the rounds
        decode_step_fn(model, context, kv_dtype=kv_dtype)()
    timed = {}
    for context in STEP_PARTS_CONTEXTS:
        timed[context] = breakdown(model, context=context, rounds=max(7, args.reps), bandwidth=1.0, kv_dtype=kv_dtype)
        samples += [measure_bandwidth(device, budget_s=0.5)["read"] for _ in range(2)]
    bw = statistics.median(samples)
    out = {"engine": "LLM(" + ", ".join(f"{k}={v!r}" for k, v in DOOR.items()) + ")",
           "bandwidth_GB_s": bw / 1e9, "bandwidth_samples_GB_s": [b / 1e9 for b in samples], "contexts": {}}
    for context, r in timed.items():  # the law's times with the run's median bandwidth, known only now
        r |= {"bandwidth_GB_s": bw / 1e9, "law_ms": 1e3 * r["weight_bytes"] / bw,
              "law_kv_ms": 1e3 * (r["weight_bytes"] + r["kv_MB"] * 1e6) / bw}
        out["contexts"][str(context)] = r
    return out


def quality_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits of ``model`` at every position of ``ids`` ([1, T]) but the last: [T-1, vocab],
    one decode step at a time through a KV cache: the arithmetic generation runs (a kernel may round
    or order a many-row pass otherwise)."""
    from inference_internals.kv_cache import KVCache

    cache = KVCache.for_model(model, 1, ids.shape[1])
    with torch.inference_mode():
        return torch.cat([model(ids[:, t:t + 1], cache=cache)[0, -1:].float() for t in range(ids.shape[1] - 1)])


def weights_in_fp32(model):
    """``model`` (quantized by ``optimize``) with every quantized projection replaced by its
    dequantized weight, multiplied in fp32: the format's weights without the kernels' bf16."""
    from inference_internals.optimize import Projection, QuantProjection

    model.float()
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, QuantProjection):
                setattr(module, name, Projection(child.qw.dequantize(), "linear"))
    return model


def bench_quality(args, device, formats: dict | None = None) -> dict:
    """``{format: {"top1", "kl", "perplexity", "weight_MB"}}`` against fp32, over the Zen of Python;
    each quantized one also in fp32 arithmetic (``weights_in_fp32``)."""
    from inference_course.prompts import zen_of_python
    from inference_internals import quant
    from inference_internals.bpe import BPETokenizer
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize, weight_bytes_read

    tok = BPETokenizer.from_pretrained()
    ids = torch.tensor([tok.encode(zen_of_python())], device=device)
    base = Llama.from_pretrained(device=device, dtype=torch.float32)
    ref = quality_logits(base, ids)
    out = {"text": {"name": "the Zen of Python", "predictions": ids.shape[1] - 1}}
    for name, kw in (formats or (FORMATS | HEAD_VARIANTS | FP32_ACTIVATIONS)).items():
        try:
            m = optimize(copy.deepcopy(base), **optimize_args(kw, device))
        except (RuntimeError, ValueError) as e:  # e.g. the block kernels on a CPU without VNNI: say so, score the rest
            out[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        r = quant.compare_logits(ref, quality_logits(m, ids), ids[0, 1:])
        out[name] = r | {"weight_MB": weight_bytes_read(m) / 1e6}
        if "weights" in kw and kw["dtype"] != torch.float32:
            out[f"{name}, fp32 arithmetic"] = quant.compare_logits(ref, quality_logits(weights_in_fp32(m), ids), ids[0, 1:])
    return out
