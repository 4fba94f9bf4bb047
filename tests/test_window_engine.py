"""The sliding window through the one runtime: a Gemma-shaped tiny model (window 4, blocks of 2
tokens) gives the same tokens through every engine path as through the contiguous cache and with no
cache at all, on prompts and generations much longer than its window."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from inference_internals import LLM, SamplingParams
from inference_internals.generate import generate
from inference_internals.kv_cache import PagedKVCache
from inference_internals.kv_cache.paged_attention import InPlaceBatch
from inference_internals.model import LlamaConfig, random_model

WINDOW = 4


def tiny_gemma(window=WINDOW, seed=3):
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=128, model_type="gemma3_text",
                      layer_types=("sliding_attention", "sliding_attention", "full_attention", "sliding_attention"),
                      sliding_window=window, rope_local_theta=100.0, qk_norm=True, sandwich_norms=True,
                      norm_offset=1.0, embed_scale=True, hidden_act="gelu_pytorch_tanh", eos_token_id=0)
    return random_model(cfg, seed=seed, device="cpu")


@pytest.fixture(scope="module")
def tiny():
    return tiny_gemma()


def uncached_greedy(model, prompt, n):
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


PROMPTS = [[5, 17, 33, 2, 8, 9, 41, 3, 70, 12, 11], [7, 7, 7], [60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def want(tiny):
    return [uncached_greedy(tiny, p, 12) for p in PROMPTS]


def test_contiguous_cache_equals_no_cache(tiny, want):
    assert [generate(tiny, p, max_new_tokens=12, stop_ids=[]) for p in PROMPTS] == want


@pytest.mark.parametrize("settings", [{}, {"packed": True}, {"attention": "in_place"}, {"padded_prefill": True},
                                      {"enable_chunked_prefill": True, "max_num_batched_tokens": 5, "max_num_seqs": 3}],
                         ids=["padded", "packed", "in_place", "padded_prefill", "chunked"])
def test_every_engine_layout_equals_no_cache(tiny, want, settings):
    llm = LLM(tiny, block_size=2, **settings)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert [list(o.outputs[0].token_ids) for o in outs] == want


@pytest.mark.parametrize("packed", [False, True])
def test_speculative_prompt_lookup_equals_no_cache(tiny, want, packed):
    llm = LLM(tiny, block_size=2, packed=packed,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert [list(o.outputs[0].token_ids) for o in outs] == want


def test_in_place_attention_reads_only_the_window(tiny):
    """The in-place kernel hides keys window or more positions back: it equals the gathered view."""
    pool = PagedKVCache.for_model(tiny, 16, 2)
    ids = torch.tensor([PROMPTS[2]])
    view_a = pool.batch([list(range(8))], [0], [15])
    with torch.inference_mode():
        a = tiny(ids, cache=view_a)
        b = tiny(ids, cache=InPlaceBatch(pool, [list(range(8, 16))], [0], [15]))
        c = tiny(ids)
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5)


def test_the_local_pool_frees_blocks_as_they_leave_the_window(tiny, want):
    """A long generation holds a bounded number of local blocks: window / block size, plus the block the
    window straddles and the one being written; the full layers keep every block."""
    llm = LLM(tiny, block_size=2)
    outs = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert list(outs[0].outputs[0].token_ids)[:12] == want[0]
    assert llm.pool.local_freed >= (len(PROMPTS[0]) + 40 - WINDOW) // 2 - 1
    assert llm.cache.has_local and llm.cache.local_k.shape[0] == 3 and llm.cache.k.shape[0] == 1
    # the local pool was sized for a window, not for the whole sequence
    assert llm.pool.local.num_blocks < llm.pool.num_blocks


def test_held_local_blocks_stay_bounded_during_decoding(tiny):
    llm = LLM(tiny, block_size=2, num_blocks=64)
    llm.add_request({"prompt_token_ids": PROMPTS[2]}, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    held = []
    while llm.has_unfinished():
        llm.step()
        for s in llm.scheduler.sequences:
            held.append(sum(b is not None for b in s.local_table))
            assert len(s.block_table) == -(-s.num_cached // 2)  # the full layers keep every stored token
    assert max(held[1:]) <= WINDOW // 2 + 2
    assert llm.pool.local.num_free == llm.pool.local.num_blocks and llm.pool.num_free == 64


@given(prompts=st.lists(st.lists(st.integers(1, 96), min_size=1, max_size=14), min_size=1, max_size=4),
       max_tokens=st.integers(1, 14), temperature=st.sampled_from([0.0, 1.0]), n=st.integers(1, 3),
       packed=st.booleans(), num_blocks=st.integers(8, 30), spec=st.booleans(),
       chunked=st.booleans(), block_size=st.sampled_from([1, 2, 3]))
@settings(max_examples=25, deadline=None)
def test_no_leaked_or_double_owned_block_in_either_pool(tiny, prompts, max_tokens, temperature, n, packed,
                                                        num_blocks, spec, chunked, block_size):
    """Windows freeing, forks sharing, guesses taking and giving back slots, preemption freeing: after every
    step every block of both pools is held exactly as often as tables name it, no sequence holds a local
    block its window has left, and at the end all are free."""
    if temperature == 0:
        n = 1
    settings_ = dict(block_size=block_size, num_blocks=num_blocks, packed=packed and not chunked)
    if spec and not chunked:
        settings_["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3}
    if chunked:
        settings_.update(enable_chunked_prefill=True, max_num_batched_tokens=6, max_num_seqs=4)
    llm = LLM(tiny, **settings_)
    params = SamplingParams(temperature=temperature, seed=3, n=n, max_tokens=max_tokens, ignore_eos=True)
    reqs = []
    for p in prompts:
        try:
            reqs.append(llm.add_request(p, params))
        except Exception:  # a request that can never fit is refused at the door; nothing changed
            llm.pool.check(llm.scheduler.sequences)
    while llm.has_unfinished():
        llm.step()
        llm.pool.check(llm.scheduler.sequences)
    assert llm.pool.num_free == num_blocks and llm.pool.local.num_free == llm.pool.local.num_blocks
    for r in reqs:
        assert [len(o) for o in r.outputs] == [max_tokens] * n


def test_ring_cache_equals_no_cache_and_holds_a_window(tiny, want):
    from inference_internals.kv_cache import KVCache, RingKVCache

    for p, w in zip(PROMPTS, want):
        ring = RingKVCache.for_model(tiny, 1, len(p) + 12)
        from inference_internals.generate import generate_stream
        out = [int(t) for t in generate_stream(tiny, [p], max_new_tokens=12, stop_ids=[], cache=ring)]
        assert out == w
    ids = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(2))
    ring = RingKVCache.for_model(tiny, 2, 30, slack=2)
    with torch.inference_mode():
        full = tiny(ids)
        steps = [tiny(ids[:, :9], cache=ring)] + [tiny(ids[:, t:t + 3], cache=ring) for t in range(9, 30, 3)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    # 1 full layer of 30 slots and 3 sliding layers of window + slack = 6 slots, instead of 4 x 30
    per_slot = 2 * 2 * 1 * 16 * 4
    assert ring.nbytes == per_slot * (30 + 3 * 6) < KVCache.for_model(tiny, 2, 30).nbytes == per_slot * 4 * 30


def test_ring_cache_rolls_back_within_its_slack(tiny):
    from inference_internals.kv_cache import RingKVCache

    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(4))
    ring = RingKVCache.for_model(tiny, 1, 20, slack=2)
    with torch.inference_mode():
        tiny(ids[:, :12], cache=ring)
        tiny(ids[:, 12:15], cache=ring)   # three guesses
        ring.crop(13)                     # two rejected
        a = tiny(ids[:, 13:16], cache=ring)[:, -1]
        with pytest.raises(ValueError, match="rolls back at most 3"):
            ring.crop(11)
        b = tiny(ids[:, :16])[:, -1]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_windowed_memory_formula_for_gemma():
    """bf16, one K/V head of 256: 1 KiB per token and layer; 3 global layers keep every token, 15 local ones 512."""
    from inference_internals.analysis.kv_memory import windowed_kv_bytes
    from inference_internals.model import LlamaConfig
    from inference_internals.weights import model_dir

    cfg = LlamaConfig.from_json(model_dir("gemma-3-270m") / "config.json")
    assert [windowed_kv_bytes(cfg, n) for n in (1024, 8192, 32768)] == [11_010_048, 33_030_144, 108_527_616]
    assert windowed_kv_bytes(cfg, 300) == 18 * 1024 * 300  # inside the window nothing is saved
    assert windowed_kv_bytes(LlamaConfig(), 100) == 2 * 30 * 3 * 64 * 2 * 100  # no window: every layer


def test_local_tables_are_checked(tiny):
    pool = PagedKVCache.for_model(tiny, 8, 2, num_local_blocks=4)
    assert pool.has_local and pool.nbytes == 2 * 2 * 16 * 4 * (1 * 8 + 3 * 4)
    with pytest.raises(ValueError, match="one local block table per row"):
        pool.batch([[0, 1]], [0], [3])
    with pytest.raises(ValueError, match="inside the window"):
        pool.batch([[0, 1, 2, 3]], [6], [1], [[None, None, 1, 2]])  # position 6 sees 3..6: block 1 is needed
    pool.batch([[0, 1, 2, 3]], [6], [1], [[None, 0, 1, 2]])
    with pytest.raises(ValueError, match="sliding-window"):
        PagedKVCache(LlamaConfig(num_hidden_layers=1), 4, 2, num_local_blocks=2)
