"""`make gpu-check`: the engine's checks and the GPU's own numbers, in one command, offline.

On a CUDA machine: the unit tests (where pytest and hypothesis are installed), then for fp32 and
the GPU's 16-bit dtype the engine checks (ours vs Hugging Face on the same weights: logits and
greedy tokens; paged == contiguous; speculative == plain; CUDA-graph decode == eager), then the
measurements: ceilings (bandwidth, 16-bit FLOP/s), batch-1 decode eager and with CUDA graphs (the
difference is the per-step launch overhead), batched decode with graphs up to the batch where the
step turns compute-bound, TTFT vs prompt length, continuous vs static batching, speculative
speedup. Results go to benchmarks/results/gpu-<name>.json, which the Benchmarks page renders.

Without the real weights (a GPU box holds only the working tree) it saves random weights of
SmolLM2-135M's exact config as a Hugging Face folder and loads both models from it through
INFERENCE_INTERNALS_MODEL: every check compares two implementations on the same weights, and
every timing depends on shapes only. What needs the real weights is listed in REAL_WEIGHTS_ONLY.
On a CPU it runs the checks in fp32 and says which CUDA parts it skipped. It imports neither gguf
nor jupyter. Usage: PYTHONPATH=src python3 -m scripts.gpu_check [--tiny] [--out FILE] [--no-tests]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from inference_internals import roofline as hw, timing
from inference_internals.cuda_graph import GraphDecoder, decode_seconds, generate_graphed
from inference_internals.device import default_dtype, describe, synchronize
from inference_internals.drafts import PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.model import Llama, LlamaConfig, load_reference, random_model
from inference_internals.paged import LLMEngine, SamplingParams
from inference_internals.paged.trace import make_trace
from inference_internals.speculative import speculative_generate

ROOT = Path(__file__).resolve().parent.parent
REAL_WEIGHTS_ONLY = [
    "the chapters' notebooks (they need Jupyter too, and real text: chat prompts, tokenizer, answers)",
    "tests that load the real model or its tokenizer (skipped by the unit-test run when absent)",
    "fp16's range on pre-Ampere GPUs (tests/test_device.py measures the real activations)",
    "speculative speedups worth quoting (random weights give the draft nothing to guess)",
]
TINY = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
DT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def log(msg: str) -> None:
    print(msg, flush=True)


# --- weights -----------------------------------------------------------------------------------

def real_weights_folder() -> Path | None:
    """The prepared SmolLM2 cache, if it is here and verifies (checked without importing gguf)."""
    from inference_internals import weights

    if os.environ.get("INFERENCE_INTERNALS_MODEL"):
        return weights.model_dir()
    folder = weights.cache_root() / weights.CACHE_NAME
    return folder if weights.verify_cache(folder) else None


def save_random_checkpoint(cfg: LlamaConfig, folder: Path) -> Path:
    """Random weights of ``cfg`` as a Hugging Face LlamaForCausalLM folder (config + safetensors)."""
    from safetensors.torch import save_file

    model = random_model(cfg, seed=0, device="cpu")
    state = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "initializer_range": 0.02,
          "dtype": "float32", "use_cache": True, **asdict(cfg)}
    (folder / "config.json").write_text(json.dumps(hf, indent=1))
    return folder


# --- comparing tokens --------------------------------------------------------------------------

@torch.inference_mode()
def same_or_near_tie(arbiter, prompt: list[int], a: list[int], b: list[int], tol: float) -> tuple[bool, str]:
    """Token lists ``a`` and ``b`` agree, or first differ where ``arbiter`` (fp32) puts the two
    choices within ``tol`` of each other: a near-tie two kernel orders may break either way."""
    n = min(len(a), len(b))
    i = next((i for i in range(n) if a[i] != b[i]), None)
    if i is None:
        return len(a) == len(b), "identical" if len(a) == len(b) else f"lengths {len(a)} vs {len(b)}"
    logits = arbiter(torch.tensor([prompt + a[:i]]), last_only=True)[0, -1].float()
    gap = abs(float(logits[a[i]] - logits[b[i]]))
    return gap < tol, f"first differ at token {i}: logit gap {gap:.2e} ({'near-tie' if gap < tol else 'real'})"


# --- the engine checks -------------------------------------------------------------------------

def engine_checks(folder: Path, device: torch.device, dtype: torch.dtype, arbiter, prompts, n_new: int) -> dict:
    model = Llama.from_pretrained(folder, device=device, dtype=dtype)
    ref = load_reference(folder, device=device, dtype=dtype)
    out, ok = {}, True
    ids = torch.tensor(prompts[:2])
    with torch.inference_mode():
        ours, theirs = model(ids).float(), ref(ids.to(device)).logits.float()
    diff, scale = float((ours - theirs).abs().max()), float(theirs.abs().max())
    # fp32 differs only by summation order; 16-bit by a rounding per op: a tolerance per dtype,
    # relative to the logits' size. A token may differ only where the fp32 arbiter's two choices are
    # closer than twice that: a near-tie.
    rel = 1e-4 if dtype == torch.float32 else 3e-2
    tie_tol = 2 * rel * scale
    out.update(logits_max_abs_diff=diff, logits_max_abs=scale, logits_ok=diff < rel * scale)
    checks, t0 = {}, time.perf_counter()

    def record(name, results):
        checks[name] = results
        log(f"  {'ok  ' if all(r[0] for r in results) else 'FAIL'} {name}: {'; '.join(sorted({r[1] for r in results}))} "
            f"({time.perf_counter() - t0:.0f} s)")

    log(f"  {'ok  ' if out['logits_ok'] else 'FAIL'} logits: max |ours - HF| = {diff:.2e} (largest logit {scale:.1f})")
    want = generate(model, prompts, n_new, stop_ids=[])
    hf = [ref.generate(torch.tensor([p], device=device), max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    record("greedy tokens: ours == Hugging Face", [same_or_near_tie(arbiter, p, w, h, tie_tol)
                                                   for p, w, h in zip(prompts, want, hf)])
    engine = LLMEngine(model, num_blocks=256, block_size=16)
    paged = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True))
    record("paged == contiguous", [same_or_near_tie(arbiter, p, w, g, tie_tol) for p, w, g in zip(prompts, want, paged)])
    spec = [speculative_generate(model, p, PromptLookupDraft(3), n_new, stop_ids=[]).tokens for p in prompts]
    record("speculative == plain", [same_or_near_tie(arbiter, p, w, g, tie_tol) for p, w, g in zip(prompts, want, spec)])
    if device.type == "cuda":
        graphed = generate_graphed(model, prompts, n_new, stop_ids=[]) + generate_graphed(model, prompts[:1], n_new, stop_ids=[])
        record("CUDA-graph decode == eager", [same_or_near_tie(arbiter, p, w, g, tie_tol)
                                              for p, w, g in zip(prompts + prompts[:1], want + want[:1], graphed)])
    for name, results in checks.items():
        passed = all(r[0] for r in results)
        ok &= passed
        out[name] = {"ok": passed, "rows": [r[1] for r in results]}
    out["ok"] = ok and out["logits_ok"]
    del model, ref
    return out


# --- the measurements --------------------------------------------------------------------------

def graph_step_seconds(model, batch: int, context: int, steps: int = 16) -> float:
    dec = GraphDecoder(model, batch, context + steps + 4)
    dec.prefill(torch.randint(0, model.config.vocab_size, (batch, context), device=model.device))
    decode_seconds(dec, 3)  # capture and warm up
    return decode_seconds(dec, steps)


def measurements(folder: Path, device: torch.device, dtype: torch.dtype, budget_s: float) -> dict:
    model = Llama.from_pretrained(folder, device=device, dtype=dtype)
    cfg = model.config
    name = DT_NAMES[dtype]
    compute = "bf16" if dtype != torch.float32 else "fp32"
    res = {"dtype": name}
    machine = hw.measure_ceilings(device, budget_s=6.0, dtypes=(torch.float32, dtype))
    res["ceilings"] = {"bandwidth_Bps": machine.bandwidth, "flops": machine.flops,
                       "bandwidth_detail": machine.details["bandwidth"]}
    weight_bytes = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
    law_s = weight_bytes / machine.bandwidth
    context = 64
    eager = min(timing.time_decode_step(model, context, budget_s=1.0))
    graphed = graph_step_seconds(model, 1, context, steps=64)
    res["decode_batch1"] = {
        "weight_bytes": weight_bytes, "bandwidth_law_tok_s": 1 / law_s,
        "eager_tok_s": 1 / eager, "cuda_graph_tok_s": 1 / graphed,
        "launch_overhead_ms_per_step": (eager - graphed) * 1e3,
        "cuda_graph_pct_of_bandwidth_law": 100 * law_s / graphed, "eager_pct_of_bandwidth_law": 100 * law_s / eager}
    log(f"  batch 1: eager {1 / eager:,.0f} tok/s, CUDA graph {1 / graphed:,.0f} tok/s, "
        f"bandwidth law {1 / law_s:,.0f} tok/s ({100 * law_s / graphed:.0f}% reached with graphs)")
    # Batched decode, doubling the batch until the step costs 3x the batch-1 step (compute-bound)
    sweep, B, free = {}, 1, torch.cuda.mem_get_info(device)[0]
    while B <= 8192:
        kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * (context + 24) * B * dtype.itemsize
        if kv + B * cfg.vocab_size * 4 * 3 > free / 2:
            break  # stop before the cache and logits crowd the GPU's memory
        sweep[B] = graph_step_seconds(model, B, context)
        if sweep[B] > 3 * sweep[1]:
            break
        B *= 2
    b_max = max(sweep)
    res["decode_batched_cuda_graph"] = {
        "step_ms": {str(b): t * 1e3 for b, t in sweep.items()},
        "tok_s": {str(b): b / t for b, t in sweep.items()},
        "reached_compute_bound": sweep[b_max] > 3 * sweep[1],
        "measured_knee": b_max * sweep[1] / sweep[b_max],
        "critical_batch_from_ceilings": hw.critical_batch(machine, compute)}
    log(f"  batched: {max(b / t for b, t in sweep.items()):,.0f} tok/s best; knee ≈ "
        f"{res['decode_batched_cuda_graph']['measured_knee']:.0f} (ceilings say {hw.critical_batch(machine, compute):.0f})")
    lens = [16, 128, 512, 2048, 8192 if cfg.max_position_embeddings >= 8192 else cfg.max_position_embeddings // 2]
    res["ttft_ms"] = {str(n): min(timing.time_prefill(model, n, budget_s=0.2, min_reps=3)) * 1e3 for n in lens}
    res["batching"] = batching(model, n_requests=128)
    res["speculative"] = speculative(model)
    del model
    return res


def batching(model, n_requests: int) -> dict:
    """Continuous vs static batching on one trace (greedy, EOS ignored: lengths from the trace)."""
    trace = make_trace(n_requests, (16, 256), (16, 128), max_new_tokens=128, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(r.prompt_len)] for r in trace]
    max_len, block = 256 + 128, 16
    num_blocks = 32 * max_len // block  # static batching fits 32 sequences at a time

    def serve(static: bool) -> float:
        eng = LLMEngine(model, num_blocks, block, max_num_seqs=256, enable_prefix_caching=False,
                        static_reserve_tokens=max_len if static else None, packed=static)
        synchronize(model.device)
        t0 = time.perf_counter()
        eng.generate(prompts, [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in trace])
        synchronize(model.device)
        return sum(r.output_len for r in trace) / (time.perf_counter() - t0)

    cont, stat = serve(False), serve(True)
    log(f"  batching: continuous {cont:,.0f} tok/s, static {stat:,.0f} tok/s (x{cont / stat:.2f})")
    return {"requests": n_requests, "continuous_tok_s": cont, "static_tok_s": stat, "speedup": cont / stat}


def speculative(model, n_new: int = 96) -> dict:
    """Prompt lookup on a prompt that repeats itself (random weights still copy what they saw)."""
    rng = random.Random(1)
    unit = [rng.randrange(model.config.vocab_size) for _ in range(48)]
    prompt = unit * 4
    synchronize(model.device)
    t0 = time.perf_counter()
    plain = generate(model, prompt, n_new, stop_ids=[])
    synchronize(model.device)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    spec = speculative_generate(model, prompt, PromptLookupDraft(3), n_new, gamma=4, stop_ids=[])
    synchronize(model.device)
    t_spec = time.perf_counter() - t0
    out = {"tokens": n_new, "plain_s": t_plain, "speculative_s": t_spec, "speedup": t_plain / t_spec,
           "acceptance_rate": spec.acceptance_rate, "same_tokens": spec.tokens == plain}
    log(f"  speculative (prompt lookup): x{t_plain / t_spec:.2f}, acceptance {spec.acceptance_rate:.2f}")
    return out


# --- the unit tests ----------------------------------------------------------------------------

def unit_tests(device: torch.device, timeout_s: int) -> dict:
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return {"ran": False, "why": f"{' and '.join(missing)} not installed"}
    env = {**os.environ, "INFERENCE_DEVICE": device.type, "PYTHONPATH": str(ROOT / "src"),
           "INFERENCE_INTERNALS_SKIP_REAL": "1"}  # tests that need the real weights skip without them
    env.pop("INFERENCE_INTERNALS_MODEL", None)
    cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-m", "not browser and not slow", "-p", "no:cacheprovider",
           "--hypothesis-profile=repeatable", "--continue-on-collection-errors"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ran": True, "ok": False, "why": f"timed out after {timeout_s} s"}
    text = p.stdout + p.stderr
    summary = (text.strip().splitlines() or [""])[-1]
    # A module that imports a package this image lacks (e.g. scipy) cannot be collected: reported,
    # not counted as a failure; any failed test or other error is one.
    not_found = re.findall(r"ModuleNotFoundError: No module named '([^']+)'", text)
    errors = int(m.group(1)) if (m := re.search(r"(\d+) errors?", summary)) else 0
    collecting = len(re.findall(r"ERROR collecting", text))
    failed = re.search(r"\d+ failed", summary) is not None
    ok = p.returncode == 0 or (not failed and errors == collecting <= len(not_found))
    missing = sorted(set(not_found))
    return {"ran": True, "ok": ok, "summary": summary, "modules_missing": missing,
            "seconds": time.perf_counter() - t0, "tail": text.strip().splitlines()[-15:]}


# --- main --------------------------------------------------------------------------------------

def machine_info(device: torch.device) -> dict:
    info = {"device": describe(device), "torch": torch.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", memory_GB=props.total_memory / 1e9,
                    cuda=torch.version.cuda, sms=props.multi_processor_count)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (a quick run of the CPU path)")
    ap.add_argument("--out", type=Path, help="where to write the JSON (default on CUDA: benchmarks/results/gpu-<name>.json)")
    ap.add_argument("--no-tests", action="store_true", help="skip the unit tests")
    ap.add_argument("--tests-timeout", type=int, default=240)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    report = {"machine": machine_info(device), "needs_real_weights": REAL_WEIGHTS_ONLY, "skipped": [], "checks": {}}
    log(f"gpu-check on {report['machine']['device']}, torch {torch.__version__}")
    if not cuda:
        report["skipped"] += ["everything on CUDA: the unit tests and engine checks on the GPU, the 16-bit "
                              "engine checks, CUDA-graph decode == eager, and every measurement (no CUDA device here)"]

    tmp = tempfile.TemporaryDirectory(prefix="gpu-check-")
    real = None if args.tiny else real_weights_folder()
    if real is not None:
        folder, report["weights"] = real, f"real: {real}"
    else:
        folder = save_random_checkpoint(TINY if args.tiny else LlamaConfig(), Path(tmp.name))
        report["weights"] = ("random, tiny config" if args.tiny else
                             "random, SmolLM2-135M's exact config (the real weights are absent)")
    log(f"weights: {report['weights']}")
    os.environ["INFERENCE_INTERNALS_MODEL"] = str(folder)  # every loader reads this folder

    if args.no_tests:
        report["skipped"].append("the unit tests (--no-tests)")
    elif not cuda:
        report["skipped"].append("the unit tests (on a CPU, `make test-unit` runs them)")
    else:
        log("unit tests ...")
        report["unit_tests"] = unit_tests(device, args.tests_timeout)
        log(f"  {report['unit_tests']}")

    rng = random.Random(0)
    vocab = 512 if args.tiny else 49152
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (24, 24, 24)]
    arbiter = Llama.from_pretrained(folder, device="cpu", dtype=torch.float32)
    dtypes = [torch.float32] + ([default_dtype(device)] if cuda else [])
    for dt in dtypes:
        log(f"engine checks on {device.type} in {DT_NAMES[dt]} ...")
        res = engine_checks(folder, device, dt, arbiter, prompts, n_new=32 if cuda else 16)
        report["checks"][f"{device.type}/{DT_NAMES[dt]}"] = res
    if not cuda:
        report["skipped"].append("the 16-bit engine checks (bf16/fp16 are checked on CUDA only)")
    if cuda:
        for dt in dict.fromkeys([default_dtype(device), torch.float32]):
            log(f"measurements in {DT_NAMES[dt]} ...")
            report.setdefault("measurements", {})[DT_NAMES[dt]] = measurements(folder, device, dt, budget_s=60)
    report["seconds"] = time.perf_counter() - t_start
    ok = all(c["ok"] for c in report["checks"].values()) and report.get("unit_tests", {}).get("ok", True) is not False
    report["ok"] = ok
    out = args.out
    if out is None and cuda:
        slug = re.sub(r"[^a-z0-9]+", "-", report["machine"]["gpu"].lower()).strip("-")
        out = ROOT / "benchmarks" / "results" / f"gpu-{slug}.json"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=float) + "\n")
        log(f"wrote {out}")
    for s in report["skipped"]:
        log(f"skipped: {s}")
    if real is None:
        log("needs the real weights (not run here): " + "; ".join(REAL_WEIGHTS_ONLY))
    log(f"gpu-check {'passed' if ok else 'FAILED'} in {report['seconds']:.0f} s")
    tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
