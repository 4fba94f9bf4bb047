"""A bounded load generator for the OpenAI-compatible server: Poisson arrivals over real HTTP.

    out = run(url, prompts, trace, poisson_arrivals(n, rate), timeout_s=30)
    load.summarize(out.timed)        # TTFT, TPOT, throughput, as load.simulate's runs are summarized

Request i is sent ``arrivals[i]`` seconds after the start, streamed (``ignore_eos``, greedy,
``max_tokens`` = its trace's output length, so it generates exactly that many tokens, as the
simulator's stand-in requests do); the client clocks its arrival (the moment it sends), its first
token (the first streamed chunk with text) and its last. The run is bounded: a count (one request
per arrival) and a time (``timeout_s`` for the whole run; what is unfinished then is cancelled,
so its connection closes and the server aborts it). A request the server refuses (503) is
counted, not retried.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from .load import Timed


@dataclass
class LoadRun:
    timed: list[Timed]        # the finished requests, in the order they were sent
    texts: list[str | None]   # each request's text (None: refused, failed or cut)
    refused: int              # answered with an error status (503 when the server is full), or failed
    cut: int                  # still running at timeout_s, cancelled


async def _one(client, url: str, model: str, prompt, max_tokens: int, t0: float, at: float):
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    first = last = None
    tokens, parts = 0, []
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            text = "".join(c.get("text") or "" for c in chunk.get("choices", []))
            if text:
                first = first if first is not None else now
                last = now
                parts.append(text)
    return Timed(sent - t0, first - t0, last - t0, tokens), "".join(parts)


async def _run(url, prompts, trace, arrivals, model, timeout_s):
    import httpx
    limits = httpx.Limits(max_connections=len(prompts) + 1, max_keepalive_connections=len(prompts) + 1)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.perf_counter() + 0.05
        tasks = [asyncio.ensure_future(_one(client, url, model, p, r.output_len, t0, a))
                 for p, r, a in zip(prompts, trace, arrivals)]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    results = [t.result() if t in done and t.exception() is None else None for t in tasks]
    ok = [r for r in results if isinstance(r, tuple)]
    return LoadRun([r[0] for r in ok], [r[1] if isinstance(r, tuple) else None for r in results],
                   sum(1 for t, r in zip(tasks, results) if t in done and not isinstance(r, tuple)), len(pending))


def run(url: str, prompts, trace, arrivals, model: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
        timeout_s: float = 60.0) -> LoadRun:
    """The finished requests' ``Timed`` and texts, how many were refused or failed, how many were
    cut at ``timeout_s``. Blocking: runs its own event loop (in a thread when one is already running, as
    in a notebook)."""
    if not len(prompts) == len(trace) == len(arrivals):
        raise ValueError("need one prompt and one arrival time per request")
    coro = _run(url, list(prompts), list(trace), list(arrivals), model, timeout_s)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
