"""Chapter 3's helpers: the batch-size figure, and section 8's reading of the committed benchmark run
(benchmarks/results/latest.json) beside the live measurements: our engines against llama.cpp and
Hugging Face, and where a decode step's time goes per weight format.

The committed run may lack a section (llama.cpp not installed where it ran, an older file): each
reader then says "not measured in the committed run" instead of failing.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from inference_internals import timing

NOT_MEASURED = "not measured in the committed run"
# The ISA flags that decide which kernels a CPU can run fast (matrix units, 8- and 16-bit dot products).
KERNEL_ISA = ("amx", "bf16", "vnni", "fp16", "neon", "sve", "dotprod")


def table_html(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A measurement table, compact: small type, tight cells, numbers on one line; on a phone it scrolls
    sideways in the theme's table box, which the book's CSS gives edge shadows. ``align``: one letter per column, l or r (default: first l, rest r).
    Cells are HTML (escape text yourself); ``<code>`` and ``<small>`` read as in the prose."""
    align = align or "l" + "r" * (len(header) - 1)
    if any(len(r) != len(header) for r in rows) or len(align) != len(header):
        raise ValueError("every row, and align, needs one entry per column")
    cell = "padding:0.15rem 0.45rem;border-bottom:1px solid var(--pst-color-border,#ddd);text-align:{}"
    th = "".join(f'<th style="{cell.format("left" if a == "l" else "right")};vertical-align:bottom">{h}</th>'
                 for h, a in zip(header, align))
    body = "".join("<tr>" + "".join(f'<td style="{cell.format("left" if a == "l" else "right")};white-space:nowrap">'
                                    f"{c}</td>" for c, a in zip(r, align)) + "</tr>" for r in rows)
    return (f'<div class="pst-scrollable-table-container"><table style="border-collapse:collapse;font-size:0.85rem;'
            f'margin:0.3rem 0"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>')


def find_results(start: Path | str = ".") -> Path | None:
    """``benchmarks/results/latest.json`` in ``start`` or the nearest folder above it, or None."""
    here = Path(start).resolve()
    for p in (here, *here.parents):
        f = p / "benchmarks" / "results" / "latest.json"
        if f.is_file():
            return f
    return None


def load_results(path: Path | str | None) -> dict:
    """The committed run as a dict; {} when there is none."""
    return json.loads(Path(path).read_text()) if path else {}


def _spread(stats: dict) -> timing.Spread:
    """A stored summary of rounds ({"median", "min", "max"}) as a Spread: its band is the rounds' range."""
    return timing.Spread((stats["min"], stats["median"], stats["max"]))


def machine_line(results: dict, when: str | None = None) -> str:
    """Where and when the committed run ran: cpu, cores, the kernel-relevant ISA flags, date (or
    ``when`` in its place: a section run again later)."""
    m = results.get("machine")
    if not isinstance(m, dict):
        return f"the machine it ran on is {NOT_MEASURED}"
    isa = [f for f in m.get("isa", []) if any(k in f for k in KERNEL_ISA)] or m.get("isa", [])
    parts = [m.get("cpu") or m.get("device", "an unnamed machine")]
    if m.get("cores"):
        parts.append(f"{m['cores']} cores")
    if isa:
        parts.append(", ".join(isa))
    return '; '.join(parts) + (f"; {when}" if when else f", on {m.get('date', 'an unrecorded date')}")


def best_compiled(q: dict) -> str | None:
    """Our fastest quantized engine, compiled ones first (the committed run's own pick otherwise); not a
    lever that changes the tokens (an LM head requantized: format "q4_1 int4-head")."""
    engines = q.get("engines", {})
    ours = {k: e for k, e in engines.items() if k.startswith("ours") and isinstance(e, dict) and "median" in e
            and e.get("format", "") not in ("fp32", "bf16") and "int4-head" not in e.get("format", "")
            and not any(f in k for f in (" fp32", " bf16"))}
    compiled = {k: e for k, e in ours.items() if e.get("compiled") or k.endswith("compiled")}
    pool = compiled or ours
    if pool:
        return max(pool, key=lambda k: pool[k]["median"])
    best = q.get("best") or q.get("best_quantized")
    return best if best in engines else None


def _engine(engines: dict, *starts: str) -> str | None:
    """The first engine whose name starts with one of ``starts`` and that has a measurement."""
    for s in starts:
        for k, e in engines.items():
            if k.startswith(s) and isinstance(e, dict) and "median" in e:
                return k
    return None


def peers_markdown(results: dict) -> str:
    """Our best compiled quantized engine, llama.cpp and Hugging Face's generate() in the committed
    run: tok/s (median, range), ours ÷ each per round, and the sentence that spread supports; "not
    measured in the committed run" wherever the file lacks a part."""
    q = results.get("quantized")
    best = best_compiled(q) if isinstance(q, dict) and q.get("engines") else None
    if best is None:
        return f"Our quantized engines against llama.cpp and Hugging Face: {NOT_MEASURED}."
    engines = q["engines"]
    e = engines[best]
    kind = "" if best.endswith("compiled") else " (compiled)" if e.get("compiled") else " (eager: none compiled in that run)"
    run = results.get("quantized_run")  # this section run again later, with some others or none, on the same machine
    where = machine_line(results, f"this comparison run again on {run['date']}, commit {run['commit']}"
                         if isinstance(run, dict) else None)
    head = (f"Committed run ({where}): our fastest quantized engine, {best}{kind}, "
            f"{e['median']:.1f} tok/s ({e['min']:.1f}–{e['max']:.1f}) at batch 1.")
    if "vnni" in e.get("format", ""):
        head += (" Its kernels (`blockdot.py`) take the file's own bytes, as llama.cpp does, but round each "
                 "activation to two int8 codes per block of 32, not one.")
    rows, said, missing = [], [], []
    for label, starts, key in (("llama.cpp", ("llama.cpp",), "vs_llama_cpp"),
                               ("Hugging Face generate()", ("Hugging Face generate() fp32", "Hugging Face"), "vs_hf")):
        name = _engine(engines, *starts)
        r = q.get(key, {}).get(best) if isinstance(q.get(key), dict) else None
        if name is None or not (isinstance(r, dict) and {"median", "min", "max"} <= set(r)):
            missing.append(label)
            continue
        p, s = engines[name], _spread(r)
        rows.append([html.escape(name), f"{p['median']:.1f} ({p['min']:.1f}–{p['max']:.1f})", f"{s:.2fx}"])
        said.append(timing.says(s, 1.0, f"faster than {label} in every round", f"slower than {label} in every round",
                                f"level with {label} within the rounds' spread ({s.lo:.2f}–{s.hi:.2f}×)"))
    text = head
    if rows:
        text += f" Ours was {' and '.join(said)}:\n\n" + table_html(
            ["engine", "tok/s, median (range)", "ours ÷ it, per round"],
            [[html.escape(best), f"{e['median']:.1f} ({e['min']:.1f}–{e['max']:.1f})", "—"], *rows])
    cpp = q.get("llama_cpp")
    if rows and "llama.cpp" in " ".join(said) and isinstance(cpp, dict) and cpp.get("fallback"):
        text += ("\n\nllama.cpp ran without its AMX buffers, on its AVX-512 kernels: with them, version "
                 f"{cpp.get('version', '?')} crashed in its first prefill on this CPU (llama.cpp issue #20824).")
    if missing:
        why = q.get("llama_cpp") if "llama.cpp" in missing and isinstance(q.get("llama_cpp"), str) else ""
        text += ("\n\n" if rows else " ") + " and ".join(missing) + f": {NOT_MEASURED}" + (
            f" ({why.removeprefix('unmeasured: ')})" if why else "") + "."
    return text


PARTS = (("law_ms", "bytes ÷ bandwidth"), ("kernels_beyond", "kernels beyond that"),
         ("outside_ms", "outside kernels"))


def breakdown_parts(entry: dict) -> dict:
    """One format's step in three stacked parts (ms): the bandwidth law's time for its bytes, what its
    projection kernels take beyond that, and the rest of the step (norms, attention, the ops' fixed cost)."""
    kernels = sum(entry["kernels_ms"].values())
    return {"law_ms": entry["law_ms"], "kernels_beyond": max(kernels - entry["law_ms"], 0.0),
            "outside_ms": max(entry["outside_ms"], 0.0), "kernels_ms": kernels}


SECTION_NAMES = {"breakdown": "The breakdown is", "quality": "The quality table is",
                 "quantized": "The per-format comparison is", "speculative": "The speculative figures are"}


def section_run(results: dict, section: str = "breakdown") -> str | None:
    """Where a section's figures come from, when a later run of some sections only replaced the
    committed run's (``results[f"{section}_run"]``, or the section's own ``"run"``: the speculative
    section keeps its run's facts inside itself); None when they are the committed run's own."""
    run = results.get(f"{section}_run")
    if run is None and isinstance(results.get(section), dict):
        run = results[section].get("run")
    if not isinstance(run, dict):
        return None
    return (f"{SECTION_NAMES.get(section, f'{section} is')} from a later run of some sections only, on the same "
            f"machine ({run['date']}, commit {run['commit']}: {run['note']}).")


def breakdown_source(results: dict) -> str | None:
    """Chapter 3's line under the comparison, on where its breakdown comes from: the same later run
    as the comparison (then just that), another one (``section_run``), or the committed run (None)."""
    run, comparison = results.get("breakdown_run"), results.get("quantized_run")
    if isinstance(run, dict) and isinstance(comparison, dict) and \
            (run.get("date"), run.get("commit")) == (comparison.get("date"), comparison.get("commit")):
        return "The breakdown below is from the same run as the comparison above."
    return section_run(results)


def breakdown_figure(results: dict):
    """Horizontal stacked bars, one per format of the committed run's "breakdown": bytes ÷ bandwidth,
    projection kernels beyond it, outside the kernels (ms per token), and the measured step (median,
    range). Narrow (4.2 in) and large-lettered (11 pt): a phone shows it at ~85%, its text at 13 px. None
    when the run has no breakdown."""
    import matplotlib.pyplot as plt

    b = results.get("breakdown")
    b = {k: v for k, v in b.items() if isinstance(v, dict) and "step_ms" in v} if isinstance(b, dict) else {}
    if not b:  # none measured (a format that failed to compile keeps only its error)
        return None
    if any(v.get("compiled") for v in b.values()):  # the compiled steps are the engines people run: those only
        b = {k: v for k, v in b.items() if v.get("compiled")}
    names = list(b)[::-1]  # the first format on top
    compiled = [bool(b[n].get("compiled")) for n in names]
    fig, ax = plt.subplots(figsize=(4.2, 1.7 + 0.33 * len(names)))
    left = [0.0] * len(names)
    for (key, label), colour in zip(PARTS, ("0.35", "C0", "C1")):
        widths = [breakdown_parts(b[n])[key] for n in names]
        ax.barh(range(len(names)), widths, left=left, color=colour, label=label, height=0.6)
        left = [a + w for a, w in zip(left, widths)]
    steps = [b[n]["step_ms"] for n in names]
    ax.errorbar([s["median"] for s in steps], range(len(names)),
                xerr=[[s["median"] - s["min"] for s in steps], [s["max"] - s["median"] for s in steps]],
                fmt="k|", ms=14, capsize=3, label="measured step")
    mixed = any(compiled) and not all(compiled)
    ax.set_yticks(range(len(names)), [n.removesuffix(" compiled") + (" (eager)" if mixed and not c else "")
                                      for n, c in zip(names, compiled)], fontsize=11)
    ax.set_xlabel("ms per token (batch-1 step)", fontsize=11)
    ax.tick_params(axis="x", labelsize=11)
    ax.set_xlim(0, None)
    fig.legend(loc="outside lower center", ncol=2, fontsize=11, frameon=False)
    ax.set_title("Where a step's time goes" + (", compiled" if all(compiled) else ""), fontsize=11.5)
    return fig


def batch_figure(step_t: dict, graph_t: dict, law_step, compute_step, launch: float, launch_estimated: bool,
                 b_crit: float, knee: float, predicted_agg: dict, where: str):
    """Section 6 in one figure. Left, the decode step against the batch: measured eagerly (and
    replayed as a CUDA graph where there is one), beside the three regimes' lines: bytes ÷ bandwidth,
    FLOPs ÷ FLOP/s, the launch cost per step. Right, the tokens/s of all sequences against the
    roofline's. Times in seconds, ``law_step``/``compute_step`` functions of the batch."""
    import matplotlib.pyplot as plt

    batches = sorted(step_t)
    every = sorted(set(step_t) | set(graph_t))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7.2, 3.7))
    ax1.loglog(batches, [step_t[b] * 1e3 for b in batches], "o-", label="eager (measured)")
    if graph_t:
        ax1.loglog(list(graph_t), [t * 1e3 for t in graph_t.values()], "s-", label="CUDA graph (measured)")
    ax1.loglog(every, [law_step(b) * 1e3 for b in every], "k--", label="bytes ÷ bandwidth")
    ax1.loglog(every, [compute_step(b) * 1e3 for b in every], "k:", label="FLOPs ÷ FLOP/s")
    ax1.axhline(launch * 1e3, color="C3", lw=0.8,
                label="launch cost per step" + (" (estimate)" if launch_estimated else ""))
    ax1.axvline(b_crit, color="gray", ls=":", label=f"B_crit {b_crit:.0f}")
    ax1.axvline(knee, color="C1", ls="-.", lw=0.8, label=f"knee {knee:.0f}")
    ax1.set(xlabel="batch size", ylabel="decode step (ms)", title="Step time")
    ax2.loglog(batches, [b / step_t[b] for b in batches], "o-")
    ax2.loglog(batches, [predicted_agg[b] for b in batches], "--", color="C2", label="roofline (ceilings)")
    ax2.axvline(b_crit, color="gray", ls=":")
    ax2.set(xlabel="batch size", ylabel="tokens/s (all sequences)", title="Throughput")
    ax2.legend(loc="upper left")
    fig.legend(*ax1.get_legend_handles_labels(), loc="outside lower center", ncol=3)
    fig.suptitle(f"A decode step's three regimes ({where})")
    return fig
