"""The paged engine on the real model: same logits as the contiguous cache, same greedy tokens."""
import pytest
import torch

from inference_internals.generate import generate
from inference_internals.kv_cache import KVCache
from inference_internals.engine import BlockPool, LLMEngine, Sequence
from inference_internals.kv_cache import PagedKVCache
from inference_internals.params import SamplingParams

TEXTS = ["The capital of France is", "def fibonacci(n):\n    ",
         "Once upon a time, in a small village by the sea, there lived an old fisherman who",
         "1, 2, 3, 4, 5,"]


def test_ragged_batch_logits_match_contiguous_cache(model, tokenizer):
    """Prefill three prompts of different lengths in one padded batch, then decode them together:
    every row's logits equal those of its own contiguous KVCache."""
    prompts = [tokenizer.encode(t) for t in TEXTS[:3]]
    assert len({len(p) for p in prompts}) == 3
    steps, bs = 4, 4
    # Reference: one prompt at a time, contiguous cache, greedy tokens.
    ref_logits, ref_tokens = [], []
    with torch.inference_mode():
        for p in prompts:
            cache = KVCache.for_model(model, 1, len(p) + steps)
            x, rows, toks = torch.tensor([p]), [], []
            for _ in range(steps + 1):
                last = model(x, cache=cache, last_only=True)[0, -1]
                rows.append(last)
                toks.append(int(last.argmax()))
                x = torch.tensor([[toks[-1]]])
            ref_logits.append(torch.stack(rows))
            ref_tokens.append(toks)
    # Paged: the same token sequences, all rows in each forward.
    pool, cache = BlockPool(32, bs), PagedKVCache.for_model(model, 32, bs)
    seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=64), bs) for p in prompts]
    for s in seqs:
        pool.allocate(s)
    got = [[] for _ in seqs]
    with torch.inference_mode():
        for step in range(steps + 1):
            new = [s.num_new_tokens for s in seqs]
            T = max(new)
            ids = [s.token_ids[s.num_cached:] + [s.token_ids[-1]] * (T - n) for s, n in zip(seqs, new)]
            pos = [list(range(s.num_cached, len(s))) + [len(s) - 1] * (T - n) for s, n in zip(seqs, new)]
            view = cache.batch([s.block_table for s in seqs], [s.num_cached for s in seqs], new)
            logits = model(torch.tensor(ids), positions=torch.tensor(pos), cache=view, last_only=True)[:, -1]
            for i, s in enumerate(seqs):
                got[i].append(logits[i])
                s.num_cached += new[i]
                s.token_ids.append(ref_tokens[i][step])  # teacher-forced: same inputs as the reference
                pool.append_slot(s)
    for i in range(len(prompts)):
        torch.testing.assert_close(torch.stack(got[i]), ref_logits[i], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("packed", [False, True])
def test_engine_greedy_is_token_identical_to_generate(model, tokenizer, packed):
    """A batch of different lengths, a pool small enough to force preemption, prefix caching
    on (two prompts share their start): still the tokens generate() gives one prompt at a time,
    with one forward per prompt or with every step packed into one row."""
    prompts = [tokenizer.encode(t) for t in TEXTS]
    prompts.append(tokenizer.encode(TEXTS[2] + " caught"))  # shares TEXTS[2]'s full blocks
    new = 8
    ref = [generate(model, p, new) for p in prompts]
    bs = 4
    need = max(BlockPool(1, bs).blocks_needed(len(p) + new) for p in prompts)
    engine = LLMEngine(model, num_blocks=need + 4, block_size=bs, packed=packed)
    out = engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=new))
    assert engine.scheduler.num_preemptions > 0
    out += engine.generate(prompts[4:], SamplingParams(temperature=0, max_tokens=new))  # its start is cached
    out = [o.outputs[0].token_ids for o in out]
    assert engine.pool.prefix_hits > 0
    assert out == ref
    assert engine.pool.num_free == engine.pool.num_blocks
    if packed:  # a request that arrives while another decodes joins that step: a mixed step
        engine = LLMEngine(model, num_blocks=32, block_size=bs, packed=True)
        first = engine.add_request(prompts[0], SamplingParams(temperature=0, max_tokens=new))
        engine.step(), engine.step()
        second = engine.add_request(prompts[1], SamplingParams(temperature=0, max_tokens=new))
        engine.run()
        assert [s.kind for s in engine.stats[:3]] == ["prefill", "decode", "mixed"]
        assert [first.outputs[0], second.outputs[0]] == ref[:2]


def test_in_place_attention_and_chunked_prefill_on_the_real_model(model, tokenizer):
    """Block-by-block attention gives the gathered version's logits on SmolLM2 (9 query heads
    sharing 3 K/V heads), reading a prefix held in the prefix cache's shared blocks; chunked
    prefill gives the same greedy tokens as whole prompts."""
    from inference_internals.kv_cache.paged_attention import InPlaceBatch

    bs = 4
    first, second = (tokenizer.encode(TEXTS[2]), tokenizer.encode(TEXTS[2] + " caught a fish"))
    pool, cache = BlockPool(32, bs), PagedKVCache.for_model(model, 32, bs)
    params = SamplingParams(temperature=0, max_tokens=64)
    a, b = Sequence(first, params, bs), Sequence(second, params, bs)
    pool.allocate(a)
    with torch.inference_mode():
        model(torch.tensor([first]), positions=torch.arange(len(first))[None],
              cache=cache.batch([a.block_table], [0], [len(first)]))
        a.num_cached = len(a)
        pool.register(a)
        pool.allocate(b)  # its leading blocks are a's
        assert b.num_cached > 0 and b.block_table[:2] == a.block_table[:2]
        rows = dict(block_tables=[a.block_table, b.block_table], num_cached=[len(a) - 1, b.num_cached],
                    num_new=[1, len(b) - b.num_cached])
        T = max(rows["num_new"])
        ids = torch.tensor([[first[-1]] * T, second[b.num_cached:] + [second[-1]] * (T - rows["num_new"][1])])
        pos = torch.tensor([[len(a) - 1] * T, list(range(b.num_cached, len(b))) + [len(b) - 1] * (T - rows["num_new"][1])])
        want = model(ids, positions=pos, cache=cache.batch(**rows), last_only=True)
        got = model(ids, positions=pos, cache=InPlaceBatch(cache, **rows), last_only=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    prompts = [tokenizer.encode(t) for t in TEXTS]
    ref = LLMEngine(model, num_blocks=64, block_size=bs).generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    ref = [o.outputs[0].token_ids for o in ref]
    chunked = LLMEngine(model, num_blocks=64, block_size=bs, max_num_batched_tokens=8, max_num_seqs=4,
                        packed=True, enable_chunked_prefill=True)
    assert [o.outputs[0].token_ids for o in chunked.generate(prompts, SamplingParams(temperature=0, max_tokens=6))] == ref
    assert max(s.num_tokens for s in chunked.stats) <= 8
