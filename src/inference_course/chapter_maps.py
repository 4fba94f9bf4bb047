"""Each chapter's map: the seed diagram it teaches at its top, and under each section's heading a
strip of the diagram's stages with that section's in bold.

The diagrams are the home page's (``diagrams.py``), drawn from the model's config, a real run or a
cited source; a chapter shows the same drawing, as an SVG image that needs no kernel to display.

    from inference_course import chapter_maps
    chapter_maps.show(3)                     # chapter 3's diagram (first cell after the title)
    chapter_maps.strip(3, "decode")          # the line under a section's heading: where it sits
"""
from __future__ import annotations

import base64
import html
import io

from . import diagrams
from .plotting import PHONE_PX, STYLE, check_legible

# Each chapter's stages, in the order its diagram shows them: (key, label on the strip).
STAGES: dict[int, list[tuple[str, str]]] = {
    1: [("tokenizer", "Tokenizer"), ("embedding", "Embedding"), ("blocks", "Blocks"),
        ("norm", "Final norm"), ("head", "LM head"), ("sampling", "Sampling")],
    2: [("template", "Chat template"), ("bpe", "BPE ids"), ("prefill", "Prefill"),
        ("decode", "Decode · sampling"), ("detokenize", "Detokenize")],
    3: [("ceilings", "Ridge: bytes/s, FLOP/s"), ("prefill", "Prefill · TTFT"),
        ("decode", "Decode · TPOT"), ("roofline", "Roofline"), ("batch", "Batching · B_crit"),
        ("bytes", "Fewer bytes")],
    4: [("recompute", "No cache: O(n²)"), ("cache", "Cache: O(n)"),
        ("bytes", "Bytes per token"), ("buffer", "Preallocated buffer"),
        ("api", "Append · batch · crop"), ("published", "Published models")],
    5: [("blocks", "Blocks"), ("tables", "Block tables"), ("pool", "Physical pool"),
        ("sharing", "Sharing"), ("scheduler", "Scheduler"),
        ("continuous", "Continuous batching")],
    6: [("draft", "Draft γ guesses"), ("verify", "Check in one pass"),
        ("accept", "Keep prefix + own token"), ("tokens", "Tokens per pass")],
    7: [("tokenizer", "SentencePiece"), ("embedding", "Embedding"), ("blocks", "Local · global blocks"),
        ("head", "Tied LM head"), ("cache", "Windowed KV cache")],
}

# What each diagram shows, for readers who cannot see it.
ALT = {
    1: ("The inference flow: tokenizer, embedding, the blocks, final norm, LM head and sampling in a row, with "
        "the decode loop back to the embedding; below, one block: RMSNorm, attention, residual add, RMSNorm, "
        "MLP, residual add."),
    2: ("A real run of 'What is RAG?' in five steps: the chat template around the question, the prompt's BPE "
        "tokens with their ids, one prefill box, one box per decoded token to the end-of-sequence token or "
        "the length limit, and the detokenized answer."),
    3: ("Left: roofline chart with decode far left on the bandwidth slope and prefill on the compute roof. "
        "Right: timeline with one prefill bar (time to first token) followed by short equal decode bars "
        "(time per output token)."),
    4: ("Left: without a cache every decode step recomputes keys and values for all earlier tokens (a "
        "triangle); with a cache only the new token's (a diagonal). Right: KV cache size growing linearly "
        "with context length for several batch sizes."),
    5: ("Top: three sequences split into blocks, their block tables, and the physical block pool where their "
        "blocks sit scattered among free ones. Bottom: static batching versus continuous batching of eight "
        "requests in three slots."),
    6: ("Left: four draft tokens; the first two are kept, the third is rejected and the target's own token "
        "takes its place, the fourth is never checked. Right: expected tokens per target pass against "
        "acceptance rate for γ = 2, 4, 8."),
    7: ("Gemma 3 270M's path: SentencePiece tokenizer, an embedding of 262,144 × 640 scaled by √640, 18 blocks "
        "(15 local, 3 global), the tied LM head and sampling. Below: the positions each layer's KV cache keeps "
        "at 2,048 tokens of context: 512 for each local layer, all 2,048 for the global layers 5, 11 and 17."),
}

# Chapter 6's left panel is an illustration (its tokens are typed, and the page says so).
SPEC_DRAFT, SPEC_TARGET = [" Paris", ".", " It", " is"], [" Paris", ".", " The", " city"]
# Chapter 2's real run: the chapter's question, with the short system message of its section 9 (the
# template's default system message would add 13 tokens to the drawing), greedy, to a length limit.
RUN_MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is RAG?"}]
RUN_NEW_TOKENS = 16


def _config(name=None):
    from inference_internals.model import LlamaConfig
    from inference_internals.weights import model_dir

    return LlamaConfig.from_json(model_dir(name) / "config.json")


def figure(chapter: int, model=None, tokenizer=None, phone: bool = False):
    """Chapter ``chapter``'s diagram as a matplotlib Figure, in the book's style; ``phone``: the same
    diagram laid out for a phone's column (``PHONE_PX``). Chapter 2's is a real greedy run on the CPU in
    fp32 (``model`` and ``tokenizer`` if given, else loaded here): the same drawing everywhere."""
    return figures(chapter, model, tokenizer, phones=(phone,))[0]


def figures(chapter: int, model=None, tokenizer=None, phones=(False, True)):
    """The diagram for each of ``phones`` (False: the column's, True: a phone's), from one run."""
    import matplotlib as mpl

    if chapter not in STAGES:
        raise ValueError(f"no diagram for chapter {chapter!r}: chapters are 1 to {len(STAGES)}")
    run = chapter2_run(model, tokenizer) if chapter == 2 else None
    with mpl.rc_context(STYLE):
        return [_figure(chapter, model, phone, run) for phone in phones]


def chapter2_run(model=None, tokenizer=None) -> dict:
    """Chapter 2's diagram's run: RUN_MESSAGES through the chat template, greedy, RUN_NEW_TOKENS at most."""
    import torch

    from inference_internals.generate import generate
    from inference_internals.model import Llama, load_tokenizer

    model = model if model is not None else Llama.from_pretrained(device="cpu", dtype=torch.float32)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    eos = model.config.eos_token_id
    prompt = tokenizer.apply_chat_template(RUN_MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(prompt_ids) == prompt  # the round trip is lossless
    new_ids = generate(model, prompt_ids, max_new_tokens=RUN_NEW_TOKENS, stop_ids=[eos])
    return dict(pieces=tokenizer.convert_ids_to_tokens(prompt_ids), prompt_ids=prompt_ids,
                new_pieces=[tokenizer.decode([i]) for i in new_ids], stopped_on_eos=new_ids[-1] == eos,
                answer=tokenizer.decode(new_ids, skip_special_tokens=True), messages=RUN_MESSAGES)


def _figure(chapter, model, phone, run):
    cfg = model.config if model is not None else None
    if chapter == 1:
        cfg = cfg or _config()
        return diagrams.inference_flow_phone(cfg) if phone else diagrams.inference_flow(cfg)
    if chapter == 2:
        return diagrams.tokenization_to_generation(**run, width=36 if phone else 80)
    if chapter == 3:
        from inference_internals.analysis.flops import param_counts

        return diagrams.prefill_vs_decode(sum(param_counts(cfg or _config()).values()), phone=phone)
    if chapter == 4:
        from inference_internals.kv_cache import kv_cache_bytes

        return diagrams.kv_cache(cfg or _config(), kv_cache_bytes, phone=phone)
    if chapter == 5:
        return diagrams.paged_attention(phone=phone)
    if chapter == 7:
        return diagrams.second_model(cfg or _config("gemma-3-270m"), phone=phone)
    return diagrams.speculative_decoding(draft=SPEC_DRAFT, target=SPEC_TARGET, phone=phone)


def svg(fig) -> str:
    """The figure as SVG text, the same bytes on every run (fixed hash salt, no date)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "inference-internals"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


class Diagram:
    """A chapter's diagram for display: an SVG image as wide as the column and, for screens narrower than
    720 px, the same diagram laid out for a phone's column (book/_static/course.css shows one of the two;
    Jupyter, without that style sheet, shows the first). Each is checked legible at the width it is shown."""

    def __init__(self, chapter: int, fig, phone_fig=None):
        check_legible(fig, svg=True)
        self.chapter = chapter
        self.svg = svg(fig)
        self.phone_svg = None
        if phone_fig is not None:
            check_legible(phone_fig, svg=True, column_px=PHONE_PX)
            self.phone_svg = svg(phone_fig)

    def _repr_html_(self) -> str:
        alt = html.escape(ALT[self.chapter])
        wide = ' class="chapter-map-wide"' if self.phone_svg is not None else ""
        shown = [f'<img{wide} src="data:image/svg+xml;base64,{_b64(self.svg)}" alt="{alt}" style="width:100%">']
        if self.phone_svg is not None:
            shown.append(f'<img class="chapter-map-phone" src="data:image/svg+xml;base64,{_b64(self.phone_svg)}" '
                         f'alt="{alt}" style="display:none">')
        return f'<div class="chapter-map">{"".join(shown)}</div>'


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def show(chapter: int, model=None, tokenizer=None) -> Diagram:
    """Chapter ``chapter``'s diagram, ready to display (the last line of a cell), with its phone layout."""
    return Diagram(chapter, *figures(chapter, model, tokenizer))


def strip(chapter: int, *keys: str) -> str:
    """One line of HTML for a section's Markdown, under its heading: chapter ``chapter``'s stages in the
    diagram's order, the ``keys`` in bold. Plain text with bold in Jupyter; pills on the website
    (book/_static/course.css). tests/test_chapter_maps.py checks every section's line against this."""
    known = [k for k, _ in STAGES[chapter]]
    unknown = [k for k in keys if k not in known]
    if not keys or unknown or len(set(keys)) != len(keys):
        raise ValueError(f"chapter {chapter}'s stages are {known}; got {list(keys)}")
    ordered = [k for k in known if k in keys]
    pills = [f"<b>{html.escape(label)}</b>" if key in keys else f"<span>{html.escape(label)}</span>"
             for key, label in STAGES[chapter]]
    return (f'<div class="stage-strip" data-chapter="{chapter}" data-stages="{" ".join(ordered)}">'
            f'On the map: {" → ".join(pills)}</div>')
