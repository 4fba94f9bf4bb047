"""A cache for CUDA graphs: fixed-shape K/V buffers, written at positions that live on the device.

A graph replays the same kernels on the same memory, so nothing a step does may depend on a value
read back to the host: where it writes and which keys each query sees come from ``positions``
alone, and attention runs over every slot with the unfilled ones masked out (cuda_graph.py).
"""
from __future__ import annotations

import torch

from .base import Gathering


class StaticKVCache(Gathering):
    """K/V buffers [layers, batch, kv_heads, max_len, head_dim] written at device-side positions.

    ``begin`` reads nothing back to the host, so the same calls can be captured in a graph and
    replayed: where a step writes, and which keys it sees, comes from ``positions`` alone.
    Every row shares the same positions (one batch of equal-length prompts).
    """

    def __init__(self, cfg, batch_size: int, max_len: int, device, dtype: torch.dtype):
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size and max_len must be >= 1, got {batch_size}, {max_len}")
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds the context window {cfg.max_position_embeddings}")
        self.cfg, self.batch_size, self.max_len = cfg, batch_size, max_len
        shape = (cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.slots = torch.arange(max_len, device=device)
        self._where = None

    def positions(self, B: int, T: int) -> torch.Tensor:
        raise ValueError("a static cache keeps its length on the device: pass the positions explicitly")

    def begin(self, positions: torch.Tensor) -> None:
        if positions.shape[0] != self.batch_size:
            raise ValueError(f"batch of {positions.shape[0]} rows, but the cache was made for {self.batch_size}")
        self._where = positions[0]  # [T]: the slots this step writes (the same for every row)
        # [B, 1, T, max_len]: query t sees slot s iff s <= its position; empty slots lie after it
        self.mask = self.slots[None, None, None, :] <= positions[:, None, :, None]
        self._windowed, self._pos = None, positions

    def positions_seen(self):
        """Queries at their (device-side) positions, slot s holding position s: no read back."""
        return self._pos[:, None, :], self.slots

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.k[layer].index_copy_(2, self._where, k)
        self.v[layer].index_copy_(2, self._where, v)
        return self.k[layer], self.v[layer]

    def commit(self, n_new: int) -> None:
        pass  # the length lives in the positions; GraphDecoder counts it on the host
