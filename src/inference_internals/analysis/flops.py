"""Counting parameters, FLOPs and bytes from the config alone.

A matrix multiply of [m, k] by [k, n] costs 2*m*k*n FLOPs (a multiply and an add per term)
and must at least read both operands and write the result once. These counts are what the
chapters compare their measurements against: the parameter table (chapter 1), the roofline
(chapter 3) and the O(n^2) vs O(n) cost of decoding without and with a KV cache (chapter 4).
Elementwise work (norms, RoPE, SiLU, softmax) is counted in bytes, not FLOPs: it is tiny
next to the matmuls.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model import LlamaConfig

COMPONENTS = ("embedding", "attention", "mlp", "norms", "lm_head")


def param_counts(cfg: LlamaConfig) -> dict[str, int]:
    """Parameters per component; a tied LM head owns none (it reuses the embedding)."""
    d, hd, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return {
        "embedding": cfg.vocab_size * d,
        "attention": L * (d * q + 2 * d * kv + q * d),
        "mlp": L * 3 * d * cfg.intermediate_size,
        "norms": (2 * L + 1) * d,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * d,
    }


def flops_per_token(cfg: LlamaConfig, context: int = 1) -> dict[str, int]:
    """Forward FLOPs for one token that attends to ``context`` tokens (itself included)."""
    d, hd, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    projections = 2 * (d * q + 2 * d * kv + q * d)
    scores_and_mix = 2 * 2 * q * context  # q.k over the context, then the weighted sum of v
    return {
        "embedding": 0,  # a table lookup
        "attention": L * (projections + scores_and_mix),
        "mlp": L * 2 * 3 * d * cfg.intermediate_size,
        "norms": 0,
        "lm_head": 2 * d * cfg.vocab_size,
    }


def sequence_flops(cfg: LlamaConfig, n_tokens: int) -> int:
    """FLOPs of one causal forward over ``n_tokens`` (token t attends to t+1 tokens)."""
    return sum(sum(flops_per_token(cfg, t + 1).values()) for t in range(n_tokens))


def generation_flops(cfg: LlamaConfig, prompt_len: int, new_tokens: int, cached: bool,
                     last_only: bool = False) -> list[int]:
    """FLOPs of each step that produces one new token.

    Step 0 is the prompt's forward either way. After it, a cached step feeds 1 token that
    attends to everything before it (O(n)); an uncached step re-runs the whole sequence (O(n^2)).
    ``last_only``: the LM head runs on the last position only (``Llama(..., last_only=True)``).
    """
    if prompt_len < 1 or new_tokens < 0:
        raise ValueError("need prompt_len >= 1 and new_tokens >= 0")
    head = 2 * cfg.hidden_size * cfg.vocab_size
    steps = []
    for i in range(new_tokens):
        n = prompt_len + i  # sequence length fed at this step
        if i == 0 or not cached:
            steps.append(sequence_flops(cfg, n) - (head * (n - 1) if last_only else 0))
        else:
            steps.append(sum(flops_per_token(cfg, n).values()))
    return steps


@dataclass(frozen=True)
class Op:
    """One kernel of a forward pass: its FLOPs and the bytes it must move at the least."""
    name: str
    component: str
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: above the machine's FLOP/s ÷ bytes/s it is compute-bound."""
        return self.flops / self.bytes


def forward_ops(cfg: LlamaConfig, new_tokens: int, past: int = 0, batch: int = 1,
                weight_bytes: int = 4, act_bytes: int = 4) -> list[Op]:
    """The ops of one forward over ``new_tokens`` per sequence after ``past`` cached ones.

    Prefill is ``new_tokens = prompt length, past = 0``; a decode step is ``new_tokens = 1``.
    Repeated layers are listed once with their totals multiplied by the layer count.
    """
    if new_tokens < 1 or past < 0 or batch < 1:
        raise ValueError("need new_tokens >= 1, past >= 0, batch >= 1")
    d, hd, L, I = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    m = batch * new_tokens  # rows fed through every weight matrix

    def linear(name, comp, k, n, layers=L):
        return Op(name, comp, layers * 2 * m * k * n,
                  layers * (weight_bytes * k * n + act_bytes * m * (k + n)))

    ctx = past + new_tokens
    # Causal attention: query i sees past + i + 1 keys; summed over the new tokens.
    pairs = batch * (new_tokens * past + new_tokens * (new_tokens + 1) // 2)
    attn = Op("attention (QK^T, softmax, ·V)", "attention", L * 2 * 2 * q * pairs,
              L * act_bytes * (2 * batch * kv * ctx + 2 * m * q))
    return [
        linear("q_proj", "attention", d, q),
        linear("k_proj", "attention", d, kv),
        linear("v_proj", "attention", d, kv),
        attn,
        linear("o_proj", "attention", q, d),
        linear("gate_proj", "mlp", d, I),
        linear("up_proj", "mlp", d, I),
        linear("down_proj", "mlp", I, d),
        linear("lm_head", "lm_head", d, cfg.vocab_size, layers=1),
    ]


def weight_bytes_per_token(cfg: LlamaConfig, bytes_per_param: float) -> float:
    """Bytes of weights a batch-1 decode step must read: every matrix once (the embedding row
    lookup is negligible, but a tied LM head reads the full embedding matrix)."""
    p = param_counts(cfg)
    read = p["attention"] + p["mlp"] + p["norms"] + cfg.vocab_size * cfg.hidden_size
    return read * bytes_per_param
