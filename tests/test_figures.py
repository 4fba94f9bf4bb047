"""The chapters' viewer helpers (inference_course.figures) draw what they are given."""
import re

from inference_course.figures.ch02 import show_token, token_html
from inference_course.figures.ch05 import block_pool_html
from inference_internals.bpe import BPETokenizer


def test_token_html_shows_every_token_with_its_id():
    tok = BPETokenizer.from_pretrained()
    text = "Hi 😀<|im_end|>"
    ids = tok.encode(text)
    shown = token_html(tok, text)
    assert shown.startswith(f"<div>{len(ids)} tokens, {len(text.encode())} bytes</div>")
    assert re.findall(r"<small[^>]*>(\d+)</small>", shown) == [str(i) for i in ids]
    assert "#f4b6b6" in shown  # the special token stands out
    partial = [i for i in ids if i not in tok.added_ids and show_token(tok, i).startswith("<")]
    assert partial and all(re.fullmatch(r"<[0-9a-f]{2}( [0-9a-f]{2})*>", show_token(tok, i)) for i in partial)


def test_block_pool_html_counts_held_shared_and_cached_blocks():
    state = {"step": 3, "kind": "decode", "owners": [[7], [7, 8], [], [8]], "cached": [False, True, False, False],
             "fill": [4, 2, 0, 1], "running": [7, 8], "waiting": [9], "preempted": [],
             "seqs": {7: {"tokens": 6, "table": [0, 1]}, 8: {"tokens": 5, "table": [1, 3]}}}
    shown = block_pool_html("demo", state, base=7, block_size=4)
    assert "demo, after step 3 (decode)</b>: 3 of 4 blocks held" in shown
    assert ">2x<" in shown and shown.count("repeating-linear-gradient") == 1  # one shared block, hatched
    assert shown.count("border:1px solid #555") == 1  # one cached block outlined
    assert "width:100%" in shown and "width:25%" in shown  # filled in proportion to its tokens
    assert "seq  0:   6 tokens, blocks [0, 1]" in shown and "running 2, waiting 1" in shown
