"""Tensor parallelism on two (and three) CPU shards: the split layer is the unsplit layer."""
import pytest
import torch

from inference_internals.model import LlamaConfig, random_model
from inference_internals.analysis.roofline import GPUS
from inference_internals.analysis.tensor_parallel import (ShardedBlock, allreduce_bytes, decode_step_time, shard_attention,
                                                 shard_mlp, sharded_embedding, sharded_logits,
                                                 split_evenly)


def test_split_evenly():
    assert split_evenly(3, 2) == [2, 1] and split_evenly(1536, 2) == [768, 768] and split_evenly(9, 9) == [1] * 9
    for bad in (0, 4):
        with pytest.raises(ValueError, match="cannot split"):
            split_evenly(3, bad)


def test_shards_hold_disjoint_slices_of_the_weights(model):
    attn, mlp = model.layers[3].self_attn, model.layers[3].mlp
    parts = shard_attention(attn, 2)
    # column-parallel: the shards' output rows stack back into the full matrix; row-parallel: the columns
    assert torch.equal(torch.cat([p.q_proj.weight for p in parts]), attn.q_proj.weight)
    assert torch.equal(torch.cat([p.k_proj.weight for p in parts]), attn.k_proj.weight)
    assert torch.equal(torch.cat([p.o_proj.weight for p in parts], dim=1), attn.o_proj.weight)
    assert [p.cfg.num_key_value_heads for p in parts] == [2, 1] and [p.cfg.num_attention_heads for p in parts] == [6, 3]
    m = shard_mlp(mlp, 2)
    assert [p.gate_proj.out_features for p in m] == [768, 768]
    assert torch.equal(torch.cat([p.down_proj.weight for p in m], dim=1), mlp.down_proj.weight)


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_layer_equals_the_unsplit_layer(model, shards):
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 7]])
    x = model.embed_tokens(ids)
    cos, sin = model.rotary(torch.arange(ids.shape[1])[None], x.dtype)
    with torch.no_grad():
        for i in (0, 14, 29):
            layer = ShardedBlock.split(model.layers[i], shards)
            full = model.layers[i](x, cos, sin)
            torch.testing.assert_close(layer(x, cos, sin), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())
            assert layer.all_reduces == 2  # one after attention, one after the MLP


def test_sharded_model_gives_the_same_logits(model):
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    logits, reduces = sharded_logits(model, ids, 2)
    with torch.no_grad():
        full = model(ids)
    assert reduces == 2 * model.config.num_hidden_layers + 1  # two per layer, one for the embedding
    torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)
    assert torch.equal(logits.argmax(-1), full.argmax(-1))


def test_uneven_vocab_and_a_random_model():
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=8, max_position_embeddings=64)
    m = random_model(cfg, seed=1)
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = m(ids)
    for shards in (2, 3, 4):
        torch.testing.assert_close(sharded_logits(m, ids, shards)[0], full, rtol=1e-5, atol=1e-5)


def test_sharded_embedding_is_the_embedding():
    emb = torch.nn.Embedding(101, 8)
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for shards in (1, 2, 3, 7):
            assert torch.equal(sharded_embedding(emb, ids, shards), emb(ids))


def test_allreduce_bytes_from_the_config():
    cfg = LlamaConfig()  # SmolLM2-135M: 30 layers, hidden 576, vocabulary 49152
    assert allreduce_bytes(cfg, 1) == {"all_reduces": 0, "message_bytes": 1152, "allreduce_sent": 0.0,
                                       "gather_sent": 0.0, "sent_per_device": 0.0}
    for tp, ring in ((2, 1.0), (4, 1.5), (8, 1.75)):
        t = allreduce_bytes(cfg, tp)
        assert t["all_reduces"] == 61 and t["message_bytes"] == 576 * 2  # 2 per layer + the embedding's
        assert t["allreduce_sent"] == 61 * 1152 * ring
        assert t["gather_sent"] == 49152 * 2 * ring / 2  # its slice to every other device: (tp - 1) / tp
        assert t["sent_per_device"] == t["allreduce_sent"] + t["gather_sent"]


def test_decode_time_weights_shrink_communication_does_not():
    h100, cfg = GPUS["H100 SXM"], LlamaConfig(hidden_size=8192, num_hidden_layers=80)
    t = {tp: decode_step_time(h100, 70e9, cfg, tp, link_bandwidth=450e9, link_latency=5e-6) for tp in (1, 2, 4, 8)}
    assert t[1]["communication"] == 0
    assert all(t[2 * a]["weights"] == pytest.approx(t[a]["weights"] / 2) for a in (1, 2, 4))
    assert t[2]["communication"] < t[4]["communication"] < t[8]["communication"]
    slow = decode_step_time(h100, 70e9, cfg, 8, link_bandwidth=50e9, link_latency=5e-6)
    assert slow["communication"] > t[8]["communication"]
    with pytest.raises(ValueError):
        decode_step_time(h100, 70e9, cfg, 2, link_bandwidth=0)
