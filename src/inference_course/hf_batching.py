"""Transformers' own continuous batching as chapter 5's reference, as Hugging Face's forward is chapter 1's.

transformers ships a paged, continuously batched engine of its own: ``model.generate_batch``
(``generation/continuous_batching``), with a paged KV cache of ``page_size``-token blocks, a FIFO
scheduler and a ``max_batch_tokens`` budget per step. The same requests go through it and through
``engine.LLMEngine``, greedy, in fp32, each for exactly ``max_tokens`` tokens (EOS does not end
them, so both sides produce the same counts), and come back as ``Served``: the tokens and each
request's time to first token and time per output token, on one clock (``time.perf_counter``).

``compare`` checks the tokens request by request. Two fp32 engines that add the same numbers in a
different order (a packed row against a padded batch, a mask against a causal kernel) can flip a
greedy choice where the two best logits are within rounding of each other. So a request that
differs is accepted only where a plain forward of the prompt and the tokens both sides agreed on
puts the two chosen tokens first and second, less than ``tol`` apart; any other difference fails.
``closest_call`` says how near a trace came to such a tie: its smallest top-two gap.

The engine never imports this module: the reference lives with the course.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from inference_internals.params import check_int
from inference_internals.timing import tpot, ttft

# fp32 logits of this model agree to ~1e-4 between two summation orders (chapter 5's TOL on a CPU);
# a greedy tie closer than ten times that may fall either way.
NEAR_TIE = 1e-3


@dataclass(frozen=True)
class Served:
    """One run of a trace through one engine."""
    tokens: list            # new token ids per request, in the order given
    ttft: list              # seconds from each request's submission to its first token
    tpot: list              # seconds per output token after the first (None for one token)
    seconds: float          # first submission to last token
    call_seconds: float     # the whole call: engine set-up and tear-down included

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.seconds


@dataclass(frozen=True)
class Divergence:
    request: int
    index: int           # first output position where the two engines differ
    ours: int
    hf: int
    margin: float        # plain forward's top-1 logit minus its top-2, at that position
    top2: tuple          # the plain forward's two best tokens there

    @property
    def near_tie(self) -> bool:
        return set(self.top2) == {self.ours, self.hf}


@dataclass(frozen=True)
class Comparison:
    identical: list      # per request: the same tokens on both sides
    divergences: list    # one Divergence per request that differs
    tol: float

    @property
    def ok(self) -> bool:
        """Every request identical, or differing first at a near tie (both picks are the top two,
        closer than ``tol``): the only difference summation order can explain."""
        return all(d.near_tie and d.margin < self.tol for d in self.divergences)

    def summary(self) -> str:
        n, same = len(self.identical), sum(self.identical)
        text = f"{same} of {n} requests token-identical"
        if self.divergences:
            text += "; " + "; ".join(
                f"request {d.request} first differs at token {d.index} ({d.ours} vs {d.hf}), where the "
                f"plain forward's top two logits are {d.margin:.2e} apart"
                + ("" if d.near_tie else f" and its top two are {d.top2}, not both picks")
                for d in self.divergences)
        return text


def check_trace(prompts, max_tokens: int, vocab_size: int | None = None) -> list[list[int]]:
    """The prompts as lists of ints, checked: a non-empty list of non-empty prompts of token ids."""
    check_int("max_tokens", max_tokens, 1)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token-id lists, got {type(prompts).__name__}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple)) or not p:
            raise ValueError(f"prompt {i} must be a non-empty list of token ids (tokenize text first), got {p!r:.60}")
        for t in p:
            if isinstance(t, bool) or not isinstance(t, int):
                raise TypeError(f"prompt {i} holds {t!r} ({type(t).__name__}): token ids are ints")
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                raise ValueError(f"prompt {i} holds token id {t}, outside [0, {vocab_size})")
        out.append(list(p))
    return out


def _check_fp32(model, name: str) -> None:
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"{name} is {dtype}: the token-for-token comparison runs in fp32 "
                         "(lower precision flips near-ties by design)")


def text_prompts(tokenizer, lengths: list[int], text: str | None = None) -> list[list[int]]:
    """Prompts of the given lengths cut from one real text (the Zen of Python by default), each from
    its own offset: real tokens, not random ids, whose next-token logits look like a user's."""
    from .prompts import zen_of_python

    ids = tokenizer.encode(text or zen_of_python())
    out = []
    for i, n in enumerate(lengths):
        check_int("prompt length", n, 1, len(ids))
        start = (i * 37) % (len(ids) - n + 1)
        out.append(ids[start:start + n])
    return out


def run_ours(model, prompts, max_tokens: int, block_size: int = 16, num_blocks: int | None = None,
             max_batch_tokens: int = 2048, packed: bool = True) -> Served:
    """The trace through ``engine.LLMEngine`` (vLLM's packed step by default), greedy, EOS ignored."""
    from inference_internals.engine.llm_engine import LLMEngine
    from inference_internals.params import SamplingParams

    _check_fp32(model, "our model")
    prompts = check_trace(prompts, max_tokens, model.config.vocab_size)
    num_blocks = num_blocks or blocks_needed(prompts, max_tokens, block_size)
    t0 = time.perf_counter()
    eng = LLMEngine(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=len(prompts),
                    max_num_batched_tokens=max_batch_tokens, packed=packed)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for o in eng.generate(prompts, params)]
    call = time.perf_counter() - t0
    reqs = eng.requests
    first = [r.seqs[0].first_token_time for r in reqs]
    return Served(tokens, [ttft(r.arrival_time, f) for r, f in zip(reqs, first)],
                  [tpot(f, r.finish_time, len(t)) for r, f, t in zip(reqs, first, tokens)],
                  max(r.finish_time for r in reqs) - min(r.arrival_time for r in reqs), call)


def blocks_needed(prompts, max_tokens: int, block_size: int) -> int:
    """KV blocks for every request at its full length at once: no preemption on either side."""
    return sum(-(-(len(p) + max_tokens) // block_size) for p in prompts) + 1


def run_hf(hf_model, prompts, max_tokens: int, block_size: int = 16, num_blocks: int | None = None,
           max_batch_tokens: int = 2048) -> Served:
    """The trace through transformers' ``generate_batch``: greedy, EOS disabled (``eos_token_id=-1``),
    the same pool (``num_blocks`` blocks of ``block_size`` tokens) and per-step token budget as
    ``run_ours``, each token time-stamped (``record_timestamps``)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    _check_fp32(hf_model, "the Hugging Face model")
    prompts = check_trace(prompts, max_tokens, hf_model.config.vocab_size)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=-1,
                           pad_token_id=hf_model.config.pad_token_id)
    cb = ContinuousBatchingConfig(page_size=block_size,
                                  num_blocks=num_blocks or blocks_needed(prompts, max_tokens, block_size),
                                  max_batch_tokens=max_batch_tokens, max_requests_per_batch=len(prompts),
                                  use_cuda_graph=False, auto_switch_to_flash=False)
    t0 = time.perf_counter()
    outs = hf_model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                                   record_timestamps=True)
    call = time.perf_counter() - t0
    results = list(outs.values())
    failed = [o for o in results if o.error is not None]
    if len(results) != len(prompts) or failed:
        raise RuntimeError(f"generate_batch returned {len(results)} of {len(prompts)} requests"
                           + (f"; {failed[0].request_id} failed: {failed[0].error}" if failed else ""))
    tokens = [list(o.generated_tokens) for o in results]
    bad = [i for i, t in enumerate(tokens) if len(t) != max_tokens or len(results[i].timestamps) != max_tokens]
    if bad:
        raise RuntimeError(f"generate_batch gave request {bad[0]} {len(tokens[bad[0]])} tokens, not {max_tokens}")
    return Served(tokens, [ttft(o.created_time, o.timestamps[0]) for o in results],
                  [tpot(o.timestamps[0], o.timestamps[-1], len(o.timestamps)) for o in results],
                  max(o.timestamps[-1] for o in results) - min(o.created_time for o in results), call)


@torch.inference_mode()
def compare(ours: list, hf: list, prompts, reference, tol: float = NEAR_TIE) -> Comparison:
    """Request by request: identical tokens, or a first difference at a near tie of ``reference``'s
    plain forward (Hugging Face's model on one sequence, no cache) over the prompt and the tokens
    both sides agree on. Lengths must match: both sides ran the same fixed number of tokens."""
    prompts = check_trace(prompts, 1)
    if not len(ours) == len(hf) == len(prompts):
        raise ValueError(f"need one output per prompt on each side: {len(prompts)} prompts, "
                         f"{len(ours)} and {len(hf)} outputs")
    identical, divergences = [], []
    for i, (a, b, p) in enumerate(zip(ours, hf, prompts)):
        if len(a) != len(b):
            raise ValueError(f"request {i}: {len(a)} tokens against {len(b)}: run both for the same count")
        identical.append(a == b)
        if a == b:
            continue
        at = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
        ids = torch.tensor([p + a[:at]], device=reference.device)
        logits = reference(ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        divergences.append(Divergence(i, at, a[at], b[at], float(top.values[0] - top.values[1]),
                                      tuple(top.indices.tolist())))
    return Comparison(identical, divergences, tol)


@torch.inference_mode()
def closest_call(tokens: list, prompts, reference) -> dict:
    """The smallest gap between the plain forward's top two logits at any greedy choice of ``tokens``
    (one forward per request over its prompt and output): how near the trace came to a tie that
    summation order could flip. Returns {"margin", "request", "index"}."""
    prompts = check_trace(prompts, 1)
    best = {"margin": float("inf"), "request": None, "index": None}
    for i, (p, t) in enumerate(zip(prompts, tokens)):
        if not t:
            continue
        logits = reference(torch.tensor([p + t[:-1]], device=reference.device)).logits[0, len(p) - 1:].float()
        top = torch.topk(logits, 2).values
        gaps = top[:, 0] - top[:, 1]
        j = int(gaps.argmin())
        if float(gaps[j]) < best["margin"]:
            best = {"margin": float(gaps[j]), "request": i, "index": j}
    return best

