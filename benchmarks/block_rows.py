"""What each extra row of a verify pass costs in the block kernels: the products of one decode step's
weights (SmolLM2's 30 layers as the fast path packs them, Q4_1, and its Q8_0 LM head: 96 MB, so they
stream from memory as in a step, not from the cache) with 1 to 8 activation rows, interleaved
round by round.

    make bench BENCH_ARGS="--only block_rows --merge"

Every row meets each weight tile as it passes through the cache (blockdot.cpp), so if memory set the time,
8 rows would cost about one; each row still pays its own dot products, two int8 codes per activation.
"""
from __future__ import annotations

import time

import torch

from .common import stats

ROWS = (1, 2, 3, 4, 5, 8)


def bench_block_rows(args, device) -> dict:
    from inference_internals.model import LlamaConfig
    from inference_internals.optimize import blockdot
    from inference_internals.weights import model_dir

    if device.type != "cpu" or (why := blockdot.available()) is not None:
        return {"unmeasured": "the block kernels run on a CPU with AVX-512 VNNI" if device.type != "cpu" else why}
    c = LlamaConfig.from_json(model_dir(None) / "config.json")
    hidden = c.hidden_size
    # [out, in] of one layer's products as the fast path runs them (q, k and v fused; gate and up fused)
    layer_shapes = (((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, hidden),
                    (hidden, c.num_attention_heads * c.head_dim), (2 * c.intermediate_size, hidden),
                    (hidden, c.intermediate_size))
    g = torch.Generator().manual_seed(0)

    def q4_1(out, inp):
        return blockdot.pack_q4_1(torch.randint(0, 16, (out, inp), generator=g, dtype=torch.uint8),
                                  torch.rand(out, inp // 32, generator=g) / 100, -torch.rand(out, inp // 32, generator=g) / 10)

    layers = [[q4_1(o, i) for o, i in layer_shapes] for _ in range(c.num_hidden_layers)]
    head = blockdot.pack_q8_0(torch.randint(-127, 128, (c.vocab_size, hidden), generator=g, dtype=torch.int8),
                              torch.rand(c.vocab_size, hidden // 32, generator=g).to(torch.bfloat16).float() / 100)
    xs = {r: {i: torch.randn(r, i, generator=g) for i in {i for _, i in layer_shapes}} for r in ROWS}

    def step(r):  # every product of a step, in its order
        x = xs[r]
        for layer in layers:
            for (_, i), w in zip(layer_shapes, layer):
                blockdot.q4_1_mm(x[i], w["qs"], w["sc"], w["n"])
        blockdot.q8_0_mm(x[hidden], head["qs"], head["sc"], head["n"])

    rounds = 1 if args.quick else 5
    seconds = {r: [] for r in ROWS}
    for r in ROWS:
        step(r)  # warm-up
    for k in range(rounds):
        for r in ROWS[k % len(ROWS):] + ROWS[:k % len(ROWS)]:  # each row count first once
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                step(r)
                best = min(best, time.perf_counter() - t0)
            seconds[r].append(best)
    return {"rows": list(ROWS), "rounds": rounds, "threads": torch.get_num_threads(),
            "weights_MB": sum(t.nbytes for w in [head, *(w for layer in layers for w in layer)] for t in w.values()
                              if isinstance(t, torch.Tensor)) / 1e6,
            "ms": {str(r): stats([s * 1e3 for s in seconds[r]]) for r in ROWS},
            "over_one_row": {str(r): stats([s / one for s, one in zip(seconds[r], seconds[1])]) | {
                "rounds": [s / one for s, one in zip(seconds[r], seconds[1])]} for r in ROWS}}
