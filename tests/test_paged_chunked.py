"""Chunked prefill: a per-step token budget, decodes first, prompts in chunks after them.

Invariants under random workloads (hypothesis, on a tiny random model so hundreds of steps run in
seconds): every step computes at most ``max_num_batched_tokens`` tokens; no block is held by a table
that does not count it, none leaks; every request finishes; greedy output equals one prompt at a time.
"""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import BlockPool, LLMEngine, Scheduler, Sequence
from inference_internals.params import SamplingParams
from inference_internals.analysis.trace import make_trace, replay

TINY = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=96,
                   eos_token_id=2)
MODEL = random_model(TINY, seed=0, device="cpu")


def check_step(engine, budget):
    st_ = engine.stats[-1]
    assert st_.num_tokens <= budget, (st_.num_tokens, budget)
    engine.pool.check(engine.scheduler.sequences)  # ref counts = tables holding each block; free list exact


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.integers(1, 30), min_size=1, max_size=6), new=st.integers(1, 8),
       num_blocks=st.integers(6, 30), block_size=st.sampled_from([1, 2, 4, 8]), prefix=st.booleans(),
       packed=st.booleans(), budget=st.integers(6, 24), seed=st.integers(0, 1000))
def test_chunked_engine_matches_generate_under_its_budget(lens, new, num_blocks, block_size, prefix, packed,
                                                          budget, seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 8) for _ in range(n)] for n in lens]  # repetitive: prefix hits
    num_blocks = max(num_blocks, BlockPool(1, block_size).blocks_needed(max(lens) + new))
    engine = LLMEngine(MODEL, num_blocks=num_blocks, block_size=block_size, max_num_seqs=6, max_num_batched_tokens=budget,
                       enable_prefix_caching=prefix, packed=packed, enable_chunked_prefill=True)
    reqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=new)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        check_step(engine, budget)
    assert engine.pool.num_free == num_blocks  # nothing leaked
    assert all(r.finished and r.error is None for r in reqs)
    assert [r.outputs[0] for r in reqs] == [generate(MODEL, p, new) for p in prompts]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), num_blocks=st.integers(8, 40), block_size=st.sampled_from([2, 4, 8]),
       budget=st.integers(8, 64), seed=st.integers(0, 1000))
def test_chunked_replay_respects_budget_and_finishes(n, num_blocks, block_size, budget, seed):
    """Model-free: the scheduler alone, long prompts, a tight pool (preemption mid-prompt)."""
    trace = make_trace(n, (1, 60), (1, 20), seed=seed)
    num_blocks = max(num_blocks, BlockPool(1, block_size).blocks_needed(60 + 20))
    pool = BlockPool(num_blocks, block_size, enable_prefix_caching=False)
    sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=budget, watermark=0, chunked=True)
    records = replay(sched, trace, seed=seed)
    assert all(r["tokens"] <= budget for r in records)
    assert pool.num_free == num_blocks and not sched.has_unfinished()
    # Every prompt token is computed at least once; no step is empty.
    assert sum(r["tokens"] for r in records) >= sum(t.prompt_len + t.output_len - 1 for t in trace)


def test_a_long_prompt_is_split_and_decodes_run_beside_it():
    engine = LLMEngine(MODEL, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True,
                       packed=True)
    short = engine.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    engine.step()  # the short prompt, whole
    long = engine.add_request(list(range(3, 33)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    chunks = []
    while long.seqs[0].num_cached < 30:
        engine.step()
        chunks.append(engine.stats[-1])
    # 30 prompt tokens in chunks of 8 - 1 (the decode of the short request goes first): 7, 7, 7, 7, 2
    assert [s.num_tokens for s in chunks] == [8, 8, 8, 8, 3] and all(s.num_decode == 1 for s in chunks)
    assert len(long.seqs[0].output_ids) == 1  # its first token comes with its last chunk
    engine.run()
    assert short.outputs[0] == generate(MODEL, [3, 4, 5], 12, stop_ids=[])
    assert long.outputs[0] == generate(MODEL, list(range(3, 33)), 2, stop_ids=[])


def test_preemption_mid_prompt_recomputes_and_everyone_finishes():
    """The pool runs out while a prompt is part-way: the newest (mid-prompt) sequence gives its
    blocks back, starts again later, and every output equals generate()'s."""
    prompts, new = [[3, 4, 5, 6], [7, 3, 4, 5, 6, 7, 3, 4, 5, 6]], [8, 4]
    engine = LLMEngine(MODEL, num_blocks=8, block_size=2, max_num_seqs=2, max_num_batched_tokens=4, enable_prefix_caching=False,
                       watermark=0, enable_chunked_prefill=True)
    reqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            for p, n in zip(prompts, new)]
    mid_prompt_victim = False
    while engine.has_unfinished():
        before = reqs[1].seqs[0].num_cached
        engine.step()
        check_step(engine, 4)
        if engine.stats[-1].preempted and 0 < before < len(prompts[1]):
            mid_prompt_victim = True
    assert mid_prompt_victim
    assert [r.outputs[0] for r in reqs] == [generate(MODEL, p, n, stop_ids=[]) for p, n in zip(prompts, new)]
    assert engine.pool.num_free == 8


def test_chunked_settings_are_checked():
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLMEngine(MODEL, num_blocks=8, block_size=4, max_num_seqs=16, max_num_batched_tokens=8, enable_chunked_prefill=True)
    with pytest.raises(ValueError, match="static"):
        LLMEngine(MODEL, num_blocks=8, block_size=4, static_reserve_tokens=16, enable_chunked_prefill=True)
    sched = Scheduler(BlockPool(8, 4), max_num_seqs=2, max_num_batched_tokens=4, chunked=True)
    seq = Sequence([3, 4, 5, 6, 7, 3], SamplingParams(temperature=0, max_tokens=2), 4)
    sched.add(seq)
    batch = sched.schedule()
    assert batch.num_tokens == [4]
    with pytest.raises(ValueError, match="chunk"):  # a chunk that stops short must not sample
        sched.postprocess(batch.seqs, [[]], [6])
    assert seq.num_cached == 0  # nothing changed
    sched.postprocess(batch.seqs, [[]], [4])
    assert seq.num_cached == 4 and seq.output_ids == []
