"""Tensor parallelism: one decoder layer split over several devices, Megatron-style.

Each of a layer's two sublayers is a pair of projections: the first split by its output features
(column-parallel), the second by its input features (row-parallel). No device then needs another's
activations in between, and the second projection leaves every device with a partial sum of the
full output: one all-reduce per sublayer, two per layer (Shoeybi et al. 2019,
https://arxiv.org/abs/1909.08053, section 3). Outside the layers, the embedding and the LM head are
split by vocabulary rows: a shard looks up only the ids in its rows and zeros the rest, so one more
all-reduce assembles the embeddings (vLLM's VocabParallelEmbedding), and each shard scores its slice
of the vocabulary, gathered into the full logits at the end (ParallelLMHead, then LogitsProcessor).

attention  q/k/v_proj by column in whole heads: a shard owns some key/value heads and the query
           heads that read them (grouped-query attention keeps the groups together); o_proj by
           row, the same heads' input features. Attention itself needs nothing from other shards.
MLP        gate/up_proj by column (a slice of the intermediate features), down_proj by row.

vLLM's names for the same layers are QKVParallelLinear, MergedColumnParallelLinear (gate|up) and
RowParallelLinear (o_proj, down_proj); it requires the query heads to divide evenly by the
tensor-parallel size, and replicates K/V heads when there are fewer of them than devices.

Here the shards are modules on one CPU and the all-reduce is their sum: the arithmetic is exactly
what the devices would do, and ``sharded_logits`` gives logits to set beside the unsplit model's. What the
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


def _vocab_bounds(vocab: int, shards: int) -> list[tuple[int, int]]:
    """Each shard's rows [start, stop) of the vocabulary."""
    bounds = [0]
    for n in split_evenly(vocab, shards):
        bounds.append(bounds[-1] + n)
    return list(zip(bounds, bounds[1:]))


def sharded_embedding(embedding: nn.Embedding, ids: torch.Tensor, shards: int) -> torch.Tensor:
    """``embedding(ids)`` as ``shards`` devices holding disjoint vocabulary rows compute it (vLLM's
    VocabParallelEmbedding): each looks up the ids in its rows, zeros the others, and one all-reduce
    (here: the sum) gives every device every token's embedding."""
    partials = []
    for start, stop in _vocab_bounds(embedding.num_embeddings, shards):
        mine = (ids >= start) & (ids < stop)
        rows = embedding.weight[start:stop][torch.where(mine, ids - start, 0)]
        partials.append(rows * mine.unsqueeze(-1))
    return torch.stack(partials).sum(0)


@torch.inference_mode()
def sharded_logits(model, input_ids: torch.Tensor, shards: int) -> tuple[torch.Tensor, int]:
    """The model's logits [B, T, vocab] with the embedding, every layer and the LM head split over
    ``shards``, and the number of all-reduces it took: one for the embedding, two per layer. The LM
    head is split by vocabulary rows (vLLM's ParallelLMHead): each shard scores its slice of the
    vocabulary, and the slices are gathered (concatenated), a gather rather than an all-reduce."""
    ids = torch.as_tensor(input_ids, device=model.device)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    x = sharded_embedding(model.embed_tokens, ids, shards)
    reduces = 1 if shards > 1 else 0
    cos, sin = model.rotary(positions, x.dtype)
    for block in model.layers:
        layer = ShardedBlock.split(block, shards)
        x = layer(x, cos, sin)
        reduces += layer.all_reduces
    x = model.norm(x)
    bounds = _vocab_bounds(model.config.vocab_size, shards)
    return torch.cat([_rows(model.lm_head, a, b)(x) for a, b in bounds], dim=-1), reduces


# --- what it costs: traffic per token ---------------------------------------------------------

def allreduce_bytes(cfg: LlamaConfig, tp: int, bytes_per_value: float = 2) -> dict[str, float]:
    """Per generated token, what ``tp`` devices send one another:

    ``all_reduces``   two per layer and one for the vocabulary-parallel embedding, each of one
                      hidden vector (``message_bytes``);
    ``allreduce_sent`` the bytes each device sends for them with a ring all-reduce (2 (tp - 1) / tp
                      times the message: a reduce-scatter then an all-gather);
    ``gather_sent``   the bytes each device sends to gather the logits, its slice of the vocabulary
                      to every other device (an all-gather: (tp - 1) / tp of the vocabulary's logits);
    ``sent_per_device`` both together."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    count = 2 * cfg.num_hidden_layers + 1 if tp > 1 else 0
    message = cfg.hidden_size * bytes_per_value
    reduced = count * message * 2 * (tp - 1) / tp
    gathered = cfg.vocab_size * bytes_per_value * (tp - 1) / tp
    return {"all_reduces": count, "message_bytes": message, "allreduce_sent": reduced,
            "gather_sent": gathered, "sent_per_device": reduced + gathered}


def decode_step_time(machine: Machine, n_params: float, cfg: LlamaConfig, tp: int, link_bandwidth: float,
                     link_latency: float = 0.0, dtype: str = "bf16", batch: int = 1) -> dict[str, float]:
    """The bandwidth law with an interconnect: a batch-``batch`` decode step on ``tp`` devices.

    Each device reads 1/tp of the ``n_params`` weights a step reads from its own memory, then the
    all-reduces send ``batch`` hidden vectors each and the logits' gather ``batch`` slices of the
    vocabulary, over links of ``link_bandwidth`` bytes/s per device and direction, each collective
    paying ``link_latency`` seconds. Weights shrink with tp, the communication does not: past some
    tp, or over a slow link, communication is the step.
    """
    if link_bandwidth <= 0 or link_latency < 0:
        raise ValueError("link_bandwidth must be > 0 and link_latency >= 0")
    weights = n_params * bytes_per_param(dtype) / tp / machine.bandwidth
    traffic = allreduce_bytes(cfg, tp, bytes_per_param(dtype))
    collectives = traffic["all_reduces"] + (1 if tp > 1 else 0)  # and the logits' gather
    comm = traffic["sent_per_device"] * batch / link_bandwidth + collectives * link_latency
    return {"weights": weights, "communication": comm, "total": weights + comm}
