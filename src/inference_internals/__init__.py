"""Inference Internals: a small, legible LLM inference engine, one module per mechanism.

    from inference_internals import LLM, SamplingParams
    LLM().generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text

The front door (what a user calls):
llm           LLM.generate(prompts, SamplingParams) and LLM.chat(messages, ...) -> list[RequestOutput]
params        SamplingParams; check_request, the one check a request gets (-> CheckedRequest);
              finish_reason, the one stop rule every loop asks

The engine, bottom up:
device        where to run and in which precision
weights       the model file, found offline and cached once
model         a from-scratch Llama (SmolLM2-135M by default) and the cache protocol; nothing about speed
sampling      temperature, top-k, top-p, min-p: the sampler; a request's penalties and min_tokens
logprobs      log-probabilities in vLLM's shape                      (chapter 2)
bpe           byte-level BPE: encode, decode, train, stream        (chapter 2)
kv_cache      the contiguous KV cache (static and growing)         (chapter 4)
timing        the one clock: synchronized, repeated; TTFT and TPOT
generate      prefill, then the decode loop; chat template         (chapter 2)
speculative   draft, verify, the acceptance rule                   (chapter 6)
drafts        prompt lookup, early exit, MTP heads                 (chapter 6)
paged/        config, block pool (block tables), sequences, paged cache and attention,
              scheduler, engine; the load simulator                (chapter 5)
quant         int8/int4/Q4_1 weights and what they cost in quality (chapter 3)
gguf_blocks   the GGUF file's own blocks, read from scratch         (chapter 3)
optimize      optimize(model): fused projections, the fast kernels, the compiled step, applied from outside
cuda_graph    the decode step captured once and replayed (CUDA)    (chapter 3)
tensor_parallel  a layer split column/row over shards, and what its all-reduces move (book/production)
roofline      the machine's two ceilings and the bandwidth law     (chapter 3)
flops, kv_memory, logit_lens, moe   counting and probing the model (chapters 1, 3, 4)

The generate-like functions, and what each returns: ``LLM.generate``/``LLM.chat`` (the door, any
mode) -> ``list[RequestOutput]``; the mechanisms the chapters take apart, each for one prompt or
one equal-length batch: ``generate.generate`` -> new token ids (a list, or a list per row),
``generate.generate_stream`` -> the next ids [B] per step, ``generate.stream_text`` -> text pieces,
``cuda_graph.generate_graphed`` -> as ``generate``, ``speculative.speculative_generate`` ->
``SpecResult``, ``paged.LLMEngine.generate`` -> new token ids per prompt (n lists when n > 1).

The course around it (exercises, widgets, figure style, listings, prompt texts) is the separate
package ``inference_course``, which imports this one; nothing here imports it (tests/test_layers.py).
"""
__version__ = "0.1.0"

from .llm import LLM, CompletionOutput, RequestMetrics, RequestOutput, SpeculativeConfig  # noqa: E402
from .params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "SpeculativeConfig"]
