"""Choosing a kernel by timing: every candidate runs one token through all of a role's weights
(every layer's copy, as a decode step reads them, so from memory and not from a cache one small
matrix would fit in), interleaved, and the fastest by a clear margin wins."""
from __future__ import annotations

import statistics

import torch

from ..quant import QuantizedWeight
from ..timing import timed
from .projection import KERNELS, Projection, QuantProjection


def fastest_quant(qws: list[QuantizedWeight], kernels: tuple[str, ...], reps: int = 5) -> str:
    """The kernel that runs one token through all of ``qws`` fastest here (as ``_fastest``); the
    last, dequant, runs anywhere and is kept unless another beats it."""
    device = qws[0].codes.device
    x = torch.randn(1, 1, qws[0].shape[1], device=device)
    runs = {}
    for kernel in kernels:
        if kernel == "int8_dyn" and device.type != "cpu":
            continue
        try:
            projs = [QuantProjection(q, kernel) for q in qws]
        except (RuntimeError, NotImplementedError, ValueError):  # one this device, build or group cannot run
            continue
        runs[kernel] = lambda projs=projs: [p(x) for p in projs]
    return pick(runs, kernels[-1], device, reps)


def fastest(weights: list[torch.Tensor], slabs: int, reps: int = 5) -> str:
    """The kernel that runs one token through all of ``weights`` fastest here.

    Timed over every layer's copy, as a decode step reads them, so the weights come from memory
    and not from a cache that one small matrix would fit in. Plain ``linear`` is kept unless
    another kernel beats it clearly (``_pick``).
    """
    device = weights[0].device
    x = torch.randn(1, 1, weights[0].shape[1], dtype=weights[0].dtype, device=device)
    runs = {}
    for kernel in KERNELS:
        if kernel.startswith("split") and (slabs < 2 or weights[0].shape[0] % slabs):
            continue
        projs = [Projection(w, kernel, slabs) for w in weights]
        runs[kernel] = lambda projs=projs: [p(x) for p in projs]
    return pick(runs, "linear", device, reps)


def pick(runs: dict, default: str, device, reps: int, margin: float = 0.05) -> str:
    """The fastest of ``runs`` (name -> a call), by the median of ``reps`` interleaved rounds, so
    a change in the machine's load hits every candidate alike. ``default`` is kept unless another
    is more than ``margin`` faster: three quick timings of 5 kernels used to pick a different
    winner from run to run, and a near-tie on the micro-benchmark could lose in the real step.
    A candidate this device or build lacks, or already 3x slower than the best at warm-up, is out."""
    warm = {}
    with torch.inference_mode():
        for name, run in runs.items():
            try:
                run()  # first calls allocate
                warm[name] = timed(run, device)[1]
            except (RuntimeError, NotImplementedError):
                continue
        live = [n for n, t in warm.items() if t <= 3 * min(warm.values())]
        times = {n: [] for n in live}
        for _ in range(reps):
            for n in live:
                times[n].append(timed(runs[n], device)[1])
    med = {n: statistics.median(ts) for n, ts in times.items()}
    best = min(med, key=med.get)
    if default in med and med[best] > (1 - margin) * med[default]:
        return default
    return best
