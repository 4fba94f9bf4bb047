"""Chapter 3's helpers: the batch-size figure, and section 8's reading of the committed benchmark run
(benchmarks/results/latest.json) beside the live measurements: our engines against llama.cpp and
Hugging Face, and where a decode step's time goes per weight format.

The committed run may lack a section (llama.cpp not installed where it ran, an older file): each
reader then says "not measured in the committed run" instead of failing.
"""
from __future__ import annotations

import copy
import html
import json
import statistics
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


def bandwidth(results: dict) -> dict | None:
    """The committed run's memory bandwidth (GB/s): every sample it took (``bandwidth_samples_GB_s``),
    their median (the figure every page uses), the best and the lowest; None when the run kept none.
    A run from before the samples kept only its best: then that one value stands for all four."""
    samples = results.get("bandwidth_samples_GB_s") or (
        [results["bandwidth_GB_s"]] if isinstance(results.get("bandwidth_GB_s"), (int, float)) else [])
    samples = [float(s) for s in samples if isinstance(s, (int, float)) and s > 0]
    if not samples:
        return None
    return {"median": statistics.median(samples), "best": max(samples), "min": min(samples), "n": len(samples),
            "samples": samples}


def bandwidth_words(bw: dict | None) -> str:
    """How a page names the bandwidth it divides by: '48.1 GB/s, the median of 10 samples (39.9–82.5)'."""
    if bw is None:
        return f"a bandwidth {NOT_MEASURED}"
    if bw["n"] == 1:
        return f"{bw['median']:.1f} GB/s, its one sample"
    return f"{bw['median']:.1f} GB/s, the median of {bw['n']} samples ({bw['min']:.1f}–{bw['best']:.1f})"


# Figures a run computed by dividing by its bandwidth: (key, power of bandwidth). bytes ÷ bandwidth is a
# time (power -1); bandwidth ÷ bytes a rate (+1); a rate over that rate (% of the law) goes with -1.
_BY_BANDWIDTH = {"bound_tok_s": 1, "pct_of_bound": -1, "law_ms": -1, "law_kv_ms": -1}


def at_median_bandwidth(results: dict) -> dict:
    """A copy of the committed run with every figure that divides by its bandwidth (the law's tok/s, %
    of it, the law's ms) restated at the median sample, where the run stored them at its best one (a
    moment of a quiet memory bus, not what the run's engines met). The input is left as it was."""
    bw = bandwidth(results)
    out = copy.deepcopy(results)
    if bw is None:
        return out

    def walk(d, used, median):
        if isinstance(d, dict):
            if d.get("bandwidth_samples_GB_s") and bandwidth(d):  # a later run of one section, with its own
                median = bandwidth(d)["median"]
            if isinstance(d.get("bandwidth_GB_s"), (int, float)):
                used = d["bandwidth_GB_s"]
            for k, v in d.items():
                if k in _BY_BANDWIDTH and isinstance(v, (int, float)) and used:
                    d[k] = v * (median / used) ** _BY_BANDWIDTH[k]
                elif isinstance(v, (dict, list)):
                    walk(v, used, median)
            if isinstance(d.get("bandwidth_GB_s"), (int, float)):
                d["bandwidth_GB_s"] = median
        elif isinstance(d, list):
            for v in d:
                walk(v, used, median)

    walk(out, bw["best"], bw["median"])
    return out


def ridge_range(results: dict) -> tuple[float, float] | None:
    """The committed run's fp32 ridge point (FLOPs per byte), from its matmul ceiling over its median and
    its best bandwidth sample: (at the best, at the median); None without both ceilings."""
    bw, peak = bandwidth(results), results.get("matmul_fp32_GFLOP_s")
    if bw is None or not isinstance(peak, (int, float)):
        return None
    return peak / bw["best"], peak / bw["median"]


def run_words(results: dict) -> str:
    """The committed run in a phrase, for a figure's caption: machine, date, the bandwidth it divides by."""
    m = results.get("machine") if isinstance(results.get("machine"), dict) else {}
    cpu = m.get("cpu") or m.get("device") or "an unnamed machine"
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    return (f"the committed `make bench` run ({cpu}{cores}, {m.get('date', 'an unrecorded date')}), "
            f"memory bandwidth {bandwidth_words(bandwidth(results))}")


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
    bw = bandwidth(results)
    tail = f"; memory bandwidth {bw['median']:.1f} GB/s, its median sample" if bw else ""
    return '; '.join(parts) + (f"; {when}" if when else f", on {m.get('date', 'an unrecorded date')}") + tail


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
    head = (f"In the committed run of `make bench` ({where}), our fastest quantized engine, {best}{kind}, decoded "
            f"{e['median']:.1f} tok/s ({e['min']:.1f}–{e['max']:.1f}) at batch 1: another run than this page's, its "
            "steps compiled.")
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
                 "quantized": "The per-format comparison is", "speculative": "The speculative figures are",
                 "door_batches": "The batch figures are", "step_parts": "The step's parts are",
                 "spec_schedule": "The γ-schedule figures are", "block_rows": "The block kernels' timings by rows are"}


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


def step_parts_markdown(results: dict) -> str:
    """The committed run's ``step_parts`` (benchmarks/breakdown.py): one decode step of the door's fast
    engine after a short and a long context, part by part (projections, LM head, attention, the rest)
    with the bytes each part reads, and the sentences those numbers support; "not measured" when the
    file has no such section."""
    sp = results.get("step_parts")
    if not isinstance(sp, dict) or not sp.get("contexts"):
        why = sp.get("error", "")[:160] if isinstance(sp, dict) else ""
        return f"Where a step goes at a short and a long context: {NOT_MEASURED}{f' ({why})' if why else ''}."
    ctxs = sorted(sp["contexts"], key=int)
    c = {n: sp["contexts"][n] for n in ctxs}
    heads = ("lm_head",)
    ms = {n: {"projections": sum(v for k, v in r["kernels_ms"].items() if k not in heads),
              "head": sum(r["kernels_ms"][k] for k in heads), "attention": r["attention_ms"]["median"]}
          for n, r in c.items()}
    mb = {n: {"projections": sum(v for k, v in r["part_bytes"].items() if k not in (*heads, "attention", "outside")) / 1e6,
              "head": sum(r["part_bytes"][k] for k in heads) / 1e6, "attention": r["part_bytes"]["attention"] / 1e6}
          for n, r in c.items()}
    step = {n: _spread(r["step_ms"]) for n, r in c.items()}
    bw = sp["bandwidth_GB_s"]
    run = results.get("step_parts_run") if isinstance(results.get("step_parts_run"), dict) else results.get("machine", {})
    names = {"projections": "projections <small>(q k v, o, gate·up, down)</small>", "head": "LM head",
             "attention": "attention over the cache"}
    rows = [[label] + [f"{ms[n][part]:.1f} <small>({mb[n][part]:.1f} MB)</small>" for n in ctxs] for part, label in names.items()]
    # one span a cell: on a phone each row is a card whose cells lay out their children side by side
    rows += [["the rest: the step less those parts"] + [f"{c[n]['outside_ms']:.1f}" for n in ctxs],
             [f"the step, median <small>(range, {c[ctxs[0]]['rounds']} rounds)</small>"]
             + [f"{step[n].median:.1f} <small>({step[n].lo:.1f}–{step[n].hi:.1f})</small>" for n in ctxs],
             [f"the law: bytes ÷ {bw:.1f} GB/s"] + [f"{c[n]['law_kv_ms']:.1f}" for n in ctxs]]
    rows = [[f"<span>{cell}</span>" for cell in row] for row in rows]
    short, long = ctxs[0], ctxs[-1]
    weights = {n: mb[n]["projections"] + mb[n]["head"] for n in ctxs}
    weights_ms = {n: ms[n]["projections"] + ms[n]["head"] for n in ctxs}
    text = (f"After {int(short):,} tokens the weights are {weights[short] / (weights[short] + mb[short]['attention']):.0%} "
            f"of a step's bytes; after {int(long):,} the cache adds {mb[long]['attention']:.0f} MB and attention takes "
            f"{ms[long]['attention']:.1f} of {step[long].median:.1f} ms ({ms[long]['attention'] / step[long].median:.0%}). "
            f"The weights' kernels read at {weights[short] / weights_ms[short]:.1f} GB/s, attention at "
            f"{mb[long]['attention'] / ms[long]['attention']:.1f} GB/s, against the law's {bw:.1f}: the steps took "
            f"{step[short].median / c[short]['law_kv_ms']:.1f}× and {step[long].median / c[long]['law_kv_ms']:.1f}× "
            "the law's time.")
    # the rest is a difference of medians: say what it is only where the step's rounds can tell
    rest = {n: (c[n]["outside_ms"], step[n].hi - step[n].lo) for n in ctxs}
    within = [n for n, (x, width) in rest.items() if abs(x) <= width]
    if within:
        text += (f" The rest is within the step's range over its rounds after {' and '.join(f'{int(n):,}' for n in within)} "
                 "tokens.")
    for n, (x, width) in rest.items():
        if n not in within:
            text += (f" After {int(n):,} tokens {x:.1f} ms of the step runs outside the parts (norms, RoPE, residuals, "
                     "the cache's write, Python)." if x > 0 else
                     f" After {int(n):,} tokens the parts, each timed on its own, add up to {-x:.1f} ms more than the "
                     f"step, beyond its rounds' range ({width:.1f} ms).")
    facts = (f"<small>`{sp['engine']}`; the committed `make bench` section `step_parts`: "
             f"{run.get('cpu', 'an unnamed machine')}, {run.get('cores', '?')} cores, {run.get('date', 'an unrecorded date')}; "
             f"{bw:.1f} GB/s, the median of {len(sp.get('bandwidth_samples_GB_s', []))} samples.</small>")
    return "\n\n".join([table_html(["the door's decode step, ms"] + [f"after {int(n):,} tokens" for n in ctxs], rows),
                        f"{facts} {text}"])


def breakdown_figure(results: dict):
    """Horizontal stacked bars, one per format of the committed run's "breakdown": bytes ÷ bandwidth,
    projection kernels beyond it, outside the kernels (ms per token), and the measured step (median,
    range). Narrow (4.2 in) and large-lettered (11 pt): a phone shows it at ~85%, its text at 13 px. None
    when the run has no breakdown."""
    import matplotlib.pyplot as plt

    results = at_median_bandwidth(results)  # the law's bar at the median sample, as every page states it
    bw = bandwidth(results)
    b = results.get("breakdown")
    b = {k: v for k, v in b.items() if isinstance(v, dict) and "step_ms" in v} if isinstance(b, dict) else {}
    if not b:  # none measured (a format that failed to compile keeps only its error)
        return None
    if any(v.get("compiled") for v in b.values()):  # the compiled steps are the engines people run: those only
        b = {k: v for k, v in b.items() if v.get("compiled")}
    names = list(b)[::-1]  # the first format on top
    compiled = [bool(b[n].get("compiled")) for n in names]
    fig, ax = plt.subplots(figsize=(4.2, 1.6 + 0.24 * len(names)))
    left = [0.0] * len(names)
    parts = [(k, f"bytes ÷ {bw['median']:.0f} GB/s" if k == "law_ms" and bw else label) for k, label in PARTS]
    for (key, label), colour in zip(parts, ("0.35", "C0", "C1")):
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
    m = results.get("machine") if isinstance(results.get("machine"), dict) else {}
    ax.set_title("Where a step's time goes" + (", compiled" if all(compiled) else "")
                 + f"\ncommitted run, {m.get('cpu', '?')}, {str(m.get('date', '?'))[:10]}", fontsize=11.5)
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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7.2, 3.1))
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


# --- section 6 and the Summary: sentences that follow the run ---------------------------------------

FLAT = 1.25  # "nearly flat": a step within 25% of the batch-1 step's time


def bandwidth_samples(device, n: int = 7, budget_s: float = 0.25) -> list[float]:
    """``n`` short samples of the read bandwidth (bytes/s), each the best of a burst of sums over a buffer
    far larger than any cache: the chapter divides by their median, as the Benchmarks page does with
    the committed run's, and names the spread. One best sample is a quiet moment of the memory bus."""
    from inference_internals.analysis.roofline import measure_bandwidth

    return [measure_bandwidth(device, budget_s=budget_s)["read"] for _ in range(n)]


def gpu_batching(gpu, n_params: float, kv_bytes, dtype: str = "bf16", batches=(2, 4, 16)) -> dict:
    """A datasheet GPU's roofline for section 6's batches: its B_crit and each batch's step ÷ the batch-1
    step (``kv_bytes(B)``: the caches a batch reads). Ceilings, not a measurement."""
    from inference_internals.analysis import roofline as hw

    t1 = hw.decode_step_time(gpu, n_params, dtype, 1, kv_bytes(1))
    return {"name": gpu.name, "b_crit": hw.critical_batch(gpu, dtype), "dtype": dtype,
            "bandwidth": gpu.bandwidth, "flops": gpu.compute_flops(dtype),
            **{B: hw.decode_step_time(gpu, n_params, dtype, B, kv_bytes(B)) / t1 for B in batches}}


def _flat(grow: dict) -> bool | None:
    """True when batches 2 and 4 both stay clearly within FLAT of the batch-1 step, False when either is
    clearly above it, None when the rounds' spread cannot tell."""
    if grow[2].below(FLAT) and grow[4].below(FLAT):
        return True
    if grow[2].above(FLAT) or grow[4].above(FLAT):
        return False
    return None


def batching_markdown(grow: dict, roof: dict, gpu: dict, b_crit: float, knee: float, step_over_law: float,
                      where: str, rounds: int) -> str:
    """Section 6's reading of its own run. ``grow``: batch → Spread of (step at that batch ÷ the batch-1
    step) over ``rounds`` interleaved rounds; ``roof``: batch → the same ratio on this machine's roofline
    (its measured ceilings); ``gpu``: ``gpu_batching``'s datasheet figures; ``step_over_law``: the
    batch-1 step ÷ the time its bytes take at the measured bandwidth. The claim that batching is nearly
    free is made only where this run's rounds show it; a GPU's roofline numbers are given as such."""
    text = (f"{where}: in {rounds} interleaved rounds, batch 2 takes {grow[2]:.2fx}, batch 4 {grow[4]:.2fx} and "
            f"batch 16 {grow[16]:.2fx} the batch-1 step's time, for 2, 4 and 16× the tokens; this machine's roofline "
            f"expected {roof[2]:.2f}×, {roof[4]:.2f}× and {roof[16]:.2f}× (B_crit {b_crit:.1f}, measured knee "
            f"{knee:.1f}). ")
    flat = _flat(grow)
    if flat:
        text += (f"Up to batch 4 the step stays within {FLAT:.2f}× the batch-1 time: extra sequences ride along on "
                 "the same weight reads, nearly free, as the roofline says.")
    elif flat is False:
        worst = 2 if grow[2].above(FLAT) else 4
        if roof[worst] >= FLAT:
            text += (f"Batch {worst} costs more than {FLAT:.2f}× the batch-1 step, and the roofline expected that "
                     "too: this machine's B_crit is small, so few sequences fill its arithmetic.")
        else:
            text += f"So batching is not nearly free on this CPU (batch {worst}: more than {FLAT:.2f}×). "
            text += (f"The roofline's premise fails here: the batch-1 step takes {step_over_law:.1f}× the time its "
                     "bytes take to stream at the measured bandwidth, so it does not wait on the weight reads a second "
                     "sequence would share; its time goes to the kernels and the fixed cost per op (section 5)."
                     if step_over_law > 1.5 else
                     "The batch-1 step is close to its bandwidth law, yet extra rows cost: the kernels for a few rows "
                     "at a time use this CPU's cores less well than the law assumes.")
    else:
        text += (f"Whether the step stays within {FLAT:.2f}× the batch-1 time up to batch 4, {timing.COULD_NOT_TELL}: "
                 f"the rounds' spread straddles {FLAT:.2f}×.")
    text += (f" On a GPU the premise holds: an {gpu['name']}'s datasheet ({gpu['bandwidth'] / 1e12:.2f} TB/s, "
             f"{gpu['flops'] / 1e12:,.0f} {gpu['dtype']} TFLOP/s) puts B_crit at {gpu['b_crit']:.0f} and batches 2, 4 "
             f"and 16 at {gpu[2]:.2f}×, {gpu[4]:.2f}× and {gpu[16]:.2f}× the batch-1 step (the roofline's numbers, not a "
             "measurement): why servers batch decode requests (chapter 5).")
    return text


def summary_batching(grow: dict, roof: dict, gpu: dict, b_crit: float) -> str:
    """The Summary's line on batching, from the same figures as ``batching_markdown``."""
    head = (f"Batching decode is nearly free below B_crit = ridge × bytes per parameter ÷ 2 on a GPU's roofline "
            f"({gpu['name']}, {gpu['dtype']}: B_crit {gpu['b_crit']:.0f}, batch 4 at {gpu[4]:.2f}×). ")
    flat = _flat(grow)
    if flat:
        return head + f"This run agreed: batch 4 took {grow[4].median:.2f}× the batch-1 step (B_crit here {b_crit:.1f})."
    if flat is False:
        worst = 2 if grow[2].above(FLAT) else 4
        why = "as its roofline expected" if roof[worst] >= FLAT else (
            f"where its roofline said {roof[worst]:.2f}×: the step does not wait on the weight reads")
        return head + f"On this CPU it was not: batch {worst} took {grow[worst].median:.2f}× the batch-1 step, {why}."
    return head + f"On this CPU {timing.COULD_NOT_TELL} (batch 4: {grow[4]:.2fx})."


def summary_intensity(ridge_here: float, gpu_ridge: float, gpu_name: str, committed: tuple | None) -> str:
    """The Summary's line on decode's intensity against the ridges: a GPU's (datasheet) and this CPU's
    (measured live, and the committed run's range over its median and best bandwidth)."""
    def where(i, ridge):
        return "left of" if i < ridge / 2 else "right of" if i > 2 * ridge else "near"

    def decode_at(ridge):
        a, b = where(0.5, ridge), where(4, ridge)
        return f"both {a} it" if a == b else f"fp32 {a} it, 4-bit {b} it"

    text = (f"Decode feeds one: 2 FLOPs per weight read, 0.5 per byte in fp32, 4 at 4 bits, far left of a GPU's ridge "
            f"({gpu_name}: {gpu_ridge:.0f}, bf16). This machine's fp32 ridge, measured live, is "
            f"{ridge_here:.1f} FLOPs per byte: {decode_at(ridge_here)}")
    if committed:
        text += (f"; the committed run's CPU has {committed[0]:.1f}–{committed[1]:.1f} (best to median bandwidth): "
                 f"4-bit decode is {where(4, committed[1])} it")
    return text + (". Left of it decode is memory-bound: TPOT is set by the bytes read, the weights once per step "
                   "plus a KV cache that grows with batch × context.")


def moved_words(top1: float, n: int) -> str:
    """How many of ``n`` next-token predictions a format moved off fp32's top token, counted."""
    k = round((1 - top1) * n)
    return f"all {n} positions keep fp32's top token" if k == 0 else \
        f"{k} of {n} positions move{'s' * (k == 1)}"
