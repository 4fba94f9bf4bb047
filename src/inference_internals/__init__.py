"""Inference Internals: a small, legible LLM inference engine, one module per mechanism.

    from inference_internals import LLM, SamplingParams
    LLM().generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text

The runtime, from the door down (every request goes through one engine, one step loop):
llm            LLM: the front door, vLLM's offline LLM (the engine, with chat)
config         EngineConfig: everything the engine is told, one object; SpeculativeConfig
params         SamplingParams; check_request, the one check a request gets at the door
stop           finish_reason, the one stop rule (stop ids, stop strings, max_tokens, min_tokens)
outputs        RequestOutput, CompletionOutput, RequestMetrics: what a request gets back
serve          python -m inference_internals.serve: the OpenAI API over the engine's step loop (FastAPI)
engine/        LLMEngine (schedule -> run -> postprocess), the scheduler, the block pool (block
               tables), sequences, the model runner, speculative decoding as a step mode   (chapter 5)
model          a from-scratch Llama (SmolLM2-135M by default); nothing about speed
kv_cache/      every KV cache, one protocol: contiguous (chapter 4), paged and paged attention
               (chapter 5), static (CUDA graphs), the compiled step's view
sampling       temperature, top-k, top-p, min-p: the sampler; a request's penalties and min_tokens
logprobs       log-probabilities in vLLM's shape                                   (chapter 2)
optimize/      optimize(model), applied from outside: fused projections, the kernel switch and its
               choice by timing, the block kernels (blockdot), the compiled step   (chapter 3)
quant          int8/int4/Q4_1 weights and what they cost in quality                (chapter 3)
gguf_blocks    the GGUF file's own blocks, read from scratch                       (chapter 3)
speculative    the acceptance rule (greedy and rejection sampling), the Draft interface (chapter 6)
drafts         prompt lookup, early exit, MTP heads                                (chapter 6)
bpe            byte-level BPE: encode, decode, train, stream                       (chapter 2)
device         where to run and in which precision;  weights: the model file, found offline and cached once
timing         the one clock: synchronized, repeated, interleaved; TTFT and TPOT

The chapters' reference loops: small, readable implementations a chapter builds, each tested
token-for-token equal to the engine on the same requests, and no longer doors:
``generate.generate`` / ``generate_stream`` / ``stream_text`` (chapter 2: prefill, then the decode
loop), ``cuda_graph.generate_graphed`` (chapter 3: the step replayed from a CUDA graph),
``speculative.speculative_generate`` (chapter 6: draft, verify, accept, for one sequence).

Measuring and teaching the engine (never imported by the runtime: tests/test_layers.py):
analysis/      roofline, flops, kv_memory, step_time, tensor_parallel, moe, logit_lens, and the
               serving simulator (trace, load) and the HTTP load generator (http_load)

The course around it (exercises, widgets, figure style, listings, prompt texts) is the separate
package ``inference_course``, which imports this one; nothing here imports it.
"""
__version__ = "0.1.0"

from .config import EngineConfig, SpeculativeConfig  # noqa: E402
from .llm import LLM  # noqa: E402
from .outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from .params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "SpeculativeConfig",
           "EngineConfig"]
