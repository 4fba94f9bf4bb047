"""How a step runs: the model, its KV pool, and the layout of each forward pass.

The scheduler decides *what* runs (which sequences, how many tokens each); the runner decides *how*,
from the config and the batch in front of it, and returns each sequence's next-token logits:

- one sequence (a lone request, a prompt run on its own): a ``PagedBatch`` of one row. On a model
  optimized with ``compile=True`` its decode steps and speculative verify passes then run the compiled
  graph (``optimize.compiled_step``), which reads the sequence's blocks in place through its table;
- several, each one new token (a decode step), on a compiled model and not ``packed``: the compiled
  batch graph, each row reading its own blocks through its table;
- several, ``packed=True`` (vLLM's layout): every sequence's new tokens end to end in one row [1, N],
  prompts and decodes in one pass, the LM head only where logits are needed;
- several, otherwise: a padded ragged batch [B, longest] (``padded``), except that new prompts run one
  by one unless ``padded_prefill=True``.

A sequence that feeds a speculative step's guesses (``spec_tokens``) gets logits at each of them and at
the token before them (γ + 1 rows); every other sequence gets the logits after its last token. A draft
that reads the target's hidden states (``Draft.needs_hidden``) gets them at every position fed: EAGLE's
layer reads them all, the prompt's too.

A forward over several sequences that fails is run again one sequence at a time, so that only the
sequence that causes the error loses its step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..kv_cache.paged import PagedBatch, PagedKVCache
from ..kv_cache.paged_attention import InPlaceBatch
from .sequence import Sequence


def quantization_args(quantization: str | None, device) -> dict:
    """The ``optimize`` arguments of ``quantization=...`` beside ``weights``. 'q4_1' is the file's
    own formats: its Q4_1 layers and a Q8_0 LM head (the GGUF's format for the tied embedding; its
    scales rounded up to bf16 numbers, so the head's values are near the file's, not all equal).
    'q4_1' and 'int8_asym' (whose grid holds the file's Q4_1 blocks) go through the block kernels
    (blockdot.py) on a CPU that runs them: their activations rounded to two int8 codes, which keeps
    the model's next token where bf16 activations move it; elsewhere, and for the other formats,
    the fastest of torch's kernels per kind of weight (``quant_kernel='auto'``). ``make bench``
    measures the choice: decode tok/s beside llama.cpp (its quantized section), and top-1
    agreement with fp32 (its quality section)."""
    from ..optimize import blockdot

    if quantization not in ("q4_1", "int8_asym"):
        return {}
    kernels = "auto"
    if torch.device(device).type == "cpu" and blockdot.available() is None:
        kernels = {"int4" if quantization == "q4_1" else "int8_asym": "vnni", "q8_0": "vnni"}
    return {"head": "q8_0", "quant_kernel": kernels}


def load_model(config: EngineConfig):
    """The model ``config`` names: a ``Llama`` given is used as it is; one loaded here (the offline
    SmolLM2 by default, or a checkpoint folder) is made fast first (``optimize``: fused projections, the
    fastest kernel per weight here, ``quantization`` and ``compile`` as asked) unless ``optimize=False``."""
    from ..device import get_device, parse_dtype
    from ..model import Llama
    from ..optimize import optimize
    from ..weights import gguf_source

    if not config.loads_model:
        return config.model
    device = get_device(config.device)
    model = Llama.from_pretrained(config.model, device=device, dtype=parse_dtype(config.dtype, device))
    if config.optimize:
        gguf = gguf_source(config.model) if config.quantization == "q4_1" else None
        optimize(model, weights=config.quantization, compile=config.compile, gguf=gguf,
                 **quantization_args(config.quantization, device))
    return model


@dataclass
class StepOutput:
    """What one sequence's forward gave: the logits it needs [k, vocab] (fp32), and, when a draft reads
    them, the final hidden states at every position it fed [n, hidden]."""
    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, config: EngineConfig, needs_hidden: bool = False):
        self.config, self.needs_hidden = config, needs_hidden
        self.model = load_model(config)
        self.view = InPlaceBatch if config.attention == "in_place" else PagedBatch
        self.cache: PagedKVCache | None = None  # the pool: ``allocate`` makes it

    def allocate(self, num_blocks: int, num_local_blocks: int | None = None) -> None:
        """The K/V pool, for ``num_blocks`` blocks of ``block_size`` tokens in every layer (every full-attention
        layer, with ``num_local_blocks`` for the sliding-window layers' own storage)."""
        dtype = None if self.config.kv_cache_dtype == "auto" else self.config.kv_cache_dtype
        self.cache = PagedKVCache.for_model(self.model, num_blocks, self.config.block_size, num_local_blocks, dtype)

    def _local_tables(self, seqs):
        return [s.local_table for s in seqs] if self.cache.has_local else None

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], num_fed: list[int], is_prefill: bool) -> list[StepOutput | Exception]:
        """Each sequence fed its next ``num_fed`` tokens; its ``StepOutput``, or the exception its forward raised."""
        pairs = list(zip(seqs, num_fed))
        if len(pairs) > 1 and self.config.packed:
            forward, groups = self._packed, [pairs]
        else:
            forward = self._padded
            alone = len(pairs) == 1 or (is_prefill and not self.config.padded_prefill)
            groups = [[p] for p in pairs] if alone else [pairs]
        outs = []
        for group in groups:
            try:
                outs += forward(*zip(*group))
            except Exception as e:
                outs += [e] if len(group) == 1 else [self._alone(forward, *p) for p in group]
        return outs

    @staticmethod
    def _alone(forward, seq: Sequence, n: int):
        try:
            return forward([seq], [n])[0]
        except Exception as e:
            return e

    def _padded(self, seqs, num_fed) -> list[StepOutput]:
        """A ragged batch padded to its longest row, each row's last token repeating at its last
        position (paged.py): the pads' outputs equal the last real token's, never stored."""
        T = max(num_fed)
        fed = [s.next_token_ids[:n] for s, n in zip(seqs, num_fed)]
        ids = [row + [row[-1]] * (T - len(row)) for row in fed]
        wants = [1 + len(s.spec_tokens) for s in seqs]
        view = self.view(self.cache, [s.block_table for s in seqs], [s.num_cached for s in seqs], list(num_fed),
                         self._local_tables(seqs))
        last_only = all(k == 1 for k in wants)
        # No positions passed: the view knows where each row continues from.
        out = self.model(torch.tensor(ids, device=self.model.device), cache=view, last_only=last_only,
                         output_hidden_states=self.needs_hidden)
        logits, hidden = out if self.needs_hidden else (out, None)
        states = [None if hidden is None else hidden[-1][b, :n] for b, n in enumerate(num_fed)]
        if last_only:
            return [StepOutput(logits[b, -1:].float(), states[b]) for b in range(len(seqs))]
        return [StepOutput(logits[b, n - k:n].float(), states[b]) for b, (n, k) in enumerate(zip(num_fed, wants))]

    def _packed(self, seqs, num_fed) -> list[StepOutput]:
        """Every row's fed tokens in one row, the LM head only at the positions each one needs."""
        ids = [t for s, n in zip(seqs, num_fed) for t in s.next_token_ids[:n]]
        view = self.cache.packed([s.block_table for s in seqs], [s.num_cached for s in seqs], list(num_fed),
                                 self._local_tables(seqs))
        wants = [1 + len(s.spec_tokens) for s in seqs]
        at, end = [], -1
        for n, k in zip(num_fed, wants):
            end += n
            at += range(end - k + 1, end + 1)
        idx = torch.tensor(at, device=self.model.device)
        out = self.model(torch.tensor([ids], device=self.model.device), cache=view, logits_at=idx,
                         output_hidden_states=self.needs_hidden)
        logits, hidden = out if self.needs_hidden else (out, None)
        rows, start, first = [], 0, 0
        for n, k in zip(num_fed, wants):
            h = None if hidden is None else hidden[-1][0, first:first + n]
            rows.append(StepOutput(logits[0, start:start + k].float(), h))
            start, first = start + k, first + n
        return rows
