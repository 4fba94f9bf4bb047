"""Issue 53's Aim, measured: the door's fast engine (``LLM(quantization="q4_1", compile=True)``) behind
the OpenAI-compatible server, sixteen streams at once against one alone and against the same requests
through ``LLM.generate`` in one process.

    make bench BENCH_ARGS="--only serving --out benchmarks/results/serving.json"

The server runs as a reader starts it, in a process of its own (``python -m inference_internals.serve
--quantization q4_1 --compile``); this process sends the requests (``analysis.http_load``: streamed,
greedy, EOS ignored, so every request makes exactly its tokens) and runs ``LLM.generate`` on an
engine built the same way. Round by round, alternating: generate() one request, then sixteen; over
HTTP one stream, then sixteen at once. Reported per round and as median (min-max): each path's time
per output token (TPOT: first token to last, per gap) of the lone request and of the slowest of the
sixteen, and the sixteen's throughput (output tokens over first send to last token).
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time

from .common import ROOT, stats

N, PROMPT_LEN, OUTPUT_LEN = 16, 32, 24
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, threads: int | None) -> subprocess.Popen:
    import httpx
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "inference_internals.serve", "--quantization", "q4_1", "--compile",
           "--max-num-seqs", str(N), "--max-model-len", "512", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600  # loading and compiling: about a minute on 2 cores
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("the server did not answer within 600 s")


def _generate_round(llm, ids, params) -> dict:
    out = {}
    for n in (1, N):
        t = time.perf_counter()
        outs = llm.generate(ids[:n], params)
        s = time.perf_counter() - t
        tpots = [o.metrics.tpot for o in outs]  # first token to last, per gap, as the client clocks it
        out[n] = {"tpot_worst": max(tpots), "tps": n * OUTPUT_LEN / s, "texts": [o.outputs[0].text for o in outs]}
    return out


def _http_round(url, ids, model, sizes=(1, N)) -> dict:
    from inference_internals.analysis import http_load
    from inference_internals.analysis.trace import TraceRequest
    trace = [TraceRequest(PROMPT_LEN, OUTPUT_LEN, OUTPUT_LEN)] * N
    out = {}
    for n in sizes:
        run = http_load.run(url, ids[:n], trace[:n], [0.0] * n, model, timeout_s=300)
        if run.refused or run.cut or len(run.timed) != n:
            raise RuntimeError(f"{n} streams: {run.refused} refused, {run.cut} cut")
        span = max(t.finish for t in run.timed) - min(t.arrival for t in run.timed)
        out[n] = {"tpot_worst": max(t.tpot for t in run.timed), "tps": n * OUTPUT_LEN / span, "texts": run.texts,
                  "ttft_worst": max(t.ttft for t in run.timed)}
    return out


def bench_serving(args, device) -> dict:
    from inference_internals import LLM, SamplingParams

    rng = random.Random(16)
    ids = [rng.choices(range(3, 49000), k=PROMPT_LEN) for _ in range(N)]
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True)
    port = _free_port()
    proc = _start_server(port, args.threads)
    try:
        llm = LLM(quantization="q4_1", compile=True, max_num_seqs=N, num_blocks=N * 4 + 8,
                  enable_prefix_caching=False)
        llm.generate(ids, params)  # compiles the steps here too: a batch's, then one sequence's
        llm.generate(ids[:1], params)
        _http_round(f"http://127.0.0.1:{port}", ids, MODEL, sizes=(N, 1))  # the HTTP side warm too
        rounds = []
        for _ in range(args.serving_rounds):
            g = _generate_round(llm, ids, params)
            h = _http_round(f"http://127.0.0.1:{port}", ids, MODEL)
            if h[N]["texts"] != g[N]["texts"]:
                raise RuntimeError("over HTTP the texts differ from generate()'s")
            rounds.append({"generate": {n: {k: v for k, v in d.items() if k != "texts"} for n, d in g.items()},
                           "http": {n: {k: v for k, v in d.items() if k != "texts"} for n, d in h.items()}})
            print(f"  round {len(rounds)}: generate TPOT lone {g[1]['tpot_worst'] * 1e3:.1f} ms, worst of 16 "
                  f"{g[N]['tpot_worst'] * 1e3:.1f} ms, {g[N]['tps']:.0f} tok/s | HTTP lone "
                  f"{h[1]['tpot_worst'] * 1e3:.1f} ms, worst of 16 {h[N]['tpot_worst'] * 1e3:.1f} ms, "
                  f"{h[N]['tps']:.0f} tok/s", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()

    def per_round(f):
        return stats([f(r) for r in rounds])

    return {
        "engine": 'LLM(quantization="q4_1", compile=True); server: python -m inference_internals.serve '
                  "--quantization q4_1 --compile, its own process",
        "requests": {"n": N, "prompt_tokens": PROMPT_LEN, "output_tokens": OUTPUT_LEN},
        "rounds": rounds,
        "http_worst_tpot_over_lone": per_round(lambda r: r["http"][N]["tpot_worst"] / r["http"][1]["tpot_worst"]),
        "http_tps_over_generate": per_round(lambda r: r["http"][N]["tps"] / r["generate"][N]["tps"]),
        "generate_worst_tpot_over_lone": per_round(
            lambda r: r["generate"][N]["tpot_worst"] / r["generate"][1]["tpot_worst"]),
        "aim": "every stream's TPOT within 2x a lone stream's; throughput within 10% of generate()",
    }
