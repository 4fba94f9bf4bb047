"""A decode-optimised runner over a loaded ``Llama``: same weights, same tokens, fewer ops.

A batch-1 decode step of a small model is bound by two costs: reading every weight once
(bytes / bandwidth) and paying ~3-10 µs of Python and dispatch per op. ``model.py`` is
written to be read, so it pays the second cost generously: three projections for Q, K, V,
two for gate and up, RoPE tables recomputed every step, RMSNorm as five ops.
``FastLlama`` keeps the arithmetic and removes the overhead:

- fused projections: Q|K|V and gate|up are concatenated once, so one call reads them all
- RoPE cos/sin computed once for every position, then indexed
- RMSNorm as one ``F.rms_norm``; the KV cache preallocated and written in place
- optional ``dtype`` (e.g. bf16: half the bytes per weight)
- per weight, the faster of two batch-1 kernels on this machine (``F.linear`` on [out, in]
  or ``x @ W`` on a pre-transposed [in, out] copy): BLAS libraries pick different paths
  for the two layouts, and which wins depends on the shape and the CPU (benchmarks/kernels.py)

At fp32 it is token-identical to ``generate.generate`` at greedy (tests/test_fast.py).
"""
from __future__ import annotations

import time
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F

from .model import Llama, rope_cos_sin
from .generate import collect
from .sampling import greedy


def _timeit(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class _Proj:
    """One batch-1-friendly linear map y = x W^T with the kernel chosen at build time."""

    def __init__(self, weight: torch.Tensor, kernel: str):
        if kernel == "auto":
            x = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
            wt = weight.t().contiguous()
            with torch.inference_mode():
                t_lin = _timeit(lambda: F.linear(x, weight))
                t_mm = _timeit(lambda: x @ wt)
            kernel = "linear" if t_lin <= t_mm else "matmul_t"
        if kernel not in ("linear", "matmul_t"):
            raise ValueError(f"kernel must be 'auto', 'linear' or 'matmul_t', got {kernel!r}")
        self.kernel = kernel
        self.w = weight if kernel == "linear" else weight.t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w) if self.kernel == "linear" else x @ self.w


class FastLlama:
    """``FastLlama(model)``: a runner with ``generate_stream`` / ``generate`` like ``generate.py``.

    ``dtype`` None keeps the model's; ``kernel`` is 'auto' (time both per weight), 'linear'
    or 'matmul_t'; ``max_len`` is the longest prompt + output one call may reach.
    """

    def __init__(self, model: Llama, dtype: torch.dtype | None = None, kernel: str = "linear",
                 max_len: int = 2048):
        if not isinstance(model, Llama):
            raise TypeError(f"FastLlama wraps an inference_internals.model.Llama, got {type(model).__name__}")
        cfg = model.config
        if not 1 <= max_len <= cfg.max_position_embeddings:
            raise ValueError(f"max_len must be in [1, {cfg.max_position_embeddings}], got {max_len}")
        self.config, self.max_len = cfg, max_len
        self.dtype = dtype or model.dtype
        self.device = model.device
        dt = self.dtype

        def cast(t):  # shares the model's tensor when nothing changes
            return t.detach().to(dt)

        self.embed = cast(model.embed_tokens.weight)
        self.layers = []
        for b in model.layers:
            a, m = b.self_attn, b.mlp
            self.layers.append(dict(
                ln1=cast(b.input_layernorm.weight), ln2=cast(b.post_attention_layernorm.weight),
                qkv=_Proj(torch.cat([cast(a.q_proj.weight), cast(a.k_proj.weight), cast(a.v_proj.weight)]), kernel),
                o=_Proj(cast(a.o_proj.weight), kernel),
                gate_up=_Proj(torch.cat([cast(m.gate_proj.weight), cast(m.up_proj.weight)]), kernel),
                down=_Proj(cast(m.down_proj.weight), kernel)))
        self.norm = cast(model.norm.weight)
        self.lm_head = _Proj(cast(model.lm_head.weight), kernel)
        pos = torch.arange(max_len, device=self.device)[None]
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, dt)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, hd]
        self.k = self.v = None

    # --- the model, minus the overhead ---
    def _rms(self, x, w):
        # the same arithmetic as model.RMSNorm: normalise in fp32, cast back, then scale
        return w * F.rms_norm(x.float(), (x.shape[-1],), eps=self.config.rms_norm_eps).to(x.dtype)

    def _layer_step(self, x, L, k_cache, v_cache, start: int, cos, sin):
        cfg = self.config
        B, T, _ = x.shape
        hd, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = L["qkv"](self._rms(x, L["ln1"])).view(B, T, hq + 2 * hkv, hd).transpose(1, 2)
        q, k, v = qkv.split([hq, hkv, hkv], dim=1)
        q = q * cos + torch.cat([-q[..., hd // 2:], q[..., :hd // 2]], -1) * sin
        k = k * cos + torch.cat([-k[..., hd // 2:], k[..., :hd // 2]], -1) * sin
        end = start + T
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        att = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end],
                                             is_causal=start == 0 and T > 1,
                                             attn_mask=None if start == 0 or T == 1 else self._mask(start, T),
                                             enable_gqa=hq != hkv)
        x = x + L["o"](att.transpose(1, 2).reshape(B, T, hq * hd))
        gu = L["gate_up"](self._rms(x, L["ln2"]))
        i = gu.shape[-1] // 2
        return x + L["down"](F.silu(gu[..., :i]) * gu[..., i:])

    def _mask(self, start: int, T: int) -> torch.Tensor:
        q = torch.arange(T, device=self.device)[:, None] + start
        return torch.arange(start + T, device=self.device)[None] <= q

    def reset(self, batch_size: int) -> None:
        cfg = self.config
        shape = (cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, self.max_len, cfg.head_dim)
        if self.k is None or self.k.shape != shape:
            self.k = torch.zeros(shape, device=self.device, dtype=self.dtype)
            self.v = torch.zeros_like(self.k)
        self.length = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        """Logits for ``ids`` [B, T] after the ``length`` tokens already cached (call ``reset`` first)."""
        B, T = ids.shape
        if self.k is None or self.k.shape[1] != B:
            raise ValueError(f"the cache holds a batch of {None if self.k is None else self.k.shape[1]}, "
                             f"got {B} rows: call reset({B}) first")
        start = self.length
        if start + T > self.max_len:
            raise ValueError(f"{start} cached + {T} new tokens exceed max_len={self.max_len}")
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]
        for i, L in enumerate(self.layers):
            x = self._layer_step(x, L, self.k[i], self.v[i], start, cos, sin)
        self.length = start + T
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self._rms(x, self.norm))

    __call__ = forward

    # --- the loop, as generate.generate_stream ---
    @torch.inference_mode()
    def generate_stream(self, prompt, max_new_tokens: int = 64, sample=greedy,
                        stop_ids: Iterable[int] | None = None) -> Iterator[torch.Tensor]:
        ids = torch.as_tensor(prompt, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.numel() == 0:
            raise ValueError("the prompt must hold at least one token id")
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        B, T = ids.shape
        if T >= self.max_len:
            raise ValueError(f"prompt of {T} tokens leaves no room in max_len={self.max_len}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        max_new_tokens = min(max_new_tokens, self.max_len - T)
        stop = torch.tensor(sorted(set(stop_ids if stop_ids is not None else [self.config.eos_token_id])),
                            dtype=torch.long, device=self.device)
        self.reset(B)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        logits = self.forward(ids)[:, -1]
        for _ in range(max_new_tokens):
            nxt = sample(logits.float())
            if len(stop):
                nxt = torch.where(done, stop[0], nxt)
            yield nxt
            done |= torch.isin(nxt, stop)
            if bool(done.all()) or self.length >= self.max_len:
                return
            logits = self.forward(nxt[:, None])[:, -1]

    def generate(self, prompt, max_new_tokens: int = 64, sample=greedy, stop_ids=None,
                 include_stop: bool = True):
        """New token ids, exactly as ``generate.generate`` returns them."""
        steps = list(self.generate_stream(prompt, max_new_tokens, sample, stop_ids))
        return collect(steps, prompt, stop_ids if stop_ids is not None else [self.config.eos_token_id],
                       include_stop)


def fast(model: Llama, **kw) -> FastLlama:
    """The decode-optimised runner for ``model`` (see ``FastLlama`` for the options)."""
    return FastLlama(model, **kw)
