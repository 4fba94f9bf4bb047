"""A request as the engine sees it: token ids, a status, and a block table.

``token_ids`` is the prompt followed by everything generated so far. ``num_cached`` counts
the tokens whose keys/values are already stored; the rest are fed to the next forward
(the whole prompt at prefill, the last sampled token at each decode step, or, after a
preemption, the prompt and all its output again). ``block_table[i]`` is the physical
block that holds tokens ``i*block_size .. (i+1)*block_size-1``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum, auto

from ..sampling import Sampler


class Status(Enum):
    WAITING = auto()    # no blocks: not admitted yet, or preempted
    RUNNING = auto()    # holds blocks for all its tokens
    FINISHED = auto()   # hit a stop token or max_new_tokens; blocks returned


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token. ``temperature=0`` is greedy; ``seed`` makes sampling
    repeatable whatever the batch is; ``n`` samples share the prompt's blocks."""
    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stop_ids: tuple[int, ...] | None = None   # None: the model's EOS
    ignore_eos: bool = False                  # run to max_new_tokens whatever is sampled

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        Sampler(self.temperature, self.top_k, self.top_p)  # raises on bad values

    def sampler(self, index: int = 0) -> Sampler:
        """Sample ``index`` of a request gets its own seeded generator (seed + index)."""
        seed = None if self.seed is None else self.seed + index
        return Sampler(self.temperature, self.top_k, self.top_p, seed=seed)


class Sequence:
    _ids = itertools.count()

    def __init__(self, prompt_ids, params: SamplingParams, block_size: int, sample_index: int = 0):
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("the prompt must hold at least one token id")
        self.id = next(Sequence._ids)
        self.token_ids = prompt_ids
        self.num_prompt_tokens = len(prompt_ids)
        self.params, self.block_size = params, block_size
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full, computed blocks
        self.num_cached = 0
        self.sample_index = sample_index
        self.sampler = params.sampler(sample_index)
        self.num_preemptions = 0
        # wall-clock times (seconds), filled in by the engine
        self.arrival_time = self.first_token_time = self.finish_time = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.id}, {self.status.name}, tokens={len(self)}, "
                f"cached={self.num_cached}, blocks={self.block_table})")

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next forward must compute (their K/V are not stored yet)."""
        return len(self) - self.num_cached

    def block_tokens(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def fork(self, sample_index: int) -> "Sequence":
        """A sibling with the same tokens and its own sampler; blocks are shared by the pool."""
        child = Sequence(self.token_ids[:self.num_prompt_tokens], self.params, self.block_size, sample_index)
        child.token_ids = list(self.token_ids)
        child.status = self.status
        child.arrival_time = self.arrival_time
        return child
