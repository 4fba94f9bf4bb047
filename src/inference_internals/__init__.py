"""Inference Internals: a small, legible LLM inference engine, one module per mechanism.

    from inference_internals import LLM, SamplingParams
    LLM().generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text

llm           the front door: LLM.generate(prompts, SamplingParams) -> RequestOutput
params        SamplingParams, and the checks every entry point makes on a request

device        where to run and in which precision
weights       the model file, found offline and cached once
model         a from-scratch Llama (SmolLM2-135M by default)
flops         parameters, FLOPs and bytes counted from the config
logit_lens    the next-token prediction read after every layer   (chapter 1)
moe           a dense MLP split into experts, routed top-k         (chapter 1)
bpe           byte-level BPE: encode, decode, train, stream        (chapter 2)
sampling      temperature, top-k, top-p, min-p; penalties, min_tokens (chapter 2)
logprobs      log-probabilities in vLLM's shape                      (chapter 2)
generate      prefill, then decode; chat template; streaming text  (chapter 2)
roofline      the machine's two ceilings and the bandwidth law     (chapter 3)
timing        the one clock: synchronized, repeated, the engine's timers
kv_cache      the contiguous KV cache (static and growing)         (chapter 4)
kv_memory     KV-cache memory of published models                  (chapter 4)
paged/        block pool, sequences, paged cache, scheduler, engine (chapter 5)
speculative   draft, verify, accept                                (chapter 6)
drafts        prompt lookup, early exit, MTP heads                 (chapter 6)
optimize      Llama.optimize(): fused projections, kernel choice, compiled step
cuda_graph    the decode step captured once and replayed (CUDA)    (chapter 3)
tensor_parallel  a layer split column/row over shards; all-reduce traffic (book/production)

The course around it (exercises, widgets, figure style, listings, prompt texts) is the separate
package ``inference_course``, which imports this one; nothing here imports it.
"""
__version__ = "0.1.0"

from .llm import LLM, CompletionOutput, RequestMetrics, RequestOutput, SpeculativeConfig  # noqa: E402
from .params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "SpeculativeConfig"]
