"""Micro-benchmark of the candidate batch-1 kernels: which one streams weights fastest here?

Every decode step of SmolLM2-135M is ~30 x 7 matrix-vector products; the ceiling is the
memory read bandwidth. For each candidate this prints GB/s of weight read (weight bytes ÷ best
time per call) for the model's real shapes.

    .venv/bin/python benchmarks/kernels.py [--json out.json]
    .venv/bin/python benchmarks/kernels.py --rows   # the same weights times 1..16 rows (fp32)

A speculative verify pass or a small decode batch multiplies each weight by a few rows, not one;
``--rows`` shows which layout streams those fastest (it sets ``Projection.SPLIT_W_ROWS``).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from inference_internals.optimize import Projection
from inference_internals.timing import time_call

D, I, V = 576, 1536, 49152
SHAPES = {"q (576->576)": (576, D), "qkv fused (576->960)": (960, D), "gate/up fused (576->3072)": (2 * I, D),
          "down (1536->576)": (D, I), "lm head (576->49152)": (V, D)}


def best(fn, reps=30, budget=0.4):
    return min(time_call(fn, "cpu", budget, min_reps=5, max_reps=reps, warmup=3))


def run(layers: int = 30) -> dict:
    torch.manual_seed(0)
    out = {}
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            dn = str(dtype).removeprefix("torch.")
            for name, (o, i) in SHAPES.items():
                # many copies so the weights come from memory, not cache (as in a real step)
                n = max(2, int(64e6 // (o * i * dtype.itemsize)))
                ws = [torch.randn(o, i).to(dtype) for _ in range(n)]
                wts = [w.t().contiguous() for w in ws]
                x = torch.randn(1, i).to(dtype)
                xv = x[0]
                cands = {
                    "F.linear": lambda: [F.linear(x, w) for w in ws],
                    "torch.mv": lambda: [torch.mv(w, xv) for w in ws],
                    "x @ W^T (pre-transposed)": lambda: [x @ wt for wt in wts],
                }
                # the optimized model's split kernels: one slab of rows per thread, all multiplied by one bmm
                slabs = torch.get_num_threads()
                if slabs > 1 and o % slabs == 0:
                    projs = {k: [Projection(w, k, slabs) for w in ws] for k in ("split_n", "split_t", "split_w")}
                    cands[f"bmm over {slabs} row slabs"] = lambda: [p(x) for p in projs["split_n"]]
                    cands[f"bmm over {slabs} slabs (pre-transposed)"] = lambda: [p(x) for p in projs["split_t"]]
                    cands[f"bmm over {slabs} slabs, slab · x^T"] = lambda: [p(x) for p in projs["split_w"]]
                for cname, fn in cands.items():
                    try:
                        t = best(fn) / n
                    except RuntimeError as e:
                        print(f"{dn:9s} {name:28s} {cname:36s} failed: {e}", file=sys.stderr)
                        continue
                    gbs = o * i * dtype.itemsize / t / 1e9
                    out[f"{dn} | {name} | {cname}"] = {"us": t * 1e6, "GB/s": gbs}
                    print(f"{dn:9s} {name:28s} {cname:36s} {t*1e6:8.1f} us  {gbs:6.1f} GB/s", flush=True)
    # fused vs unfused projections: three small calls against one concatenated
    for dtype in (torch.float32, torch.bfloat16):
        dn = str(dtype).removeprefix("torch.")
        x = torch.randn(1, D).to(dtype)
        wq, wk, wv = (torch.randn(o, D).to(dtype) for o in (576, 192, 192))
        wqkv = torch.cat([wq, wk, wv])
        wg, wu = torch.randn(I, D).to(dtype), torch.randn(I, D).to(dtype)
        wgu = torch.cat([wg, wu])
        with torch.inference_mode():
            pairs = {"qkv 3 calls": lambda: (F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)),
                     "qkv 1 fused": lambda: F.linear(x, wqkv),
                     "gate/up 2 calls": lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                     "gate/up 1 fused": lambda: (lambda gu: F.silu(gu[..., :I]) * gu[..., I:])(F.linear(x, wgu))}
            for k, fn in pairs.items():
                t = best(fn, reps=200)
                out[f"{dn} | fusion | {k}"] = {"us": t * 1e6}
                print(f"{dn:9s} fusion {k:22s} {t*1e6:8.1f} us (weights in cache: overhead dominates)", flush=True)
    # per-op overhead
    z, o_ = torch.zeros(1), torch.zeros(1)
    t = best(lambda: [torch.add(z, 1, out=o_) for _ in range(1000)]) / 1000
    out["op overhead"] = {"us": t * 1e6}
    print(f"per-op overhead (tiny add): {t*1e6:.2f} us")
    return out


def rows_sweep(layers: int = 30) -> dict:
    """µs per call of the two slab layouts of optimize.Projection and F.linear, for 1..16 rows, over ``layers`` copies."""
    torch.manual_seed(0)
    slabs, out = torch.get_num_threads(), {}
    with torch.inference_mode():
        for name, (o, i) in SHAPES.items():
            if name.startswith("lm head") or o % slabs:
                continue
            ws = [torch.randn(o, i) for _ in range(layers)]
            slab_first = [Projection(w, "split_w", slabs) for w in ws]
            for p in slab_first:  # slab · x^T at every row count, not only up to the switch
                p.SPLIT_W_ROWS = Projection.PREFILL_ROWS
            x_first = [Projection(w, "split_n", slabs) for w in ws]  # x · slab^T
            for rows in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16):
                x = torch.randn(1, rows, i)
                cands = {"slab · x^T": lambda: [p(x) for p in slab_first],
                         "x · slab^T": lambda: [p(x) for p in x_first],
                         "F.linear": lambda: [F.linear(x, w) for w in ws]}
                line = {k: best(fn) / layers * 1e6 for k, fn in cands.items()}
                out[f"{name} | {rows} rows"] = line
                print(f"{name:28s} {rows:2d} rows " + "  ".join(f"{k} {v:7.1f} us" for k, v in line.items()), flush=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--threads", type=int)
    p.add_argument("--rows", action="store_true", help="sweep 1..16 rows instead")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    res = rows_sweep() if a.rows else run()
    res["threads"] = torch.get_num_threads()
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
