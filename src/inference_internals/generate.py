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
from .kv_cache import KVCache
from .params import DEFAULT_MAX_NEW_TOKENS, check_int, check_token_ids, cut_at_stop, stop_set
from .sampling import greedy  # noqa: F401  (re-exported: generate.greedy is the default sampler)


def as_batch(prompt, device, config=None) -> torch.Tensor:
    """``prompt`` (a list of ids, or [B, T]) as a [B, T] long tensor on ``device``, checked by
    ``params.check_token_ids`` (against ``config``'s vocabulary and context window when given)."""
    ids = check_token_ids(prompt, *((config.vocab_size, config.max_position_embeddings) if config else ()))
    return ids.to(device)


@torch.inference_mode()
def generate_stream(model, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    sample: Callable[[torch.Tensor], torch.Tensor] = greedy,
                    stop_ids: Iterable[int] | None = None,
                    cache: KVCache | None = None) -> Iterator[torch.Tensor]:
    """Yield the next token ids [B] one step at a time.

    ``prompt`` is a list of ids or a [B, T] tensor. ``stop_ids`` defaults to the model's EOS;
    a row that has emitted a stop id keeps emitting it, and the loop ends when all rows have.
    """
    ids = as_batch(prompt, model.device, model.config)
    B, T = ids.shape
    max_new_tokens = min(check_int("max_new_tokens", max_new_tokens, 0), model.config.max_position_embeddings - T)
    if cache is None:
        cache = KVCache.for_model(model, B, T + max_new_tokens)
    logits = model(ids, cache=cache, last_only=True)[:, -1]  # prefill
    yield from decode_loop(logits, lambda nxt: model(nxt[:, None], cache=cache, last_only=True)[:, -1],
                           max_new_tokens, sample, stop_tensor(stop_ids, model.config.eos_token_id, model.device),
                           is_full=lambda: cache.length >= cache.max_len)


def stop_tensor(stop_ids: Iterable[int] | None, eos_token_id: int, device) -> torch.Tensor:
    """The stop ids as a sorted tensor; ``None`` means the model's EOS, ``[]`` means none."""
    return torch.tensor(sorted(stop_set(stop_ids, eos_token_id)), dtype=torch.long, device=device)


def decode_loop(logits: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], max_new_tokens: int,
                sample: Callable[[torch.Tensor], torch.Tensor], stop: torch.Tensor,
                is_full: Callable[[], bool]) -> Iterator[torch.Tensor]:
    """The decode steps every runner shares, from the prefill's last ``logits`` [B, V].

    ``step(ids [B])`` feeds one token per row and returns the next logits [B, V]. A row that has
    emitted a stop id keeps emitting it; the loop ends when all rows have, or when ``is_full()``.
    """
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    for _ in range(max_new_tokens):
        nxt = sample(logits.float())
        if len(stop):
            nxt = torch.where(done, stop[0], nxt)
        yield nxt
        done |= torch.isin(nxt, stop)
        if bool(done.all()) or is_full():
            return
        logits = step(nxt)  # decode


def generate(model, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, sample=greedy, stop_ids=None,
             include_stop: bool = True) -> list[int] | list[list[int]]:
    """New token ids for ``prompt`` (a list for one prompt, a list of lists for a batch)."""
    steps = list(generate_stream(model, prompt, max_new_tokens, sample, stop_ids))
    return collect(steps, prompt, stop_set(stop_ids, model.config.eos_token_id), include_stop)


def collect(steps: list[torch.Tensor], prompt, stop_ids, include_stop: bool = True):
    """Turn the per-step ids [B] of a stream into one list per row, each cut at its first stop id."""
    single = torch.as_tensor(prompt).dim() == 1
    if not steps:
        return [] if single else [[] for _ in range(len(prompt))]
    out = []
    for row in torch.stack(steps, dim=1).tolist():
        row, hit = cut_at_stop(row, set(stop_ids))
        out.append(row[:-1] if hit and not include_stop else row)
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
    stops = stop_set(stop_ids, model.config.eos_token_id)
    decoder = StreamDecoder(tokenizer, skip_special_tokens)
    for nxt in generate_stream(model, ids, max_new_tokens, sample, stop_ids):
        token = int(nxt[0])
        if token in stops:
            break
        piece = decoder.push(token)
        if piece:
            yield piece
    rest = decoder.flush()
    if rest:
        yield rest
