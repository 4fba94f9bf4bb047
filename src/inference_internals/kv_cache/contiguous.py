"""The KV cache: keep every past token's keys and values so each new token costs O(n), not O(n^2).

Without a cache, step n re-runs all n tokens through every layer to get the one new token.
With one, step n runs only the new token and reads the n stored keys/values.

``KVCache`` preallocates [layers, batch, kv_heads, max_len, head_dim] for K and for V
once, and writes each step into the next free slots: no allocation while decoding.
Its size is exactly 2 x layers x kv_heads x head_dim x max_len x batch x bytes.
``GrowingKVCache`` is the naive alternative, kept to measure what preallocation saves:
it concatenates each step onto the past, so step n allocates and copies all n tokens again.

Both speak the model's protocol (``base.KVCacheView``): ``positions`` / ``begin`` / ``attend`` / ``commit``,
``attend`` being ``update`` (store, return all) then ordinary attention.
A step that fails (full, wrong batch) raises before anything changes, and ``length`` only
moves on ``commit``, so a failed or rolled-back step never corrupts what is stored.
All rows of a batch share one length (prompts of equal length, or one prompt);
chapter 5's paged cache handles ragged batches.
"""
from __future__ import annotations

import numbers

import torch

from ..device import get_device, parse_dtype
from ..model import LlamaConfig, window_mask
from ..params import check_int
from .base import Gathering, Stored


def kv_cache_bytes(cfg: LlamaConfig, seq_len: int, batch: int = 1, bytes_per_elem: int = 2) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x seq_len x batch x bytes."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * seq_len * batch * bytes_per_elem


class CacheFullError(RuntimeError):
    pass


class BaseKVCache(Gathering):
    """What every contiguous cache shares: one length for all rows, the step checks, crop and reset.

    A subclass stores K/V its own way and implements ``update`` (and ``kv``/``nbytes``).
    """

    def __init__(self, cfg: LlamaConfig, batch_size: int, max_len: int, device, dtype: torch.dtype):
        check_int("batch_size", batch_size, 1)
        check_int("max_len", max_len, 1)
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds the context window {cfg.max_position_embeddings}")
        self.cfg, self.batch_size, self.max_len = cfg, int(batch_size), int(max_len)
        # parsed as the model's are ('cuda', 'bf16', ...), and refused here rather than inside torch
        self.device, self.dtype = get_device(device), parse_dtype(dtype, device)
        self.length = 0         # tokens whose K/V are stored, for every row
        self.bytes_copied = 0   # bytes written into cache storage so far (new tokens and any re-copies)

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, dtype: torch.dtype | str | None = None):
        """The cache for ``model``, its K/V kept in ``dtype`` (None: the model's own), as ``PagedKVCache.for_model``."""
        return cls(model.config, batch_size, max_len, model.device, dtype or model.dtype)

    # --- the calls the model makes (base.KVCacheView) ---
    def positions(self, B: int, T: int) -> torch.Tensor:
        return torch.arange(self.length, self.length + T, device=self.device).expand(B, -1)

    def begin(self, positions: torch.Tensor) -> None:
        """Check there is room for this step; keep the attention mask it needs (None = none)."""
        B, T = positions.shape
        self.check_room(B, T)
        # None: plain causal (a prefill) or see-everything (one new token)
        self.mask = None if self.length == 0 or T == 1 else self.mask_after(self.length, T, positions.device)
        self._windowed, self._T = None, T

    def positions_seen(self):
        """Every row's queries at length..length+T-1; the gathered keys at 0..length+T-1."""
        return (torch.arange(self.length, self.length + self._T, device=self.device),
                torch.arange(self.length + self._T, device=self.device))

    @staticmethod
    def mask_after(cached, T: int, device) -> torch.Tensor:
        """[T, cached + T]: T new queries after ``cached`` keys, query i sees keys 0..cached+i."""
        q = torch.arange(T, device=device)[:, None] + cached
        return torch.arange(cached + T, device=device)[None, :] <= q

    def commit(self, n_new: int) -> None:
        self.length += n_new

    # --- what generation and speculative decoding need ---
    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store T tokens for every layer at once: k, v are [layers, batch, kv_heads, T, head_dim]."""
        L = self.cfg.num_hidden_layers
        if k.dim() != 5 or k.shape[0] != L or k.shape != v.shape:
            raise ValueError(f"append wants k and v of shape [{L}, batch, kv_heads, T, head_dim], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        self._check_kv(k[0], v[0])  # one layer's shape is every layer's: check before writing any
        for layer in range(L):
            self.update(layer, k[layer], v[layer])
        self.commit(k.shape[3])

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored keys and values of one layer: [batch, kv_heads, length, head_dim] each."""
        raise NotImplementedError

    def crop(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens (e.g. rejected draft tokens)."""
        # a float (2.5) would pass the range test and make ``length`` a float
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length!r}")
        self.length = int(length)

    def reset(self) -> None:
        self.length = 0

    # --- checks, run before anything is written ---
    def check_room(self, B: int, T: int) -> None:
        """Refuse a step of ``B`` rows and ``T`` new tokens that this cache cannot take."""
        if B != self.batch_size:
            raise ValueError(f"batch of {B} rows, but the cache was made for {self.batch_size}")
        if self.length + T > self.max_len:
            raise CacheFullError(f"cache holds {self.length} of {self.max_len} tokens; "
                                 f"{T} more do not fit")

    def _check_kv(self, k: torch.Tensor, v: torch.Tensor) -> None:
        cfg = self.cfg
        want = (self.batch_size, cfg.num_key_value_heads, cfg.head_dim)
        if k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != want or k.shape != v.shape:
            raise ValueError(f"k and v must be [batch={want[0]}, kv_heads={want[1]}, T, "
                             f"head_dim={want[2]}], got {tuple(k.shape)} and {tuple(v.shape)}")
        self.check_room(k.shape[0], k.shape[2])


class KVCache(BaseKVCache):
    """Preallocated ("static") cache: one buffer for K and one for V, filled left to right."""

    def __init__(self, cfg: LlamaConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__(cfg, batch_size, max_len, device, dtype)
        shape = (cfg.num_hidden_layers, self.batch_size, cfg.num_key_value_heads, self.max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self._span = torch.empty(self.max_len, 0, device=self.device)  # stored(): a size, no bytes

    @property
    def nbytes(self) -> int:
        """Bytes held, which is the capacity: allocated once, whatever ``length`` is."""
        return self.k.nbytes + self.v.nbytes

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self._check_kv(k, v)
        end = self.length + k.shape[2]
        k_layer, v_layer = self.k[layer], self.v[layer]  # [batch, kv_heads, max_len, head_dim] views
        k_layer[:, :, self.length:end] = k
        v_layer[:, :, self.length:end] = v
        self.bytes_copied += 2 * k.numel() * self.k.element_size()  # the new tokens only
        return k_layer[:, :, :end], v_layer[:, :, :end]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """As ``BaseKVCache.append``, every layer in one write."""
        L = self.cfg.num_hidden_layers
        if k.dim() != 5 or k.shape[0] != L or k.shape != v.shape:
            raise ValueError(f"append wants k and v of shape [{L}, batch, kv_heads, T, head_dim], "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        self._check_kv(k[0], v[0])
        self._write(k, v)
        self.commit(k.shape[3])

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        end = self.length + k.shape[3]
        self.k[:, :, :, self.length:end] = k
        self.v[:, :, :, self.length:end] = v
        self.bytes_copied += 2 * k.numel() * self.k.element_size()

    def stored(self):
        """One row's stored tokens, seen as one block as long as they are. Not below 2 tokens: torch
        gives sizes 0 and 1 graphs of their own, and a decode step always follows a prefill."""
        if self.batch_size != 1 or self.length < 2 or self.cfg.windowed_layers:
            return None  # (the compiled step's view has no sliding window: such a model runs eagerly)
        k, v = self.k[:, :, :, :self.length], self.v[:, :, :, :self.length]
        span = self._span[:self.length]
        return Stored(k, v, None, span, self._write, ((k, 3), (v, 3), (span, 0)), "contiguous")

    def kv(self, layer: int):
        return self.k[layer, :, :, :self.length], self.v[layer, :, :, :self.length]


class GrowingKVCache(BaseKVCache):
    """The naive cache: ``torch.cat`` the new K/V onto the past at every step.

    Each step allocates a fresh tensor and copies all ``length`` past tokens into it, so a
    step costs O(length) bytes moved and a whole generation O(n^2): what ``KVCache`` avoids.
    ``max_len`` defaults to the model's context window, since nothing is reserved up front.
    """

    def __init__(self, cfg: LlamaConfig, batch_size: int, max_len: int | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__(cfg, batch_size, max_len or cfg.max_position_embeddings, device, dtype)
        self.k: list[torch.Tensor | None] = [None] * cfg.num_hidden_layers
        self.v: list[torch.Tensor | None] = [None] * cfg.num_hidden_layers

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int | None = None):
        return cls(model.config, batch_size, max_len, model.device, model.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tokens: the cache grows with ``length`` instead of reserving."""
        return kv_cache_bytes(self.cfg, self.length, self.batch_size, self.dtype.itemsize)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self._check_kv(k, v)
        past_k, past_v = self.kv(layer)  # sliced to `length`: drops what a failed step or crop left
        k = torch.cat([past_k, k.to(self.dtype)], dim=2)  # a new tensor: the past is copied again
        v = torch.cat([past_v, v.to(self.dtype)], dim=2)
        self.k[layer], self.v[layer] = k, v
        self.bytes_copied += k.nbytes + v.nbytes  # the whole past, again, plus the new tokens
        return k, v

    def kv(self, layer: int):
        if self.k[layer] is None or self.length == 0:
            shape = (self.batch_size, self.cfg.num_key_value_heads, 0, self.cfg.head_dim)
            empty = torch.empty(shape, device=self.device, dtype=self.dtype)
            return empty, empty
        return self.k[layer][:, :, :self.length], self.v[layer][:, :, :self.length]

    def reset(self) -> None:
        super().reset()
        self.k = [None] * self.cfg.num_hidden_layers
        self.v = [None] * self.cfg.num_hidden_layers


class RingKVCache(KVCache):
    """``KVCache`` for a model with sliding-window layers: the full-attention layers keep every token
    ([full layers, batch, kv_heads, max_len, head_dim], as ``KVCache``), a sliding layer only its last
    ``window + slack`` in a ring ([sliding layers, batch, kv_heads, window + slack, head_dim]): position p
    lives in slot p % (window + slack), overwriting the position that far back, which no query will see
    again. Memory: 2 x kv_heads x head_dim x bytes x (full layers x max_len + sliding layers x ring).

    A step reads a sliding layer's stored keys still inside the window of its first query (in position
    order), puts its own new keys after them, attends under the window's mask, then writes the newest
    into the ring. ``slack`` is how far ``crop`` may roll back (a rejected speculative guess): the ring
    still holds the window behind any length up to ``slack + 1`` tokens back."""

    def __init__(self, cfg: LlamaConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, slack: int = 16):
        if not cfg.windowed_layers:
            raise ValueError("a ring cache is for a model with sliding-window layers")
        check_int("slack", slack, 0)
        BaseKVCache.__init__(self, cfg, batch_size, max_len, device, dtype)
        local = cfg.windowed_layers
        self.window, self.slack = cfg.sliding_window, slack
        self.ring = min(self.window + slack, self.max_len)
        full = [i for i in range(cfg.num_hidden_layers) if i not in local]
        self.where = {layer: (False, j) for j, layer in enumerate(full)} | {layer: (True, j) for j, layer in enumerate(local)}
        head = (self.batch_size, cfg.num_key_value_heads)
        self.k = torch.zeros(len(full), *head, self.max_len, cfg.head_dim, device=self.device, dtype=self.dtype)
        self.v = torch.zeros_like(self.k)
        self.ring_k = torch.zeros(len(local), *head, self.ring, cfg.head_dim, device=self.device, dtype=self.dtype)
        self.ring_v = torch.zeros_like(self.ring_k)

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, slack: int = 16):
        return cls(model.config, batch_size, max_len, model.device, model.dtype, slack)

    @property
    def _lo(self) -> int:
        """The oldest position the next step's first query sees."""
        return max(0, self.length - self.window + 1)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.ring_k.nbytes + self.ring_v.nbytes

    def layer_mask(self, layer: int):
        if not self.where[layer][0]:
            return self.mask
        if self._windowed is None:
            self._windowed = {}
        if "ring" not in self._windowed:  # keys are positions lo .. length + T - 1, in order
            q = torch.arange(self.length, self.length + self._T, device=self.device)
            self._windowed["ring"] = window_mask(q, torch.arange(self._lo, self.length + self._T, device=self.device),
                                                 self.window)
        return self._windowed["ring"]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self._check_kv(k, v)
        local, j = self.where[layer]
        T, end = k.shape[2], self.length + k.shape[2]
        self.bytes_copied += 2 * k.numel() * self.k.element_size()
        if not local:
            self.k[j, :, :, self.length:end] = k
            self.v[j, :, :, self.length:end] = v
            return self.k[j, :, :, :end], self.v[j, :, :, :end]
        old = torch.arange(self._lo, self.length, device=self.device) % self.ring
        keys = torch.cat([self.ring_k[j][:, :, old], k.to(self.dtype)], dim=2)
        values = torch.cat([self.ring_v[j][:, :, old], v.to(self.dtype)], dim=2)
        keep = min(T, self.ring)  # only the newest fit; the older ones no later query sees
        slots = torch.arange(end - keep, end, device=self.device) % self.ring
        self.ring_k[j][:, :, slots] = k[:, :, T - keep:].to(self.dtype)
        self.ring_v[j][:, :, slots] = v[:, :, T - keep:].to(self.dtype)
        return keys, values

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        BaseKVCache.append(self, k, v)

    def stored(self):
        return None

    def kv(self, layer: int):
        """A full layer's stored K/V; a sliding layer's last ``min(length, ring)`` positions, in order."""
        local, j = self.where[layer]
        if not local:
            return self.k[j, :, :, :self.length], self.v[j, :, :, :self.length]
        idx = torch.arange(max(0, self.length - self.ring), self.length, device=self.device) % self.ring
        return self.ring_k[j][:, :, idx], self.ring_v[j][:, :, idx]

    def crop(self, length: int) -> None:
        if isinstance(length, numbers.Integral) and not isinstance(length, bool) and \
                0 <= length <= self.length and self.length - length > self.slack + 1:
            raise ValueError(f"a ring cache rolls back at most {self.slack + 1} tokens (its slack + 1), "
                             f"not {self.length - length}")
        super().crop(length)
