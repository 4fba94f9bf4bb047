"""Byte-level BPE: text -> UTF-8 bytes -> pre-tokens -> merges by rank -> ids, and back.

The model never sees characters, only ids of byte sequences. Encoding takes four steps:

1. cut out the special tokens (``<|im_start|>`` ...), which map straight to their ids;
2. pre-tokenize the rest with the model's regex, so merges never cross a word boundary;
3. spell each piece as UTF-8 bytes, one printable character per byte (``bytes_to_unicode``),
   because the vocabulary file stores byte strings as text;
4. merge adjacent symbols, lowest-ranked merge first, until no learned merge applies (``bpe``).

Decoding reverses step 3 and turns bytes into text. ``train_bpe`` learns merges from a text,
and ``StreamDecoder`` turns ids into text one step at a time without ever splitting a character.
"""
from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable

import regex

# GPT-2's pre-tokenizer, which Hugging Face's ByteLevel pre-tokenizer runs when use_regex=True:
# contractions, letters, numbers and punctuation each with one optional leading space, then
# whitespace runs. `\s+(?!\S)` leaves the last space of a run to prefix the next word.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other
    68 (control codes, space, ...) shift to characters 256+, so every byte is one visible character
    and the space becomes 'Ġ' (U+0120)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


@functools.lru_cache(maxsize=None)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


@functools.lru_cache(maxsize=None)
def _latin1_to_symbol() -> dict[int, str]:
    # str.translate table: a byte read as Latin-1 -> its BPE symbol (fast path for step 3).
    return {b: c for b, c in bytes_to_unicode().items()}


def to_symbols(text: str) -> str:
    """``text`` as byte symbols: its UTF-8 bytes, one character from ``bytes_to_unicode`` each."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode (lone surrogate at index {e.start}): {text!r}") from None
    return raw.decode("latin-1").translate(_latin1_to_symbol())


def symbols_to_bytes(symbols: str) -> bytes:
    """Inverse of ``to_symbols``; a character outside the table keeps its own UTF-8 bytes, as in HF."""
    table = _unicode_to_bytes()
    if all(c in table for c in symbols):
        return bytes(table[c] for c in symbols)
    return symbols.encode("utf-8")


def split_text(text: str, patterns: Iterable[regex.Pattern]) -> list[str]:
    """Pre-tokenize: each pattern in turn cuts every piece into its matches and the gaps between
    them (HF's "Isolated" split behaviour)."""
    pieces = [text] if text else []
    for pat in patterns:
        out = []
        for piece in pieces:
            pos = 0
            for m in pat.finditer(piece):
                if m.start() > pos:
                    out.append(piece[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


def bpe(symbols: Iterable[str], ranks: dict[tuple[str, str], int],
        trace: list | None = None) -> list[str]:
    """Merge adjacent symbols, always the pair with the lowest rank (earliest learned) first, all
    its occurrences left to right, until no pair is a known merge. GPT-2's loop.

    If ``trace`` is a list, each step's (pair, rank, symbols after) is appended to it.
    """
    word = list(symbols)
    while len(word) > 1:
        pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        first, second = pair
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
        if trace is not None:
            trace.append((pair, ranks[pair], list(word)))
    return word


class BPETokenizer:
    """A byte-level BPE tokenizer: ``vocab`` maps byte-symbol strings to ids, ``merges`` lists the
    learned pairs in rank order, ``added_tokens`` are matched in the raw text before anything else
    (those in ``special`` can be skipped when decoding)."""

    def __init__(self, vocab: dict[str, int], merges: Iterable[tuple[str, str]],
                 added_tokens: dict[str, int] | None = None, special: Iterable[str] | None = None,
                 split_patterns: Iterable[str] = (GPT2_SPLIT,), ignore_merges: bool = False,
                 cache_size: int = 1 << 16):
        self.vocab = dict(vocab)
        self.merges = [tuple(m) for m in merges]
        self.ranks = {m: r for r, m in enumerate(self.merges)}
        self.added_tokens = dict(added_tokens or {})
        self.special = set(self.added_tokens if special is None else special)
        self.split_patterns = [regex.compile(p) for p in split_patterns]
        self.ignore_merges = ignore_merges
        if len(self.ranks) != len(self.merges):
            raise ValueError("merges contain a duplicate pair")
        for a, b in self.merges:
            for s in (a, b, a + b):
                if s not in self.vocab:
                    raise ValueError(f"merge ({a!r}, {b!r}) uses {s!r}, which is not in the vocabulary")
        if not self.special <= set(self.added_tokens):
            raise ValueError(f"special tokens {sorted(self.special - set(self.added_tokens))} are not added tokens")
        # Bytes with no symbol in the vocabulary: the encoder drops them (see _encode_piece).
        self.missing_bytes = [b for b, c in bytes_to_unicode().items() if c not in self.vocab]
        self.id_to_token = {i: s for s, i in self.vocab.items()}
        self.id_to_token.update({i: s for s, i in self.added_tokens.items()})
        self.added_ids = {i: s for s, i in self.added_tokens.items()}
        # Leftmost-longest match, as HF's added-vocabulary matcher: longer alternatives first.
        self._added_re = {
            split_special: regex.compile("|".join(regex.escape(t) for t in sorted(toks, key=len, reverse=True)))
            if toks else None
            for split_special, toks in ((False, list(self.added_tokens)),
                                        (True, [t for t in self.added_tokens if t not in self.special]))}
        # Per-piece cache, as in GPT-2's encoder: the same words recur, and BPE is the slow part.
        self._encode_piece = functools.lru_cache(maxsize=cache_size)(self._encode_piece_uncached)

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "BPETokenizer":
        """Read a Hugging Face ``tokenizer.json`` (BPE model, ByteLevel pre-tokenizer)."""
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise ValueError(f"{path}: model type {model.get('type')!r} is not BPE")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
                or model.get("byte_fallback") or model.get("dropout"):
            raise ValueError(f"{path}: subword prefixes/suffixes, byte fallback and dropout are not supported")
        if spec.get("normalizer") is not None:
            raise ValueError(f"{path}: a normalizer ({spec['normalizer'].get('type')}) is not supported")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        added, special = {}, set()
        for t in spec.get("added_tokens", []):
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
                raise ValueError(f"{path}: added token {t['content']!r} uses lstrip/rstrip/single_word, "
                                 "which is not supported")
            added[t["content"]] = t["id"]
            if t.get("special"):
                special.add(t["content"])
        return cls(model["vocab"], merges, added, special, _split_patterns(spec.get("pre_tokenizer"), path),
                   ignore_merges=bool(model.get("ignore_merges")))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None) -> "BPETokenizer":
        """The tokenizer of the model in ``weights.model_dir(path)``."""
        from .weights import model_dir

        return cls.from_file(model_dir(path) / "tokenizer.json")

    # -- encoding ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.id_to_token)

    def token_to_id(self, token: str) -> int:
        if token in self.added_tokens:
            return self.added_tokens[token]
        if token not in self.vocab:
            raise KeyError(f"{token!r} is not a token")
        return self.vocab[token]

    def clear_cache(self) -> None:
        """Forget the cached pieces (to time a cold encoder)."""
        self._encode_piece.cache_clear()

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces of ordinary text (no added tokens) that BPE sees, as byte symbols."""
        return [to_symbols(p) for p in split_text(text, self.split_patterns)]

    def _encode_piece_uncached(self, symbols: str) -> tuple[int, ...]:
        if self.ignore_merges and symbols in self.vocab:
            return (self.vocab[symbols],)
        # A byte the vocabulary lacks (SmolLM2 has no symbol for e.g. 0x04 or 0xFF) is dropped
        # silently, as HF does when there is no unknown token.
        return tuple(self.vocab[s] for s in bpe((c for c in symbols if c in self.vocab), self.ranks))

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids for text with no added tokens looked for."""
        ids: list[int] = []
        for piece in self.pre_tokenize(text):
            ids.extend(self._encode_piece(piece))
        return ids

    def encode(self, text: str, split_special_tokens: bool = False) -> list[int]:
        """Ids for ``text``. Added tokens written in the text become their own ids, as in HF;
        with ``split_special_tokens=True`` special ones are read as ordinary text instead."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        ids: list[int] = []
        for segment, is_added in self.split_added(text, split_special_tokens):
            if is_added:
                ids.append(self.added_tokens[segment])
            else:
                ids.extend(self.encode_ordinary(segment))
        return ids

    def split_added(self, text: str, split_special_tokens: bool = False) -> list[tuple[str, bool]]:
        """``text`` cut into (segment, is_added_token) pairs."""
        pattern = self._added_re[split_special_tokens]
        if pattern is None:
            return [(text, False)] if text else []
        out, pos = [], 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                out.append((text[pos:m.start()], False))
            out.append((m.group(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], False))
        return out

    # -- decoding ----------------------------------------------------------------------------
    def _check_id(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                i = int(i)  # numpy / 0-d tensor ids
            except (TypeError, ValueError):
                raise TypeError(f"token ids must be integers, got {i!r}") from None
        if i not in self.id_to_token:
            raise ValueError(f"token id {i} is outside the vocabulary (size {len(self)})")
        return i

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The vocabulary strings of ``ids`` (byte symbols, e.g. 'Ġis')."""
        return [self.id_to_token[self._check_id(i)] for i in ids]

    def token_bytes(self, i: int) -> bytes:
        """The bytes one token stands for."""
        i = self._check_id(i)
        if i in self.added_ids:
            return self.added_ids[i].encode("utf-8")
        return symbols_to_bytes(self.id_to_token[i])

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        out = []
        for i in ids:
            i = self._check_id(i)
            if not (skip_special_tokens and self.added_ids.get(i) in self.special):
                out.append(self.token_bytes(i))
        return b"".join(out)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text for ``ids``; bytes that are not valid UTF-8 become U+FFFD, as in HF."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")


def _split_patterns(spec: dict | None, path) -> list[str]:
    """The pre-tokenizer of a tokenizer.json as a list of isolate-the-matches regexes, ending
    with the ByteLevel step (which does the byte -> symbol mapping)."""
    if spec is None:
        raise ValueError(f"{path}: no pre_tokenizer; byte-level BPE needs a ByteLevel one")
    steps = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
    patterns = []
    for i, step in enumerate(steps):
        kind = step.get("type")
        if kind == "ByteLevel":
            if i != len(steps) - 1:
                raise ValueError(f"{path}: ByteLevel must be the last pre-tokenizer step")
            if step.get("add_prefix_space"):
                raise ValueError(f"{path}: ByteLevel add_prefix_space=True is not supported")
            if step.get("use_regex", True):
                patterns.append(GPT2_SPLIT)
            return patterns
        if kind == "Digits":  # Rust's char::is_numeric is the Unicode N category
            patterns.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert"):
            pat = step["pattern"]
            patterns.append(pat["Regex"] if "Regex" in pat else regex.escape(pat["String"]))
        else:
            raise ValueError(f"{path}: pre-tokenizer step {step} is not supported")
    raise ValueError(f"{path}: the pre-tokenizer has no ByteLevel step")


def train_bpe(text: str, vocab_size: int, pattern: str = GPT2_SPLIT,
              special_tokens: Iterable[str] = ()) -> BPETokenizer:
    """Learn merges from ``text``: start from the 256 byte symbols and repeatedly merge the most
    frequent adjacent pair (within pre-tokenized words) into a new symbol.

    Stops early when no pair occurs twice. Ties go to the pair seen first in the text.
    """
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be at least 256 (one symbol per byte), got {vocab_size}")
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    words = Counter(tuple(to_symbols(p)) for p in split_text(text, [regex.compile(pattern)]))
    merges = []
    while len(vocab) < vocab_size:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best, count = max(pairs.items(), key=lambda kv: kv[1])  # max keeps the first of equals
        if count < 2:
            break
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        ranks = {best: 0}
        words = Counter({tuple(bpe(w, ranks)) if best[0] in w else w: n for w, n in words.items()})
    added = {t: len(vocab) + i for i, t in enumerate(special_tokens)}
    return BPETokenizer(vocab, merges, added, split_patterns=[pattern])


def utf8_complete_length(buf: bytes) -> int:
    """How much of ``buf`` can be decoded now: all of it, unless it ends inside a UTF-8 character
    (a lead byte 110xxxxx/1110xxxx/11110xxx followed by fewer continuation bytes than it needs)."""
    for back in range(1, min(4, len(buf)) + 1):
        b = buf[-back]
        if b & 0xC0 == 0x80:  # continuation byte 10xxxxxx: keep looking for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return len(buf) - back if back < need else len(buf)
    return len(buf)


class StreamDecoder:
    """Turn ids into text as they arrive, never emitting half a character.

    A token can end in the middle of a multi-byte UTF-8 character (an emoji is 4 bytes and often
    2-3 tokens). ``push`` holds such trailing bytes back until the character is complete;
    ``flush`` releases whatever is left. Joined, the pieces equal ``tokenizer.decode(all ids)``.
    """

    def __init__(self, tokenizer: BPETokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.pending = b""

    def push_bytes(self, data: bytes) -> str:
        buf = self.pending + data
        n = utf8_complete_length(buf)
        self.pending = buf[n:]
        return buf[:n].decode("utf-8", errors="replace")

    def push(self, ids) -> str:
        """Add one id or a list of ids; return the text that is now complete (maybe '')."""
        ids = [ids] if isinstance(ids, int) or getattr(ids, "ndim", 1) == 0 else list(ids)
        return self.push_bytes(self.tokenizer.decode_bytes(ids, self.skip_special_tokens))

    def flush(self) -> str:
        """The held-back bytes (an unfinished character becomes U+FFFD)."""
        out, self.pending = self.pending.decode("utf-8", errors="replace"), b""
        return out


__all__ = ["GPT2_SPLIT", "bytes_to_unicode", "to_symbols", "symbols_to_bytes", "split_text", "bpe",
           "BPETokenizer", "train_bpe", "StreamDecoder",
           "utf8_complete_length"]
