"""A request as the engine sees it: token ids, a status, and a block table.

``token_ids`` is the prompt followed by everything generated so far. ``num_cached`` counts
the tokens whose keys/values are already stored; the rest are fed to the next forward
(the whole prompt at prefill, the last sampled token at each decode step, or, after a
preemption, the prompt and all its output again). ``block_table[i]`` is the physical
block that holds tokens ``i*block_size .. (i+1)*block_size-1``.

In speculative mode a sequence also carries its draft (``draft``: its own copy, with whatever
state it keeps) and the tokens it proposed for the next step (``spec_tokens``), which the next
forward feeds after the last sampled token and verifies.
"""
from __future__ import annotations

import itertools
from enum import Enum, auto

from ..params import SamplingParams


class Status(Enum):
    WAITING = auto()    # no blocks: not admitted yet, or preempted
    RUNNING = auto()    # holds blocks for all its tokens
    FINISHED = auto()   # hit a stop token or max_new_tokens, or aborted; blocks returned


class Sequence:
    _ids = itertools.count()

    def __init__(self, prompt_ids, params: SamplingParams, block_size: int, sample_index: int = 0,
                 eos_token_id: int | None = None):
        """``prompt_ids``: token ids, or the ``params.CheckedRequest`` the engine made of them (then
        checked once already: its budget clamped, its stop ids resolved)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        self.request = params.request(prompt_ids, eos_token_id=eos_token_id)
        prompt_ids = self.request.prompt_token_ids
        self.id = next(Sequence._ids)
        self.token_ids = prompt_ids
        self.num_prompt_tokens = len(prompt_ids)
        self.params, self.block_size = params, block_size
        self.status = Status.WAITING
        self.block_table: list[int] = []
        # a model with sliding-window layers: their blocks, from the local pool (block_pool.WindowedBlockPool);
        # None where a block has left the window and gone back
        self.local_table: list[int | None] = []
        self.block_hashes: list[int] = []  # chained hashes of the full, computed blocks
        self.num_cached = 0
        self.sample_index = sample_index
        self.sampler = params.sampler(sample_index, self.request)  # with its history, when the settings need one
        self.watch = None  # stop.StopStrings, when the request has stop strings (the engine holds the tokenizer)
        self.finish_reason: str | None = None  # "stop", "length" or "abort", once finished
        self.num_preemptions = 0
        self.draft = None  # speculative mode: this sequence's draft
        self.spec_tokens: list[int] = []  # the draft's guesses, fed and verified by the next step
        self.gamma = 0  # how many it may guess next (SpecDecoder: γ, or less under the heuristic schedule)
        self.spec_q = None  # [γ, V] the distributions they were drawn from (None: a deterministic draft)
        self.hidden = None  # [k, D] the target's states at the k positions before the last token, not read yet
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
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def max_new_tokens(self) -> int:
        """The most tokens it may generate: its budget, clamped to the context window."""
        return self.request.max_new_tokens

    @property
    def num_uncached(self) -> int:
        """Tokens whose K/V are not stored yet: the prompt (or what is left of it), else the last sampled one."""
        return len(self) - self.num_cached

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next forward feeds: the uncached ones, then the draft's guesses."""
        return len(self) - self.num_cached + len(self.spec_tokens)

    @property
    def next_token_ids(self) -> list[int]:
        """What the next forward feeds: every token not stored yet, then the draft's guesses."""
        return self.token_ids[self.num_cached:] + self.spec_tokens

    def block_tokens(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def fork(self, sample_index: int) -> "Sequence":
        """A sibling with the same tokens and its own sampler; blocks are shared by the pool."""
        child = Sequence(self.request, self.params, self.block_size, sample_index)
        child.token_ids = list(self.token_ids)
        child.status = self.status
        child.arrival_time = self.arrival_time
        return child
