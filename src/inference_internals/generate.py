"""The autoregressive loop: prefill the prompt once, then decode one token per step.

Prefill runs all prompt tokens through the model in one pass and fills the KV cache;
each decode step feeds back only the newest token. Generation stops at an end-of-sequence
token, a stop token, or after ``max_new_tokens``.

For the Instruct model, ``chat_prompt`` renders a conversation in its chat template, and
``stream_text`` turns the ids into text as they come, holding back incomplete UTF-8 characters.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

from .bpe import StreamDecoder
from .kv_cache.contiguous import KVCache
from .params import DEFAULT_MAX_NEW_TOKENS, CheckedRequest, check_request
from .stop import StopStrings, finish, finish_reason
from .sampling import greedy  # noqa: F401  (re-exported: generate.greedy is the default sampler)


@torch.inference_mode()
def generate_stream(model, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    sample: Callable[[torch.Tensor], torch.Tensor] = greedy,
                    stop_ids: Iterable[int] | None = None,
                    cache: KVCache | None = None, watch: StopStrings | None = None) -> Iterator[torch.Tensor]:
    """Yield the next token ids [B] one step at a time.

    ``prompt`` is a list of ids, a [B, T] tensor, or a ``params.CheckedRequest`` (then
    ``max_new_tokens`` and ``stop_ids`` are the request's). ``stop_ids`` defaults to the model's
    EOS; a row that has finished keeps emitting its stop id, and the loop ends when all rows have.
    ``watch`` (one prompt only) also ends it at a stop string.
    """
    req = check_request(prompt, model.config, max_new_tokens, stop_ids)
    ids = req.ids.to(model.device)
    B, T = ids.shape
    if cache is None:
        cache = KVCache.for_model(model, B, T + req.max_new_tokens)
    logits = model(ids, cache=cache, last_only=True)[:, -1]  # prefill
    yield from decode_loop(logits, lambda nxt: model(nxt[:, None], cache=cache, last_only=True)[:, -1],
                           req, sample, is_full=lambda: cache.length >= cache.max_len, watch=watch)


def decode_loop(logits: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], req: CheckedRequest,
                sample: Callable[[torch.Tensor], torch.Tensor], is_full: Callable[[], bool],
                watch: StopStrings | None = None) -> Iterator[torch.Tensor]:
    """The decode steps every runner shares, from the prefill's last ``logits`` [B, V].

    ``step(ids [B])`` feeds one token per row and returns the next logits [B, V]. Each step's
    tokens are read back once, for the stop rule (``params.finish_reason``) to judge every row;
    a finished row keeps emitting a stop id, and the loop ends when all rows have finished, or
    when ``is_full()``.
    """
    B = logits.shape[0]
    counts, reasons = [0] * B, [None] * B
    pad = min(req.stop_ids, default=None)
    done = None  # a device mask of the finished rows, made once one finishes
    for _ in range(req.max_new_tokens):
        nxt = sample(logits.float())
        if done is not None and pad is not None:
            nxt = torch.where(done, pad, nxt)
        yield nxt
        for i, t in enumerate(nxt.tolist()):  # the step's one read back
            if reasons[i] is None:
                counts[i] += 1
                reasons[i] = finish_reason(t, counts[i], req, watch)
        if all(reasons) or is_full():
            return
        if any(reasons):
            done = torch.tensor([r is not None for r in reasons], device=nxt.device)
        logits = step(nxt)  # decode


def generate(model, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, sample=greedy, stop_ids=None,
             include_stop: bool = True) -> list[int] | list[list[int]]:
    """New token ids for ``prompt`` (a list for one prompt, a list of lists for a batch)."""
    req = check_request(prompt, model.config, max_new_tokens, stop_ids)
    steps = list(generate_stream(model, req, sample=sample))
    return collect(steps, prompt, req, include_stop)


def collect(steps: list[torch.Tensor], prompt, req: CheckedRequest, include_stop: bool = True):
    """Turn the per-step ids [B] of a stream into one list per row, each ended by the stop rule."""
    single = torch.as_tensor(prompt).dim() == 1
    rows = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(req.ids.shape[0])]
    out = []
    for row in rows:
        row, why = finish(row, req)
        out.append(row[:-1] if why == "stop" and not include_stop else row)
    return out[0] if single else out


# SmolLM2-Instruct's chat template (chat_template.jinja beside the weights), ChatML style:
# each message is <|im_start|>role\ncontent<|im_end|>\n, and a conversation that does not open
# with a system message gets this one.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_prompt(messages: list[dict], add_generation_prompt: bool = True,
                default_system: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The prompt text for ``messages`` ([{"role": ..., "content": ...}]); with
    ``add_generation_prompt`` it ends with an open assistant turn for the model to complete."""
    if isinstance(messages, (str, dict)) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("cannot render an empty conversation: give at least one message")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} needs a str 'role' and a str 'content', got {m!r}")
        if i == 0 and m["role"] != "system":
            parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
        parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def stream_text(model, tokenizer, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, sample=greedy, stop_ids=None,
                skip_special_tokens: bool = True) -> Iterator[str]:
    """Generate for one prompt (text or ids) and yield the new text piece by piece.

    A piece is only yielded once its UTF-8 bytes are complete, so an emoji split over three
    tokens appears whole; the stop token itself is not shown.
    """
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    if torch.as_tensor(ids).dim() != 1:
        raise ValueError("stream_text takes one prompt (text or a 1-D list of ids), not a batch")
    req = check_request(ids, model.config, max_new_tokens, stop_ids)
    decoder = StreamDecoder(tokenizer, skip_special_tokens)
    for count, nxt in enumerate(generate_stream(model, req, sample=sample), 1):
        token = int(nxt[0])
        if finish_reason(token, count, req) == "stop":
            break  # the stop token itself is not shown
        piece = decoder.push(token)
        if piece:
            yield piece
    rest = decoder.flush()
    if rest:
        yield rest
