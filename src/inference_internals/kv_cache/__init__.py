"""Every KV cache, in one place, speaking one protocol to the model (``base.KVCacheView``).

base             the protocol (positions, begin, attend, commit, stored) and what most caches share
contiguous       ``KVCache``: one preallocated buffer per K and V; ``GrowingKVCache``: the naive
                 concatenation it replaces (chapter 4); ``RingKVCache``: a sliding-window model's
                 sliding layers in rings of the window's size (chapter 7)
paged            ``PagedKVCache``: the pool of fixed-size blocks; ``PagedBatch``/``PackedBatch``: one
                 forward pass's view of a ragged batch through its block tables (chapter 5)
paged_attention  attention that reads the blocks in place, with an online softmax (chapter 5)
static           fixed-shape buffers written at device-side positions, for CUDA graphs (chapter 3)
appending        the view a compiled step reads the stored K/V through (optimize.compiled_step)
"""
from .base import KVCacheView, Stored
from .contiguous import BaseKVCache, CacheFullError, GrowingKVCache, KVCache, RingKVCache, kv_cache_bytes
from .paged import PackedBatch, PagedBatch, PagedKVCache

__all__ = ["KVCacheView", "Stored", "BaseKVCache", "CacheFullError", "GrowingKVCache", "KVCache", "RingKVCache", "kv_cache_bytes",
           "PackedBatch", "PagedBatch", "PagedKVCache"]
