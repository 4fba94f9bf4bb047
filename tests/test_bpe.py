"""Our byte-level BPE against the production (Hugging Face) tokenizer, plus its invariants."""
import random

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_internals.bpe import (GPT2_SPLIT, BPETokenizer, StreamDecoder, bpe, bytes_to_unicode,
                                     split_text, symbols_to_bytes, to_symbols, train_bpe)
from inference_internals.model import load_tokenizer
from inference_internals.weights import model_dir


@pytest.fixture(scope="module")
def folder():
    return model_dir()  # verifies the cache once; a given folder is not re-hashed


@pytest.fixture(scope="module")
def ours(folder):
    return BPETokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def hf(folder):
    return load_tokenizer(folder)


def hf_encode(hf, texts):
    return hf(list(texts), add_special_tokens=False)["input_ids"]


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<jupyter_code>"]
HAND = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n\n", "\t", "\t\t x", "\r\n", " \n ", "  \n\n  \t ",
    "What is RAG?", " RAG", "RAG", "rag", "1234567890", "3.14159", "1,000,000", "-42", "x=1e-9",
    "٣٤٥", "½²³", "Ⅻ", "१२३", "I'm", "I'll've", "don't", "DON'T", "'s", "'S", "''", "'''",
    "héllo", "he\u0301llo", "ﬁne", "naïve café", "Straße", "İstanbul", "Ωμέγα", "Привет, мир!",
    "日本語のテキスト", "中文分词测试", "한국어 텍스트", "مرحبا بالعالم", "שלום", "हिन्दी", "ไทย",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "a😀b", " 😀 😀", "🤗🤗🤗",
    "\u200b", "\u00a0", "a\u00a0b", "\u3000", "\u2028", "\x85", "\x1c\x1d\x1e\x1f", "\x00", "\x04!\x04",
    "\x7f", "\ufeffBOM", "\U000f0000", "tab\tsep\tvalues",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = i; }",
    "<div class=\"x\">&amp;</div>", "SELECT * FROM t WHERE id = 1;", "https://example.com/a?b=c#d",
    "    indented", "trailing   ", "a" * 300, " " * 200, "\n" * 100, "ab" * 150, "!" * 50, "😀" * 20,
    "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nWhat is RAG?<|im_end|>\n",
    "<|im_start|><|im_end|>", "<|im_start", "im_start|>", "<<|im_end|>>", "<|endoftext|><|endoftext|>",
    " <|im_end|> ", "x<|im_end|>y", "<|IM_END|>", "<file_sep><filename>a.py<jupyter_code>",
]
ALPHABET = [*"abcxyzABCXYZ", *"0123456789", *" \t\n\r", *".,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
            "é", "ß", "ñ", "ø", "Ж", "λ", "日", "本", "語", "中", "한", "ا", "ह", "😀", "👍", "🏽", "\u200d",
            "\u0301", "\u00a0", "\u3000", "½", "²", "٣", "'s", "'ll", " the", " RAG", "    ", "\n\n",
            *SPECIALS]


def corpus(n=2000, seed=0):
    """Hand-written hard cases plus ``n`` seeded random strings drawn from a mixed alphabet."""
    rng = random.Random(seed)
    out = list(HAND)
    for _ in range(n):
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))))
    return out


def test_what_is_rag(ours, hf):
    ids = ours.encode("What is RAG?")
    assert ids == [1780, 314, 428, 6801, 47] == hf.encode("What is RAG?")
    assert ours.tokens(ids) == ["What", "Ġis", "ĠR", "AG", "?"]


def test_digits_one_by_one(ours):
    assert len(ours.encode("1234567890")) == 10


def test_hard_corpus_matches_hf(ours, hf):
    texts = corpus()
    assert len(texts) >= 2000
    expected = hf_encode(hf, texts)
    bad = [(t, ours.encode(t), e) for t, e in zip(texts, expected) if ours.encode(t) != e]
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:3]}"


def test_decode_matches_hf(ours, hf):
    for t in corpus(300, seed=1):
        ids = ours.encode(t)
        assert ours.decode(ids) == hf.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_random_text_matches_hf_and_round_trips(ours, hf, text):
    ids = ours.encode(text)
    assert ids == hf.encode(text)
    missing = {chr(b) for b in ours.missing_bytes if b < 128}  # dropped bytes cannot come back
    if not any(c in missing for c in text) and not any(0x40000 <= ord(c) < 0xC0000 for c in text):
        assert ours.decode(ids) == text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 49151), max_size=30))
def test_random_ids_decode_like_hf(ours, hf, ids):
    # arbitrary id sequences include broken UTF-8: both must replace it the same way
    assert ours.decode(ids) == hf.decode(ids)


def test_special_tokens_handled_like_hf(ours, hf):
    text = "<|im_start|>user\nhi<|im_end|>\n"
    assert ours.encode(text)[0] == 1 and 2 in ours.encode(text)
    assert ours.encode(text, split_special_tokens=True) == \
        hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert 1 not in ours.encode(text, split_special_tokens=True)
    assert ours.decode([1, 2, 0]) == "<|im_start|><|im_end|><|endoftext|>"
    assert ours.decode([1, 6004, 2], skip_special_tokens=True) == "hi"


def test_byte_table_is_a_bijection_of_visible_characters():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


@settings(deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_symbols_round_trip(text):
    assert symbols_to_bytes(to_symbols(text)) == text.encode("utf-8")
    assert "".join(split_text(text, [regex.compile(GPT2_SPLIT)])) == text


def test_bpe_merges_lowest_rank_first():
    ranks = {("a", "n"): 0, ("b", "an"): 1, ("an", "a"): 2}
    trace = []
    assert bpe("banana", ranks, trace) == ["ban", "ana"]
    assert [step[0] for step in trace] == [("a", "n"), ("b", "an"), ("an", "a")]
    assert bpe("banana", {("a", "n"): 0, ("b", "an"): 1}) == ["ban", "an", "a"]
    assert bpe("xyz", ranks) == ["x", "y", "z"]
    assert bpe("", ranks) == []


def test_rag_merge_trace(ours):
    trace = []
    assert bpe(to_symbols(" RAG"), ours.ranks, trace) == ["ĠR", "AG"]
    assert trace[0][0] == ("Ġ", "R") and "ĠRAG" not in ours.vocab and ("ĠR", "AG") not in ours.ranks


def test_cache_gives_same_ids(ours):
    text = "the cat sat on the mat " * 20
    first = ours.encode(text)
    assert ours.encode(text) == first
    assert ours._encode_piece.cache_info().hits > 0


def test_train_bpe_learns_frequent_pairs_and_round_trips():
    text = "low lower lowest newer newest wider widest " * 30
    tok = train_bpe(text, 256 + 10)
    assert len(tok.merges) == 10 and len(tok.vocab) == 266
    assert tok.merges[0] in {("l", "o"), ("Ġ", "l"), ("e", "s"), ("e", "r"), ("w", "e"), ("s", "t")}
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text.encode()) / 2
    # fewer merges learnt than asked: stops when no pair repeats
    assert len(train_bpe("abc", 300).merges) == 0
    assert len(train_bpe(text, 1000).merges) < 1000 - 256


def test_train_bpe_with_special_tokens():
    tok = train_bpe("aaab aaab", 258, special_tokens=["<|end|>"])
    ids = tok.encode("aaab<|end|>")
    assert ids[-1] == tok.added_tokens["<|end|>"] == 258
    assert tok.decode(ids) == "aaab<|end|>"


def test_bad_input_raises_clear_errors(ours):
    with pytest.raises(TypeError, match="str"):
        ours.encode(b"bytes")
    with pytest.raises(ValueError, match="surrogate"):
        ours.encode("\ud800")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.decode([49152])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.decode([-1])
    with pytest.raises(TypeError, match="integers"):
        ours.decode(["a"])
    with pytest.raises(ValueError, match="at least 256"):
        train_bpe("x", 100)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPETokenizer({c: i for i, c in enumerate(bytes_to_unicode().values())}, [("a", "q")])
    with pytest.raises(ValueError, match="duplicate"):
        BPETokenizer({**{c: i for i, c in enumerate(bytes_to_unicode().values())}, "ab": 256},
                     [("a", "b"), ("a", "b")])
    assert ours.encode("What is RAG?") == [1780, 314, 428, 6801, 47]  # nothing corrupted


def test_from_file_rejects_other_tokenizer_kinds(tmp_path, folder):
    import json

    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["model"] = {**spec["model"], "vocab": {}, "merges": []}  # rejected before they are read
    for change in ({"pre_tokenizer": None}, {"normalizer": {"type": "NFC"}},
                   {"model": {**spec["model"], "type": "WordPiece"}},
                   {"pre_tokenizer": {"type": "Metaspace"}}):
        p = tmp_path / "tokenizer.json"
        p.write_text(json.dumps({**spec, **change}))
        with pytest.raises(ValueError):
            BPETokenizer.from_file(p)


def test_sequence_pre_tokenizer_with_digits(tmp_path, folder):
    """The original SmolLM2 tokenizer.json splits digits first, then runs ByteLevel."""
    import json

    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]]}
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(spec))
    ours = BPETokenizer.from_file(p)
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(p))
    for t in corpus(300, seed=2):
        assert ours.encode(t) == ref.encode(t, add_special_tokens=False).ids, t


def test_stream_decoder_never_splits_a_character(ours):
    text = "Emoji 😀👍🏽 and 日本語 and é"
    raw = text.encode()
    # one single-byte token per byte: every byte boundary becomes a step boundary
    ids = [ours.vocab[bytes_to_unicode()[b]] for b in raw]
    dec = StreamDecoder(ours)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert sum(p == "" for p in pieces) == len(raw) - len(text) + 1  # held back exactly the partial bytes


def test_stream_decoder_on_real_tokens(ours):
    text = "日本語 😀 🤗 ñ"
    ids = ours.encode(text)
    naive = [ours.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in naive)  # per-token decoding breaks characters
    dec = StreamDecoder(ours)
    pieces = [dec.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces) and "".join(pieces) + dec.flush() == text


@settings(deadline=None)
@given(st.binary(max_size=40), st.lists(st.integers(0, 40), max_size=8))
def test_stream_decoder_equals_whole_decode_on_any_bytes(data, cuts):
    class Raw:  # ids are bytes
        def decode_bytes(self, ids, skip=False):
            return bytes(ids)

    dec = StreamDecoder(Raw())
    cuts = sorted({0, len(data), *[c for c in cuts if c <= len(data)]})
    out = "".join(dec.push(list(data[a:b])) for a, b in zip(cuts, cuts[1:])) + dec.flush()
    assert out == data.decode("utf-8", errors="replace")
