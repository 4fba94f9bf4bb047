"""Chapter 5's scheduler viewer: one recorded engine step (LLMEngine.states) as a grid of blocks."""
from __future__ import annotations

import html

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

TAB20 = [to_hex(plt.get_cmap("tab20")(i)) for i in range(20)]


def block_pool_html(run: str, s: dict, base: int, block_size: int, cols: int = 12) -> str:
    """Step ``s`` of ``run`` as HTML: each physical block coloured by the sequence that holds it (numbered
    from ``base``) and filled in proportion to its tokens; shared blocks hatched and labelled with their
    reference count, cached ones outlined dark; then the running sequences and their block tables."""
    n = len(s["owners"])
    cells = []
    for b in range(n):
        owners = s["owners"][b]
        edge = "#555" if s["cached"][b] else "#ccc"
        fill, label = "", ""
        if owners:
            hatch = len(owners) > 1
            colour = TAB20[(owners[0] - base) % 20]
            pattern = f"repeating-linear-gradient(45deg,{colour} 0 4px,#fff 4px 6px)" if hatch else colour
            fill = (f'<i style="position:absolute;left:0;top:0;bottom:0;'
                    f'width:{100 * s["fill"][b] / block_size:.0f}%;background:{pattern}"></i>')
            label = f"{len(owners)}x" if hatch else str(owners[0] - base)
        cells.append(f'<b style="position:relative;display:block;border:1px solid {edge};height:1.6em">{fill}'
                     f'<span style="position:relative;display:block;text-align:center;font-size:.8em;line-height:2em;'
                     f'font-weight:normal">{label}</span></b>')
    lines = [f"running {len(s['running'])}, waiting {len(s['waiting'])}"]
    if s["preempted"]:
        lines.append(f"preempted this step: {[p - base for p in s['preempted']]}")
    for sid in s["running"][:10]:
        q = s["seqs"][sid]
        lines.append(f"seq {sid - base:2}: {q['tokens']:3} tokens, blocks {q['table']}")
    if len(s["running"]) > 10:
        lines.append(f"... and {len(s['running']) - 10} more")
    return (f"<p style='margin:.2rem 0'><b>{html.escape(run)}, after step {s['step']} ({s['kind']})</b>: "
            f"{sum(map(bool, s['owners']))} of {n} blocks held</p>"
            f"<div style='display:grid;grid-template-columns:repeat({cols},minmax(1.6em,2.6em));gap:2px'>"
            f"{''.join(cells)}</div>"
            f"<pre style='font-size:.85em;margin:.4rem 0 0'>{html.escape(chr(10).join(lines))}</pre>")
