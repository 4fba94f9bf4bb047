"""The OpenAI-compatible server (``inference_internals.serve``) with the real ``openai`` client.

One server for the file, on 127.0.0.1 and a free port, over one engine; the references come from
``LLM.generate`` / ``LLM.chat`` on that same engine before the server starts stepping it. After every
fault the pool's invariants are checked on the engine thread (``BlockPool.check``) and, once the
server is idle, every block is back (no block held by anyone).
"""
from __future__ import annotations

import json
import threading
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from inference_internals import LLM, SamplingParams  # noqa: E402
from inference_internals.generate import chat_prompt  # noqa: E402
from inference_internals.serve import Running, Server, ServerConfig  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 128          # small, so "past the context" and "cut to the room" are cheap to reach
PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
SEEDED = dict(temperature=0.8, top_p=0.95, seed=7)
WITNESS = "Once upon a time"     # a request that runs beside each fault and must not notice it


@pytest.fixture(scope="module")
def served():
    llm = LLM(num_blocks=64, max_num_seqs=8)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    outs = [o.outputs[0] for o in llm.generate(  # one call, one batch: the references in a few steps
        PROMPTS + [chat_prompt(CHAT), PROMPTS[0], WITNESS],
        [greedy, greedy, greedy, SamplingParams(max_tokens=6, **SEEDED), SamplingParams(temperature=0, max_tokens=12)])]
    refs = {"greedy": outs[:2], "chat": outs[2], "seeded": outs[3], "witness": outs[4]}
    assert llm.pool.num_used == 0
    for r in list(llm.requests):  # the references leave the engine: the server starts with none in it
        llm.forget(r)
    server = Server(llm, ServerConfig(MODEL, MAX_MODEL_LEN, max_num_seqs=8, max_queued_requests=2))
    with Running(server) as run:
        yield run, refs


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0, timeout=120)


def pool_ok(run, idle: bool = True) -> None:
    """The allocator's invariants, checked between two steps; idle: every block back in the pool."""
    loop = run.engine_loop
    if idle:
        deadline = time.monotonic() + 60
        # (in_flight drops when the HTTP side is done with a request: just after its last event was sent)
        while loop.call_sync(lambda e: e.has_unfinished()) or loop.in_flight:
            assert time.monotonic() < deadline, "the engine never went idle"
            time.sleep(0.05)
    loop.call_sync(lambda e: e.pool.check(e.scheduler.sequences))
    if idle:
        assert loop.call_sync(lambda e: e.pool.num_used) == 0
        # answered requests leave the engine: a server that runs for weeks holds only those in flight
        assert loop.call_sync(lambda e: list(e.requests)) == []


class Witness:
    """A greedy streamed completion running in a thread beside a fault; its text must be the reference's."""

    def __init__(self, client):
        self.text, self.started = None, threading.Event()
        self.thread = threading.Thread(target=self._run, args=(client,), daemon=True)
        self.thread.start()
        assert self.started.wait(60)

    def _run(self, client):
        parts = []
        for chunk in client.completions.create(model=MODEL, prompt=WITNESS, max_tokens=12, temperature=0,
                                               stream=True):
            parts.append(chunk.choices[0].text)
            self.started.set()
        self.text = "".join(parts)

    def check(self, refs):
        self.thread.join(120)
        assert self.text == refs["witness"].text


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_equals_generate(served, client):
    run, refs = served
    for prompt, ref in zip(PROMPTS, refs["greedy"]):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
        assert r.choices[0].text == ref.text and r.choices[0].finish_reason == ref.finish_reason
        assert r.usage.completion_tokens == len(ref.token_ids)
    pool_ok(run)


def test_streamed_completion_equals_generate(served, client):
    run, refs = served
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == refs["greedy"][0].text
    assert chunks[-1].choices[0].finish_reason == refs["greedy"][0].finish_reason
    assert len(chunks) >= 3, "a stream arrives in pieces, not as one answer"
    pool_ok(run)


def test_chat_streamed_and_not_equals_llm_chat(served, client):
    run, refs = served
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == refs["chat"].text
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == refs["chat"].text
    assert chunks[-1].usage.completion_tokens == len(refs["chat"].token_ids)
    pool_ok(run)


def test_four_concurrent_same_seed_requests_are_identical_and_equal_generate(served, client):
    run, refs = served
    texts = [None] * 4

    def one(i):
        texts[i] = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, **SEEDED).choices[0].text
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert texts == [refs["seeded"].text] * 4
    pool_ok(run)


def test_a_request_joins_the_running_batch(served, client):
    """Continuous batching over HTTP: a short request sent while a longer one streams is decoded in the
    same steps and finishes first, without waiting for the longer one."""
    run, refs = served
    first = run.engine_loop.call_sync(lambda e: len(e.stats))
    witness = Witness(client)  # 12 tokens, streaming: it is running now
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=2, temperature=0)
    assert witness.thread.is_alive(), "the short request finished while the long one still ran"
    witness.check(refs)
    assert r.choices[0].text == refs["greedy"][1].text[:len(r.choices[0].text)]
    steps = run.engine_loop.call_sync(lambda e: e.stats[first:])
    assert max(s.batch_size for s in steps) == 2 and any(s.kind != "prefill" and s.batch_size == 2 for s in steps)
    pool_ok(run)


def test_n_logprobs_and_stop(served, client):
    run, _ = served
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=4, n=2, seed=3, logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) > 0
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=6, temperature=0, stop=[" 6"])
    assert " 6" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0, logprobs=True,
                                       top_logprobs=2)
    assert all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content)
    pool_ok(run)


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (json.dumps({"model": "gpt-4", "prompt": "hi"}).encode(), 404, "model_not_found"),
    (json.dumps({"model": MODEL, "prompt": "hi " * 200}).encode(), 400, "context_length_exceeded"),
    (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode(), 400, "invalid_value"),
    (json.dumps({"model": MODEL, "prompt": "hi", "temperature": -1}).encode(), 400, "invalid_value"),
    (json.dumps({"model": MODEL, "prompt": "hi", "logit_bias": {"5": 1}}).encode(), 400, "unsupported_parameter"),
    (json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400, "invalid_value"),
])
def test_bad_requests_get_their_clear_answer(served, body, status, code):
    run, _ = served
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    r = httpx.post(run.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["code"] == code
    pool_ok(run)


def test_the_engines_refusal_reaches_the_client_with_its_message(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="hi", temperature=-1)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi")
    assert e.value.code == "model_not_found"


def test_unknown_path_and_wrong_method(served):
    run, _ = served
    r = httpx.post(run.url + "/v1/embeddings", json={}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["message"]
    assert httpx.get(run.url + "/v1/completions", timeout=30).status_code == 405


def test_huge_max_tokens_is_cut_to_the_room_left(served, client):
    run, _ = served
    prompt = "a " * 110
    ids = run.server.engine.tokenizer.encode(prompt)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10 ** 9, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == MAX_MODEL_LEN - len(ids)
    pool_ok(run)


def test_a_client_killed_mid_stream_is_aborted_and_its_blocks_freed(served, client):
    run, refs = served
    witness = Witness(client)
    loop = run.engine_loop
    n_before = len(loop.recent)
    with httpx.stream("POST", run.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 100, "ignore_eos": True,
                            "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one token seen: the client goes away
    witness.check(refs)
    pool_ok(run)
    mine = [q for q in loop.call_sync(lambda e: list(loop.recent)[n_before:]) if q.params.max_tokens == 100]
    assert len(mine) == 1 and mine[0].error and "client went away" in mine[0].error
    assert len(mine[0].outputs[0]) < 100, "aborted, not decoded to the end"


def test_overload_gets_503_with_retry_after_never_a_hang(served, client):
    run, refs = served
    bound = run.engine_loop.max_in_flight  # 8 running + 2 waiting
    witness = Witness(client)
    streams = []
    try:
        for _ in range(bound - 1):  # the witness holds one place
            cm = httpx.stream("POST", run.url + "/v1/completions", timeout=60,
                              json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 40, "ignore_eos": True,
                                    "stream": True})
            streams.append(cm)
            assert cm.__enter__().status_code == 200
        t = time.monotonic()
        r = httpx.post(run.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "server_overloaded"
        assert time.monotonic() - t < 5, "refused at once, not after a wait"
    finally:
        for cm in streams:
            cm.__exit__(None, None, None)
    witness.check(refs)
    pool_ok(run)
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    assert r.choices[0].text == refs["greedy"][0].text  # served again once there is room


def test_cli_flags_are_vllms():
    from inference_internals.serve import parser
    args = parser().parse_args(["--quantization", "q4_1", "--compile", "--max-num-seqs", "16",
                                "--max-num-batched-tokens", "512", "--port", "8123", "--kv-cache-dtype", "float16",
                                "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert (args.quantization, args.compile, args.max_num_seqs, args.max_num_batched_tokens, args.port,
            args.kv_cache_dtype) == ("q4_1", True, 16, 512, 8123, "float16")
    assert parser().parse_args([]).kv_cache_dtype == "auto"
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert args.host == "127.0.0.1"


def test_the_command_line_server_answers_and_stops_on_sigterm(served):
    """``python -m inference_internals.serve`` as a reader starts it: the engine steps in the main thread,
    HTTP beside it; greedy output is LLM.generate's, and SIGTERM ends it cleanly."""
    import signal
    import subprocess
    import sys

    from test_lab import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inference_internals.serve", "--port", str(port),
                             "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0})
        assert r.json()["choices"][0]["text"] == served[1]["greedy"][0].text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
