"""SentencePiece-style BPE (Gemma's tokenizer), from scratch, beside chapter 2's byte-level BPE.

Chapter 2's tokenizer (bpe.py) works on bytes: every text is first spelled as UTF-8 bytes, cut
into words by a regex, and merged by a *ranked list of merges*. Gemma's works on characters:

1. added tokens (control tokens such as ``<bos>``, and the file's user-defined pieces such as
   ``\\n\\n`` or ``<table>``) are cut out of the raw text first, as in bpe.py;
2. each space becomes ``▁`` (U+2581), so a word carries its leading space inside its first piece.
   There is no pre-tokenizer: a whole run of text is one sequence of characters;
3. merge: of all adjacent pairs whose concatenation is a piece of the vocabulary, join the one whose
   piece has the highest *score* (the leftmost on a tie), until no pair joins. The scores come with
   the vocabulary (``tokenizer.ggml.scores`` in the GGUF): no list of merges is stored at all;
4. *byte fallback*: a character that is not a piece (a rare CJK character, an emoji) becomes the
   tokens of its UTF-8 bytes, ``<0xF0>`` ``<0x9F>`` ..., so nothing is ever unknown.

Decoding reverses it: pieces joined, ``▁`` back to a space, byte tokens back to bytes, the bytes read
as UTF-8. ``encode`` puts ``<bos>`` first, as the model was trained (and as Hugging Face's does).

Gemma's file stores its runs of 2-31 spaces as user-defined pieces written with real spaces; the
real SentencePiece matches them whole before merging. Here they are pieces of ``▁`` with the
highest scores (shorter runs first), which merges them first: the same pieces.
"""
from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Iterable

import regex

SPACE = "\u2581"  # ▁
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece's piece types


class SentencePieceBPE:
    """``pieces[i]`` is token i's text (``▁`` for spaces), ``scores[i]`` its merge priority, ``types[i]``
    its SentencePiece type (normal, control, user-defined, byte, ...)."""

    def __init__(self, pieces: list[str], scores: list[float], types: list[int], bos_id: int | None = None,
                 eos_id: int | None = None, add_bos: bool = True):
        if not len(pieces) == len(scores) == len(types):
            raise ValueError(f"need one score and one type per piece, got {len(pieces)}, {len(scores)}, {len(types)}")
        self.pieces, self.scores, self.types = list(pieces), list(scores), list(types)
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.vocab: dict[str, int] = {}     # mergeable pieces -> id
        self.score: dict[str, float] = {}
        self.added: dict[str, int] = {}     # matched in the raw text, whole
        self.byte_ids: dict[int, int] = {}  # byte value -> id of <0xXX>
        for i, (p, s, t) in enumerate(zip(self.pieces, self.scores, self.types)):
            if t == BYTE:
                self.byte_ids[int(p[3:5], 16)] = i
            elif t == USER_DEFINED and p.strip(" ") == "" and len(p) > 1:
                # a run of spaces: a piece of ▁s, merged before anything else (shorter runs first)
                self.pieces[i] = SPACE * len(p)
                self.vocab[self.pieces[i]] = i
                self.score[self.pieces[i]] = 1e9 - len(p)
            elif t in (CONTROL, USER_DEFINED, UNKNOWN):
                self.added[p] = i
            elif t == NORMAL:
                self.vocab.setdefault(p, i)
                self.score.setdefault(p, s)
        if len(self.byte_ids) != 256:
            raise ValueError(f"byte fallback needs the 256 byte pieces <0x00>..<0xFF>, found {len(self.byte_ids)}")
        self.special = {i for i, t in enumerate(self.types) if t == CONTROL}
        # leftmost-longest match of the added tokens, as Hugging Face's added-vocabulary matcher
        self._added_re = regex.compile("|".join(regex.escape(t) for t in sorted(self.added, key=len, reverse=True)))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "SentencePieceBPE":
        """The tokenizer a GGUF file carries (``tokenizer.ggml.model == 'llama'``: SentencePiece)."""
        from .gguf_blocks import GGUFFile

        md = GGUFFile(path).metadata
        if md.get("tokenizer.ggml.model") != "llama":
            raise ValueError(f"{path}: tokenizer model {md.get('tokenizer.ggml.model')!r} is not SentencePiece ('llama')")
        return cls(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.scores"], md["tokenizer.ggml.token_type"],
                   md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id"),
                   bool(md.get("tokenizer.ggml.add_bos_token", True)))

    @classmethod
    def from_pretrained(cls, name: str = "gemma-3-270m") -> "SentencePieceBPE":
        """The tokenizer of an offline model whose GGUF is SentencePiece (Gemma 3 270M)."""
        from .weights import gguf_path

        return cls.from_gguf(gguf_path(name))

    def __len__(self) -> int:
        return len(self.pieces)

    # -- encoding ----------------------------------------------------------------------------
    def merge(self, text: str) -> list[str]:
        """Step 3 on normalized text: the pieces left when no adjacent pair joins into a better one.

        A heap of candidate pairs, best score first (then leftmost); the symbols form a linked
        list, and a pair whose symbols changed since it was pushed is skipped when popped."""
        syms = list(text)
        n = len(syms)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        heap = []

        def push(i: int) -> None:
            j = nxt[i]
            if j < n:
                s = self.score.get(syms[i] + syms[j])
                if s is not None and syms[i] in self.vocab and syms[j] in self.vocab:
                    heapq.heappush(heap, (-s, i, syms[i], syms[j]))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, left, right = heapq.heappop(heap)
            j = nxt[i] if syms[i] is not None else n
            if syms[i] != left or j >= n or syms[j] != right:
                continue  # stale: one of its symbols has merged since
            syms[i], syms[j] = left + right, None
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        return [s for s in syms if s is not None]

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids for text with no added tokens looked for (and no ``<bos>``)."""
        ids: list[int] = []
        for piece in self.merge(text.replace(" ", SPACE)):
            if piece in self.vocab:
                ids.append(self.vocab[piece])
            else:  # byte fallback
                ids.extend(self.byte_ids[b] for b in piece.encode("utf-8"))
        return ids

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Ids for ``text``: ``<bos>`` (unless ``add_bos=False``), then added tokens matched whole in the
        raw text and the ordinary text between them merged."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        ids = [self.bos_id] if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None else []
        pos = 0
        for m in self._added_re.finditer(text):
            if m.start() > pos:
                ids += self.encode_ordinary(text[pos:m.start()])
            ids.append(self.added[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self.encode_ordinary(text[pos:])
        return ids

    # -- decoding ----------------------------------------------------------------------------
    def _check_id(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                i = int(i)
            except (TypeError, ValueError):
                raise TypeError(f"token ids must be integers, got {i!r}") from None
        if not 0 <= i < len(self.pieces):
            raise ValueError(f"token id {i} is outside the vocabulary (size {len(self)})")
        return i

    def token_bytes(self, i: int) -> bytes:
        i = self._check_id(i)
        if self.types[i] == BYTE:
            return bytes([int(self.pieces[i][3:5], 16)])
        return self.pieces[i].replace(SPACE, " ").encode("utf-8")

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        return b"".join(self.token_bytes(i) for i in ids
                        if not (skip_special_tokens and self._check_id(i) in self.special))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text for ``ids``; bytes that are not valid UTF-8 become U+FFFD, as in Hugging Face."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.pieces[self._check_id(i)] for i in ids]


def load_tokenizer_for(path) -> object:
    """The from-scratch tokenizer of a model the engine loads: this file's for Gemma 3 270M (by name,
    or its prepared folder) and for a GGUF file whose vocabulary is SentencePiece's, chapter 2's
    byte-level BPE otherwise."""
    from .gguf_blocks import GGUFFile
    from .weights import cache_root, is_gguf_file, is_model_name, source

    if is_gguf_file(path):
        f = GGUFFile(Path(path).expanduser())
        sentencepiece = f.metadata.get("tokenizer.ggml.model") == "llama"
        f.close()
        if sentencepiece:
            return SentencePieceBPE.from_gguf(Path(path).expanduser())
    gemma = source("gemma-3-270m")
    if (is_model_name(path) and source(path) is gemma) or (
            path is not None and not is_model_name(path) and Path(path).expanduser().resolve()
            == (cache_root() / gemma.name).resolve()):
        return SentencePieceBPE.from_pretrained(gemma.name)
    from .bpe import BPETokenizer

    return BPETokenizer.from_pretrained(path)
