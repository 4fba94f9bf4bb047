"""The engine: one runtime for every request, one module per mechanism (nano-vllm's shape).

llm_engine    LLMEngine: add_request / step / generate; a step is schedule -> run -> postprocess
scheduler     waiting/running queues, admission by free blocks, preemption, chunked prefill, and the
              post-processing where the stop rule is asked; static batching, the baseline
block_pool    fixed-size blocks and block tables: free list, ref counts, copy-on-write, prefix cache
sequence      a request's sample: token ids, status, block table, sampler, draft state
model_runner  how a step runs: the model and its KV pool, the layout of each forward pass
spec_decode   speculative decoding as a mode of the step: propose, verify in one pass, accept, roll back
"""
from .block_pool import BlockPool, OutOfBlocksError, block_hash
from .llm_engine import LLMEngine, Request, StepStats
from .model_runner import ModelRunner
from .scheduler import ScheduledBatch, Scheduler, StaticScheduler
from .sequence import Sequence, Status

__all__ = ["BlockPool", "OutOfBlocksError", "block_hash", "LLMEngine", "Request", "StepStats", "ModelRunner",
           "ScheduledBatch", "Scheduler", "StaticScheduler", "Sequence", "Status"]
