"""What a request gets back: vLLM's ``RequestOutput``, ``CompletionOutput`` and ``RequestMetrics``,
their names and meanings (``LLMEngine.generate`` returns one per prompt)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .logprobs import Logprob
from .timing import tpot, ttft

# vLLM's output fields these outputs leave out, and why (tests/test_vllm_fields.py walks vLLM's list).
NOT_RETURNED = {
    "RequestOutput": {
        "lora_request": "no LoRA adapters", "encoder_prompt": "decoder-only models only",
        "encoder_prompt_token_ids": "decoder-only models only",
        "num_cached_tokens": "prefix-cache hits are counted per engine (BlockPool.prefix_hits), not per request",
        "num_cache_creation_tokens": "prefix-cache writes are not counted per request",
        "prompt_token_id_logprobs": "prompt logprobs come as the top k only",
        "kv_transfer_params": "no disaggregated prefill", "ec_transfer_params": "no encoder cache transfer"},
    "CompletionOutput": {
        "routed_experts": "a dense model: no experts", "lora_request": "no LoRA adapters",
        "sampling_mask": "the sampler's kept set is not returned",
        "spec_decode_metrics": "speculative statistics are the engine's (LLMEngine.spec_stats), not an output's",
        "weight_versions": "the weights never change while serving"},
}


@dataclass
class CompletionOutput:
    index: int                 # which of the request's n samples
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (a stop id or string), "length" (max_tokens), "abort"
    stop_reason: int | str | None = None  # the stop string or stop_token_ids id that ended it (None: EOS)
    cumulative_logprob: float | None = None  # with logprobs: log p(output | prompt)
    logprobs: list[dict[int, Logprob]] | None = None  # with logprobs=k: one dict per token


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_tokens: int = 0        # generated, over all samples

    @property
    def ttft(self) -> float | None:
        """Time to first token (s): arrival to the first sampled token (``timing.ttft``)."""
        return None if self.first_token_time is None else ttft(self.arrival_time, self.first_token_time)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (s), over the request's samples (``timing.tpot``)."""
        if self.finish_time is None or self.first_token_time is None:
            return None
        return tpot(self.first_token_time, self.finish_time, self.num_tokens)


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    error: str | None = None   # why the request was aborted, if it was
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with prompt_logprobs=k; first None

    @property
    def finished(self) -> bool:
        return self.error is not None or all(o.finish_reason for o in self.outputs)
