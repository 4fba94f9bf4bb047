"""A dense SwiGLU MLP is already a sum of experts; routing keeps only some of them.

down(silu(gate(x)) * up(x)) is a sum over the intermediate dimension, so cutting that
dimension into E equal slices gives E small SwiGLU MLPs ("experts") whose outputs add
up to the dense output exactly (up to float rounding). A mixture of experts runs only the
k experts a router picks for each token, so it spends about k/E of the MLP's FLOPs.

Routers here (the model was not trained with any of them, so all lose some quality):
    "oracle"  keeps the k experts with the largest output norm. It must run every expert
              to know, so it saves nothing: an upper bound on what routing can keep.
    "gate"    keeps the k experts whose SiLU(gate pre-activations) have the largest norm.
              The gate projection (1/3 of the MLP) runs for every expert; only the chosen
              experts then pay for up and down. SiLU first, because a large negative
              pre-activation switches its neuron off rather than on.
    "random"  k experts at random: free, and the baseline a router has to beat.
A trained MoE uses a learned linear router (E dot products per token, nearly free).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..model import MLP, LlamaConfig

ROUTERS = ("oracle", "gate", "random")


def split_into_experts(mlp: MLP, n_experts: int) -> nn.ModuleList:
    """E SwiGLU experts of width I/E whose outputs sum to ``mlp``'s output.

    Expert e owns intermediate neurons [e*I/E, (e+1)*I/E): rows of gate/up, columns of down.
    Its weights are views of the dense ones (no copy).
    """
    d, inter = mlp.gate_proj.in_features, mlp.gate_proj.out_features
    if not isinstance(n_experts, int) or n_experts < 1:
        raise ValueError(f"n_experts must be a positive integer, got {n_experts!r}")
    if inter % n_experts:
        raise ValueError(f"{n_experts} experts do not divide the intermediate size {inter}")
    width = inter // n_experts
    cfg = LlamaConfig(hidden_size=d, intermediate_size=width)
    experts = nn.ModuleList()
    for e in range(n_experts):
        rows = slice(e * width, (e + 1) * width)
        with torch.device("meta"):
            expert = MLP(cfg)
        expert.gate_proj.weight = nn.Parameter(mlp.gate_proj.weight.detach()[rows], requires_grad=False)
        expert.up_proj.weight = nn.Parameter(mlp.up_proj.weight.detach()[rows], requires_grad=False)
        expert.down_proj.weight = nn.Parameter(mlp.down_proj.weight.detach()[:, rows], requires_grad=False)
        experts.append(expert)
    return experts


def predicted_flop_fraction(n_experts: int, k: int, router: str) -> float:
    """The MLP's matmul FLOPs per token with routing, as a fraction of the dense MLP's."""
    _check_k(n_experts, k)
    if router == "oracle":
        return 1.0                                   # every expert runs, then k are kept
    if router == "gate":
        return 1 / 3 + 2 / 3 * k / n_experts         # all gates, then up + down for k experts
    if router == "random":
        return k / n_experts
    raise ValueError(f"unknown router {router!r}: expected one of {ROUTERS}")


def _check_k(n_experts: int, k: int) -> None:
    if not isinstance(k, int) or not 1 <= k <= n_experts:
        raise ValueError(f"k must be an integer in [1, {n_experts}] (the number of experts), got {k!r}")


class MoEMLP(nn.Module):
    """Each token runs through its top-k experts; their outputs are summed unweighted,
    because the experts are slices of one MLP, not alternatives to be averaged."""

    def __init__(self, mlp: MLP, n_experts: int, k: int, router: str = "gate", seed: int = 0):
        super().__init__()
        if router not in ROUTERS:
            raise ValueError(f"unknown router {router!r}: expected one of {ROUTERS}")
        _check_k(n_experts, k)
        self.experts = split_into_experts(mlp, n_experts)
        self.k, self.router = k, router
        self.generator = torch.Generator(mlp.gate_proj.weight.device).manual_seed(seed)
        self.reset_stats()

    def reset_stats(self) -> None:
        """``flops``: matmul FLOPs spent; ``dense_flops``: what the dense MLP would have spent;
        ``tokens_per_expert``: how often each expert was chosen (its load)."""
        self.flops = self.dense_flops = 0
        self.tokens_per_expert = torch.zeros(len(self.experts), dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        n, d, E = x.shape[0], x.shape[1], len(self.experts)
        width = self.experts[0].gate_proj.out_features
        self.dense_flops += 2 * 3 * n * d * width * E
        if self.router == "oracle":
            outs = torch.stack([ex(x) for ex in self.experts], dim=1)       # [n, E, d]
            self.flops += 2 * 3 * n * d * width * E
            top = outs.norm(dim=-1).topk(self.k, dim=-1).indices            # [n, k]
            out = outs.gather(1, top[..., None].expand(-1, -1, d)).sum(1)
            self.tokens_per_expert += torch.bincount(top.flatten().cpu(), minlength=E)
            return out.view(shape)
        if self.router == "gate":
            gates = [ex.gate_proj(x) for ex in self.experts]                # the router's cost
            self.flops += 2 * n * d * width * E
            scores = torch.stack([F.silu(g).norm(dim=-1) for g in gates], dim=-1)
        else:
            gates = None
            scores = torch.rand(n, E, generator=self.generator, device=self.generator.device)
        top = scores.float().topk(self.k, dim=-1).indices                   # [n, k]
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            rows = (top == e).any(dim=-1).nonzero().squeeze(-1)             # tokens routed to e
            if rows.numel() == 0:
                continue
            xe = x[rows]
            g = gates[e][rows] if gates is not None else ex.gate_proj(xe)
            out.index_add_(0, rows, ex.down_proj(F.silu(g) * ex.up_proj(xe)))
            self.flops += 2 * (2 if gates is not None else 3) * rows.numel() * d * width
            self.tokens_per_expert[e] += rows.numel()
        return out.view(shape)


def moefy(model, n_experts: int, k: int, router: str = "gate", seed: int = 0) -> list[MLP]:
    """Replace every block's MLP by a routed ``MoEMLP`` in place; return the originals
    (for ``restore``). Arguments are checked before anything changes."""
    if router not in ROUTERS:
        raise ValueError(f"unknown router {router!r}: expected one of {ROUTERS}")
    _check_k(n_experts, k)
    if any(isinstance(b.mlp, MoEMLP) for b in model.layers):
        raise ValueError("the model's MLPs are already routed: restore them first")
    moes = [MoEMLP(b.mlp, n_experts, k, router, seed + i) for i, b in enumerate(model.layers)]
    originals = []
    for block, moe in zip(model.layers, moes):
        originals.append(block.mlp)
        block.mlp = moe
    return originals


def restore(model, originals: list[MLP]) -> None:
    """Put back the dense MLPs that ``moefy`` returned."""
    if len(originals) != len(model.layers):
        raise ValueError(f"got {len(originals)} MLPs for {len(model.layers)} layers")
    for block, mlp in zip(model.layers, originals):
        block.mlp = mlp


@contextmanager
def routed(model, n_experts: int, k: int, router: str = "gate", seed: int = 0):
    """``with routed(model, 8, 2) as moes:`` runs the model with MoE MLPs, then restores the
    dense ones (even on error). Yields the list of ``MoEMLP`` (for their FLOP counters)."""
    originals = moefy(model, n_experts, k, router, seed)
    try:
        yield [b.mlp for b in model.layers]
    finally:
        restore(model, originals)


def flop_fraction(moes: list[MoEMLP]) -> float:
    """FLOPs the routed MLPs spent, as a fraction of what the dense MLPs would have."""
    dense = sum(m.dense_flops for m in moes)
    if dense == 0:
        raise ValueError("no tokens have gone through these MLPs yet")
    return sum(m.flops for m in moes) / dense
