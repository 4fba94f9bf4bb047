"""The KV cache: keep every past token's keys and values so each new token costs O(n), not O(n^2).

``KVCache`` preallocates [layers, batch, kv_heads, max_len, head_dim] for K and for V
once, and writes each step into the next free slots: no allocation while decoding.
Its size is exactly 2 x layers x kv_heads x head_dim x max_len x batch x bytes.

All rows of a batch share one length (prompts of equal length, or one prompt);
chapter 5's paged cache handles ragged batches.
"""
from __future__ import annotations

import torch

from .model import LlamaConfig


def kv_cache_bytes(cfg: LlamaConfig, seq_len: int, batch: int = 1, bytes_per_elem: int = 2) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x seq_len x batch x bytes."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * seq_len * batch * bytes_per_elem


class CacheFullError(RuntimeError):
    pass


class KVCache:
    def __init__(self, cfg: LlamaConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size and max_len must be >= 1, got {batch_size}, {max_len}")
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds the context window {cfg.max_position_embeddings}")
        shape = (cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.batch_size, self.max_len = batch_size, max_len
        self.length = 0  # tokens whose K/V are stored, for every row

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "KVCache":
        return cls(model.config, batch_size, max_len, model.device, model.dtype)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    # --- the three calls the model makes (see model.py) ---
    def begin(self, positions: torch.Tensor):
        """Check there is room for this step; return the attention mask it needs (None = none)."""
        B, T = positions.shape
        if B != self.batch_size:
            raise ValueError(f"batch of {B} rows, but the cache was made for {self.batch_size}")
        if self.length + T > self.max_len:
            raise CacheFullError(f"cache holds {self.length} of {self.max_len} tokens; "
                                 f"{T} more do not fit")
        if self.length == 0 or T == 1:
            return None  # plain causal (prefill) or see-everything (one new token)
        # T new queries after `length` cached keys: query i sees keys 0..length+i.
        q = torch.arange(T, device=self.k.device)[:, None] + self.length
        kpos = torch.arange(self.length + T, device=self.k.device)[None, :]
        return kpos <= q

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def commit(self, n_new: int) -> None:
        self.length += n_new

    # --- what generation and speculative decoding need ---
    def crop(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens (e.g. rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0
