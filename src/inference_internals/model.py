"""A from-scratch Llama: the whole model a reader needs to follow one token through.

token ids -> embedding -> N x [RMSNorm -> attention (RoPE, grouped-query) -> +residual,
RMSNorm -> SwiGLU MLP -> +residual] -> RMSNorm -> LM head (tied to the embedding) -> logits

Parameter names match Hugging Face's ``LlamaForCausalLM`` (minus the ``model.`` prefix)
so the same safetensors file loads into both, and every intermediate can be compared.

The same classes run Gemma 3 (chapter 7), told by the config (``LlamaConfig.from_json`` reads a
``gemma3_text`` config), not by a second copy of the file. What Gemma changes:

- the embedding is scaled by sqrt(hidden_size) (``embed_scale``);
- RMSNorm multiplies by (1 + w), not w (``norm_offset``: Gemma stores w around 0);
- four norms per block, not two (``sandwich_norms``): each sublayer's output is normed before it
  joins the residual (``post_attention_layernorm``, ``post_feedforward_layernorm``), and the MLP's
  input has its own (``pre_feedforward_layernorm``). In a Llama ``post_attention_layernorm`` is the
  MLP's input norm: the names are Hugging Face's, in both;
- Q and K are RMS-normed per head before RoPE (``qk_norm``);
- GELU (tanh approximation), not SiLU, gates the MLP (``hidden_act``);
- most layers attend only to the last ``sliding_window`` positions (``layer_types``), with their own
  RoPE base (``rope_local_theta``), five local layers for each global one. The window is the
  cache's business too (kv_cache/): a local layer never needs a key older than the window.

A KV cache plugs in through one protocol (``kv_cache.base.KVCacheView``), so chapters 4-6 can
swap the storage without touching this file (see ``kv_cache.KVCache`` for the contiguous one):
    positions = cache.positions(B, T)    # where the new tokens sit (unless given)
    cache.begin(positions)               # check room, work out which keys each query may see
    out = cache.attend(layer, q, k, v)   # store this step's keys/values, attend over all of them
    cache.commit(n_new)                  # the step succeeded: the new tokens now count
Without a cache, a forward pass is one causal attention over its own tokens.

This file knows nothing about speed. ``optimize.optimize(model)`` makes the same model fast from
outside, as gpt-fast does: it swaps in fused projections (Q|K|V and gate|up each one matrix,
``optimize.fused``) running the fastest kernel for this machine, and can install a compiled batch-1
decode step. Same forward, same caches, same callers.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2
    # --- what a Gemma 3 config changes (the defaults are a Llama's) ---
    model_type: str = "llama"
    layer_types: tuple | None = None      # per layer 'full_attention' or 'sliding_attention'; None: all full
    sliding_window: int | None = None     # keys a sliding layer's query sees, itself included
    rope_local_theta: float | None = None  # the sliding layers' RoPE base
    qk_norm: bool = False
    sandwich_norms: bool = False
    norm_offset: float = 0.0
    embed_scale: bool = False
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (None: head_dim's)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "LlamaConfig":
        raw = json.loads(Path(path).read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a config is a JSON object, got {type(raw).__name__}")
        if raw.get("model_type", "llama") not in ("llama", "mistral", "qwen2", *GEMMA3_TYPES):
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r} is neither Llama-family nor Gemma 3")
        from .params import check_int

        raw.setdefault("model_type", "llama")
        if raw["model_type"] in GEMMA3_TYPES:
            _gemma3_fields(raw, path)

        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ValueError(f"{path}: config lacks {missing}")
        rope = raw.get("rope_parameters") or {}
        rope = rope.get("full_attention", rope)  # per layer type (Gemma 3) or one for all
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"{path}: RoPE scaling {rope.get('rope_type')!r} is not supported")
        raw.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        if raw.get("num_key_value_heads") is None:
            raw["num_key_value_heads"] = raw["num_attention_heads"]
        # sizes are checked before any arithmetic on them (a head count of 0 divides below)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if raw.get(key) is not None:
                check_int(f"{path}: {key}", raw[key], 1)
        raw.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
        if raw["num_attention_heads"] % raw["num_key_value_heads"]:
            raise ValueError(f"{path}: {raw['num_attention_heads']} attention heads do not share "
                             f"{raw['num_key_value_heads']} key/value heads evenly")
        for key in ("rope_theta", "rms_norm_eps"):
            if raw.get(key) is not None and not (isinstance(raw[key], (int, float)) and raw[key] > 0):
                raise ValueError(f"{path}: {key} must be a positive number, got {raw[key]!r}")
        for key in ("eos_token_id", "bos_token_id"):
            if isinstance(raw.get(key), list):
                raw[key] = raw[key][0]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names and v is not None})

    def __post_init__(self):
        if self.layer_types is not None:
            self.layer_types = tuple(self.layer_types)
            if len(self.layer_types) != self.num_hidden_layers or \
                    not set(self.layer_types) <= {"full_attention", "sliding_attention"}:
                raise ValueError(f"layer_types must name 'full_attention' or 'sliding_attention' for each of "
                                 f"{self.num_hidden_layers} layers, got {self.layer_types!r}")
            if "sliding_attention" in self.layer_types and not (
                    isinstance(self.sliding_window, int) and self.sliding_window >= 1):
                raise ValueError(f"sliding layers need a sliding_window >= 1, got {self.sliding_window!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {self.hidden_act!r}")

    @property
    def n_rep(self) -> int:
        """Query heads that share one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def window(self, layer: int) -> int | None:
        """The keys layer ``layer``'s queries see, counting back from their own position (None: all)."""
        if self.layer_types is not None and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def windowed_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.window(i) is not None]


GEMMA3_TYPES = ("gemma3_text",)
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def _gemma3_fields(raw: dict, path) -> None:
    """A ``gemma3_text`` config's facts in this file's terms (Hugging Face's names where they exist)."""
    if raw.get("attn_logit_softcapping") or raw.get("final_logit_softcapping"):
        raise ValueError(f"{path}: logit soft-capping (Gemma 2) is not supported")
    if raw.get("use_bidirectional_attention"):
        raise ValueError(f"{path}: bidirectional attention is not supported")
    n = raw["num_hidden_layers"]
    if raw.get("layer_types") is None:  # older configs: every sliding_window_pattern-th layer is global
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        raw["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    rope = raw.get("rope_parameters") or {}
    for kind in ("full_attention", "sliding_attention"):
        if rope.get(kind, {}).get("rope_type", "default") != "default":
            raise ValueError(f"{path}: RoPE scaling {rope[kind]['rope_type']!r} on {kind} layers is not supported")
    raw["rope_local_theta"] = rope.get("sliding_attention", {}).get("rope_theta", raw.get("rope_local_base_freq", 10000.0))
    raw.setdefault("hidden_act", raw.get("hidden_activation", "gelu_pytorch_tanh"))
    raw.update(qk_norm=True, sandwich_norms=True, norm_offset=1.0, embed_scale=True)
    raw.setdefault("tie_word_embeddings", True)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 whatever the model's dtype. With ``offset`` (Gemma's 1.0)
    the scale is (offset + weight), applied in fp32 before the cast back, as Gemma's reference does."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) - offset)  # the identity scale, either way
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is x * rsqrt(mean(x^2) + eps) in one op instead of five
        if self.offset:
            normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
            return (normed * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables for rotary embeddings at integer ``positions`` ([B, T]) -> [B, T, head_dim].

    Pair i of a head rotates by angle position * theta^(-2i/head_dim): slow rotations for
    late pairs carry long-range position, fast ones short-range.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.int64).float() / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    emb = torch.cat([angles, angles], dim=-1)        # HF's layout: halves, not interleaved pairs
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RotaryEmbedding(nn.Module):
    """``rope_cos_sin`` for every position of the context window, computed once and then
    indexed: a step looks its positions up instead of recomputing the angles."""

    def __init__(self, cfg: LlamaConfig, theta: float | None = None):
        super().__init__()
        # on the CPU even when the model is built on "meta" to be given its weights: the tables
        # are computed, never loaded, and not persistent (not part of the checkpoint)
        positions = torch.arange(cfg.max_position_embeddings, device="cpu")[None]
        cos, sin = rope_cos_sin(positions, cfg.head_dim, theta or cfg.rope_theta, torch.float32)
        self.register_buffer("cos", cos[0], persistent=False)  # [max_positions, head_dim]
        self.register_buffer("sin", sin[0], persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin [B, T, head_dim] at ``positions`` [B, T], in ``dtype``."""
        if self.cos.device != positions.device:  # a model assembled from another's modules
            self.cos, self.sin = self.cos.to(positions.device), self.sin.to(positions.device)
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, H, T, D] by the angles in cos/sin [B, T, D]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, with q [B, Hq, T, hd] and k, v [B, Hkv, S, hd]: query head h reads
    K/V head h // (Hq / Hkv) (grouped-query attention). ``mask`` [.., T, S] says which keys each query
    may see (True: visible); None is causal over the T tokens themselves (S == T)."""
    # enable_gqa lets 3 K/V heads serve 9 query heads without copying them 3 times. On CUDA
    # only the flash kernel takes it, and flash takes no mask and no fp32: with either, SDPA
    # would fall back to its math kernel (every paged and verify pass), so copy K/V there.
    n_rep = q.shape[1] // k.shape[1]
    gqa = n_rep > 1
    if gqa and q.is_cuda and (mask is not None or q.dtype == torch.float32):
        k, v, gqa = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and q.shape[2] > 1,
                                          enable_gqa=gqa)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Which keys each query sees: causal (key position <= query position) and, with a ``window``,
    at most ``window - 1`` positions back (Hugging Face's sliding window: q - k < window).
    ``q_pos`` [.., T] and ``k_pos`` [.., S] broadcast to [.., T, S]."""
    seen = k_pos[..., None, :] <= q_pos[..., :, None]
    if window is not None:
        seen = seen & (k_pos[..., None, :] > q_pos[..., :, None] - window)
    return seen


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.window = cfg.window(layer_idx)
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)
        if cfg.qk_norm:  # one norm over each head's hd numbers, shared by the heads
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg.norm_offset)
        # SDPA scales by 1/sqrt(hd); another scale is folded into q (Gemma 3 270M's is the same)
        scalar = cfg.query_pre_attn_scalar
        self.q_scale = None if scalar is None or scalar == hd else math.sqrt(hd / scalar)

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The three projections, side by side: [B, T, (Hq + 2 Hkv) * hd]."""
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def forward(self, x, cos, sin, cache=None):
        B, T, _ = x.shape
        hd, hq, hkv = self.cfg.head_dim, self.cfg.num_attention_heads, self.cfg.num_key_value_heads
        qkv = self.qkv(x).view(B, T, hq + 2 * hkv, hd).transpose(1, 2)  # [B, Hq + 2 Hkv, T, hd]
        qk, v = qkv.split([hq + hkv, hkv], dim=1)
        if self.cfg.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :hq]), self.k_norm(qk[:, hq:])], dim=1)
        q, k = apply_rope(qk, cos, sin).split([hq, hkv], dim=1)  # one rotation for Q and K
        if self.q_scale is not None:
            q = q * self.q_scale
        if cache is not None:
            out = cache.attend(self.layer_idx, q, k, v)
        elif self.window is not None and T > 1:  # a whole pass: causal, and no further back than the window
            pos = torch.arange(T, device=q.device)
            out = attention(q, k, v, window_mask(pos, pos, self.window))
        else:
            out = attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); Gemma's GeGLU puts GELU where SiLU is."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_proj(x), self.up_proj(x)

    def forward(self, x):
        gate, up = self.gate_up(x)
        return self.down_proj(self.act(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)  # noqa: E731
        self.sandwich = cfg.sandwich_norms
        self.local = cfg.window(layer_idx) is not None  # which RoPE table it reads (Llama.compute)
        self.input_layernorm = norm()
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = norm()  # Llama: the MLP's input norm; Gemma: the attention output's
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        if self.sandwich:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, cache))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg)
        # the sliding layers' own RoPE base (Gemma 3: 10k, the global layers' 1M); None: one table
        self.rotary_local = RotaryEmbedding(cfg, cfg.rope_local_theta) if cfg.windowed_layers else None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def prepare(self, input_ids, positions, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``positions`` as checked tensors on the model's device (lists and CPU
        ids welcome; positions default to continuing the cache).

        Values are read where reading costs the device no wait: ids and positions still on the host
        (lists, CPU tensors, any tensor of a CPU model) are checked before they move, and a pass
        without a cache (one whole forward) reads its ids back once. A step with a cache on an
        accelerator is never read: its request's ids were checked at the door
        (``params.check_token_ids``), the ids it feeds back were sampled from the vocabulary, and its
        positions come from the cache's host-side counts. Reading them would stall the GPU at every
        decode step, and a CUDA graph being captured cannot read at all (cuda_graph.py)."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"input_ids must be an integer tensor [batch, seq], got {tuple(ids.shape)} {ids.dtype}")
        B, T = ids.shape
        if T == 0:
            raise ValueError("input_ids is empty: the model needs at least one token")
        if ids.device.type == "cpu" or cache is None:
            lo, hi = torch.stack([ids.min(), ids.max()]).tolist()  # one read for both bounds
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(f"token ids must be in [0, {self.config.vocab_size}), got range [{lo}, {hi}]")
        ids = ids.to(self.device)
        if positions is None and cache is not None:  # a cache knows where its rows continue
            positions = cache.positions(B, T)  # within its room, which it never lets past the context window
        elif positions is None:
            positions = torch.arange(T, device=self.device).expand(B, -1)
        else:  # given: read where that costs the device no wait
            positions = torch.as_tensor(positions)
            if positions.device.type == "cpu" and (last := int(positions.max())) >= self.config.max_position_embeddings:
                raise ValueError(f"position {last} is past the context window of "
                                 f"{self.config.max_position_embeddings} tokens")
        if positions.shape != ids.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must match input_ids {tuple(ids.shape)}")
        return ids, positions.to(self.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache=None, output_hidden_states: bool = False, last_only: bool = False,
                logits_at: torch.Tensor | None = None):
        """Logits [B, T, vocab] for ``input_ids`` [B, T].

        ``positions`` default to 0..T-1 after whatever the cache already holds.
        ``last_only`` computes the LM head for the last position only (all that decoding needs);
        ``logits_at`` (indices along T) for those positions only: a packed row holding several
        sequences needs each one's last.
        With ``output_hidden_states`` also returns the residual stream after the embedding and
        after every block (the last one after the final norm), like Hugging Face.
        """
        input_ids, positions = self.prepare(input_ids, positions, cache)
        return self.compute(input_ids, positions, cache, output_hidden_states, last_only, logits_at)

    def compute(self, input_ids: torch.Tensor, positions: torch.Tensor, cache=None, output_hidden_states: bool = False,
                last_only: bool = False, logits_at: torch.Tensor | None = None):
        """``forward`` on inputs ``prepare`` has checked: what a compiled step traces (optimize)."""
        if cache is not None:
            cache.begin(positions)
        x = self.embed_tokens(input_ids)
        if self.config.embed_scale:  # sqrt(hidden), rounded to the model's dtype first, as Gemma's reference
            x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        cos, sin = self.rotary(positions, x.dtype)
        local = self.rotary_local(positions, x.dtype) if self.rotary_local is not None else (cos, sin)
        hidden = [x] if output_hidden_states else None  # 31 live tensors only when asked for
        for layer in self.layers:
            x = layer(x, *(local if layer.local else (cos, sin)), cache)
            if hidden is not None:
                hidden.append(x)
        x = self.norm(x)
        if hidden is not None:
            hidden[-1] = x
        if cache is not None:
            cache.commit(input_ids.shape[1])
        if logits_at is not None:
            x = x[:, logits_at]
        logits = self.lm_head(x[:, -1:] if last_only else x)
        return (logits, hidden) if output_hidden_states else logits

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None, device=None, dtype=None) -> "Llama":
        """Load a Llama-family checkpoint folder (default: the prepared SmolLM2-135M cache).
        ``device`` and ``dtype`` as ``LLM`` takes them ('cuda', 'bf16', torch.float16; None: the default)."""
        from safetensors.torch import load_file

        from .device import get_device, parse_dtype
        from .weights import model_dir

        device = get_device(device)
        dtype = parse_dtype(dtype, device)
        folder = model_dir(path)
        cfg = LlamaConfig.from_json(folder / "config.json")
        with torch.device("meta"):
            model = cls(cfg)
        state = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(f))
        state = {k.removeprefix("model."): v for k, v in state.items()}
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        model.load_state_dict(state, strict=not cfg.tie_word_embeddings, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        missing = [n for n, p in model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"{folder}: checkpoint lacks {missing[:5]}")
        return model.to(device=device, dtype=dtype).eval()


def load_tokenizer(path: str | os.PathLike | None = None):
    """The production (Hugging Face) tokenizer saved beside the weights."""
    from transformers import AutoTokenizer

    from .weights import model_dir

    return AutoTokenizer.from_pretrained(model_dir(path))


def load_reference(path: str | os.PathLike | None = None, device=None, dtype=torch.float32):
    """Hugging Face's ``LlamaForCausalLM`` on the same weights: the reference we check against."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from .device import get_device, parse_dtype
    from .weights import model_dir

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    device, dtype = get_device(device), parse_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(model_dir(path), dtype=dtype)
    return model.to(device).eval()


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (a tied LM head is counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def random_model(cfg: LlamaConfig | None = None, seed: int = 0, device=None, dtype=torch.float32) -> Llama:
    """A model of the same shape with random weights: for speed and equality checks where the
    real weights are not present (e.g. on a lent GPU machine)."""
    from .device import get_device, parse_dtype

    cfg = cfg or LlamaConfig()
    device, dtype = get_device(device), parse_dtype(dtype, device)
    torch.manual_seed(seed)
    model = Llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # the identity scale (0 where Gemma's norms add 1)
                p.fill_(1.0 - cfg.norm_offset)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model.to(device=device, dtype=dtype).eval()
