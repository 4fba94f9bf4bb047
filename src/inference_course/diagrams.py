"""The diagrams of the book's map (book/intro.md), each at the top of its chapter, drawn with matplotlib.

Every number a diagram shows comes from the model config, the library, a small simulation
run here, or a cited source: nothing is typed in by hand. Each function returns a Figure.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch, Rectangle

INK = "#222222"
MUTED = "#777777"
FILL = {
    "io": "#eeeeee", "tok": "#fde2b3", "model": "#cfe2f3", "block": "#d9ead3",
    "head": "#ead1dc", "sample": "#fff2cc", "draft": "#e1d5f0", "ok": "#b7e1b5",
    "bad": "#f4b6b6", "off": "#f4f4f4",
}
SEQ_COLOURS = ["#8fb8de", "#f4a582", "#a6d96a", "#d9a6e0", "#f6d365"]

# H100 SXM5, dense BF16 tensor-core peak and HBM3 bandwidth, from NVIDIA's data sheet:
# https://www.nvidia.com/en-us/data-center/h100/ (1,979 TFLOPS is quoted with sparsity; dense is half).
H100_BF16_FLOPS = 1979e12 / 2
H100_BYTES_PER_S = 3.35e12


def _canvas(width: float, height: float):
    """A figure where one data unit is 0.1 inch, so layouts can be planned in text sizes."""
    fig = plt.figure(figsize=(width / 10, height / 10), layout="none")  # the layout is ours
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def _box(ax, x, y, w, h, text, fill, fontsize=10, ec=INK, lw=1.0, ls="-", weight="normal", color=INK):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.8",
                                fc=fill, ec=ec, lw=lw, ls=ls))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, weight=weight, color=color)


def _arrow(ax, start, end, color=INK, lw=1.2, style="-|>", connection="arc3", ls="-"):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle=style, color=color, lw=lw, shrinkA=0, shrinkB=0,
                                connectionstyle=connection, linestyle=ls, mutation_scale=12))


def _chain(ax, boxes, y, h, fontsize=10):
    """Boxes in a row, (x, w, text, fill) each, joined left to right by arrows."""
    for x, w, text, fill in boxes:
        _box(ax, x, y, w, h, text, FILL.get(fill, fill), fontsize=fontsize)
    for (x0, w0, *_), (x1, w1, *_) in zip(boxes, boxes[1:]):
        _arrow(ax, (x0 + w0 / 2, y), (x1 - w1 / 2, y))


# --- 1 ---------------------------------------------------------------------------------------

def inference_flow(cfg):
    """Tokenizer -> embedding -> N blocks -> final norm -> LM head -> logits -> sampling -> loop."""
    fig, ax = _canvas(80, 44)
    d, V, N = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    y = 30
    top = [(7, 11, "Tokenizer\n(BPE)", "tok"), (20.5, 11, "Embedding\ntable", "model"),
           (35, 13, f"{N} blocks", "block"), (49.5, 11, "Final\nRMSNorm", "model"),
           (62, 10, "LM head", "head"), (74, 10, "Sampling", "sample")]
    _chain(ax, top, y, 7)
    shapes = ["ids [T]", f"[T, {d}]", f"[T, {d}]", f"[T, {d}]", f"logits\n[T, {V:,}]", "next id"]
    for (x, *_), shape in zip(top, shapes):
        ax.text(x, y - 5, shape, ha="center", va="top", fontsize=9.5, color=MUTED, family="monospace")
    ax.text(7, 41.5, "prompt text", ha="center", va="center", fontsize=10, style="italic")
    _arrow(ax, (7, 40), (7, y + 3.5))
    # The decode loop: the sampled token becomes the next step's input.
    _arrow(ax, (74, y + 3.5), (74, 39.5), style="-")
    _arrow(ax, (74, 39.5), (20.5, 39.5), style="-")
    _arrow(ax, (20.5, 39.5), (20.5, y + 3.5))
    ax.text(47, 40.5, "append the new token and run again (decode), until EOS", ha="center", va="bottom",
            fontsize=9.5)
    # One block, zoomed in.
    ax.add_patch(FancyBboxPatch((8, 1), 71, 17.5, boxstyle="round,pad=0,rounding_size=1",
                                fc="#f7fbf5", ec=MUTED, ls="--", lw=1))
    for x in (28.5, 41.5):  # the zoom: this panel is what one of the blocks holds
        ax.plot([x, x], [y - 3.5, 18.5], color=MUTED, ls="--", lw=0.8)
    ax.text(10, 16.5, f"one block, repeated {N}×", fontsize=9.5, va="center", weight="bold")
    yb = 7.5
    inner = [(15, 5, "x", "io"), (23.5, 9, "RMSNorm", "model"),
             (37, 13, f"Attention\n{cfg.num_attention_heads} q / {cfg.num_key_value_heads} kv heads",
              "block"),
             (48, 3, "+", "off"), (56, 9, "RMSNorm", "model"), (67.5, 10, "MLP\n(or MoE)", "block"),
             (76, 3, "+", "off")]
    _chain(ax, inner, yb, 6, fontsize=9.5)
    # Residual connections skip each sub-layer.
    for x0, x1 in [(17.5, 48), (49.5, 76)]:
        _arrow(ax, (x0 + 1, yb + 3), (x1, yb + 3), connection="bar,fraction=-0.12", color="#4d8a3f")
    ax.text(33, 15, "residual", fontsize=9.5, color="#4d8a3f", ha="center")
    ax.text(43.5, 2.2, "RoPE on q, k · keys/values kept in the KV cache", fontsize=9.5, color=MUTED,
            ha="center")
    return fig


def inference_flow_phone(cfg):
    """``inference_flow`` for a phone's column: the same boxes, shapes and loop, top to bottom."""
    width, x = 36, 12.5
    d, V, N = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    stages = [("Tokenizer (BPE)", "tok", "ids [T]"), ("Embedding table", "model", f"[T, {d}]"),
              (f"{N} blocks", "block", f"[T, {d}]"), ("Final RMSNorm", "model", f"[T, {d}]"),
              ("LM head", "head", f"logits\n[T, {V:,}]"), ("Sampling", "sample", "next id")]
    fig, ax = _canvas(width, 10)  # drawn top down from y = 0; the height is set at the end
    ax.text(x, -1.5, "prompt text", ha="center", va="center", fontsize=10, style="italic")
    ys = [-7 - 6.3 * k for k in range(len(stages))]
    _arrow(ax, (x, -2.8), (x, ys[0] + 2.2))
    for k, ((label, fill, shape), yk) in enumerate(zip(stages, ys)):
        _box(ax, x, yk, 17, 4.4, label, FILL[fill])
        ax.text(x + 9.8, yk, shape, va="center", fontsize=9.5, color=MUTED, family="monospace")
        if k:
            _arrow(ax, (x, ys[k - 1] - 2.2), (x, yk + 2.2))
    # The decode loop: the sampled token becomes the next step's input.
    ax.plot([x - 8.5, 1.6, 1.6], [ys[-1], ys[-1], ys[1]], color=INK, lw=1.2)
    _arrow(ax, (1.6, ys[1]), (x - 8.5, ys[1]))
    y = ys[-1] - 3.5
    ax.text(1, y, "append the new token and run again\n(decode), until EOS", fontsize=9.5, va="top")
    # One block, zoomed in.
    top = y - 7.5
    ax.text(1.5, top - 2, f"one block, repeated {N}×", fontsize=9.5, va="center", weight="bold")
    inner = [("x", "io", 5), ("RMSNorm", "model", 12),
             (f"Attention · {cfg.num_attention_heads} q / {cfg.num_key_value_heads} kv heads", "block", 19),
             ("+", "off", 3), ("RMSNorm", "model", 12), ("MLP (or MoE)", "block", 14), ("+", "off", 3)]
    yb = [top - 6.5 - 5.2 * k for k in range(len(inner))]
    for k, ((label, fill, w), yk) in enumerate(zip(inner, yb)):
        _box(ax, x, yk, w, 3.4, label, FILL[fill], fontsize=9.5)
        if k:
            _arrow(ax, (x, yb[k - 1] - 1.7), (x, yk + 1.7))
    # Residual connections skip each sub-layer.
    green, xr = "#4d8a3f", x + 11
    for k0, k1 in [(0, 3), (3, 6)]:
        ax.plot([x + inner[k0][2] / 2, xr, xr], [yb[k0], yb[k0], yb[k1]], color=green, lw=1.2)
        _arrow(ax, (xr, yb[k1]), (x + 1.5, yb[k1]), color=green)
        ax.text(xr + 0.8, (yb[k0] + yb[k1]) / 2, "residual", fontsize=9.5, color=green, va="center")
    y = yb[-1] - 3.5
    ax.text(1.5, y, "RoPE on q, k · keys/values kept\nin the KV cache", fontsize=9.5, color=MUTED, va="top")
    y -= 6.5
    ax.add_patch(FancyBboxPatch((0.5, y), width - 1, top - y, boxstyle="round,pad=0,rounding_size=1",
                                fc="#f7fbf5", ec=MUTED, ls="--", lw=1, zorder=0))
    ax.set_ylim(y - 0.5, 0)
    fig.set_size_inches(width / 10, (0.5 - y) / 10)
    return fig


# --- 2 ---------------------------------------------------------------------------------------

def tokenization_to_generation(pieces, prompt_ids, new_pieces, stopped_on_eos, answer, messages, width=80):
    """A real run, in the five steps chapter 2 names: the chat template around ``messages``, the
    prompt's BPE pieces and ids, one prefill, the decode steps (to EOS or the length limit) and the
    detokenized answer. ``width`` in canvas units (0.1 inch): 80 for the column, 36 for a phone."""
    def box_width(text, least):  # a box as wide as its 9.5-point text (about 0.66 units a character)
        return max(least, 0.66 * len(text) + 1.5)

    def lines(text):  # bold 10-point text: about 0.76 units a character
        return textwrap.wrap(text, int((width - 2) / 0.76), subsequent_indent="    ")

    def flow(widths, x0):  # boxes left to right, a new row when the next would not fit
        rows, row, x = [], [], x0
        for i, w in enumerate(widths):
            if row and x + w > width - 1:
                rows.append(row)
                row, x = [], 1.5
            row.append((i, x + w / 2, w))
            x += w + 0.4 if x0 == 1.5 else w + 1.5
        return rows + [row]

    texts = [_show(p) for p in pieces]
    token_rows = flow([box_width(t, 5.6) for t in texts], 1.5)
    new_texts = [_show(p) for p in new_pieces]
    decode_rows = flow([box_width(t, 5.0) for t in new_texts] + [6], 13)  # the last: "EOS: stop" or "limit"
    said = ", ".join(f"{m['role']} “{m['content']}”" for m in messages)
    fig, ax = _canvas(width, 10)  # drawn top down from y = 0; the height is set at the end

    def say(y, text):
        for line in lines(text):
            ax.text(1, y - 1.5, line, fontsize=10, weight="bold", va="center")
            y -= 3
        return y

    y = say(0, f"1 · chat template: {said}, in ChatML (pink: its special tokens)")
    y = say(y, f"2 · BPE splits it into {len(pieces)} tokens; each is an id in the vocabulary")
    for row in token_rows:
        y -= 3
        for i, x, w in row:
            _box(ax, x, y, w, 3.6, texts[i], FILL["head"] if pieces[i].startswith("<|") else FILL["tok"],
                 fontsize=9.5)
            ax.text(x, y - 2.3, str(prompt_ids[i]), ha="center", va="top", fontsize=9.5, color=MUTED,
                    family="monospace")
        y -= 4.5
    y = say(y - 0.5, "3 · prefill: one forward pass over the whole prompt gives the first token")
    y = say(y, "4 · decode: each pass feeds the last token back in and gives one more")
    for r, row in enumerate(decode_rows):
        y -= 3.5
        if r == 0:
            _box(ax, 6.3, y, 10, 5, f"prefill\n{len(pieces)} tokens", FILL["block"], fontsize=9.5)
        for i, x, w in row:
            _arrow(ax, (x - w / 2 - (1.5 if i else 1.7), y), (x - w / 2, y))
            if i == len(new_texts):
                ax.text(x - w / 2 + 0.3, y, "EOS:\nstop" if stopped_on_eos else "limit:\nstop",
                        fontsize=9.5, va="center")
            else:
                eos = stopped_on_eos and i == len(new_texts) - 1
                _box(ax, x, y, w, 5, new_texts[i], FILL["bad"] if eos else FILL["sample"], fontsize=9.5)
        y -= 3
    y = say(y - 0.5, f"5 · detokenize the {len(new_pieces)} new ids: “{answer}”")
    ax.set_ylim(y - 0.5, 0)
    fig.set_size_inches(width / 10, (0.5 - y) / 10)
    return fig


def _show(piece: str) -> str:
    """A token as it reads: byte-level BPE writes a leading space as Ġ and a newline as Ċ."""
    return piece.replace("Ġ", "␣").replace("Ċ", "\\n").replace("\n", "\\n").replace(" ", "␣")


# --- 3 ---------------------------------------------------------------------------------------

def prefill_vs_decode(n_params, prompt_len=512, new_tokens=16, bytes_per_param=2, phone=False):
    """Roofline: prefill is compute-bound, decode bandwidth-bound; and what that does to TTFT / TPOT.
    ``phone``: the two panels one above the other, for a phone's column."""
    if phone:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(3.6, 6.4), gridspec_kw=dict(height_ratios=[1.2, 1]),
                                       layout="tight")
    else:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7.6, 3.6), gridspec_kw=dict(width_ratios=[1, 1.25]),
                                       layout="tight")
    peak, bw = H100_BF16_FLOPS, H100_BYTES_PER_S
    intensity = np.logspace(-0.5, 4, 200)
    ax1.loglog(intensity, np.minimum(peak, bw * intensity) / 1e12, color=INK, lw=2)
    ridge = peak / bw
    ax1.axvline(ridge, color=MUTED, ls=":", lw=1)
    ax1.text(ridge * 1.15, 3, f"ridge\n{ridge:.0f} FLOP/B", fontsize=9, color=MUTED)

    # A forward pass over T tokens: 2 FLOPs per parameter per token, every weight read once.
    def point(tokens):
        flops = 2 * n_params * tokens
        return flops / (n_params * bytes_per_param), flops

    for tokens, label, colour in [(1, "decode\n(1 token)", "#c0392b"), (prompt_len, f"prefill\n({prompt_len} tokens)",
                                                                       "#2e7d32")]:
        ai, _ = point(tokens)
        ax1.plot(ai, min(peak, bw * ai) / 1e12, "o", color=colour, ms=8)
        ax1.annotate(label, (ai, min(peak, bw * ai) / 1e12), textcoords="offset points", xytext=(8, -26),
                     fontsize=9, color=colour)
    ax1.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax1.set_ylabel("attainable TFLOP/s")
    ax1.set_title("roofline, H100 SXM (bf16)", fontsize=10)
    ax1.set_ylim(0.5, 3000)

    # Lower bounds on time from the same roofline: max(compute time, memory time).
    def seconds(tokens):
        flops = point(tokens)[1]
        return max(flops / peak, n_params * bytes_per_param / bw)

    ttft, tpot = seconds(prompt_len), seconds(1)
    ax2.barh(1, ttft * 1e6, color="#2e7d32", height=0.5)
    starts = ttft + tpot * np.arange(new_tokens)
    ax2.barh([0] * new_tokens, [tpot * 1e6] * new_tokens, left=starts * 1e6, color="#c0392b", height=0.5,
             edgecolor="white", linewidth=1)
    ax2.set_yticks([1, 0], ["prefill", "decode"])
    ax2.set_xlabel("time (µs), roofline lower bound")
    ax2.annotate("", xy=(ttft * 1e6, 1.45), xytext=(0, 1.45),
                 arrowprops=dict(arrowstyle="<->", color=INK, lw=1))
    ax2.text(ttft * 1e6 * 1.15, 1.45, f"TTFT ≥ {ttft * 1e6:.0f} µs", ha="left", va="center", fontsize=9)
    ax2.annotate("", xy=((ttft + tpot) * 1e6, -0.45), xytext=(ttft * 1e6, -0.45),
                 arrowprops=dict(arrowstyle="<->", color=INK, lw=1))
    ax2.text((ttft + tpot / 2) * 1e6, -0.75, f"TPOT ≥ {tpot * 1e6:.0f} µs", ha="left", fontsize=9)
    ax2.set_ylim(-1.1, 2.0)
    ax2.set_title(f"{n_params / 1e6:.0f}M parameters, {prompt_len}-token prompt,\n{new_tokens} new tokens",
                  fontsize=10)
    for a in (ax1, ax2):
        a.spines[["top", "right"]].set_visible(False)
    return fig


# --- 4 ---------------------------------------------------------------------------------------

def kv_cache(cfg, cache_bytes, n=8, contexts=(512, 1024, 2048, 4096, 8192), batches=(1, 8, 32), phone=False):
    """Without a cache step t recomputes K, V for all t tokens (O(n²) in total); with one, once each.
    ``phone``: the two grids side by side above the memory chart, for a phone's column."""
    if phone:
        fig, grid = plt.subplot_mosaic([["a", "b"], ["c", "c"]], figsize=(3.6, 6.2), layout="tight",
                                       gridspec_kw=dict(height_ratios=[1, 1.2]))
        axes = [grid["a"], grid["b"], grid["c"]]
    else:
        fig, axes = plt.subplots(1, 3, figsize=(7.6, 3.6), gridspec_kw=dict(width_ratios=[1, 1, 1.5]),
                                 layout="tight")
    for ax, cached in zip(axes[:2], (False, True)):
        for step in range(n):
            for tok in range(step + 1):
                new = tok == step
                colour = "#c0392b" if (new or not cached) else "#c9def0"
                ax.add_patch(Rectangle((tok, n - 1 - step), 0.9, 0.9, color=colour))
        computed = n * (n + 1) // 2 if not cached else n
        ax.set_title(f"{'with' if cached else 'without'} cache:\n{computed} K/V" + ("\n" if phone else " ")
                     + "computations",
                     fontsize=10)
        ax.set_xlim(-0.2, n)
        ax.set_ylim(-0.2, n)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        # On a phone the colours' key goes under the grids (it would not fit between them).
        ax.set_xlabel("token position" + (("\n(blue: from cache)" if cached else "\n(red: computed)") if phone else ""))
        for s in ax.spines.values():
            s.set_visible(False)
    axes[0].set_ylabel("decode step ↓")
    if not phone:
        axes[1].text(-0.5, -3.4, "red: computed   blue: read from cache", ha="center", fontsize=9,
                     color=MUTED)
    ax = axes[2]
    for batch in batches:
        ax.plot(contexts, [cache_bytes(cfg, c, batch) / 2**20 for c in contexts], "o-", ms=4,
                label=f"batch {batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(contexts, [f"{c // 1024}k" if c >= 1024 else str(c) for c in contexts])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache (MiB, bf16)")
    per_token = cache_bytes(cfg, 1, 1)
    ax.set_title(f"2 × {cfg.num_hidden_layers} layers × {cfg.num_key_value_heads} kv heads\n"
                 f"× {cfg.head_dim} × 2 B\n= {per_token:,} B per token", fontsize=9.5)
    ax.legend(fontsize=9, frameon=False, loc="lower right" if phone else "upper left")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


# --- 5 ---------------------------------------------------------------------------------------

def _schedule(lengths, slots, continuous):
    """Which request runs in which slot at each decode step (a tiny scheduler simulation)."""
    waiting, running, rows = list(range(len(lengths))), {}, []
    left = dict(enumerate(lengths))
    while waiting or running:
        if continuous or not running:  # static batching refills only when the whole batch is done
            for slot in range(slots):
                if slot not in running and waiting:
                    running[slot] = waiting.pop(0)
        rows.append(dict(running))
        for slot, req in list(running.items()):
            left[req] -= 1
            if left[req] == 0:
                del running[slot]
    return rows


def paged_attention(block_size=4, seq_lens=(10, 6, 13), pool=16, seed=3,
                    request_lens=(6, 2, 3, 7, 2, 4, 3, 2), slots=3, phone=False):
    """Block tables map each sequence's logical blocks to any free physical block;
    continuous batching refills a slot as soon as its request ends. ``phone``: the physical pool
    under the block tables, in a phone's column."""
    fs = 9.5 if phone else 11  # the column shrinks the 9-inch figure to 0.8; a phone's is shown at 1.0
    if phone:  # placed by hand, in inches: the drawing's units square, 0.06 inch each
        h = 7.4
        fig = plt.figure(figsize=(3.6, h), layout="none")
        ax = fig.add_axes([0.01, 1 - 4.4 / h, 0.98, 4.36 / h])
        places = [fig.add_axes([0.17, bottom / h, 0.8, 0.65 / h]) for bottom in (1.95, 0.74)]
    else:
        fig = plt.figure(figsize=(9, 6), layout="none")  # placed by the gridspec below
        grid = fig.add_gridspec(3, 1, height_ratios=[3.2, 1, 1], hspace=0.6, left=0.08, right=0.98,
                                top=0.99, bottom=0.09)
        ax = fig.add_subplot(grid[0])
        places = [fig.add_subplot(grid[1]), fig.add_subplot(grid[2])]
    ax.set_xlim(-7, 51 if phone else 90)
    ax.set_ylim(-38 if phone else -6, 35 if phone else 33)
    ax.axis("off")
    rng = np.random.default_rng(seed)
    free = [int(b) for b in rng.permutation(pool)]  # any free block will do: no contiguity needed
    tables, owner = [], {}
    for s, length in enumerate(seq_lens):
        tables.append([free.pop() for _ in range(-(-length // block_size))])
        owner.update({b: s for b in tables[-1]})
    ax.text(-6, 33 if phone else 31.5, f"sequences (blocks of {block_size} tokens)", fontsize=fs, weight="bold")
    ax.text(33, 29.8 if phone else 31.5, "block tables", fontsize=fs, weight="bold")
    # The pool: right of the tables in the column, under them on a phone.
    px, py = (-6, -8) if phone else (55, 23)
    ax.text(px, py + 8.5 if phone else 31.5, "physical KV blocks (GPU memory)", fontsize=fs, weight="bold")
    for s, (length, blocks) in enumerate(zip(seq_lens, tables)):
        y = 25 - 9 * s
        ax.text(-6, y + 2.8, f"seq {s}: {length} tokens", fontsize=fs)
        end = -6
        for t in range(length):
            end = -6 + t * 2.2 + (t // block_size) * 0.8
            ax.add_patch(Rectangle((end, y - 1), 2, 2.6, color=SEQ_COLOURS[s]))
        ax.annotate("", xy=(32.5, y + 0.3), xytext=(end + 3, y + 0.3),
                    arrowprops=dict(arrowstyle="-|>", color=MUTED, lw=0.8))
        ax.text(33, y + 0.3, "[" + ", ".join(map(str, blocks)) + "]", fontsize=fs, family="monospace",
                va="center")
    cols = 4
    for b in range(pool):
        x, y = px + (b % cols) * 8.5, py - (b // cols) * 6.5
        ax.add_patch(FancyBboxPatch((x, y), 7.5, 5.2, boxstyle="round,pad=0,rounding_size=0.5",
                                    fc=SEQ_COLOURS[owner[b]] if b in owner else "white", ec=INK, lw=0.8))
        ax.text(x + 3.75, y + 2.6, str(b) if b in owner else f"{b}\nfree", ha="center", va="center",
                fontsize=fs)
    used = sum(len(t) for t in tables)
    waste = used * block_size - sum(seq_lens)
    ax.text(px if phone else 55, py - 21 if phone else 2.5, f"{used} of {pool} blocks in use.\nEmpty slots: {waste} tokens, only\n"
            "ever in a sequence's last block.", fontsize=fs, color=MUTED, va="top")

    schedules = [(continuous, _schedule(list(request_lens), slots, continuous)) for continuous in (False, True)]
    longest = max(len(rows) for _, rows in schedules)
    for k, (continuous, rows) in enumerate(schedules):
        a = places[k]
        for step, running in enumerate(rows):
            for slot, req in running.items():
                a.add_patch(Rectangle((step, slot), 0.95, 0.9, color=plt.cm.tab10(req % 10)))
                a.text(step + 0.47, slot + 0.45, str(req), ha="center", va="center", fontsize=fs, color="white")
        a.set_xlim(0, longest + 0.2)
        a.set_ylim(slots, 0)
        a.set_yticks([s + 0.45 for s in range(slots)], [f"slot {s}" for s in range(slots)], fontsize=fs)
        kind = "continuous" if continuous else "static"
        a.set_title(f"{kind} batching: {len(request_lens)} requests, {len(rows)} steps" if phone else
                    f"{kind} batching: {len(request_lens)} requests done after {len(rows)} steps",
                    fontsize=fs, loc="left")
        a.spines[["top", "right", "left"]].set_visible(False)
        a.tick_params(left=False, labelsize=fs)
    a.set_xlabel("decode step (a cell: one token of the request" + ("\n" if phone else " ") + "with that number)",
                 fontsize=fs)
    return fig


# --- 6 ---------------------------------------------------------------------------------------

def speculative_decoding(draft, target, gammas=(2, 4, 8), phone=False):
    """Draft γ tokens cheaply, verify them in one target pass, keep the agreeing prefix plus the
    target's own token (its pick where the first guess failed, or a bonus token if none did).
    ``phone``: the two panels one above the other, for a phone's column."""
    if phone:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(3.6, 6.6), gridspec_kw=dict(height_ratios=[1.15, 1]),
                                      layout="tight")
    else:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(7.6, 3.9), gridspec_kw=dict(width_ratios=[1.55, 1]),
                                      layout="tight")
    ax.set_xlim(0, 50)
    ax.set_ylim(0, 40)
    ax.axis("off")
    gamma = len(draft)
    accepted = 0
    while accepted < gamma and draft[accepted] == target[accepted]:
        accepted += 1
    green, red = "#2e7d32", "#c0392b"
    cut = "\n" if phone else " "
    ax.text(0, 38, f"1 · the draft guesses γ = {gamma}{cut}tokens, cheaply", fontsize=9.5, weight="bold",
            va="center")
    ax.text(0, 23.5, f"2 · the target checks them all{cut}in one pass", fontsize=9.5, weight="bold", va="center")
    w = 11
    for i, guess in enumerate(draft):
        x = 0.5 + w / 2 + i * (w + 1.2)
        _box(ax, x, 33, w, 5, _show(guess), FILL["draft"], fontsize=9.5)
        verdict, colour = (("✓ kept", green) if i < accepted else ("✗ rejected", red) if i == accepted
                           else ("not\nchecked" if phone else "not checked", MUTED))
        ax.text(x, 28.6, verdict, ha="center", va="center", fontsize=9, color=colour)
        # The target's pick after the context and the guesses before position i.
        if i < accepted:
            _box(ax, x, 18.5, w, 5, _show(target[i]), FILL["ok"], fontsize=9.5)
        elif i == accepted:
            _box(ax, x, 18.5, w, 5, _show(target[i]), FILL["model"], fontsize=9.5, lw=1.6)
            ax.text(x, 14, "its own token", ha="center", va="center", fontsize=9, color=INK)
        else:
            _box(ax, x, 18.5, w, 5, "—", FILL["off"], fontsize=9.5, ec=MUTED)
    own = "its own token at the first mismatch" if accepted < gamma else "a bonus token of its own"
    ax.text(0, 5.5, f"3 · one target pass yields {accepted + 1} tokens:\n{accepted} kept guesses + "
            + ("\n" if phone else "") + own, fontsize=9.5, va="center")
    # Expected tokens per target pass when each guess is accepted with probability a
    # (Leviathan et al. 2023, eq. 1): (1 - a^(γ+1)) / (1 - a).
    alpha = np.linspace(0, 0.99, 100)
    for g in gammas:
        ax2.plot(alpha, (1 - alpha ** (g + 1)) / (1 - alpha), label=f"γ = {g}")
    ax2.set_xlabel("acceptance rate α")
    ax2.set_ylabel("tokens per target pass")
    ax2.set_title(r"expected: $(1-\alpha^{\gamma+1})\,/\,(1-\alpha)$", fontsize=10)
    ax2.legend(fontsize=9, frameon=False)
    ax2.spines[["top", "right"]].set_visible(False)
    return fig


# --- 7 ---------------------------------------------------------------------------------------

def second_model(cfg, context=2048, phone=False):
    """Gemma 3's path from text to token, and what its window does to the KV cache: the positions each
    layer keeps at ``context`` tokens (a local layer its ``sliding_window``, a global one all of them).
    Every number comes from ``cfg``. ``phone``: the chain top to bottom, for a phone's column."""
    d, V, N = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    local = cfg.windowed_layers
    stages = [("SentencePiece\ntokenizer", "tok"), (f"Embedding\n{V:,} × {d}\nscaled ×√{d}", "model"),
              (f"{N} blocks\n{len(local)} local\n{N - len(local)} global", "block"),
              (f"Tied LM head\n{V:,} × {d}", "head"), ("Sampling", "sample")]
    if phone:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(3.6, 6.6), gridspec_kw=dict(height_ratios=[1.3, 1]),
                                      layout="tight")
        ax.set_xlim(0, 36)
        ax.set_ylim(0, 40)
        ys = [36 - 7.6 * k for k in range(len(stages))]
        for k, ((label, fill), y) in enumerate(zip(stages, ys)):
            name, _, rest = label.partition("\n")
            _box(ax, 18, y, 30, 5.4, f"{name}\n{rest.replace(chr(10), ' · ')}".strip(), FILL[fill], fontsize=9.5)
            if k:
                _arrow(ax, (18, ys[k - 1] - 2.7), (18, y + 2.7))
    else:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7.6, 4.6), gridspec_kw=dict(height_ratios=[0.8, 1]),
                                      layout="tight")
        ax.set_xlim(0, 76)
        ax.set_ylim(0, 10)
        xs = [7 + 15.5 * k for k in range(len(stages))]
        for k, ((label, fill), x) in enumerate(zip(stages, xs)):
            _box(ax, x, 5, 13.5, 7.5, label, FILL[fill], fontsize=9.5)
            if k:
                _arrow(ax, (xs[k - 1] + 6.75, 5), (x - 6.75, 5))
    ax.axis("off")
    kept = [min(context, cfg.window(i)) if i in local else context for i in range(N)]
    colours = [FILL["block"] if i in local else "#6a9fd4" for i in range(N)]
    ax2.bar(range(N), kept, color=colours, edgecolor=INK, linewidth=0.6)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("positions kept")
    ax2.set_title(f"KV cache at {context:,} tokens of context", fontsize=10)
    ax2.set_xticks(range(0, N, 3 if phone else 1))
    ax2.set_ylim(0, context * 1.3)
    first_global = next(i for i in range(N) if i not in local)
    ax2.text(local[0] - 0.4, cfg.sliding_window + context * 0.04, f"local: last {cfg.sliding_window}",
             fontsize=9, va="bottom")
    ax2.text(first_global, context * 1.03, "global: all", fontsize=9, va="bottom", ha="center")
    ax2.spines[["top", "right"]].set_visible(False)
    return fig
