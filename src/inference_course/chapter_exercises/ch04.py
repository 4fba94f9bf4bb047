"""Chapter 4 exercises: KV-cache memory and cost. Every expected answer is computed from
the published configs in ``kv_memory`` and the FLOP counts in ``flops``."""
from __future__ import annotations

from ..exercises import Exercise, integer, number
from inference_internals.analysis.flops import generation_flops
from inference_internals.analysis.kv_memory import GB, PUBLISHED_CONFIGS, bytes_per_token, kv_bytes, max_batch, weight_bytes
from inference_internals.model import LlamaConfig

LLAMA8, LLAMA70 = PUBLISHED_CONFIGS["Llama-3-8B"], PUBLISHED_CONFIGS["Llama-3-70B"]
QWEN, DEEPSEEK = PUBLISHED_CONFIGS["Qwen2.5-7B"], PUBLISHED_CONFIGS["DeepSeek-V3"]

# 1. Largest batch at 32k context on an 80 GB GPU, bf16 weights included.
CONTEXT, GPU = 32768, 80 * GB
batch_answer = max_batch(LLAMA8, CONTEXT, GPU, bytes_per_value=2, bytes_per_param=2)
max_batch_exercise = Exercise(
    title="The largest batch at 32k context",
    prompt=(f"Llama-3-8B ({LLAMA8.layers} layers, {LLAMA8.kv_heads} KV heads, head_dim {LLAMA8.head_dim}, "
            f"{LLAMA8.params:,} parameters) serves requests of {CONTEXT:,} tokens each on one 80 GB GPU "
            "(80 × 10⁹ bytes). Weights and cache are both bf16. **Weights included**, activations "
            "ignored: how many sequences fit at once?"),
    check=integer(batch_answer),
    hint="Subtract the weights (2 bytes per parameter) first, then divide by one sequence's cache: "
         "2 × layers × kv_heads × head_dim × tokens × 2 bytes. Round down.",
    solution=(f"Weights: {weight_bytes(LLAMA8) / GB:.2f} GB. One sequence: 2 × {LLAMA8.layers} × "
              f"{LLAMA8.kv_heads} × {LLAMA8.head_dim} × {CONTEXT:,} × 2 B = "
              f"{kv_bytes(LLAMA8, CONTEXT) / GB:.3f} GB. "
              f"⌊({GPU / GB:.0f} − {weight_bytes(LLAMA8) / GB:.2f}) / {kv_bytes(LLAMA8, CONTEXT) / GB:.3f}⌋ "
              f"= **{batch_answer}** (without the weights it would be "
              f"{max_batch(LLAMA8, CONTEXT, GPU, bytes_per_param=None)}).\n\n"
              "```python\nkv_memory.max_batch(PUBLISHED_CONFIGS['Llama-3-8B'], 32768, 80e9)\n```"),
    placeholder="a whole number",
)

# 2. GQA (8 KV heads) vs MHA (64 heads) for Llama-3-70B.
GQA_CONTEXT = 8192
mha70 = LLAMA70.with_kv_heads(LLAMA70.q_heads)
saved_gb = (kv_bytes(mha70, GQA_CONTEXT) - kv_bytes(LLAMA70, GQA_CONTEXT)) / GB
gqa_saving_exercise = Exercise(
    title="What grouped-query attention saves",
    prompt=(f"Llama-3-70B has {LLAMA70.q_heads} query heads but only {LLAMA70.kv_heads} K/V heads "
            f"({LLAMA70.layers} layers, head_dim {LLAMA70.head_dim}). For one sequence of "
            f"{GQA_CONTEXT:,} tokens in bf16, how many GB (10⁹ bytes) of KV cache does GQA save "
            f"compared with plain multi-head attention ({LLAMA70.q_heads} K/V heads)?"),
    check=number(saved_gb, rel=0.01, unit="GB"),
    hint="Compute the cache twice, once with 64 and once with 8 K/V heads, and subtract. "
         "The ratio between them is 64 / 8.",
    solution=(f"MHA: {kv_bytes(mha70, GQA_CONTEXT) / GB:.2f} GB; GQA: "
              f"{kv_bytes(LLAMA70, GQA_CONTEXT) / GB:.2f} GB; saved **{saved_gb:.2f} GB** "
              f"({LLAMA70.q_heads // LLAMA70.kv_heads}× less).\n\n"
              "```python\nspec = PUBLISHED_CONFIGS['Llama-3-70B']\n"
              "(kv_bytes(spec.with_kv_heads(64), 8192) - kv_bytes(spec, 8192)) / 1e9\n```"),
    placeholder="GB, e.g. 12.3",
)

# 3. Bytes per token of Qwen2.5-7B.
qwen_bytes = int(bytes_per_token(QWEN, 2))
bytes_per_token_exercise = Exercise(
    title="Bytes per token",
    prompt=(f"Qwen2.5-7B: {QWEN.layers} layers, {QWEN.q_heads} query heads, {QWEN.kv_heads} K/V heads, "
            f"head_dim {QWEN.head_dim}. How many bytes of KV cache does each token add, in bf16?"),
    check=integer(qwen_bytes),
    hint="K and V (×2), for every layer, for every K/V head (not query head), head_dim values each, "
         "2 bytes per value.",
    solution=(f"2 × {QWEN.layers} × {QWEN.kv_heads} × {QWEN.head_dim} × 2 = **{qwen_bytes:,} bytes** "
              f"({qwen_bytes / 1024:.0f} KiB) per token."),
    placeholder="bytes",
)

# 4. MLA vs MHA for DeepSeek-V3.
mla_ratio = bytes_per_token(DEEPSEEK.with_kv_heads(DEEPSEEK.q_heads)) / bytes_per_token(DEEPSEEK)
mla_exercise = Exercise(
    title="Multi-head latent attention",
    prompt=(f"DeepSeek-V3 ({DEEPSEEK.layers} layers) caches, per token and layer, one compressed "
            f"vector of {DEEPSEEK.latent} values (a 512-value latent plus a 64-value RoPE key) instead "
            f"of per-head keys and values. How many times smaller is that than MHA with "
            f"{DEEPSEEK.q_heads} heads of head_dim {DEEPSEEK.head_dim}?"),
    check=number(mla_ratio, rel=0.01),
    hint="Per token and layer: MHA stores 2 × heads × head_dim values, MLA stores 576. "
         "The layer count cancels.",
    solution=(f"2 × {DEEPSEEK.q_heads} × {DEEPSEEK.head_dim} / {DEEPSEEK.latent} = **{mla_ratio:.1f}×**."),
    placeholder="a ratio, e.g. 4.5",
)

# 5. Uncached vs cached FLOPs for a generation on our model.
PROMPT, NEW = 32, 256
_cfg = LlamaConfig()
flops_ratio = sum(generation_flops(_cfg, PROMPT, NEW, cached=False)) / sum(generation_flops(_cfg, PROMPT, NEW, cached=True))
flops_ratio_exercise = Exercise(
    title="The price of no cache",
    prompt=(f"SmolLM2-135M generates {NEW} tokens after a {PROMPT}-token prompt. Counting matmul FLOPs "
            "with `flops.generation_flops` (full logits at every position), how many times more FLOPs "
            "does decoding **without** a KV cache cost than decoding with one?"),
    check=number(flops_ratio, rel=0.02),
    hint="Without a cache step i runs the whole sequence of prompt + i tokens; with one, it runs one "
         "token. Sum both lists: about (new·prompt + new²/2) / (prompt + new) when the per-token "
         "cost dominates.",
    solution=(f"**{flops_ratio:.0f}×**.\n\n```python\ncfg = LlamaConfig()\n"
              f"sum(generation_flops(cfg, {PROMPT}, {NEW}, cached=False)) / "
              f"sum(generation_flops(cfg, {PROMPT}, {NEW}, cached=True))\n```"),
    placeholder="a ratio",
)

EXERCISES = [max_batch_exercise, gqa_saving_exercise, bytes_per_token_exercise, mla_exercise,
             flops_ratio_exercise]
