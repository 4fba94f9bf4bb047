"""Decode steps (one sequence's, or a batch's with one new token each) and speculative verify passes,
compiled by ``torch.compile``.

``optimize(model, compile=True)`` installs a ``CompiledDecodeStep`` as the model's own ``forward``
(an instance attribute, so every caller of ``model(...)`` reaches it: the engine's model runner, and
the chapters' reference loops alike). A call that feeds one sequence a few new tokens through a cache
that can show them stored where they lie (``stored()``: a contiguous ``KVCache`` of one row, or the
paged pool through one sequence's block table) runs the compiled graph over an
``kv_cache.appending.AppendingView``; so does a continuous-batching decode step, every row one new
token through its own block table (``stored().lengths``: each row's keys past its own length masked;
one graph for every batch of 2 or more); so does a speculative verify pass, a few tokens whose every
logits it wants. Every other call (a prompt or what prefix caching left of it, a ragged or packed batch,
other caches) runs the model eagerly. The graph is ``Llama.compute`` with the weights frozen into it, so inductor packs each
weight once for its own matrix-vector kernels and fuses each layer's small elementwise ops. One graph
serves every length; a decode step has one, a batch's decode step one, and passes of 2 or more tokens
another (with the hidden states a speculative draft reads, one more). The batch's graph: Q4_1 on a
2-core Xeon, a step of 4 rows 10.5 ms against 18.9 eager, of 16 rows 34 against 48 (the block kernels'
integer products are most of it: all the projections of 16 rows take 33.6 ms by themselves). It costs about a minute of compilation on a small CPU
(and a C++ compiler): a server pays that once, a notebook cannot.
"""
from __future__ import annotations

import torch
from torch import nn

from ..kv_cache.appending import AppendingView
from . import decode_attention
from .projection import QuantProjection

MAX_NEW_TOKENS = 32  # a decode step's 1, a verify pass's γ + 1: more is a prompt, which runs eagerly


class _Compute(nn.Module):
    """The part of a forward pass the graph holds: the model's layers on inputs already checked.
    A module of its own, so that inductor sees the model's weights as its parameters and freezes them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, positions, cache, output_hidden_states, last_only):
        return self.model.compute(ids, positions, cache, output_hidden_states, last_only)


class CompiledDecodeStep:
    def __init__(self, model):
        self.model, self.device = model, model.device
        self.eager = type(model).forward.__get__(model)
        self.step = torch.compile(_Compute(model), fullgraph=True)
        self.quantized = any(isinstance(m, QuantProjection) for m in model.modules())
        self.warm = set()  # the kinds of pass compiled (one token or more, hidden states, storage, grad mode)
        # every compiled model's graphs sit in one cache, that of _Compute.forward (told apart by
        # their guards): past dynamo's default of 8, fullgraph=True refuses to compile the next one
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def __call__(self, input_ids, positions=None, cache=None, output_hidden_states=False, last_only=False,
                 logits_at=None):
        stored = cache.stored() if cache is not None and logits_at is None else None
        if stored is None:
            return self.eager(input_ids, positions, cache, output_hidden_states, last_only, logits_at)
        ids, positions = self.model.prepare(input_ids, positions, cache)
        B, T = ids.shape
        # A pass of several tokens that wants only the last one's logits is a prompt (or what prefix
        # caching left of one), not a verify pass: eager. Compiled, each first remainder of a new size
        # class compiled a graph mid-request (19 s for 8 tokens, again 47 s for 29, on a 2-core EPYC)
        if T > MAX_NEW_TOKENS or (T > 1 and last_only) or (B != 1 and stored.lengths is None):
            return self.model.compute(ids, positions, cache, output_hidden_states, last_only)
        cache.begin(positions)  # the cache's own checks (room), before anything runs
        view = AppendingView(stored, decode_attention if decode_attention.runs_here(stored.k) else None)
        last_only = last_only or T == 1  # the same logits for one token: one graph, not two
        # Once this model has compiled this kind of pass, dynamo need not check its ~2,000 guards (every
        # module attribute the trace read; about 1 ms a step): under this stance it checks only the
        # input tensors' and those that once told two graphs apart (this model's from another's, one
        # token from several). Safe here because what the skipped guards watch does not change: the
        # weights are frozen into the graph, the model is not edited after optimize(). An input no
        # graph matches (another cache's tensors, say) is refused before anything runs: then check
        # everything and compile. Q4_1 on a 2-core Xeon: 1.08x tok/s, 15 of 16 interleaved rounds faster
        kind = (T == 1, output_hidden_states, last_only, stored.layout, torch.is_grad_enabled(),
                torch.is_inference_mode_enabled())

        def run():
            return self.step(ids, positions, view, output_hidden_states, last_only)

        out = None
        if kind in self.warm:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    out = run()
            except RuntimeError as e:
                if "skip_guard_eval_unsafe" not in str(e):
                    raise
                view.new_k.clear()  # (empty: the refusal comes before anything runs)
                view.new_v.clear()
        if out is None:
            # one graph for every stored length, not one per length; and one for every pass of 2 or more
            # tokens (read when a graph is traced: a warm pass never is)
            batch = ((ids, 0), (positions, 0)) if stored.lengths is not None else ()  # one graph for every B >= 2
            for tensor, dim in stored.varying + (((ids, 1), (positions, 1)) if T > 1 else ()) + batch:
                # a size below 2 is a graph of its own in torch (a pool of one block): that one, kept fixed
                mark = torch._dynamo.mark_dynamic if tensor.shape[dim] > 1 else torch._dynamo.maybe_mark_dynamic
                mark(tensor, dim)
            # the compiler's settings only where a graph may be compiled: a warm pass never compiles
            # (refused above instead), and entering the patch each step cost more than it reads as,
            # run after the weights have pushed Python's objects out of the cache (Q4_1 on a 2-core
            # Zen 4: 1.04x tok/s, 20 of 24 interleaved rounds faster).
            #
            # Read when the graph is compiled: torch.compile's own ``options`` do not reach freezing.
            # On a CPU, inductor's C++ GEMM template only, so that every compilation picks the same
            # kernels rather than whichever won a timing made with the weights in cache. Quantized
            # projections are called as they are (the kernels QuantProjection chose): with
            # max_autotune, inductor would offer its C++ template alone for them, which has no int4
            # variant without AVX-512, and no choice at all fails the compilation. On a CPU the
            # graph's wrapper is C++ too (cpp_wrapper): the ~400 kernel calls of a step no longer go
            # through Python one by one (Q4_1 on a 2-core Xeon: 1.10x tok/s, 1.02-1.25x in each of 9
            # interleaved rounds)
            backends = "CPP" if self.device.type == "cpu" else "ATEN,TRITON"
            tune = {} if self.quantized else {"max_autotune": True, "max_autotune_gemm_backends": backends}
            with torch._inductor.config.patch(freezing=True, cpp_wrapper=self.device.type == "cpu", **tune):
                out = run()
        self.warm.add(kind)
        stored.write(torch.stack(view.new_k), torch.stack(view.new_v))
        cache.commit(T)
        return out
