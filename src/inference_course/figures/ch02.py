"""Chapter 2's tokenizer viewer: each token of a text as a coloured span with its id under it."""
from __future__ import annotations

import html

PALETTE = ["#fde2b3", "#cfe2f3", "#d9ead3", "#ead1dc", "#fff2cc", "#e1d5f0"]
SPECIAL = "#f4b6b6"


def show_token(tok, i: int) -> str:
    """Token ``i`` as it reads: spaces, newlines and tabs made visible; a token that is only part of a
    character shows its bytes in hex."""
    if i in tok.added_ids:
        return tok.added_ids[i]
    raw = tok.token_bytes(i)
    try:
        return raw.decode("utf-8").replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    except UnicodeDecodeError:
        return "<" + raw.hex(" ") + ">"


def token_html(tok, text: str) -> str:
    """``text`` encoded by ``tok`` (chapter 2's BPETokenizer), one span per token, special tokens in red."""
    ids = tok.encode(text)
    spans = []
    for k, i in enumerate(ids):
        colour = SPECIAL if i in tok.added_ids else PALETTE[k % len(PALETTE)]
        spans.append(f'<span style="display:inline-block;margin:1px;padding:1px 3px;background:{colour};'
                     f'border-radius:3px;font-family:monospace;text-align:center">{html.escape(show_token(tok, i))}'
                     f'<br><small style="color:#555">{i}</small></span>')
    return f"<div>{len(ids)} tokens, {len(text.encode())} bytes</div><div>{''.join(spans)}</div>"
