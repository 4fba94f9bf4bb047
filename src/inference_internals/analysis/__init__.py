"""Measuring and teaching the model and the engine: what the chapters count, time and simulate.

roofline         the machine's two ceilings and the bandwidth law                  (chapter 3)
flops            FLOPs and bytes per token, by part of the model                   (chapters 1, 3)
kv_memory        the KV cache's bytes per token, for published model configs       (chapter 4)
step_time        where a decode step's time goes, projection by projection         (chapter 3)
tensor_parallel  a layer split column/row over shards, and what its all-reduces move (book/production)
moe              a mixture-of-experts MLP, and the FLOPs it saves                   (chapter 1)
logit_lens       what each layer would predict, read through the LM head           (chapter 1)
trace, load      seeded request traces and the serving simulator: arrivals, a fitted step cost,
                 latency percentiles against request rate                          (chapter 5)

The runtime (``llm``, ``engine``, ``kv_cache``, ``optimize`` ...) never imports this package
(tests/test_layers.py): it reads the engine, the engine does not read it.
"""
