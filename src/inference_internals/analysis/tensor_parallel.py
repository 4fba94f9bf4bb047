"""Tensor parallelism: one decoder layer split over several devices, Megatron-style.

Each of a layer's two sublayers is a pair of projections: the first split by its output features
(column-parallel), the second by its input features (row-parallel). No device then needs another's
activations in between, and the second projection leaves every device with a partial sum of the
full output: one all-reduce per sublayer, two per layer (Shoeybi et al. 2019,
https://arxiv.org/abs/1909.08053, section 3).

attention  q/k/v_proj by column in whole heads: a shard owns some key/value heads and the query
           heads that read them (grouped-query attention keeps the groups together); o_proj by
           row, the same heads' input features. Attention itself needs nothing from other shards.
MLP        gate/up_proj by column (a slice of the intermediate features), down_proj by row.

vLLM's names for the same layers are QKVParallelLinear, MergedColumnParallelLinear (gate|up) and
RowParallelLinear (o_proj, down_proj); it requires the query heads to divide evenly by the
tensor-parallel size, and replicates K/V heads when there are fewer of them than devices.

Here the shards are modules on one CPU and the all-reduce is their sum: the arithmetic is exactly
what the devices would do, and ``layer_forward`` checks it against the unsplit layer. What the
split costs is traffic: ``allreduce_bytes`` and ``decode_step_time`` put numbers on it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..model import MLP, Attention, Block, LlamaConfig
from .roofline import Machine, bytes_per_param


def split_evenly(n: int, parts: int) -> list[int]:
    """``n`` items over ``parts`` shards, sizes differing by at most one (the first ones larger)."""
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} items over {parts} shards: need 1 <= shards <= {n}")
    return [n // parts + (i < n % parts) for i in range(parts)]


def _rows(linear: nn.Linear, start: int, stop: int) -> nn.Linear:
    """The output features [start, stop) of ``linear``: its column-parallel shard."""
    out = nn.Linear(linear.in_features, stop - start, bias=False).to(linear.weight)
    out.weight.data.copy_(linear.weight.data[start:stop])
    return out


def _cols(linear: nn.Linear, start: int, stop: int) -> nn.Linear:
    """The input features [start, stop) of ``linear``: its row-parallel shard."""
    out = nn.Linear(stop - start, linear.out_features, bias=False).to(linear.weight)
    out.weight.data.copy_(linear.weight.data[:, start:stop])
    return out


def shard_attention(attn: Attention, shards: int) -> list[Attention]:
    """``attn`` split into ``shards`` attentions over disjoint groups of key/value heads.

    Each is an ordinary ``Attention`` with fewer heads, so it runs the model's own forward; its
    output is a partial sum of the full layer's (its slice of o_proj's input features).
    """
    cfg, hd = attn.cfg, attn.cfg.head_dim
    out, kv0 = [], 0
    for kv in split_evenly(cfg.num_key_value_heads, shards):
        q0, q = kv0 * cfg.n_rep, kv * cfg.n_rep
        part = Attention(replace(cfg, num_attention_heads=q, num_key_value_heads=kv), attn.layer_idx)
        part.q_proj = _rows(attn.q_proj, q0 * hd, (q0 + q) * hd)
        part.k_proj = _rows(attn.k_proj, kv0 * hd, (kv0 + kv) * hd)
        part.v_proj = _rows(attn.v_proj, kv0 * hd, (kv0 + kv) * hd)
        part.o_proj = _cols(attn.o_proj, q0 * hd, (q0 + q) * hd)
        out.append(part)
        kv0 += kv
    return out


def shard_mlp(mlp: MLP, shards: int) -> list[MLP]:
    """``mlp`` split into ``shards`` SwiGLUs over disjoint slices of the intermediate features."""
    cfg = LlamaConfig(hidden_size=mlp.down_proj.out_features, intermediate_size=mlp.down_proj.in_features)
    out, i0 = [], 0
    for n in split_evenly(cfg.intermediate_size, shards):
        part = MLP(replace(cfg, intermediate_size=n))
        part.gate_proj = _rows(mlp.gate_proj, i0, i0 + n)
        part.up_proj = _rows(mlp.up_proj, i0, i0 + n)
        part.down_proj = _cols(mlp.down_proj, i0, i0 + n)
        out.append(part)
        i0 += n
    return out


@dataclass
class ShardedBlock:
    """One decoder layer as ``shards`` devices hold it: the norms replicated, the rest split."""
    block: Block
    attention: list[Attention]
    mlp: list[MLP]
    all_reduces: int = 0      # partial sums combined so far (each one an all-reduce on real devices)

    @classmethod
    def split(cls, block: Block, shards: int) -> "ShardedBlock":
        return cls(block, shard_attention(block.self_attn, shards), shard_mlp(block.mlp, shards))

    def all_reduce(self, partials: list[torch.Tensor]) -> torch.Tensor:
        self.all_reduces += 1
        return torch.stack(partials).sum(0)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``x`` [B, T, hidden] (no cache: a prefill from position 0)."""
        h = self.block.input_layernorm(x)
        x = x + self.all_reduce([a(h, cos, sin) for a in self.attention])
        h = self.block.post_attention_layernorm(x)
        return x + self.all_reduce([m(h) for m in self.mlp])


@torch.inference_mode()
def sharded_logits(model, input_ids: torch.Tensor, shards: int) -> tuple[torch.Tensor, int]:
    """The model's logits [B, T, vocab] with every layer split over ``shards``, and the number of
    all-reduces it took. The LM head is split by vocabulary rows (vLLM's ParallelLMHead): each
    shard scores its slice of the vocabulary, and the slices are gathered (concatenated)."""
    ids = torch.as_tensor(input_ids, device=model.device)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    x = model.embed_tokens(ids)
    cos, sin = model.rotary(positions, x.dtype)
    reduces = 0
    for block in model.layers:
        layer = ShardedBlock.split(block, shards)
        x = layer(x, cos, sin)
        reduces += layer.all_reduces
    x = model.norm(x)
    bounds = [0]
    for n in split_evenly(model.config.vocab_size, shards):
        bounds.append(bounds[-1] + n)
    return torch.cat([_rows(model.lm_head, a, b)(x) for a, b in zip(bounds, bounds[1:])], dim=-1), reduces


# --- what it costs: traffic per token ---------------------------------------------------------

def allreduce_bytes(cfg: LlamaConfig, tp: int, bytes_per_value: float = 2) -> dict[str, float]:
    """Per generated token: the all-reduces, the bytes each one reduces (one hidden vector), and the
    bytes each device sends for all of them with a ring all-reduce (2 (tp - 1) / tp times the
    message: a reduce-scatter then an all-gather, each moving (tp - 1) / tp of it)."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    count = 2 * cfg.num_hidden_layers if tp > 1 else 0
    message = cfg.hidden_size * bytes_per_value
    return {"all_reduces": count, "message_bytes": message,
            "sent_per_device": count * message * 2 * (tp - 1) / tp}


def decode_step_time(machine: Machine, n_params: float, cfg: LlamaConfig, tp: int, link_bandwidth: float,
                     link_latency: float = 0.0, dtype: str = "bf16", batch: int = 1) -> dict[str, float]:
    """The bandwidth law with an interconnect: a batch-``batch`` decode step on ``tp`` devices.

    Each device reads 1/tp of the weights from its own memory, then the layer's all-reduces send
    ``batch`` hidden vectors each over links of ``link_bandwidth`` bytes/s per device and direction,
    each paying ``link_latency`` seconds. Weights shrink with tp, the all-reduces do not: past some
    tp, or over a slow link, communication is the step.
    """
    if link_bandwidth <= 0 or link_latency < 0:
        raise ValueError("link_bandwidth must be > 0 and link_latency >= 0")
    weights = n_params * bytes_per_param(dtype) / tp / machine.bandwidth
    traffic = allreduce_bytes(cfg, tp, bytes_per_param(dtype))
    comm = traffic["sent_per_device"] * batch / link_bandwidth + traffic["all_reduces"] * link_latency
    return {"weights": weights, "communication": comm, "total": weights + comm}
