"""`make gpu-check`: the engine's checks and the GPU's own numbers, in one command, offline.

On a CUDA machine: for fp32 and the GPU's 16-bit dtype the engine checks (ours vs Hugging Face on
the same weights: logits and greedy tokens; paged == contiguous; speculative == plain; CUDA-graph
decode == eager), then the
measurements: ceilings (bandwidth, FLOP/s), batch-1 decode (eager; the static step a CUDA graph
records, run eagerly and replayed: their difference is the launch overhead, with the kernels each
ran counted by the profiler), the eager batch sweep and the graphed one up to the batch where the
step turns compute-bound, TTFT vs prompt length, continuous vs static batching, speculative speedup;
the three-regime figure beside the JSON; last, the unit tests on CUDA (where pytest and hypothesis
are installed), under a time limit.

The same sections run on a CPU (``--device cpu``; ``--tiny`` for a tiny model): every line but the
CUDA-only calls (graph capture, CUDA events, the GPU's free memory) runs in the unit tests before a
GPU ever sees it. Each section is guarded: one that raises records its error and the next runs, and
the JSON is rewritten after every section, so a run cut short still says what it measured.

Without the real weights (a GPU box holds only the working tree) it saves random weights of
SmolLM2-135M's exact config as a Hugging Face folder and loads both models from it through
INFERENCE_INTERNALS_MODEL: every check compares two implementations on the same weights, and
every timing depends on shapes only. What needs the real weights is listed in REAL_WEIGHTS_ONLY.
It imports neither gguf nor jupyter, and needs neither make nor the venv:

    python3 scripts/gpu_check.py [--device cpu|cuda] [--tiny] [--out FILE] [--no-tests]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "src"):  # the checkout's own code, whatever is installed (src/ ends up first)
    if str(_p) not in sys.path[:2]:
        sys.path.insert(0, str(_p))

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's start/stop lines on stderr (read when it starts)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import torch  # noqa: E402

from inference_internals.analysis import roofline as hw
from inference_internals import timing  # noqa: E402
from inference_internals.cuda_graph import GraphDecoder, decode_seconds, generate_graphed  # noqa: E402
from inference_internals.device import default_dtype, describe, get_device, synchronize  # noqa: E402
from inference_internals.drafts import PromptLookupDraft  # noqa: E402
from inference_internals.analysis.flops import weight_bytes_per_token  # noqa: E402
from inference_internals.generate import generate  # noqa: E402
from inference_internals.kv_cache import kv_cache_bytes  # noqa: E402
from inference_internals.model import Llama, LlamaConfig, load_reference, random_model  # noqa: E402
from inference_internals.engine import LLMEngine  # noqa: E402
from inference_internals.params import SamplingParams  # noqa: E402
from inference_internals.analysis.trace import make_trace  # noqa: E402
from inference_internals.speculative import speculative_generate  # noqa: E402

REAL_WEIGHTS_ONLY = [
    "the chapters' notebooks (they need Jupyter too, and real text: chat prompts, tokenizer, answers)",
    "tests that load the real model or its tokenizer (skipped by the unit-test run when absent)",
    "fp16's range on pre-Ampere GPUs (tests/test_device.py measures the real activations)",
    "speculative speedups worth quoting (random weights give the draft nothing to guess)",
]
TINY = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
DT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Set in the environment of everything gpu-check starts: a gpu-check inside its own unit-test run
# (tests/test_gpu_check.py) must not start the unit tests again.
GUARD = "INFERENCE_INTERNALS_IN_GPU_CHECK"


@dataclass(frozen=True)
class Plan:
    """How much each measurement does: a GPU's full sizes, or a quick pass of the same code."""
    context: int = 64             # tokens in the cache for the decode steps
    budget_s: float = 0.3         # per timed point (hundreds of repetitions of a GPU step)
    ceilings_s: float = 4.0
    max_batch: int = 8192
    ttft_lens: tuple = (16, 128, 512, 2048, 4096)
    batching_requests: int = 128
    spec_new: int = 96
    check_new: int = 32


QUICK = Plan(context=16, budget_s=0.02, ceilings_s=0.3, max_batch=8, ttft_lens=(8, 32), batching_requests=4,
             spec_new=12, check_new=8)


def log(msg: str) -> None:
    print(msg, flush=True)


# --- the report: one JSON, rewritten after every section -----------------------------------------

class Report:
    def __init__(self, out: Path | None):
        self.out, self.data = out, {"sections": {}, "skipped": [], "checks": {}}

    def write(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.out.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=float) + "\n")
            tmp.replace(self.out)  # never a half-written file, even if the run is killed mid-write

    def section(self, name: str, fn, into: dict | None = None, key: str | None = None):
        """Run ``fn()``; its result goes to ``into[key]`` (default: the report, under ``name``). An
        exception is recorded (sections[name]) and the run goes on; the JSON is rewritten either way."""
        t0 = time.perf_counter()
        log(f"{name} ...")
        try:
            result = fn()
            (self.data if into is None else into)[key or name] = result
            status = {"ok": True}
        except Exception as e:  # noqa: BLE001 - recorded, and the next section runs
            result = None
            status = {"ok": False, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc().strip().splitlines()[-12:]}
            log(f"  ERROR in {name}: {status['error']}")
        status["seconds"] = round(time.perf_counter() - t0, 3)
        self.data["sections"][name] = status
        self.write()
        return result


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
    out = {}
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
    log(f"  {'ok  ' if out['logits_ok'] else 'FAIL'} logits: max |ours - HF| = {diff:.2e} (largest logit {scale:.1f})")
    t0 = time.perf_counter()

    def record(name, results):
        out[name] = {"ok": all(r[0] for r in results), "rows": [r[1] for r in results]}
        log(f"  {'ok  ' if out[name]['ok'] else 'FAIL'} {name}: {'; '.join(sorted(set(out[name]['rows'])))} "
            f"({time.perf_counter() - t0:.0f} s)")

    want = generate(model, prompts, n_new, stop_ids=[])
    hf = [ref.generate(torch.tensor([p], device=device), max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    record("greedy tokens: ours == Hugging Face", [same_or_near_tie(arbiter, p, w, h, tie_tol)
                                                   for p, w, h in zip(prompts, want, hf)])
    for packed in (False, True):
        engine = LLMEngine(model, num_blocks=256, block_size=16, packed=packed)
        paged = [o.outputs[0].token_ids for o in
                 engine.generate(prompts, SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True))]
        record(f"paged{' (packed)' if packed else ''} == contiguous",
               [same_or_near_tie(arbiter, p, w, g, tie_tol) for p, w, g in zip(prompts, want, paged)])
    spec = [speculative_generate(model, p, PromptLookupDraft(3), n_new, stop_ids=[]).tokens for p in prompts]
    record("speculative == plain",
           [same_or_near_tie(arbiter, p, w, g, tie_tol) for p, w, g in zip(prompts, want, spec)])
    # graph=False on a CPU: the very step a graph records, run eagerly
    graph = device.type == "cuda"
    graphed = (generate_graphed(model, prompts, n_new, stop_ids=[], graph=graph)
               + generate_graphed(model, prompts[:1], n_new, stop_ids=[], graph=graph))
    record(f"{'CUDA-graph' if graph else 'static (graph-ready) step'} decode == eager",
           [same_or_near_tie(arbiter, p, w, g, tie_tol)
            for p, w, g in zip(prompts + prompts[:1], want + want[:1], graphed)])
    out["ok"] = out["logits_ok"] and all(v["ok"] for v in out.values() if isinstance(v, dict))
    return out


# --- the measurements --------------------------------------------------------------------------

def static_step_seconds(model, batch: int, context: int, graph: bool, steps: int = 16) -> float:
    """Seconds per step of GraphDecoder's static decode step, replayed from a CUDA graph or run eagerly:
    the same kernels either way, so the difference is what launching them from the host costs."""
    dec = GraphDecoder(model, batch, context + steps + 4, graph=graph)
    dec.prefill(torch.randint(0, model.config.vocab_size, (batch, context), device=model.device))
    decode_seconds(dec, 3)  # (with a graph: captures it) and warms up
    return decode_seconds(dec, steps)


ATTENTION = re.compile(r"attention|attn|fmha|flash|softmax|sdpa|bmm", re.I)


def kernels_of(fn, device: torch.device) -> dict:
    """What one call of ``fn`` runs, from the profiler: on CUDA its kernels (device events), on a CPU
    its aten ops; the total, and by name those of attention (a different attention kernel would make
    two step times incomparable)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()  # warm: a first call sets things up (cuBLAS handles, graph capture) that later ones do not
    synchronize(device)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    names = [e.name for e in prof.events()
             if (e.device_type == torch.autograd.DeviceType.CUDA if cuda else e.name.startswith("aten::"))]
    attention: dict[str, int] = {}
    for n in names:
        if ATTENTION.search(n):
            attention[n] = attention.get(n, 0) + 1
    return {"what": "CUDA kernels" if cuda else "aten ops (CPU)", "total": len(names), "attention": attention}


def decode_batch1(model, plan: Plan, law_s: float) -> dict:
    device, context = model.device, plan.context
    eager = min(timing.time_decode_step(model, context, budget_s=plan.budget_s))
    static = static_step_seconds(model, 1, context, graph=False)
    res = {"context": context, "bandwidth_law_tok_s": 1 / law_s, "eager_tok_s": 1 / eager,
           "static_eager_tok_s": 1 / static, "eager_pct_of_bandwidth_law": 100 * law_s / eager}
    # The kernels one step of each runs: the eager step on the contiguous cache (one query, no mask:
    # SDPA's flash kernel with GQA on CUDA) and the static step the graph replays (a mask over every
    # slot: K/V repeated per query head and a masked kernel). Their difference is not launch overhead;
    # the static step's eager and graphed times are, kernel for kernel, the same work.
    static_step = GraphDecoder(model, 1, context + 4, graph=False)
    static_step.prefill(torch.randint(0, model.config.vocab_size, (1, context), device=device))
    res["kernels"] = {"eager step (contiguous cache)": kernels_of(timing.decode_step_fn(model, context), device),
                      "static step (what the graph replays)": kernels_of(
                          lambda: static_step.step(static_step.logits.argmax(-1)), device)}
    if device.type == "cuda":
        graphed = static_step_seconds(model, 1, context, graph=True, steps=64)
        res.update(cuda_graph_tok_s=1 / graphed, launch_overhead_ms_per_step=(static - graphed) * 1e3,
                   cuda_graph_pct_of_bandwidth_law=100 * law_s / graphed)
        log(f"  batch 1: eager {1 / eager:,.0f} tok/s; static step eager {1 / static:,.0f}, replayed as a CUDA graph "
            f"{1 / graphed:,.0f} tok/s (launch overhead {(static - graphed) * 1e3:.3f} ms/step); "
            f"bandwidth law {1 / law_s:,.0f} tok/s")
    else:
        log(f"  batch 1: eager {1 / eager:,.1f} tok/s, static step {1 / static:,.1f} tok/s (no CUDA graph on a CPU)")
    return res


def sweep(step_seconds, plan: Plan, kv_per_seq: int, vocab: int, device: torch.device) -> dict:
    """Step time per batch size, doubling from 1 until the step costs 3x the batch-1 step
    (compute-bound), the caches would crowd the device's memory, or ``plan.max_batch``."""
    times, B, why = {}, 1, f"the plan's largest batch ({plan.max_batch})"
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    while B <= plan.max_batch:
        if free is not None and B * (kv_per_seq + 3 * 4 * vocab) > free / 2:
            why = "memory: the caches and logits would crowd the GPU"
            break
        times[B] = step_seconds(B)
        if times[B] > 3 * times[1]:
            why = "compute-bound: the step costs 3x the batch-1 step"
            break
        B *= 2
    b_max = max(times)
    return {"step_ms": {str(b): t * 1e3 for b, t in times.items()}, "tok_s": {str(b): b / t for b, t in times.items()},
            "stopped": why, "reached_compute_bound": times[b_max] > 3 * times[1],
            "measured_knee": b_max * times[1] / times[b_max]}


def batching(model, n_requests: int, small: bool) -> dict:
    """Continuous vs static batching on one trace (greedy, EOS ignored: lengths from the trace)."""
    prompt_lens, out_lens, max_new = ((4, 16), (4, 8), 8) if small else ((16, 256), (16, 128), 128)
    trace = make_trace(n_requests, prompt_lens, out_lens, max_new_tokens=max_new, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(r.prompt_len)] for r in trace]
    max_len, block = prompt_lens[1] + max_new, 16
    num_blocks = 32 * -(-max_len // block)  # static batching fits 32 sequences at a time

    def serve(static: bool) -> float:
        eng = LLMEngine(model, num_blocks=num_blocks, block_size=block, max_num_seqs=256, enable_prefix_caching=False,
                        static_reserve_tokens=max_len if static else None, packed=static)
        synchronize(model.device)
        t0 = time.perf_counter()
        eng.generate(prompts, [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in trace])
        synchronize(model.device)
        return sum(r.output_len for r in trace) / (time.perf_counter() - t0)

    cont, stat = serve(False), serve(True)
    log(f"  batching: continuous {cont:,.0f} tok/s, static {stat:,.0f} tok/s (x{cont / stat:.2f})")
    return {"requests": n_requests, "continuous_tok_s": cont, "static_tok_s": stat, "speedup": cont / stat}


def speculative(model, n_new: int) -> dict:
    """Prompt lookup on a prompt that repeats itself (random weights still copy what they saw)."""
    rng = random.Random(1)
    unit = [rng.randrange(model.config.vocab_size) for _ in range(48)]
    prompt = unit * 4
    t_plain, t_spec = [], []
    with timing.timer(model.device, t_plain):
        plain = generate(model, prompt, n_new, stop_ids=[])
    with timing.timer(model.device, t_spec):
        spec = speculative_generate(model, prompt, PromptLookupDraft(3), n_new, gamma=4, stop_ids=[])
    out = {"tokens": n_new, "plain_s": t_plain[0], "speculative_s": t_spec[0], "speedup": t_plain[0] / t_spec[0],
           "acceptance_rate": spec.acceptance_rate, "same_tokens": spec.tokens == plain}
    log(f"  speculative (prompt lookup): x{out['speedup']:.2f}, acceptance {spec.acceptance_rate:.2f}")
    return out


def measurements(rep: Report, folder: Path, device: torch.device, dtype: torch.dtype, plan: Plan) -> None:
    """Every measurement for one dtype, each its own guarded section, into report['measurements'][dtype]."""
    name = DT_NAMES[dtype]
    res = rep.data.setdefault("measurements", {}).setdefault(name, {"dtype": name})
    model = rep.section(f"{name}: load the model", lambda: Llama.from_pretrained(folder, device=device, dtype=dtype),
                        into={}, key="model")
    if model is None:
        return
    cfg = model.config

    def ceilings():
        machine = hw.measure_ceilings(device, budget_s=plan.ceilings_s,
                                      dtypes=tuple(dict.fromkeys((torch.float32, dtype))))
        flops = machine.flops[name]  # a KeyError here (no matmul rate for this dtype) fails this section alone
        res["ceilings"] = {"bandwidth_Bps": machine.bandwidth, "flops": machine.flops,
                           "bandwidth_detail": machine.details.get("bandwidth")}
        weight_bytes = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
        # The roofline's inputs, so a figure needs nothing but this JSON (gpu_report.regime_series)
        return {"weight_bytes": weight_bytes, "bandwidth_Bps": machine.bandwidth, "flops_per_s": flops,
                "kv_bytes_per_sequence": kv_cache_bytes(cfg, plan.context, 1, dtype.itemsize),
                "flops_per_token": 2 * weight_bytes_per_token(cfg, 1), "context": plan.context,
                "critical_batch_from_ceilings": flops / machine.bandwidth * dtype.itemsize / 2}

    roof = rep.section(f"{name}: ceilings", ceilings, into=res, key="roofline")
    if roof is not None:
        law_s = roof["weight_bytes"] / roof["bandwidth_Bps"]
        rep.section(f"{name}: batch-1 decode", lambda: decode_batch1(model, plan, law_s), into=res, key="decode_batch1")
    kv_per_seq = kv_cache_bytes(cfg, plan.context + 24, 1, dtype.itemsize)
    rep.section(f"{name}: eager batch sweep", lambda: sweep(
        lambda B: min(timing.time_decode_step(model, plan.context, batch=B, budget_s=plan.budget_s)),
        plan, kv_per_seq, cfg.vocab_size, device), into=res, key="decode_eager_sweep")
    if device.type == "cuda":
        def graph_sweep():
            out = sweep(lambda B: static_step_seconds(model, B, plan.context, graph=True), plan, kv_per_seq,
                        cfg.vocab_size, device)
            if roof is not None:
                out["critical_batch_from_ceilings"] = roof["critical_batch_from_ceilings"]
            log(f"  batched (CUDA graph): {max(out['tok_s'].values()):,.0f} tok/s best; "
                f"knee ≈ {out['measured_knee']:.0f}")
            return out
        rep.section(f"{name}: CUDA-graph batch sweep", graph_sweep, into=res, key="decode_batched_cuda_graph")
    lens = [n for n in plan.ttft_lens if n < cfg.max_position_embeddings]
    rep.section(f"{name}: TTFT", lambda: {
        str(n): min(timing.time_prefill(model, n, budget_s=plan.budget_s, min_reps=3)) * 1e3 for n in lens},
        into=res, key="ttft_ms")
    rep.section(f"{name}: batching", lambda: batching(model, plan.batching_requests, small=plan is QUICK),
                into=res, key="batching")
    rep.section(f"{name}: speculative", lambda: speculative(model, plan.spec_new), into=res, key="speculative")
    del model


# --- the unit tests ----------------------------------------------------------------------------

def run_group(cmd: list[str], env: dict, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in a session of its own; on timeout kill the whole process group (pytest and
    anything it started), not just pytest. Returns (exit code or None on timeout, output)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out
    finally:  # gpu-check itself stopped (SIGTERM from `timeout`, Ctrl-C): its tests stop with it
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def tests_skipped(no_tests: bool, nested: bool, cuda: bool) -> str | None:
    """Why this run does not start the unit tests, or None: it does."""
    if no_tests:
        return "--no-tests"
    if nested:
        return f"this gpu-check runs inside another one's unit tests: {GUARD} is set"
    if not cuda:
        return "on a CPU, `make test-unit` runs them"
    return None


def unit_tests(device: torch.device, timeout_s: float) -> dict:
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return {"ran": False, "why": f"{' and '.join(missing)} not installed"}
    env = {**os.environ, "INFERENCE_DEVICE": device.type, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
           "INFERENCE_INTERNALS_SKIP_REAL": "1", GUARD: "1"}  # tests that need the real weights skip without them
    env.pop("INFERENCE_INTERNALS_MODEL", None)
    cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-m", "not browser and not slow and not notebook",
           "-p", "no:cacheprovider", "--hypothesis-profile=repeatable", "--continue-on-collection-errors"]
    t0 = time.perf_counter()
    code, text = run_group(cmd, env, timeout_s)
    if code is None:
        return {"ran": True, "ok": False, "why": f"timed out after {timeout_s:.0f} s (process group killed)",
                "tail": text.strip().splitlines()[-15:]}
    summary = (text.strip().splitlines() or [""])[-1]
    # A module that imports a package this image lacks (e.g. scipy) cannot be collected: reported,
    # not counted as a failure; any failed test or other error is one.
    not_found = re.findall(r"ModuleNotFoundError: No module named '([^']+)'", text)
    errors = int(m.group(1)) if (m := re.search(r"(\d+) errors?", summary)) else 0
    collecting = len(re.findall(r"ERROR collecting", text))
    failed = re.search(r"\d+ failed", summary) is not None
    ok = code == 0 or (not failed and errors == collecting <= len(not_found))
    return {"ran": True, "ok": ok, "summary": summary, "modules_missing": sorted(set(not_found)),
            "seconds": time.perf_counter() - t0, "tail": text.strip().splitlines()[-15:]}


# --- main --------------------------------------------------------------------------------------

def machine_info(device: torch.device) -> dict:
    import inference_internals

    info = {"device": describe(device), "torch": torch.__version__, "python": platform.python_version(),
            "code": str(Path(inference_internals.__file__).parent),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", memory_GB=props.total_memory / 1e9,
                    cuda=torch.version.cuda, sms=props.multi_processor_count)
    return info


def render(rep: Report) -> list[str]:
    """The three-regime figure of each measured dtype, beside the JSON (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inference_course.gpu_report import regimes_figure

    paths = []
    for dt in rep.data.get("measurements", {}):
        fig = regimes_figure(rep.data, dt)
        path = rep.out.with_name(f"{rep.out.stem}-regimes-{dt}.png")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(str(path))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when there is one)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model and quick measurements (the CPU test)")
    ap.add_argument("--out", type=Path, help="the JSON to write, or a folder for gpu-<name>.json in it "
                                             "(default on CUDA: benchmarks/results/; on a CPU: nowhere)")
    ap.add_argument("--no-tests", action="store_true", help="skip the unit tests")
    ap.add_argument("--tests-timeout", type=float, default=240)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = get_device(args.device)
    cuda = device.type == "cuda"
    nested = os.environ.get(GUARD) == "1"
    os.environ[GUARD] = "1"  # for everything this run starts
    # SIGTERM (`timeout`, a machine being handed back) ends the run as an exception would: the
    # unit tests' process group is killed on the way out, and the JSON already holds every section done
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out
    if out is None and cuda:
        out = ROOT / "benchmarks" / "results"
    if out is not None and out.is_dir():
        name = torch.cuda.get_device_name(device) if cuda else "cpu"
        out = out / f"gpu-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}.json"
    rep = Report(out)
    r = rep.data
    r.update(machine=machine_info(device), needs_real_weights=REAL_WEIGHTS_ONLY)
    log(f"gpu-check on {r['machine']['device']}, torch {torch.__version__}" + (f"; writing {out}" if out else ""))
    if not cuda:
        r["skipped"].append("the CUDA-only calls (graph capture and replay, CUDA events, the GPU's free memory) "
                            "and the 16-bit dtype: no CUDA device here")

    tmp = tempfile.TemporaryDirectory(prefix="gpu-check-")
    real = None if args.tiny else real_weights_folder()
    if real is not None:
        folder, r["weights"] = real, f"real: {real}"
    else:
        folder = save_random_checkpoint(TINY if args.tiny else LlamaConfig(), Path(tmp.name))
        r["weights"] = ("random, tiny config" if args.tiny else
                        "random, SmolLM2-135M's exact config (the real weights are absent)")
    log(f"weights: {r['weights']}")
    os.environ["INFERENCE_INTERNALS_MODEL"] = str(folder)  # every loader reads this folder
    rep.write()

    plan = QUICK if args.tiny else Plan()
    rng = random.Random(0)
    prompts = [[rng.randrange(TINY.vocab_size if args.tiny else 49152) for _ in range(n)] for n in (24, 24, 24)]
    arbiter = rep.section("load the fp32 CPU arbiter", lambda: Llama.from_pretrained(folder, device="cpu",
                                                                                     dtype=torch.float32),
                          into={}, key="arbiter")
    dtypes = list(dict.fromkeys([torch.float32] + ([default_dtype(device)] if cuda else [])))
    for dt in dtypes:
        key = f"{device.type}/{DT_NAMES[dt]}"
        rep.section(f"engine checks {key}", lambda: engine_checks(folder, device, dt, arbiter, prompts, plan.check_new),
                    into=r["checks"], key=key)
    for dt in dict.fromkeys([default_dtype(device), torch.float32]):
        measurements(rep, folder, device, dt, plan)
    if out is not None:
        r["figures"] = rep.section("figures", lambda: render(rep), into={}, key="figures")
    # Last: the figures above are what a short loan must not lose; the tests have their own limit.
    why_not = tests_skipped(args.no_tests, nested, cuda)
    if why_not:
        r["skipped"].append(f"the unit tests ({why_not})")
    else:
        rep.section("unit tests", lambda: unit_tests(device, args.tests_timeout), key="unit_tests")

    r["seconds"] = time.perf_counter() - t_start
    r["ok"] = (all(s["ok"] for s in r["sections"].values()) and len(r["checks"]) == len(dtypes)
               and all(c["ok"] for c in r["checks"].values()) and r.get("unit_tests", {}).get("ok", True) is not False)
    rep.write()
    for s in r["skipped"]:
        log(f"skipped: {s}")
    if real is None:
        log("needs the real weights (not run here): " + "; ".join(REAL_WEIGHTS_ONLY))
    failed = [n for n, s in r["sections"].items() if not s["ok"]]
    log(f"gpu-check {'passed' if r['ok'] else 'FAILED'} in {r['seconds']:.0f} s"
        + (f"; sections with errors: {', '.join(failed)}" if failed else "") + (f"; wrote {out}" if out else ""))
    tmp.cleanup()
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
