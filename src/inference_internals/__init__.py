"""Inference Internals: a small, legible LLM inference engine, one module per mechanism.

device      where to run and in which precision
weights     the model file, found offline and cached once
model       a from-scratch Llama (SmolLM2-135M by default)
kv_cache    the contiguous KV cache
generate    prefill, then decode
exercises   the course's exercise framework
"""
__version__ = "0.1.0"
