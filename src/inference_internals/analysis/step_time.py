"""Where a batch-1 decode step's time goes: the weights' kernels, role by role, and everything else.

Chapter 3's bandwidth law says a step takes at least bytes ÷ bandwidth. ``breakdown`` measures how
far a model (as ``optimize`` left it: any format, eager or compiled) is from that, and where the
rest goes:

- the step itself: one token, batch 1, on a cache already holding ``context`` tokens
  (``timing.decode_step_fn``), repeated in rounds
- the law's time: the bytes one step reads from weights (``optimize.weight_bytes_read``) over the
  measured streaming bandwidth (``roofline.measure_bandwidth``)
- per projection role (qkv, o, gate_up, down, lm_head): the kernel time of all of that role's
  weights, every layer's, fed one token each in turn, as a step reads them. Each role is timed in
  the same rounds as the step, right after it, so its weights were pushed out of the cache by the
  step's other weights (a role timed alone, again and again, would run from the cache)
- attention over the cache: every layer's one query against ``context`` stored keys and values (kept
  in ``kv_dtype``, as ``LLM(kv_cache_dtype=...)`` keeps them), as the step runs it (in a compiled
  step on an AVX-512 CPU, optimize.decode_attention's kernel; else
  SDPA over the cache's keys and values), timed in the same rounds; at 8K tokens it is most of a step
- outside the kernels: the step's median minus the kernels' and the attention's medians (norms, RoPE,
  residuals, the embedding row, the cache writes, the sampling's logits, Python and dispatch)
- the bytes each part reads (``part_bytes``): each role's weights as stored, the cache's keys and
  values for attention, the norms' weights for the rest; so each part's time can be set beside its
  own share of the bandwidth law

In a compiled step (``optimize(..., compile=True)``) the kernels run inside inductor's graph. A
quantized projection is an op the graph calls as it is (``QuantProjection``'s kernel, the same
code eager runs), so its eager timing is that kernel's time. An unquantized projection in the
graph is inductor's own C++ GEMM, which eager code cannot call: its eager ``F.linear`` stands in
for it, and ``kernels_are`` says which of the two a result holds.
"""
from __future__ import annotations

import statistics

import torch
from torch import nn

from ..optimize import CompiledDecodeStep, QuantProjection, weight_bytes_read
from ..timing import decode_step_fn, interleaved

ROLES = ("qkv", "o", "gate_up", "down", "lm_head")


def projections(model) -> dict[str, list[nn.Module]]:
    """Each role's projection modules, every layer's, in the order a step calls them."""
    attn = [b.self_attn for b in model.layers]
    mlp = [b.mlp for b in model.layers]

    def fused(m, name, parts):
        return getattr(m, name) if getattr(m, name, None) is not None else _Concat([getattr(m, p) for p in parts])

    return {"qkv": [fused(a, "qkv_proj", ("q_proj", "k_proj", "v_proj")) for a in attn],
            "o": [a.o_proj for a in attn],
            "gate_up": [fused(m, "gate_up_proj", ("gate_proj", "up_proj")) for m in mlp],
            "down": [m.down_proj for m in mlp],
            "lm_head": [model.lm_head]}


class _Concat(nn.Module):
    """A plain model's q, k, v (or gate, up) projections, called as its attention calls them."""

    def __init__(self, parts):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x):
        return torch.cat([p(x) for p in self.parts], dim=-1)


def _in_features(m: nn.Module) -> int:
    if isinstance(m, _Concat):
        return _in_features(m.parts[0])
    if isinstance(m, QuantProjection):
        return m.in_features
    return m.weight.shape[1]


def kernels_fn(modules: list[nn.Module], dtype: torch.dtype, device):
    """A call that feeds one token (batch 1) through each of ``modules`` in turn."""
    x = torch.randn(1, 1, _in_features(modules[0]), dtype=dtype, device=device)

    @torch.inference_mode()
    def run():
        for m in modules:
            m(x)
    return run


def attention_fn(model, context: int, kv_dtype: torch.dtype | None = None):
    """A call that runs every layer's attention of one new token over ``context`` stored tokens (random
    keys and values in ``kv_dtype``, default the model's, each layer's its own, as a cache holds them):
    the kernel a compiled step calls where it runs here, else SDPA over the stored and new keys in the
    model's dtype, as an eager step gathers them."""
    from ..model import attention
    from ..optimize import decode_attention

    cfg, dev, dtype = model.config, model.device, model.dtype
    L, Hkv, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    store = torch.randn(2, L, 1, Hkv, context, D, device=dev).to(kv_dtype or dtype)  # [K/V, layer, 1 block, Hkv, S, D]
    q = torch.randn(1, cfg.num_attention_heads, 1, D, device=dev)
    k, v = torch.randn(2, 1, Hkv, 1, D, device=dev)
    span = torch.empty(context, 0, device=dev)
    kernel = isinstance(model.__dict__.get("forward"), CompiledDecodeStep) and _kernel_runs(model, kv_dtype)

    @torch.inference_mode()
    def run():
        for layer in range(L):
            if kernel:
                decode_attention.decode(q, k, v, store[0, layer], store[1, layer], None, span)
            else:
                keys, values = (torch.cat([x[layer].to(dtype), new.to(dtype)], 2) for x, new in ((store[0], k), (store[1], v)))
                attention(q.to(dtype), keys, values)  # one query: it sees every key
    return run


def kv_bytes_read(model, context: int, kv_dtype: torch.dtype | None = None) -> int:
    """Bytes of keys and values one step reads back from a cache of ``context`` tokens kept in
    ``kv_dtype`` (default the model's dtype)."""
    cfg = model.config
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context * (kv_dtype or model.dtype).itemsize


def part_bytes(model, context: int, kv_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Bytes one batch-1 step reads per part: each role's weights (as stored, ``weight_bytes_read`` of
    its modules), ``attention``'s cached keys and values, and ``outside``: the rest of
    ``weight_bytes_read`` (the norms' weights). The weights' parts add up to ``weight_bytes_read``."""
    roles = {role: weight_bytes_read(nn.ModuleList(mods)) for role, mods in projections(model).items()}
    return roles | {"attention": float(kv_bytes_read(model, context, kv_dtype)),
                    "outside": weight_bytes_read(model) - sum(roles.values())}


def _spread_ms(seconds: list[float]) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "n": len(ms)}


def breakdown(model, context: int = 256, rounds: int = 7, bandwidth: float | None = None,
              warmup: int = 2, kv_dtype: torch.dtype | None = None) -> dict:
    """Where one batch-1 decode step of ``model`` goes, measured in ``rounds`` interleaved rounds
    (the step, then each role's kernels; ``warmup`` untimed rounds first), its cache kept in
    ``kv_dtype`` (default the model's). ``bandwidth`` (bytes/s) defaults to
    ``roofline.measure_bandwidth``'s read figure, measured here.

    ``model`` may be a dict of models (``{name: model}``, one device): then every model's step and
    kernels share the same rounds, so a slow spell of the machine lands on all of them alike, not
    on whichever model was being timed then, and the result is ``{name: breakdown}``.

    Returns milliseconds: ``step_ms`` and ``kernels_spread_ms`` per role ({"median", "min",
    "max", "n"}), ``kernels_ms`` (each role's median), ``outside_ms`` (step median minus their sum),
    ``law_ms`` (weight bytes ÷ bandwidth; ``law_kv_ms`` adds the cache's keys and values),
    ``weight_bytes`` (``weight_bytes_read``), ``part_bytes`` (``part_bytes``), ``weight_MB``, ``kv_MB``,
    ``kv_dtype``, ``bandwidth_GB_s``, ``compiled``, ``kernels_are`` and ``context``.
    """
    from .roofline import measure_bandwidth

    models = model if isinstance(model, dict) else {None: model}
    for m in models.values():
        if not hasattr(m, "layers") or not hasattr(m, "config"):
            raise TypeError(f"breakdown takes an inference_internals.model.Llama, got {type(m).__name__}")
    if context < 2 or rounds < 1 or warmup < 0 or not models:
        # a compiled step takes a cache of 2 tokens or more (CompiledDecodeStep.takes)
        raise ValueError(f"need a model, context >= 2, rounds >= 1 and warmup >= 0, got {len(models)} models, "
                         f"{context}, {rounds}, {warmup}")
    devices = {m.device for m in models.values()}
    if len(devices) > 1:
        raise ValueError(f"the models are on {sorted(map(str, devices))}: time one device at a time")
    device = devices.pop()
    runs = {}
    for name, m in models.items():
        runs[name, "step"] = decode_step_fn(m, context, kv_dtype=kv_dtype)
        runs[name, "attention"] = attention_fn(m, context, kv_dtype)
        runs |= {(name, role): kernels_fn(mods, m.dtype, device) for role, mods in projections(m).items()}
    times = interleaved(runs, rounds, device, warmup)
    bw = bandwidth if bandwidth is not None else measure_bandwidth(device)["read"]
    out = {name: _parts(m, {part: t for (n, part), t in times.items() if n == name}, context, rounds, bw, kv_dtype)
           for name, m in models.items()}
    return out if isinstance(model, dict) else out[None]


def _parts(model, times: dict, context: int, rounds: int, bw: float, kv_dtype: torch.dtype | None) -> dict:
    """One model's breakdown from its timings (``{"step": [...], role: [...]}``, seconds)."""
    compiled = isinstance(model.__dict__.get("forward"), CompiledDecodeStep)
    roles = projections(model)
    weights, kv = weight_bytes_read(model), kv_bytes_read(model, context, kv_dtype)
    step = _spread_ms(times["step"])
    kernels = {role: _spread_ms(times[role]) for role in roles}
    attn = _spread_ms(times["attention"])
    quantized = all(isinstance(m, QuantProjection) for mods in roles.values() for m in mods)
    if not compiled:
        are = "the step's own kernels, timed eagerly"
    elif quantized:
        are = "the step's own kernels: the compiled graph calls each quantized kernel as eager code does"
    else:
        are = "eager F.linear standing in for inductor's C++ GEMM in the compiled graph"
    return {"step_ms": step,
            "weight_bytes": weights, "part_bytes": part_bytes(model, context, kv_dtype),
            "weight_MB": weights / 1e6, "kv_MB": kv / 1e6, "kv_dtype": str(kv_dtype or model.dtype).removeprefix("torch."),
            "bandwidth_GB_s": bw / 1e9,
            "law_ms": 1e3 * weights / bw, "law_kv_ms": 1e3 * (weights + kv) / bw,
            "kernels_ms": {role: k["median"] for role, k in kernels.items()},
            "kernels_spread_ms": kernels,
            "attention_ms": attn, "attention_is": "the decode-attention kernel (optimize.decode_attention)"
            if compiled and _kernel_runs(model, kv_dtype) else "SDPA over the stored and new keys",
            "outside_ms": step["median"] - sum(k["median"] for k in kernels.values()) - attn["median"],
            "compiled": compiled, "kernels_are": are, "context": context, "rounds": rounds}


def _kernel_runs(model, kv_dtype: torch.dtype | None = None) -> bool:
    """Whether a compiled step of ``model`` attends through optimize.decode_attention's kernel here."""
    from ..optimize import decode_attention

    cfg = model.config
    store = torch.empty(1, cfg.num_key_value_heads, 1, cfg.head_dim, dtype=kv_dtype or model.dtype, device=model.device)
    q = torch.empty(1, cfg.num_attention_heads, 1, cfg.head_dim, device=model.device)
    return decode_attention.runs_here(store) and decode_attention.fits(q, store)


def table(results: dict) -> str:
    """``{name: breakdown(...)}`` as a Markdown table."""
    head = ("| model | step ms (rounds) | law ms | kernels ms: " + " + ".join(ROLES) + " | attention ms | outside ms | MB |\n"
            "|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, r in results.items():
        s, k = r["step_ms"], r["kernels_ms"]
        rows.append(f"| {name} | {s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f}) | {r['law_ms']:.1f} | "
                    + " + ".join(f"{k[role]:.1f}" for role in ROLES)
                    + f" = {sum(k.values()):.1f} | {r['attention_ms']['median']:.1f} | {r['outside_ms']:.1f} | {r['weight_MB']:.0f} |")
    return "\n".join([head, *rows])
