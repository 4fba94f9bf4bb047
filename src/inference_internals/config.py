"""Everything an engine is told, in one place, with vLLM's names, checked once when made.

    EngineConfig(model=None, quantization="q4_1", compile=True, num_blocks=64, block_size=16,
                 speculative_config={"method": "ngram", "num_speculative_tokens": 4})

``LLM(...)`` and ``LLMEngine(...)`` take these settings as keyword arguments and make one
``EngineConfig`` of them before anything is loaded; the engine hands it whole to its model runner
(what model, how it is made fast, how a step runs) and to its scheduler (the pool and the batch).
Nothing below the door reads a loose keyword argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

import torch

from .optimize.projection import FORMATS  # quantization: optimize(weights=...)
from .params import check_int

ATTENTION = ("gather", "in_place")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")  # vLLM's names ('auto': the model's dtype)
DRAFTS = ("ngram", "early_exit", "mtp", "eagle")
SCHEDULES = ("constant", "heuristic")  # γ per verify pass: Hugging Face's num_assistant_tokens_schedule
HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # model=HF_NAME, as a vLLM script names it: the offline cache


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: which draft, and γ guesses per step. One key is not vLLM's:
    ``num_speculative_tokens_schedule``, Hugging Face's ``num_assistant_tokens_schedule`` (assisted
    generation) with its meaning: 'constant' keeps γ; 'heuristic' starts each sequence at γ and, after
    every verify pass, guesses 2 more next time if all its guesses were kept, 1 fewer (down to 1) if
    not; here never more than ``num_speculative_tokens``. ``dtype`` (not vLLM's either) is what the eagle
    layer computes in: 'auto' the target's, 'bfloat16' reads half the bytes a guess costs (a draft's
    rounding changes its guesses, never the output)."""
    method: str = "ngram"
    num_speculative_tokens: int = 4      # γ
    prompt_lookup_max: int = 2           # ngram: longest n-gram matched
    prompt_lookup_min: int = 1           # ngram: shortest n-gram worth a guess
    num_layers: int = 4                  # early_exit: target layers the draft runs
    model: str | None = None             # eagle: the trained layer's file (None: the shipped data/eagle.pt)
    num_speculative_tokens_schedule: str = "constant"  # or 'heuristic' (Hugging Face's names)
    dtype: str = "auto"                  # eagle: its layer's dtype (KV_CACHE_DTYPES' names)

    def __post_init__(self):
        if self.method not in DRAFTS:
            raise ValueError(f"unknown speculative method {self.method!r}: expected one of {DRAFTS}")
        if self.num_speculative_tokens_schedule not in SCHEDULES:
            raise ValueError(f"unknown num_speculative_tokens_schedule {self.num_speculative_tokens_schedule!r}: "
                             f"expected one of {SCHEDULES}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "num_layers"):
            check_int(name, getattr(self, name), 1)  # γ = 0 would be plain decoding with extra steps
        if self.dtype not in KV_CACHE_DTYPES or (self.dtype != "auto" and self.method != "eagle"):
            raise ValueError(f"speculative dtype is one of {KV_CACHE_DTYPES}, and only the eagle draft's layer "
                             f"takes one other than 'auto': got {self.dtype!r} for method {self.method!r}")
        if self.model is not None and (self.method != "eagle" or not isinstance(self.model, (str, os.PathLike))):
            raise ValueError(f"speculative model is the eagle draft's file (a path), got {self.model!r} "
                             f"for method {self.method!r}")

    def draft(self, model):
        """The draft these settings describe, for ``model`` (speculative.Draft)."""
        from .drafts import EagleDraft, Eagle, EarlyExitDraft, MTPDraft, MTPHeads, PromptLookupDraft
        if self.method == "ngram":
            return PromptLookupDraft(self.prompt_lookup_max, self.prompt_lookup_min)
        if self.method == "early_exit":
            if self.num_layers >= model.config.num_hidden_layers:
                raise ValueError(f"num_layers must be below the model's {model.config.num_hidden_layers}, "
                                 f"got {self.num_layers}")
            return EarlyExitDraft(model, self.num_layers)
        if self.method == "eagle":
            return EagleDraft(model, Eagle.load(model.config, self.model),
                              dtype=None if self.dtype == "auto" else getattr(torch, self.dtype))
        return MTPDraft(model, MTPHeads.load().to(model.device))


@dataclass(frozen=True)
class EngineConfig:
    # --- the model, and how it is made fast (the model runner) ---
    model: object = None                   # None (SmolLM2-135M-Instruct, offline), a checkpoint folder, or a model.Llama
    device: str | None = None              # 'cpu', 'cuda', 'mps'; None: the best here (device.get_device)
    dtype: str | None = None               # 'fp32', 'bf16', 'fp16'; None: the device's default
    optimize: bool = True                  # fused projections, the fastest kernel per weight (optimize.optimize)
    quantization: str | None = None        # vLLM's word: one of FORMATS ('q4_1': the GGUF's own blocks)
    compile: bool = False                  # the decode step compiled (vLLM compiles unless enforce_eager)
    speculative_config: SpeculativeConfig | None = None  # vLLM's name; a dict is taken too
    # --- the KV cache and the scheduler ---
    num_blocks: int | None = None          # KV blocks in the pool (vLLM: num_gpu_blocks); None: sized for each call
    block_size: int = 16                   # tokens per block
    kv_cache_dtype: str = "auto"           # what the pool stores K/V in: 'auto' (the model's dtype), 'bfloat16', 'float16'
    max_num_seqs: int = 64                 # sequences in one step
    max_num_batched_tokens: int = 2048     # tokens in one step (the chunked-prefill budget)
    enable_prefix_caching: bool = True     # full blocks shared by hash between requests
    enable_chunked_prefill: bool = False   # prompts cut into chunks that fill each step's budget
    static_reserve_tokens: int | None = None  # static batching (the baseline): tokens reserved per sequence
    watermark: float = 0.01                # share of the pool admission leaves free for running sequences
    # --- how a step runs (the model runner) ---
    packed: bool = False                   # a step as one row [1, N] of every token (vLLM's layout)
    padded_prefill: bool = False           # new prompts in one padded batch instead of one by one
    attention: str = "gather"              # 'gather' the blocks into a copy, or read them 'in_place'
    record_states: bool = False            # keep a snapshot of the pool after every step (chapter 5's viewer)

    def __post_init__(self):
        set_ = object.__setattr__
        if isinstance(self.speculative_config, dict):
            set_(self, "speculative_config", SpeculativeConfig(**self.speculative_config))
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            raise TypeError(f"speculative_config must be a SpeculativeConfig or a dict, "
                            f"got {type(self.speculative_config).__name__}")
        if self.model == HF_NAME:
            set_(self, "model", None)
        if not (self.loads_model or all(hasattr(self.model, a) for a in ("config", "device", "dtype"))):
            raise TypeError(f"model must be None, a path or a Llama, got {type(self.model).__name__}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            check_int(name, getattr(self, name), 1)
        for name in ("num_blocks", "static_reserve_tokens"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"{f.name} must be a bool, got {getattr(self, f.name)!r}")
        if self.quantization is not None and self.quantization not in FORMATS:
            raise ValueError(f"quantization must be None or one of {FORMATS}, got {self.quantization!r}")
        if self.quantization == "q4_1" and self.loads_model:  # the file's blocks, checked before it is loaded
            from .weights import gguf_source
            gguf = gguf_source(self.model)
            if gguf is not None:
                from .gguf_blocks import GGUFFile, check_q4_projections
                check_q4_projections(GGUFFile(gguf))
        if (self.quantization or self.compile) and (not self.loads_model or not self.optimize):
            raise ValueError("quantization and compile apply to a model the engine loads and optimizes itself: "
                             "pass a path (or None), or call optimize(model, weights=..., compile=...) on your Llama")
        if not self.loads_model:
            from .device import get_device, parse_dtype
            if self.device is not None and torch.device(get_device(self.device)) != self.model.device:
                raise ValueError(f"the model is on {self.model.device}, not {self.device}: move it, or pass a path")
            if self.dtype is not None and parse_dtype(self.dtype) != self.model.dtype:
                raise ValueError(f"the model is in {self.model.dtype}, not {self.dtype}")
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)) \
                or not 0 <= self.watermark < 1:
            raise ValueError(f"watermark is a fraction of the pool in [0, 1), got {self.watermark!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            fp8 = " (fp8 is not supported here)" if str(self.kv_cache_dtype).startswith("fp8") else ""
            raise ValueError(f"kv_cache_dtype is one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}{fp8}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention is one of {ATTENTION}, got {self.attention!r}")
        if self.packed and self.padded_prefill:
            raise ValueError("choose one layout: packed or padded_prefill")
        if self.attention == "in_place" and self.packed:
            raise ValueError("in-place attention runs on the padded ragged batch: use packed=False")
        if self.enable_chunked_prefill and self.static:
            raise ValueError("static batching prefills whole batches: no chunked prefill")
        if self.speculative_config is not None and self.static:
            raise ValueError("speculative decoding runs with continuous batching, not static batching")
        if self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            # every running sequence's decode token must fit in one step (vLLM checks the same)
            raise ValueError(f"with chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"must be >= max_num_seqs ({self.max_num_seqs})")

    @property
    def loads_model(self) -> bool:
        """Whether the engine loads its model (None, or a checkpoint folder) rather than being given one
        (a ``model.Llama``, or anything called as one is, with its ``config``, ``device`` and ``dtype``)."""
        return self.model is None or isinstance(self.model, (str, os.PathLike))

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

    def with_blocks(self, num_blocks: int) -> "EngineConfig":
        return replace(self, num_blocks=num_blocks)
