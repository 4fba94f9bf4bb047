"""The cache as a compiled decode step sees it: one sequence's stored K/V read where they lie, the new
rows handed back instead of written.

A compiled graph that writes into one of its inputs copies the whole input each step (measured: the
step twice as slow), so the step (optimize.compiled_step) stores the new rows itself after the graph
has run. What it reads comes from the cache being stepped (``Stored``: its ``stored()``): a contiguous
cache's buffer, seen as one block as long as what it holds, or the paged pool with the sequence's block
table, read through the table inside the graph, block by block where the blocks lie. On a CPU with AVX-512
the attention over them is one kernel call a layer (optimize.decode_attention, handed in by the step);
elsewhere (a GPU, other CPUs) the products and sums below, which the compiler turns into loops of its own.
"""
from __future__ import annotations

import torch

from .base import Stored
from .contiguous import BaseKVCache


class AppendingView:
    """The cache protocol (``base.KVCacheView``) over ``Stored`` for a compiled graph: the new K/V of
    each layer are kept in ``new_k``/``new_v`` for the caller to store."""

    def __init__(self, stored: Stored, kernel=None):
        self.k, self.v, self.table, self.span = stored.k, stored.v, stored.table, stored.span
        self.lengths = stored.lengths
        self.new_k, self.new_v = [], []
        # the compiled step's attention kernel (optimize.decode_attention), where it runs: chosen by the
        # step outside the graph, so that this module needs nothing from optimize
        self.kernel = kernel

    def positions(self, B: int, T: int) -> torch.Tensor:
        raise ValueError("a compiled step passes its positions")

    def begin(self, positions: torch.Tensor) -> None:
        pass  # the caller checked the step against the cache it views

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The new queries q [1, Hq, T, D] against the stored keys and the new ones k, v [1, Hkv, T, D],
        one softmax over both, as products and sums the compiler fuses into loops of its own. Not
        SDPA over a gathered copy: concatenating the new keys to the cached ones copied the whole cache
        in every layer of every step, and one SDPA call cost more than the arithmetic of a single query
        (about 20 us, 30 calls a step). Query head h reads K/V head h // (Hq / Hkv), as ``enable_gqa``;
        new query i sees new keys 0..i. In fp32 whatever the model's dtype, as SDPA's kernels compute
        (the compiler reads bf16 and converts as it goes). Q4_1 on a 2-core Xeon: 1.06x tok/s over 32
        new tokens (18 of 20 interleaved rounds faster), 1.09x over 200. But at 8,128 stored tokens these
        loops read each K/V head's keys once per query head: 30 tok/s where the kernel gives 53 (2-core EPYC)."""
        self.new_k.append(k)
        self.new_v.append(v)
        B, H, T, D = q.shape
        dtype = q.dtype
        if self.kernel is not None and self.kernel.fits(q, self.k[layer]):  # the same sums, each K/V row read once
            return self.kernel.decode(q.float(), k.float(), v.float(), self.k[layer], self.v[layer], self.table,
                                      self.span, self.lengths).to(dtype)
        q, k, v = q.float(), k.float(), v.float()
        kc, vc = (self._stored(store[layer]) for store in (self.k, self.v))  # [1 or B, Hkv, S, D]
        hkv, S = kc.shape[1], kc.shape[2]
        g = (q * D ** -0.5).reshape(B, hkv, H // hkv * T, 1, D)  # each K/V head's queries together
        old = (g * kc[:, :, None]).sum(-1)  # [B, Hkv, Hq / Hkv * T, S]
        if self.lengths is not None:  # a batch: row b's keys past its own length are another's padding
            past = torch.arange(S, device=q.device)[None, :] >= self.lengths[:, None]
            old = old.masked_fill(past[:, None, None, :], float("-inf"))
        new = (g * k[:, :, None]).sum(-1)  # [B, Hkv, Hq / Hkv * T, T]
        if T > 1:
            later = ~BaseKVCache.mask_after(0, T, q.device).repeat(H // hkv, 1)
            new = new.masked_fill(later, float("-inf"))
        # One softmax over [old, new] without joining them, so that every sum over the stored keys has S
        # terms. Inductor's C++ sums switch to chunked accumulation past 4,096 terms and guard the graph on
        # which side it is: sums of S + T and of S terms put S = 4,096 on both sides, a graph for that one
        # length (refused: the length is marked dynamic). Now one graph up to 4,096 stored tokens, another past.
        m = torch.maximum(old.amax(-1, keepdim=True), new.amax(-1, keepdim=True))
        e_old, e_new = torch.exp(old - m), torch.exp(new - m)
        total = e_old.sum(-1, keepdim=True) + e_new.sum(-1, keepdim=True)
        out = ((e_old[..., None] * vc[:, :, None]).sum(-2) + (e_new[..., None] * v[:, :, None]).sum(-2)) / total
        return out.reshape(B, H, T, D).to(dtype)

    def _stored(self, layer_store: torch.Tensor) -> torch.Tensor:
        """[blocks, Hkv, bs, D] -> the sequence's stored tokens end to end, [1, Hkv, length, D] (indices the
        compiler folds into its loads: nothing is copied). Its length is ``span``'s size: a size, not a
        value, so the graph's loops run over the stored tokens only, and no mask is needed. A batch's
        table [B, nb] gives [B, Hkv, longest, D], each row masked past its own length in ``attend``."""
        x = (layer_store if self.table is None else layer_store[self.table]).float()  # [(B,) nb, Hkv, bs, D]
        if x.dim() == 4:
            x = x[None]
        rows, nb, hkv, bs, D = x.shape
        return x.permute(0, 2, 1, 3, 4).reshape(rows, hkv, nb * bs, D)[:, :, :self.span.shape[0]]

    def commit(self, n_new: int) -> None:
        pass
