"""The paged engine's settings in one place, with vLLM's names, checked once when made.

    EngineConfig(num_blocks=64, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048,
                 enable_prefix_caching=True, enable_chunked_prefill=False)

``LLMEngine`` builds its pool, its scheduler and its forward from this and nothing else; ``LLM``
checks the engine settings it is given by making one, before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..params import check_int

ATTENTION = ("gather", "in_place")


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int | None = None          # KV blocks in the pool (vLLM: num_gpu_blocks); LLM sizes it per call when None
    block_size: int = 16                   # tokens per block
    max_num_seqs: int = 64                 # sequences in one step
    max_num_batched_tokens: int = 2048     # tokens in one step (the chunked-prefill budget)
    enable_prefix_caching: bool = True     # full blocks shared by hash between requests
    enable_chunked_prefill: bool = False   # prompts cut into chunks that fill each step's budget
    static_reserve_tokens: int | None = None  # static batching (the baseline): tokens reserved per sequence
    watermark: float = 0.01                # share of the pool admission leaves free for running sequences
    packed: bool = False                   # a step as one row [1, N] of every token (vLLM's layout)
    padded_prefill: bool = False           # new prompts in one padded batch instead of one by one
    attention: str = "gather"              # 'gather' the blocks into a copy, or read them 'in_place'
    record_states: bool = False            # keep a snapshot of the pool after every step (chapter 5's viewer)

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            check_int(name, getattr(self, name), 1)
        for name in ("num_blocks", "static_reserve_tokens"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"{f.name} must be a bool, got {getattr(self, f.name)!r}")
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)) \
                or not 0 <= self.watermark < 1:
            raise ValueError(f"watermark is a fraction of the pool in [0, 1), got {self.watermark!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention is one of {ATTENTION}, got {self.attention!r}")
        if self.packed and self.padded_prefill:
            raise ValueError("choose one layout: packed or padded_prefill")
        if self.attention == "in_place" and self.packed:
            raise ValueError("in-place attention runs on the padded ragged batch: use packed=False")
        if self.enable_chunked_prefill and self.static:
            raise ValueError("static batching prefills whole batches: no chunked prefill")
        if self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            # every running sequence's decode token must fit in one step (vLLM checks the same)
            raise ValueError(f"with chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"must be >= max_num_seqs ({self.max_num_seqs})")

    @property
    def static(self) -> bool:
        """The scheduling policy: static batching (a fixed reservation per sequence) or continuous."""
        return self.static_reserve_tokens is not None

    @classmethod
    def of(cls, **settings) -> "EngineConfig":
        """``EngineConfig(**settings)``, with an unknown name refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"unknown engine setting{'s' * (len(unknown) > 1)} {unknown}: "
                            f"expected some of {sorted(known)}")
        return cls(**settings)
