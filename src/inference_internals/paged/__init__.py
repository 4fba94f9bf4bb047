"""Paged KV cache and continuous batching: a small vLLM, one module per mechanism.

block_pool   fixed-size blocks: free list, ref counts, chained-hash prefix cache
sequence     a request: token ids, status, block table; its sampling parameters
paged_cache  the physical K/V pool and the model-facing view of a ragged batch
paged_attention  attention block by block through the tables (online softmax), split-K merge
scheduler    waiting/running queues, admission by free blocks, preemption, chunked prefill; static baseline
engine       add_request / step / run, with per-step statistics
trace        seeded request traces, replayed through a scheduler without the model
load         Poisson arrivals, a fitted step-cost model, latency percentiles against request rate
"""
from .block_pool import BlockPool, OutOfBlocksError, block_hash
from .engine import LLMEngine, Request, StepStats
from .paged_cache import PagedBatch, PagedKVCache
from .scheduler import ScheduledBatch, Scheduler, StaticScheduler
from .sequence import SamplingParams, Sequence, Status

__all__ = ["BlockPool", "OutOfBlocksError", "block_hash", "LLMEngine", "Request", "StepStats",
           "PagedBatch", "PagedKVCache", "ScheduledBatch", "Scheduler", "StaticScheduler",
           "SamplingParams", "Sequence", "Status"]
