"""Attention that reads K/V through the block tables, block by block, with an online softmax.

``PagedBatch.update`` gathers every row's blocks into one contiguous tensor per layer and
hands it to ordinary attention. vLLM's PagedAttention kernel never builds that copy: it walks
a row's block table and reads each block where it lies. That needs attention computed one
block at a time, which the softmax seems to forbid (its denominator sums over every key).
The online softmax (Milakov & Gimelshein 2018; FlashAttention) removes the obstacle: keep,
per query, the running max ``m`` of the scores seen so far, the running sum ``l`` of
``exp(score - m)`` and the accumulator ``acc`` of ``exp(score - m) * v``. A new block with a
larger max rescales the old ``l`` and ``acc`` by ``exp(m_old - m_new)``; at the end
``acc / l`` is exactly softmax(scores) @ V, up to rounding.

``paged_attention`` does this for a ragged batch: row b's queries (at ``positions[b]``) see
the keys of its own block table up to their own position; block i of every row is read in one
indexing step, so what is held at once is one block per row, not the whole context (a fused GPU
kernel keeps that block in on-chip memory and never writes it back). Grouped-query attention
reads each K/V head once for the query heads that share it.

``paged_attention_split`` is Flash-Decoding (Dao et al. 2023): the blocks are cut into
``num_splits`` ranges that can run in parallel (on a GPU, on different streaming
multiprocessors, which a single long decode row would otherwise leave idle); each returns its
normalised output and its log-sum-exp, and the partial results merge exactly:
``out = sum_s exp(lse_s - lse) * out_s`` with ``lse = logsumexp_s(lse_s)``.

``InPlaceBatch`` is ``PagedBatch`` with this attention: the model asks it to ``attend``
(base.KVCacheView) itself, instead of gathering the K/V for ordinary attention.
"""
from __future__ import annotations

import math

import torch

from .paged import PagedBatch, _check_kv


def _check(q, k_cache, v_cache, tables, positions, read_positions: bool = True):
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"need q [B, Hq, T, hd] and K/V caches [blocks, Hkv, block_size, hd], got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, hq, T, hd = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv or k_cache.shape[3] != hd:
        raise ValueError(f"{hq} query heads of size {hd} cannot share {hkv} K/V heads of size {k_cache.shape[3]}")
    if tables.dim() != 2 or tables.shape[0] != B or tuple(positions.shape) != (B, T):
        raise ValueError(f"need block tables [{B}, blocks] and positions [{B}, {T}], got "
                         f"{tuple(tables.shape)}, {tuple(positions.shape)}")
    if read_positions and bool(((positions < 0) | (positions >= tables.shape[1] * k_cache.shape[2])).any()):
        raise ValueError(f"positions must lie in the {tables.shape[1]} blocks of each table")


def _blocks(q, k_cache, v_cache, tables, positions, lo, hi, scale, window=None):
    """The online softmax over blocks lo..hi-1 of every row: (acc, m, l), unnormalised.

    q is [B, Hkv, G, hd] with G = n_rep * T query rows per K/V head; key slot j of block i is
    position i * block_size + j, visible to a query at position p when it is <= p (and, with a
    ``window``, when it is > p - window)."""
    B, hkv, G, hd = q.shape
    bs = k_cache.shape[2]
    pos = positions.repeat(1, G // positions.shape[1])[:, None, :, None]  # [B, 1, G, 1]
    m = torch.full((B, hkv, G, 1), -math.inf, device=q.device, dtype=torch.float32)
    l = torch.zeros_like(m)
    acc = torch.zeros(B, hkv, G, hd, device=q.device, dtype=torch.float32)
    slot = torch.arange(bs, device=q.device)
    for i in range(lo, hi):
        k = k_cache[tables[:, i]].float()  # [B, Hkv, bs, hd]: block i of every row, read in place
        v = v_cache[tables[:, i]].float()
        s = (q @ k.transpose(-1, -2)) * scale  # [B, Hkv, G, bs]
        key = (i * bs + slot)[None, None, None]
        hidden = key > pos if window is None else (key > pos) | (key <= pos - window)
        s = s.masked_fill(hidden, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        # A query that has seen no visible key yet has m_new = -inf: subtract 0 instead, so
        # exp(-inf) gives 0 rather than exp(-inf + inf) = nan.
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)  # rescales what was summed under the old max
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + p @ v
        m = m_new
    return acc, m, l


def _grouped(q, hkv):
    """[B, Hq, T, hd] -> [B, Hkv, n_rep * T, hd]: query heads h * n_rep .. (h+1) * n_rep - 1 share K/V head h."""
    B, hq, T, hd = q.shape
    return q.float().reshape(B, hkv, hq // hkv * T, hd)


def _ungrouped(x, hq, T):
    B, hkv, G, hd = x.shape
    return x.reshape(B, hq, T, hd)


def paged_attention(q, k_cache, v_cache, tables, positions, scale: float | None = None,
                    read_positions: bool = True, window: int | None = None) -> torch.Tensor:
    """softmax(q K^T * scale) V for a ragged batch, K/V read block by block through ``tables``.

    q [B, Hq, T, hd]; k_cache, v_cache [num_blocks, Hkv, block_size, hd] (one layer of the pool);
    tables [B, blocks] (pad with any valid block: slots past a row's positions are masked);
    positions [B, T] (each query sees the keys at positions <= its own). Returns [B, Hq, T, hd].
    ``read_positions=False`` skips reading the positions back to check their range: for a caller
    that checked them on the host (``InPlaceBatch``, at every layer of every step). ``window``: each
    query sees only the keys less than ``window`` positions back (a sliding-window layer)."""
    _check(q, k_cache, v_cache, tables, positions, read_positions)
    B, hq, T, hd = q.shape
    scale = 1 / math.sqrt(hd) if scale is None else scale
    acc, m, l = _blocks(_grouped(q, k_cache.shape[1]), k_cache, v_cache, tables, positions, 0, tables.shape[1], scale,
                        window)
    return _ungrouped(acc / l, hq, T).to(q.dtype)


def paged_attention_split(q, k_cache, v_cache, tables, positions, num_splits: int,
                          scale: float | None = None) -> torch.Tensor:
    """``paged_attention`` with the blocks cut into ``num_splits`` ranges, each reduced on its own
    and the partial outputs merged by their log-sum-exp (Flash-Decoding)."""
    _check(q, k_cache, v_cache, tables, positions)
    nb = tables.shape[1]
    if not 1 <= num_splits <= nb:
        raise ValueError(f"num_splits must be in 1..{nb} (the blocks per row), got {num_splits}")
    B, hq, T, hd = q.shape
    scale = 1 / math.sqrt(hd) if scale is None else scale
    qg = _grouped(q, k_cache.shape[1])
    edges = [round(s * nb / num_splits) for s in range(num_splits + 1)]
    outs, lses = [], []
    for lo, hi in zip(edges, edges[1:]):
        acc, m, l = _blocks(qg, k_cache, v_cache, tables, positions, lo, hi, scale)
        # A split whose keys a query cannot see (all past its position) contributes nothing:
        # lse = -inf gives it weight 0, and its output is set to 0 rather than 0/0.
        outs.append(torch.where(l > 0, acc / l.clamp_min(1e-30), 0.0))
        lses.append(torch.where(l > 0, m + torch.log(l.clamp_min(1e-30)), -math.inf))
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    out = sum(torch.exp(ls - lse) * o for ls, o in zip(lses, outs))
    return _ungrouped(out, hq, T).to(q.dtype)


class InPlaceBatch(PagedBatch):
    """A ragged batch whose attention reads the pool in place (``paged_attention``): ``attend``
    writes the new K/V into their slots and attends, with no gathered copy of the context."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _check_kv(self.pool, k, v, len(self.num_new))
        blocks, tables = self.layer_slots(layer)
        self.pool.write(layer, blocks, self.offsets, k[self.rows, :, self.cols], v[self.rows, :, self.cols])
        if self.pos is None:
            raise RuntimeError("begin(positions) must come before attend()")
        # begin() checked the positions against the host-side counts: no read back per layer
        k_store, v_store = self.pool.layer_kv(layer)
        return paged_attention(q, k_store, v_store, tables, self.pos, read_positions=False,
                               window=self.pool.cfg.window(layer))


def gathered_bytes(tables: torch.Tensor, pool) -> int:
    """Bytes ``PagedBatch`` copies per step to gather K and V for ``tables`` in every layer:
    what ``InPlaceBatch`` avoids writing (and reading back)."""
    B, nb = tables.shape
    return B * nb * pool.bytes_per_block  # a block's bytes count K and V in every layer
