"""The three regimes of a decode step, drawn from a gpu-check result (``benchmarks/results/gpu-*.json``).

``scripts/gpu_check.py`` measures a decode step per batch size, eagerly and (on CUDA) replayed from a
CUDA graph, and records the roofline's inputs beside them (bytes read per step, FLOPs per token, the
machine's measured ceilings). This module turns one run into the chapter 3 picture:

launch-bound     every op pays a fixed cost to be launched from the host: the step costs the same
                 however few bytes it reads (eager step time minus the graphed step of the same kernels);
bandwidth-bound  the weights and caches are read once per step: bytes ÷ bandwidth;
compute-bound    2 FLOPs per weight per sequence: FLOPs ÷ FLOP/s, growing with the batch.

The Benchmarks page and gpu-check itself call ``regimes_figure``; a test draws it from a synthetic run.
"""
from __future__ import annotations


def regime_series(measurement: dict) -> dict:
    """The lines of the figure, in ms per step by batch size, from one dtype's ``measurements`` entry:
    ``eager`` and ``cuda_graph`` (measured), ``bandwidth`` and ``compute`` (the roofline's two bounds),
    ``launch`` (ms per step, or None without a graphed step to compare with)."""
    roof = measurement["roofline"]
    eager = {int(b): ms for b, ms in measurement.get("decode_eager_sweep", {}).get("step_ms", {}).items()}
    graph = {int(b): ms for b, ms in measurement.get("decode_batched_cuda_graph", {}).get("step_ms", {}).items()}
    batches = sorted(set(eager) | set(graph))
    bw, flops = roof["bandwidth_Bps"], roof["flops_per_s"]
    return {
        "eager": eager, "cuda_graph": graph, "batches": batches,
        "bandwidth": {b: 1e3 * (roof["weight_bytes"] + b * roof["kv_bytes_per_sequence"]) / bw for b in batches},
        "compute": {b: 1e3 * roof["flops_per_token"] * b / flops for b in batches},
        "launch": measurement.get("decode_batch1", {}).get("launch_overhead_ms_per_step"),
    }


def regimes_figure(report: dict, dtype: str | None = None, ax=None):
    """The three-regime plot of one gpu-check ``report`` (its first measured dtype by default);
    returns the figure."""
    import matplotlib.pyplot as plt

    measurements = report.get("measurements") or {}
    if not measurements:
        raise ValueError("this gpu-check report has no measurements to draw")
    dtype = dtype or next(iter(measurements))
    s = regime_series(measurements[dtype])
    if not s["batches"]:
        raise ValueError(f"the {dtype} measurements hold no decode sweep")
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4))
    if s["eager"]:
        ax.loglog(list(s["eager"]), list(s["eager"].values()), "o-", label="eager (measured)")
    if s["cuda_graph"]:
        ax.loglog(list(s["cuda_graph"]), list(s["cuda_graph"].values()), "s-", label="CUDA graph (measured)")
    ax.loglog(s["batches"], [s["bandwidth"][b] for b in s["batches"]], "k--", label="bandwidth: bytes ÷ bandwidth")
    ax.loglog(s["batches"], [s["compute"][b] for b in s["batches"]], "k:", label="compute: FLOPs ÷ FLOP/s")
    if s["launch"] is not None and s["launch"] > 0:
        ax.axhline(s["launch"], color="C3", lw=0.8, label="launch overhead per step (eager − graph, same kernels)")
    machine = report.get("machine", {})
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel="decode step (ms)",
           title=f"Three regimes of a decode step ({machine.get('gpu') or machine.get('device', '?')}, {dtype})")
    ax.legend()
    return fig
