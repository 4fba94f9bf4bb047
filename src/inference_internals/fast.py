"""A decode-optimised runner over a loaded ``Llama``: same weights, same tokens, fewer ops.

A batch-1 decode step of a small model is bound by two costs: reading every weight once
(bytes / bandwidth) and paying ~3-10 µs of Python and dispatch per op. ``model.py`` is
written to be read, so it pays the second cost generously: three projections for Q, K, V,
two for gate and up, RoPE tables recomputed every step, RMSNorm as five ops.
``FastLlama`` keeps the arithmetic and removes the overhead:

- fused projections: Q|K|V and gate|up are concatenated once, so one call reads them all
- RoPE cos/sin computed once for every position, then indexed, and applied to Q and K at once
- RMSNorm as one ``F.rms_norm``; the KV cache preallocated and written in place
- optional ``dtype`` (e.g. bf16: half the bytes per weight)
- per kind of weight, the fastest batch-1 kernel on this machine (``kernel="auto"``): BLAS
  libraries pick different paths for different layouts, and some run a matrix-vector product
  on one core only; cutting the weight into one slab per core and calling ``torch.bmm`` puts
  every core to work (benchmarks/kernels.py measures each candidate)
- optionally (``compile=True``) the batch-1 one-token step compiled by ``torch.compile``:
  the weights frozen into the graph, so inductor packs each one once for its own matrix-vector
  kernels, and each layer's small elementwise ops fused into a few loops. It costs about a minute
  of compilation on a small CPU (and a C++ compiler): a server pays that once, a notebook cannot

At fp32 it is token-identical to ``generate.generate`` at greedy (tests/test_fast.py).
"""
from __future__ import annotations

import time
from functools import partial
from typing import Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import Llama, rope_cos_sin
from .generate import as_batch, collect, decode_loop, stop_tensor
from .sampling import greedy


KERNELS = ("linear", "matmul_t", "split_n", "split_t", "split_w")


class Projection:
    """One linear map y = x W^T, stored in the layout its kernel wants.

    - ``linear``: ``F.linear`` on W [out, in], as ``nn.Linear`` does
    - ``matmul_t``: ``x @ W^T`` on a pre-transposed [in, out] copy
    - ``split_n`` / ``split_t`` / ``split_w``: W cut into ``slabs`` row blocks, one per thread,
      all multiplied by one ``torch.bmm``. A batch-1 product is a matrix-vector product, and the
      BLAS kernel for it may run on one core however many there are; the batched product hands
      each core its own slab, so all of them stream weights at once. ``split_n`` computes
      x · slab^T on W's own memory, ``split_t`` the same on pre-transposed copies, and
      ``split_w`` slab · x^T: the weight first, which BLAS treats as a tall matrix to stream.
    """

    PREFILL_ROWS = 16  # above this many rows, a split kernel hands over to F.linear
    # split_w streams one or a few rows fastest; from about 6 rows (a speculative verify pass,
    # a decode batch) x · slab^T on the same memory is faster (benchmarks/kernels.py --rows)
    SPLIT_W_ROWS = 5

    def __init__(self, weight: torch.Tensor, kernel: str, slabs: int = 1):
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
        out, inp = weight.shape
        if kernel.startswith("split") and (slabs < 2 or out % slabs):
            raise ValueError(f"a split kernel needs >= 2 slabs that divide {out} rows, got {slabs}")
        self.kernel = kernel
        if kernel == "linear":
            self.w = weight
        elif kernel == "matmul_t":
            self.w = weight.t().contiguous()
        elif kernel == "split_w":
            self.w = weight.reshape(slabs, out // slabs, inp)  # [slabs, out/slabs, in], no copy
        else:
            w = weight.reshape(slabs, out // slabs, inp).transpose(1, 2)  # [slabs, in, out/slabs]
            self.w = w.contiguous() if kernel == "split_t" else w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "linear":
            return F.linear(x, self.w)
        if self.kernel == "matmul_t":
            return x @ self.w
        s = self.w.shape[0]
        # contiguous rows: BLAS is several times slower on x^T laid out row-major (measured)
        rows = x.reshape(1, -1, x.shape[-1]).contiguous()
        if rows.shape[1] > self.PREFILL_ROWS and self.kernel != "split_t":
            # many rows (a prefill) make a matrix-matrix product, which BLAS runs on every core
            # anyway: use the plain one, on W itself (these layouts are views of it)
            w = self.w if self.kernel == "split_w" else self.w.transpose(1, 2)
            return F.linear(x, w.reshape(-1, x.shape[-1]))
        if self.kernel == "split_w" and rows.shape[1] <= self.SPLIT_W_ROWS:
            y = torch.bmm(self.w, rows.transpose(1, 2).expand(s, -1, -1))  # [slabs, out/slabs, rows]
            # a copy, not a view: the next op's input would otherwise be strided by rows
            return y.permute(2, 0, 1).reshape(*x.shape[:-1], -1).contiguous()
        w = self.w.transpose(1, 2) if self.kernel == "split_w" else self.w  # split_n's view of W
        y = torch.bmm(rows.expand(s, -1, -1), w)  # [slabs, rows, out/slabs]
        return y.transpose(0, 1).reshape(*x.shape[:-1], -1)


def _fastest(weights: list[torch.Tensor], slabs: int, reps: int = 3) -> list[Projection]:
    """``weights`` as projections of the kernel that runs one token through all of them fastest here.

    Timed over every layer's copy, as a decode step reads them, so the weights come from memory
    and not from a cache that one small matrix would fit in.
    """
    x = torch.randn(1, 1, weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device)
    best, best_t = None, float("inf")
    with torch.inference_mode():
        for kernel in KERNELS:
            if kernel.startswith("split") and (slabs < 2 or weights[0].shape[0] % slabs):
                continue
            projs = [Projection(w, kernel, slabs) for w in weights]
            for p in projs:  # warm up (first calls allocate)
                p(x)
            t = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for p in projs:
                    p(x)
                t = min(t, time.perf_counter() - t0)
            if t < best_t:
                best, best_t = projs, t  # keep the winner's layouts; the losers' copies are dropped
    return best


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # the same arithmetic as model.RMSNorm: normalise in fp32, cast back, then scale
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _layer(x, L, attend, cos, sin, config):
    """One decoder layer; ``L`` maps "qkv", "o", "gate_up", "down" to linear maps and "ln1", "ln2"
    to norm weights. ``attend(q, k, v)`` stores the new K/V and attends: the one part that the
    eager runner and the compiled step do differently."""
    B, T, _ = x.shape
    hd, hq, hkv, eps = config.head_dim, config.num_attention_heads, config.num_key_value_heads, config.rms_norm_eps
    qkv = L["qkv"](_rms(x, L["ln1"], eps)).view(B, T, hq + 2 * hkv, hd).transpose(1, 2)
    qk, v = qkv.split([hq + hkv, hkv], dim=1)
    qk = qk * cos + torch.cat([-qk[..., hd // 2:], qk[..., :hd // 2]], -1) * sin  # RoPE on Q and K at once
    q, k = qk.split([hq, hkv], dim=1)
    x = x + L["o"](attend(q, k, v).transpose(1, 2).reshape(B, T, hq * hd))
    gu = L["gate_up"](_rms(x, L["ln2"], eps))
    i = gu.shape[-1] // 2
    return x + L["down"](F.silu(gu[..., :i]) * gu[..., i:])


class _DecodeStep(nn.Module):
    """One batch-1, one-token step over the runner's weights, written for ``torch.compile``.

    The weights are parameters so that inductor can freeze them (``freezing``): a frozen weight
    is a constant, packed once into the layout of inductor's own matrix-vector kernel. The step
    reads the cache and returns the new K/V rows instead of writing them: an in-place write into
    a graph input makes the compiled graph copy the whole cache each step (measured: twice as slow).
    """

    def __init__(self, runner: "FastLlama", weights: dict[str, list[torch.Tensor]]):
        super().__init__()
        self.config = runner.config

        def params(ts):
            return nn.ParameterList(nn.Parameter(t, requires_grad=False) for t in ts)
        self.qkv, self.o, self.gate_up, self.down = (params(weights[k]) for k in ("qkv", "o", "gate_up", "down"))
        self.ln1, self.ln2 = params(L["ln1"] for L in runner.layers), params(L["ln2"] for L in runner.layers)
        self.norm, self.lm_head, self.embed = params([runner.norm, weights["lm_head"][0], runner.embed])
        self.register_buffer("cos", runner.cos)
        self.register_buffer("sin", runner.sin)

    def forward(self, ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """``ids`` [1, 1] after the cached ``k``, ``v`` [layers, 1, kv_heads, start, head_dim]:
        (logits [1, 1, vocab], final normed hidden [1, 1, hidden], new K and new V rows)."""
        start = k.shape[3]
        x = F.embedding(ids, self.embed)
        new_k, new_v = [], []
        for i in range(len(self.qkv)):
            def attend(q, ki, vi, i=i):
                new_k.append(ki)
                new_v.append(vi)
                return F.scaled_dot_product_attention(q, torch.cat([k[i], ki], 2), torch.cat([v[i], vi], 2),
                                                      enable_gqa=q.shape[1] != ki.shape[1])
            L = {"ln1": self.ln1[i], "ln2": self.ln2[i],
                 **{name: partial(F.linear, weight=getattr(self, name)[i]) for name in ("qkv", "o", "gate_up", "down")}}
            x = _layer(x, L, attend, self.cos[start], self.sin[start], self.config)
        h = _rms(x, self.norm, self.config.rms_norm_eps)
        return F.linear(h, self.lm_head), h, torch.stack(new_k), torch.stack(new_v)


class FastLlama:
    """``FastLlama(model)``: a runner with ``generate_stream`` / ``generate`` like ``generate.py``.

    ``dtype`` None keeps the model's; ``kernel`` is 'auto' (time every kernel in ``KERNELS`` on
    each kind of weight, keep the fastest) or one name for all; ``slabs`` (default: torch's
    thread count) is how many pieces the split kernels cut a weight into; ``max_len`` is the
    longest prompt + output one call may reach. ``compile=True`` runs every batch-1 one-token
    step through ``torch.compile`` (compiled on the first such step: a minute or more); prefills,
    batches and multi-token passes stay eager.
    """

    def __init__(self, model: Llama, dtype: torch.dtype | None = None, kernel: str = "linear",
                 max_len: int = 2048, slabs: int | None = None, compile: bool = False):
        if not isinstance(model, Llama):
            raise TypeError(f"FastLlama wraps an inference_internals.model.Llama, got {type(model).__name__}")
        if kernel != "auto" and kernel not in KERNELS:
            raise ValueError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
        cfg = model.config
        if not 1 <= max_len <= cfg.max_position_embeddings:
            raise ValueError(f"max_len must be in [1, {cfg.max_position_embeddings}], got {max_len}")
        self.config, self.max_len = cfg, max_len
        self.dtype = dtype or model.dtype
        self.device = model.device
        self.slabs = slabs or torch.get_num_threads()
        dt = self.dtype

        def cast(t):  # shares the model's tensor when nothing changes
            return t.detach().to(dt)

        weights = {"qkv": [], "o": [], "gate_up": [], "down": []}
        for b in model.layers:
            a, m = b.self_attn, b.mlp
            weights["qkv"].append(torch.cat([cast(a.q_proj.weight), cast(a.k_proj.weight), cast(a.v_proj.weight)]))
            weights["o"].append(cast(a.o_proj.weight))
            weights["gate_up"].append(torch.cat([cast(m.gate_proj.weight), cast(m.up_proj.weight)]))
            weights["down"].append(cast(m.down_proj.weight))
        weights["lm_head"] = [cast(model.lm_head.weight)]
        projs = {role: _fastest(ws, self.slabs) if kernel == "auto" else [Projection(w, kernel, self.slabs) for w in ws]
                 for role, ws in weights.items()}
        self.kernels = {role: ps[0].kernel for role, ps in projs.items()}
        self.embed = cast(model.embed_tokens.weight)
        self.layers = [dict(ln1=cast(b.input_layernorm.weight), ln2=cast(b.post_attention_layernorm.weight),
                            **{role: projs[role][i] for role in ("qkv", "o", "gate_up", "down")})
                       for i, b in enumerate(model.layers)]
        self.lm_head = projs["lm_head"][0]
        self.norm = cast(model.norm.weight)
        pos = torch.arange(max_len, device=self.device)[None]
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, dt)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, hd]
        self.k = self.v = None
        self.step = None
        if compile:
            self.step = torch.compile(_DecodeStep(self, weights).eval(), fullgraph=True)

    # --- the model, minus the overhead ---
    def _layer_step(self, x, L, k_cache, v_cache, start: int, cos, sin):
        T = x.shape[1]
        end = start + T

        def attend(q, k, v):  # into the preallocated cache, then over everything cached so far
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            return F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end],
                                                  is_causal=start == 0 and T > 1,
                                                  attn_mask=None if start == 0 or T == 1 else self._mask(start, T),
                                                  enable_gqa=q.shape[1] != k.shape[1])
        return _layer(x, L, attend, cos, sin, self.config)

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
    def forward(self, ids: torch.Tensor, last_only: bool = True, return_hidden: bool = False):
        """Logits for ``ids`` [B, T] after the ``length`` tokens already cached (call ``reset`` first).

        ``return_hidden`` also returns the final hidden state (after the final norm, as
        ``model.py``'s last ``output_hidden_states`` entry), which MTP heads draft from.
        """
        B, T = ids.shape
        if self.k is None or self.k.shape[1] != B:
            raise ValueError(f"the cache holds a batch of {None if self.k is None else self.k.shape[1]}, "
                             f"got {B} rows: call reset({B}) first")
        start = self.length
        if start + T > self.max_len:
            raise ValueError(f"{start} cached + {T} new tokens exceed max_len={self.max_len}")
        if self.step is not None and B == T == 1 and start >= 2:
            return self._compiled_step(ids, start, return_hidden)
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]
        for i, L in enumerate(self.layers):
            x = self._layer_step(x, L, self.k[i], self.v[i], start, cos, sin)
        self.length = start + T
        if last_only:
            x = x[:, -1:]
        h = _rms(x, self.norm, self.config.rms_norm_eps)
        return (self.lm_head(h), h) if return_hidden else self.lm_head(h)

    __call__ = forward

    def _compiled_step(self, ids: torch.Tensor, start: int, return_hidden: bool):
        k, v = self.k[:, :, :, :start], self.v[:, :, :, :start]
        # one graph for every cache length, not one per length (0 and 1 would be specialised: start >= 2)
        torch._dynamo.mark_dynamic(k, 3)
        torch._dynamo.mark_dynamic(v, 3)
        # read when the graph is compiled (the first call): torch.compile's own ``options`` do not
        # reach freezing. On a CPU, inductor's C++ GEMM template only, so that every compilation
        # picks the same kernels rather than whichever won a timing made with the weights in cache
        backends = "CPP" if self.device.type == "cpu" else "ATEN,TRITON"
        with torch._inductor.config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends=backends):
            logits, h, new_k, new_v = self.step(ids, k, v)
        self.k[:, :, :, start] = new_k[:, :, :, 0]
        self.v[:, :, :, start] = new_v[:, :, :, 0]
        self.length = start + 1
        return (logits, h) if return_hidden else logits

    # --- the loop: generate.decode_loop over this runner's forward ---
    @torch.inference_mode()
    def generate_stream(self, prompt, max_new_tokens: int = 64, sample=greedy,
                        stop_ids: Iterable[int] | None = None) -> Iterator[torch.Tensor]:
        ids = as_batch(prompt, self.device)
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        B, T = ids.shape
        if T >= self.max_len:
            raise ValueError(f"prompt of {T} tokens leaves no room in max_len={self.max_len}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        max_new_tokens = min(max_new_tokens, self.max_len - T)
        self.reset(B)
        yield from decode_loop(self.forward(ids)[:, -1], lambda nxt: self.forward(nxt[:, None])[:, -1],
                               max_new_tokens, sample, stop_tensor(stop_ids, self.config.eos_token_id, self.device),
                               is_full=lambda: self.length >= self.max_len)

    def generate(self, prompt, max_new_tokens: int = 64, sample=greedy, stop_ids=None,
                 include_stop: bool = True):
        """New token ids, exactly as ``generate.generate`` returns them."""
        steps = list(self.generate_stream(prompt, max_new_tokens, sample, stop_ids))
        return collect(steps, prompt, stop_ids if stop_ids is not None else [self.config.eos_token_id],
                       include_stop)


def fast(model: Llama, **kw) -> FastLlama:
    """The decode-optimised runner for ``model`` (see ``FastLlama`` for the options)."""
    return FastLlama(model, **kw)
