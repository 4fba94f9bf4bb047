"""Inference Internals: a small, legible LLM inference engine, one module per mechanism.

device        where to run and in which precision
weights       the model file, found offline and cached once
model         a from-scratch Llama (SmolLM2-135M by default)
flops         parameters, FLOPs and bytes counted from the config
logit_lens    the next-token prediction read after every layer   (chapter 1)
moe           a dense MLP split into experts, routed top-k         (chapter 1)
bpe           byte-level BPE: encode, decode, train, stream        (chapter 2)
sampling      temperature, top-k, top-p, min-p                     (chapter 2)
generate      prefill, then decode; chat template; streaming text  (chapter 2)
hardware      the machine's ceilings and the bandwidth law         (chapter 3)
kv_cache      the contiguous KV cache (static and growing)         (chapter 4)
kv_memory     KV-cache memory of published models                  (chapter 4)
paged/        block pool, sequences, paged cache, scheduler, engine (chapter 5)
speculative   draft, verify, accept                                (chapter 6)
drafts        prompt lookup, early exit, MTP heads                 (chapter 6)
train_mtp     trains the MTP heads on the model's own generations  (chapter 6)
fast          a decode-optimised runner on the same weights        (benchmarks)
exercises     the course's exercise framework
plotting      one figure style for the book, and a legibility check
listing       source listings for the chapters, long ones folded
"""
__version__ = "0.1.0"
