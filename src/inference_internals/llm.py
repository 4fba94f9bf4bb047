"""The front door: vLLM's offline ``LLM``, over the one engine.

    from inference_internals import LLM, SamplingParams
    llm = LLM()                                    # SmolLM2-135M-Instruct, on the best device
    outs = llm.generate(["The capital of France is", "1, 2, 3,"], SamplingParams(temperature=0, max_tokens=16))
    outs[0].outputs[0].text, outs[0].metrics.ttft

``LLM`` is ``engine.LLMEngine`` (as nano-vllm's is), with ``chat``: every request, one prompt or many,
plain or speculative, runs through the engine's one scheduler and step loop. Names, defaults and
meanings follow vLLM (``LLM``, ``SamplingParams``, ``RequestOutput``, ``CompletionOutput``,
``speculative_config``'s keys): a script written for vLLM's offline ``LLM`` runs here with its import
line changed. Every setting is ``config.EngineConfig``'s, checked before the model is loaded:

    LLM(model=None | path | Llama, tokenizer=None, device=None, dtype=None, quantization=None, compile=False,
        speculative_config=None | {"method": "ngram" | "early_exit" | "mtp" | "eagle", "num_speculative_tokens": γ, ...},
        num_blocks=None, block_size=16, max_num_seqs=64, packed=False, ...)

A model ``LLM`` loads itself is made fast first (``optimize``: fused projections, the fastest kernel
per weight here) unless ``optimize=False``; ``quantization`` ('int8', 'q8_0', 'int4', 'int8_asym' or
'q4_1', vLLM's word) quantizes its projections ('q4_1': the GGUF's own formats, the bytes llama.cpp
reads, multiplied by the block kernels where the CPU has AVX-512 VNNI), and ``compile=True`` compiles
its decode steps, one sequence's and a batch's (a minute or more on the first of each). A ``Llama`` passed in is used as it is.
"""
from __future__ import annotations

from .config import HF_NAME, SpeculativeConfig  # noqa: F401  (the door's names, as vLLM's are)
from .engine.llm_engine import LLMEngine
from .generate import chat_prompt
from .logprobs import Logprob  # noqa: F401  (the type of the logprobs' values)
from .outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: F401


class LLM(LLMEngine):
    """``LLM(model=None, tokenizer=None, **settings)``: see the module's docstring."""

    def chat(self, messages, sampling_params=None) -> list[RequestOutput]:
        """``generate`` on one conversation ([{"role", "content"}, ...]) or a list of them, each in the
        model's chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self.generate([chat_prompt(m) for m in convs], sampling_params)
