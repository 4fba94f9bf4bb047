"""The graph-safe decode step (cuda_graph.py): on the CPU, everything but the capture itself."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.cuda_graph import GraphDecoder, StaticKVCache, decode_seconds, generate_graphed
from inference_internals.generate import generate
from inference_internals.kv_cache import CacheFullError
from inference_internals.model import LlamaConfig, random_model
from inference_internals.sampling import Sampler

TINY = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
MODEL = random_model(TINY, seed=0, device="cpu", dtype=torch.float64)  # fp64: no near-ties to flip


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 10), st.integers(0, 20), st.integers(0, 10**6))
def test_static_step_is_token_identical_to_generate(batch, prompt_len, new, seed):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, TINY.vocab_size, (batch, prompt_len), generator=g).tolist()
    assert generate_graphed(MODEL, prompt, new, graph=False, stop_ids=[]) == generate(MODEL, prompt, new, stop_ids=[])


def test_static_step_stops_and_samples_like_generate():
    prompt = [5, 17, 3]
    eos = generate(MODEL, prompt, 12, stop_ids=[])[4]  # make the 5th token a stop token
    assert generate_graphed(MODEL, prompt, 12, graph=False, stop_ids=[eos]) == generate(MODEL, prompt, 12, stop_ids=[eos])
    assert (generate_graphed(MODEL, prompt, 12, Sampler(temperature=1.0, seed=3), graph=False)
            == generate(MODEL, prompt, 12, Sampler(temperature=1.0, seed=3)))


def test_logits_match_the_eager_model_step_by_step():
    dec = GraphDecoder(MODEL, 1, 12, graph=False)
    ids = [4, 8, 15, 16]
    logits = dec.prefill([ids])
    with torch.no_grad():
        for t in (23, 42, 7):
            torch.testing.assert_close(logits, MODEL(torch.tensor([ids]))[:, -1])
            ids.append(t)
            logits = dec.step(torch.tensor([t]))
    assert dec.length == 7 and dec.pos.tolist() == [[7]]


def test_graphs_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match="CUDA graphs need a model on a CUDA device.*graph=False"):
        GraphDecoder(MODEL, 1, 8)
    with pytest.raises(ValueError, match="CUDA graphs need"):
        generate_graphed(MODEL, [1, 2, 3], 4)


def test_bad_use_is_refused():
    dec = GraphDecoder(MODEL, 2, 6, graph=False)
    with pytest.raises(RuntimeError, match="prefill"):
        dec.step(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="made for 2"):
        dec.prefill([[1, 2, 3]])
    with pytest.raises(CacheFullError):
        dec.prefill([[1] * 6, [2] * 6])
    logits = dec.prefill([[1] * 4, [2] * 4])
    dec.step(logits.argmax(-1))
    dec.step(logits.argmax(-1))
    with pytest.raises(CacheFullError):
        dec.step(logits.argmax(-1))
    with pytest.raises(ValueError, match="context window"):
        StaticKVCache(TINY, 1, 65, "cpu", torch.float32)
    with pytest.raises(ValueError, match="room left"):
        decode_seconds(dec, 1)
    with pytest.raises(RuntimeError, match="prefill"):
        decode_seconds(GraphDecoder(MODEL, 1, 4, graph=False), 1)


def test_decode_seconds_times_the_steps():
    dec = GraphDecoder(MODEL, 1, 16, graph=False)
    dec.prefill([[1, 2]])
    assert decode_seconds(dec, 5) > 0 and dec.length == 7
