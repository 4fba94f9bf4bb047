"""Online-softmax paged attention: equal to attention over the gathered blocks, for random block
tables, ragged rows, grouped-query heads, split over the context; clear errors for bad input."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import LLMEngine
from inference_internals.params import SamplingParams
from inference_internals.kv_cache.paged_attention import paged_attention, paged_attention_split

TINY = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=96,
                   eos_token_id=2)
MODEL = random_model(TINY, seed=0, device="cpu")


def gathered(q, kc, vc, tables, positions):
    """The reference: each row's blocks end to end, a position mask, ordinary attention."""
    B, hq, T, hd = q.shape
    hkv = kc.shape[1]
    k = kc[tables].transpose(1, 2).reshape(B, hkv, -1, hd).repeat_interleave(hq // hkv, 1)
    v = vc[tables].transpose(1, 2).reshape(B, hkv, -1, hd).repeat_interleave(hq // hkv, 1)
    mask = torch.arange(k.shape[2])[None, None, None] <= positions[:, None, :, None]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=4),
       heads=st.sampled_from([(1, 1), (4, 2), (9, 3), (6, 6)]), block_size=st.sampled_from([1, 3, 4, 16]),
       splits=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_block_by_block_equals_gathered(rows, heads, block_size, splits, seed):
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    hd, T = 8, max(n for _, n in rows)
    nb = max(-(-length // block_size) for length, _ in rows)
    num_blocks = nb * len(rows) + 3
    kc, vc = torch.randn(2, num_blocks, hkv, block_size, hd, generator=g)
    # Random tables: each row's blocks anywhere in the pool; rows may share blocks (a prefix cache).
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:nb] for _ in rows])
    # Row b's T queries end at its last position; a shorter row repeats its last (a pad).
    positions = torch.tensor([[max(0, length - n + min(t, n - 1)) for t in range(T)] for length, n in rows])
    q = torch.randn(len(rows), hq, T, hd, generator=g)
    want = gathered(q, kc, vc, tables, positions)
    torch.testing.assert_close(paged_attention(q, kc, vc, tables, positions), want, atol=1e-5, rtol=1e-5)
    got = paged_attention_split(q, kc, vc, tables, positions, min(splits, nb))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bad_input_is_refused():
    kc = vc = torch.zeros(4, 2, 4, 8)
    q, tables, pos = torch.zeros(1, 4, 1, 8), torch.tensor([[0, 1]]), torch.tensor([[3]])
    with pytest.raises(ValueError, match="share"):
        paged_attention(torch.zeros(1, 3, 1, 8), kc, vc, tables, pos)
    with pytest.raises(ValueError, match="positions must lie"):
        paged_attention(q, kc, vc, tables, torch.tensor([[8]]))
    with pytest.raises(ValueError, match="block tables"):
        paged_attention(q, kc, vc, tables[0], pos)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention_split(q, kc, vc, tables, pos, 3)


@pytest.mark.parametrize("chunked", [False, True])
def test_engine_with_in_place_attention_matches_generate(chunked):
    """Through the engine (prefix caching on: later prompts read the first one's blocks)."""
    prompts = [[3, 4, 5, 6, 7, 3, 4, 5, 6], [3, 4, 5, 6, 7, 3, 4, 5, 7, 7], [5, 6]]
    engine = LLMEngine(MODEL, num_blocks=24, block_size=2, max_num_seqs=4, max_num_batched_tokens=6, attention="in_place",
                       enable_chunked_prefill=chunked)
    out = engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=6))
    out += engine.generate(prompts[1:], SamplingParams(temperature=0, max_tokens=6))
    out = [o.outputs[0].token_ids for o in out]
    assert engine.pool.prefix_hits > 0
    assert out == [generate(MODEL, p, 6) for p in prompts]
    with pytest.raises(ValueError, match="attention"):
        LLMEngine(MODEL, num_blocks=8, block_size=2, attention="flash")
