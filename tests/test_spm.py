"""Gemma's tokenizer from scratch (spm.py): SentencePiece-style BPE (scores, ▁, byte fallback) read from
the model's GGUF, equal to Hugging Face's ids on hard strings, and decoding back to the text."""
import random

import pytest

from inference_internals.spm import SPACE, SentencePieceBPE

HARD = ["The capital of France is Paris.", "def f(x):\n    return x**2  # square\n\n\tprint(f(3))",
        "emoji 🤖🎉👩‍👩‍👧 and flags 🇫🇷", "中文分词测试，日本語のテキスト、한국어 텍스트",
        "     five spaces, then\t\ttabs   and  two", "numbers 1234567890 3.14159 -0.001 1e10 2024-12-05",
        "<bos>inline special<eos> <table><tr>", "\n\n\n\nnewlines\r\n", "  leading", "trailing   ", "", " ",
        "a" * 300, "ẞ ǅ Ω ﬁ ½ ⁴ 𝔘𝔫𝔦", "URL https://example.com/a?b=c&d=e#f", "naïve café résumé",
        "\u200b zero width \ufeff bom", "x = [i for i in range(10) if i % 2 == 0]\nprint(x)",
        "{\"key\": [1, 2, {\"n\": null}]}", "mixed日本abc123😀xyz", "\x00\x01 control \x7f", " " * 40 + "x",
        "if (a && b) { return -1; } else { i++; }", "Ü̈ combining marks é", "𓀀 egyptian 𒀀 cuneiform"]


@pytest.fixture(scope="module")
def toks():
    from transformers import AutoTokenizer

    from inference_internals.weights import model_dir
    return SentencePieceBPE.from_pretrained("gemma-3-270m"), AutoTokenizer.from_pretrained(model_dir("gemma-3-270m"))


def test_hard_strings_equal_hugging_face(toks):
    ours, hf = toks
    mismatches = [t for t in HARD if ours.encode(t) != hf(t).input_ids]
    assert mismatches == []
    for t in HARD:
        assert ours.decode(ours.encode(t, add_bos=False)) == t


def test_random_strings_equal_hugging_face(toks):
    ours, hf = toks
    r = random.Random(0)
    chars = "ab cde\n\t  1234😀中文ñ.,;:'\"()[]{}<>_-=+*/\\\u2581"
    texts = ["".join(r.choice(chars) for _ in range(r.randint(0, 40))) for _ in range(200)]
    assert [t for t in texts if ours.encode(t) != hf(t).input_ids] == []


def test_the_three_ideas(toks):
    ours, _ = toks
    ids = ours.encode(" hello world", add_bos=False)
    assert all(p.startswith(SPACE) for p in ours.tokens(ids))     # ▁ carries the space
    rare = ours.encode("𓀀", add_bos=False)                         # a character no piece holds
    assert ours.tokens(rare) == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>"] and ours.decode(rare) == "𓀀"
    assert ours.merge("the") == ["the"]


@pytest.mark.parametrize("ab, bc, want", [(-1.0, -2.0, ["ab", "c"]), (-2.0, -1.0, ["a", "bc"]), (-1.0, -1.0, ["ab", "c"])])
def test_the_higher_score_joins_first_and_the_leftmost_on_a_tie(ab, bc, want):
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = bytes_ + ["<bos>", "a", "b", "c", "ab", "bc"]
    scores = [0.0] * 256 + [0.0, -10.0, -11.0, -12.0, ab, bc]
    types = [6] * 256 + [3, 1, 1, 1, 1, 1]
    tok = SentencePieceBPE(pieces, scores, types, bos_id=256)
    assert tok.merge("abc") == want
    assert tok.encode("abcé") == [256] + [pieces.index(p) for p in want] + [0xC3, 0xA9]  # é: byte fallback


def test_bad_ids_are_refused(toks):
    ours, _ = toks
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.decode([262_144])
    with pytest.raises(TypeError):
        ours.encode(b"bytes")
