"""CUDA graphs for the decode step: record its kernels once, then replay them with one launch.

A decode step of a 135M model is hundreds of small kernels. Eager PyTorch launches each from
Python (a few microseconds apiece), so on a GPU the step is bound by launches, not by the bandwidth
the bandwidth law assumes. A CUDA graph records the step's kernels once and replays them all with
one launch.

Replaying is only correct if every replay does the same thing to the same memory, so the step
must not depend on host values: ``kv_cache.static.StaticKVCache`` keeps fixed-shape K/V buffers
and takes its write position from a device tensor (``positions``), builds the mask on the device
(each query sees the slots at or before its position), and attends over all ``max_len`` slots
(the unfilled ones masked out). The step goes through the model's public forward and the cache
protocol like any other cache (``model(ids, positions=..., cache=..., last_only=True)``); only the
runner, ``GraphDecoder``, knows about graphs. It serves one batch of equal-length prompts (every
row at the same position), the decode shape a fixed-batch server replays.

On a CPU, ``graph=True`` is refused with an error; ``graph=False`` runs the very same static step
eagerly, which is how the tests check it is token-identical to ``generate`` without a GPU. It is
also what launch overhead is measured against: attending over every slot with a mask is not the
kernel ``generate``'s step uses (one query, no mask: flash attention with GQA on CUDA), so only
this step run eagerly and replayed differ by launches alone (gpu-check times both).
"""
from __future__ import annotations

import torch

from .generate import collect, decode_loop
from .kv_cache.contiguous import CacheFullError
from .kv_cache.static import StaticKVCache
from .params import check_request
from .timing import clock
from .sampling import greedy


class GraphDecoder:
    """Prefill a batch eagerly, then decode one token per row per ``step``, replaying a CUDA graph.

    ``graph=True`` needs a model on a CUDA device: the first ``step`` captures the decode step
    (after a warm-up, on a side stream, that leaves the cache as it was) and every later one copies
    the new ids into the graph's input buffer and replays it. ``graph=False`` runs the same step
    eagerly (any device). The logits a step returns live in a buffer the next step overwrites.
    """

    def __init__(self, model, batch_size: int, max_len: int, graph: bool = True):
        if graph and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on a CUDA device, and this one is on "
                             f"{model.device.type}: use graph=False (the same static step, run eagerly)")
        self.model, self.use_graph, self.max_len = model, graph, max_len
        dev = model.device
        self.cache = StaticKVCache(model.config, batch_size, max_len, dev, model.dtype)
        self.ids = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)   # the step's input
        self.pos = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)   # its position
        self.length = 0  # tokens in the cache, counted on the host (never read from the device)
        self.graph, self.out = None, None
        self.logits = None  # the latest step's logits [B, V]

    def _step(self) -> torch.Tensor:
        """The captured region: one token per row in, logits out, position moved on. No host reads."""
        logits = self.model(self.ids, positions=self.pos, cache=self.cache, last_only=True)[:, -1]
        self.pos.add_(1)
        return logits

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the prompts ``ids`` [B, T] or a ``params.CheckedRequest`` (eagerly: every prompt
        length is a new shape) into the cache; returns the last position's logits [B, V]."""
        ids = check_request(ids, self.model.config, 0).ids.to(self.model.device)
        B, T = ids.shape
        if B != self.cache.batch_size:
            raise ValueError(f"batch of {B} prompts, but the decoder was made for {self.cache.batch_size}")
        if T >= self.max_len:
            raise CacheFullError(f"a prompt of {T} tokens leaves no room in max_len={self.max_len}")
        positions = torch.arange(T, device=ids.device).expand(B, -1)
        logits = self.model(ids, positions=positions, cache=self.cache, last_only=True)[:, -1]
        self.pos.fill_(T)
        self.length = T
        self.logits = logits
        return logits

    @torch.inference_mode()
    def step(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed ``next_ids`` [B] (on the model's device) and return the next logits [B, V]."""
        if self.length == 0:
            raise RuntimeError("call prefill before step")
        if self.length >= self.max_len:
            raise CacheFullError(f"the decoder holds {self.length} of {self.max_len} tokens")
        self.ids.copy_(next_ids.reshape(-1, 1))
        if not self.use_graph:
            out = self._step()
        else:
            if self.graph is None:
                self._capture()
            self.graph.replay()
            out = self.out
        self.length += 1
        self.logits = out
        return out

    def _capture(self) -> None:
        # Warm up on a side stream first (cuBLAS and the caching allocator set themselves up on
        # first use, which a graph must not record), putting the position back each time: the
        # warm-up writes the slot the real step will write again with the same values.
        start = self.pos.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step()
                self.pos.copy_(start)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._step()
        self.pos.copy_(start)  # capturing records the kernels without running them; be sure


@torch.inference_mode()
def generate_graphed(model, prompt, max_new_tokens: int = 64, sample=greedy, stop_ids=None,
                     include_stop: bool = True, graph: bool = True):
    """``generate`` with the decode step replayed from a CUDA graph: same arguments, same tokens.

    The prompts of a batch must have equal lengths. ``graph=False`` runs the static step eagerly.
    """
    req = check_request(prompt, model.config, max_new_tokens, stop_ids)  # the one check
    B, T = req.ids.shape
    # one slot more than generate's cache: the decoder never has to refuse the last step
    dec = GraphDecoder(model, B, min(T + req.max_new_tokens + 1, model.config.max_position_embeddings), graph=graph)
    if req.max_new_tokens == 0:
        return collect([], prompt, req, include_stop)
    logits = dec.prefill(req)
    steps = list(decode_loop(logits, dec.step, req, sample, is_full=lambda: dec.length >= dec.max_len))
    return collect(steps, prompt, req, include_stop)


@torch.inference_mode()
def decode_seconds(dec: GraphDecoder, steps: int) -> float:
    """Seconds per greedy decode step over ``steps`` steps after the prefill (or the last step),
    with no host read inside the loop (the argmax stays on the device): what the device sustains,
    not what a Python loop that reads every token waits for."""
    if dec.logits is None:
        raise RuntimeError("call prefill before decode_seconds")
    if steps < 1 or dec.length + steps > dec.max_len:
        raise ValueError(f"need 1 <= steps <= {dec.max_len - dec.length} (room left), got {steps}")
    t0 = clock(dec.model.device)
    for _ in range(steps):
        dec.step(dec.logits.argmax(-1))
    return (clock(dec.model.device) - t0) / steps
