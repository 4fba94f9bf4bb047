"""Fused projections: Q|K|V and gate|up each one matrix, so one call reads them all.

``optimize`` turns a model's ``Attention`` and ``MLP`` modules into these subclasses in place: the
same module objects, the same weights and names (``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/
``up_proj`` become views of the fused rows, so the checkpoint's names load and ``state_dict()`` is the
same as before), only the projections now one call each.
"""
from __future__ import annotations

import torch
from torch import nn

from ..model import MLP, Attention


class FusedAttention(Attention):
    """``Attention`` whose Q, K and V come from one projection, ``qkv_proj`` (set by ``optimize``)."""
    qkv_proj: nn.Module

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv_proj(x)


class FusedMLP(MLP):
    """``MLP`` whose gate and up come from one projection, ``gate_up_proj`` (set by ``optimize``)."""
    gate_up_proj: nn.Module

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return gate, up


def fuse(parts: list[nn.Linear]) -> torch.Tensor:
    """The parts' weights as one matrix; each part's weight becomes a view of its rows."""
    fused = torch.cat([p.weight.detach() for p in parts])
    start = 0
    for p in parts:
        n = p.weight.shape[0]
        p.weight = nn.Parameter(fused[start:start + n], requires_grad=False)
        start += n
    return fused
