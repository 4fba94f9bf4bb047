"""``Llama.optimize()``: the same model, the same forward, fewer ops and faster kernels.

A batch-1 decode step of a small model is bound by two costs: reading every weight once
(bytes / bandwidth) and paying ~3-10 µs of Python and dispatch per op. ``optimize`` keeps the
arithmetic and the modules, and swaps parts of them:

- fused projections: Q|K|V and gate|up concatenated once (``Attention.qkv_proj``,
  ``MLP.gate_up_proj``), so one call reads them all. ``q_proj``/``k_proj``/``v_proj`` (and gate,
  up) keep their names, their weights now views of the fused rows: the checkpoint's names load,
  and ``state_dict()`` is the same as before
- per kind of weight, the fastest batch-1 kernel on this machine (``kernel="auto"``): a
  ``Projection`` module that holds the weight in its kernel's layout. BLAS libraries pick
  different paths for different layouts, and some run a matrix-vector product on one core only;
  cutting the weight into one slab per core and calling ``torch.bmm`` puts every core to work
  (benchmarks/kernels.py measures each candidate)
- optional ``dtype`` (e.g. bf16: half the bytes per weight)
- optionally (``compile=True``) the batch-1 one-token step through the contiguous ``KVCache``
  compiled by ``torch.compile``: the same layers, with the weights frozen into the graph, so
  inductor packs each one once for its own matrix-vector kernels and fuses each layer's small
  elementwise ops. It costs about a minute of compilation on a small CPU (and a C++ compiler):
  a server pays that once, a notebook cannot

Everything else (RoPE tables, one-op RMSNorm, the preallocated ``KVCache`` written in place, the
mask from ``cache.begin``) is the model's own. At fp32 an optimized model is token-identical to
the plain one at greedy (tests/test_optimize.py). Optimize last: after ``.to(device)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache
from .timing import timed

KERNELS = ("linear", "matmul_t", "split_n", "split_t", "split_w")


class Projection(nn.Module):
    """One linear map y = x W^T, stored in the layout its kernel wants.

    - ``linear``: ``F.linear`` on W [out, in], as ``nn.Linear`` does
    - ``matmul_t``: ``x @ W^T`` on a pre-transposed [in, out] copy
    - ``split_n`` / ``split_t`` / ``split_w``: W cut into ``slabs`` row blocks, one per thread,
      all multiplied by one ``torch.bmm``. A batch-1 product is a matrix-vector product, and the
      BLAS kernel for it may run on one core however many there are; the batched product hands
      each core its own slab, so all of them stream weights at once. ``split_n`` computes
      x · slab^T on W's own memory, ``split_t`` the same on pre-transposed copies, and
      ``split_w`` slab · x^T: the weight first, which BLAS treats as a tall matrix to stream.

    ``weight`` stays W (a parameter when given one, so a replaced ``nn.Linear`` keeps its name in
    ``state_dict``); the kernel's layout ``w`` is a view of it, or a copy for the pre-transposed ones.
    """

    PREFILL_ROWS = 16  # above this many rows, a split kernel hands over to F.linear
    # split_w streams one or a few rows fastest; from about 6 rows (a speculative verify pass,
    # a decode batch) x · slab^T on the same memory is faster (benchmarks/kernels.py --rows)
    SPLIT_W_ROWS = 5

    def __init__(self, weight: torch.Tensor, kernel: str = "linear", slabs: int = 1):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
        out, inp = weight.shape
        if kernel.startswith("split") and (slabs < 2 or out % slabs):
            raise ValueError(f"a split kernel needs >= 2 slabs that divide {out} rows, got {slabs}")
        if isinstance(weight, nn.Parameter):
            self.weight = weight
        else:  # a fused weight: its parts keep the checkpoint's names, so it is not saved twice
            self.register_buffer("weight", weight, persistent=False)
        self.kernel, self.slabs = kernel, slabs
        self.relayout()

    def relayout(self) -> None:
        """(Re)build the kernel's layout from ``weight`` (after a ``load_state_dict``, say)."""
        w, s = self.weight.detach(), self.slabs
        out, inp = w.shape
        if self.kernel == "linear":
            self.w = w
        elif self.kernel == "matmul_t":
            self.w = w.t().contiguous()
        elif self.kernel == "split_w":
            self.w = w.reshape(s, out // s, inp)  # [slabs, out/slabs, in], no copy
        else:
            w = w.reshape(s, out // s, inp).transpose(1, 2)  # [slabs, in, out/slabs]
            self.w = w.contiguous() if self.kernel == "split_t" else w

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}, kernel={self.kernel}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "linear" or torch.compiler.is_compiling():
            # compiled: inductor packs the frozen weight for its own kernel, whatever the layout
            return F.linear(x, self.weight)
        if self.kernel == "matmul_t":
            return x @ self.w
        s = self.w.shape[0]
        # contiguous rows: BLAS is several times slower on x^T laid out row-major (measured)
        rows = x.reshape(1, -1, x.shape[-1]).contiguous()
        if rows.shape[1] > self.PREFILL_ROWS and self.kernel != "split_t":
            # many rows (a prefill) make a matrix-matrix product, which BLAS runs on every core
            # anyway: use the plain one, on W itself (these layouts are views of it)
            return F.linear(x, self.weight)
        if self.kernel == "split_w" and rows.shape[1] <= self.SPLIT_W_ROWS:
            y = torch.bmm(self.w, rows.transpose(1, 2).expand(s, -1, -1))  # [slabs, out/slabs, rows]
            # a copy, not a view: the next op's input would otherwise be strided by rows
            return y.permute(2, 0, 1).reshape(*x.shape[:-1], -1).contiguous()
        w = self.w.transpose(1, 2) if self.kernel == "split_w" else self.w  # split_n's view of W
        y = torch.bmm(rows.expand(s, -1, -1), w)  # [slabs, rows, out/slabs]
        return y.transpose(0, 1).reshape(*x.shape[:-1], -1)


def _fastest(weights: list[torch.Tensor], slabs: int, reps: int = 3) -> str:
    """The kernel that runs one token through all of ``weights`` fastest here.

    Timed over every layer's copy, as a decode step reads them, so the weights come from memory
    and not from a cache that one small matrix would fit in.
    """
    device = weights[0].device
    x = torch.randn(1, 1, weights[0].shape[1], dtype=weights[0].dtype, device=device)
    best, best_t = "linear", float("inf")
    with torch.inference_mode():
        for kernel in KERNELS:
            if kernel.startswith("split") and (slabs < 2 or weights[0].shape[0] % slabs):
                continue
            projs = [Projection(w, kernel, slabs) for w in weights]
            for p in projs:  # warm up (first calls allocate)
                p(x)
            # a GPU runs asynchronously: the clock waits for the kernels, not just their launch
            t = min(timed(lambda: [p(x) for p in projs], device)[1] for _ in range(reps))
            if t < best_t:
                best, best_t = kernel, t
    return best


def _fuse(parts: list[nn.Linear]) -> torch.Tensor:
    """The parts' weights as one matrix; each part's weight becomes a view of its rows."""
    fused = torch.cat([p.weight.detach() for p in parts])
    start = 0
    for p in parts:
        n = p.weight.shape[0]
        p.weight = nn.Parameter(fused[start:start + n], requires_grad=False)
        start += n
    return fused


def optimize(model, dtype: torch.dtype | None = None, kernel: str = "auto", compile: bool = False,
             slabs: int | None = None):
    """Make ``model`` (a ``model.Llama``) fast in place, and return it.

    ``dtype`` None keeps the model's; ``kernel`` is 'auto' (time every kernel in ``KERNELS`` on
    each kind of weight, keep the fastest), one name for all, or a dict of them per kind of weight
    (``model.kernels`` of an earlier run: the choice without the timing); ``slabs`` (default: torch's thread
    count) is how many pieces the split kernels cut a weight into. ``compile=True`` runs every
    batch-1 one-token step on a ``KVCache`` through ``torch.compile`` (compiled on the first such
    step: a minute or more); prefills, batches, multi-token passes and other caches stay eager.
    Calling it again re-optimizes (e.g. another kernel).
    """
    from .model import Llama

    if not isinstance(model, Llama):
        raise TypeError(f"optimize takes an inference_internals.model.Llama, got {type(model).__name__}")
    roles = ("qkv", "o", "gate_up", "down", "lm_head")
    choice = kernel if isinstance(kernel, dict) else dict.fromkeys(roles, kernel)
    if set(choice) != set(roles) or any(k != "auto" and k not in KERNELS for k in choice.values()):
        raise ValueError(f"kernel must be 'auto', one of {KERNELS}, or a dict giving one for each of "
                         f"{roles}, got {kernel!r}")
    slabs = slabs or torch.get_num_threads()
    if dtype is not None:
        model.to(dtype)
    attns = [b.self_attn for b in model.layers]
    mlps = [b.mlp for b in model.layers]
    weights = {  # role -> (weights, where each Projection goes)
        "qkv": ([_fuse([a.q_proj, a.k_proj, a.v_proj]) for a in attns], [(a, "qkv_proj") for a in attns]),
        "o": ([a.o_proj.weight for a in attns], [(a, "o_proj") for a in attns]),
        "gate_up": ([_fuse([m.gate_proj, m.up_proj]) for m in mlps], [(m, "gate_up_proj") for m in mlps]),
        "down": ([m.down_proj.weight for m in mlps], [(m, "down_proj") for m in mlps]),
        "lm_head": ([model.lm_head.weight], [(model, "lm_head")]),
    }
    model.kernels = {}
    for role, (ws, places) in weights.items():
        k = _fastest([w.detach() for w in ws], slabs) if choice[role] == "auto" else choice[role]
        model.kernels[role] = k
        for w, (module, name) in zip(ws, places):
            setattr(module, name, Projection(w, k, slabs))
    if not getattr(model, "relayout_on_load", False):  # weights loaded later reach every layout
        model.register_load_state_dict_post_hook(_relayout)
        model.relayout_on_load = True
    model.decode_step = CompiledDecodeStep(model) if compile else None
    return model.eval()


def _relayout(model, incompatible_keys) -> None:
    for m in model.modules():
        if isinstance(m, Projection):
            m.relayout()


class _AppendingView:
    """The cache as the compiled step sees it: the cached prefix is read, and the new rows are
    handed back instead of written. An in-place write into a graph input makes the compiled graph
    copy the whole cache each step (measured: twice as slow)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v, self.new_k, self.new_v = k, v, [], []

    def begin(self, positions):
        return None  # one query sees every key: no mask

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.new_k.append(k)
        self.new_v.append(v)
        return torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)

    def commit(self, n_new: int) -> None:
        pass


class CompiledDecodeStep:
    """Behind ``Llama.forward``: a batch-1, one-token step on a contiguous ``KVCache`` runs the
    same ``Llama.forward`` compiled, over an ``_AppendingView`` of the cache. Compiling the model
    itself lets inductor freeze its weights (``freezing``). Not an ``nn.Module`` attribute of the
    model, since it holds the model."""

    def __init__(self, model):
        self.step = torch.compile(model, fullgraph=True)
        self.device = model.device

    def takes(self, ids, cache, output_hidden_states, logits_at) -> bool:
        # 0 and 1 cached tokens would each get a graph of their own (torch specialises sizes 0, 1)
        return (type(cache) is KVCache and ids.shape == (1, 1) and cache.batch_size == 1
                and cache.length >= 2 and not output_hidden_states and logits_at is None)

    def __call__(self, ids, positions, cache: KVCache):
        cache.begin(positions)  # room is checked before anything runs
        n = cache.length
        view = _AppendingView(cache.k[:, :, :, :n], cache.v[:, :, :, :n])
        # one graph for every cache length, not one per length
        torch._dynamo.mark_dynamic(view.k, 3)
        torch._dynamo.mark_dynamic(view.v, 3)
        # read when the graph is compiled (the first call): torch.compile's own ``options`` do not
        # reach freezing. On a CPU, inductor's C++ GEMM template only, so that every compilation
        # picks the same kernels rather than whichever won a timing made with the weights in cache
        backends = "CPP" if self.device.type == "cpu" else "ATEN,TRITON"
        with torch._inductor.config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends=backends):
            logits = self.step(ids, positions, cache=view, last_only=True)
        cache.append(torch.stack(view.new_k), torch.stack(view.new_v))
        return logits
