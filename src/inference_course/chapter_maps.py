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
from .plotting import STYLE, check_legible

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
}

# What each diagram shows, for readers who cannot see it.
ALT = {
    1: ("The inference flow: tokenizer, embedding, the blocks, final norm, LM head and sampling in a row, with "
        "the decode loop back to the embedding; below, one block: RMSNorm, attention, residual add, RMSNorm, "
        "MLP, residual add."),
    2: ("A real run: the prompt's BPE tokens with their ids, one prefill box, then one box per decoded token "
        "ending in the end-of-sequence token, and the detokenized answer."),
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
}

# Chapter 6's left panel is an illustration (its tokens are typed, and the page says so).
SPEC_DRAFT, SPEC_TARGET = [" Paris", ".", " It", " is"], [" Paris", ".", " The", " city"]
# Chapter 2's real run: a question the model answers in a few tokens.
RUN_MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


def _config():
    from inference_internals.model import LlamaConfig
    from inference_internals.weights import model_dir

    return LlamaConfig.from_json(model_dir() / "config.json")


def figure(chapter: int, model=None, tokenizer=None):
    """Chapter ``chapter``'s diagram as a matplotlib Figure, in the book's style. Chapter 2's is a real
    greedy run on the CPU in fp32 (``model`` and ``tokenizer`` if given, else loaded here): the same
    drawing everywhere."""
    import matplotlib as mpl

    with mpl.rc_context(STYLE):
        return _figure(chapter, model, tokenizer)


def _figure(chapter, model, tokenizer):
    if chapter == 1:
        return diagrams.inference_flow(model.config if model is not None else _config())
    if chapter == 2:
        import torch

        from inference_internals.generate import generate
        from inference_internals.model import Llama, load_tokenizer

        model = model if model is not None else Llama.from_pretrained(device="cpu", dtype=torch.float32)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
        eos = model.config.eos_token_id
        prompt = tokenizer.apply_chat_template(RUN_MESSAGES, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt)["input_ids"]
        assert tokenizer.decode(prompt_ids) == prompt  # the round trip is lossless
        new_ids = generate(model, prompt_ids, max_new_tokens=24, stop_ids=[eos])
        return diagrams.tokenization_to_generation(
            tokenizer.convert_ids_to_tokens(prompt_ids), prompt_ids, [tokenizer.decode([i]) for i in new_ids],
            stopped_on_eos=new_ids[-1] == eos, answer=tokenizer.decode(new_ids, skip_special_tokens=True))
    if chapter == 3:
        from inference_internals.analysis.flops import param_counts

        cfg = model.config if model is not None else _config()
        return diagrams.prefill_vs_decode(sum(param_counts(cfg).values()))
    if chapter == 4:
        from inference_internals.kv_cache import kv_cache_bytes

        return diagrams.kv_cache(model.config if model is not None else _config(), kv_cache_bytes)
    if chapter == 5:
        return diagrams.paged_attention()
    if chapter == 6:
        return diagrams.speculative_decoding(draft=SPEC_DRAFT, target=SPEC_TARGET)
    raise ValueError(f"no diagram for chapter {chapter!r}: chapters are 1 to {len(STAGES)}")


def svg(fig) -> str:
    """The figure as SVG text, the same bytes on every run (fixed hash salt, no date)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "inference-internals"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


class Diagram:
    """A chapter's diagram for display: an SVG image, as wide as the column, that a phone shows at the
    width whose text ``check_legible`` accepted and scrolls sideways (book/_static/course.css)."""

    def __init__(self, chapter: int, fig):
        check_legible(fig, svg=True)
        self.chapter = chapter
        self.svg = svg(fig)

    def _repr_html_(self) -> str:
        data = base64.b64encode(self.svg.encode()).decode()
        return (f'<div class="chapter-map"><img src="data:image/svg+xml;base64,{data}" '
                f'alt="{html.escape(ALT[self.chapter])}" style="width:100%"></div>')


def show(chapter: int, model=None, tokenizer=None) -> Diagram:
    """Chapter ``chapter``'s diagram, ready to display (the last line of a cell)."""
    return Diagram(chapter, figure(chapter, model, tokenizer))


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
