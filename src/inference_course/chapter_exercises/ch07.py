"""Chapter 7 exercises: what Gemma 3 270M's shape does to memory and bandwidth. Every expected
answer is computed from the model's own config (``config.json`` of the offline checkpoint) and
``kv_memory.windowed_kv_bytes``."""
from __future__ import annotations

from ..exercises import Exercise, integer, number
from inference_internals.analysis.kv_memory import windowed_kv_bytes
from inference_internals.model import LlamaConfig
from inference_internals.weights import model_dir

CFG = LlamaConfig.from_json(model_dir("gemma-3-270m") / "config.json")
LOCAL = len(CFG.windowed_layers)
GLOBAL = CFG.num_hidden_layers - LOCAL

# 1. The windowed cache at 32k tokens.
CONTEXT = 32768
windowed_mb = windowed_kv_bytes(CFG, CONTEXT, bytes_per_value=2) / 1e6
windowed_exercise = Exercise(
    title="The cache with a window",
    prompt=(f"Gemma 3 270M has {CFG.num_hidden_layers} layers: {LOCAL} local ones that keep the last "
            f"{CFG.sliding_window} positions and {GLOBAL} global ones that keep every position, each with "
            f"{CFG.num_key_value_heads} K/V head of size {CFG.head_dim}. In bf16, how many MB (10⁶ bytes) "
            f"does one sequence's KV cache hold at {CONTEXT:,} tokens?"),
    check=number(windowed_mb, rel=0.01, unit="MB"),
    hint="Keys and values: 2 × heads × head_dim × 2 bytes per position and layer. The global layers "
         "hold every position, the local ones only their window.",
    solution=(f"2 × {CFG.num_key_value_heads} × {CFG.head_dim} × 2 B × ({GLOBAL} × {CONTEXT:,} + {LOCAL} × "
              f"{CFG.sliding_window}) = **{windowed_mb:.1f} MB** (every layer full: "
              f"{windowed_kv_bytes(CFG, CONTEXT, bytes_per_value=2, ring=CONTEXT) / 1e6:.1f} MB).\n\n"
              "```python\nkv_memory.windowed_kv_bytes(cfg, 32768, bytes_per_value=2) / 1e6\n```"),
    placeholder="MB, e.g. 123.4",
)

# 2. The tied LM head's bytes per decode step.
head_mb = CFG.vocab_size * CFG.hidden_size * 2 / 1e6
head_exercise = Exercise(
    title="What the LM head reads",
    prompt=(f"The LM head is tied to the embedding: {CFG.vocab_size:,} × {CFG.hidden_size}. In bf16, how "
            "many MB (10⁶ bytes) of it does **one** decode step read? (The embedding lookup reads one row "
            "of the same table.)"),
    check=number(head_mb, rel=0.01, unit="MB"),
    hint="Every logit is a dot product with one row of the head: the step reads all of it, 2 bytes a number.",
    solution=f"{CFG.vocab_size:,} × {CFG.hidden_size} × 2 B = **{head_mb:.1f} MB**, every token.",
    placeholder="MB",
)

# 3. Positions a local layer keeps.
LONG = 2000
kept = min(LONG, CFG.sliding_window)
kept_exercise = Exercise(
    title="What a local layer keeps",
    prompt=(f"After {LONG:,} tokens, how many positions does one local layer of Gemma 3 270M keep in its "
            "cache (without any slack for rolling back)?"),
    check=integer(kept),
    hint="A local layer's query sees only the last `sliding_window` positions, itself included.",
    solution=f"min({LONG:,}, {CFG.sliding_window}) = **{kept}**: the ring holds its window, however long the text.",
    placeholder="a whole number",
)

EXERCISES = [windowed_exercise, head_exercise, kept_exercise]
