"""An OpenAI-compatible server over the one engine: ``python -m inference_internals.serve``.

    python -m inference_internals.serve --port 8000                 # 127.0.0.1 unless --host says
    python -m inference_internals.serve --quantization q4_1 --compile --max-num-seqs 16
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 8}'

It is an asynchronous front over ``engine.LLMEngine``'s step loop and nothing else (vLLM's
``AsyncLLM`` over its ``EngineCore``): the engine steps in a thread of its own (``EngineLoop``), and
the HTTP side (FastAPI on uvicorn, server-sent events for streams) only hands it requests and
aborts, and reads what each step produced. A request that arrives while a step runs is added at the
next step boundary and joins the running batch there, as chapter 5 draws it; a client that goes
away is aborted at the next boundary, its blocks back in the pool at once.

Every request is checked once, by the engine's own check (``SamplingParams`` and
``SamplingParams.request``): what it refuses is an HTTP 400 in OpenAI's error shape, with the
engine's message. What the server adds is vLLM's server-side limits: ``--max-model-len`` (a
prompt at or past it is a 400; ``max_tokens`` is cut to the room left, so a huge one ends with
finish_reason "length") and a bound on requests in the server (``--max-num-seqs`` running plus
``--max-queued-requests`` waiting, SGLang's name): one past it gets 503 with ``Retry-After`` at
once, never a hang. The flags are ``vllm serve``'s names.

Endpoints: ``/v1/completions``, ``/v1/chat/completions`` (the model's chat template,
``generate.chat_prompt``), ``/v1/models``, ``/health``.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import queue
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from .config import HF_NAME
from .engine.block_pool import OutOfBlocksError
from .generate import chat_prompt
from .params import SamplingParams

# OpenAI request fields this server reads, beside the vLLM extras that go to SamplingParams as they are.
VLLM_EXTRAS = ("top_k", "min_p", "min_tokens", "ignore_eos", "repetition_penalty", "stop_token_ids",
               "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
               "logit_bias", "allowed_token_ids", "bad_words")
# OpenAI fields with no counterpart here: set to anything but their default, a 400 that says so.
UNSUPPORTED = {"tools": None, "tool_choice": None, "functions": None, "response_format": None,
               "best_of": None, "suffix": None, "echo": False, "prompt_logprobs": None}


class APIError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# --- the engine's side: one thread steps, everything else talks to it through its inbox ---------

@dataclass
class Stream:
    """One HTTP request's view of its engine request: the events the engine thread sends it."""
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    request: object = None        # the engine's Request, once added
    sent: dict = field(default_factory=dict)    # sample index -> (tokens sent, text sent)
    finished: bool = False

    def put(self, event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class EngineLoop:
    """The engine in a thread of its own. Between two steps it takes what the HTTP side queued (adds,
    aborts, calls), then steps if anything is unfinished, then tells each stream what it got."""

    def __init__(self, engine, max_in_flight: int, stats_kept: int = 10_000):
        self.engine = engine
        self.max_in_flight = max_in_flight
        self.in_flight = 0             # requests accepted and not yet finished (the HTTP side counts)
        self.stats_kept = stats_kept   # engine.stats grows by one per step: a server keeps the last ones
        # answered requests leave the engine (engine.forget); the last ones stay here, for a look after
        self.recent: collections.deque = collections.deque(maxlen=1000)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.streams: dict[int, Stream] = {}
        self.stopping = False
        self.finished = threading.Event()  # the step loop has returned
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        if not self.thread.is_alive():  # (run_here: the caller's thread steps)
            self.thread.start()

    def run_here(self, beside: threading.Thread) -> None:
        """Step in the calling thread until ``stop()`` (the command line's main thread: see ``main``), with
        ``beside`` (the HTTP side) started once this thread is the one ``start()`` finds stepping."""
        self.thread = threading.current_thread()
        beside.start()
        self._run()

    def stop(self) -> None:
        """Abort what is still running (its clients get their answers' ends), then end the thread."""
        def abort_all(engine):
            for stream in list(self.streams.values()):
                engine.abort(stream.request, "the server is shutting down")
                self._publish_one(stream)
        if self.thread.is_alive() and not self.finished.is_set():
            try:
                self.call_sync(abort_all, timeout=30)
            except TimeoutError:
                pass
        self.stopping = True
        self.wake.set()
        self.finished.wait(timeout=30)

    def _send(self, command) -> None:
        self.inbox.put(command)
        self.wake.set()

    async def call(self, fn):
        """``fn(engine)`` on the engine thread, between two steps (for checks: the pool's invariants)."""
        fut = asyncio.get_running_loop().create_future()
        self._send(("call", fn, fut))
        return await fut

    def call_sync(self, fn, timeout: float = 60):
        """The same from a thread that is not the server's event loop (a test, a notebook)."""
        done, box = threading.Event(), {}

        def run(engine):
            try:
                box["value"] = fn(engine)
            except BaseException as e:  # noqa: BLE001 (handed back to the caller)
                box["error"] = e
            done.set()
        self._send(("call_sync", run))
        if not done.wait(timeout):
            raise TimeoutError(f"the engine thread did not answer within {timeout} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    async def add(self, prompt_ids: list[int], params: SamplingParams) -> Stream:
        """Queue a request for the next step boundary; its ``Stream`` once the engine took it."""
        loop = asyncio.get_running_loop()
        stream, fut = Stream(params, loop), loop.create_future()
        self._send(("add", prompt_ids, stream, fut))
        try:
            await fut  # raises what add_request raised (a 400)
        except asyncio.CancelledError:  # the client left before the next step boundary: it is added, then aborted
            self._send(("abort", stream))
            raise
        return stream

    def abort(self, stream: Stream) -> None:
        if not stream.finished:
            self._send(("abort", stream))

    # -- the thread --
    def _run(self) -> None:
        try:
            self._steps()
        finally:
            self.finished.set()

    def _steps(self) -> None:
        engine = self.engine
        while not self.stopping:
            self._drain()
            if not engine.has_unfinished():
                self.wake.wait(0.5)
                self.wake.clear()
                continue
            try:
                engine.step()
            except Exception as e:  # noqa: BLE001 (a step that fails fails its requests, not the server)
                for stream in list(self.streams.values()):
                    engine.abort(stream.request, f"the engine's step failed: {type(e).__name__}: {e}")
            if len(engine.stats) > 2 * self.stats_kept:
                del engine.stats[:-self.stats_kept]
            self._publish()

    def _drain(self) -> None:
        while True:
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                return
            kind = cmd[0]
            if kind == "add":
                _, ids, stream, fut = cmd
                try:
                    stream.request = self.engine.add_request(ids, stream.params)
                    self.streams[stream.request.id] = stream
                    stream.loop.call_soon_threadsafe(_resolve, fut, None, None)
                except Exception as e:  # noqa: BLE001 (the engine's refusal, for the HTTP side)
                    stream.loop.call_soon_threadsafe(_resolve, fut, None, e)
            elif kind == "abort":
                stream = cmd[1]
                req = stream.request
                if req is not None and req.id in self.streams and not req.finished:
                    self.engine.abort(req, "the client went away")
                    self._publish_one(stream)
            elif kind == "call":
                _, fn, fut = cmd
                try:
                    value, err = fn(self.engine), None
                except Exception as e:  # noqa: BLE001
                    value, err = None, e
                fut.get_loop().call_soon_threadsafe(_resolve, fut, value, err)
            elif kind == "call_sync":
                cmd[1](self.engine)

    def _publish(self) -> None:
        for stream in list(self.streams.values()):
            self._publish_one(stream)

    def _publish_one(self, stream: Stream) -> None:
        """What ``stream``'s request has that its client has not seen: text deltas per sample, and at
        the end the engine's own output (its texts, finish reasons, logprobs)."""
        engine, req = self.engine, stream.request
        p = req.params
        tok = engine.tokenizer
        hold = max((len(s) for s in p.stop or ()), default=1) - 1  # a stop string may be forming
        for s in req.seqs:
            n_sent, text_sent = stream.sent.get(s.sample_index, (0, ""))
            ids = s.output_ids
            if len(ids) == n_sent or req.finished:
                continue
            text = tok.decode(ids, skip_special_tokens=p.skip_special_tokens) if p.detokenize else ""
            if s.finish_reason is None:
                if text.endswith("\ufffd"):  # a character split over tokens: wait for its other bytes
                    text = text.rstrip("\ufffd")
                text = text[:len(text) - hold] if hold else text
            if not text.startswith(text_sent):
                text = text_sent
            stream.sent[s.sample_index] = (len(ids), text)
            new_ids = ids[n_sent:]
            logprobs = None
            if p.logprobs is not None and getattr(s.sampler, "recorder", None) is not None:
                logprobs = s.sampler.recorder.positions(_decoder(engine, p))[n_sent:len(ids)]
            if text != text_sent or new_ids:
                stream.put(("delta", s.sample_index, text[len(text_sent):], new_ids, logprobs))
        if req.finished:
            out = engine.output(req)
            for o in out.outputs:  # the rest of each text, as the engine ends it (stop strings cut)
                n_sent, text_sent = stream.sent.get(o.index, (0, ""))
                rest = o.text[len(text_sent):] if o.text.startswith(text_sent) else ""
                lp = o.logprobs[n_sent:] if o.logprobs is not None else None
                stream.put(("delta", o.index, rest, o.token_ids[n_sent:], lp))
            stream.finished = True
            del self.streams[req.id]
            self.recent.append(req)
            engine.forget(req)
            stream.put(("done", out))


def _decoder(engine, p):
    if engine.tokenizer is None or not p.detokenize:
        return None
    return lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=False)


def _resolve(fut: asyncio.Future, value, error) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


# --- the HTTP side ---------------------------------------------------------------------------

@dataclass
class ServerConfig:
    served_model_name: str = HF_NAME
    max_model_len: int = 8192
    max_num_seqs: int = 64
    max_queued_requests: int = 64
    retry_after_s: int = 1


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", code, param)


def sampling_params(body: dict, max_tokens, chat: bool) -> SamplingParams:
    """The request's fields as ``SamplingParams`` (their one check: a refusal is a 400 with its message)."""
    for name, default in UNSUPPORTED.items():
        if body.get(name, default) not in (default, [], {}) and not (name == "tool_choice" and body[name] == "none"):
            raise _bad(f"{name!r} is not supported by this server", name, "unsupported_parameter")
    kw = {k: body[k] for k in VLLM_EXTRAS if body.get(k) is not None}
    for name in ("n", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
        if body.get(name) is not None:
            kw[name] = body[name]
    if body.get("stop") is not None:
        kw["stop"] = body["stop"]
    if chat:
        if body.get("logprobs"):
            kw["logprobs"] = body.get("top_logprobs") or 0
    elif body.get("logprobs") is not None:
        kw["logprobs"] = body["logprobs"]
    kw["max_tokens"] = max_tokens
    try:
        return SamplingParams(**kw)
    except NotImplementedError as e:
        raise _bad(str(e), code="unsupported_parameter") from None
    except (TypeError, ValueError) as e:
        raise _bad(str(e)) from None


class Server:
    """The FastAPI app over one ``EngineLoop``. ``Server(engine).app`` is the ASGI app."""

    def __init__(self, engine, config: ServerConfig | None = None):
        self.engine, self.config = engine, config or ServerConfig()
        c = self.config
        self.loop = EngineLoop(engine, c.max_num_seqs + c.max_queued_requests)
        self.created = int(time.time())
        @contextlib.asynccontextmanager
        async def lifespan(_app):
            self.loop.start()
            try:
                yield
            finally:
                await asyncio.get_running_loop().run_in_executor(None, self.loop.stop)

        self.app = app = FastAPI(title="inference_internals.serve", docs_url=None, redoc_url=None, openapi_url=None,
                                 lifespan=lifespan)

        @app.exception_handler(APIError)
        async def api_error(_request, e: APIError):
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

        @app.exception_handler(HTTPException)
        async def http_error(_request, e: HTTPException):  # unknown path (404), wrong method (405)
            type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
            return JSONResponse(APIError(e.status_code, str(e.detail), type_).body(), status_code=e.status_code,
                                headers=getattr(e, "headers", None))

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [self._model_card()]}

        @app.get("/v1/models/{name:path}")
        async def model(name: str):
            self._check_model(name)
            return self._model_card()

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self._handle(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            return await self._handle(request, chat=True)


    def _model_card(self) -> dict:
        return {"id": self.config.served_model_name, "object": "model", "created": self.created,
                "owned_by": "inference_internals", "max_model_len": self.config.max_model_len}

    def _check_model(self, name) -> None:
        if name is not None and name != self.config.served_model_name:
            raise APIError(404, f"The model `{name}` does not exist: this server serves "
                                f"`{self.config.served_model_name}`", "not_found_error", "model_not_found", "model")

    # -- one request --
    async def _handle(self, request, chat: bool):
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise _bad(f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object", code="invalid_json")
        self._check_model(body.get("model"))
        ids = self._prompt_ids(body, chat)
        room = self.config.max_model_len - len(ids)
        if room < 1:
            raise _bad(f"This model's maximum context length is {self.config.max_model_len} tokens; the prompt "
                       f"has {len(ids)} tokens, which leaves no room for output", "messages" if chat else "prompt",
                       "context_length_exceeded")
        asked = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None \
            else body.get("max_tokens")
        if asked is None:
            asked = room if chat else 16  # OpenAI's completions default 16; chat: up to the context
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > room:
            asked = room  # vLLM: max_tokens cut to the room the context leaves
        params = sampling_params(body, asked, chat)
        stream_ = body.get("stream", False)
        if not isinstance(stream_, bool):
            raise _bad("stream must be a boolean", "stream")
        if self.loop.in_flight >= self.loop.max_in_flight:
            raise APIError(503, f"the server is full: {self.loop.in_flight} requests in it (at most "
                                f"{self.config.max_num_seqs} running and {self.config.max_queued_requests} waiting); "
                                "retry later", "server_overloaded", "server_overloaded",
                           headers={"Retry-After": str(self.config.retry_after_s)})
        self.loop.in_flight += 1
        try:
            s = await self.loop.add(ids, params)
        except (TypeError, ValueError, NotImplementedError, OutOfBlocksError) as e:
            self.loop.in_flight -= 1
            raise _bad(str(e)) from None
        except BaseException:
            self.loop.in_flight -= 1
            raise
        meta = dict(id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, created=int(time.time()),
                    model=self.config.served_model_name, prompt_tokens=len(ids))
        if stream_:
            opts = body.get("stream_options") or {}
            return StreamingResponse(self._sse(s, chat, meta, bool(opts.get("include_usage"))),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._whole(request, s, chat, meta)

    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        tok = self.engine.tokenizer
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _bad("messages must be a non-empty list of {role, content}", "messages")
            flat = []
            for m in messages:
                if not isinstance(m, dict):
                    raise _bad("each message must be an object with role and content", "messages")
                content = m.get("content")
                if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
                    if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
                        raise _bad("only text content parts are supported", "messages")
                    content = "".join(part.get("text", "") for part in content)
                flat.append({"role": m.get("role"), "content": content})
            try:
                return tok.encode(chat_prompt(flat))
            except (TypeError, ValueError) as e:
                raise _bad(str(e), "messages") from None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise _bad("prompt is empty", "prompt")
            return tok.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            vocab = self.engine.model.config.vocab_size
            if not all(0 <= t < vocab for t in prompt):
                raise _bad(f"token ids must be in [0, {vocab})", "prompt")
            return list(prompt)
        raise _bad("prompt must be a non-empty string or a list of token ids (one prompt per request here)", "prompt")

    def _finished(self) -> None:
        self.loop.in_flight -= 1

    async def _whole(self, request, s: Stream, chat: bool, meta: dict):
        """A non-streamed answer; the request is aborted if the client goes away first."""
        disconnect = asyncio.ensure_future(_wait_disconnect(request))
        try:
            while True:
                get = asyncio.ensure_future(s.events.get())
                done, _ = await asyncio.wait({get, disconnect}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    return None  # nobody to answer
                event = get.result()
                if event[0] == "done":
                    out = event[1]
                    break
        finally:
            disconnect.cancel()
            if not s.finished:
                self.loop.abort(s)
            self._finished()
        if out.error is not None and "client went away" not in out.error:
            raise APIError(500, f"the request failed in the engine: {out.error}", "server_error", "engine_error")
        choices, out_k = [], s.params.logprobs
        for o in out.outputs:
            c = {"index": o.index, "finish_reason": o.finish_reason,
                 "stop_reason": o.stop_reason, "logprobs": self._logprobs(o.logprobs, o.token_ids, chat, out_k)}
            if chat:
                c["message"] = {"role": "assistant", "content": o.text}
            else:
                c["text"] = o.text
            choices.append(c)
        completion = sum(len(o.token_ids) for o in out.outputs)
        return {"id": meta["id"], "object": "chat.completion" if chat else "text_completion",
                "created": meta["created"], "model": meta["model"], "choices": choices,
                "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": completion,
                          "total_tokens": meta["prompt_tokens"] + completion}}

    async def _sse(self, s: Stream, chat: bool, meta: dict, include_usage: bool):
        """Server-sent events: one chunk per sample per step that added text, a last chunk per sample
        with its finish reason, then ``data: [DONE]``. A client that goes away cancels this generator
        (Starlette listens for the disconnect), and its request is aborted."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": meta["id"], "object": obj, "created": meta["created"], "model": meta["model"]}

        def chunk(choices, usage=None):
            d = dict(head, choices=choices)
            if usage is not None:
                d["usage"] = usage
            return f"data: {json.dumps(d)}\n\n"
        try:
            if chat:
                for i in range(s.params.n):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
            while True:
                event = await s.events.get()
                if event[0] == "delta":
                    _, i, text, ids, lp = event
                    if not text and lp is None:  # (a stop token: nothing to show)
                        continue
                    c = {"index": i, "logprobs": self._logprobs(lp, ids, chat, s.params.logprobs), "finish_reason": None}
                    if chat:
                        c["delta"] = {"content": text}
                    else:
                        c["text"] = text
                    yield chunk([c])
                else:
                    out = event[1]
                    if out.error is not None:
                        err = APIError(500, f"the request failed in the engine: {out.error}", "server_error")
                        yield f"data: {json.dumps(err.body())}\n\n"
                    for o in out.outputs:
                        c = {"index": o.index, "logprobs": None, "finish_reason": o.finish_reason,
                             "stop_reason": o.stop_reason}
                        if chat:
                            c["delta"] = {}
                        else:
                            c["text"] = ""
                        yield chunk([c])
                    if include_usage:
                        completion = sum(len(o.token_ids) for o in out.outputs)
                        yield chunk([], {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": completion,
                                         "total_tokens": meta["prompt_tokens"] + completion})
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not s.finished:
                self.loop.abort(s)
            self._finished()

    def _logprobs(self, positions, ids, chat: bool, k: int | None):
        """vLLM's per-position dicts in OpenAI's shape (chat: ``content`` entries with the top ``k``;
        completions: the four parallel lists, the top k and the chosen token, as vLLM gives them)."""
        if positions is None:
            return None
        tok = self.engine.tokenizer

        def text(t):
            return tok.decode([t], skip_special_tokens=False)
        if chat:
            content = []
            for t, pos in zip(ids, positions):
                top = sorted(pos.items(), key=lambda kv: -kv[1].logprob)[:k or 0]
                content.append({"token": text(t), "logprob": _finite(pos[t].logprob), "bytes": list(text(t).encode()),
                                "top_logprobs": [{"token": text(i), "logprob": _finite(v.logprob),
                                                  "bytes": list(text(i).encode())} for i, v in top]})
            return {"content": content}
        return {"tokens": [text(t) for t in ids], "token_logprobs": [_finite(pos[t].logprob) for t, pos in zip(ids, positions)],
                "top_logprobs": [{text(i): _finite(v.logprob) for i, v in pos.items()} for pos in positions],
                "text_offset": None}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf (OpenAI's and vLLM's stand-in)


async def _wait_disconnect(request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# --- starting it -----------------------------------------------------------------------------

def make_engine(args) -> object:
    from .llm import LLM
    settings = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                    block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype)
    for name in ("quantization", "device", "dtype", "speculative_config"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    if args.compile:
        settings["compile"] = True
    model = None if args.model in (None, HF_NAME) else args.model
    llm = LLM(model, num_blocks=1, **settings)  # the pool is sized below, once the context is known
    context = llm.model.config.max_position_embeddings
    max_model_len = min(args.max_model_len or context, context)
    blocks = args.num_gpu_blocks_override or -(-max_model_len // args.block_size)
    if blocks * args.block_size < max_model_len:
        raise SystemExit(f"--num-gpu-blocks-override {blocks} holds {blocks * args.block_size} tokens, "
                         f"less than one --max-model-len {max_model_len} sequence")
    llm._allocate(blocks)
    return llm, max_model_len


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference_internals.serve",
                                description="An OpenAI-compatible server over the engine (vllm serve's flags).")
    p.add_argument("model", nargs="?", default=None, help=f"a checkpoint folder; default {HF_NAME} (offline)")
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1: this machine only")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=HF_NAME)
    p.add_argument("--quantization", default=None, help="int8, q8_0, int4, int8_asym or q4_1")
    p.add_argument("--compile", action="store_true", help="compile the decode steps (a minute or two at start)")
    p.add_argument("--speculative-config", type=json.loads, default=None,
                   help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's context")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV blocks in the pool; default: one --max-model-len sequence's worth")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype), bfloat16 or float16")
    p.add_argument("--max-queued-requests", type=int, default=64,
                   help="requests waiting beyond --max-num-seqs before a 503 (SGLang's name)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    return p


def build(argv=None) -> tuple[Server, argparse.Namespace]:
    args = parser().parse_args(argv)
    engine, max_model_len = make_engine(args)
    # warm-up (and the compiles): a batch's decode steps, then one sequence's
    warm = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 4)]
    engine.generate([[1, 2, 3], [4, 5, 6]], warm)
    cfg = ServerConfig(args.served_model_name, max_model_len, args.max_num_seqs, args.max_queued_requests)
    return Server(engine, cfg), args


class Running:
    """A server in a background thread of this process, on its own socket (tests, the notebook)."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0):
        import uvicorn
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()
        self.url = f"http://{self.host}:{self.port}"
        self.uv = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", lifespan="on",
                                                timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)

    @property
    def engine_loop(self) -> EngineLoop:
        return self.server.loop

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None) -> None:
    import uvicorn
    server, args = build(argv)
    print(f"serving {server.config.served_model_name} on http://{args.host}:{args.port}/v1 "
          f"(max_model_len {server.config.max_model_len}, {server.engine.pool.num_blocks} KV blocks)", flush=True)
    uv = uvicorn.Server(uvicorn.Config(server.app, host=args.host, port=args.port, log_level="info",
                                       timeout_graceful_shutdown=5))
    # The engine steps in this thread, the one whose OpenMP team build()'s warm-up made; HTTP runs beside
    # it. torch's parallel work run from a second thread gets a second team, and with more OpenMP threads
    # than cores libgomp stops its threads' spin-waiting: the Q4_1 compiled step took 22 ms there against
    # 6 here (2-core Xeon), every step of the server's.
    http = threading.Thread(target=uv.run, name="http", daemon=True)

    def interrupt(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)  # (uvicorn handles signals only in the main thread)
    try:
        server.loop.run_here(beside=http)
    except KeyboardInterrupt:
        pass
    finally:
        server.loop.stopping = True
        uv.should_exit = True
        if http.is_alive():
            http.join(timeout=30)


if __name__ == "__main__":
    main()
