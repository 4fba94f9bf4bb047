"""How much memory a KV cache needs, for our model and for published ones.

Every layer stores, for every token of every sequence, one key and one value vector per
K/V head:  bytes = 2 x layers x kv_heads x head_dim x tokens x batch x bytes_per_value.
Grouped-query attention (GQA) shrinks it by sharing each K/V head among several query heads;
multi-head latent attention (MLA, DeepSeek) caches one compressed vector per token and layer
instead of per-head K and V.

``PUBLISHED_CONFIGS`` holds the numbers from each model's released config, with a link.
Memory sizes are in bytes; "GB" means 10**9 bytes throughout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .flops import param_counts
from ..model import LlamaConfig

GB = 10**9
GPUS = {"24 GB (RTX 4090, L4)": 24 * GB, "80 GB (A100, H100)": 80 * GB, "141 GB (H200)": 141 * GB}
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """The numbers that size a KV cache (and the weights beside it)."""
    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    params: int          # total parameters, for the weights' memory
    source: str          # where the numbers come from
    latent: int = 0      # MLA: values cached per token per layer (kv_lora_rank + rope dim); 0 = per-head K/V

    @property
    def attention(self) -> str:
        if self.latent:
            return "MLA"
        return "MHA" if self.kv_heads == self.q_heads else "MQA" if self.kv_heads == 1 else "GQA"

    def with_kv_heads(self, kv_heads: int) -> "ModelSpec":
        """The same model with per-head K/V and ``kv_heads`` of them (q_heads = MHA, 1 = MQA)."""
        if not 1 <= kv_heads <= self.q_heads or self.q_heads % kv_heads:
            raise ValueError(f"kv_heads must divide the {self.q_heads} query heads, got {kv_heads}")
        spec = replace(self, kv_heads=kv_heads, latent=0)
        return replace(spec, name=f"{self.name} as {spec.attention} ({kv_heads} KV heads)")


def spec_from_config(cfg: LlamaConfig, name: str, source: str) -> ModelSpec:
    """A Llama-family config (our ``LlamaConfig``) as a ``ModelSpec``; parameters counted from it."""
    return ModelSpec(name, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                     cfg.head_dim, sum(param_counts(cfg).values()), source)


def _llama(name, source, layers, hidden, heads, kv_heads, intermediate, vocab, tied=False):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=hidden // heads, tie_word_embeddings=tied)
    return spec_from_config(cfg, name, source)


_HF = "https://huggingface.co/{}/blob/main/config.json"
PUBLISHED_CONFIGS: dict[str, ModelSpec] = {s.name: s for s in [
    spec_from_config(LlamaConfig(), "SmolLM2-135M", _HF.format("HuggingFaceTB/SmolLM2-135M-Instruct")),
    _llama("Llama-3-8B", _HF.format("meta-llama/Meta-Llama-3-8B"),
           layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    _llama("Llama-3-70B", _HF.format("meta-llama/Meta-Llama-3-70B"),
           layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=128256),
    # Mistral 7B v0.1 also has a 4096-token sliding window; a rolling-buffer cache would stop
    # growing there (https://arxiv.org/abs/2310.06825). We size the full cache.
    _llama("Mistral-7B-v0.1", _HF.format("mistralai/Mistral-7B-v0.1"),
           layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
    # Qwen2's q/k/v biases (0.13M parameters) are left out of the count.
    _llama("Qwen2.5-7B", _HF.format("Qwen/Qwen2.5-7B"),
           layers=28, hidden=3584, heads=28, kv_heads=4, intermediate=18944, vocab=152064),
    # MLA caches the compressed KV (kv_lora_rank 512) plus the shared RoPE key (qk_rope_head_dim 64)
    # per token and layer. 128 heads of dim 128 would be its MHA equivalent (DeepSeek-V2 paper,
    # https://arxiv.org/abs/2405.04434, table 1). 671B parameters: DeepSeek-V3 report,
    # https://arxiv.org/abs/2412.19437 (the main model, without the MTP module).
    ModelSpec("DeepSeek-V3", layers=61, q_heads=128, kv_heads=128, head_dim=128, params=671 * 10**9,
              source=_HF.format("deepseek-ai/DeepSeek-V3"), latent=512 + 64),
]}


def values_per_token(spec: ModelSpec) -> int:
    """Numbers cached per token over all layers: K and V per head, or MLA's one latent."""
    per_layer = spec.latent if spec.latent else 2 * spec.kv_heads * spec.head_dim
    return spec.layers * per_layer


def bytes_per_token(spec: ModelSpec, bytes_per_value: float = 2) -> float:
    return values_per_token(spec) * bytes_per_value


def kv_bytes(spec: ModelSpec, context: int, batch: int = 1, bytes_per_value: float = 2) -> float:
    """Bytes of the KV cache for ``batch`` sequences of ``context`` tokens each."""
    if context < 0 or batch < 0:
        raise ValueError(f"context and batch must be >= 0, got {context}, {batch}")
    return bytes_per_token(spec, bytes_per_value) * context * batch


def weight_bytes(spec: ModelSpec, bytes_per_param: float = 2) -> float:
    return spec.params * bytes_per_param


def max_batch(spec: ModelSpec, context: int, gpu_bytes: float, bytes_per_value: float = 2,
              bytes_per_param: float | None = 2) -> int:
    """Most sequences of ``context`` tokens whose cache fits in ``gpu_bytes``.

    The weights take their share first (``bytes_per_param=None`` leaves them out); activations
    and the framework's own overhead are ignored, so real engines fit somewhat fewer.
    """
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    free = gpu_bytes - (weight_bytes(spec, bytes_per_param) if bytes_per_param else 0)
    return max(0, math.floor(free / kv_bytes(spec, context, 1, bytes_per_value)))


def windowed_kv_bytes(cfg: LlamaConfig, context: int, batch: int = 1, bytes_per_value: float = 2,
                      ring: int | None = None) -> float:
    """Bytes of the KV cache of a model with sliding-window layers (Gemma 3): a full-attention layer
    keeps every token, a sliding layer at most ``ring`` (default: its window):
    2 x kv_heads x head_dim x bytes x batch x (full layers x context + sliding layers x min(context, ring)).
    Without sliding layers it is ``kv_bytes`` of the config."""
    if context < 0 or batch < 0:
        raise ValueError(f"context and batch must be >= 0, got {context}, {batch}")
    local = len(cfg.windowed_layers)
    kept = min(context, cfg.sliding_window if ring is None else ring) if local else 0
    per_token_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * bytes_per_value * batch
    return per_token_layer * ((cfg.num_hidden_layers - local) * context + local * kept)
