"""Chapter 2's code exercises: the BPE merge loop and top-p filtering, graded against
``bpe.bpe`` and ``sampling.top_p_filter``."""
from __future__ import annotations

import random

import torch

from inference_internals.bpe import bpe
from ..code_exercises import Case, CodeExercise
from inference_internals.sampling import top_p_filter


# --- 1. The BPE merge loop -------------------------------------------------------------------

def reference_bpe(symbols: list[str], ranks: dict) -> list[str]:
    return bpe(symbols, ranks)


def _random_ranks(rng: random.Random, n: int) -> dict:
    """n merges over a, b, c, each of two symbols that exist by then (as a trained BPE's are)."""
    vocab, ranks = ["a", "b", "c"], {}
    while len(ranks) < n:
        pair = (rng.choice(vocab), rng.choice(vocab))
        if pair not in ranks:
            ranks[pair] = len(ranks)
            vocab.append(pair[0] + pair[1])
    return ranks


def _bpe_cases() -> list[Case]:
    def case(label, word, ranks):
        return Case(label, lambda: (list(word), dict(ranks)), inputs=f"symbols={list(word)}, ranks={ranks}")
    fixed = [
        case("no known pair: nothing merges", "abc", {("c", "a"): 0}),
        case("one merge", "ab", {("a", "b"): 0}),
        case("every occurrence of the pair merges", "abcab", {("a", "b"): 0}),
        case("the lowest rank first, wherever it is", "abc", {("b", "c"): 0, ("a", "b"): 1}),
        case("merges chain into longer symbols", "abcd", {("a", "b"): 0, ("c", "d"): 1, ("ab", "cd"): 2}),
        case("aaa with (a, a): left to right, no overlap", "aaa", {("a", "a"): 0}),
        case("a single symbol", "a", {("a", "a"): 0}),
        case("an empty word", "", {("a", "b"): 0}),
    ]
    randoms = []
    for seed in range(12):
        rng = random.Random(seed)
        ranks = _random_ranks(rng, rng.randint(2, 8))
        word = "".join(rng.choice("abc") for _ in range(rng.randint(2, 12)))
        randoms.append(case(f"random word {seed}", word, ranks))
    return fixed + randoms


bpe_exercise = CodeExercise(
    title="Write the BPE merge loop",
    prompt=("A word arrives as a list of symbols (bytes mapped to characters). `ranks` maps each learned "
            "merge, a pair of symbols, to its rank: 0 was learned first. Repeat: among the adjacent "
            "pairs of the word, find the one with the **lowest** rank; if none is a known merge, stop; "
            "otherwise merge **every** occurrence of that pair, scanning left to right without overlap "
            "(`a a a` with `(a, a)` gives `aa a`). Return the final list of symbols."),
    name="merge_word",
    stub='''def merge_word(symbols, ranks):
    """symbols: list of str; ranks: {(left, right): rank}. Returns the merged list of str."""
    raise NotImplementedError("your code here")
''',
    solution='''def merge_word(symbols, ranks):
    word = list(symbols)
    while len(word) > 1:
        pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                merged.append(word[i] + word[i + 1])
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word
''',
    hint=("Pick the pair with `min(zip(word, word[1:]), key=lambda p: ranks.get(p, inf))`; stop when it "
          "is not in ranks; rebuild the word with an index that jumps by 2 after a merge; loop."),
    reference=reference_bpe,
    cases=_bpe_cases,
)


# --- 2. Top-p (nucleus) filtering ------------------------------------------------------------

def reference_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    return top_p_filter(logits, p)


def _top_p_cases() -> list[Case]:
    def case(label, make_logits, p):
        return Case(label, lambda: (make_logits(), p))

    def randn(seed, *shape, dtype=torch.float32, scale=2.0):
        g = torch.Generator().manual_seed(seed)
        return lambda: (torch.randn(*shape, generator=g.manual_seed(seed)) * scale).to(dtype)

    def with_inf():
        x = torch.randn(8, generator=torch.Generator().manual_seed(5))
        x[[1, 6]] = float("-inf")
        return x
    return [
        case("8 logits, p = 0.9", randn(0, 8), 0.9),
        case("8 logits, p = 0.5", randn(1, 8), 0.5),
        case("the token that crosses p is kept", lambda: torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]), 0.6),
        case("p = 1 keeps every token", randn(2, 6), 1.0),
        case("p = 0 keeps the top token", randn(3, 6), 0.0),
        case("one token already holds more than p", lambda: torch.tensor([0.0, 6.0, 1.0, -2.0]), 0.5),
        case("a batch of 3 rows, each its own nucleus", randn(4, 3, 10), 0.7),
        case("logits already at -inf stay there", with_inf, 0.8),
        case("float64 in, float64 out", randn(6, 2, 7, dtype=torch.float64), 0.75),
        case("a vocabulary of one token", lambda: torch.tensor([[1.5]]), 0.3),
    ]


top_p_exercise = CodeExercise(
    title="Write top-p filtering",
    prompt=("Nucleus sampling keeps the smallest set of most likely tokens whose probabilities add up to "
            "at least `p`, and sets every other logit to `-inf`. Sort by probability, descending; keep a "
            "token if the probability mass **before** it is below `p` (so the token that crosses `p` "
            "stays, and the top token always does). Work on the last axis of `[..., V]` logits, return "
            "the same shape and dtype, and leave the kept logits unchanged."),
    name="top_p",
    stub='''def top_p(logits, p):
    """logits: [..., V]; p in [0, 1]. Returns the logits with the tokens outside the nucleus at -inf."""
    raise NotImplementedError("your code here")
''',
    solution='''import torch

def top_p(logits, p):
    probs = logits.softmax(dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False              # the top token always stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)   # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))
''',
    hint=("softmax on dim=-1, sort descending, mass before = cumsum − the token's own probability; drop "
          "where that is ≥ p except position 0; `scatter` the mask back through the sort order."),
    reference=reference_top_p,
    cases=_top_p_cases,
)

CODE_EXERCISES = [bpe_exercise, top_p_exercise]
