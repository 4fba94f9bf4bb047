"""The one rule that ends an output, asked once per emitted token.

``finish_reason(token, count, request, watch)`` says why an output is done once ``token`` is its
``count``-th new token, in vLLM's words: "stop" (a stop id: the model's EOS unless ``ignore_eos``, or
one of ``stop_token_ids``; or, with a ``watch``, a stop string the token completes), "length" (the
budget ``max_tokens`` is spent, or the context window is full), or None: it goes on. Before
``min_tokens`` tokens nothing but the budget ends it (vLLM's ``check_stop``).

The engine asks it in one place, its scheduler's post-processing, for every token it emits, in every
mode (a speculative step emits several: they are judged one by one, and the first that ends the
output ends it there). The chapters' reference loops (``generate``, ``speculative_generate``) ask the
same function.
"""
from __future__ import annotations

from typing import Callable

from .params import CheckedRequest


def finish_reason(token: int, count: int, req: CheckedRequest, watch: "StopStrings | None" = None) -> str | None:
    """Why an output is done once ``token`` is its ``count``-th new token: "stop", "length" or None."""
    hit = watch is not None and watch.push(token, stop=count >= req.min_tokens)
    if count >= req.min_tokens and (token in req.stop_ids or hit):
        return "stop"
    if count >= req.max_new_tokens:
        return "length"
    return None


def finish(tokens, req: CheckedRequest, before: int = 0, watch: "StopStrings | None" = None
           ) -> tuple[list[int], str | None]:
    """``tokens`` (new ones, after ``before`` earlier ones) up to where ``finish_reason`` first
    ends the output, and why; all of them and None if it never does."""
    for i, t in enumerate(tokens):
        why = finish_reason(t, before + i + 1, req, watch)
        if why is not None:
            return list(tokens[: i + 1]), why
    return list(tokens), None


class StopStrings:
    """vLLM's ``stop`` strings: the output ends where one of them first appears in its text.

    ``push`` each new token; it returns True when the text the token added completes a stop string
    (and ``stop`` is True: before ``min_tokens`` a string is let pass, as vLLM lets it). ``text`` is
    then the output's text up to that string (vLLM leaves the string out), ``stop_reason`` the string,
    and ``num_tokens`` how many tokens it took (the one that completed the string included).
    ``decode(ids) -> str`` is the tokenizer's. The whole output is decoded at each token: a string can
    be completed by a token that also changes the bytes before it (a UTF-8 character split over two
    tokens), and outputs are short enough for that to cost little.
    """

    def __init__(self, stops, decode: Callable[[list[int]], str]):
        self.stops, self.decode = tuple(stops), decode
        self.longest = max(map(len, self.stops), default=0)
        self.tokens: list[int] = []
        self.text, self.stop_reason, self.num_tokens = "", None, None
        self._searched = 0  # characters before which no stop string can begin

    def push(self, token: int, stop: bool = True) -> bool:
        if self.stop_reason is not None:
            return True
        self.tokens.append(int(token))
        text = self.decode(self.tokens)
        start = max(0, min(self._searched, len(text)) - self.longest + 1)
        hits = [(i, s) for s in self.stops if (i := text.find(s, start)) >= 0]
        self._searched = len(text)
        if not hits or not stop:
            self.text = text
            return False
        i, self.stop_reason = min(hits)
        self.text, self.num_tokens = text[:i], len(self.tokens)
        return True
