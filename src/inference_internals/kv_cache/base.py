"""The one protocol every KV cache speaks to the model (model.py), and the part most of them share.

A forward pass with a cache makes four calls, in this order:

    positions = cache.positions(B, T)     # where the T new tokens of each row sit (unless given)
    cache.begin(positions)                # check there is room; work out which keys each query sees
    out = cache.attend(layer, q, k, v)    # in every layer: store this step's K/V, attend over all of them
    cache.commit(T)                       # the step succeeded: the new tokens now count

A compiled decode step (optimize.compiled_step) asks one thing more, ``cache.stored()``: one sequence's
stored K/V where they lie (``Stored``), which its graph reads in place; a cache that cannot show them so
(several rows, or storage no graph reads) says None, and the step runs eagerly through the four calls.

Storage is each cache's own business: one contiguous buffer (``contiguous.KVCache``), a buffer that
grows by concatenation (``GrowingKVCache``), fixed-size blocks reached through block tables
(``paged``), the same blocks read in place (``paged_attention``), fixed-shape buffers written at
device-side positions (``static``, for CUDA graphs), or the compiled step's view that reads the
stored prefix and hands the new rows back (``appending``). Most of them gather a layer's keys and
values into one tensor and run ordinary attention over it: ``Gathering`` is that ``attend``, from
their ``update`` and the mask their ``begin`` made.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Protocol, runtime_checkable

import torch

from ..model import attention, window_mask


@runtime_checkable
class KVCacheView(Protocol):
    """What the model calls on a cache during one forward pass."""

    def positions(self, B: int, T: int) -> torch.Tensor:
        """[B, T]: the positions of the new tokens, each row continuing from what it has stored."""

    def begin(self, positions: torch.Tensor) -> None:
        """Refuse a step that does not fit (before anything is written); prepare its attention mask."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the new k, v [B, Hkv, T, hd] of ``layer``; return attention of q [B, Hq, T, hd] over
        every key the cache holds for it, [B, Hq, T, hd]."""

    def commit(self, n_new: int) -> None:
        """The forward pass succeeded: its ``n_new`` tokens per row now count as stored."""

    def stored(self) -> "Stored | None":
        """One sequence's stored K/V where they lie, for a compiled step to read (optimize.compiled_step),
        or None: several rows, or a storage no compiled step reads."""


class Stored(NamedTuple):
    """One sequence's stored K/V (or a batch's, one new token each), as a compiled step reads them and
    writes after them."""
    k: torch.Tensor          # [layers, blocks, Hkv, block_size, hd]: the storage, unchanged
    v: torch.Tensor
    table: torch.Tensor | None  # [nb] long: the sequence's blocks in order ([B, nb]: each row's); None: ``k`` holds just its blocks
    span: torch.Tensor       # [length, 0]: no bytes, its size the number of tokens stored (a size the graph can vary)
    write: Callable[[torch.Tensor, torch.Tensor], None]  # stores the new rows [layers, B, Hkv, T, hd]
    varying: tuple           # (tensor, dim) pairs whose size changes from step to step (dynamic in the graph)
    layout: str              # 'contiguous', 'paged' or 'paged batch': each has graphs of its own
    lengths: torch.Tensor | None = None  # a batch's [B] tokens stored per row (span is the longest); keys past a row's are masked


class Gathering:
    """``attend`` for a cache whose ``update(layer, k, v)`` stores the new K/V and returns all of
    them, gathered: ordinary attention over them, under the mask ``begin`` left in ``self.mask``.

    A layer with a sliding window (``cfg.window(layer)``, Gemma 3's local layers) attends under that
    mask narrowed to the window: ``positions_seen()`` says where each query and each gathered key
    sit, and the mask, made once per step and window, hides keys ``window`` or more positions back."""
    mask: torch.Tensor | None = None
    _windowed: dict | None = None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = self.update(layer, k, v)  # in the storage's dtype, which may be narrower than the model's
        return attention(q, k.to(q.dtype), v.to(q.dtype), self.layer_mask(layer))

    def layer_mask(self, layer: int) -> torch.Tensor | None:
        """The mask layer ``layer`` attends under this step: ``self.mask``, narrowed to its window if it has one."""
        cfg = self.model_config
        window = cfg.window(layer) if cfg is not None else None
        if window is None:
            return self.mask
        if self._windowed is None:  # begin() empties it: one mask per step and window size
            self._windowed = {}
        if window not in self._windowed:
            q_pos, k_pos = self.positions_seen()
            seen = window_mask(q_pos, k_pos, window)
            self._windowed[window] = seen if self.mask is None else seen & self.mask
        return self._windowed[window]

    def positions_seen(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(query positions [.., T], gathered keys' positions [.., S]) of this step, broadcastable to the mask."""
        raise NotImplementedError(f"{type(self).__name__} has no sliding-window attention")

    @property
    def model_config(self):
        """The model's config, for its windows (None: a cache that keeps none, e.g. a reader's own, sees every key)."""
        return getattr(self, "cfg", None)

    def stored(self) -> None:
        return None
