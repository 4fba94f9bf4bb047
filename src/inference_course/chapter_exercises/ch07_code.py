"""Chapter 7's code exercises, both in plain Python (the website grades them): SentencePiece's merge
step, graded against ``spm.SentencePieceBPE.merge`` on a small vocabulary, and a local layer's ring
of keys, graded against ``kv_cache.RingKVCache`` (its write and the keys it holds after)."""
from __future__ import annotations

import torch

from ..code_exercises import Case, CodeExercise
from inference_internals.kv_cache import RingKVCache
from inference_internals.model import LlamaConfig
from inference_internals.spm import BYTE, NORMAL, SentencePieceBPE


# --- 1. SentencePiece's merge: scores, not ranks ------------------------------------------------

def reference_spm_merge(text: str, scores: dict) -> list:
    """The library's tokenizer built on ``scores`` alone (and the 256 byte pieces it needs), merging."""
    pieces = list(scores) + [f"<0x{b:02X}>" for b in range(256)]
    types = [NORMAL] * len(scores) + [BYTE] * 256
    return SentencePieceBPE(pieces, list(scores.values()) + [0.0] * 256, types).merge(text)


def _merge_cases() -> list[Case]:
    def case(label, text, joined):
        # every character of the text is a piece (score 0: a single character never outranks a merge here)
        scores = {**{ch: 0.0 for ch in text}, **joined}
        return Case(label, lambda: (text, dict(scores)), inputs=f"text={text!r}, scores={scores}")
    return [
        case("one pair joins", "ab", {"ab": -1.0}),
        case("the higher score joins first", "abc", {"ab": -5.0, "bc": -1.0}),
        case("a tie: the leftmost pair joins", "abc", {"ab": -2.0, "bc": -2.0}),
        case("no piece for any pair: nothing joins", "xyz", {}),
        case("an odd run: one pair joins, one character stays", "aaa", {"aa": -1.0}),
        case("a joined piece joins again", "aaaa", {"aa": -1.0, "aaaa": -2.0}),
        case("a new pair outscores the rest of the old one", "abab", {"ab": -1.0, "aba": -0.5}),
        case("a word with its space", "▁the", {"th": -3.0, "he": -4.0, "▁t": -6.0, "▁th": -7.0, "the": -2.0,
                                                "▁the": -1.0}),
        case("two words, each into its own pieces", "▁low▁lower",
             {"lo": -1.0, "low": -2.0, "▁low": -3.0, "er": -4.0, "▁lower": -9.0, "ow": -5.0}),
        case("an empty text", "", {}),
    ]


merge_exercise = CodeExercise(
    title="SentencePiece's merge step, by scores",
    prompt=("Gemma's tokenizer merges by **score**, not by rank: start from the text's characters (a space "
            "is already `▁`); among all adjacent pairs whose joined text is a piece in `scores`, join the "
            "one whose piece has the **highest** score (on a tie, the **leftmost**), **one pair at a time**; "
            "repeat until no adjacent pair joins into a piece. Return the list of pieces. Every character of "
            "the text is itself a piece. Chapter 2's BPE merged every occurrence of the best-ranked pair at "
            "once: here a pair that a merge just created may outscore the other copies of the old one."),
    name="spm_merge",
    stub='''def spm_merge(text, scores):
    """text: str; scores: {piece: score}. Returns the list of pieces after every merge."""
    raise NotImplementedError("your code here")
''',
    solution='''def spm_merge(text, scores):
    pieces = list(text)
    while True:
        best = None
        for i in range(len(pieces) - 1):
            joined = pieces[i] + pieces[i + 1]
            if joined in scores and (best is None or scores[joined] > scores[pieces[best] + pieces[best + 1]]):
                best = i
        if best is None:
            return pieces
        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]
''',
    hint=("Scan the adjacent pairs, keep the index of the best joined piece (a strictly higher score "
          "replaces it, so ties stay leftmost), replace those two pieces by their join "
          "(`pieces[i:i + 2] = [joined]`), and scan again until no pair joins."),
    reference=reference_spm_merge,
    cases=_merge_cases,
)


# --- 2. A local layer's ring of keys -------------------------------------------------------------

def reference_ring_write(ring: list, length: int, new: list) -> list:
    """``RingKVCache.update`` on one sliding layer of one head whose window is ``len(ring)``: the ring
    list as its ring of keys; the slots it writes are copied back into ``ring``; it returns the keys
    the ring holds after (``kv``), oldest first."""
    R, T = len(ring), len(new)
    width = len(new[0]) if new else next((len(k) for k in ring if k is not None), 1)
    cfg = LlamaConfig(num_hidden_layers=1, num_key_value_heads=1, num_attention_heads=1, head_dim=width,
                      hidden_size=width, max_position_embeddings=max(length + T, R),
                      layer_types=("sliding_attention",), sliding_window=R)
    cache = RingKVCache(cfg, 1, max(length + T, R), dtype=torch.float64, slack=0)
    for slot, key in enumerate(ring):
        if key is not None:
            cache.ring_k[0, 0, 0, slot] = torch.tensor(key, dtype=torch.float64)
    cache.length = length
    keys = torch.tensor(new, dtype=torch.float64).reshape(1, 1, T, width)
    cache.update(0, keys, torch.zeros_like(keys))
    cache.length = length + T
    for p in range(max(0, length + T - R), length + T):  # the slots that hold a position now
        ring[p % R] = cache.ring_k[0, 0, 0, p % R].tolist()
    return cache.kv(0)[0][0, 0].tolist()


def observe_ring(args, result):
    """What a case compares: the answer, and the ring after the call (written in place)."""
    return {"returned": result, "ring": args[0]}


def _ring_cases() -> list[Case]:
    def case(label, R, length, new):
        def make():
            ring = [None] * R
            for p in range(max(0, length - R), length):  # what the ring holds after `length` positions
                ring[p % R] = [float(p), -float(p)]
            return ring, length, [list(k) for k in new]
        ring = make()[0]
        return Case(label, make, inputs=f"ring={ring}, length={length}, new={new}")
    key = lambda p: [float(p), -float(p)]  # noqa: E731 (a key that names its position)
    return [
        case("the first keys into an empty ring", 4, 0, [key(0), key(1)]),
        case("filling the ring exactly", 4, 2, [key(2), key(3)]),
        case("one past the window: position 4 overwrites position 0", 4, 4, [key(4)]),
        case("wrapping around in one write", 4, 3, [key(3), key(4), key(5)]),
        case("far past the window", 3, 10, [key(10)]),
        case("more new keys than slots: only the newest stay", 3, 1, [key(p) for p in range(1, 6)]),
        case("a window of one", 1, 5, [key(5), key(6)]),
        case("no new keys: nothing changes", 4, 6, []),
    ]


ring_exercise = CodeExercise(
    title="A local layer's ring of keys",
    prompt=("A local layer with a window of `R` keeps its keys in a list of `R` slots, `ring`: position `p` "
            "lives in slot `p % R`, overwriting the position `R` before it, which no later query sees. "
            "Positions `0 … length − 1` were written before. Write the keys of `new` (positions `length`, "
            "`length + 1`, …) into their slots **in place**, then return the keys the ring holds, **oldest "
            "position first**: the last `min(length + len(new), R)` positions."),
    name="ring_write",
    stub='''def ring_write(ring, length, new):
    """Writes new's keys (positions length, length + 1, ...) into ring's slots p % len(ring), in place.
    Returns the keys the ring holds, oldest position first."""
    raise NotImplementedError("your code here")
''',
    solution='''def ring_write(ring, length, new):
    R = len(ring)
    for i, key in enumerate(new):
        ring[(length + i) % R] = list(key)
    end = length + len(new)
    return [ring[p % R] for p in range(max(0, end - R), end)]
''',
    hint=("Assign `ring[(length + i) % R] = key` for each new key (later keys overwrite earlier ones in "
          "the same slot, as they should), then read the slots of positions `max(0, end − R) … end − 1` "
          "in that order: slot order is not position order once the ring has wrapped."),
    reference=reference_ring_write,
    cases=_ring_cases,
    observe=observe_ring,
)

CODE_EXERCISES = [merge_exercise, ring_exercise]
