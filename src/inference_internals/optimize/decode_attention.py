"""A decode step's attention over a long KV cache, read where it lies: ``decode`` (decode_attention.cpp).

At 8,128 tokens of context the stored keys and values are most of what a decode step reads (fp32:
46 KB a token, 377 MB, against the Q4_1 weights' ~100 MB), and the compiled step's own attention
(inductor's loops over ``appending.AppendingView``'s products and sums) read each K/V head's keys once
for each of the 3 query heads that share it, and ended each score in a reduction across one vector:
the door decoded 30 tok/s there. This kernel reads each stored row once for every query head that
needs it, sums 16 scores across at once, takes e^x 16 lanes at a time, and lets both cores share one
sequence's tokens (chunks of 256, merged at the end, as flash-decoding splits a long cache on a GPU:
one row has only 3 K/V heads to share out): 53 tok/s with the same fp32 cache (2-core AMD EPYC, one run
each), 70 with the cache in f16 (``kv_cache_dtype``; the committed ``llama_cpp_best`` run, interleaved).

Same arithmetic as the loops, in another order: scores and sums in fp32, exact to rounding. Built with
the block kernels (blockdot.py: one C++ extension), on CPUs with AVX-512; elsewhere ``runs_here`` says no
and the compiled step keeps its loops.
"""
from __future__ import annotations

import torch

from . import blockdot

MAX_QUERIES = 64   # query heads per K/V head x new tokens (decode_attention.cpp's kMaxRows)
MAX_HEAD_DIM = 256


def runs_here(store: torch.Tensor) -> bool:
    """Whether the kernel is built for this storage: a CPU with the block kernels (AVX-512 VNNI), K/V in
    fp32, bf16 or fp16. Asked once per step by the compiled step, outside its graph (it reads /proc/cpuinfo once)."""
    return (store.device.type == "cpu" and store.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and blockdot.available() is None)


def fits(q: torch.Tensor, store: torch.Tensor) -> bool:
    """Whether ``decode`` takes these shapes: head_dim a multiple of 16 (at most 256), at most 64 queries
    (query heads x new tokens) per K/V head of ``store`` [blocks, Hkv, block_size, D]."""
    B, Hq, T, D = q.shape
    return D % 16 == 0 and D <= MAX_HEAD_DIM and Hq // store.shape[1] * T <= MAX_QUERIES


def decode(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_store: torch.Tensor, v_store: torch.Tensor,
           table: torch.Tensor | None, span: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [B, Hq, T, D] over each row's stored keys and the new ones, one softmax over both.

    ``k_store``/``v_store`` [blocks, Hkv, block_size, D]: one layer's storage (fp32, bf16 or fp16; its
    rows contiguous). Row b's stored token s lies in block ``table[b, s // block_size]`` (``table`` [B, nb],
    or [nb] for one row; None: block s // block_size of the storage itself) at slot s % block_size.
    ``span``'s size is the number of tokens stored (``lengths`` [B]: each row's own, when they differ).
    ``k_new``/``v_new`` [B, Hkv, T, D] (fp32): this step's keys, which new query t sees up to its own.
    Query head h reads K/V head h // (Hq / Hkv). Returns [B, Hq, T, D] fp32."""
    return torch.ops.cache_attention.decode(q, k_new, v_new, k_store, v_store, table, span, lengths)
